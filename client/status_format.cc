#include "baton/status_format.h"

#include <algorithm>
#include <cstddef>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "google/protobuf/util/json_util.h"

namespace baton::client {
namespace {

// Columns separated by two spaces, each as wide as its widest cell; the last
// column is not padded, so no line ends in spaces.
class TextTable {
 public:
  explicit TextTable(std::vector<std::string> header) {
    rows_.push_back(std::move(header));
  }

  void AddRow(std::vector<std::string> row) { rows_.push_back(std::move(row)); }

  // Every row, each line starting with `indent`.
  std::string Render(const std::string& indent) const {
    std::vector<size_t> widths;
    for (const auto& row : rows_) {
      widths.resize(std::max(widths.size(), row.size()));
      for (size_t i = 0; i < row.size(); ++i) {
        widths[i] = std::max(widths[i], row[i].size());
      }
    }
    std::string text;
    for (const auto& row : rows_) {
      std::string line = indent;
      for (size_t i = 0; i < row.size(); ++i) {
        line += row[i];
        if (i + 1 < row.size()) {
          line += std::string(widths[i] - row[i].size() + 2, ' ');
        }
      }
      absl::StrAppend(&text, line, "\n");
    }
    return text;
  }

 private:
  std::vector<std::vector<std::string>> rows_;
};

constexpr char kNone[] = "  (none)\n";

std::string FormatUnixMs(int64_t unix_ms) {
  return absl::FormatTime("%Y-%m-%d %H:%M:%E3S UTC",
                          absl::FromUnixMillis(unix_ms), absl::UTCTimeZone());
}

std::string RankRange(const v1::MemberStatus& member) {
  if (member.node_rank() < 0) return "-";
  if (member.local_size() == 1) return absl::StrCat(member.rank_offset());
  return absl::StrCat(member.rank_offset(), "..",
                      member.rank_offset() + member.local_size() - 1);
}

std::string Section(const std::string& title, const std::string& body) {
  return absl::StrCat(title, "\n", body.empty() ? kNone : body);
}

std::string StateSection(const v1::JobStatus& job, absl::Time now) {
  const int sealed = static_cast<int>(std::count_if(
      job.members().begin(), job.members().end(),
      [](const v1::MemberStatus& m) { return m.node_rank() >= 0; }));
  std::string body = absl::StrFormat(
      "  state: %s%s\n  generation: %d\n"
      "  nodes: %d (%d sealed), %d expected, min %d, world size %d\n",
      JobStateName(job.state()),
      job.state_reason().empty() ? ""
                                 : absl::StrCat(" (", job.state_reason(), ")"),
      job.generation(), job.members_size(), sealed, job.expected_nodes(),
      job.min_nodes(), job.world_size());
  if (job.created_unix_ms() > 0) {
    absl::StrAppend(&body, "  created: ", FormatUnixMs(job.created_unix_ms()),
                    " (", FormatAgo(job.created_unix_ms(), now), ")\n");
  }
  return Section("State", body);
}

// Needs a look: not connected, not sealed, or one of its ranks lags.
bool Notable(const v1::MemberStatus& m) {
  return !m.connected() || m.node_rank() < 0 ||
         std::any_of(m.ranks().begin(), m.ranks().end(),
                     [](const v1::RankStatus& r) { return r.lag() > 0; });
}

// The members a job's tables show, in the job's order: all of them up to
// `max_members`; past it the notable ones first, then the others in order,
// `max_members` in all.
std::vector<const v1::MemberStatus*> ShownMembers(const v1::JobStatus& job,
                                                  int max_members) {
  std::vector<const v1::MemberStatus*> shown;
  if (job.members_size() <= max_members) {
    for (const v1::MemberStatus& m : job.members()) shown.push_back(&m);
    return shown;
  }
  std::vector<bool> taken(job.members_size());
  int count = 0;
  for (bool notable : {true, false}) {
    for (int i = 0; i < job.members_size() && count < max_members; ++i) {
      if (!taken[i] && Notable(job.members(i)) == notable) {
        taken[i] = true;
        ++count;
      }
    }
  }
  for (int i = 0; i < job.members_size(); ++i) {
    if (taken[i]) shown.push_back(&job.members(i));
  }
  return shown;
}

// Under a table that left members out: how many, and how to see them.
std::string MoreMembers(const v1::JobStatus& job, int shown) {
  if (shown >= job.members_size()) return "";
  const int connected = static_cast<int>(
      std::count_if(job.members().begin(), job.members().end(),
                    [](const v1::MemberStatus& m) { return m.connected(); }));
  return absl::StrFormat(
      "  ... %d more nodes (%d of %d connected; shown: the disconnected, "
      "unsealed and lagging first): batonctl members %s lists every node\n",
      job.members_size() - shown, connected, job.members_size(), job.job());
}

std::string MembershipTable(const v1::JobStatus& job, absl::Time now,
                            int max_members) {
  if (job.members().empty()) return "";
  TextTable table(
      {"NODE", "DATA ADDRESS", "NODE RANK", "RANKS", "LAST SEEN", "CONNECTED"});
  const std::vector<const v1::MemberStatus*> shown =
      ShownMembers(job, max_members);
  for (const v1::MemberStatus* member : shown) {
    const v1::MemberStatus& m = *member;
    table.AddRow(
        {m.node_name(), m.data_address().empty() ? "-" : m.data_address(),
         m.node_rank() < 0 ? "-" : absl::StrCat(m.node_rank()), RankRange(m),
         m.connected() ? FormatAgo(m.last_seen_unix_ms(), now) : "-",
         m.connected() ? "yes" : "no"});
  }
  return table.Render("  ") + MoreMembers(job, static_cast<int>(shown.size()));
}

// "0.42 s".
std::string FormatSeconds(int64_t millis) {
  return absl::StrFormat("%.2f s", millis / 1000.0);
}

// The nodes lost and joined, then the last kRecentReforms re-forms, oldest
// first; one in progress says so, with its duration so far.
std::string ReformsSection(const v1::JobStatus& job, absl::Time now) {
  std::string body = absl::StrCat("  nodes lost: ", job.members_lost(),
                                  ", joined: ", job.members_joined(), "\n");
  const int first = std::max(0, job.reforms_size() - kRecentReforms);
  if (first < job.reforms_size()) {
    TextTable table({"GENERATION", "STARTED", "CAUSE", "NODE", "DURATION",
                     "NODES", "OUTCOME"});
    for (int i = first; i < job.reforms_size(); ++i) {
      const v1::Reform& r = job.reforms(i);
      table.AddRow(
          {absl::StrCat(r.aborted_generation(), " -> ", r.new_generation()),
           FormatAgo(r.started_unix_ms(), now), r.cause(), r.node_name(),
           FormatSeconds(r.duration_ms()),
           absl::StrCat(r.nodes_before(), " -> ", r.nodes_after()),
           r.outcome().empty() ? "in progress" : r.outcome()});
    }
    body += table.Render("  ");
  }
  return Section("Re-forms", body);
}

// The ranks behind the fastest one, slowest first.
std::string LaggingRanks(const v1::JobStatus& job) {
  std::vector<v1::RankStatus> lagging;
  for (const v1::MemberStatus& m : job.members()) {
    for (const v1::RankStatus& r : m.ranks()) {
      if (r.lag() > 0) lagging.push_back(r);
    }
  }
  if (lagging.empty()) return "(none)";
  std::sort(lagging.begin(), lagging.end(),
            [](const v1::RankStatus& a, const v1::RankStatus& b) {
              if (a.lag() != b.lag()) return a.lag() > b.lag();
              return a.rank() < b.rank();
            });
  constexpr size_t kShown = 5;
  std::vector<std::string> parts;
  for (size_t i = 0; i < std::min(lagging.size(), kShown); ++i) {
    parts.push_back(
        absl::StrFormat("rank %d (step %d, lag %d)", lagging[i].rank(),
                        lagging[i].completed_step(), lagging[i].lag()));
  }
  if (lagging.size() > kShown) {
    parts.push_back(absl::StrCat(lagging.size() - kShown, " more"));
  }
  return absl::StrJoin(parts, ", ");
}

std::string StepSection(const v1::JobStatus& job) {
  return Section(
      "Step",
      absl::StrCat("  global step: ",
                   job.global_step() < 0 ? std::string("none completed yet")
                                         : absl::StrCat(job.global_step()),
                   "\n  lagging ranks: ", LaggingRanks(job), "\n"));
}

std::string SchedulingSection(const v1::JobStatus& job, int max_members) {
  const v1::PlanSummary& plan = job.plan();
  std::string body =
      plan.version() == 0
          ? "  plan: (none yet)\n"
          : absl::StrFormat(
                "  plan: version %d from step %d, %d tensors, %s in %d "
                "partitions of at most %s\n",
                plan.version(), plan.effective_step(), plan.num_tensors(),
                FormatBytes(plan.total_bytes()), plan.num_partitions(),
                FormatBytes(plan.partition_bytes()));
  if (!job.members().empty()) {
    TextTable table({"NODE", "MODE", "PARTITION", "CREDIT", "QUEUE DEPTH",
                     "IN FLIGHT", "THROUGHPUT"});
    // " (auto)": baton chose it online.
    const auto sized = [](int64_t bytes, bool tuned) {
      return bytes > 0 ? FormatBytes(bytes) + (tuned ? " (auto)" : "")
                       : std::string("-");
    };
    const std::vector<const v1::MemberStatus*> shown =
        ShownMembers(job, max_members);
    for (const v1::MemberStatus* member : shown) {
      const v1::MemberStatus& m = *member;
      // Unknown until the node's first report.
      table.AddRow(
          {m.node_name(), m.scheduling().empty() ? "-" : m.scheduling(),
           sized(m.partition_bytes(), m.partition_tuned()),
           sized(m.credit_bytes(), m.credit_tuned()),
           absl::StrCat(m.queue_depth()), FormatBytes(m.bytes_in_flight()),
           FormatBytes(m.throughput_bytes_per_second()) + "/s"});
    }
    body +=
        table.Render("  ") + MoreMembers(job, static_cast<int>(shown.size()));
  }
  return Section("Scheduling", body);
}

std::string StallsSection(const v1::JobStatus& job) {
  std::string body;
  for (const v1::Stall& stall : job.stalls()) {
    absl::StrAppendFormat(
        &body,
        "  tensor %s, step %d: waiting for ranks {%s} on nodes {%s} for %.0f "
        "s\n",
        stall.tensor(), stall.step(), absl::StrJoin(stall.missing_ranks(), ","),
        absl::StrJoin(stall.missing_nodes(), ","), stall.waiting_ms() / 1000.0);
  }
  return Section("Stalls", body);
}

std::string MismatchesSection(const v1::JobStatus& job) {
  std::string body;
  for (const v1::TensorMismatchStatus& m : job.mismatches()) {
    absl::StrAppend(&body, "  tensor ", m.tensor(), ", ", m.field(), ": ",
                    m.message(), "\n");
  }
  return Section("Mismatches", body);
}

// The last `limit` events, one line each, oldest first.
std::string EventLines(const v1::JobStatus& job, int limit, absl::Time now) {
  const int first = std::max(0, job.events_size() - limit);
  if (first == job.events_size()) return "";
  TextTable table({"TIME", "AGE", "KIND", "GENERATION", "MESSAGE"});
  for (int i = first; i < job.events_size(); ++i) {
    const v1::JobEvent& e = job.events(i);
    table.AddRow({FormatUnixMs(e.unix_ms()), FormatAgo(e.unix_ms(), now),
                  e.kind(), absl::StrCat(e.generation()), e.message()});
  }
  return table.Render("  ");
}

std::string DataTypeName(v1::DataType type) {
  return absl::AsciiStrToLower(
      absl::StripPrefix(v1::DataType_Name(type), "DATA_TYPE_"));
}

}  // namespace
}  // namespace baton::client

