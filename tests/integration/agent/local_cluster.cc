#include "tests/integration/agent/local_cluster.h"

#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

#ifndef BATON_AGENT_BIN
#error "BATON_AGENT_BIN must name the baton-agent binary"
#endif
#ifndef BATON_TEST_TRAINER_BIN
#error "BATON_TEST_TRAINER_BIN must name the baton-test-trainer binary"
#endif

namespace baton {

std::string LocalCluster::AgentBinary() { return BATON_AGENT_BIN; }
std::string LocalCluster::TrainerBinary() { return BATON_TEST_TRAINER_BIN; }

LocalCluster::LocalCluster() {
  // Short: unix socket paths are limited to 108 bytes.
  std::string pattern = "/tmp/baton-test.XXXXXX";
  dir_ = mkdtemp(pattern.data());
}

LocalCluster::~LocalCluster() {
  for (auto& trainer : trainers_) {
    if (trainer->running()) trainer->Kill();
  }
  for (auto& agent : agents_) {
    if (agent->running()) agent->Terminate(absl::Seconds(5));
  }
  if (coordinator_.running()) coordinator_.Terminate(absl::Seconds(5));
  if (::testing::Test::HasFailure()) {
    std::fprintf(stderr, "logs of the failed test kept in %s\n", dir_.c_str());
  } else if (!dir_.empty()) {
    std::system(absl::StrCat("rm -rf ", dir_).c_str());
  }
}

std::string LocalCluster::node_name(int node) const {
  return absl::StrCat("n", node);
}

std::string LocalCluster::socket(int node) const {
  return absl::StrCat(dir_, "/agent", node, ".sock");
}

absl::Status LocalCluster::Start(
    int nodes, const std::vector<std::string>& coordinator_flags,
    const std::vector<std::string>& agent_flags) {
  coordinator_flags_ = coordinator_flags;
  if (absl::Status s = coordinator_.Start(coordinator_flags); !s.ok()) return s;
  for (int node = 1; node <= nodes; ++node) {
    ChildProcess::Options options;
    options.argv = {AgentBinary(), "--coordinator=" + coordinator_.address(),
                    "--node=" + node_name(node), "--socket=" + socket(node),
                    "--launch_trace_dir=" + dir_};
    for (const std::string& flag : agent_flags) {
      options.argv.push_back(
          absl::StrReplaceAll(flag, {{"{node}", node_name(node)}}));
    }
    options.ready_prefix = "baton-agent ";
    options.stderr_path = absl::StrCat(dir_, "/agent", node, ".log");
    auto agent = std::make_unique<ChildProcess>();
    if (absl::Status s = agent->Start(options); !s.ok()) return s;
    agents_.push_back(std::move(agent));
  }
  return absl::OkStatus();
}

absl::Status LocalCluster::RestartCoordinator() {
  return coordinator_.Start(coordinator_flags_, coordinator_.port());
}

absl::Status LocalCluster::StartTrainers(const std::string& job,
                                         const std::vector<int>& local_sizes,
                                         const std::vector<std::string>& flags,
                                         const std::vector<std::string>& env) {
  for (size_t k = 0; k < local_sizes.size(); ++k) {
    for (int r = 0; r < local_sizes[k]; ++r) {
      ChildProcess::Options options;
      options.argv = {TrainerBinary()};
      options.argv.insert(options.argv.end(), flags.begin(), flags.end());
      options.env = {
          "BATON_AGENT_SOCKET=" + socket(static_cast<int>(k) + 1),
          "BATON_JOB=" + job,
          absl::StrCat("LOCAL_RANK=", r),
          absl::StrCat("LOCAL_WORLD_SIZE=", local_sizes[k]),
          absl::StrCat("BATON_NODES=", local_sizes.size()),
      };
      options.env.insert(options.env.end(), env.begin(), env.end());
      options.stderr_path =
          absl::StrCat(dir_, "/trainer.", job, ".", k + 1, ".", r, ".log");
      auto trainer = std::make_unique<ChildProcess>();
      if (absl::Status s = trainer->Start(options); !s.ok()) return s;
      trainers_.push_back(std::move(trainer));
    }
  }
  return absl::OkStatus();
}

ClientOptions LocalCluster::TrainerOptions(int node, const std::string& job,
                                           int local_rank, int local_size,
                                           int nodes) const {
  ClientOptions options;
  options.socket = socket(node);
  options.job = job;
  options.local_rank = local_rank;
  options.local_size = local_size;
  options.expected_nodes = nodes;
  options.attach_timeout = std::chrono::seconds(20);
  return options;
}

std::vector<ProcessExit> LocalCluster::WaitTrainers(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<ProcessExit> exits;
  for (auto& trainer : trainers_) {
    exits.push_back(
        trainer->Wait(std::max(deadline - absl::Now(), absl::Milliseconds(1))));
  }
  return exits;
}

std::vector<std::string> LocalCluster::Launches(const std::string& job,
                                                int node) const {
  std::ifstream in(
      absl::StrCat(dir_, "/", job, ".", node_name(node), ".launches"));
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) lines.push_back(line);
  return lines;
}

std::string Describe(ChildProcess& trainer, const ProcessExit& exit) {
  return absl::StrCat("trainer ", exit.ToString(), "; stdout:\n",
                      trainer.stdout_text());
}

}  // namespace baton
