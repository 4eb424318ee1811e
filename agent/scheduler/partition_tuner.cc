#include "agent/scheduler/partition_tuner.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace baton::agent {
namespace {

// The coordinator's largest partition (coordinator/job.h).
constexpr int64_t kMaxPartitionBytes = int64_t{1} << 30;
// Keeps (channels + spares) * partition far from overflowing.
constexpr int kMaxChannels = 1 << 16;
// A size group's median ignores one outlier only with three samples.
constexpr size_t kMinSamplesPerSize = 3;
// The largest over the smallest size the fit's points must span: closer
// sizes leave the slope to the noise.
constexpr double kMinSizeSpan = 2.0;
// A partition in use changes only for one more than this factor away.
constexpr double kChangeRatio = 2.0;

// The size group of `bytes` (> 0): k with 2^k <= bytes < 2^(k+1).
int SizeGroup(int64_t bytes) {
  int group = 0;
  while ((bytes >> (group + 1)) != 0) ++group;
  return group;
}

// The median of `values` (not empty), reordering them; the mean of the two
// middle ones for an even count.
double Median(std::vector<double>& values) {
  const size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + mid, values.end());
  const double upper = values[mid];
  if (values.size() % 2 == 1) return upper;
  const double lower = *std::max_element(values.begin(), values.begin() + mid);
  return (lower + upper) / 2;
}

bool FarApart(int64_t a, int64_t b) {
  return static_cast<double>(std::max(a, b)) >
         kChangeRatio * static_cast<double>(std::min(a, b));
}

}  // namespace

absl::Status PartitionTuner::Validate(const Options& options) {
  const auto bad = [](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat(parts...));
  };
  if (options.channels < 1 || options.channels > kMaxChannels) {
    return bad("PartitionTuner channels is ", options.channels,
               "; it must be in 1..", kMaxChannels);
  }
  if (options.min_partition_bytes < 8 || options.min_partition_bytes % 8 != 0 ||
      options.max_partition_bytes < options.min_partition_bytes ||
      options.max_partition_bytes % 8 != 0 ||
      options.max_partition_bytes > kMaxPartitionBytes) {
    return bad("PartitionTuner partition bounds are ",
               options.min_partition_bytes, "..", options.max_partition_bytes,
               "; they must be multiples of 8 with 8 <= min <= max <= ",
               kMaxPartitionBytes);
  }
  if (options.initial_partition_bytes < 8 ||
      options.initial_partition_bytes % 8 != 0 ||
      options.initial_partition_bytes > kMaxPartitionBytes ||
      options.initial_credit_bytes <= 0) {
    return bad("PartitionTuner initial values are partition ",
               options.initial_partition_bytes, " and credit ",
               options.initial_credit_bytes,
               "; the partition must be a multiple of 8 in 8..",
               kMaxPartitionBytes, " and the credit positive");
  }
  if (options.min_samples < 2 * kMinSamplesPerSize ||
      options.window < 2 * options.min_samples) {
    return bad("PartitionTuner window is ", options.window, " and min_samples ",
               options.min_samples, "; min_samples must be at least ",
               2 * kMinSamplesPerSize,
               " (two sizes of three samples) and the window at least twice "
               "min_samples (a change needs a fit of each half)");
  }
  if (!(options.overhead_fraction > 0 && options.overhead_fraction < 1)) {
    return bad("PartitionTuner overhead_fraction is ",
               options.overhead_fraction, "; it must be in (0, 1)");
  }
  return absl::OkStatus();
}

// Invalid options would index the window out of bounds or size partitions
// nobody can run, hence a CHECK: callers validate user input first.
PartitionTuner::PartitionTuner(Options options) : options_(std::move(options)) {
  const absl::Status valid = Validate(options_);
  CHECK(valid.ok()) << valid;
  samples_.reserve(options_.window);
  applied_ = {options_.initial_partition_bytes, options_.initial_credit_bytes};
}

void PartitionTuner::Add(Sample sample) {
  if (sample.bytes <= 0 || sample.took <= absl::ZeroDuration()) return;
  absl::MutexLock lock(&mu_);
  ++added_;
  if (samples_.size() < options_.window) {
    samples_.push_back(sample);
    return;
  }
  samples_[next_] = sample;
  next_ = (next_ + 1) % options_.window;
}

std::vector<PartitionTuner::Sample> PartitionTuner::WindowLocked() const {
  std::vector<Sample> window(samples_.begin() + next_, samples_.end());
  window.insert(window.end(), samples_.begin(), samples_.begin() + next_);
  return window;
}

std::optional<PartitionTuner::Fit> PartitionTuner::fit() const {
  std::vector<Sample> window;
  {
    absl::MutexLock lock(&mu_);
    window = WindowLocked();
  }
  return FitSamples(window, options_.min_samples);
}

