// The baseline of the agent-path benchmark: plain gloo, as torch.distributed
// uses it on CPU. --ranks processes (started by the runner) rendezvous
// through a gloo FileStore, connect one TCP context, and time --iterations
// in-place float32 allreduces (gloo::allreduce, ring, default segments) of
// --bytes. Rank 0 prints one JSON line
// of timings (tools/bench/timings.h).
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <memory>
#include <vector>

#include "gflags/gflags.h"
#include "gloo/allreduce.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/transport/tcp/device.h"
#include "tools/bench/timings.h"

DEFINE_int64(bytes, 64 << 20, "tensor size (a multiple of 4)");
DEFINE_int32(iterations, 10, "timed allreduces");
DEFINE_int32(warmup, 2, "untimed allreduces first");
DEFINE_int32(rank, 0, "this process's rank");
DEFINE_int32(ranks, 2, "processes");
DEFINE_string(store_dir, "", "an empty directory shared by the ranks");
DEFINE_string(host, "127.0.0.1", "address to bind");

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  gloo::transport::tcp::attr attr;
  attr.hostname = FLAGS_host;
  auto device = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore store(FLAGS_store_dir);
  auto context =
      std::make_shared<gloo::rendezvous::Context>(FLAGS_rank, FLAGS_ranks);
  context->connectFullMesh(store, device);
  std::vector<float> data(FLAGS_bytes / 4, 1.0f);
  std::vector<int64_t> micros;
  for (int i = 0; i < FLAGS_warmup + FLAGS_iterations; ++i) {
    std::fill(data.begin(), data.begin() + 1, 1.0f);
    const auto start = std::chrono::steady_clock::now();
    gloo::AllreduceOptions opts(context);
    opts.setOutput(data.data(), data.size());
    opts.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(
            &gloo::sum<float>));
    gloo::allreduce(opts);
    const auto us = std::chrono::duration_cast<std::chrono::microseconds>(
                        std::chrono::steady_clock::now() - start)
                        .count();
    if (i >= FLAGS_warmup) micros.push_back(us);
  }
  if (FLAGS_rank == 0) {
    baton::bench::PrintTimings("gloo", FLAGS_bytes, FLAGS_ranks, micros);
  }
  return 0;
}
