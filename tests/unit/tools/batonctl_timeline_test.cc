// batonctl timeline's files for a fixed Timeline: the Chrome trace parses,
// holds every phase of every partition in time order on the right lane with
// no overlapping slices on a thread, and the SVG is well-formed XML.
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/tools/trace_events.h"
#include "tools/batonctl/timeline.h"
#include "tools/batonctl/timeline_svg.h"

namespace baton::batonctl {
namespace {

using ::google::protobuf::Struct;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr int64_t kT0 = 1714564800000000;  // unix us

// A partition whose phases start `at` us after kT0 and last `lengths`
// (queued, credit, worker queue, local reduce, network).
v1::PartitionTrace Partition(const std::string& tensor, int priority,
                             int64_t step, int partition, int partitions,
                             int channel, uint64_t seq, int64_t at,
                             std::vector<int64_t> lengths) {
  v1::PartitionTrace t;
  t.set_tensor_id(priority);
  t.set_tensor(tensor);
  t.set_step(step);
  t.set_partition(partition);
  t.set_num_partitions(partitions);
  t.set_bytes(1 << 20);
  t.set_priority(priority);
  t.set_kind("push_pull");
  t.set_generation(1);
  t.set_channel(channel);
  t.set_launch_seq(seq);
  int64_t time = kT0 + at;
  t.set_submitted_us(time);
  t.set_agreed_us(time += lengths[0]);
  t.set_launched_us(time += lengths[1]);
  t.set_started_us(time += lengths[2]);
  t.set_reduced_us(time += lengths[3]);
  t.set_done_us(time += lengths[4]);
  t.set_ok(true);
  return t;
}

// Two nodes, two channels: a large tensor's two partitions (priority 5) are
// overtaken by an urgent one (priority 0); partitions wait side by side in
// the scheduler; one small tensor runs inline.
v1::Timeline FixedTimeline() {
  v1::Timeline timeline;
  timeline.set_job("resnet");
  timeline.set_first_step(7);
  timeline.set_last_step(7);
  for (int rank = 0; rank < 2; ++rank) {
    v1::NodeTimeline* node = timeline.add_nodes();
    node->set_node_name(absl::StrCat("n", rank + 1));
    node->set_node_rank(rank);
    const int64_t skew = rank * 30;  // the agents' clocks differ a little
    *node->add_partitions() = Partition("grad.layer4.weight", 5, 7, 0, 2, 0, 0,
                                        skew, {100, 10, 5, 200, 800});
    *node->add_partitions() = Partition("grad.conv1.weight", 0, 7, 0, 1, 1, 1,
                                        skew + 50, {60, 5, 5, 50, 300});
    *node->add_partitions() = Partition("grad.layer4.weight", 5, 7, 1, 2, 0, 2,
                                        skew, {100, 900, 20, 200, 800});
    *node->add_partitions() =
        Partition("bias<&>", 3, 7, 0, 1, -1, 3, skew + 400, {10, 0, 0, 5, 0});
  }
  return timeline;
}

TEST(BatonctlTimelineTest, TraceHasEveryPhaseOfEveryPartitionInOrder) {
  const TraceEvents trace =
      ReadTraceEvents(TimelineToTraceJson(FixedTimeline()));
  EXPECT_EQ(trace.display_time_unit, "ms");
  EXPECT_THAT(trace.processes,
              ElementsAre(std::pair(0, "n1"), std::pair(1, "n2")));
  ASSERT_EQ(trace.partitions.size(), 8u);
  ExpectEveryPhaseInOrder(trace);
  int earliest = -1;
  for (const auto& [key, phases] : trace.partitions) {
    const auto& [pid, name] = key;
    SCOPED_TRACE(absl::StrCat("node ", pid, " ", name));
    ASSERT_EQ(phases.size(), 5u);
    const Struct& network = phases.back();
    const int channel = Int(Args(network), "channel");
    // A lane's first thread is tid channel + 1 (0: the scheduler, which also
    // runs inline partitions); overlapping slices go to its extra threads.
    const int tid = Int(network, "tid");
    EXPECT_EQ(tid % 1000, channel + 1);
    EXPECT_THAT(trace.threads.at({pid, tid}),
                StartsWith(channel < 0 ? "scheduler"
                                       : absl::StrCat("channel ", channel)));
    EXPECT_EQ(Int(phases[0], "tid") % 1000, 0) << "queued in the scheduler";
    EXPECT_EQ(Int(Args(network), "bytes"), 1 << 20);
    EXPECT_TRUE(Args(network).fields().at("ok").bool_value());
    EXPECT_THAT(name, ::testing::EndsWith(absl::StrCat(
                          " p", Int(Args(network), "partition"), "/",
                          Int(Args(network), "num_partitions"), " step 7")));
    if (earliest < 0 || Int(phases[0], "ts") < earliest) {
      earliest = Int(phases[0], "ts");
    }
  }
  EXPECT_EQ(earliest, 0) << "timestamps are relative to the earliest record";
  // The large tensor's partitions wait side by side: two scheduler threads.
  EXPECT_EQ(trace.threads.at({0, 1000}), "scheduler #2");
}

TEST(BatonctlTimelineTest, SlicesOfAThreadNeverOverlap) {
  const TraceEvents trace =
      ReadTraceEvents(TimelineToTraceJson(FixedTimeline()));
  std::map<std::pair<int, int>, std::vector<std::pair<int, int>>> slices;
  for (const auto& [key, phases] : trace.partitions) {
    for (const Struct& e : phases) {
      slices[{key.first, Int(e, "tid")}].push_back(
          {Int(e, "ts"), Int(e, "ts") + Int(e, "dur")});
    }
  }
  for (auto& [thread, spans] : slices) {
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); ++i) {
      EXPECT_LE(spans[i - 1].second, spans[i].first)
          << "pid " << thread.first << " tid " << thread.second;
    }
  }
}

