// One trainer's side of the agent-path benchmark: attaches through the
// environment (like any trainer), declares one float32 tensor of --bytes,
// and times --iterations push_pulls (enqueue -> completion). The input is
// written once; each iteration is the agent path only: local reduction,
// the scheduler, gloo between nodes, the completion event. Rank 0 prints
// one JSON line of timings (tools/bench/timings.h).
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <vector>

#include "baton/client.h"
#include "gflags/gflags.h"
#include "tools/bench/timings.h"

DEFINE_int64(bytes, 64 << 20, "tensor size (a multiple of 4)");
DEFINE_int32(iterations, 10, "timed push_pulls");
DEFINE_int32(warmup, 2, "untimed push_pulls first");

namespace baton {
namespace {

int Main() {
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
  v1::TensorSpec spec;
  spec.set_name("bench");
  spec.set_dtype(v1::DATA_TYPE_FLOAT32);
  spec.add_shape(FLAGS_bytes / 4);
  spec.set_op(v1::COLLECTIVE_OP_PUSH_PULL);
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
    auto handle = (*client)->PushPullAsync(tensor, i, false);
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
  const float expected = static_cast<float>((*client)->size());
  if (reinterpret_cast<const float*>(tensor.output())[0] != expected) {
    std::fprintf(stderr, "agent_allreduce: wrong result\n");
    return 4;
  }
  if ((*client)->rank() == 0) {
    bench::PrintTimings("agent", FLAGS_bytes, (*client)->size(), micros);
  }
  (*client)->Detach(true).IgnoreError();
  return 0;
}

}  // namespace
}  // namespace baton

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  return baton::Main();
}
