#pragma once

// The measurement every C++ program of tools/bench/collectives shares (baton
// through its agents, raw gloo, OpenMPI), so that the systems differ only in
// the collective itself; torch_collectives.py follows the same steps.
//
// Per op: `warmup` untimed iterations; then each run is a barrier,
// `iterations` timed collectives back to back, and the slowest rank's total
// divided by `iterations`. After each run one more, untimed collective on a
// rank- and run-dependent pattern is checked on every rank. The timed
// iterations run on ones, never zeros: baton's TCP rings leave out 1 KiB
// blocks that are all zero (--skip_zero_blocks), so zeros would time a
// transfer the others make in full. An in-place allreduce grows the ones
// to inf over the iterations, which costs x86 float arithmetic nothing
// (only subnormals are slow). Rank 0 prints the row (tools/bench/timings.h).
//
// The size of an op (`bytes`, what the rows call bytes) is what every rank
// gives as its input:
//   allreduce      the tensor; each rank gets the sum
//   broadcast      the tensor; rank 0's reaches every rank
//   allgather      one rank's part; each rank gets size() parts, in rank order
//   reducescatter  the whole tensor (a multiple of size() elements); rank r
//                  gets the sum of part r, 1/size() of it
//   alltoall       the whole tensor (a multiple of size() elements), cut
//                  into size() blocks; rank r gets block r of every rank,
//                  in rank order, as many bytes as it gave

#include <cstdint>
#include <string>

namespace baton::bench {

enum class CollectiveOp {
  kAllreduce,
  kBroadcast,
  kAllgather,
  kReduceScatter,
  kAlltoall
};

// "allreduce", "broadcast", "allgather", "reducescatter" or "alltoall".
const char* CollectiveOpName(CollectiveOp op);

// Elements of the result of `op` on an input of `elements` over `ranks`.
int64_t ResultElements(CollectiveOp op, int64_t elements, int ranks);

// One rank of a system under test. Every method but rank(), size() and
// Result() is collective: all ranks call it in the same order. A method that
// returns false has printed why on stderr; the program then exits.
class CollectiveRank {
 public:
  virtual ~CollectiveRank() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Sets up the float32 buffers for `op` on an input of `elements` (the
  // op's size, above) and returns the one this rank writes its input to
  // (the root's data for a broadcast), or nullptr on failure. Invalidates
  // earlier buffers.
  virtual float* Prepare(CollectiveOp op, int64_t elements) = 0;
  // Runs the prepared op once: a sum allreduce, a broadcast from rank 0, an
  // allgather, a sum reduce-scatter, or an alltoall.
  virtual bool Run() = 0;
  // Where the last Run left this rank's result (ResultElements of it);
  // nullptr where the system keeps none on this rank (baton's broadcast root
  // reads its own input).
  virtual const float* Result() const = 0;

  virtual bool Barrier() = 0;
  // The largest `value` over the ranks, on every rank.
  virtual bool Max(double value, double* max) = 0;
};

struct MeasurementOptions {
  int warmup = 1;
  int iterations = 10;
  int runs = 1;
};

// Measures each of `ops` (comma-separated op names) on `bytes` (a positive
// multiple of 4; for a reduce-scatter or an alltoall, of 4 x size()) in
// turn, as described above; rank 0 prints a row per op.
// False when the arguments are wrong, a collective failed or a check found a
// wrong result: stderr says which (the first wrong element).
bool MeasureCollectives(const char* system, CollectiveRank& rank,
                        const std::string& ops, int64_t bytes,
                        const MeasurementOptions& options);

}  // namespace baton::bench
