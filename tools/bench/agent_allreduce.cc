// One trainer's side of the agent-path benchmark: attaches through the
// environment (like any trainer), declares one float32 tensor of --bytes,
// and times --iterations push_pulls (enqueue -> completion). The input is
// written once; each iteration is the agent path only: local reduction,
// the scheduler, gloo between nodes, the completion event. Rank 0 prints
// one JSON line of timings (tools/bench/timings.h).
//
// With --runs > 0 it is instead baton's side of tools/bench/collectives: the
// --ops on --bytes, measured as tools/bench/collectives/measurement.h says;
// rank 0 prints one row per op. --api=client (system "baton") writes the
// input and reads the result in the tensor's shared memory, nothing copied:
// what the agents' collectives cost. --api=session (system "session") goes
// through baton::Session with buffers of its own, as a Horovod-style caller
// does: the same plus copying the input in and the result out. --system
// renames the rows (tools/bench/collectives/run's "baton-gloo": the same
// trainers on agents with --data_transport=gloo).
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <thread>
#include <vector>

#include "baton/client.h"
#include "baton/session.h"
#include "gflags/gflags.h"
#include "tools/bench/collectives/measurement.h"
#include "tools/bench/timings.h"

DEFINE_int64(bytes, 64 << 20, "tensor size (a multiple of 4)");
DEFINE_int32(iterations, 10, "timed push_pulls");
DEFINE_int32(warmup, 2, "untimed push_pulls first");
DEFINE_int32(runs, 0,
             "0: time --iterations push_pulls and print percentiles; > 0: "
             "measure --ops for tools/bench/collectives, this many runs of "
             "--iterations each");
DEFINE_string(ops, "allreduce",
              "with --runs: comma-separated allreduce (push_pull, sum), "
              "broadcast (from rank 0), allgather, reducescatter (sum), "
              "alltoall; without: allreduce or broadcast, the one op to time");
DEFINE_string(api, "client",
              "with --runs: client (the tensors' shared memory, no copies) or "
              "session (baton::Session on buffers of the caller's)");
DEFINE_string(system, "",
              "with --runs: the rows' system name (default: baton, or "
              "session with --api=session)");
DEFINE_int32(linger_ms, 0,
             "stay attached this long after the timed push_pulls, so that "
             "batonctl timeline can still read the job from the agents");

namespace baton {
namespace {

constexpr auto kOperationTimeout = std::chrono::minutes(2);

// Waits for an enqueued operation; false (and why, on stderr) when it could
// not be enqueued or failed.
bool Finished(const char* what,
              const absl::StatusOr<std::shared_ptr<Handle>>& handle) {
  const absl::Status status =
      handle.ok() ? (*handle)->Wait(kOperationTimeout) : handle.status();
  if (!status.ok()) {
    std::fprintf(stderr, "agent_allreduce: %s: %s\n", what,
                 std::string(status.message()).c_str());
  }
  return status.ok();
}

// A trainer of a baton job as tools/bench/collectives drives it: one tensor
// per op, declared when the op is prepared; barrier and max over a float64
// push_pull of one element per rank.
class BatonRank : public bench::CollectiveRank {
 public:
  explicit BatonRank(Client& client) : client_(client) {}

  int rank() const override { return client_.rank(); }
  int size() const override { return client_.size(); }

  float* Prepare(bench::CollectiveOp op, int64_t elements) override {
    std::vector<v1::TensorSpec> specs(1);
    specs[0].set_name(bench::CollectiveOpName(op));
    specs[0].set_dtype(v1::DATA_TYPE_FLOAT32);
    // Allgather, reduce-scatter and alltoall tensors are stacked by rank:
    // [ranks, one rank's part] (baton/session.h).
    switch (op) {
      case bench::CollectiveOp::kAllreduce:
        specs[0].add_shape(elements);
        specs[0].set_op(v1::COLLECTIVE_OP_PUSH_PULL);
        break;
      case bench::CollectiveOp::kBroadcast:
        specs[0].add_shape(elements);
        specs[0].set_op(v1::COLLECTIVE_OP_BROADCAST);
        break;
      case bench::CollectiveOp::kAllgather:
        specs[0].add_shape(size());
        specs[0].add_shape(elements);
        specs[0].set_op(v1::COLLECTIVE_OP_ALLGATHER);
        break;
      case bench::CollectiveOp::kReduceScatter:
        specs[0].add_shape(size());
        specs[0].add_shape(elements / size());
        specs[0].set_op(v1::COLLECTIVE_OP_REDUCE_SCATTER);
        break;
      case bench::CollectiveOp::kAlltoall:
        specs[0].add_shape(size());
        specs[0].add_shape(elements / size());
        specs[0].set_op(v1::COLLECTIVE_OP_ALLTOALL);
        break;
    }
    if (control_ == nullptr) {
      specs.emplace_back();
      specs[1].set_name("control");
      specs[1].set_dtype(v1::DATA_TYPE_FLOAT64);
      specs[1].add_shape(size());
      specs[1].set_op(v1::COLLECTIVE_OP_PUSH_PULL);
    }
    auto tensors = client_.Declare(specs);
    if (!tensors.ok()) {
      std::fprintf(stderr, "agent_allreduce: declare: %s\n",
                   std::string(tensors.status().message()).c_str());
      return nullptr;
    }
    op_ = op;
    tensor_ = (*tensors)[0];
    step_ = 0;
    if (control_ == nullptr) control_ = (*tensors)[1];
    return reinterpret_cast<float*>(tensor_->input());
  }

