// A trainer whose every result is known exactly (tools/bench/negotiation/
// namespaces): each step it push-pulls --tensors int64 tensors of different
// sizes, all at once, rank r's element e of tensor i at step s holding
// (r + 1)(s + 1)(i + 1) + e, so the sum over the N ranks is
// (s + 1)(i + 1) N(N + 1)/2 + N e. It checks every element of every result
// and exits 4 at the first that differs. Prints one JSON line: the steps,
// the step time's p50 and p99 (enqueue of the first tensor to completion
// of the last) and the elements checked.
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "baton/session.h"
#include "gflags/gflags.h"

DEFINE_int32(tensors, 32, "tensors per step, 1..1024");
DEFINE_int32(elements, 64,
             "elements of tensor 0; tensor i has elements x (1 + i % 8)");
DEFINE_int32(steps, 50, "steps");

namespace {

int Fail(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "exact_push_pull: %s: %s\n", what.c_str(),
               status.ToString().c_str());
  return 3;
}

int Run() {
  if (FLAGS_tensors < 1 || FLAGS_tensors > 1024 || FLAGS_elements < 1 ||
      FLAGS_steps < 1) {
    std::fprintf(stderr,
                 "exact_push_pull: give --tensors in 1..1024, --elements >= 1 "
                 "and --steps >= 1\n");
    return 2;
  }
  absl::StatusOr<std::unique_ptr<baton::Session>> init = baton::Session::Init();
  if (!init.ok()) return Fail("init", init.status());
  baton::Session& session = **init;
  const int64_t rank = session.rank();
  const int64_t n = session.size();
  std::vector<std::vector<int64_t>> data(FLAGS_tensors);
  for (int i = 0; i < FLAGS_tensors; ++i) {
    data[i].resize(static_cast<size_t>(FLAGS_elements) * (1 + i % 8));
  }
  std::vector<int64_t> step_us;
  int64_t checked = 0;
  for (int64_t step = 0; step < FLAGS_steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    std::vector<baton::OperationHandle> handles;
    for (int i = 0; i < FLAGS_tensors; ++i) {
      std::vector<int64_t>& d = data[i];
      for (size_t e = 0; e < d.size(); ++e) {
        d[e] = (rank + 1) * (step + 1) * (i + 1) + static_cast<int64_t>(e);
      }
      absl::StatusOr<baton::OperationHandle> handle =
          session.PushPullAsync(absl::StrCat("exact.", i),
                                {d.data(),
                                 baton::v1::DATA_TYPE_INT64,
                                 {static_cast<int64_t>(d.size())}},
                                /*average=*/false);
      if (!handle.ok()) {
        return Fail(absl::StrCat("step ", step, " tensor ", i),
                    handle.status());
      }
      handles.push_back(*handle);
    }
    for (int i = 0; i < FLAGS_tensors; ++i) {
      absl::Status status =
          session.Synchronize(handles[i], std::chrono::minutes(2));
      if (!status.ok()) {
        return Fail(absl::StrCat("step ", step, " tensor ", i), status);
      }
    }
    step_us.push_back(std::chrono::duration_cast<std::chrono::microseconds>(
                          std::chrono::steady_clock::now() - start)
                          .count());
    for (int i = 0; i < FLAGS_tensors; ++i) {
      const std::vector<int64_t>& d = data[i];
      for (size_t e = 0; e < d.size(); ++e) {
        const int64_t want = (step + 1) * (i + 1) * n * (n + 1) / 2 +
                             n * static_cast<int64_t>(e);
        if (d[e] != want) {
          std::fprintf(stderr,
                       "exact_push_pull: rank %" PRId64 " step %" PRId64
                       " tensor exact.%d element %zu is %" PRId64
                       ", the sum over %" PRId64 " ranks is %" PRId64 "\n",
                       rank, step, i, e, d[e], n, want);
          return 4;
        }
        ++checked;
      }
    }
  }
  absl::Status status = session.Shutdown();
  if (!status.ok()) return Fail("shutdown", status);
  std::sort(step_us.begin(), step_us.end());
  const auto at = [&](double q) {
    return step_us[std::min(step_us.size() - 1,
                            static_cast<size_t>(q * step_us.size()))];
  };
  std::printf("{\"rank\": %" PRId64 ", \"size\": %" PRId64
              ", \"steps\": %d, \"tensors\": %d, \"elements_checked\": %" PRId64
              ", \"step_p50_us\": %" PRId64 ", \"step_p99_us\": %" PRId64 "}\n",
              rank, n, FLAGS_steps, FLAGS_tensors, checked, at(0.5), at(0.99));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "push-pulls int64 tensors with known sums and checks every element; "
      "start it with batonrun");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  return Run();
}
