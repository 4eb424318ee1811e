// batonctl's text and JSON output for fixed coordinator responses. The text
// is compared with golden files in testdata/; BATON_UPDATE_GOLDEN=1 rewrites
// them (then review the diff).
#include "baton/status_format.h"

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "baton/status_client.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// "now" of every test: 2024-05-01 12:00:00 UTC.
constexpr int64_t kNowMs = 1714564800000;
const absl::Time kNow = absl::FromUnixMillis(kNowMs);

std::string Golden(const std::string& name) {
  return std::string(BATONCTL_TESTDATA) + "/" + name;
}

void ExpectGolden(const std::string& name, const std::string& actual) {
  if (std::getenv("BATON_UPDATE_GOLDEN") != nullptr) {
    std::ofstream(Golden(name)) << actual;
  }
  std::ifstream in(Golden(name));
  ASSERT_TRUE(in) << "missing " << Golden(name)
                  << ": run with BATON_UPDATE_GOLDEN=1 to write it";
  const std::string expected((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  EXPECT_EQ(actual, expected) << "output differs from " << Golden(name);
}

v1::MemberStatus* AddMember(v1::JobStatus& job, const std::string& name,
                            int node_rank, int local_size) {
  v1::MemberStatus* m = job.add_members();
  m->set_node_name(name);
  m->set_data_address(name + ".cluster:29500");
  m->set_node_rank(node_rank);
  m->set_rank_offset(node_rank < 0 ? -1 : node_rank * local_size);
  m->set_local_size(local_size);
  m->set_connected(node_rank >= 0);
  if (node_rank >= 0) m->set_last_seen_unix_ms(kNowMs - 1500);
  for (int i = 0; node_rank >= 0 && i < local_size; ++i) {
    v1::RankStatus* r = m->add_ranks();
    r->set_rank(node_rank * local_size + i);
  }
  return m;
}

v1::Reform* AddReform(v1::JobStatus& job, int64_t aborted,
                      const std::string& cause, const std::string& node,
                      int64_t seconds_ago, int64_t duration_ms, int32_t before,
                      int32_t after, const std::string& outcome) {
  v1::Reform* r = job.add_reforms();
  r->set_aborted_generation(aborted);
  r->set_new_generation(aborted + 1);
  r->set_cause(cause);
  r->set_node_name(node);
  r->set_reason("node " + node + " " + cause);
  r->set_started_unix_ms(kNowMs - seconds_ago * 1000);
  r->set_duration_ms(duration_ms);
  r->set_nodes_before(before);
  r->set_nodes_after(after);
  r->set_outcome(outcome);
  return r;
}

// The lines of `text` from the one that is `title` to the next section's
// title (a line that does not start with a space).
std::string SectionOf(const std::string& text, const std::string& title) {
  const size_t start = text.find("\n" + title + "\n");
  if (start == std::string::npos) return "";
  size_t end = start + title.size() + 2;
  while (end < text.size() && text[end] == ' ') {
    end = text.find('\n', end);
    end = end == std::string::npos ? text.size() : end + 1;
  }
  return text.substr(start + 1, end - start - 1);
}

void AddEvent(v1::JobStatus& job, int64_t seconds_ago, const std::string& kind,
              int64_t generation, const std::string& message) {
  v1::JobEvent* e = job.add_events();
  e->set_unix_ms(kNowMs - seconds_ago * 1000);
  e->set_kind(kind);
  e->set_generation(generation);
  e->set_message(message);
}

// A running job with a lagging rank, a stall, a mismatch, a member that
// joined but is not sealed yet, and more events than status shows.
v1::JobStatus RunningJob() {
  v1::JobStatus job;
  job.set_job("resnet");
  job.set_state(v1::JOB_STATE_RUNNING);
  job.set_state_reason("generation 3 sealed with 2 nodes, world size 4");
  job.set_generation(3);
  job.set_expected_nodes(2);
  job.set_min_nodes(2);
  job.set_world_size(4);
  job.set_created_unix_ms(kNowMs - 3723000);
  v1::MemberStatus* n1 = AddMember(job, "n1", 0, 2);
  n1->set_throughput_bytes_per_second(1.5 * 1024 * 1024 * 1024);
  n1->set_queue_depth(3);
  n1->set_scheduling("priority");
  n1->set_credit_bytes(10 << 20);
  n1->set_credit_tuned(true);
  n1->set_partition_bytes(2 << 20);
  n1->set_partition_tuned(true);
  n1->set_bytes_in_flight(8 << 20);
  n1->mutable_ranks(0)->set_completed_step(41);
  n1->mutable_ranks(1)->set_completed_step(40);
  n1->mutable_ranks(1)->set_lag(1);
  v1::MemberStatus* n2 = AddMember(job, "n2", 1, 2);
  n2->set_last_seen_unix_ms(kNowMs - 75000);
  n2->set_throughput_bytes_per_second(512 * 1024);
  n2->mutable_ranks(0)->set_completed_step(41);
  n2->mutable_ranks(1)->set_completed_step(39);
  n2->mutable_ranks(1)->set_lag(2);
  AddMember(job, "n3", -1, 1);
  job.set_global_step(39);
  v1::PlanSummary* plan = job.mutable_plan();
  plan->set_version(2);
  plan->set_effective_step(10);
  plan->set_num_tensors(12);
  plan->set_total_bytes(48 << 20);
  plan->set_partition_bytes(4 << 20);
  plan->set_num_partitions(14);
  v1::Stall* stall = job.add_stalls();
  stall->set_tensor_id(4);
  stall->set_tensor("grad.fc.weight");
  stall->set_step(41);
  stall->add_missing_ranks(2);
  stall->add_missing_ranks(3);
  stall->add_missing_nodes("n2");
  stall->add_submitted_ranks(0);
  stall->add_submitted_ranks(1);
  stall->set_waiting_ms(12400);
  v1::TensorMismatchStatus* mismatch = job.add_mismatches();
  mismatch->set_tensor("grad.fc.bias");
  mismatch->set_field("shape");
  mismatch->set_message("node n1 declared [10], node n2 declared [12]");
  for (int i = 0; i < 9; ++i) {
    AddEvent(job, 3700 - i * 10, "join", 1, "node n" + std::to_string(i));
  }
  AddEvent(job, 95, "lost", 2, "node n2 lost: session closed");
  AddEvent(job, 80, "reforming", 2, "waiting for 2 nodes");
  AddEvent(job, 5, "sealed", 3, "generation 3 sealed with 2 nodes");
  AddReform(job, 1, "lost", "n2", 95, 420, 2, 1, "sealed");
  AddReform(job, 2, "joined", "n2", 5, 0, 1, 2, "sealed");
  job.set_members_lost(1);
  job.set_members_joined(1);
  return job;
}

v1::TensorsStatus Tensors() {
  v1::TensorsStatus tensors;
  tensors.set_job("resnet");
  tensors.set_plan_version(2);
  tensors.set_partition_bytes(4 << 20);
  const auto add = [&](const std::string& name, v1::DataType dtype,
                       std::vector<int64_t> shape, int64_t bytes, int priority,
                       int partitions, int64_t count, int64_t mean,
                       int64_t max) {
    v1::TensorStatus* t = tensors.add_tensors();
    t->set_id(tensors.tensors_size() - 1);
    t->mutable_spec()->set_name(name);
    t->mutable_spec()->set_dtype(dtype);
    for (int64_t d : shape) t->mutable_spec()->add_shape(d);
    t->mutable_spec()->set_op(v1::COLLECTIVE_OP_PUSH_PULL);
    t->set_size_bytes(bytes);
    t->set_priority(priority);
    t->set_num_partitions(partitions);
    t->set_latency_count(count);
    t->set_latency_mean_us(mean);
    t->set_latency_max_us(max);
  };
  add("grad.conv1.weight", v1::DATA_TYPE_FLOAT32, {64, 3, 7, 7}, 37632, 0, 1,
      12, 850, 2100);
  add("grad.fc.weight", v1::DATA_TYPE_BFLOAT16, {1000, 2048}, 4096000, 1, 1, 12,
      14500, 31000);
  add("grad.layer4.weight", v1::DATA_TYPE_FLOAT32, {2048, 512, 3, 3}, 37748736,
      2, 9, 0, 0, 0);
  return tensors;
}

TEST(BatonctlFormatTest, StatusOfARunningJobHasEverySection) {
  ExpectGolden("status_running.txt", FormatJob(RunningJob(), kNow));
}

TEST(BatonctlFormatTest, EmptySectionsOfAFormingJobSayNone) {
  v1::JobStatus job;
  job.set_job("forming-job");
  job.set_state(v1::JOB_STATE_FORMING);
  job.set_state_reason("waiting for 2 more nodes");
  job.set_expected_nodes(2);
  job.set_min_nodes(2);
  job.set_global_step(-1);
  ExpectGolden("status_forming.txt", FormatJob(job, kNow));
}

// A job re-forming for the seventh time: the last five re-forms, the one in
// progress with its wait so far.
TEST(BatonctlFormatTest, ReformsShowTheLastFewAndTheOneInProgress) {
  v1::JobStatus job;
  job.set_job("elastic");
  job.set_state(v1::JOB_STATE_REFORMING);
  for (int i = 1; i <= 6; ++i) {
    AddReform(job, i, i % 2 == 1 ? "left" : "joined", "n3", 700 - i * 100,
              i * 10, 3, 2, "sealed");
  }
  AddReform(job, 7, "lost", "n1", 12, 12345, 3, 2, "");
  job.set_members_lost(4);
  job.set_members_joined(3);
  EXPECT_EQ(SectionOf(FormatJob(job, kNow), "Re-forms"),
            "Re-forms\n"
            "  nodes lost: 4, joined: 3\n"
            "  GENERATION  STARTED    CAUSE   NODE  DURATION  NODES   OUTCOME\n"
            "  3 -> 4      6m40s ago  left    n3    0.03 s    3 -> 2  sealed\n"
            "  4 -> 5      5m0s ago   joined  n3    0.04 s    3 -> 2  sealed\n"
            "  5 -> 6      3m20s ago  left    n3    0.05 s    3 -> 2  sealed\n"
            "  6 -> 7      1m40s ago  joined  n3    0.06 s    3 -> 2  sealed\n"
            "  7 -> 8      12s ago    lost    n1    12.35 s   3 -> 2  in "
            "progress\n");
}

TEST(BatonctlFormatTest, FailedReformSaysWhy) {
  v1::JobStatus job;
  job.set_job("failed");
  job.set_state(v1::JOB_STATE_FAILED);
  AddReform(job, 4, "lost", "n0", 70, 60000, 2, 1,
            "failed: not whole again within 60.0 s (have 1 of the 2 nodes "
            "needed) after: node n0 lost");
  job.set_members_lost(1);
  EXPECT_THAT(SectionOf(FormatJob(job, kNow), "Re-forms"),
              HasSubstr("  4 -> 5      1m10s ago  lost   n0    60.00 s   2 -> "
                        "1  failed: not whole again within 60.0 s (have 1 of "
                        "the 2 nodes needed) after: node n0 lost\n"));
}

TEST(BatonctlFormatTest, StatusOfEveryJobSeparatesThemAndSaysWhenThereAreNone) {
  v1::ListJobsResponse jobs;
  EXPECT_EQ(FormatJobs(jobs, kNow), "jobs: (none)\n");
  *jobs.add_jobs() = RunningJob();
  jobs.add_jobs()->set_job("second");
  const std::string text = FormatJobs(jobs, kNow);
  EXPECT_THAT(
      text, HasSubstr("sealed with 2 nodes\n\n======== job second ========\n"));
}

TEST(BatonctlFormatTest, JobsIsOneLinePerJob) {
  v1::ListJobsResponse jobs;
  *jobs.add_jobs() = RunningJob();
  v1::JobStatus* failed = jobs.add_jobs();
  failed->set_job("bert-large");
  failed->set_state(v1::JOB_STATE_FAILED);
  failed->set_generation(12);
  failed->set_world_size(64);
  failed->set_global_step(100321);
  EXPECT_EQ(FormatJobList(jobs),
            "JOB         STATE    GENERATION  WORLD SIZE  GLOBAL STEP\n"
            "resnet      running  3           4           39\n"
            "bert-large  failed   12          64          100321\n");
  EXPECT_EQ(FormatJobList(v1::ListJobsResponse()), "jobs: (none)\n");
}

TEST(BatonctlFormatTest, MembersIsTheMembershipTable) {
  EXPECT_EQ(FormatMembers(RunningJob(), kNow),
            "Membership of job resnet\n"
            "  NODE  DATA ADDRESS      NODE RANK  RANKS  LAST SEEN  CONNECTED\n"
            "  n1    n1.cluster:29500  0          0..1   1s ago     yes\n"
            "  n2    n2.cluster:29500  1          2..3   1m15s ago  yes\n"
            "  n3    n3.cluster:29500  -          -      -          no\n");
}

TEST(BatonctlFormatTest, StatusOfALargeJobShowsTheNodesThatNeedALookFirst) {
  v1::JobStatus job;
  job.set_job("big");
  job.set_state(v1::JOB_STATE_RUNNING);
  for (int k = 0; k < 30; ++k) AddMember(job, "n" + std::to_string(k), k, 1);
  job.mutable_members(25)->set_connected(false);
  job.mutable_members(27)->mutable_ranks(0)->set_lag(4);
  const std::string text = FormatJob(job, kNow);
  const std::string membership =
      text.substr(text.find("\nMembership\n"),
                  text.find("\nRe-forms\n") - text.find("\nMembership\n"));
  // 20 rows in rank order: the two that need a look, then n0..n17.
  EXPECT_THAT(membership, HasSubstr("\n  n17 "));
  EXPECT_THAT(membership, Not(HasSubstr("\n  n18 ")));
  EXPECT_THAT(membership, HasSubstr("\n  n25 "));
  EXPECT_THAT(membership, HasSubstr("\n  n27 "));
  EXPECT_LT(membership.find("\n  n17 "), membership.find("\n  n25 "));
  EXPECT_THAT(membership,
              HasSubstr("  ... 10 more nodes (29 of 30 connected; shown: the "
                        "disconnected, unsealed and lagging first): batonctl "
                        "members big lists every node"));
  // The Scheduling table is cut the same way.
  EXPECT_THAT(text.substr(text.find("\nScheduling\n")),
              HasSubstr("  ... 10 more nodes"));
  // Asked for all of them (batonctl status --all), and in `members`.
  EXPECT_THAT(FormatJob(job, kNow, 30), Not(HasSubstr("more nodes")));
  EXPECT_THAT(FormatMembers(job, kNow), HasSubstr("\n  n29 "));
  EXPECT_THAT(FormatMembers(job, kNow), Not(HasSubstr("more nodes")));
}

TEST(BatonctlFormatTest, EventsListsEveryEventOldestFirst) {
  const std::string text = FormatEvents(RunningJob(), kNow);
  EXPECT_THAT(text, HasSubstr("node n0\n"));
  EXPECT_THAT(text, HasSubstr("  2024-05-01 11:59:55.000 UTC  5s ago     "
                              "sealed     3           generation 3 sealed "
                              "with 2 nodes\n"));
  EXPECT_LT(text.find("node n0"), text.find("node n2 lost"));
  // status shows only the last kRecentEvents of the 12.
  EXPECT_THAT(FormatJob(RunningJob(), kNow), Not(HasSubstr("node n1\n")));
}

TEST(BatonctlFormatTest, TensorsListsThePlanWithLatencies) {
  ExpectGolden("tensors.txt", FormatTensors(Tensors()));
}

TEST(BatonctlFormatTest, TensorsBeforeThePlanSaysNone) {
  v1::TensorsStatus tensors;
  tensors.set_job("new");
  EXPECT_EQ(FormatTensors(tensors),
            "Tensors of job new: plan version 0, partitions of at most 0 B\n"
            "  (none)\n");
}

TEST(BatonctlFormatTest, UnitsAndAges) {
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(1536), "1.5 KiB");
  EXPECT_EQ(FormatBytes(4 << 20), "4.0 MiB");
  EXPECT_EQ(FormatBytes(3.0 * (1LL << 40)), "3.0 TiB");
  EXPECT_EQ(FormatMicros(850), "850 us");
  EXPECT_EQ(FormatMicros(14500), "14.5 ms");
  EXPECT_EQ(FormatMicros(3400000), "3.40 s");
  EXPECT_EQ(FormatAgo(0, kNow), "-");
  EXPECT_EQ(FormatAgo(kNowMs + 2000, kNow), "0s ago");
  EXPECT_EQ(FormatAgo(kNowMs - 59999, kNow), "59s ago");
  EXPECT_EQ(FormatAgo(kNowMs - 3723000, kNow), "1h2m ago");
  EXPECT_EQ(FormatAgo(kNowMs - 90000000, kNow), "1d1h ago");
}

TEST(BatonctlFormatTest, JsonIsTheProtoWithItsFieldNamesAndEveryField) {
  const v1::JobStatus job = RunningJob();
  absl::StatusOr<std::string> json = ToJson(job, /*multiline=*/true);
  ASSERT_TRUE(json.ok()) << json.status();
  // Proto field names; zero fields printed; int64 as strings (proto3 JSON).
  EXPECT_THAT(*json, HasSubstr("\"state_reason\": "));
  EXPECT_THAT(*json, HasSubstr("\"queue_depth\": \"0\""));
  EXPECT_THAT(*json, HasSubstr("\"state\": \"JOB_STATE_RUNNING\""));
  v1::JobStatus parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(*json, &parsed).ok());
  EXPECT_EQ(parsed.job(), "resnet");
  EXPECT_EQ(parsed.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(parsed.generation(), 3);
  ASSERT_EQ(parsed.members_size(), 3);
  EXPECT_EQ(parsed.members(1).node_name(), "n2");
  EXPECT_EQ(parsed.members(1).ranks(1).lag(), 2);
  EXPECT_EQ(parsed.members(0).bytes_in_flight(), 8 << 20);
  EXPECT_EQ(parsed.plan().num_partitions(), 14);
  ASSERT_EQ(parsed.stalls_size(), 1);
  EXPECT_THAT(parsed.stalls(0).missing_ranks(), ::testing::ElementsAre(2, 3));
  EXPECT_EQ(parsed.events_size(), 12);
  ASSERT_EQ(parsed.reforms_size(), 2);
  EXPECT_EQ(parsed.reforms(0).duration_ms(), 420);
  EXPECT_EQ(parsed.reforms(1).cause(), "joined");
  EXPECT_EQ(parsed.members_joined(), 1);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(parsed, job));
}

