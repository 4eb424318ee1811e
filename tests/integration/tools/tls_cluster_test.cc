// Mutual TLS end to end: a real coordinator, agents, trainers and batonctl
// with certificates made by tools/dev/make-test-certs. A TLS cluster
// trains; what is refused is refused with a clear error and disturbs nobody
// else; the coordinator's certificate is replaced while a job runs.

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/agent/local_cluster.h"
#include "tests/integration/child_process.h"

#ifndef BATONCTL_BIN
#error "BATONCTL_BIN must name the batonctl binary"
#endif
#ifndef BATON_MAKE_TEST_CERTS
#error "BATON_MAKE_TEST_CERTS must name tools/dev/make-test-certs"
#endif

namespace baton {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Certificates for nodes n1..n3 under `dir` (COORDINATOR_SAN: `san`).
void MakeCerts(const std::string& dir, const std::string& san = "") {
  const std::string command =
      absl::StrCat(san.empty() ? "" : "COORDINATOR_SAN=" + san + " ",
                   BATON_MAKE_TEST_CERTS, " ", dir, " n1 n2 n3 >/dev/null");
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
}

// --tls_* for NAME.pem (key and certificate in one file) and `ca`.
std::vector<std::string> TlsFlags(const std::string& pem,
                                  const std::string& ca) {
  return {"--tls_cert=" + pem, "--tls_key=" + pem, "--tls_ca=" + ca,
          "--tls_refresh_s=1"};
}

using Ended = ProgramRun;

class TlsClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    certs_ = absl::StrCat(
        ::testing::TempDir(), "/tls-cluster-",
        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    MakeCerts(certs_);
  }

  std::string Cert(const std::string& name) const {
    return absl::StrCat(certs_, "/", name, ".pem");
  }
  std::string Ca() const { return certs_ + "/ca.crt"; }

  // The cluster: the coordinator with `coordinator_pem`, agents n1..n<nodes>
  // each with its own certificate.
  void StartCluster(LocalCluster& cluster, int nodes,
                    const std::string& coordinator_pem) {
    // Each agent gets its own node's certificate: the {node} of its flags.
    ASSERT_TRUE(cluster
                    .Start(nodes, TlsFlags(coordinator_pem, Ca()),
                           TlsFlags(certs_ + "/{node}.pem", Ca()))
                    .ok());
  }

  Ended Batonctl(LocalCluster& cluster, const std::vector<std::string>& tls,
                 const std::vector<std::string>& command = {"jobs"}) {
    std::vector<std::string> args = {
        "--coordinator=" + cluster.coordinator().address(),
        "--timeout_ms=3000"};
    args.insert(args.end(), tls.begin(), tls.end());
    args.insert(args.end(), command.begin(), command.end());
    return RunToEnd(BATONCTL_BIN, args);
  }

  std::string certs_;
};

// A cluster with TLS on every channel trains; batonctl answers with its own
// certificate, and one without TLS is told what to give.
TEST_F(TlsClusterTest, ClusterTrainsAndBatonctlAnswers) {
  LocalCluster cluster;
  StartCluster(cluster, 2, Cert("coordinator"));
  ASSERT_TRUE(cluster.StartTrainers("tls", {1, 1}, {"--steps=3"}).ok());
  const std::vector<ProcessExit> exits = cluster.WaitTrainers(absl::Minutes(2));
  for (size_t i = 0; i < exits.size(); ++i) {
    EXPECT_TRUE(exits[i].ok()) << Describe(cluster.trainer(i), exits[i]);
    EXPECT_THAT(cluster.trainer(i).stdout_text(), HasSubstr("PASS"));
  }
  const Ended status =
      Batonctl(cluster, TlsFlags(Cert("batonctl"), Ca()), {"status", "tls"});
  EXPECT_TRUE(status.exit.ok()) << status.err;
  EXPECT_THAT(status.out, HasSubstr("tls"));

  const Ended plaintext = Batonctl(cluster, {});
  EXPECT_FALSE(plaintext.exit.ok());
  EXPECT_THAT(plaintext.err,
              HasSubstr("if it runs with TLS, give --tls_cert, --tls_key and "
                        "--tls_ca"));
  const Ended stranger = Batonctl(
      cluster, TlsFlags(certs_ + "/wrong/n1.pem", certs_ + "/wrong/ca.crt"));
  EXPECT_FALSE(stranger.exit.ok());
}

