// baton-gpu-bench: the NCCL transport's allreduce against a direct
// ncclAllReduce of the same buffers, in the same run, on every local GPU
// (one NCCL rank each), for sizes from --min_bytes to --max_bytes (doubling).
//
// Both sides are timed on the host from the call to the result being on
// every device: the transport's DeviceAllreduce (group call, completion
// events and NCCL's error state polled, timeout armed), and the direct path
// (group call on communicators of its own, NCCL's state polled until the
// work is launched, then cudaStreamSynchronize on every stream). The two
// alternate iteration by iteration. Prints one JSON object per size and a
// table; the ratio is transport / direct (1.00 = no overhead).
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

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/transport/nccl/cuda_nccl_api.h"
#include "agent/transport/nccl/local_gpus.h"
#include "agent/transport/nccl/nccl_communicator.h"
#include "agent/transport/nccl/nccl_transport.h"
#include "common/clock.h"
#include "gflags/gflags.h"

DEFINE_int64(min_bytes, int64_t{1} << 20, "Smallest allreduce, in bytes");
DEFINE_int64(max_bytes, int64_t{1} << 30, "Largest allreduce, in bytes");
DEFINE_int32(iterations, 20, "Timed iterations per size and side");
DEFINE_int32(warmup, 3, "Untimed iterations per size and side");
DEFINE_int64(timeout_ms, 60000, "Bound on each allreduce and on connecting");

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

struct Timings {
  std::vector<double> transport_us;
  std::vector<double> direct_us;
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
      FLAGS_iterations < 1 || FLAGS_warmup < 0 || FLAGS_timeout_ms < 1) {
    std::fprintf(stderr,
                 "baton-gpu-bench: give 4 <= --min_bytes <= --max_bytes, "
                 "--iterations >= 1, --warmup >= 0, --timeout_ms >= 1\n");
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
      if (i < FLAGS_warmup) continue;
      timings.transport_us.push_back(*ours);
      timings.direct_us.push_back(*theirs);
    }
    const double transport_us = Median(timings.transport_us);
    const double direct_us = Median(timings.direct_us);
    const double ratio = transport_us / direct_us;
    // Bytes each rank moves per second, as nccl-tests' algbw.
    const auto algbw = [&](double us) { return bytes / us / 1e3; };
    std::printf(
        "{\"bytes\": %lld, \"dtype\": \"float32\", \"ranks\": %d, "
        "\"iterations\": %d, \"transport_median_us\": %.1f, "
        "\"direct_median_us\": %.1f, \"transport_min_us\": %.1f, "
        "\"direct_min_us\": %.1f, \"ratio\": %.3f, "
        "\"transport_algbw_gbps\": %.2f, \"direct_algbw_gbps\": %.2f}\n",
        static_cast<long long>(bytes), ranks, FLAGS_iterations, transport_us,
        direct_us,
        *std::min_element(timings.transport_us.begin(),
                          timings.transport_us.end()),
        *std::min_element(timings.direct_us.begin(), timings.direct_us.end()),
        ratio, algbw(transport_us), algbw(direct_us));
    std::fflush(stdout);
    table.push_back(absl::StrFormat("# %10s %14.1f %14.1f %7.3f", Bytes(bytes),
                                    transport_us, direct_us, ratio));
  }
  std::printf("# allreduce float32 sum over %d rank(s), median of %d\n", ranks,
              FLAGS_iterations);
  std::printf("# %10s %14s %14s %7s\n", "size", "transport us", "direct us",
              "ratio");
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
      "baton-gpu-bench [--min_bytes N] [--max_bytes N] [--iterations N]\n"
      "The NCCL transport's allreduce against a direct ncclAllReduce.");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  return baton::agent::Run();
}