  // A reduce-scatter tensor is enqueued like a push-pull, an alltoall tensor
  // like an allgather (baton/client.h).
  bool Run() override {
    const int64_t step = step_++;
    switch (op_) {
      case bench::CollectiveOp::kBroadcast:
        return Finished("broadcast", client_.BroadcastAsync(*tensor_, step, 0));
      case bench::CollectiveOp::kAllgather:
      case bench::CollectiveOp::kAlltoall:
        return Finished(bench::CollectiveOpName(op_),
                        client_.AllgatherAsync(*tensor_, step));
      default:
        return Finished(bench::CollectiveOpName(op_),
                        client_.PushPullAsync(*tensor_, step, false));
    }
  }

  const float* Result() const override {
    if (op_ == bench::CollectiveOp::kBroadcast && rank() == 0) return nullptr;
    return reinterpret_cast<const float*>(tensor_->output());
  }

  bool Barrier() override {
    double ignored = 0;
    return Max(0, &ignored);
  }

  bool Max(double value, double* max) override {
    double* input = reinterpret_cast<double*>(control_->input());
    std::fill_n(input, size(), 0.0);
    input[rank()] = value;
    if (!Finished("control",
                  client_.PushPullAsync(*control_, control_step_++, false))) {
      return false;
    }
    const double* output = reinterpret_cast<const double*>(control_->output());
    *max = *std::max_element(output, output + size());
    return true;
  }

 private:
  Client& client_;
  std::shared_ptr<Tensor> control_;
  int64_t control_step_ = 0;
  bench::CollectiveOp op_ = bench::CollectiveOp::kAllreduce;
  std::shared_ptr<Tensor> tensor_;
  int64_t step_ = 0;
};

// The same through baton::Session, on this trainer's own buffers: every
// Run copies the input into shared memory and the result out of it, as
// Session does for a Horovod-style caller. Each op's tensor is declared on
// first use (in the warm-up), by its name.
class SessionRank : public bench::CollectiveRank {
 public:
  explicit SessionRank(Session& session) : session_(session) {}

  int rank() const override { return session_.rank(); }
  int size() const override { return session_.size(); }

  float* Prepare(bench::CollectiveOp op, int64_t elements) override {
    op_ = op;
    input_.assign(elements, 0.0f);
    output_.clear();
    if (op != bench::CollectiveOp::kBroadcast) {
      output_.assign(bench::ResultElements(op, elements, size()), 0.0f);
    }
    return input_.data();
  }

  bool Run() override {
    const std::string name = bench::CollectiveOpName(op_);
    const Buffer input{input_.data(),
                       v1::DATA_TYPE_FLOAT32,
                       {static_cast<int64_t>(input_.size())}};
    absl::StatusOr<OperationHandle> handle;
    switch (op_) {
      case bench::CollectiveOp::kAllreduce:
        handle = session_.PushPullAsync(name, input, output_.data(), false);
        break;
      case bench::CollectiveOp::kBroadcast:
        handle = session_.BroadcastAsync(name, input, 0);
        break;
      case bench::CollectiveOp::kAllgather:
        handle = session_.AllgatherAsync(name, input, output_.data());
        break;
      case bench::CollectiveOp::kReduceScatter:
        handle =
            session_.ReduceScatterAsync(name, input, output_.data(), false);
        break;
      case bench::CollectiveOp::kAlltoall:
        handle = session_.AlltoallAsync(name, input, output_.data());
        break;
    }
    return Reported(name, handle.ok()
                              ? session_.Synchronize(*handle, kOperationTimeout)
                              : handle.status());
  }

  // A broadcast leaves the result in the input buffer.
  const float* Result() const override {
    return op_ == bench::CollectiveOp::kBroadcast ? input_.data()
                                                  : output_.data();
  }

  bool Barrier() override {
    double ignored = 0;
    return Max(0, &ignored);
  }

  bool Max(double value, double* max) override {
    std::vector<double> values(size(), 0.0);
    values[rank()] = value;
    const Buffer control{values.data(), v1::DATA_TYPE_FLOAT64, {size()}};
    if (!Reported("control", session_.PushPull("control", control, false))) {
      return false;
    }
    *max = *std::max_element(values.begin(), values.end());
    return true;
  }

 private:
  static bool Reported(const std::string& what, const absl::Status& status) {
    if (!status.ok()) {
      std::fprintf(stderr, "agent_allreduce: %s: %s\n", what.c_str(),
                   std::string(status.message()).c_str());
    }
    return status.ok();
  }

