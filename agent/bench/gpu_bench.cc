// baton-gpu-bench: the NCCL transport's allreduce, and the agent's
// push_pull through its scheduler, against a direct ncclAllReduce of the
// same buffers, in the same run, on every local GPU (one NCCL rank each),
// for sizes from --min_bytes to --max_bytes (doubling).
//
// The three are timed on the host from the call to the result being on
// every device, and alternate iteration by iteration:
// - transport: the transport's DeviceAllreduce (group call, completion
//   events and NCCL's error state polled, timeout armed);
// - direct: a group call on communicators of its own, NCCL's state polled
//   until the work is launched, then cudaStreamSynchronize on every stream;
// - data plane: one push_pull submitted to the agent's Scheduler of a
//   one-node job with --gpu_cross_node=nccl, until its op_done: the
//   scheduler's rounds, credit and partitioning (--partition_bytes), and
//   one DeviceAllreduce per partition on the device worker.
// Prints one JSON object per size and a table; the ratios are transport /
// direct and data plane / direct (1.00 = no overhead).
//
// Without a CUDA device: prints "skipped: no CUDA device (<why>)" and exits
// with 77.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/scheduler/operation.h"
#include "agent/scheduler/scheduler.h"
#include "agent/transport/gloo/gloo_transport.h"
#include "agent/transport/nccl/cuda_nccl_api.h"
#include "agent/transport/nccl/local_gpus.h"
#include "agent/transport/nccl/nccl_communicator.h"
#include "agent/transport/nccl/nccl_transport.h"
#include "common/clock.h"
#include "gflags/gflags.h"
// The coordinator's store semantics in memory: one node rendezvouses with
// itself.
#include "agent/transport/memory_key_value_store.h"

DEFINE_int64(min_bytes, int64_t{1} << 20, "Smallest allreduce, in bytes");
DEFINE_int64(max_bytes, int64_t{1} << 30, "Largest allreduce, in bytes");
DEFINE_int32(iterations, 20, "Timed iterations per size and side");
DEFINE_int32(warmup, 3, "Untimed iterations per size and side");
DEFINE_int64(timeout_ms, 60000,
             "Bound on each allreduce (each push_pull through the data "
             "plane) and on connecting");
DEFINE_int64(partition_bytes, int64_t{4} << 20,
             "The data plane's partition size (a multiple of 8)");
DEFINE_int64(credit_bytes, int64_t{64} << 20,
             "The data plane's bytes in flight (priority mode's credit)");

namespace baton::agent {
namespace {

using SteadyClock = std::chrono::steady_clock;

// Exit codes: 77 is ctest's (and check.sh's) "skipped".
constexpr int kSkipped = 77;
constexpr int kFailed = 1;

absl::Status Check(gpu::GpuApi& api, gpu::CudaError error,
                   const std::string& what) {
  if (error == gpu::kCudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(what, " failed: ", api.CudaErrorText(error)));
}

// The direct path: NCCL communicators and streams of its own on the same
// devices, driven the plain way.
class DirectAllreduce {
 public:
  explicit DirectAllreduce(gpu::GpuApi& api) : api_(api) {}
  ~DirectAllreduce() { ReleaseLocalRanks(api_, ranks_); }

  absl::Status Connect(const std::vector<int>& devices) {
    gpu::NcclUniqueId id;
    if (gpu::NcclResult r = api_.GetUniqueId(&id);
        r != gpu::NcclResult::kSuccess) {
      return NcclError(api_, "ncclGetUniqueId", r, nullptr);
    }
    ranks_.resize(devices.size());
    for (size_t i = 0; i < devices.size(); ++i) {
      ranks_[i].device = devices[i];
      absl::Status s = Check(api_, api_.SetDevice(devices[i]), "cudaSetDevice");
      if (s.ok()) {
        s = Check(api_, api_.StreamCreate(&ranks_[i].stream), "stream");
      }
      if (!s.ok()) return s;
    }
    api_.GroupStart();
    for (size_t i = 0; i < devices.size(); ++i) {
      api_.SetDevice(devices[i]);
      const gpu::NcclResult r = api_.CommInitRankNonBlocking(
          &ranks_[i].comm, static_cast<int>(devices.size()), id,
          static_cast<int>(i));
      if (r != gpu::NcclResult::kSuccess && r != gpu::NcclResult::kInProgress) {
        api_.GroupEnd();
        return NcclError(api_, "ncclCommInitRankConfig", r, ranks_[i].comm);
      }
    }
    api_.GroupEnd();
    return AwaitSettled("initializing the direct communicators");
  }

