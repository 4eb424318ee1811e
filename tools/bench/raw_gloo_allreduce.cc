// The baseline of the agent-path benchmark: plain gloo, as torch.distributed
// uses it on CPU. --ranks processes (started by the runner) rendezvous
// through a gloo FileStore, connect one TCP context, and time --iterations
// in-place float32 allreduces (gloo::allreduce, ring, default segments) of
// --bytes. Rank 0 prints one JSON line
// of timings (tools/bench/timings.h).
//
// With --runs > 0 it is instead raw gloo's side of tools/bench/collectives:
// the --ops on --bytes, measured as tools/bench/collectives/measurement.h
// says; rank 0 prints one row per op. allreduce: gloo::allreduce in place as
// above; broadcast: gloo::broadcast from rank 0; allgather: gloo::allgather
// (ring) into a separate output (what torch's ProcessGroupGloo calls for
// all three); reducescatter: gloo::ReduceScatterHalvingDoubling (sum, in
// place), the only reduce-scatter libgloo has (torch 1.13 calls none);
// alltoall: gloo::alltoall (every rank sends each peer its block directly)
// into a separate output, what torch's all_to_all_single calls for equal
// splits.
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <memory>
#include <vector>

#include "gflags/gflags.h"
#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/alltoall.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/common/error.h"
#include "gloo/math.h"
#include "gloo/reduce_scatter.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/transport/tcp/device.h"
#include "tools/bench/collectives/measurement.h"
#include "tools/bench/timings.h"

DEFINE_int64(bytes, 64 << 20, "tensor size (a multiple of 4)");
DEFINE_int32(iterations, 10, "timed allreduces");
DEFINE_int32(warmup, 2, "untimed allreduces first");
DEFINE_int32(rank, 0, "this process's rank");
DEFINE_int32(ranks, 2, "processes");
DEFINE_string(store_dir, "", "an empty directory shared by the ranks");
DEFINE_string(host, "127.0.0.1", "address to bind");
DEFINE_int32(runs, 0,
             "0: time --iterations allreduces and print percentiles; > 0: "
             "measure --ops for tools/bench/collectives, this many runs of "
             "--iterations each");
DEFINE_string(ops, "allreduce",
              "with --runs: comma-separated allreduce (sum), broadcast (from "
              "rank 0), allgather, reducescatter (sum), alltoall");

namespace baton::bench {
namespace {

using ReduceFunction = void (*)(void*, const void*, const void*, size_t);

// One rank on one gloo context: allreduce and broadcast in place on one
// buffer, allgather and alltoall into a second one. The reduce-scatter, an
// algorithm object of gloo's older API, runs on a context of its own:
// running such an algorithm on a context slows the newer collectives on it
// 50-100x (docs/benchmarks.md, "Allgather and reduce-scatter").
class GlooRank : public CollectiveRank {
 public:
  GlooRank(std::shared_ptr<gloo::Context> context,
           gloo::rendezvous::Store& store,
           std::shared_ptr<gloo::transport::Device> device)
      : context_(std::move(context)),
        store_(store),
        device_(std::move(device)) {}

  int rank() const override { return context_->rank; }
  int size() const override { return context_->size; }

  float* Prepare(CollectiveOp op, int64_t elements) override {
    op_ = op;
    reduce_scatter_.reset();
    buffer_.assign(elements, 0.0f);
    output_.clear();
    if (op == CollectiveOp::kAllgather || op == CollectiveOp::kAlltoall) {
      output_.assign(ResultElements(op, elements, size()), 0.0f);
    }
    if (op == CollectiveOp::kReduceScatter &&
        !Catching("reducescatter setup", [&] {
          const std::vector<int> parts(
              size(), static_cast<int>(ResultElements(op, elements, size())));
          reduce_scatter_ =
              std::make_unique<gloo::ReduceScatterHalvingDoubling<float>>(
                  ReduceScatterContext(), std::vector<float*>{buffer_.data()},
                  static_cast<int>(elements), parts);
        })) {
      return nullptr;
    }
    return buffer_.data();
  }

