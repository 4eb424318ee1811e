// batonctl: the operator's view of a baton coordinator, through its
// read-only Status service, and its Admin service (cancel).
//
//   batonctl [--coordinator HOST:PORT] [--json] [--timeout_ms N] COMMAND ...
//
// Commands: status [JOB] [--all], jobs, members JOB, tensors JOB, events JOB,
// watch [JOB] [--interval_ms N], timeline JOB --steps A:B [-o trace.json]
// [--svg out.svg], cancel --job JOB [--reason TEXT]. --json prints the
// response message (status.proto, admin.proto) as JSON instead of text.
// The address defaults to $BATON_COORDINATOR (every flag has its
// BATON_<FLAG> variable). A job's members come in pages (Status.GetJob,
// --page_size per page): batonctl fetches them all. With TLS:
// --tls_cert/--tls_key/--tls_ca, or --tls_ca and --token_file (a bearer token;
// cancel needs one of scope admin).
//
// Exit codes: 0 done; 1 the coordinator could not answer, or there was
// nothing to draw (one line on stderr saying what to check); 2 a usage
// error (one line, then the usage line).
#include <signal.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "baton/status_client.h"
#include "baton/status_format.h"
#include "baton/v1/admin.grpc.pb.h"
#include "common/init.h"
#include "common/token_flag.h"
#include "gflags/gflags.h"
#include "tools/batonctl/timeline.h"
#include "tools/batonctl/timeline_svg.h"

DEFINE_string(coordinator, "",
              "The coordinator, HOST:PORT (BATON_COORDINATOR sets it)");
DEFINE_bool(json, false,
            "Print the response message (baton.v1, status.proto) as JSON");
DEFINE_int32(timeout_ms, 5000, "Deadline of each call to the coordinator");
DEFINE_int32(interval_ms, 1000, "watch: how often to redraw");
DEFINE_string(steps, "", "timeline: the steps FIRST:LAST (inclusive)");
DEFINE_string(output, "",
              "timeline: the Chrome trace / Perfetto JSON file to write (-o)");
DEFINE_string(svg, "", "timeline: an SVG picture of the steps to write");
DEFINE_string(job, "", "cancel: the job to end as failed");
DEFINE_string(reason, "", "cancel: why, recorded in the job's failure reason");
DEFINE_bool(all, false,
            "status, watch: list every node in the Membership and Scheduling "
            "tables (by default at most 20: the disconnected, unsealed and "
            "lagging first)");
DEFINE_int32(page_size, 0,
             "Members per Status.GetJob page (0: the coordinator's default); "
             "batonctl fetches every page");

namespace baton::batonctl {
namespace {

constexpr char kUsage[] =
    "batonctl [--coordinator HOST:PORT] [--json] [--timeout_ms N] COMMAND: "
    "status [JOB] [--all] | jobs | members JOB | tensors JOB | events JOB | "
    "watch [JOB] [--interval_ms N] | "
    "timeline JOB --steps A:B [-o trace.json] [--svg out.svg] | "
    "cancel --job JOB [--reason TEXT]";

constexpr int kUsageError = 2;

int UsageError(const std::string& what) {
  std::fprintf(stderr, "batonctl: %s\nusage: %s\n", what.c_str(), kUsage);
  return kUsageError;
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "batonctl: %s\n", std::string(status.message()).c_str());
  return 1;
}

enum class Output { kText, kJson, kJsonLine };

// The response as text (by `text`) or as JSON.
template <typename Message, typename Text>
absl::StatusOr<std::string> Render(const absl::StatusOr<Message>& response,
                                   Output output, Text text) {
  if (!response.ok()) return response.status();
  if (output == Output::kText) return text(*response);
  return ToJson(*response, /*multiline=*/output == Output::kJson);
}

// `status [JOB]`; also what watch draws.
absl::StatusOr<std::string> StatusText(StatusClient& client,
                                       const std::string& job, Output output) {
  const int max_members = FLAGS_all ? INT_MAX : kShownMembers;
  if (job.empty()) {
    absl::StatusOr<v1::ListJobsResponse> jobs = client.ListJobs();
    // ListJobs gives each job's first page of members; the tables count and
    // pick from all of them.
    if (jobs.ok()) {
      for (v1::JobStatus& listed : *jobs->mutable_jobs()) {
        if (listed.next_page_token().empty()) continue;
        absl::StatusOr<v1::JobStatus> whole = client.GetJob(listed.job());
        if (!whole.ok()) return whole.status();
        listed = *std::move(whole);
      }
    }
    return Render(jobs, output, [max_members](const v1::ListJobsResponse& r) {
      return FormatJobs(r, absl::Now(), max_members);
    });
  }
  return Render(client.GetJob(job), output,
                [max_members](const v1::JobStatus& r) {
                  return FormatJob(r, absl::Now(), max_members);
                });
}

absl::Status WriteFile(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << contents;
  out.close();
  if (!out) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot write ", path, ": ", std::strerror(errno),
                     ": check that its directory exists and is writable"));
  }
  return absl::OkStatus();
}