  absl::Status Run(void* const* buffers, size_t count) {
    api_.GroupStart();
    for (size_t i = 0; i < ranks_.size(); ++i) {
      const gpu::NcclResult r = api_.AllReduce(
          buffers[i], buffers[i], count, gpu::NcclDataType::kFloat32,
          gpu::NcclRedOp::kSum, ranks_[i].comm, ranks_[i].stream);
      if (r != gpu::NcclResult::kSuccess && r != gpu::NcclResult::kInProgress) {
        api_.GroupEnd();
        return NcclError(api_, "ncclAllReduce", r, ranks_[i].comm);
      }
    }
    api_.GroupEnd();
    if (absl::Status s = AwaitSettled("ncclAllReduce"); !s.ok()) return s;
    for (const NcclLocalRank& rank : ranks_) {
      if (absl::Status s = Check(api_, api_.StreamSynchronize(rank.stream),
                                 "cudaStreamSynchronize");
          !s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  }

 private:
  absl::Status AwaitSettled(const std::string& what) {
    absl::Mutex mu;
    const absl::Status status = PollUntilDone(
        *Clock::Real(),
        Clock::Real()->Now() + absl::Milliseconds(FLAGS_timeout_ms), mu,
        nullptr, [&] { return NcclStatesSettled(api_, ranks_, what); });
    if (status.ok() || !status.message().empty()) return status;
    return absl::DeadlineExceededError(absl::StrCat(what, " timed out"));
  }

  gpu::GpuApi& api_;
  std::vector<NcclLocalRank> ranks_;
};

// The agent's path: the Scheduler of a one-node job over every local GPU,
// as baton-agent builds it with --gpu_cross_node=nccl: the negotiation's
// connections and one gloo data channel on loopback (one node negotiates
// with nobody), and a DeviceGroup whose NCCL group
// comes from NcclTransport::ConnectDevices. The buffers are this process's
// own: no CUDA IPC, no ready events.
class DataPlaneAllreduce {
 public:
  // `nccl` must outlive this.
  absl::Status Connect(NcclTransport& nccl) {
    const std::chrono::milliseconds timeout(FLAGS_timeout_ms);
    ConnectRequest request;
    request.node_rank = 0;
    request.num_nodes = 1;
    request.store = std::make_shared<MemoryKeyValueStore>();
    request.timeout = timeout;
    request.prefix = "baton-gpu-bench/nccl/";
    // One node in one process: no peer to prove it to, but the negotiation
    // rounds require a secret all the same.
    request.secret = "baton-gpu-bench";
    absl::StatusOr<std::vector<std::unique_ptr<DeviceCommunicator>>> device =
        nccl.ConnectDevices(request);
    if (!device.ok()) return device.status();
    absl::StatusOr<std::unique_ptr<GlooTransport>> gloo =
        GlooTransport::Create("127.0.0.1");
    if (!gloo.ok()) return gloo.status();
    gloo_ = std::move(*gloo);
    request.prefix = "baton-gpu-bench/gloo/";
    request.count = 1;  // one data channel
    absl::StatusOr<std::unique_ptr<NegotiationWire>> negotiation =
        gloo_->ConnectNegotiation(request);
    if (!negotiation.ok()) return negotiation.status();
    absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> host =
        gloo_->Connect(request);
    if (!host.ok()) return host.status();

    SchedulerOptions options;
    options.job = "baton-gpu-bench";
    options.generation = 1;
    options.world_size = (*device)[0]->world_size();
    options.credit_bytes = FLAGS_credit_bytes;
    options.op_timeout = timeout;
    Scheduler::Callbacks callbacks;
    callbacks.op_done = [this](uint64_t id, absl::Status status) {
      absl::MutexLock lock(&mu_);
      done_id_ = id;
      done_status_ = std::move(status);
    };
    std::vector<std::unique_ptr<Communicator>> data;
    data.push_back(std::move((*host)[0]));
    DeviceGroup group;
    group.cross_node = GpuCrossNode::kNccl;
    group.comm = std::move((*device)[0]);
    plane_ = std::make_unique<Scheduler>(options, std::move(*negotiation),
                                         std::move(data), callbacks,
                                         std::move(group));
    plane_->SetKnownTensors(1);
    return absl::OkStatus();
  }

  // One push_pull (float32 sum) of the first `bytes` of every buffer, the
  // next step of tensor 0; returns when op_done reported it.
  absl::Status Run(const std::vector<void*>& buffers, int64_t bytes)
      ABSL_LOCKS_EXCLUDED(mu_) {
    auto op = std::make_shared<Operation>();
    op->step = steps_++;
    op->id = static_cast<uint64_t>(op->step) + 1;
    op->tensor_id = 0;
    op->tensor_name = "bench";
    op->kind = v1::COLLECTIVE_OP_PUSH_PULL;
    op->dtype = v1::DATA_TYPE_FLOAT32;
    op->size_bytes = bytes;
    op->partition_bytes = FLAGS_partition_bytes;
    op->on_device = true;
    for (void* buffer : buffers) {
      op->device_buffers.push_back(static_cast<uint8_t*>(buffer));
    }
    const uint64_t id = op->id;
    plane_->Submit(std::move(op));
    absl::MutexLock lock(&mu_);
    const auto done = [this, id]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return done_id_ == id;
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&done),
                              absl::Milliseconds(FLAGS_timeout_ms))) {
      return absl::DeadlineExceededError(
          absl::StrCat("push_pull step ", id - 1, " through the data plane ",
                       "not done after ", FLAGS_timeout_ms, " ms"));
    }
    return done_status_;
  }

