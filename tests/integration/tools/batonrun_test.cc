// batonrun end to end: the real binary starting an embedded coordinator,
// agents and trainer processes.
#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/child_process.h"

#ifndef BATONRUN_BIN
#error "BATONRUN_BIN must name the batonrun binary"
#endif
#ifndef BATON_TEST_TRAINER_BIN
#error "BATON_TEST_TRAINER_BIN must name the baton-test-trainer binary"
#endif

namespace baton {
namespace {

using ::testing::HasSubstr;

struct Outcome {
  ProcessExit exit;
  std::string out;
  std::string err;
};

class Batonrun {
 public:
  explicit Batonrun(std::vector<std::string> args) {
    char path[] = "/tmp/batonrun-test.XXXXXX";
    close(mkstemp(path));
    err_path_ = path;
    ChildProcess::Options options;
    options.argv = {BATONRUN_BIN};
    options.argv.insert(options.argv.end(), args.begin(), args.end());
    options.stderr_path = err_path_;
    started_ = process_.Start(options);
  }
  ~Batonrun() { unlink(err_path_.c_str()); }

  ChildProcess& process() { return process_; }
  const absl::Status& started() const { return started_; }

  // batonrun's stderr so far.
  std::string err() const {
    std::ifstream in(err_path_);
    return std::string((std::istreambuf_iterator<char>(in)),
                       std::istreambuf_iterator<char>());
  }
  // Waits up to 30 s for `text` on stderr.
  bool WaitForErr(const std::string& text) const {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (absl::Now() < deadline) {
      if (absl::StrContains(err(), text)) return true;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return false;
  }
  Outcome Finish(ProcessExit exit) {
    return {exit, process_.stdout_text(), err()};
  }
  Outcome Wait(absl::Duration timeout) {
    return Finish(process_.Wait(timeout));
  }

 private:
  std::string err_path_;
  ChildProcess process_;
  absl::Status started_;
};

// The direct children of `pid` (/proc/PID/task/PID/children).
std::vector<pid_t> ChildrenOf(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/task/", pid, "/children"));
  std::vector<pid_t> children;
  pid_t child;
  while (in >> child) children.push_back(child);
  return children;
}

bool Alive(pid_t pid) { return kill(pid, 0) == 0; }

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)),
                     std::istreambuf_iterator<char>());
}

// The command line of `pid`, arguments separated by spaces.
std::string CommandLine(const std::string& pid) {
  std::string cmdline = ReadAll(absl::StrCat("/proc/", pid, "/cmdline"));
  for (char& c : cmdline) {
    if (c == '\0') c = ' ';
  }
  return cmdline;
}

// The child of `parent` whose command line contains `binary`; -1 if none.
pid_t ChildRunning(pid_t parent, const std::string& binary) {
  for (pid_t child : ChildrenOf(parent)) {
    if (absl::StrContains(CommandLine(absl::StrCat(child)), binary))
      return child;
  }
  return -1;
}

// SIGKILL, then waits (10 s at most) until `pid` is dead: a zombie (not
// ours to reap) or gone.
bool KillAndAwaitDeath(pid_t pid) {
  kill(pid, SIGKILL);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    const std::string stat = ReadAll(absl::StrCat("/proc/", pid, "/stat"));
    const size_t paren = stat.rfind(") ");
    if (paren == std::string::npos || stat[paren + 2] == 'Z') return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return false;
}

// The directory of a log that batonrun named on stderr ("... /tmp/batonrun.X/
// coordinator.log"), to remove after the test; "" when not named.
std::string KeptDirectory(const std::string& err) {
  const size_t start = err.find("/tmp/batonrun.");
  if (start == std::string::npos) return "";
  return err.substr(start, err.find('/', start + 5) - start);
}

void RemoveDirectory(const std::string& dir) {
  if (!dir.empty()) std::system(("rm -rf " + dir).c_str());
}

bool WaitForOutput(ChildProcess& process, const std::string& text) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline) {
    if (absl::StrContains(process.stdout_text(), text)) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

// Processes whose command line contains `marker`.
int ProcessesWith(const std::string& marker) {
  int found = 0;
  DIR* proc = opendir("/proc");
  while (struct dirent* e = readdir(proc)) {
    const std::string cmdline = CommandLine(e->d_name);
    // batonrun's own command line holds the marker too.
    if (absl::StrContains(cmdline, marker) &&
        !absl::StrContains(cmdline, BATONRUN_BIN)) {
      ++found;
    }
  }
  closedir(proc);
  return found;
}

// ProcessesWith(marker), read again until it is `want` or `timeout` passed:
// a process in the middle of exec reads as an empty command line for a
// moment (a shell that printed "ready" and is becoming `sleep`).
int AwaitProcessesWith(const std::string& marker, int want,
                       absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  int found = ProcessesWith(marker);
  while (found != want && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
    found = ProcessesWith(marker);
  }
  return found;
}

TEST(BatonrunTest, StartsAClusterWithExactRanksAndPrefixedOutput) {
  Batonrun run({"--nodes=2", "--procs-per-node=2", "--job=ranks", "--",
                BATON_TEST_TRAINER_BIN, "--scenario=loop", "--count=64",
                "--steps=5"});
  ASSERT_TRUE(run.started().ok()) << run.started();
  const Outcome result = run.Wait(absl::Minutes(1));
  EXPECT_TRUE(result.exit.ok()) << result.exit.ToString() << result.err;
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_THAT(
        result.out,
        HasSubstr(absl::StrCat("[", rank, "] attached rank=", rank, " size=4")))
        << result.out;
    EXPECT_THAT(result.out, HasSubstr(absl::StrCat("[", rank, "] PASS")));
  }
}

