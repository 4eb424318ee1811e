// Who may attach to an agent (issue 19): the socket and the shared memory
// are owner-only (or shared with --trainer_group), and a trainer of another
// uid is refused with a clear error while the agent's own trainers attach
// and train. Real coordinator, agent and trainer processes; the tests that
// need a second uid run as root and start processes as uid 65534 through
// setpriv (skipped otherwise).
#include <dirent.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "baton/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/agent/local_cluster.h"

namespace baton {
namespace {

using ::testing::HasSubstr;

constexpr uid_t kNobody = 65534;
// The trainer group of the --trainer_group test: a number with no entry in
// /etc/group, as a Kubernetes fsGroup usually has none in the image.
constexpr gid_t kTrainerGroup = 4242;

constexpr char kSetpriv[] = "/usr/bin/setpriv";

// Why a test that needs a second uid cannot run here; "" when it can.
std::string CannotSwitchUsers() {
  if (geteuid() != 0) {
    return "needs root: starts processes as uid 65534 through setpriv";
  }
  if (access(kSetpriv, X_OK) != 0) return "needs /usr/bin/setpriv";
  return "";
}

// argv prefix that runs a command as uid/gid 65534 with `groups` as its
// supplementary groups (none when empty).
std::vector<std::string> AsNobody(const std::string& groups = "") {
  return {kSetpriv, absl::StrCat("--reuid=", kNobody),
          absl::StrCat("--regid=", kNobody),
          groups.empty() ? "--clear-groups" : "--groups=" + groups};
}

// A baton-test-trainer (one trainer on one node) of `job` on `socket`,
// run through `prefix` (another user), logging to `log`.
absl::Status StartTrainer(ChildProcess& trainer,
                          const std::vector<std::string>& prefix,
                          const std::string& socket, const std::string& job,
                          const std::string& log) {
  ChildProcess::Options options;
  options.argv = prefix;
  options.argv.push_back(LocalCluster::TrainerBinary());
  options.env = {"BATON_AGENT_SOCKET=" + socket, "BATON_JOB=" + job,
                 "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=1", "BATON_NODES=1"};
  options.stderr_path = log;
  return trainer.Start(options);
}

void ExpectPass(ChildProcess& trainer) {
  const ProcessExit exit = trainer.Wait(absl::Minutes(2));
  EXPECT_TRUE(exit.ok()) << Describe(trainer, exit);
  EXPECT_THAT(trainer.stdout_text(), HasSubstr("PASS"));
}

struct stat Stat(const std::string& path) {
  struct stat st = {};
  EXPECT_EQ(stat(path.c_str(), &st), 0) << path << ": " << std::strerror(errno);
  return st;
}

// The shared-memory objects agent `pid` created ("/dev/shm/baton.<pid>.*").
std::vector<std::string> AgentShm(pid_t pid) {
  std::vector<std::string> paths;
  const std::string prefix = absl::StrCat("baton.", pid, ".");
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return paths;
  while (struct dirent* entry = readdir(dir)) {
    if (absl::StartsWith(entry->d_name, prefix)) {
      paths.push_back(absl::StrCat("/dev/shm/", entry->d_name));
    }
  }
  closedir(dir);
  return paths;
}

v1::TensorSpec FloatSpec(const std::string& name, int64_t count) {
  v1::TensorSpec spec;
  spec.set_name(name);
  spec.set_dtype(v1::DATA_TYPE_FLOAT32);
  spec.add_shape(count);
  spec.set_op(v1::COLLECTIVE_OP_PUSH_PULL);
  return spec;
}

// Attaches an in-process trainer of job `job` to node 1 and declares a
// tensor: the agent then holds the job's doorbell, the trainer's channel
// and the tensor in shared memory. Returns the client (keep it attached).
std::unique_ptr<Client> AttachAndDeclare(LocalCluster& cluster,
                                         const std::string& job) {
  auto client = Client::Connect(cluster.TrainerOptions(1, job));
  EXPECT_TRUE(client.ok()) << client.status();
  if (!client.ok()) return nullptr;
  auto declared = (*client)->Declare({FloatSpec("g", 1024)});
  EXPECT_TRUE(declared.ok()) << declared.status();
  return *std::move(client);
}

// Connects to `socket` without the client library (no check of its own);
// -1 when connect fails.
int RawConnect(const std::string& socket) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un address = {};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, socket.data(), socket.size());
  if (connect(fd, reinterpret_cast<const struct sockaddr*>(&address),
              sizeof(address)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// True when the agent closed `fd` within 10 s without sending anything.
bool ClosedByAgent(int fd) {
  struct pollfd p = {fd, POLLIN, 0};
  if (poll(&p, 1, 10000) != 1) return false;
  char byte;
  return read(fd, &byte, 1) == 0;
}

// How often `text` occurs in `haystack`.
int Count(const std::string& haystack, const std::string& text) {
  int n = 0;
  for (size_t at = haystack.find(text); at != std::string::npos;
       at = haystack.find(text, at + text.size())) {
    ++n;
  }
  return n;
}

TEST(TrainerAccessTest, SocketAndSharedMemoryAreOwnerOnly) {
  LocalCluster cluster;
  ASSERT_TRUE(cluster.Start(1).ok());
  const struct stat socket = Stat(cluster.socket(1));
  EXPECT_TRUE(S_ISSOCK(socket.st_mode));
  EXPECT_EQ(socket.st_mode & 07777, 0600u);
  EXPECT_EQ(socket.st_uid, geteuid());

  std::unique_ptr<Client> client = AttachAndDeclare(cluster, "modes");
  ASSERT_NE(client, nullptr);
  const std::vector<std::string> objects = AgentShm(cluster.agent(1).pid());
  // The job's doorbell, the trainer's channel, the tensor.
  EXPECT_GE(objects.size(), 3u);
  for (const std::string& object : objects) {
    const struct stat st = Stat(object);
    EXPECT_EQ(st.st_mode & 07777, 0600u) << object;
    EXPECT_EQ(st.st_uid, geteuid()) << object;
  }
}

TEST(TrainerAccessTest, ForeignUidIsRefusedWithAClearErrorAndOwnUidTrains) {
  if (const std::string why = CannotSwitchUsers(); !why.empty()) {
    GTEST_SKIP() << why;
  }
  LocalCluster cluster;
  ASSERT_TRUE(cluster.Start(1).ok());
  // Let other users reach the socket's directory: the socket's own mode
  // must keep them out.
  ASSERT_EQ(chmod(cluster.dir().c_str(), 0711), 0);

  ChildProcess foreign;
  ASSERT_TRUE(StartTrainer(foreign, AsNobody(), cluster.socket(1), "shared",
                           cluster.dir() + "/foreign.log")
                  .ok());
  const ProcessExit refused = foreign.Wait(absl::Seconds(30));
  EXPECT_TRUE(refused.exited && refused.exit_code == 2)
      << Describe(foreign, refused);
  const std::string said = foreign.stdout_text();
  EXPECT_THAT(said, HasSubstr(absl::StrCat("ERROR connect: the baton agent's "
                                           "socket ",
                                           cluster.socket(1),
                                           " belongs to uid 0 (mode 0600")));
  EXPECT_THAT(said, HasSubstr("this trainer runs as uid 65534"));
  EXPECT_THAT(said, HasSubstr("Run the trainer as uid 0"));
  EXPECT_THAT(said, HasSubstr("--trainer_group="));

  // The same job's trainer of the agent's own uid attaches and trains.
  ChildProcess own;
  ASSERT_TRUE(StartTrainer(own, {}, cluster.socket(1), "shared",
                           cluster.dir() + "/own.log")
                  .ok());
  ExpectPass(own);
}

TEST(TrainerAccessTest, AgentClosesAndLogsAPeerOfAnotherUidOncePerPid) {
  if (const std::string why = CannotSwitchUsers(); !why.empty()) {
    GTEST_SKIP() << why;
  }
  // A coordinator only; the agent runs as uid 65534, so that this test's
  // process (root: no file permission stops it) connects as another uid.
  LocalCluster cluster;
  ASSERT_TRUE(cluster.Start(0).ok());
  ASSERT_EQ(chmod(cluster.dir().c_str(), 0711), 0);
  const std::string run = cluster.dir() + "/run";
  ASSERT_EQ(mkdir(run.c_str(), 0700), 0);
  ASSERT_EQ(chown(run.c_str(), kNobody, kNobody), 0);
  const std::string socket = run + "/agent.sock";
  const std::string log = cluster.dir() + "/agent.log";
  ChildProcess agent;
  ChildProcess::Options options;
  options.argv = AsNobody();
  options.argv.insert(options.argv.end(),
                      {LocalCluster::AgentBinary(),
                       "--coordinator=" + cluster.coordinator().address(),
                       "--node=n1", "--socket=" + socket});
  options.ready_prefix = "baton-agent ";
  options.stderr_path = log;
  ASSERT_TRUE(agent.Start(options).ok());
  EXPECT_EQ(Stat(socket).st_uid, kNobody);

  for (int attempt = 0; attempt < 2; ++attempt) {
    const int fd = RawConnect(socket);
    ASSERT_GE(fd, 0) << "root connects whatever the mode";
    EXPECT_TRUE(ClosedByAgent(fd)) << "attempt " << attempt;
    close(fd);
  }
  // The client library says why before it connects.
  auto client = Client::Connect([&] {
    ClientOptions o;
    o.socket = socket;
    o.job = "root";
    return o;
  }());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(client.status().message(),
              HasSubstr("belongs to uid 65534 (mode 0600"));

  // The agent's own uid attaches and trains.
  ChildProcess own;
  ASSERT_TRUE(
      StartTrainer(own, AsNobody(), socket, "own", cluster.dir() + "/own.log")
          .ok());
  ExpectPass(own);
  const ProcessExit stopped = agent.Terminate(absl::Seconds(10));
  EXPECT_TRUE(stopped.ok()) << stopped.ToString();
  EXPECT_NE(access(socket.c_str(), F_OK), 0) << "the socket file is left";

  // The agent's stderr reaches the file through a thread of this process;
  // it is complete once the agent was reaped.
  const std::string line =
      absl::StrCat("refused trainer pid ", getpid(), " (uid 0, gid 0) on ",
                   socket, ": this agent admits uid 65534 only");
  const std::string logged = ReadFile(log);
  EXPECT_EQ(Count(logged, line), 1) << "once per pid; log:\n" << logged;
  EXPECT_THAT(logged, HasSubstr("Run the trainer as uid 65534"));
}

TEST(TrainerAccessTest, TrainerGroupSharesSocketAndMemoryWithItsMembers) {
  if (const std::string why = CannotSwitchUsers(); !why.empty()) {
    GTEST_SKIP() << why;
  }
  LocalCluster cluster;
  ASSERT_TRUE(
      cluster.Start(1, {}, {absl::StrCat("--trainer_group=", kTrainerGroup)})
          .ok());
  ASSERT_EQ(chmod(cluster.dir().c_str(), 0711), 0);
  const struct stat socket = Stat(cluster.socket(1));
  EXPECT_EQ(socket.st_mode & 07777, 0660u);
  EXPECT_EQ(socket.st_gid, kTrainerGroup);

  std::unique_ptr<Client> client = AttachAndDeclare(cluster, "modes");
  ASSERT_NE(client, nullptr);
  const std::vector<std::string> objects = AgentShm(cluster.agent(1).pid());
  EXPECT_GE(objects.size(), 3u);
  for (const std::string& object : objects) {
    const struct stat st = Stat(object);
    EXPECT_EQ(st.st_mode & 07777, 0660u) << object;
    EXPECT_EQ(st.st_gid, kTrainerGroup) << object;
  }

  // Another uid with the group as a supplementary group (as a Kubernetes
  // fsGroup gives it) attaches and trains.
  ChildProcess member;
  ASSERT_TRUE(StartTrainer(member, AsNobody(absl::StrCat(kTrainerGroup)),
                           cluster.socket(1), "member",
                           cluster.dir() + "/member.log")
                  .ok());
  ExpectPass(member);

  // Without the group it is refused, by the client's own check.
  ChildProcess outsider;
  ASSERT_TRUE(StartTrainer(outsider, AsNobody(), cluster.socket(1), "outsider",
                           cluster.dir() + "/outsider.log")
                  .ok());
  const ProcessExit refused = outsider.Wait(absl::Seconds(30));
  EXPECT_TRUE(refused.exited && refused.exit_code == 2)
      << Describe(outsider, refused);
  EXPECT_THAT(outsider.stdout_text(),
              HasSubstr(absl::StrCat("members of group ", kTrainerGroup)));
}

}  // namespace
}  // namespace baton