int Timeline(StatusClient& client, const std::string& job,
             const StepRange& steps) {
  v1::GetTimelineRequest request;
  request.set_job(job);
  request.set_first_step(steps.first);
  request.set_last_step(steps.last);
  absl::StatusOr<v1::Timeline> timeline = client.GetTimeline(request);
  if (!timeline.ok()) return Fail(timeline.status());
  for (const std::string& warning : TimelineWarnings(*timeline)) {
    std::fprintf(stderr, "batonctl: warning: %s\n", warning.c_str());
  }
  // With --json stdout holds the message; what was written goes to stderr.
  FILE* info = stdout;
  if (FLAGS_json) {
    absl::StatusOr<std::string> json = ToJson(*timeline, /*multiline=*/true);
    if (!json.ok()) return Fail(json.status());
    std::fputs(json->c_str(), stdout);
    info = stderr;
  }
  const int partitions = CountPartitions(*timeline);
  if (partitions == 0) {
    return Fail(absl::NotFoundError(absl::StrFormat(
        "no partitions recorded for steps %d..%d of job \"%s\": the agents "
        "keep only their most recent records; batonctl status %s shows the "
        "job's global step",
        steps.first, steps.last, job, job)));
  }
  const std::string what =
      absl::StrFormat("%d partitions of steps %d..%d from %d nodes", partitions,
                      steps.first, steps.last, timeline->nodes_size());
  if (!FLAGS_output.empty()) {
    if (absl::Status s =
            WriteFile(FLAGS_output, TimelineToTraceJson(*timeline));
        !s.ok()) {
      return Fail(s);
    }
    std::fprintf(info,
                 "wrote %s to %s (open it in https://ui.perfetto.dev or "
                 "chrome://tracing)\n",
                 what.c_str(), FLAGS_output.c_str());
  }
  if (!FLAGS_svg.empty()) {
    if (absl::Status s = WriteFile(FLAGS_svg, TimelineToSvg(*timeline));
        !s.ok()) {
      return Fail(s);
    }
    std::fprintf(info, "drew %s in %s\n", what.c_str(), FLAGS_svg.c_str());
  }
  return 0;
}

// Redraws `status [JOB]` every --interval_ms until SIGINT or SIGTERM (in
// `signals`, blocked); a failed call is shown in place of the status, and
// the next one tried. With --json, one JSON line per round.
int Watch(StatusClient& client, const std::string& job,
          const sigset_t& signals) {
  const std::string command =
      absl::StrCat("batonctl status", job.empty() ? "" : " " + job);
  for (;;) {
    const absl::StatusOr<std::string> status =
        StatusText(client, job, FLAGS_json ? Output::kJsonLine : Output::kText);
    if (FLAGS_json) {
      if (status.ok()) {
        std::fputs(status->c_str(), stdout);
      } else {
        std::fprintf(stderr, "batonctl: %s\n",
                     std::string(status.status().message()).c_str());
      }
    } else {
      // Home the cursor and clear the screen, then draw.
      std::printf(
          "\033[H\033[2J%s every %.1fs (coordinator %s), %s\n\n%s",
          command.c_str(), FLAGS_interval_ms / 1000.0, client.address().c_str(),
          absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", absl::Now(),
                           absl::UTCTimeZone())
              .c_str(),
          status.ok() ? status->c_str()
                      : absl::StrCat(status.status().message(), "\n").c_str());
    }
    std::fflush(stdout);
    const timespec interval = {FLAGS_interval_ms / 1000,
                               FLAGS_interval_ms % 1000 * 1000000L};
    const int signal = sigtimedwait(&signals, nullptr, &interval);
    if (signal == SIGINT || signal == SIGTERM) return 0;
  }
}

// `cancel`: ends --job as failed through the Admin service.
int Cancel(const std::string& address,
           std::shared_ptr<grpc::ChannelCredentials> credentials) {
  std::unique_ptr<v1::Admin::Stub> admin =
      v1::Admin::NewStub(grpc::CreateChannel(address, std::move(credentials)));
  const absl::Duration timeout = absl::Milliseconds(FLAGS_timeout_ms);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  v1::CancelJobRequest request;
  request.set_job(FLAGS_job);
  request.set_reason(FLAGS_reason);
  v1::CancelJobResponse response;
  const grpc::Status status = admin->CancelJob(&context, request, &response);
  if (!status.ok()) {
    return Fail(DescribeRpcError(address, "Admin/CancelJob", FLAGS_job, timeout,
                                 status));
  }
  if (FLAGS_json) {
    absl::StatusOr<std::string> json = ToJson(response, /*multiline=*/true);
    if (!json.ok()) return Fail(json.status());
    std::fputs(json->c_str(), stdout);
    return 0;
  }
  std::printf("job \"%s\" failed: %s\n", FLAGS_job.c_str(),
              response.state_reason().c_str());
  return 0;
}