namespace baton {

using client::DataTypeName;
using client::EventLines;
using client::kNone;
using client::MembershipTable;
using client::MismatchesSection;
using client::ReformsSection;
using client::SchedulingSection;
using client::Section;
using client::StallsSection;
using client::StateSection;
using client::StepSection;
using client::TextTable;

std::string FormatBytes(double bytes) {
  if (bytes < 1024) return absl::StrFormat("%.0f B", bytes);
  constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  size_t unit = 0;
  bytes /= 1024;
  while (bytes >= 1024 && unit + 1 < std::size(kUnits)) {
    bytes /= 1024;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", bytes, kUnits[unit]);
}

std::string FormatMicros(int64_t micros) {
  if (micros < 1000) return absl::StrCat(micros, " us");
  if (micros < 1000000) return absl::StrFormat("%.1f ms", micros / 1e3);
  return absl::StrFormat("%.2f s", micros / 1e6);
}

std::string FormatAgo(int64_t unix_ms, absl::Time now) {
  if (unix_ms == 0) return "-";
  const int64_t seconds =
      std::max<int64_t>(0, (absl::ToUnixMillis(now) - unix_ms) / 1000);
  if (seconds < 60) return absl::StrCat(seconds, "s ago");
  if (seconds < 3600) {
    return absl::StrCat(seconds / 60, "m", seconds % 60, "s ago");
  }
  if (seconds < 86400) {
    return absl::StrCat(seconds / 3600, "h", seconds % 3600 / 60, "m ago");
  }
  return absl::StrCat(seconds / 86400, "d", seconds % 86400 / 3600, "h ago");
}

std::string JobStateName(v1::JobState state) {
  return absl::AsciiStrToLower(
      absl::StripPrefix(v1::JobState_Name(state), "JOB_STATE_"));
}

std::string FormatJob(const v1::JobStatus& job, absl::Time now,
                      int max_members) {
  return absl::StrCat(
      "======== job ", job.job(), " ========\n", StateSection(job, now),
      Section("Membership", MembershipTable(job, now, max_members)),
      ReformsSection(job, now), StepSection(job),
      SchedulingSection(job, max_members), StallsSection(job),
      MismatchesSection(job),
      Section("Recent events", EventLines(job, kRecentEvents, now)));
}

std::string FormatJobs(const v1::ListJobsResponse& jobs, absl::Time now,
                       int max_members) {
  if (jobs.jobs().empty()) return "jobs: (none)\n";
  std::vector<std::string> blocks;
  for (const v1::JobStatus& job : jobs.jobs()) {
    blocks.push_back(FormatJob(job, now, max_members));
  }
  return absl::StrJoin(blocks, "\n");
}

std::string FormatJobList(const v1::ListJobsResponse& jobs) {
  if (jobs.jobs().empty()) return "jobs: (none)\n";
  TextTable table({"JOB", "STATE", "GENERATION", "WORLD SIZE", "GLOBAL STEP"});
  for (const v1::JobStatus& job : jobs.jobs()) {
    table.AddRow(
        {job.job(), JobStateName(job.state()), absl::StrCat(job.generation()),
         absl::StrCat(job.world_size()), absl::StrCat(job.global_step())});
  }
  return table.Render("");
}

std::string FormatMembers(const v1::JobStatus& job, absl::Time now) {
  return Section(absl::StrCat("Membership of job ", job.job()),
                 MembershipTable(job, now, job.members_size()));
}

std::string FormatTensors(const v1::TensorsStatus& tensors) {
  std::string text = absl::StrFormat(
      "Tensors of job %s: plan version %d, partitions of at most %s\n",
      tensors.job(), tensors.plan_version(),
      FormatBytes(tensors.partition_bytes()));
  if (tensors.tensors().empty()) return text + kNone;
  TextTable table({"ID", "NAME", "DTYPE", "SHAPE", "BYTES", "PRIORITY",
                   "PARTITIONS", "LATENCY MEAN", "MAX", "COUNT"});
  for (const v1::TensorStatus& t : tensors.tensors()) {
    const bool measured = t.latency_count() > 0;
    table.AddRow({absl::StrCat(t.id()), t.spec().name(),
                  DataTypeName(t.spec().dtype()),
                  absl::StrCat("[", absl::StrJoin(t.spec().shape(), ", "), "]"),
                  FormatBytes(t.size_bytes()), absl::StrCat(t.priority()),
                  absl::StrCat(t.num_partitions()),
                  measured ? FormatMicros(t.latency_mean_us()) : "-",
                  measured ? FormatMicros(t.latency_max_us()) : "-",
                  absl::StrCat(t.latency_count())});
  }
  return text + table.Render("  ");
}

std::string FormatEvents(const v1::JobStatus& job, absl::Time now) {
  return Section(absl::StrCat("Events of job ", job.job()),
                 EventLines(job, job.events_size(), now));
}

absl::StatusOr<std::string> ToJson(const google::protobuf::Message& message,
                                   bool multiline) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = multiline;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string json;
  const auto status =
      google::protobuf::util::MessageToJsonString(message, &json, options);
  if (!status.ok()) {
    return absl::InternalError(
        absl::StrCat("cannot print ", message.GetTypeName(),
                     " as JSON: ", status.message().ToString()));
  }
  if (!multiline) json += "\n";
  return json;
}

}  // namespace baton
