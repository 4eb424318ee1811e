// Bearer tokens end to end (issue 19): a real TLS coordinator with
// --tokens_file, agents, trainers, and batonctl with --token_file. A read
// token reads status with only --tls_ca; missing, wrong and insufficient
// credentials are refused with a clear line; an admin token cancels a
// running job, whose trainers stop with the reason while another job runs
// on; an agent with only a token cannot open a session; empty token files
// are startup errors.

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "baton/job_status.h"
#include "baton/status_client.h"
#include "baton/v1/coordinator.grpc.pb.h"
#include "common/client_credentials.h"
#include "common/tls.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/agent/local_cluster.h"
#include "tests/integration/child_process.h"
#include "tests/integration/coordinator_process.h"

#ifndef BATONCTL_BIN
#error "BATONCTL_BIN must name the batonctl binary"
#endif
#ifndef BATONRUN_BIN
#error "BATONRUN_BIN must name the batonrun binary"
#endif
#ifndef BATON_MAKE_TEST_CERTS
#error "BATON_MAKE_TEST_CERTS must name tools/dev/make-test-certs"
#endif

namespace baton {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kReadToken[] = "read-0123456789abcdef0123";
constexpr char kAdminToken[] = "admin-0123456789abcdef0123";

std::vector<std::string> TlsFlags(const std::string& pem,
                                  const std::string& ca) {
  return {"--tls_cert=" + pem, "--tls_key=" + pem, "--tls_ca=" + ca,
          "--tls_refresh_s=1"};
}

void Write(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  ASSERT_TRUE(out.good()) << path;
}

using Ended = ProgramRun;

class TokenTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(
        ::testing::TempDir(), "/tokens-",
        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    const std::string command =
        absl::StrCat(BATON_MAKE_TEST_CERTS, " ", dir_, " n1 n2 >/dev/null");
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
    Write(Tokens(), absl::StrCat("# who   token\nread reader ", kReadToken,
                                 "\nadmin ops ", kAdminToken, "\n"));
    Write(dir_ + "/read.token", absl::StrCat(kReadToken, "\n"));
    Write(dir_ + "/admin.token", absl::StrCat("  ", kAdminToken, "\n"));
    Write(dir_ + "/wrong.token", "wrong-0123456789abcdef0123\n");
    Write(dir_ + "/empty.token", " \n");
  }

  std::string Cert(const std::string& name) const {
    return absl::StrCat(dir_, "/", name, ".pem");
  }
  std::string Ca() const { return dir_ + "/ca.crt"; }
  std::string Tokens() const { return dir_ + "/tokens"; }
  std::string CoordinatorLog() const { return dir_ + "/coordinator.log"; }

  // The coordinator's log once it holds `text` (it is copied by a thread:
  // at most 10 s).
  std::string AwaitLog(const std::string& text) const {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    std::string log = ReadFile(CoordinatorLog());
    while (!absl::StrContains(log, text) && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(100));
      log = ReadFile(CoordinatorLog());
    }
    return log;
  }
  std::string TokenFile(const std::string& name) const {
    return absl::StrCat(dir_, "/", name, ".token");
  }

  void StartCluster(LocalCluster& cluster, int nodes) {
    std::vector<std::string> flags = TlsFlags(Cert("coordinator"), Ca());
    flags.push_back("--tokens_file=" + Tokens());
    cluster.coordinator().set_stderr_path(CoordinatorLog());
    ASSERT_TRUE(
        cluster.Start(nodes, flags, TlsFlags(dir_ + "/{node}.pem", Ca())).ok());
  }

  // batonctl with --tls_ca and `token` (a name of TokenFile; "" for none).
  Ended Batonctl(LocalCluster& cluster, const std::string& token,
                 const std::vector<std::string>& command) {
    std::vector<std::string> args = {
        "--coordinator=" + cluster.coordinator().address(), "--timeout_ms=5000",
        "--tls_ca=" + Ca()};
    if (!token.empty()) args.push_back("--token_file=" + TokenFile(token));
    args.insert(args.end(), command.begin(), command.end());
    return RunToEnd(BATONCTL_BIN, args);
  }

  // Polls `batonctl status JOB` (read token) until it shows `state`, at most
  // 60 s.
  void AwaitState(LocalCluster& cluster, const std::string& job,
                  const std::string& state) {
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    Ended run;
    do {
      run = Batonctl(cluster, "read", {"--json", "status", job});
      if (absl::StrContains(run.out, state)) return;
      absl::SleepFor(absl::Milliseconds(200));
    } while (absl::Now() < deadline);
    FAIL() << job << " not " << state << " within 60 s: " << run.out << run.err;
  }

  std::string dir_;
};