  bool Run() override {
    return Catching(CollectiveOpName(op_), [&] {
      switch (op_) {
        case CollectiveOp::kAllreduce: {
          gloo::AllreduceOptions opts(context_);
          opts.setOutput(buffer_.data(), buffer_.size());
          opts.setReduceFunction(
              static_cast<ReduceFunction>(&gloo::sum<float>));
          gloo::allreduce(opts);
          break;
        }
        case CollectiveOp::kBroadcast: {
          gloo::BroadcastOptions opts(context_);
          opts.setOutput(buffer_.data(), buffer_.size());
          opts.setRoot(0);
          gloo::broadcast(opts);
          break;
        }
        case CollectiveOp::kAllgather: {
          gloo::AllgatherOptions opts(context_);
          opts.setInput(buffer_.data(), buffer_.size());
          opts.setOutput(output_.data(), output_.size());
          gloo::allgather(opts);
          break;
        }
        case CollectiveOp::kReduceScatter:
          reduce_scatter_->run();
          break;
        case CollectiveOp::kAlltoall: {
          gloo::AlltoallOptions opts(context_);
          opts.setInput(buffer_.data(), buffer_.size());
          opts.setOutput(output_.data(), output_.size());
          gloo::alltoall(opts);
          break;
        }
      }
    });
  }

  // The reduce-scatter leaves this rank's part at the buffer's start.
  const float* Result() const override {
    return output_.empty() ? buffer_.data() : output_.data();
  }

  bool Barrier() override {
    return Catching("barrier", [&] {
      gloo::BarrierOptions opts(context_);
      gloo::barrier(opts);
    });
  }

  bool Max(double value, double* max) override {
    *max = value;
    return Catching("max", [&] {
      gloo::AllreduceOptions opts(context_);
      opts.setOutput(max, 1);
      opts.setReduceFunction(static_cast<ReduceFunction>(&gloo::max<double>));
      gloo::allreduce(opts);
    });
  }

 private:
  // gloo reports errors by exception; this program reports them by value.
  template <typename F>
  static bool Catching(const char* what, F collective) {
    try {
      collective();
      return true;
    } catch (const gloo::Exception& e) {
      std::fprintf(stderr, "raw_gloo: %s: %s\n", what, e.what());
      return false;
    }
  }

  // The context of the older API's algorithms, connected on first use (all
  // ranks prepare the same ops in the same order).
  std::shared_ptr<gloo::Context> ReduceScatterContext() {
    if (reduce_scatter_context_ == nullptr) {
      gloo::rendezvous::PrefixStore prefixed("reducescatter", store_);
      auto context =
          std::make_shared<gloo::rendezvous::Context>(rank(), size());
      context->connectFullMesh(prefixed, device_);
      reduce_scatter_context_ = std::move(context);
    }
    return reduce_scatter_context_;
  }

  const std::shared_ptr<gloo::Context> context_;
  gloo::rendezvous::Store& store_;
  // Not const: connectFullMesh takes it by non-const reference.
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> reduce_scatter_context_;
  CollectiveOp op_ = CollectiveOp::kAllreduce;
  std::vector<float> buffer_;
  // The allgather's and the alltoall's result; empty for the others.
  std::vector<float> output_;
  std::unique_ptr<gloo::ReduceScatterHalvingDoubling<float>> reduce_scatter_;
};

}  // namespace
}  // namespace baton::bench

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  gloo::transport::tcp::attr attr;
  attr.hostname = FLAGS_host;
  auto device = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore store(FLAGS_store_dir);
  auto context =
      std::make_shared<gloo::rendezvous::Context>(FLAGS_rank, FLAGS_ranks);
  context->connectFullMesh(store, device);
  if (FLAGS_runs > 0) {
    baton::bench::GlooRank rank(context, store, device);
    return baton::bench::MeasureCollectives(
               "gloo", rank, FLAGS_ops, FLAGS_bytes,
               {FLAGS_warmup, FLAGS_iterations, FLAGS_runs})
               ? 0
               : 4;
  }
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