// Agents the cluster must not admit: one whose certificate another CA
// signed is refused at the handshake and never joins; an expired
// certificate, one naming another node and gloo's unauthenticated
// transport stop the agent at start with one line. Meanwhile the job on n1 and
// n2 trains on, undisturbed.
TEST_F(TlsClusterTest, RefusedAgentsDisturbNobody) {
  LocalCluster cluster;
  StartCluster(cluster, 2, Cert("coordinator"));
  ASSERT_TRUE(cluster
                  .StartTrainers("steady", {1, 1},
                                 {"--scenario=loop", "--count=1024",
                                  "--steps=60", "--step_sleep_ms=50"})
                  .ok());

  // Another CA's certificate, consistent in itself: it passes the agent's
  // own check, and the coordinator refuses the handshake.
  ChildProcess forged;
  ChildProcess::Options options;
  options.argv = {LocalCluster::AgentBinary(),
                  "--coordinator=" + cluster.coordinator().address(),
                  "--node=n1", "--socket=" + cluster.dir() + "/forged.sock"};
  for (const std::string& flag :
       TlsFlags(certs_ + "/wrong/n1.pem", certs_ + "/wrong/ca.crt")) {
    options.argv.push_back(flag);
  }
  options.ready_prefix = "baton-agent ";
  options.stderr_path = cluster.dir() + "/forged.log";
  ASSERT_TRUE(forged.Start(options).ok());

  const Ended expired =
      RunToEnd(LocalCluster::AgentBinary(),
               {"--coordinator=" + cluster.coordinator().address(), "--node=n1",
                "--socket=" + cluster.dir() + "/expired.sock",
                "--tls_cert=" + Cert("expired/n1"),
                "--tls_key=" + Cert("expired/n1"), "--tls_ca=" + Ca()});
  EXPECT_EQ(expired.exit.exit_code, 2) << expired.err;
  EXPECT_THAT(expired.err, HasSubstr("expired at"));

  const Ended impostor =
      RunToEnd(LocalCluster::AgentBinary(),
               {"--coordinator=" + cluster.coordinator().address(), "--node=n3",
                "--socket=" + cluster.dir() + "/impostor.sock",
                "--tls_cert=" + Cert("n2"), "--tls_key=" + Cert("n2"),
                "--tls_ca=" + Ca()});
  EXPECT_EQ(impostor.exit.exit_code, 2) << impostor.err;
  EXPECT_THAT(impostor.err, HasSubstr("does not name this node \"n3\""));

  // gloo's pair connections cannot prove the generation's secret: with
  // TLS the agent refuses them unless told --insecure.
  const Ended gloo =
      RunToEnd(LocalCluster::AgentBinary(),
               {"--coordinator=" + cluster.coordinator().address(), "--node=n3",
                "--socket=" + cluster.dir() + "/gloo.sock",
                "--data_transport=gloo", "--tls_cert=" + Cert("n3"),
                "--tls_key=" + Cert("n3"), "--tls_ca=" + Ca()});
  EXPECT_EQ(gloo.exit.exit_code, 2) << gloo.err;
  EXPECT_THAT(gloo.err, HasSubstr("--data_transport=gloo with TLS"));

  const std::vector<ProcessExit> exits = cluster.WaitTrainers(absl::Minutes(2));
  for (size_t i = 0; i < exits.size(); ++i) {
    EXPECT_TRUE(exits[i].ok()) << Describe(cluster.trainer(i), exits[i]);
    EXPECT_THAT(cluster.trainer(i).stdout_text(), HasSubstr("PASS"));
    // One generation throughout: nobody joined or left.
    EXPECT_THAT(cluster.trainer(i).stdout_text(),
                Not(HasSubstr("generation=2")));
  }
  // The forged agent never had a session.
  const Ended jobs =
      Batonctl(cluster, TlsFlags(Cert("batonctl"), Ca()), {"status", "steady"});
  EXPECT_TRUE(jobs.exit.ok()) << jobs.err;
  EXPECT_THAT(ReadFile(cluster.dir() + "/forged.log"),
              Not(HasSubstr("coordinator session")));
  forged.Terminate(absl::Seconds(5));
}

// The coordinator's certificate is replaced (one rename of its combined
// file) while a job trains: new connections get the new certificate within
// --tls_refresh_s, without a restart, and the job never notices.
TEST_F(TlsClusterTest, CoordinatorCertificateRotatesWhileAJobRuns) {
  const std::string live = certs_ + "/live.pem";
  ASSERT_EQ(
      std::system(absl::StrCat("cp ", Cert("coordinator"), " ", live).c_str()),
      0);
  // A certificate of the same CA that names another host: a client dialling
  // 127.0.0.1 refuses it, which shows when the coordinator serves it.
  const std::string other = certs_ + "/other";
  ASSERT_EQ(std::system(absl::StrCat("mkdir -p ", other, " && cp ", certs_,
                                     "/ca.crt ", certs_, "/ca.key ", other)
                            .c_str()),
            0);
  MakeCerts(other, "DNS:elsewhere.example");

  LocalCluster cluster;
  StartCluster(cluster, 2, live);
  ASSERT_TRUE(cluster
                  .StartTrainers("rotating", {1, 1},
                                 {"--scenario=loop", "--count=1024",
                                  "--steps=80", "--step_sleep_ms=50"})
                  .ok());
  const std::vector<std::string> tls = TlsFlags(Cert("batonctl"), Ca());
  EXPECT_TRUE(Batonctl(cluster, tls).exit.ok());

  const auto swap_in = [&](const std::string& pem) {
    const std::string next = live + ".next";
    ASSERT_EQ(std::system(absl::StrCat("cp ", pem, " ", next, " && mv ", next,
                                       " ", live)
                              .c_str()),
              0);
  };
  // Until `ok` (a batonctl call succeeds or not), at most 20 s.
  const auto wait_for = [&](bool ok) {
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    Ended run;
    do {
      run = Batonctl(cluster, tls);
      if (run.exit.ok() == ok) return run;
      absl::SleepFor(absl::Milliseconds(300));
    } while (absl::Now() < deadline);
    ADD_FAILURE() << "batonctl still " << (ok ? "fails" : "succeeds")
                  << " 20 s after the rotation: " << run.err;
    return run;
  };
  swap_in(other + "/coordinator.pem");
  wait_for(false);
  swap_in(Cert("coordinator"));
  wait_for(true);

  const std::vector<ProcessExit> exits = cluster.WaitTrainers(absl::Minutes(2));
  for (size_t i = 0; i < exits.size(); ++i) {
    EXPECT_TRUE(exits[i].ok()) << Describe(cluster.trainer(i), exits[i]);
    EXPECT_THAT(cluster.trainer(i).stdout_text(),
                Not(HasSubstr("generation=2")));
  }
}

}  // namespace
}  // namespace baton
