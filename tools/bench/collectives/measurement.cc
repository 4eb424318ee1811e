#include "tools/bench/collectives/measurement.h"

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "tools/bench/timings.h"

namespace baton::bench {
namespace {

// The checked iteration's values, scale x (1 + (i + phase + run) mod period)
// at element i: small integers, exact in float32 for any sum over a few
// ranks, and shifted by the run so that a result left over from the previous
// run does not pass.
struct Pattern {
  float scale;
  int period;
  // Where in the period the first element is: a reduce-scatter's part r
  // (and an alltoall's block r) starts r parts into the whole tensor's
  // pattern.
  int64_t phase = 0;
};

// What the timed iterations run on (measurement.h: not zero).
constexpr float kTimedValue = 1.0f;

// Every op but broadcast reduces, gathers or exchanges (rank + 1) x the same
// pattern.
constexpr int kPeriod = 13;
constexpr int kBroadcastPeriod = 251;

Pattern InputPattern(CollectiveOp op, int rank) {
  if (op != CollectiveOp::kBroadcast) {
    return {static_cast<float>(rank + 1), kPeriod};
  }
  return rank == 0 ? Pattern{1, kBroadcastPeriod} : Pattern{-1, 1};
}

// What `ranks`' inputs of `elements` reduce to (allreduce, reduce-scatter).
float RankSum(int ranks) { return static_cast<float>(ranks * (ranks + 1) / 2); }

void FillPattern(Pattern pattern, int run, float* data, int64_t elements) {
  int k = static_cast<int>((pattern.phase + run) % pattern.period);
  for (int64_t i = 0; i < elements; ++i) {
    data[i] = pattern.scale * static_cast<float>(1 + k);
    if (++k == pattern.period) k = 0;
  }
}

// Whether `count` elements of this rank's result from `first` on hold
// `expected`; prints the first wrong one.
bool CheckPart(const char* system, CollectiveOp op, const CollectiveRank& r,
               int run, Pattern expected, const float* result, int64_t first,
               int64_t count, int64_t elements) {
  int k = static_cast<int>((expected.phase + run) % expected.period);
  for (int64_t i = first; i < first + count; ++i) {
    const float value = expected.scale * static_cast<float>(1 + k);
    if (result[i] != value) {
      std::fprintf(stderr,
                   "collectives: %s %s of %" PRId64
                   " floats over %d ranks is WRONG: rank %d result element "
                   "%" PRId64 " is %g, expected %g (run %d)\n",
                   system, CollectiveOpName(op), elements, r.size(), r.rank(),
                   i, result[i], value, run);
      return false;
    }
    if (++k == expected.period) k = 0;
  }
  return true;
}

bool CheckResult(const char* system, CollectiveOp op, const CollectiveRank& r,
                 int run, const float* result, int64_t elements) {
  if (result == nullptr) return true;
  const int ranks = r.size();
  switch (op) {
    case CollectiveOp::kAllreduce:
      return CheckPart(system, op, r, run, {RankSum(ranks), kPeriod}, result, 0,
                       elements, elements);
    case CollectiveOp::kBroadcast:
      return CheckPart(system, op, r, run, {1, kBroadcastPeriod}, result, 0,
                       elements, elements);
    case CollectiveOp::kAllgather:
      for (int part = 0; part < ranks; ++part) {
        if (!CheckPart(system, op, r, run, InputPattern(op, part), result,
                       part * elements, elements, elements)) {
          return false;
        }
      }
      return true;
    case CollectiveOp::kReduceScatter: {
      const int64_t part = elements / ranks;
      return CheckPart(system, op, r, run,
                       {RankSum(ranks), kPeriod, r.rank() * part}, result, 0,
                       part, elements);
    }
    case CollectiveOp::kAlltoall: {
      // Block s is rank s's block r: its scale says the source, its phase
      // the block (a part of 2^k elements is never a multiple of 13).
      const int64_t part = elements / ranks;
      for (int source = 0; source < ranks; ++source) {
        Pattern block = InputPattern(op, source);
        block.phase = r.rank() * part;
        if (!CheckPart(system, op, r, run, block, result, source * part, part,
                       elements)) {
          return false;
        }
      }
      return true;
    }
  }
  return false;
}

constexpr CollectiveOp kOps[] = {
    CollectiveOp::kAllreduce, CollectiveOp::kBroadcast,
    CollectiveOp::kAllgather, CollectiveOp::kReduceScatter,
    CollectiveOp::kAlltoall};

// A comma-separated list of op names; false (and a message on stderr) for
// an unknown one or an empty list.
bool ParseCollectiveOps(const std::string& text,
                        std::vector<CollectiveOp>* ops) {
  ops->clear();
  std::stringstream stream(text);
  std::string name;
  while (std::getline(stream, name, ',')) {
    bool known = false;
    for (CollectiveOp op : kOps) {
      if (name == CollectiveOpName(op)) {
        ops->push_back(op);
        known = true;
      }
    }
    if (!known) {
      std::fprintf(stderr,
                   "collectives: unknown op \"%s\" (allreduce, broadcast, "
                   "allgather, reducescatter, alltoall)\n",
                   name.c_str());
      return false;
    }
  }
  if (ops->empty()) {
    std::fprintf(stderr, "collectives: no op given\n");
    return false;
  }
  return true;
}

bool MeasureCollective(const char* system, CollectiveRank& rank,
                       CollectiveOp op, int64_t bytes,
                       const MeasurementOptions& options) {
  if (bytes <= 0 || bytes % 4 != 0 || options.iterations < 1 ||
      options.runs < 1 || options.warmup < 0) {
    std::fprintf(stderr,
                 "collectives: bytes %" PRId64
                 " must be a positive multiple of 4, iterations %d and runs "
                 "%d positive, warmup %d not negative\n",
                 bytes, options.iterations, options.runs, options.warmup);
    return false;
  }
  const int64_t elements = bytes / 4;
  if ((op == CollectiveOp::kReduceScatter || op == CollectiveOp::kAlltoall) &&
      elements % rank.size() != 0) {
    std::fprintf(stderr,
                 "collectives: a%s %s of %" PRId64
                 " floats does not split into %d equal parts\n",
                 op == CollectiveOp::kAlltoall ? "n" : "", CollectiveOpName(op),
                 elements, rank.size());
    return false;
  }
  float* input = rank.Prepare(op, elements);
  if (input == nullptr) return false;
  std::fill_n(input, elements, kTimedValue);
  for (int i = 0; i < options.warmup; ++i) {
    if (!rank.Run()) return false;
  }
  std::vector<double> run_seconds;
  for (int run = 0; run < options.runs; ++run) {
    if (!rank.Barrier()) return false;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < options.iterations; ++i) {
      if (!rank.Run()) return false;
    }
    const std::chrono::duration<double> elapsed =
        std::chrono::steady_clock::now() - start;
    double slowest = 0;
    if (!rank.Max(elapsed.count(), &slowest)) return false;
    run_seconds.push_back(slowest / options.iterations);

    FillPattern(InputPattern(op, rank.rank()), run, input, elements);
    if (!rank.Run() ||
        !CheckResult(system, op, rank, run, rank.Result(), elements)) {
      return false;
    }
    std::fill_n(input, elements, kTimedValue);
  }
  if (rank.rank() == 0) {
    PrintCollectiveRow(system, CollectiveOpName(op), rank.size(), bytes,
                       options.iterations, run_seconds);
  }
  return true;
}

}  // namespace

const char* CollectiveOpName(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kAllreduce:
      return "allreduce";
    case CollectiveOp::kBroadcast:
      return "broadcast";
    case CollectiveOp::kAllgather:
      return "allgather";
    case CollectiveOp::kReduceScatter:
      return "reducescatter";
    case CollectiveOp::kAlltoall:
      return "alltoall";
  }
  return "?";
}

int64_t ResultElements(CollectiveOp op, int64_t elements, int ranks) {
  switch (op) {
    case CollectiveOp::kAllgather:
      return elements * ranks;
    case CollectiveOp::kReduceScatter:
      return elements / ranks;
    default:
      return elements;
  }
}

bool MeasureCollectives(const char* system, CollectiveRank& rank,
                        const std::string& ops, int64_t bytes,
                        const MeasurementOptions& options) {
  std::vector<CollectiveOp> parsed;
  if (!ParseCollectiveOps(ops, &parsed)) return false;
  for (CollectiveOp op : parsed) {
    if (!MeasureCollective(system, rank, op, bytes, options)) return false;
  }
  return true;
}

}  // namespace baton::bench