TEST(BatonctlTimelineTest, FailedPartitionHasOnlyItsRecordedPhases) {
  v1::PartitionTrace t =
      Partition("w", 0, 1, 0, 1, 0, 0, 0, {10, 10, 10, 10, 10});
  t.set_done_us(0);
  t.set_ok(false);
  std::vector<std::string> names;
  for (const Phase& phase : PartitionPhases(t)) names.push_back(phase.name);
  EXPECT_THAT(names,
              ElementsAre("queued", "credit", "worker queue", "local reduce"));
}

std::string Quoted(const std::string& s) {
  std::string quoted = "'";
  for (char c : s)
    quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

TEST(BatonctlTimelineTest, SvgIsWellFormedWithALaneForEveryChannel) {
  const std::string svg = TimelineToSvg(FixedTimeline());
  char path[] = "/tmp/batonctl-timeline-test.XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  std::ofstream(path) << svg;
  ASSERT_EQ(std::system("xmllint --version >/dev/null 2>&1"), 0)
      << "xmllint is missing: run tools/dev/install-deps (libxml2-utils)";
  EXPECT_EQ(std::system(("xmllint --noout " + Quoted(path)).c_str()), 0) << svg;
  unlink(path);
  for (const char* lane : {">n1 inline<", ">n1 channel 0<", ">n1 channel 1<",
                           ">n2 channel 0<", ">n2 channel 1<"}) {
    EXPECT_THAT(svg, HasSubstr(lane));
  }
  EXPECT_THAT(svg, HasSubstr("0 (most urgent)"));
  EXPECT_THAT(svg, HasSubstr("5 (least urgent)"));
  EXPECT_THAT(svg, HasSubstr("bias&lt;&amp;&gt; p0/1 step 7"));
  // Priority 0 is red, 5 (the least urgent here) blue.
  EXPECT_THAT(svg, HasSubstr("grad.conv1.weight p0/1 step 7, priority 0"));
  EXPECT_THAT(svg, HasSubstr("fill=\"#df2020\""));
  EXPECT_THAT(svg, HasSubstr("fill=\"#2020df\""));
  EXPECT_THAT(svg, HasSubstr(">0 us<"));
}

TEST(BatonctlTimelineTest, StepRanges) {
  absl::StatusOr<StepRange> range = ParseStepRange("10:12");
  ASSERT_TRUE(range.ok());
  EXPECT_EQ(range->first, 10);
  EXPECT_EQ(range->last, 12);
  range = ParseStepRange("7");
  ASSERT_TRUE(range.ok());
  EXPECT_EQ(range->first, 7);
  EXPECT_EQ(range->last, 7);
  for (const char* bad : {"12:10", "-1:3", "a:b", "1:2:3", "", "3:"}) {
    range = ParseStepRange(bad);
    ASSERT_FALSE(range.ok()) << bad;
    EXPECT_THAT(range.status().message(),
                HasSubstr(absl::StrCat(
                    "--steps=", bad, " is not a step range: give FIRST:LAST")));
  }
}

TEST(BatonctlTimelineTest, WarningsNameMissingAndTruncatedNodes) {
  v1::Timeline timeline = FixedTimeline();
  timeline.add_missing_nodes("n3");
  timeline.mutable_nodes(1)->set_truncated(true);
  EXPECT_THAT(
      TimelineWarnings(timeline),
      ElementsAre(HasSubstr("node n3 did not answer in time"),
                  HasSubstr("node n2 no longer holds every record of steps "
                            "7..7")));
  EXPECT_EQ(CountPartitions(timeline), 8);
  EXPECT_TRUE(TimelineWarnings(FixedTimeline()).empty());
}

TEST(BatonctlTimelineTest, JsonStringsAreEscaped) {
  EXPECT_EQ(JsonQuote("a\"b\\c\nd\x01"), "\"a\\\"b\\\\c\\nd\\u0001\"");
}

}  // namespace
}  // namespace baton::batonctl