std::optional<PartitionTuner::Fit> PartitionTuner::FitSamples(
    const std::vector<Sample>& samples, size_t min_samples) const {
  // Each size group's samples; Add admits only bytes > 0, so 63 groups.
  std::array<std::vector<double>, 63> bytes;
  std::array<std::vector<double>, 63> seconds;
  for (const Sample& sample : samples) {
    const int group = SizeGroup(sample.bytes);
    bytes[group].push_back(static_cast<double>(sample.bytes));
    seconds[group].push_back(absl::ToDoubleSeconds(sample.took));
  }

  // One point per group that can outvote an outlier.
  struct Point {
    double bytes;
    double seconds;
  };
  std::vector<Point> points;
  std::array<bool, 63> used{};
  size_t used_samples = 0;
  for (size_t group = 0; group < bytes.size(); ++group) {
    if (bytes[group].size() < kMinSamplesPerSize) continue;
    used[group] = true;
    used_samples += bytes[group].size();
    // Time grows with size, so within a group the median time belongs to
    // (about) the median size even when the sizes differ.
    points.push_back({Median(bytes[group]), Median(seconds[group])});
  }
  if (used_samples < min_samples || points.size() < 2 ||
      points.back().bytes < kMinSizeSpan * points.front().bytes) {
    return std::nullopt;
  }

  // Least squares on relative error: minimize sum(((y - a - b x) / y)^2),
  // i.e. weights 1 / y^2, so a point's misfit counts as a share of its own
  // time. Centred sums keep the slope accurate at 1e7-byte sizes.
  double sw = 0, swx = 0, swy = 0;
  for (const Point& p : points) {
    const double w = 1 / (p.seconds * p.seconds);
    sw += w;
    swx += w * p.bytes;
    swy += w * p.seconds;
  }
  const double mean_x = swx / sw;
  const double mean_y = swy / sw;
  double sxx = 0, sxy = 0;
  for (const Point& p : points) {
    const double w = 1 / (p.seconds * p.seconds);
    sxx += w * (p.bytes - mean_x) * (p.bytes - mean_x);
    sxy += w * (p.bytes - mean_x) * (p.seconds - mean_y);
  }
  double slope = sxy / sxx;  // seconds per byte
  // Time that does not grow with size gives no bandwidth to size partitions
  // by: the samples are noise (or a link too fast to measure at these sizes),
  // and any partition size would be a guess. No fit; the values in use stay.
  if (!(slope > 0)) return std::nullopt;
  double intercept = mean_y - slope * mean_x;
  // A negative latency is impossible; it comes from noise on a link whose
  // latency is near zero. The objective is convex, so the best fit with
  // latency >= 0 lies on latency = 0: the line through the origin, whose
  // slope is > 0 because every point's bytes and time are.
  if (intercept < 0) {
    intercept = 0;
    double swxy = 0, swxx = 0;
    for (const Point& p : points) {
      const double w = 1 / (p.seconds * p.seconds);
      swxy += w * p.bytes * p.seconds;
      swxx += w * p.bytes * p.bytes;
    }
    slope = swxy / swxx;
  }

  std::vector<double> deviations;
  deviations.reserve(used_samples);
  for (const Sample& sample : samples) {
    if (!used[SizeGroup(sample.bytes)]) continue;
    const double predicted =
        intercept + slope * static_cast<double>(sample.bytes);
    deviations.push_back(
        std::abs(absl::ToDoubleSeconds(sample.took) - predicted) / predicted);
  }
  Fit fit;
  fit.latency = absl::Seconds(intercept);
  fit.bytes_per_second = 1 / slope;
  fit.samples = used_samples;
  fit.residual = Median(deviations);
  return fit;
}

int64_t PartitionTuner::PartitionFor(const Fit& fit) const {
  const double f = options_.overhead_fraction;
  // The latency is at most the share f of the partition's whole time:
  // L <= f * (L + p / B), i.e. p >= L * B * (1 - f) / f.
  const double least =
      absl::ToDoubleSeconds(fit.latency) * fit.bytes_per_second * (1 - f) / f;
  const int64_t min = options_.min_partition_bytes;
  const int64_t max = options_.max_partition_bytes;
  if (!(least > static_cast<double>(min))) return min;  // NaN too
  if (least >= static_cast<double>(max)) return max;
  int64_t p = 8;  // powers of two from 8 on are multiples of 8
  while (static_cast<double>(p) < least) p <<= 1;
  return std::clamp(p, min, max);
}

