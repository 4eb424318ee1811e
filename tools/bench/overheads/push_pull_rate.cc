// Per-call overhead of the agent path: one trainer on one node pushes
// 4-byte tensors through its agent, --in_flight at a time (enqueue all, then
// wait for all), for --rounds rounds. Prints one JSON line: calls per second
// and the p50/p99 of one round (enqueue of the first to completion of the
// last). With --in_flight=1 the round is the enqueue-to-completion latency
// of a single push_pull.
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "baton/client.h"
#include "gflags/gflags.h"

DEFINE_int32(in_flight, 1, "tensors enqueued together per round, 1..1024");
DEFINE_int32(rounds, 10000, "timed rounds");
DEFINE_int32(warmup, 200, "untimed rounds first");

namespace baton {
namespace {

int Fail(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "push_pull_rate: %s: %s\n", what.c_str(),
               std::string(status.message()).c_str());
  return 3;
}

int Main() {
  if (FLAGS_in_flight < 1 || FLAGS_in_flight > 1024 || FLAGS_rounds < 1 ||
      FLAGS_warmup < 0) {
    std::fprintf(stderr,
                 "push_pull_rate: give --in_flight in 1..1024, --rounds >= 1 "
                 "and --warmup >= 0\n");
    return 2;
  }
  absl::StatusOr<ClientOptions> options = ClientOptions::FromEnvironment();
  if (!options.ok()) return Fail("environment", options.status());
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(*options);
  if (!client.ok()) return Fail("attach", client.status());
  std::vector<v1::TensorSpec> specs(FLAGS_in_flight);
  for (int i = 0; i < FLAGS_in_flight; ++i) {
    specs[i].set_name(absl::StrCat("rate.", i));
    specs[i].set_dtype(v1::DATA_TYPE_FLOAT32);
    specs[i].add_shape(1);
    specs[i].set_op(v1::COLLECTIVE_OP_PUSH_PULL);
  }
  absl::StatusOr<std::vector<std::shared_ptr<Tensor>>> tensors =
      (*client)->Declare(specs);
  if (!tensors.ok()) return Fail("declare", tensors.status());
  for (const auto& t : *tensors) *reinterpret_cast<float*>(t->input()) = 1.0f;

  std::vector<int64_t> micros;
  micros.reserve(FLAGS_rounds);
  std::vector<std::shared_ptr<Handle>> handles(FLAGS_in_flight);
  std::chrono::steady_clock::time_point timed_start;
  for (int round = 0; round < FLAGS_warmup + FLAGS_rounds; ++round) {
    if (round == FLAGS_warmup) timed_start = std::chrono::steady_clock::now();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < FLAGS_in_flight; ++i) {
      absl::StatusOr<std::shared_ptr<Handle>> handle =
          (*client)->PushPullAsync(*(*tensors)[i], round, false);
      if (!handle.ok()) return Fail("enqueue", handle.status());
      handles[i] = std::move(*handle);
    }
    for (const auto& handle : handles) {
      absl::Status status = handle->Wait(std::chrono::minutes(1));
      if (!status.ok()) return Fail(absl::StrCat("round ", round), status);
    }
    if (round >= FLAGS_warmup) {
      micros.push_back(std::chrono::duration_cast<std::chrono::microseconds>(
                           std::chrono::steady_clock::now() - start)
                           .count());
    }
  }
  const double seconds = std::chrono::duration<double>(
                             std::chrono::steady_clock::now() - timed_start)
                             .count();
  const float expected = static_cast<float>((*client)->size());
  for (const auto& t : *tensors) {
    if (*reinterpret_cast<const float*>(t->output()) != expected) {
      std::fprintf(stderr, "push_pull_rate: wrong result in %s\n",
                   t->spec().name().c_str());
      return 4;
    }
  }
  std::sort(micros.begin(), micros.end());
  const auto at = [&](double q) {
    return micros[std::min(micros.size() - 1,
                           static_cast<size_t>(q * micros.size()))];
  };
  std::printf(
      "{\"bench\":\"push_pull_rate\",\"in_flight\":%d,\"rounds\":%d,"
      "\"calls_per_s\":%.0f,\"round_p50_us\":%" PRId64
      ",\"round_p99_us\":%" PRId64 ",\"round_max_us\":%" PRId64 "}\n",
      FLAGS_in_flight, FLAGS_rounds,
      static_cast<double>(FLAGS_rounds) * FLAGS_in_flight / seconds, at(0.5),
      at(0.99), micros.back());
  std::fflush(stdout);
  (*client)->Detach(true).IgnoreError();
  return 0;
}

}  // namespace
}  // namespace baton

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  return baton::Main();
}