TEST(BatonrunTest, AFailingRankStopsTheOthersAndIsNamed) {
  Batonrun run({"--nodes=1", "--procs-per-node=2", "--", "sh", "-c",
                "if [ \"$LOCAL_RANK\" = 1 ]; then exit 3; fi; exec sleep 301"});
  ASSERT_TRUE(run.started().ok()) << run.started();
  const Outcome result = run.Wait(absl::Seconds(20));
  EXPECT_TRUE(result.exit.exited && result.exit.exit_code == 1)
      << result.exit.ToString();
  EXPECT_LT(result.exit.elapsed, absl::Seconds(15));
  EXPECT_THAT(result.err, HasSubstr("rank 1 (pid "));
  EXPECT_THAT(result.err, HasSubstr("exited with code 3; stopped the others"));
  EXPECT_EQ(ProcessesWith("sleep 301"), 0);
}

TEST(BatonrunTest, ForwardsSignalsAndLeavesNothingBehind) {
  Batonrun run({"--nodes=1", "--procs-per-node=2", "--", "sh", "-c",
                "echo ready; exec sleep 302"});
  ASSERT_TRUE(run.started().ok()) << run.started();
  ASSERT_TRUE(WaitForOutput(run.process(), "[1] ready"));
  ASSERT_TRUE(WaitForOutput(run.process(), "[0] ready"));
  EXPECT_EQ(AwaitProcessesWith("sleep 302", 2, absl::Seconds(10)), 2);
  // Coordinator, agent and two trainers.
  const std::vector<pid_t> children = ChildrenOf(run.process().pid());
  EXPECT_EQ(children.size(), 4u);
  const Outcome result = run.Finish(run.process().Terminate(absl::Seconds(15)));
  EXPECT_TRUE(result.exit.exited && result.exit.exit_code == 128 + SIGTERM)
      << result.exit.ToString();
  EXPECT_THAT(result.err, HasSubstr("stopping the trainers"));
  EXPECT_EQ(ProcessesWith("sleep 302"), 0);
  // The embedded coordinator and agent are gone too.
  for (pid_t child : children) EXPECT_FALSE(Alive(child)) << child;
}

TEST(BatonrunTest, BadUsageExitsTwo) {
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"--nodes=1"},
                                             {"--nodes=0", "--", "true"},
                                             {"stray", "--", "true"}}) {
    Batonrun run(args);
    ASSERT_TRUE(run.started().ok());
    const Outcome result = run.Wait(absl::Seconds(10));
    EXPECT_TRUE(result.exit.exited && result.exit.exit_code == 2)
        << args[0] << ": " << result.exit.ToString();
    EXPECT_THAT(result.err, HasSubstr("batonrun: ")) << args[0];
  }
}

// The embedded coordinator SIGKILLed after step 10: batonrun starts it again
// on its address, the steps after the kill go on, and a tensor declared at
// step 12, which only a coordinator can plan, is planned by the new one.
TEST(BatonrunTest, AKilledEmbeddedCoordinatorIsRestartedAndTheJobFinishes) {
  Batonrun run({"--nodes=2", "--procs-per-node=2", "--job=supervised", "--",
                BATON_TEST_TRAINER_BIN, "--scenario=loop", "--count=4096",
                "--steps=30", "--kill_coordinator_at_step=10",
                "--late_tensor_at_step=12"});
  ASSERT_TRUE(run.started().ok()) << run.started();
  const Outcome result = run.Wait(absl::Minutes(2));
  const std::string kept = KeptDirectory(result.err);
  EXPECT_TRUE(result.exit.ok())
      << result.exit.ToString() << result.err << result.out;
  EXPECT_THAT(result.out, HasSubstr("[0] killed the coordinator (pid "));
  EXPECT_THAT(result.out, HasSubstr(" after step 10"));
  EXPECT_THAT(result.err, HasSubstr("was killed by signal 9 (Killed); "
                                    "restarted it on 127.0.0.1:"));
  EXPECT_THAT(result.err, HasSubstr("restart 1 of at most 5 a minute); its "
                                    "log is /tmp/batonrun."));
  EXPECT_THAT(result.err, HasSubstr("the coordinator was restarted 1 time; "
                                    "kept its log /tmp/batonrun."));
  for (int rank = 0; rank < 4; ++rank) {
    // Every step's "loop" result and, from step 12, "late"'s: 30 + 18.
    EXPECT_THAT(result.out, HasSubstr(absl::StrCat("[", rank, "] step 29 ok")))
        << result.out;
    EXPECT_THAT(result.out,
                HasSubstr(absl::StrCat("[", rank, "] PASS checks=48")))
        << result.out;
  }
  ASSERT_FALSE(kept.empty()) << result.err;
  // The log goes on after the restart, in the same file.
  EXPECT_THAT(ReadAll(kept + "/coordinator.log"),
              HasSubstr("batonrun: the coordinator (pid "));
  RemoveDirectory(kept);
}

