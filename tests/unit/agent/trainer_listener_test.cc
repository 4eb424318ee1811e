// The trainer socket's listener and its admission rule, on real unix
// sockets in this process: the socket's mode, who is handed to the server,
// who is closed, and Stop.
#include "agent/trainer_listener.h"

#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton::agent {
namespace {

using ::testing::HasSubstr;

// A uid that is not this process's.
uid_t OtherUid() { return geteuid() == 65534 ? 65533 : 65534; }

class TempDir {
 public:
  TempDir() {
    std::string pattern = "/tmp/baton-listener.XXXXXX";
    path_ = mkdtemp(pattern.data());
  }
  ~TempDir() { std::system(absl::StrCat("rm -rf ", path_).c_str()); }
  std::string File(const std::string& name) const {
    return absl::StrCat(path_, "/", name);
  }

 private:
  std::string path_;
};

// Connects to `path`; -1 (errno set) when it cannot.
int Connect(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un address = {};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.data(), path.size());
  if (connect(fd, reinterpret_cast<const struct sockaddr*>(&address),
              sizeof(address)) != 0) {
    const int err = errno;
    close(fd);
    errno = err;
    return -1;
  }
  return fd;
}

// True when the peer closed `fd` within 10 s (a read returns 0).
bool ClosedByPeer(int fd) {
  struct pollfd p = {fd, POLLIN, 0};
  if (poll(&p, 1, 10000) != 1) return false;
  char byte;
  return read(fd, &byte, 1) == 0;
}

// Collects the fds the listener admits.
class Admitted {
 public:
  TrainerListener::AdmitFn Fn() {
    return [this](int fd) {
      absl::MutexLock lock(&mu_);
      fds_.push_back(fd);
    };
  }
  // Waits up to 10 s for the n-th admitted fd; -1 when it does not come.
  int Await(size_t n) {
    absl::MutexLock lock(&mu_);
    const auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return fds_.size() >= n;
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10))) {
      return -1;
    }
    return fds_[n - 1];
  }
  size_t count() {
    absl::MutexLock lock(&mu_);
    return fds_.size();
  }
  ~Admitted() {
    for (int fd : fds_) close(fd);
  }

 private:
  absl::Mutex mu_;
  std::vector<int> fds_ ABSL_GUARDED_BY(mu_);
};