// Why (channels + spares) partitions. The credit bounds the bytes admitted
// and not yet returned; admission happens only in negotiation rounds. Each
// channel runs one collective at a time, so `channels` partitions keep them
// all busy, but only until one returns: its worker then idles until a round
// admits the next partition, unless one is already queued for it. A round is
// one small exchange between the nodes (ExchangeMin), so it takes about the
// fitted latency L. While it runs, the channels return
// channels * L / T(p) partitions, T(p) = L + p / bandwidth being one
// partition's time; as many spares keep every channel busy across the
// round, and at least one covers a single channel's gap. With the rule's p,
// T(p) >= 10 L (f = 0.1), so up to 10 channels need one spare: the
// (channels + 1) * p ByteScheduler-style window. Partitions clamped at the
// maximum can be latency-bound (T(p) near L), and then each channel needs a
// spare: 2 * channels * p. More credit than that only delays an urgent
// tensor, which waits behind the admitted bytes. Workers take launches
// round-robin by sequence, so a spare sits with the channel due to return
// next when partitions are equal; with mixed sizes this is approximate.
int64_t PartitionTuner::CreditFor(int64_t partition_bytes,
                                  const Fit& fit) const {
  const double latency = absl::ToDoubleSeconds(fit.latency);
  const double partition_seconds =
      latency + static_cast<double>(partition_bytes) / fit.bytes_per_second;
  const double returned_per_round =
      options_.channels * latency / partition_seconds;
  const int64_t spares =
      std::clamp<int64_t>(static_cast<int64_t>(std::ceil(returned_per_round)),
                          1, options_.channels);
  return (options_.channels + spares) * partition_bytes;
}

bool PartitionTuner::Steady(const std::vector<Sample>& window,
                            int64_t partition_bytes) const {
  const auto middle = window.begin() + window.size() / 2;
  for (const std::vector<Sample>& half :
       {std::vector<Sample>(window.begin(), middle),
        std::vector<Sample>(middle, window.end())}) {
    const std::optional<Fit> fit = FitSamples(half, options_.min_samples);
    if (!fit.has_value() || PartitionFor(*fit) != partition_bytes) {
      return false;
    }
  }
  return true;
}

PartitionTuner::Proposal PartitionTuner::Propose() const {
  std::vector<Sample> window;
  Proposal applied;
  uint64_t added = 0;
  {
    absl::MutexLock lock(&mu_);
    // The scheduler asks every round; the answer changes only with a new
    // sample or new values in use.
    if (cached_ && cached_->added == added_ &&
        cached_->applied.partition_bytes == applied_.partition_bytes &&
        cached_->applied.credit_bytes == applied_.credit_bytes) {
      return cached_->proposal;
    }
    window = WindowLocked();
    applied = applied_;
    added = added_;
  }
  const Proposal proposal = ProposeFor(window, applied);
  absl::MutexLock lock(&mu_);
  cached_ = Cached{added, applied, proposal};
  return proposal;
}

PartitionTuner::Proposal PartitionTuner::ProposeFor(
    const std::vector<Sample>& window, Proposal applied) const {
  // One partition is always admitted, so a smaller credit means the same as
  // the partition; proposals say so.
  applied.credit_bytes =
      std::max(applied.credit_bytes, applied.partition_bytes);
  const std::optional<Fit> fit = FitSamples(window, options_.min_samples);
  if (!fit.has_value()) return applied;

  Proposal proposal = applied;
  const int64_t best = PartitionFor(*fit);
  const bool out_of_bounds =
      applied.partition_bytes < options_.min_partition_bytes ||
      applied.partition_bytes > options_.max_partition_bytes;
  if (out_of_bounds || FarApart(best, applied.partition_bytes)) {
    // A new partition brings its own credit: the old one may leave its
    // channels idle or no longer hold one partition.
    proposal.partition_bytes = best;
    proposal.credit_bytes = CreditFor(best, *fit);
  } else {
    // The credit in use stays while it covers what the channels need and
    // is at most twice that: a need that rises by a spare raises it, and
    // falling back by one leaves it, so it cannot flap.
    const int64_t need = CreditFor(applied.partition_bytes, *fit);
    if (applied.credit_bytes < need || applied.credit_bytes > 2 * need) {
      proposal.credit_bytes = need;
    }
  }
  if (proposal.partition_bytes != applied.partition_bytes ||
      proposal.credit_bytes != applied.credit_bytes) {
    if (!Steady(window, best)) return applied;
  }
  return proposal;
}

void PartitionTuner::SetApplied(Proposal applied) {
  DCHECK_GT(applied.partition_bytes, 0);
  DCHECK_EQ(applied.partition_bytes % 8, 0);
  DCHECK_GT(applied.credit_bytes, 0);
  absl::MutexLock lock(&mu_);
  applied_ = applied;
}

PartitionTuner::Proposal PartitionTuner::applied() const {
  absl::MutexLock lock(&mu_);
  return applied_;
}

}  // namespace baton::agent