TEST(BatonrunTest, GivesUpAfterMaxCoordinatorRestartsAMinute) {
  Batonrun run({"--nodes=1", "--procs-per-node=1",
                "--max_coordinator_restarts=1", "--", "sh", "-c",
                "echo ready; exec sleep 303"});
  ASSERT_TRUE(run.started().ok()) << run.started();
  ASSERT_TRUE(WaitForOutput(run.process(), "[0] ready"));
  const pid_t first = ChildRunning(run.process().pid(), "baton-coordinator");
  ASSERT_GT(first, 0);
  ASSERT_TRUE(KillAndAwaitDeath(first));
  ASSERT_TRUE(run.WaitForErr("restarted it on")) << run.err();
  const pid_t second = ChildRunning(run.process().pid(), "baton-coordinator");
  ASSERT_GT(second, 0);
  ASSERT_NE(second, first);
  ASSERT_TRUE(KillAndAwaitDeath(second));
  const Outcome result = run.Wait(absl::Seconds(30));
  const std::string kept = KeptDirectory(result.err);
  EXPECT_TRUE(result.exit.exited && result.exit.exit_code == 1)
      << result.exit.ToString() << result.err;
  EXPECT_THAT(result.err,
              HasSubstr(absl::StrCat(
                  "the coordinator (pid ", second,
                  ") was killed by signal 9 (Killed); not restarting it: it "
                  "was restarted 1 time within the last minute "
                  "(--max_coordinator_restarts=1); see /tmp/batonrun.")));
  EXPECT_THAT(result.err, HasSubstr("stopped the others"));
  EXPECT_EQ(ProcessesWith("sleep 303"), 0);
  RemoveDirectory(kept);
}

// While batonrun is stopped, its coordinator dies and another process takes
// the port: the restart fails at once, naming the address, and the job ends.
TEST(BatonrunTest, ACoordinatorPortTakenMeanwhileEndsTheJobNamingIt) {
  Batonrun run({"--nodes=1", "--procs-per-node=1", "--", "sh", "-c",
                "echo ready; exec sleep 304"});
  ASSERT_TRUE(run.started().ok()) << run.started();
  ASSERT_TRUE(WaitForOutput(run.process(), "[0] ready"));
  const pid_t agent = ChildRunning(run.process().pid(), "baton-agent");
  ASSERT_GT(agent, 0);
  const std::string flag = "--coordinator=127.0.0.1:";
  const std::string agent_cmdline = CommandLine(absl::StrCat(agent));
  const size_t at = agent_cmdline.find(flag);
  ASSERT_NE(at, std::string::npos) << agent_cmdline;
  const int port = std::stoi(agent_cmdline.substr(at + flag.size()));
  const pid_t coordinator =
      ChildRunning(run.process().pid(), "baton-coordinator");
  ASSERT_GT(coordinator, 0);

  ASSERT_EQ(kill(run.process().pid(), SIGSTOP), 0);
  ASSERT_TRUE(KillAndAwaitDeath(coordinator));
  const int taken = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(taken, 0);
  const int one = 1;
  // The old coordinator's connections may linger in TIME_WAIT.
  setsockopt(taken, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  // The port is free once the last of the coordinator's threads is gone,
  // which may be a little after its main thread shows as a zombie.
  bool bound = false;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!bound && absl::Now() < deadline) {
    bound = bind(taken, reinterpret_cast<sockaddr*>(&address),
                 sizeof(address)) == 0;
    if (!bound) absl::SleepFor(absl::Milliseconds(10));
  }
  bound = bound && listen(taken, 16) == 0;
  kill(run.process().pid(), SIGCONT);
  ASSERT_TRUE(bound) << "port " << port << ": " << std::strerror(errno);

  const Outcome result = run.Wait(absl::Seconds(30));
  close(taken);
  const std::string kept = KeptDirectory(result.err);
  EXPECT_TRUE(result.exit.exited && result.exit.exit_code == 1)
      << result.exit.ToString() << result.err;
  EXPECT_THAT(result.err,
              HasSubstr(absl::StrCat(
                  "the coordinator (pid ", coordinator,
                  ") was killed by signal 9 (Killed); restarting it on "
                  "127.0.0.1:",
                  port,
                  " failed: the new one exited with code 1 before it listened "
                  "(another process may hold the port now); see "
                  "/tmp/batonrun.")));
  EXPECT_THAT(result.err, HasSubstr("stopped the others"));
  EXPECT_EQ(ProcessesWith("sleep 304"), 0);
  RemoveDirectory(kept);
}

}  // namespace
}  // namespace baton