TEST(TrainerListenerTest, SocketIsOwnerOnlyWhateverTheUmask) {
  TempDir dir;
  Admitted admitted;
  const mode_t old_umask = umask(0);
  auto listener = TrainerListener::Start(
      dir.File("a.sock"), TrainerAdmission::ForThisProcess(std::nullopt),
      admitted.Fn());
  umask(old_umask);
  ASSERT_TRUE(listener.ok()) << listener.status();
  struct stat st;
  ASSERT_EQ(lstat(dir.File("a.sock").c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(st.st_uid, geteuid());
}

TEST(TrainerListenerTest, TrainerGroupMakesTheSocket0660AndItsGroups) {
  TempDir dir;
  Admitted admitted;
  const gid_t group = getegid();
  auto listener = TrainerListener::Start(
      dir.File("g.sock"), TrainerAdmission::ForThisProcess(group),
      admitted.Fn());
  ASSERT_TRUE(listener.ok()) << listener.status();
  struct stat st;
  ASSERT_EQ(lstat(dir.File("g.sock").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0660u);
  EXPECT_EQ(st.st_gid, group);
}

TEST(TrainerListenerTest, SameUidIsHandedOverWithTheConnection) {
  TempDir dir;
  Admitted admitted;
  auto listener = TrainerListener::Start(
      dir.File("s.sock"), TrainerAdmission::ForThisProcess(std::nullopt),
      admitted.Fn());
  ASSERT_TRUE(listener.ok()) << listener.status();
  const int client = Connect(dir.File("s.sock"));
  ASSERT_GE(client, 0) << std::strerror(errno);
  const int served = admitted.Await(1);
  ASSERT_GE(served, 0) << "the connection was not handed over";
  // It is this very connection: bytes written here arrive there.
  ASSERT_EQ(write(client, "x", 1), 1);
  struct pollfd p = {served, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 10000), 1);
  char byte = 0;
  EXPECT_EQ(read(served, &byte, 1), 1);
  EXPECT_EQ(byte, 'x');
  EXPECT_EQ((*listener)->refused(), 0);
  close(client);
}

TEST(TrainerListenerTest, OtherUidIsClosedAndCountedAndOthersGoOn) {
  TempDir dir;
  Admitted admitted;
  TrainerAdmission someone_else;
  someone_else.uid = OtherUid();
  auto listener =
      TrainerListener::Start(dir.File("o.sock"), someone_else, admitted.Fn());
  ASSERT_TRUE(listener.ok()) << listener.status();
  for (int i = 1; i <= 2; ++i) {
    const int client = Connect(dir.File("o.sock"));
    ASSERT_GE(client, 0) << std::strerror(errno);
    EXPECT_TRUE(ClosedByPeer(client)) << "connection " << i;
    EXPECT_EQ((*listener)->refused(), i);
    close(client);
  }
  EXPECT_EQ(admitted.count(), 0u);
}

TEST(TrainerListenerTest, GroupMemberOfAnotherUidIsHandedOver) {
  TempDir dir;
  Admitted admitted;
  TrainerAdmission group_only;
  group_only.uid = OtherUid();
  group_only.group = getegid();
  auto listener =
      TrainerListener::Start(dir.File("m.sock"), group_only, admitted.Fn());
  ASSERT_TRUE(listener.ok()) << listener.status();
  const int client = Connect(dir.File("m.sock"));
  ASSERT_GE(client, 0) << std::strerror(errno);
  EXPECT_GE(admitted.Await(1), 0);
  EXPECT_EQ((*listener)->refused(), 0);
  close(client);
}

TEST(TrainerListenerTest, StopRemovesTheSocketAndReplacesAStaleOne) {
  TempDir dir;
  Admitted admitted;
  const std::string path = dir.File("r.sock");
  {
    // A stale file where the socket goes (a killed agent's).
    FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fclose(f);
  }
  auto listener = TrainerListener::Start(
      path, TrainerAdmission::ForThisProcess(std::nullopt), admitted.Fn());
  ASSERT_TRUE(listener.ok()) << listener.status();
  (*listener)->Stop();
  EXPECT_NE(access(path.c_str(), F_OK), 0) << "the socket file is left";
  EXPECT_LT(Connect(path), 0);
  (*listener)->Stop();  // idempotent
}

TEST(TrainerListenerTest, MissingDirectoryNamesThePathAndTheFlag) {
  Admitted admitted;
  auto listener = TrainerListener::Start(
      "/nonexistent-baton-dir/agent.sock",
      TrainerAdmission::ForThisProcess(std::nullopt), admitted.Fn());
  ASSERT_FALSE(listener.ok());
  EXPECT_EQ(listener.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(listener.status().message(),
              HasSubstr("cannot serve trainers on unix socket "
                        "/nonexistent-baton-dir/agent.sock"));
  EXPECT_THAT(listener.status().message(), HasSubstr("(--socket)"));
}

TEST(TrainerAdmissionTest, OwnUidOrTheGroupAndNoExceptionForRoot) {
  TrainerAdmission admission;
  admission.uid = 10001;
  PeerCredentials peer;
  peer.uid = 10001;
  peer.gid = 5;
  EXPECT_TRUE(Admits(admission, peer));
  peer.uid = 0;
  peer.gid = 0;
  EXPECT_FALSE(Admits(admission, peer)) << "root is not the agent's uid";
  peer.uid = 1000;
  peer.gid = 2000;
  peer.groups = {3000, 4000};
  EXPECT_FALSE(Admits(admission, peer));
  admission.group = 2000;
  EXPECT_TRUE(Admits(admission, peer)) << "primary group";
  admission.group = 4000;
  EXPECT_TRUE(Admits(admission, peer)) << "supplementary group (fsGroup)";
  admission.group = 5000;
  EXPECT_FALSE(Admits(admission, peer));
}

TEST(TrainerAdmissionTest, RefusalNamesPidUidsAndWhatToDo) {
  TrainerAdmission admission;
  admission.uid = 10001;
  PeerCredentials peer;
  peer.pid = 1234;
  peer.uid = 1000;
  peer.gid = 1000;
  const std::string line = DescribeRefusal(admission, peer, "/run/a.sock");
  EXPECT_THAT(line, HasSubstr("refused trainer pid 1234 (uid 1000, gid 1000) "
                              "on /run/a.sock: this agent admits uid 10001 "
                              "only"));
  EXPECT_THAT(line, HasSubstr("Run the trainer as uid 10001"));
  EXPECT_THAT(line, HasSubstr("--trainer_group="));
  EXPECT_THAT(line, HasSubstr("runAsUser"));
  EXPECT_THAT(line, HasSubstr("fsGroup"));
  admission.group = 0;
  EXPECT_THAT(DescribeRefusal(admission, peer, "/run/a.sock"),
              HasSubstr("admits uid 10001 and group 0 (root)"));
}

TEST(TrainerAdmissionTest, GroupIsANameOrANumber) {
  auto root = ResolveTrainerGroup("root");
  ASSERT_TRUE(root.ok()) << root.status();
  EXPECT_EQ(*root, 0u);
  auto number = ResolveTrainerGroup("54321");
  ASSERT_TRUE(number.ok()) << number.status();
  EXPECT_EQ(*number, 54321u) << "a gid needs no entry on this node";
  auto unknown = ResolveTrainerGroup("no-such-baton-group");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.status().message(),
              HasSubstr("--trainer_group=\"no-such-baton-group\" is neither a "
                        "group of this node nor a numeric gid"));
}

}  // namespace
}  // namespace baton::agent
