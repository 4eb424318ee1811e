#include "tools/batonctl/timeline.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace baton::batonctl {
namespace {

// Tracks of one lane are tid, tid + kTrackStride, tid + 2 * kTrackStride...
constexpr int kTrackStride = 1000;

// One phase of one partition on its lane.
struct TraceEvent {
  int pid;
  int lane;  // tid of the lane's first track
  Phase phase;
  const v1::PartitionTrace* trace;
  int track = 0;
};

std::string LaneName(int lane) {
  return lane == 0 ? "scheduler" : absl::StrCat("channel ", lane - 1);
}

// Puts each event on the first track of its lane where it starts after the
// track's last event ended, in start order: slices of a track never overlap.
// Returns the number of tracks of each (pid, lane). Stable: a partition's
// empty phases (start = end) keep their order.
std::map<std::pair<int, int>, int> AssignTracks(
    std::vector<TraceEvent>& events) {
  std::stable_sort(
      events.begin(), events.end(),
      [](const TraceEvent& a, const TraceEvent& b) {
        return std::make_tuple(a.pid, a.lane, a.phase.start_us, a.phase.end_us,
                               a.trace->launch_seq()) <
               std::make_tuple(b.pid, b.lane, b.phase.start_us, b.phase.end_us,
                               b.trace->launch_seq());
      });
  std::map<std::pair<int, int>, std::vector<int64_t>> track_ends;
  for (TraceEvent& event : events) {
    std::vector<int64_t>& ends = track_ends[{event.pid, event.lane}];
    size_t track = 0;
    while (track < ends.size() && ends[track] > event.phase.start_us) ++track;
    if (track == ends.size()) ends.push_back(0);
    ends[track] = event.phase.end_us;
    event.track = static_cast<int>(track);
  }
  std::map<std::pair<int, int>, int> tracks;
  for (const auto& [lane, ends] : track_ends) {
    tracks[lane] = static_cast<int>(ends.size());
  }
  return tracks;
}

std::string MetadataEvent(const char* name, int pid, const std::string& tid,
                          const std::string& args) {
  return absl::StrFormat(R"({"name":"%s","ph":"M","pid":%d%s,"args":{%s}})",
                         name, pid, tid, args);
}

std::string CompleteEvent(const TraceEvent& event, int64_t origin_us) {
  const v1::PartitionTrace& t = *event.trace;
  const std::string name =
      absl::StrFormat("%s p%d/%d step %d", t.tensor(), t.partition(),
                      t.num_partitions(), t.step());
  return absl::StrFormat(
      R"({"name":%s,"cat":%s,"ph":"X","pid":%d,"tid":%d,"ts":%d,"dur":%d,)"
      R"("args":{"tensor_id":%d,"bytes":%d,"priority":%d,"step":%d,)"
      R"("partition":%d,"num_partitions":%d,"launch_seq":%d,)"
      R"("generation":%d,"kind":%s,"channel":%d,"ok":%s}})",
      JsonQuote(name), JsonQuote(event.phase.name), event.pid,
      event.lane + kTrackStride * event.track, event.phase.start_us - origin_us,
      event.phase.end_us - event.phase.start_us, t.tensor_id(), t.bytes(),
      t.priority(), t.step(), t.partition(), t.num_partitions(), t.launch_seq(),
      t.generation(), JsonQuote(t.kind()), t.channel(),
      t.ok() ? "true" : "false");
}

}  // namespace

absl::StatusOr<StepRange> ParseStepRange(const std::string& text) {
  const std::vector<std::string> parts = absl::StrSplit(text, ':');
  StepRange range;
  bool ok = parts.size() <= 2 && absl::SimpleAtoi(parts[0], &range.first);
  range.last = range.first;
  if (ok && parts.size() == 2) ok = absl::SimpleAtoi(parts[1], &range.last);
  if (!ok || range.first < 0 || range.last < range.first) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--steps=", text,
        " is not a step range: give FIRST:LAST with 0 <= FIRST <= LAST (for "
        "example --steps 10:12) or one step"));
  }
  return range;
}