// A read token is enough for status with only the CA; a call with neither a
// certificate nor a token, or with a token the coordinator does not know,
// is refused and says what to give.
TEST_F(TokenTest, AReadTokenReadsStatusAndOthersAreRefused) {
  LocalCluster cluster;
  StartCluster(cluster, 1);

  const Ended jobs = Batonctl(cluster, "read", {"jobs"});
  EXPECT_TRUE(jobs.exit.ok()) << jobs.err;

  // TLS that verifies the coordinator, with nothing to show.
  TlsFiles ca_only;
  ca_only.ca = Ca();
  StatusClient bare(cluster.coordinator().address(), absl::Seconds(5),
                    ChannelCredentials(ca_only));
  const absl::StatusOr<v1::ListJobsResponse> refused = bare.ListJobs();
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("/baton.v1.Status/ListJobs needs a client certificate "
                        "(--tls_cert and --tls_key) or a bearer token"));

  const Ended wrong = Batonctl(cluster, "wrong", {"jobs"});
  EXPECT_EQ(wrong.exit.exit_code, 1) << wrong.err;
  EXPECT_THAT(wrong.err, HasSubstr("UNAUTHENTICATED"));
  EXPECT_THAT(wrong.err, HasSubstr("the bearer token is not one the "
                                   "coordinator's --tokens_file lists"));
  EXPECT_THAT(wrong.err, Not(HasSubstr("wrong-0123456789")));

  // A certificate alone still reads status.
  std::vector<std::string> with_cert = {
      "--coordinator=" + cluster.coordinator().address(), "jobs"};
  for (const std::string& flag : TlsFlags(Cert("batonctl"), Ca())) {
    with_cert.push_back(flag);
  }
  const Ended cert = RunToEnd(BATONCTL_BIN, with_cert);
  EXPECT_TRUE(cert.exit.ok()) << cert.err;

  // The refusals are in the coordinator's log, without the tokens.
  EXPECT_THAT(AwaitLog("refused a call (no certificate, no token)"),
              HasSubstr("refused a call (no certificate, no token)"));
  const std::string log =
      AwaitLog("refused a call (no certificate, an unknown token)");
  EXPECT_THAT(log, HasSubstr("refused a call (no certificate, an unknown "
                             "token)"));
  EXPECT_THAT(log, Not(HasSubstr("wrong-0123456789")));
}

// Tokens rotate without a restart: a token added to the file is accepted
// within --tls_refresh_s (1 s here), one removed is refused, and a file
// that no longer parses leaves the tokens in force.
TEST_F(TokenTest, TheTokensFileIsReadAgainWhenItChanges) {
  LocalCluster cluster;
  StartCluster(cluster, 1);
  Write(dir_ + "/new.token", "new-0123456789abcdef0123\n");
  const Ended before = Batonctl(cluster, "new", {"jobs"});
  EXPECT_EQ(before.exit.exit_code, 1) << before.err;

  // Until batonctl with `token` succeeds or not, at most 20 s.
  const auto await = [&](const std::string& token, bool ok) {
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    Ended run;
    do {
      run = Batonctl(cluster, token, {"jobs"});
      if (run.exit.ok() == ok) return;
      absl::SleepFor(absl::Milliseconds(300));
    } while (absl::Now() < deadline);
    ADD_FAILURE() << token << " still " << (ok ? "refused" : "accepted")
                  << " 20 s after the change: " << run.err;
  };
  const std::string next = Tokens() + ".next";
  Write(next, absl::StrCat("admin ops ", kAdminToken,
                           "\nread newcomer new-0123456789abcdef0123\n"));
  ASSERT_EQ(std::rename(next.c_str(), Tokens().c_str()), 0);
  await("new", true);
  await("read", false);

  Write(next, "read broken\n");
  ASSERT_EQ(std::rename(next.c_str(), Tokens().c_str()), 0);
  // The file is read again on a call with a token: call until the
  // coordinator logged that it kept the tokens it had, at most 20 s.
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  std::string log;
  do {
    const Ended kept = Batonctl(cluster, "new", {"jobs"});
    EXPECT_TRUE(kept.exit.ok()) << kept.err;
    log = ReadFile(CoordinatorLog());
  } while (!absl::StrContains(log, "keeping the 2 tokens loaded before") &&
           absl::Now() < deadline);
  EXPECT_THAT(log, HasSubstr("keeping the 2 tokens loaded before: "
                             "--tokens_file "));
  EXPECT_THAT(log, HasSubstr("line 1 has 2 words"));
}

