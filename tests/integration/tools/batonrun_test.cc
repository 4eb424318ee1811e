// batonrun end to end: the real binary starting an embedded coordinator,
// agents and trainer processes.
#include <dirent.h>
#include <signal.h>
#include <unistd.h>

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

  Outcome Finish(ProcessExit exit) {
    std::ifstream in(err_path_);
    return {exit, process_.stdout_text(),
            std::string((std::istreambuf_iterator<char>(in)),
                        std::istreambuf_iterator<char>())};
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
    std::ifstream in(absl::StrCat("/proc/", e->d_name, "/cmdline"));
    std::string cmdline((std::istreambuf_iterator<char>(in)),
                        std::istreambuf_iterator<char>());
    for (char& c : cmdline) {
      if (c == '\0') c = ' ';
    }
    // batonrun's own command line holds the marker too.
    if (absl::StrContains(cmdline, marker) &&
        !absl::StrContains(cmdline, BATONRUN_BIN)) {
      ++found;
    }
  }
  closedir(proc);
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
  EXPECT_EQ(ProcessesWith("sleep 302"), 2);
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

}  // namespace
}  // namespace baton
