#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace baton::agent {

// Chooses partition_bytes and credit_bytes online from this node's own
// collective timings (ByteScheduler's two knobs, without its ~1,700-step
// Bayesian search): a latency/bandwidth model t = latency + bytes /
// bandwidth, fitted over a sliding window of recent collectives, and a rule
// that turns the fit into a partition size and a credit. With the default
// options it settles within the first window of 128 collectives (a training
// step runs tens of them or more, so within a few steps), and re-fits as the
// window slides, so a link that changes (other jobs, a different route) is
// followed within one window.
//
// How the scheduler uses it (the contract for the data plane):
//   - One tuner per data plane (one job, one node, one generation), built
//     with the data plane's number of host data channels and the values the
//     job starts with as initial_partition_bytes / initial_credit_bytes.
//   - Each worker calls Add() when a host collective returns: the wall time
//     of the collective call only, not its queueing or local reduction, and
//     the bytes that crossed the link meanwhile: its own (a fused launch:
//     its packed bytes) times the host collectives running beside it, itself
//     included (the channels share one link; counting only its own bytes
//     would read the time spent behind the others as latency, and the fit
//     would grow partitions with the load). The fit's bandwidth is then the
//     link's. Failed or aborted collectives are not added. The CUDA device
//     worker's collectives run on another link and are not added.
//   - Each node proposes: the scheduler puts Propose()'s two values into its
//     negotiation vector, and the round's element-wise minimum gives every
//     node the same values in the same round. A node without a fit proposes
//     the values in use: it can hold the others back from growing them,
//     never push them anywhere. The minimum is safe: a smaller partition
//     costs a little bandwidth, never correctness, and credit_bytes >=
//     partition_bytes holds for the minima because it holds for every
//     proposal.
//   - A change applies to the operations agreed from that round on: their
//     partitions use the new partition_bytes, and admission uses the new
//     credit from that round on; operations agreed earlier keep the
//     partitioning they were agreed with (every node computes the same
//     partitions for an agreed operation). The scheduler calls SetApplied()
//     with the agreed values on every node whenever it applies them, so the
//     hysteresis below is relative to the values actually in use, the same
//     on all nodes.
//   - Explicit settings win: when the user set --partition_bytes (the
//     coordinator's or the job's), --credit_bytes, or BATON_PARTITION_BYTES,
//     that value is used on every node and the tuner's proposal for it is
//     ignored (the other value may still be tuned).
//
// The model (fit()): samples are grouped by size (powers of two: a group
// holds [2^k, 2^(k+1)) bytes), each group with at least three samples gives
// one point (median bytes, median time), and the line is fitted to those
// points by least squares on relative error. The medians make one preempted
// collective, 10x slower, count for nothing; the relative error keeps the
// small transfers, which measure the latency, from being drowned by the
// large ones, which measure the bandwidth. A fit needs min_samples samples
// in those groups and group sizes spanning at least 2x; otherwise there is
// none and Propose() keeps the values in use (so a job whose collectives
// are all of one size keeps its configured values).
//
// The rule (Propose()):
//   - partition_bytes: the smallest power of two p (clamped to [min, max])
//     whose latency is at most the share f = overhead_fraction of its time:
//     latency <= f * (latency + p / bandwidth), i.e.
//     p >= latency * bandwidth * (1 - f) / f. Smaller partitions let an
//     urgent tensor preempt sooner; larger ones waste less per partition,
//     and past that point they save less than f of the time.
//   - credit_bytes: (channels + spares) * partition_bytes with spares =
//     max(1, ceil(channels * latency / (latency + partition_bytes /
//     bandwidth))): every channel busy, plus enough partitions queued to
//     cover the partitions the channels return during the negotiation round
//     that replaces one (a small exchange, taken to last about the fitted
//     latency). At the rule's partition a partition takes >= 10 latencies
//     (f = 0.1), so up to 10 channels get (channels + 1) * partition_bytes;
//     latency-bound partitions (clamped at the maximum) get up to
//     2 * channels * partition_bytes. The reasoning is at CreditFor.
//   - Hysteresis: the partition in use is kept unless the new one differs
//     from it by more than 2x (a neighbouring power of two is what noise on
//     a fit near a boundary gives, so it is not enough to change); a new
//     partition always brings its own credit. The credit in use is kept
//     while it is at least what the rule asks for and at most twice that.
//   - A change also needs a steady window: its older and its newer half,
//     each fitted alone (with min_samples of its own), choose the same
//     partition as the whole window. While the link changes, the window
//     mixes two links, and a fit of the mixture can land anywhere (a
//     100 Mbit/s link turning into a 1 Gbit/s one passes through 32 KiB on
//     its way from 8 KiB to 256 KiB); the halves disagree until the new link
//     holds most of the window, so the change comes once, to the new link's
//     value, between half a window and a window after the link changed. On
//     a steady link it keeps an early, noisy fit from deciding: the first
//     change needs at least 2 * min_samples samples, and comes once three
//     fits agree.
//
// Deterministic: the same samples in the same order give the same fits and
// proposals. Thread-safe: every method may be called from any thread.
class PartitionTuner {
 public:
  struct Options {
    // Host collectives the data plane runs at once (its data channels).
    int channels = 1;
    // The bounds of partition_bytes: multiples of 8, min <= max <= 1 GiB
    // (the coordinator's largest partition).
    int64_t min_partition_bytes = 256 << 10;
    int64_t max_partition_bytes = 64 << 20;
    // The values in use before anything was applied (and without a fit).
    int64_t initial_partition_bytes = 4 << 20;
    int64_t initial_credit_bytes = 16 << 20;
    // The most recent samples the fit uses; older ones age out.
    size_t window = 128;
    // Samples (in size groups of at least three) a fit needs, >= 6; each
    // half of the window needs as many before a change (window >=
    // 2 * min_samples).
    size_t min_samples = 16;
    // f of the rule: the share of a partition's time (latency included) its
    // latency may take; in (0, 1).
    double overhead_fraction = 0.1;
  };

