// The demo's trainer: data-parallel linear regression on the client library.
// Every rank holds its own shard of synthetic data (y = x . w_true + b_true +
// noise), computes the gradient of the mean squared error on its shard, and
// averages it over all ranks with push_pull before the SGD update — the same
// loop a PyTorch DistributedOptimizer runs, at toy size. The initial
// parameters come from rank 0 by broadcast. Rank 0 prints the loss (itself
// averaged over ranks) and, at the end, the learned parameters and the job
// as the coordinator reports it.
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "baton/client.h"
#include "baton/v1/status.grpc.pb.h"
#include "gflags/gflags.h"
#include "grpcpp/grpcpp.h"

DEFINE_int32(steps, 60, "SGD steps");
DEFINE_int32(samples, 256, "samples in each rank's shard");
DEFINE_double(learning_rate, 0.1, "SGD learning rate");
DEFINE_string(coordinator, "",
              "coordinator address, for the final status (default: "
              "BATON_COORDINATOR, which batonrun sets)");

namespace baton {
namespace {

constexpr int kDim = 8;

v1::TensorSpec Spec(const std::string& name, int64_t elements,
                    v1::CollectiveOp op) {
  v1::TensorSpec spec;
  spec.set_name(name);
  spec.set_dtype(v1::DATA_TYPE_FLOAT32);
  spec.add_shape(elements);
  spec.set_op(op);
  return spec;
}

absl::Status Run(const std::shared_ptr<Tensor>& tensor, Client& client,
                 int64_t step, bool broadcast) {
  auto handle = broadcast ? client.BroadcastAsync(*tensor, step, 0)
                          : client.PushPullAsync(*tensor, step, true);
  if (!handle.ok()) return handle.status();
  return (*handle)->Wait(std::chrono::minutes(1));
}

float* Floats(const std::shared_ptr<Tensor>& t) {
  return reinterpret_cast<float*>(t->input());
}
const float* Result(const std::shared_ptr<Tensor>& t) {
  return reinterpret_cast<const float*>(t->output());
}

void PrintStatus(const std::string& job) {
  std::string address = FLAGS_coordinator;
  if (address.empty() && std::getenv("BATON_COORDINATOR") != nullptr) {
    address = std::getenv("BATON_COORDINATOR");
  }
  if (address.empty()) return;
  auto stub = v1::Status::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  // Agents report every report_interval_ms (1 s by default): wait a little
  // for the report of the last step.
  v1::JobStatus status;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(3);
  for (;;) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(2));
    v1::GetJobRequest request;
    request.set_job(job);
    if (!stub->GetJob(&context, request, &status).ok()) return;
    if (status.global_step() >= FLAGS_steps - 1 ||
        std::chrono::steady_clock::now() > deadline) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::printf("\njob %s as the coordinator reports it: %s, generation %" PRId64
              ", world size %d, global step %" PRId64 "\n",
              status.job().c_str(), v1::JobState_Name(status.state()).c_str(),
              status.generation(), status.world_size(), status.global_step());
  for (const v1::MemberStatus& m : status.members()) {
    std::printf("  node %-4s node rank %d, ranks %d..%d, %.1f KB/s pushed\n",
                m.node_name().c_str(), m.node_rank(), m.rank_offset(),
                m.rank_offset() + m.local_size() - 1,
                m.throughput_bytes_per_second() / 1e3);
  }
}

int Main() {
  auto options = ClientOptions::FromEnvironment();
  if (!options.ok()) {
    std::fprintf(stderr, "demo trainer: %s\n",
                 std::string(options.status().message()).c_str());
    return 2;
  }
  auto connected = Client::Connect(*options);
  if (!connected.ok()) {
    std::fprintf(stderr, "demo trainer: %s\n",
                 std::string(connected.status().message()).c_str());
    return 2;
  }
  Client& client = **connected;
  const int rank = client.rank();
  if (rank == 0) {
    std::printf(
        "%d ranks on %d trainers per node; fitting y = x.w + b by SGD, "
        "gradients averaged with push_pull\n",
        client.size(), client.local_size());
  }
  auto tensors =
      client.Declare({Spec("params", kDim + 1, v1::COLLECTIVE_OP_BROADCAST),
                      Spec("grad.w", kDim, v1::COLLECTIVE_OP_PUSH_PULL),
                      Spec("grad.b", 1, v1::COLLECTIVE_OP_PUSH_PULL),
                      Spec("loss", 1, v1::COLLECTIVE_OP_PUSH_PULL)});
  if (!tensors.ok()) {
    std::fprintf(stderr, "demo trainer: %s\n",
                 std::string(tensors.status().message()).c_str());
    return 2;
  }
  const std::shared_ptr<Tensor> params = (*tensors)[0];
  const std::shared_ptr<Tensor> grad_w = (*tensors)[1];
  const std::shared_ptr<Tensor> grad_b = (*tensors)[2];
  const std::shared_ptr<Tensor> loss = (*tensors)[3];

  // This rank's shard; the true parameters are the same everywhere.
  std::mt19937 rng(1234 + rank);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  float w_true[kDim];
  for (int d = 0; d < kDim; ++d) w_true[d] = 0.5f * (d + 1) - 2.0f;
  const float b_true = 0.75f;
  std::vector<float> x(FLAGS_samples * kDim), y(FLAGS_samples);
  for (int i = 0; i < FLAGS_samples; ++i) {
    float dot = b_true;
    for (int d = 0; d < kDim; ++d) {
      x[i * kDim + d] = normal(rng);
      dot += x[i * kDim + d] * w_true[d];
    }
    y[i] = dot + 0.01f * normal(rng);
  }

  // Rank 0's random initial parameters, broadcast to everyone.
  for (int d = 0; d <= kDim; ++d) Floats(params)[d] = normal(rng);
  if (absl::Status s = Run(params, client, 0, true); !s.ok()) {
    std::fprintf(stderr, "demo trainer: %s\n",
                 std::string(s.message()).c_str());
    return 3;
  }
  float w[kDim + 1];
  std::memcpy(w, Result(params), sizeof(w));

  for (int64_t step = 0; step < FLAGS_steps; ++step) {
    float gw[kDim] = {};
    float gb = 0, mse = 0;
    for (int i = 0; i < FLAGS_samples; ++i) {
      float pred = w[kDim];
      for (int d = 0; d < kDim; ++d) pred += x[i * kDim + d] * w[d];
      const float err = pred - y[i];
      mse += err * err;
      for (int d = 0; d < kDim; ++d) gw[d] += 2 * err * x[i * kDim + d];
      gb += 2 * err;
    }
    std::memcpy(Floats(grad_w), gw, sizeof(gw));
    for (int d = 0; d < kDim; ++d) Floats(grad_w)[d] /= FLAGS_samples;
    Floats(grad_b)[0] = gb / FLAGS_samples;
    Floats(loss)[0] = mse / FLAGS_samples;
    // Enqueue all three, then wait: they travel together.
    auto hw = client.PushPullAsync(*grad_w, step, true);
    auto hb = client.PushPullAsync(*grad_b, step, true);
    auto hl = client.PushPullAsync(*loss, step, true);
    for (auto* h : {&hw, &hb, &hl}) {
      absl::Status s =
          h->ok() ? (**h)->Wait(std::chrono::minutes(1)) : h->status();
      if (!s.ok()) {
        std::fprintf(stderr, "demo trainer: step %" PRId64 ": %s\n", step,
                     std::string(s.message()).c_str());
        return 3;
      }
    }
    for (int d = 0; d < kDim; ++d) {
      w[d] -= static_cast<float>(FLAGS_learning_rate) * Result(grad_w)[d];
    }
    w[kDim] -= static_cast<float>(FLAGS_learning_rate) * Result(grad_b)[0];
    if (rank == 0 && (step % 10 == 0 || step == FLAGS_steps - 1)) {
      std::printf("step %3" PRId64 "  loss (mean over ranks) %.6f\n", step,
                  Result(loss)[0]);
    }
  }
  if (rank == 0) {
    std::printf("\nlearned w:");
    for (int d = 0; d < kDim; ++d) std::printf(" %6.3f", w[d]);
    std::printf("   b: %.3f\n   true w:", w[kDim]);
    for (int d = 0; d < kDim; ++d) std::printf(" %6.3f", w_true[d]);
    std::printf("   b: %.3f\n", b_true);
    PrintStatus(options->job);
  }
  std::fflush(stdout);
  return client.Detach(true).ok() ? 0 : 1;
}

}  // namespace
}  // namespace baton

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  return baton::Main();
}