std::vector<Phase> PartitionPhases(const v1::PartitionTrace& trace) {
  static constexpr const char* kNames[] = {"queued", "credit", "worker queue",
                                           "local reduce", "network"};
  const int64_t times[] = {trace.submitted_us(), trace.agreed_us(),
                           trace.launched_us(),  trace.started_us(),
                           trace.reduced_us(),   trace.done_us()};
  std::vector<Phase> phases;
  for (size_t i = 0; i < std::size(kNames); ++i) {
    if (times[i] > 0 && times[i + 1] >= times[i]) {
      phases.push_back({kNames[i], times[i], times[i + 1],
                        /*before_launch=*/i < 2});
    }
  }
  return phases;
}

int CountPartitions(const v1::Timeline& timeline) {
  int count = 0;
  for (const v1::NodeTimeline& node : timeline.nodes()) {
    count += node.partitions_size();
  }
  return count;
}

int64_t EarliestMicros(const v1::Timeline& timeline) {
  int64_t earliest = 0;
  for (const v1::NodeTimeline& node : timeline.nodes()) {
    for (const v1::PartitionTrace& trace : node.partitions()) {
      for (const Phase& phase : PartitionPhases(trace)) {
        if (earliest == 0 || phase.start_us < earliest) {
          earliest = phase.start_us;
        }
      }
    }
  }
  return earliest;
}

std::vector<std::string> TimelineWarnings(const v1::Timeline& timeline) {
  std::vector<std::string> warnings;
  for (const std::string& node : timeline.missing_nodes()) {
    warnings.push_back(absl::StrCat(
        "node ", node,
        " did not answer in time (or is disconnected): its partitions are "
        "missing from the timeline"));
  }
  for (const v1::NodeTimeline& node : timeline.nodes()) {
    if (!node.truncated()) continue;
    warnings.push_back(absl::StrFormat(
        "node %s no longer holds every record of steps %d..%d (agents keep "
        "only their most recent records): its part of the timeline is "
        "incomplete; ask for more recent steps",
        node.node_name(), timeline.first_step(), timeline.last_step()));
  }
  return warnings;
}

std::string TimelineToTraceJson(const v1::Timeline& timeline) {
  std::vector<TraceEvent> events;
  std::vector<std::string> lines;
  for (const v1::NodeTimeline& node : timeline.nodes()) {
    const int pid = node.node_rank();
    lines.push_back(MetadataEvent("process_name", pid, "",
                                  "\"name\":" + JsonQuote(node.node_name())));
    lines.push_back(MetadataEvent("process_sort_index", pid, "",
                                  absl::StrCat("\"sort_index\":", pid)));
    for (const v1::PartitionTrace& trace : node.partitions()) {
      const int channel_lane = trace.channel() < 0 ? 0 : trace.channel() + 1;
      for (const Phase& phase : PartitionPhases(trace)) {
        // Until launch a partition waits in the scheduler, not on a channel.
        events.push_back(
            {pid, phase.before_launch ? 0 : channel_lane, phase, &trace});
      }
    }
  }
  for (const auto& [lane, tracks] : AssignTracks(events)) {
    const auto [pid, base] = lane;
    for (int track = 0; track < tracks; ++track) {
      const int tid = base + kTrackStride * track;
      const std::string name =
          track == 0 ? LaneName(base)
                     : absl::StrCat(LaneName(base), " #", track + 1);
      const std::string tid_field = absl::StrCat(",\"tid\":", tid);
      lines.push_back(MetadataEvent("thread_name", pid, tid_field,
                                    "\"name\":" + JsonQuote(name)));
      lines.push_back(MetadataEvent(
          "thread_sort_index", pid, tid_field,
          absl::StrCat("\"sort_index\":", base * kTrackStride + track)));
    }
  }
  const int64_t origin = EarliestMicros(timeline);
  for (const TraceEvent& event : events) {
    lines.push_back(CompleteEvent(event, origin));
  }
  return absl::StrCat("{\"traceEvents\":[\n", absl::StrJoin(lines, ",\n"),
                      "\n],\n\"displayTimeUnit\":\"ms\"}\n");
}

std::string JsonQuote(const std::string& text) {
  std::string quoted = "\"";
  for (const char c : text) {
    switch (c) {
      case '"':
        quoted += "\\\"";
        break;
      case '\\':
        quoted += "\\\\";
        break;
      case '\n':
        quoted += "\\n";
        break;
      case '\t':
        quoted += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppendFormat(&quoted, "\\u%04x", static_cast<int>(c));
        } else {
          quoted += c;
        }
    }
  }
  return quoted + "\"";
}

}  // namespace baton::batonctl