// An agent that presents only a token (no certificate) cannot open an
// AgentSession: the store and sessions need a node's certificate.
TEST_F(TokenTest, AnAgentWithOnlyATokenCannotOpenASession) {
  LocalCluster cluster;
  StartCluster(cluster, 1);
  TlsFiles ca_only;
  ca_only.ca = Ca();
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      ClientChannelCredentials(ca_only, TokenFile("admin"));
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  std::unique_ptr<v1::Coordinator::Stub> stub = v1::Coordinator::NewStub(
      grpc::CreateChannel(cluster.coordinator().address(), *credentials));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  auto stream = stub->AgentSession(&context);
  v1::AgentMessage hello;
  hello.set_seq(1);
  hello.mutable_hello()->set_node_name("n1");
  stream->Write(hello);
  v1::CoordinatorMessage reply;
  EXPECT_FALSE(stream->Read(&reply));
  const grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(status.error_message(),
              HasSubstr("needs the node's client certificate"));
}

// An admin token cancels a running job: its trainers stop with the reason
// and status shows it failed; a read token may not, and a second cancel
// finds the job ended. Another job on the same nodes trains on.
TEST_F(TokenTest, AnAdminTokenCancelsARunningJob) {
  LocalCluster cluster;
  StartCluster(cluster, 2);
  ASSERT_TRUE(cluster
                  .StartTrainers("doomed", {1, 1},
                                 {"--scenario=loop", "--count=1024",
                                  "--steps=100000", "--step_sleep_ms=20"})
                  .ok());
  ASSERT_TRUE(cluster
                  .StartTrainers("other", {1, 1},
                                 {"--scenario=loop", "--count=1024",
                                  "--steps=80", "--step_sleep_ms=50"})
                  .ok());
  ASSERT_NO_FATAL_FAILURE(AwaitState(cluster, "doomed", "JOB_STATE_RUNNING"));

  const Ended denied = Batonctl(cluster, "read", {"cancel", "--job=doomed"});
  EXPECT_EQ(denied.exit.exit_code, 1) << denied.err;
  EXPECT_THAT(denied.err, HasSubstr("PERMISSION_DENIED"));
  EXPECT_THAT(denied.err, HasSubstr("the token of \"reader\" has scope read; "
                                    "this needs a token of scope admin"));

  const Ended cancelled =
      Batonctl(cluster, "admin",
               {"cancel", "--job=doomed", "--reason=integration test"});
  ASSERT_TRUE(cancelled.exit.ok()) << cancelled.err;
  EXPECT_THAT(cancelled.out,
              HasSubstr("job \"doomed\" failed: cancelled by ops: "
                        "integration test"));

  const std::vector<ProcessExit> exits = cluster.WaitTrainers(absl::Minutes(2));
  ASSERT_EQ(exits.size(), 4u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_FALSE(exits[i].ok()) << Describe(cluster.trainer(i), exits[i]);
    EXPECT_THAT(cluster.trainer(i).stdout_text(),
                HasSubstr("cancelled by ops: integration test"));
  }
  for (size_t i = 2; i < 4; ++i) {
    EXPECT_TRUE(exits[i].ok()) << Describe(cluster.trainer(i), exits[i]);
    EXPECT_THAT(cluster.trainer(i).stdout_text(), HasSubstr("PASS"));
    EXPECT_THAT(cluster.trainer(i).stdout_text(),
                Not(HasSubstr("generation=2")));
  }

  const Ended status =
      Batonctl(cluster, "read", {"--json", "status", "doomed"});
  EXPECT_TRUE(status.exit.ok()) << status.err;
  EXPECT_THAT(status.out, HasSubstr("JOB_STATE_FAILED"));
  EXPECT_THAT(status.out, HasSubstr("cancelled by ops: integration test"));

  const Ended again = Batonctl(cluster, "admin", {"cancel", "--job=doomed"});
  EXPECT_EQ(again.exit.exit_code, 1);
  EXPECT_THAT(again.err, HasSubstr("FAILED_PRECONDITION"));
  EXPECT_THAT(again.err, HasSubstr("has already failed"));
  const Ended unknown = Batonctl(cluster, "admin", {"cancel", "--job=nosuch"});
  EXPECT_EQ(unknown.exit.exit_code, 1);
  EXPECT_THAT(unknown.err, HasSubstr("\"nosuch\" is unknown"));
}