TEST(BatonctlFormatTest, JsonLineIsOneLine) {
  v1::TensorsStatus tensors = Tensors();
  absl::StatusOr<std::string> json = ToJson(tensors, /*multiline=*/false);
  ASSERT_TRUE(json.ok()) << json.status();
  EXPECT_EQ(json->find('\n'), json->size() - 1);
  v1::TensorsStatus parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(*json, &parsed).ok());
  ASSERT_EQ(parsed.tensors_size(), 3);
  EXPECT_EQ(parsed.tensors(1).spec().name(), "grad.fc.weight");
  EXPECT_EQ(parsed.tensors(1).spec().dtype(), v1::DATA_TYPE_BFLOAT16);
  EXPECT_EQ(parsed.tensors(1).latency_mean_us(), 14500);
  EXPECT_EQ(parsed.tensors(2).latency_count(), 0);
  EXPECT_TRUE(
      google::protobuf::util::MessageDifferencer::Equals(parsed, tensors));
}

TEST(BatonctlFormatTest, UnreachableCoordinatorIsOneLineNamingTheAddress) {
  const absl::Status error = DescribeRpcError(
      "10.0.0.1:50051", "Status/GetJob", "resnet", absl::Seconds(5),
      grpc::Status(grpc::StatusCode::UNAVAILABLE, "failed to connect\nretry"));
  EXPECT_EQ(error.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(error.message(),
            "cannot reach the coordinator at 10.0.0.1:50051 (Status/GetJob: "
            "UNAVAILABLE: failed to connect retry): check that "
            "baton-coordinator runs there and that --coordinator or "
            "BATON_COORDINATOR names its address");
  EXPECT_THAT(
      DescribeRpcError("h:1", "Status/ListJobs", "", absl::Seconds(5),
                       grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, ""))
          .message(),
      HasSubstr("(Status/ListJobs: no answer within 5s, --timeout_ms)"));
  // A refused TLS handshake (or plaintext to a TLS coordinator) says so.
  EXPECT_THAT(std::string(DescribeRpcError(
                              "h:1", "Status/ListJobs", "", absl::Seconds(5),
                              grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                           "ipv4:127.0.0.1:1: Socket closed"))
                              .message()),
              HasSubstr("if it runs with TLS, give --tls_cert, --tls_key and "
                        "--tls_ca"));
}

// A coordinator without the method (an older one) is named with the
// method's own service: batonctl cancel asks the Admin service.
TEST(BatonctlFormatTest, MissingMethodNamesItsService) {
  const absl::Status error = DescribeRpcError(
      "h:1", "Admin/CancelJob", "j", absl::Seconds(5),
      grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "no such method"));
  EXPECT_EQ(error.code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(error.message(),
            "the server at h:1 does not implement baton.v1.Admin/CancelJob "
            "(UNIMPLEMENTED: no such method): check that --coordinator or "
            "BATON_COORDINATOR names a baton-coordinator, and upgrade it if "
            "it is older than this batonctl");
}

TEST(BatonctlFormatTest, UnknownJobSaysHowToListTheJobs) {
  const absl::Status error = DescribeRpcError(
      "h:1", "Status/GetJob", "nope", absl::Seconds(5),
      grpc::Status(grpc::StatusCode::NOT_FOUND,
                   "job \"nope\" is unknown to the coordinator"));
  EXPECT_EQ(error.message(),
            "job \"nope\" is unknown to the coordinator (coordinator h:1): "
            "batonctl jobs lists the jobs it knows");
}

}  // namespace
}  // namespace baton
