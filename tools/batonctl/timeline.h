#pragma once

// `batonctl timeline`: the partition phases the agents recorded (a
// v1::Timeline) as a Chrome trace / Perfetto JSON file.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "baton/v1/status.pb.h"

namespace baton::batonctl {

// Steps first..last, inclusive.
struct StepRange {
  int64_t first = 0;
  int64_t last = 0;
};

// "A:B" (A <= B) or "N" (= N:N), steps >= 0. INVALID_ARGUMENT otherwise,
// saying what to give.
absl::StatusOr<StepRange> ParseStepRange(const std::string& text);

// The phases of one partition, in order, between its recorded times.
struct Phase {
  const char* name;
  int64_t start_us;
  int64_t end_us;
  // "queued" and "credit": the partition waits in the scheduler.
  bool before_launch;
};
// "queued" submitted->agreed, "credit" agreed->launched, "worker queue"
// launched->started, "local reduce" started->reduced, "network"
// reduced->done. A phase whose end was not recorded (0: the operation failed
// before it) or that would end before it starts is left out.
std::vector<Phase> PartitionPhases(const v1::PartitionTrace& trace);

// Total partition records over every node.
int CountPartitions(const v1::Timeline& timeline);

// The earliest nonzero time of any record (unix us); 0 with no records.
int64_t EarliestMicros(const v1::Timeline& timeline);

// What the operator should know about a timeline before trusting it: one
// line per node that did not answer and per node whose records of the range
// were partly dropped.
std::vector<std::string> TimelineWarnings(const v1::Timeline& timeline);

// The Trace Event Format document ({"traceEvents": [...], "displayTimeUnit":
// "ms"}): one process per node (pid = node rank, named by the node), one
// thread per data channel (tid = channel + 1, "channel C") and tid 0
// "scheduler" for the phases before launch (and every phase of a partition
// run inline, channel -1). One complete event ("ph": "X") per phase, named
// "<tensor> p<i>/<n> step <s>", category the phase's name, args bytes,
// priority, step, partition, launch_seq, generation, kind, ok. Timestamps
// are microseconds after EarliestMicros. Trace viewers need the slices of a
// thread to nest, so a phase that overlaps an earlier one on its thread
// (partitions waiting side by side) goes to an extra thread of the same
// lane: tid + 1000 * k, named "scheduler #k+1" / "channel C #k+1".
std::string TimelineToTraceJson(const v1::Timeline& timeline);

// `text` as a JSON string literal, quotes included.
std::string JsonQuote(const std::string& text);

}  // namespace baton::batonctl
