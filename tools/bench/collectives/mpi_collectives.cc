// OpenMPI's side of tools/bench/collectives: MPI_Allreduce (sum, float32,
// out of place), MPI_Bcast (from rank 0), MPI_Allgather,
// MPI_Reduce_scatter_block (sum, out of place) and MPI_Alltoall (out of
// place, --bytes / size per block) of --bytes on MPI_COMM_WORLD,
// measured as tools/bench/collectives/measurement.h says; rank 0 prints one
// row per op. Started by mpirun; which transport it uses is mpirun's choice
// (tools/bench/collectives/run pins TCP on loopback).
#include <mpi.h>

#include <climits>
#include <cstdio>
#include <vector>

#include "gflags/gflags.h"
#include "tools/bench/collectives/measurement.h"

DEFINE_int64(bytes, 1 << 20, "tensor size (a multiple of 4)");
DEFINE_int32(iterations, 10, "timed collectives per run");
DEFINE_int32(warmup, 2, "untimed collectives first");
DEFINE_int32(runs, 1, "runs of --iterations each");
DEFINE_string(ops, "allreduce,broadcast",
              "comma-separated allreduce (sum), broadcast (from rank 0), "
              "allgather, reducescatter (sum), alltoall");

namespace baton::bench {
namespace {

// MPI's default error handler aborts the job on any error, so the calls
// below only fail where the count does not fit an int.
class MpiRank : public CollectiveRank {
 public:
  MpiRank() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  float* Prepare(CollectiveOp op, int64_t elements) override {
    if (elements > INT_MAX) {
      std::fprintf(stderr, "mpi_collectives: %lld floats exceed MPI's int\n",
                   static_cast<long long>(elements));
      return nullptr;
    }
    op_ = op;
    input_.assign(elements, 0.0f);
    if (op == CollectiveOp::kBroadcast) {
      output_.clear();
    } else {
      output_.assign(ResultElements(op, elements, size_), 0.0f);
    }
    return input_.data();
  }

  bool Run() override {
    const int count = static_cast<int>(input_.size());
    switch (op_) {
      case CollectiveOp::kAllreduce:
        MPI_Allreduce(input_.data(), output_.data(), count, MPI_FLOAT, MPI_SUM,
                      MPI_COMM_WORLD);
        break;
      case CollectiveOp::kBroadcast:
        MPI_Bcast(input_.data(), count, MPI_FLOAT, 0, MPI_COMM_WORLD);
        break;
      case CollectiveOp::kAllgather:
        MPI_Allgather(input_.data(), count, MPI_FLOAT, output_.data(), count,
                      MPI_FLOAT, MPI_COMM_WORLD);
        break;
      case CollectiveOp::kReduceScatter:
        MPI_Reduce_scatter_block(input_.data(), output_.data(),
                                 static_cast<int>(output_.size()), MPI_FLOAT,
                                 MPI_SUM, MPI_COMM_WORLD);
        break;
      case CollectiveOp::kAlltoall:
        MPI_Alltoall(input_.data(), count / size_, MPI_FLOAT, output_.data(),
                     count / size_, MPI_FLOAT, MPI_COMM_WORLD);
        break;
    }
    return true;
  }

  const float* Result() const override {
    return op_ == CollectiveOp::kBroadcast ? input_.data() : output_.data();
  }

  bool Barrier() override {
    MPI_Barrier(MPI_COMM_WORLD);
    return true;
  }

  bool Max(double value, double* max) override {
    MPI_Allreduce(&value, max, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return true;
  }

 private:
  int rank_ = 0;
  int size_ = 1;
  CollectiveOp op_ = CollectiveOp::kAllreduce;
  std::vector<float> input_;
  // The receive buffer; a broadcast works in place on input_.
  std::vector<float> output_;
};

}  // namespace
}  // namespace baton::bench

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  baton::bench::MpiRank rank;
  if (!baton::bench::MeasureCollectives(
          "mpi", rank, FLAGS_ops, FLAGS_bytes,
          {FLAGS_warmup, FLAGS_iterations, FLAGS_runs})) {
    MPI_Abort(MPI_COMM_WORLD, 4);
  }
  MPI_Finalize();
  return 0;
}