  // One collective: the bytes it moved and the wall time of the collective
  // alone.
  struct Sample {
    int64_t bytes = 0;
    absl::Duration took;
  };

  // t = latency + bytes / bytes_per_second over the window.
  struct Fit {
    // >= 0 (a negative intercept is clamped: see FitSamples).
    absl::Duration latency;
    // > 0 (a fit without it is no fit).
    double bytes_per_second = 0;
    // Samples the fit used: those in size groups of at least three.
    size_t samples = 0;
    // The median of |took - predicted| / predicted over those samples: how
    // well the line explains them (about 0.05 for +-10% jitter).
    double residual = 0;
  };

  // Propose() returns credit_bytes >= partition_bytes. The values it
  // chooses are multiples of 8, the partition within the bounds; the values
  // it keeps are the ones in use.
  struct Proposal {
    int64_t partition_bytes = 0;
    int64_t credit_bytes = 0;
  };

  // OK when `options` are usable: the bounds above, channels >= 1,
  // min_samples >= 6 (two sizes of three samples), window >=
  // 2 * min_samples.
  // Callers check options that come from a user before constructing.
  static absl::Status Validate(const Options& options);

  // CHECK-fails on options Validate rejects.
  explicit PartitionTuner(Options options);

  PartitionTuner(const PartitionTuner&) = delete;
  PartitionTuner& operator=(const PartitionTuner&) = delete;

  // Records one collective; the oldest sample leaves a full window. A
  // sample with no bytes or no measured time says nothing about the link
  // and is ignored. O(1).
  void Add(Sample sample);

  // The model over the current window; nullopt without enough samples or
  // sizes, or when time does not grow with size. O(window).
  std::optional<Fit> fit() const;

  // What this node proposes from the next agreed boundary on (the rule
  // above); the values in use while there is no fit. O(window): three
  // fits, on a copy of the window taken under the lock, so Add never waits
  // for them.
  Proposal Propose() const;

  // The values the nodes agreed and now use; Propose's hysteresis is
  // relative to them. Positive; partition_bytes a multiple of 8.
  void SetApplied(Proposal applied);
  Proposal applied() const;

 private:
  // The window, oldest sample first.
  std::vector<Sample> WindowLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The model over `samples` (any order), which needs `min_samples` in size
  // groups of three.
  std::optional<Fit> FitSamples(const std::vector<Sample>& samples,
                                size_t min_samples) const;
  // Whether both halves of `window` (oldest first), fitted alone, give
  // `partition_bytes`, the whole window's choice; a half without a fit
  // does not.
  bool Steady(const std::vector<Sample>& window, int64_t partition_bytes) const;
  // Propose() for this window and the values in use.
  Proposal ProposeFor(const std::vector<Sample>& window,
                      Proposal applied) const;
  // The rule's partition_bytes for `fit`, before hysteresis.
  int64_t PartitionFor(const Fit& fit) const;
  // The rule's credit_bytes for partitions of `partition_bytes`.
  int64_t CreditFor(int64_t partition_bytes, const Fit& fit) const;

  // Constant after construction.
  const Options options_;

  mutable absl::Mutex mu_;
  // The window as a ring: the oldest sample is at next_ once it is full.
  std::vector<Sample> samples_ ABSL_GUARDED_BY(mu_);
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;
  Proposal applied_ ABSL_GUARDED_BY(mu_);
  // Samples added so far, and the last proposal with what it was made from.
  uint64_t added_ ABSL_GUARDED_BY(mu_) = 0;
  struct Cached {
    uint64_t added = 0;
    Proposal applied;
    Proposal proposal;
  };
  mutable std::optional<Cached> cached_ ABSL_GUARDED_BY(mu_);
};

}  // namespace baton::agent