 private:
  std::unique_ptr<GlooTransport> gloo_;
  absl::Mutex mu_;
  // The last operation op_done reported.
  uint64_t done_id_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status done_status_ ABSL_GUARDED_BY(mu_);
  int64_t steps_ = 0;
  // Last: destroyed first, while its callback's mutex and the gloo
  // transport under its communicators are still there.
  std::unique_ptr<Scheduler> plane_;
};

struct Timings {
  std::vector<double> transport_us;
  std::vector<double> direct_us;
  std::vector<double> dataplane_us;
};

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

template <typename Fn>
absl::StatusOr<double> TimeUs(Fn&& fn) {
  const auto start = SteadyClock::now();
  if (absl::Status s = fn(); !s.ok()) return s;
  return std::chrono::duration<double, std::micro>(SteadyClock::now() - start)
      .count();
}

// "1 MiB", "1 GiB".
std::string Bytes(int64_t bytes) {
  if (bytes >= (int64_t{1} << 30) && bytes % (int64_t{1} << 30) == 0) {
    return absl::StrCat(bytes >> 30, " GiB");
  }
  if (bytes >= (int64_t{1} << 20) && bytes % (int64_t{1} << 20) == 0) {
    return absl::StrCat(bytes >> 20, " MiB");
  }
  return absl::StrCat(bytes, " B");
}

int Run() {
  if (FLAGS_min_bytes < 4 || FLAGS_max_bytes < FLAGS_min_bytes ||
      FLAGS_iterations < 1 || FLAGS_warmup < 0 || FLAGS_timeout_ms < 1 ||
      FLAGS_partition_bytes < 8 || FLAGS_partition_bytes % 8 != 0 ||
      FLAGS_credit_bytes < 1) {
    std::fprintf(stderr,
                 "baton-gpu-bench: give 4 <= --min_bytes <= --max_bytes, "
                 "--iterations >= 1, --warmup >= 0, --timeout_ms >= 1, "
                 "--partition_bytes a positive multiple of 8, "
                 "--credit_bytes >= 1\n");
    return 2;
  }
  const absl::StatusOr<gpu::GpuApi*> loaded = gpu::LoadCudaNcclApi();
  if (!loaded.ok()) {
    const bool skip = loaded.status().code() == absl::StatusCode::kUnavailable;
    std::printf("%s%s\n", skip ? "skipped: " : "baton-gpu-bench: ",
                std::string(loaded.status().message()).c_str());
    return skip ? kSkipped : kFailed;
  }
  gpu::GpuApi& api = **loaded;
  const absl::StatusOr<int> count = CountCudaDevices(api);
  if (!count.ok()) {
    std::printf("skipped: %s\n", std::string(count.status().message()).c_str());
    return kSkipped;
  }
  std::printf("# %s\n", DescribeLocalGpus(api).value_or("?").c_str());
  std::vector<int> devices;
  for (int d = 0; d < *count; ++d) devices.push_back(d);

  const auto fail = [](const absl::Status& status) {
    std::fprintf(stderr, "baton-gpu-bench: %s\n", status.ToString().c_str());
    return kFailed;
  };
  NcclTransport::Options options;
  options.devices = devices;
  absl::StatusOr<std::unique_ptr<NcclTransport>> transport =
      NcclTransport::Create(&api, options);
  if (!transport.ok()) return fail(transport.status());
  absl::StatusOr<std::unique_ptr<DeviceCommunicator>> communicator =
      (*transport)->ConnectLocal(std::chrono::milliseconds(FLAGS_timeout_ms));
  if (!communicator.ok()) return fail(communicator.status());
  DirectAllreduce direct(api);
  if (absl::Status s = direct.Connect(devices); !s.ok()) return fail(s);
  DataPlaneAllreduce plane;
  if (absl::Status s = plane.Connect(**transport); !s.ok()) return fail(s);

  std::vector<void*> buffers;
  for (int device : devices) {
    void* pointer = nullptr;
    absl::Status s = Check(api, api.SetDevice(device), "cudaSetDevice");
    if (s.ok()) {
      s = Check(api, api.Malloc(&pointer, FLAGS_max_bytes),
                absl::StrCat("cudaMalloc of ", Bytes(FLAGS_max_bytes)));
    }
    if (s.ok())
      s = Check(api, api.Memset(pointer, 0, FLAGS_max_bytes), "memset");
    if (!s.ok()) return fail(s);
    buffers.push_back(pointer);
  }

  const CollectiveOptions collective{
      std::chrono::milliseconds(FLAGS_timeout_ms), 0};
  const int ranks = static_cast<int>(devices.size());
  std::vector<std::string> table;
  for (int64_t bytes = FLAGS_min_bytes; bytes <= FLAGS_max_bytes; bytes *= 2) {
    const size_t elements = static_cast<size_t>(bytes) / sizeof(float);
    const int64_t whole = static_cast<int64_t>(elements * sizeof(float));
    Timings timings;
    for (int i = 0; i < FLAGS_warmup + FLAGS_iterations; ++i) {
      const absl::StatusOr<double> ours = TimeUs([&] {
        return (*communicator)
            ->DeviceAllreduce(buffers, elements, v1::DATA_TYPE_FLOAT32,
                              DeviceReduceOp::kSum, collective);
      });
      if (!ours.ok()) return fail(ours.status());
      const absl::StatusOr<double> theirs =
          TimeUs([&] { return direct.Run(buffers.data(), elements); });
      if (!theirs.ok()) return fail(theirs.status());
      const absl::StatusOr<double> scheduled =
          TimeUs([&] { return plane.Run(buffers, whole); });
      if (!scheduled.ok()) return fail(scheduled.status());
      if (i < FLAGS_warmup) continue;
      timings.transport_us.push_back(*ours);
      timings.direct_us.push_back(*theirs);
      timings.dataplane_us.push_back(*scheduled);
    }
    const double transport_us = Median(timings.transport_us);
    const double direct_us = Median(timings.direct_us);
    const double dataplane_us = Median(timings.dataplane_us);
    const double ratio = transport_us / direct_us;
    const double dataplane_ratio = dataplane_us / direct_us;
    const auto min = [](const std::vector<double>& us) {
      return *std::min_element(us.begin(), us.end());
    };
    // Bytes each rank moves per second, as nccl-tests' algbw.
    const auto algbw = [&](double us) { return bytes / us / 1e3; };
    std::printf(
        "{\"bytes\": %lld, \"dtype\": \"float32\", \"ranks\": %d, "
        "\"iterations\": %d, \"partition_bytes\": %lld, "
        "\"transport_median_us\": %.1f, \"direct_median_us\": %.1f, "
        "\"dataplane_median_us\": %.1f, \"transport_min_us\": %.1f, "
        "\"direct_min_us\": %.1f, \"dataplane_min_us\": %.1f, "
        "\"ratio\": %.3f, \"dataplane_ratio\": %.3f, "
        "\"transport_algbw_gbps\": %.2f, \"direct_algbw_gbps\": %.2f, "
        "\"dataplane_algbw_gbps\": %.2f}\n",
        static_cast<long long>(bytes), ranks, FLAGS_iterations,
        static_cast<long long>(FLAGS_partition_bytes), transport_us, direct_us,
        dataplane_us, min(timings.transport_us), min(timings.direct_us),
        min(timings.dataplane_us), ratio, dataplane_ratio, algbw(transport_us),
        algbw(direct_us), algbw(dataplane_us));
    std::fflush(stdout);
    table.push_back(absl::StrFormat("# %10s %14.1f %14.1f %14.1f %8.3f %8.3f",
                                    Bytes(bytes), transport_us, direct_us,
                                    dataplane_us, ratio, dataplane_ratio));
  }
  std::printf(
      "# allreduce float32 sum over %d rank(s), median of %d; data plane: "
      "%s partitions, %s of credit\n",
      ranks, FLAGS_iterations, Bytes(FLAGS_partition_bytes).c_str(),
      Bytes(FLAGS_credit_bytes).c_str());
  std::printf("# %10s %14s %14s %14s %8s %8s\n", "size", "transport us",
              "direct us", "data plane us", "ratio", "dp ratio");
  for (const std::string& row : table) std::printf("%s\n", row.c_str());
  for (size_t i = 0; i < buffers.size(); ++i) {
    api.SetDevice(devices[i]);
    api.Free(buffers[i]);
  }
  return 0;
}

}  // namespace
}  // namespace baton::agent

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "baton-gpu-bench [--min_bytes N] [--max_bytes N] [--iterations N] "
      "[--partition_bytes N] [--credit_bytes N]\n"
      "The NCCL transport's allreduce and the agent's data plane against a "
      "direct ncclAllReduce.");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  return baton::agent::Run();
}