// Commands that take a job, and whether they require it.
struct CommandSpec {
  const char* name;
  bool takes_job;
  bool needs_job;
};
constexpr CommandSpec kCommands[] = {
    {"status", true, false},  {"jobs", false, false},   {"members", true, true},
    {"tensors", true, true},  {"events", true, true},   {"watch", true, false},
    {"timeline", true, true}, {"cancel", false, false},
};

int Run(const std::vector<std::string>& words) {
  if (words.empty()) return UsageError("no command given");
  const std::string& command = words[0];
  const CommandSpec* spec = nullptr;
  for (const CommandSpec& c : kCommands) {
    if (command == c.name) spec = &c;
  }
  if (spec == nullptr) {
    return UsageError(absl::StrCat("unknown command \"", command, "\""));
  }
  const size_t max_words = spec->takes_job ? 2 : 1;
  if (words.size() > max_words) {
    return UsageError(absl::StrCat("unexpected argument \"", words[max_words],
                                   "\" after ", command));
  }
  if (spec->needs_job && words.size() < 2) {
    return UsageError(
        absl::StrCat(command, " needs a job: batonctl ", command, " JOB"));
  }
  const std::string job = words.size() > 1 ? words[1] : "";
  if (FLAGS_coordinator.empty()) {
    return UsageError(
        "no coordinator: pass --coordinator HOST:PORT or set "
        "BATON_COORDINATOR");
  }
  if (FLAGS_timeout_ms <= 0 || FLAGS_interval_ms <= 0) {
    return UsageError(
        absl::StrFormat("--timeout_ms=%d and --interval_ms=%d must be positive",
                        FLAGS_timeout_ms, FLAGS_interval_ms));
  }
  if (FLAGS_page_size < 0) {
    return UsageError(absl::StrFormat(
        "--page_size=%d is negative: give the members per page, or 0 for the "
        "coordinator's default",
        FLAGS_page_size));
  }
  if (command == "cancel" && FLAGS_job.empty()) {
    return UsageError("cancel needs a job: batonctl cancel --job JOB");
  }
  StepRange steps;
  if (command == "timeline") {
    if (FLAGS_steps.empty()) {
      return UsageError("timeline needs --steps FIRST:LAST");
    }
    absl::StatusOr<StepRange> parsed = ParseStepRange(FLAGS_steps);
    if (!parsed.ok()) return UsageError(std::string(parsed.status().message()));
    steps = *parsed;
    if (FLAGS_output.empty() && FLAGS_svg.empty() && !FLAGS_json) {
      return UsageError(
          "timeline needs somewhere to put it: -o trace.json, --svg out.svg "
          "or --json");
    }
  }
  // Before any thread exists (the channel's), so that only sigtimedwait
  // receives them.
  sigset_t signals;
  sigemptyset(&signals);
  if (command == "watch") signals = BlockShutdownSignals();

  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      ClientCredentialsFromFlags();
  if (!credentials.ok()) {
    return UsageError(std::string(credentials.status().message()));
  }
  if (command == "cancel") return Cancel(FLAGS_coordinator, *credentials);
  StatusClient client(FLAGS_coordinator, absl::Milliseconds(FLAGS_timeout_ms),
                      *credentials);
  client.set_page_size(FLAGS_page_size);
  const Output output = FLAGS_json ? Output::kJson : Output::kText;
  const absl::Time now = absl::Now();
  absl::StatusOr<std::string> text;
  if (command == "status") {
    text = StatusText(client, job, output);
  } else if (command == "jobs") {
    text = Render(client.ListJobs(), output, FormatJobList);
  } else if (command == "members") {
    text = Render(client.GetJob(job), output, [now](const v1::JobStatus& r) {
      return FormatMembers(r, now);
    });
  } else if (command == "tensors") {
    text = Render(client.GetTensors(job), output, FormatTensors);
  } else if (command == "events") {
    text = Render(client.GetJob(job), output, [now](const v1::JobStatus& r) {
      return FormatEvents(r, now);
    });
  } else if (command == "watch") {
    return Watch(client, job, signals);
  } else {
    return Timeline(client, job, steps);
  }
  if (!text.ok()) return Fail(text.status());
  std::fputs(text->c_str(), stdout);
  return 0;
}

// "-o FILE" and "-o=FILE" are --output.
std::vector<std::string> ExpandShortFlags(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  for (std::string& arg : args) {
    if (arg == "--") break;
    if (arg == "-o") arg = "--output";
    if (absl::StartsWith(arg, "-o=")) arg = "--output=" + arg.substr(3);
  }
  return args;
}

}  // namespace
}  // namespace baton::batonctl

int main(int argc, char** argv) {
  std::vector<std::string> args = baton::batonctl::ExpandShortFlags(argc, argv);
  std::vector<char*> c_args;
  for (std::string& arg : args) c_args.push_back(arg.data());
  c_args.push_back(nullptr);
  int c_argc = argc;
  char** c_argv = c_args.data();
  baton::InitProcess(&c_argc, &c_argv, baton::batonctl::kUsage);
  return baton::batonctl::Run(
      std::vector<std::string>(c_argv + 1, c_argv + c_argc));
}