  Session& session_;
  bench::CollectiveOp op_ = bench::CollectiveOp::kAllreduce;
  std::vector<float> input_;
  // The result, but for a broadcast (in place in input_).
  std::vector<float> output_;
};

// The rows' system: --system, or `api_default`.
const char* SystemName(const char* api_default) {
  return FLAGS_system.empty() ? api_default : FLAGS_system.c_str();
}

// baton's side of tools/bench/collectives through Session; shuts the session
// down on success.
int MeasureThroughSession() {
  auto session = Session::Init();
  if (!session.ok()) {
    std::fprintf(stderr, "agent_allreduce: %s\n",
                 std::string(session.status().message()).c_str());
    return 2;
  }
  SessionRank rank(**session);
  if (!bench::MeasureCollectives(
          SystemName("session"), rank, FLAGS_ops, FLAGS_bytes,
          {FLAGS_warmup, FLAGS_iterations, FLAGS_runs})) {
    return 4;
  }
  (*session)->Shutdown().IgnoreError();
  return 0;
}

// baton's side of tools/bench/collectives; detaches (finished) on success.
int MeasureCollectives(Client& client) {
  BatonRank rank(client);
  if (!bench::MeasureCollectives(
          SystemName("baton"), rank, FLAGS_ops, FLAGS_bytes,
          {FLAGS_warmup, FLAGS_iterations, FLAGS_runs})) {
    return 4;
  }
  client.Detach(true).IgnoreError();
  return 0;
}

int Main() {
  if (FLAGS_runs > 0 && FLAGS_api != "client") {
    if (FLAGS_api == "session") return MeasureThroughSession();
    std::fprintf(stderr, "agent_allreduce: --api=%s: give client or session\n",
                 FLAGS_api.c_str());
    return 2;
  }
  auto options = ClientOptions::FromEnvironment();
  if (!options.ok()) {
    std::fprintf(stderr, "agent_allreduce: %s\n",
                 std::string(options.status().message()).c_str());
    return 2;
  }
  auto client = Client::Connect(*options);
  if (!client.ok()) {
    std::fprintf(stderr, "agent_allreduce: %s\n",
                 std::string(client.status().message()).c_str());
    return 2;
  }
  if (FLAGS_runs > 0) return MeasureCollectives(**client);
  v1::TensorSpec spec;
  spec.set_name("bench");
  spec.set_dtype(v1::DATA_TYPE_FLOAT32);
  spec.add_shape(FLAGS_bytes / 4);
  const bool broadcast = FLAGS_ops == "broadcast";
  if (!broadcast && FLAGS_ops != "allreduce") {
    std::fprintf(stderr,
                 "agent_allreduce: --ops=%s: without --runs give allreduce or "
                 "broadcast\n",
                 FLAGS_ops.c_str());
    return 2;
  }
  spec.set_op(broadcast ? v1::COLLECTIVE_OP_BROADCAST
                        : v1::COLLECTIVE_OP_PUSH_PULL);
  auto tensors = (*client)->Declare({spec});
  if (!tensors.ok()) {
    std::fprintf(stderr, "agent_allreduce: %s\n",
                 std::string(tensors.status().message()).c_str());
    return 2;
  }
  const Tensor& tensor = *(*tensors)[0];
  std::fill_n(reinterpret_cast<float*>(tensor.input()), FLAGS_bytes / 4, 1.0f);
  std::vector<int64_t> micros;
  for (int i = 0; i < FLAGS_warmup + FLAGS_iterations; ++i) {
    const auto start = std::chrono::steady_clock::now();
    auto handle = broadcast ? (*client)->BroadcastAsync(tensor, i, 0)
                            : (*client)->PushPullAsync(tensor, i, false);
    absl::Status status = handle.ok() ? (*handle)->Wait(std::chrono::minutes(2))
                                      : handle.status();
    if (!status.ok()) {
      std::fprintf(stderr, "agent_allreduce: step %d: %s\n", i,
                   std::string(status.message()).c_str());
      return 3;
    }
    const auto us = std::chrono::duration_cast<std::chrono::microseconds>(
                        std::chrono::steady_clock::now() - start)
                        .count();
    if (i >= FLAGS_warmup) micros.push_back(us);
  }
  const float expected =
      broadcast ? 1.0f : static_cast<float>((*client)->size());
  const bool root = broadcast && (*client)->rank() == 0;
  if (!root && reinterpret_cast<const float*>(tensor.output())[0] != expected) {
    std::fprintf(stderr, "agent_allreduce: wrong result\n");
    return 4;
  }
  if ((*client)->rank() == 0) {
    bench::PrintTimings("agent", FLAGS_bytes, (*client)->size(), micros);
    std::fflush(stdout);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(FLAGS_linger_ms));
  (*client)->Detach(true).IgnoreError();
  return 0;
}

}  // namespace
}  // namespace baton

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  return baton::Main();
}