// FetchJobStatus (Python's job_status_text) takes TLS and the token from
// the environment, as a trainer started by batonrun --coordinator has them.
TEST_F(TokenTest, FetchJobStatusUsesTheEnvironmentsTlsAndToken) {
  LocalCluster cluster;
  StartCluster(cluster, 1);
  ASSERT_TRUE(cluster
                  .StartTrainers("fetched", {1},
                                 {"--scenario=loop", "--count=64", "--steps=20",
                                  "--step_sleep_ms=10"})
                  .ok());
  ASSERT_NO_FATAL_FAILURE(AwaitState(cluster, "fetched", "JOB_STATE_"));
  const std::string address = cluster.coordinator().address();

  // Plaintext to a TLS coordinator: refused at the handshake.
  const absl::StatusOr<v1::JobStatus> plaintext =
      FetchJobStatus(address, "fetched");
  EXPECT_FALSE(plaintext.ok());

  setenv("BATON_TLS_CA", Ca().c_str(), 1);
  setenv("BATON_TOKEN_FILE", TokenFile("read").c_str(), 1);
  const absl::StatusOr<v1::JobStatus> fetched =
      FetchJobStatus(address, "fetched");
  EXPECT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ(fetched.ok() ? fetched->job() : "", "fetched");

  setenv("BATON_TOKEN_FILE", TokenFile("empty").c_str(), 1);
  const absl::StatusOr<v1::JobStatus> empty =
      FetchJobStatus(address, "fetched");
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      empty.status().message(),
      HasSubstr("BATON_TOKEN_FILE " + TokenFile("empty") + " is empty"));
  unsetenv("BATON_TLS_CA");
  unsetenv("BATON_TOKEN_FILE");
  cluster.WaitTrainers(absl::Minutes(1));
}

// Token files that are empty or unusable stop the process at start, with
// one line: batonctl's and batonrun's --token_file, and the coordinator's
// --tokens_file.
TEST_F(TokenTest, UnusableTokenFilesAreStartupErrors) {
  const Ended empty =
      RunToEnd(BATONCTL_BIN, {"--coordinator=127.0.0.1:1", "--tls_ca=" + Ca(),
                              "--token_file=" + TokenFile("empty"), "jobs"});
  EXPECT_EQ(empty.exit.exit_code, 2);
  EXPECT_THAT(empty.err,
              HasSubstr("--token_file " + TokenFile("empty") + " is empty"));

  const Ended plaintext =
      RunToEnd(BATONCTL_BIN, {"--coordinator=127.0.0.1:1",
                              "--token_file=" + TokenFile("read"), "jobs"});
  EXPECT_EQ(plaintext.exit.exit_code, 2);
  EXPECT_THAT(plaintext.err, HasSubstr("needs TLS"));

  const Ended batonrun = RunToEnd(
      BATONRUN_BIN, {"--coordinator=127.0.0.1:1", "--tls_ca=" + Ca(),
                     "--token_file=" + TokenFile("empty"), "--", "true"});
  EXPECT_EQ(batonrun.exit.exit_code, 2);
  EXPECT_THAT(batonrun.err, HasSubstr("batonrun: --token_file " +
                                      TokenFile("empty") + " is empty"));

  const std::string coordinator = CoordinatorProcess::BinaryPath();
  std::vector<std::string> tls = TlsFlags(Cert("coordinator"), Ca());
  tls.push_back("--listen=127.0.0.1:0");
  const auto start = [&](const std::string& tokens_flag, bool with_tls) {
    std::vector<std::string> args = {tokens_flag};
    if (with_tls) args.insert(args.end(), tls.begin(), tls.end());
    if (!with_tls) args.push_back("--listen=127.0.0.1:0");
    return RunToEnd(coordinator, args);
  };
  Write(dir_ + "/no-tokens", "# nobody yet\n");
  const Ended none = start("--tokens_file=" + dir_ + "/no-tokens", true);
  EXPECT_EQ(none.exit.exit_code, 2);
  EXPECT_THAT(none.err, HasSubstr("holds no tokens"));
  Write(dir_ + "/malformed",
        absl::StrCat("read reader ", kReadToken, "\nadmin ops\n"));
  const Ended malformed = start("--tokens_file=" + dir_ + "/malformed", true);
  EXPECT_EQ(malformed.exit.exit_code, 2);
  EXPECT_THAT(malformed.err, HasSubstr("/malformed line 2 has 2 words"));
  const Ended no_tls = start("--tokens_file=" + Tokens(), false);
  EXPECT_EQ(no_tls.exit.exit_code, 2);
  EXPECT_THAT(no_tls.err, HasSubstr("needs TLS"));
}

}  // namespace
}  // namespace baton
