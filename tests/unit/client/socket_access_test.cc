// The trainer's check of the agent's socket before it connects: what a
// trainer of another user is told instead of "Socket closed".
#include "client/socket_access.h"

#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton::client {
namespace {

using ::testing::HasSubstr;

class SocketAccessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = "/tmp/baton-access.XXXXXX";
    dir_ = mkdtemp(pattern.data());
    path_ = dir_ + "/agent.sock";
    fd_ = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un address = {};
    address.sun_family = AF_UNIX;
    std::memcpy(address.sun_path, path_.data(), path_.size());
    ASSERT_EQ(bind(fd_, reinterpret_cast<const struct sockaddr*>(&address),
                   sizeof(address)),
              0)
        << std::strerror(errno);
    ASSERT_EQ(chmod(path_.c_str(), 0600), 0);
  }
  void TearDown() override {
    close(fd_);
    std::system(absl::StrCat("rm -rf ", dir_).c_str());
  }

  std::string dir_;
  std::string path_;
  int fd_ = -1;
};

TEST_F(SocketAccessTest, OwnSocketAndNoSocketPass) {
  EXPECT_TRUE(CheckSocketAccess(path_).ok());
  // No agent there: connecting says so, not this check.
  EXPECT_TRUE(CheckSocketAccess(dir_ + "/none.sock").ok());
}

TEST_F(SocketAccessTest, AnotherUsersSocketNamesBothUidsAndTheFix) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to give the socket away";
  ASSERT_EQ(chown(path_.c_str(), 65534, 65534), 0);
  const absl::Status status = CheckSocketAccess(path_);
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(status.message(),
              HasSubstr(absl::StrCat("the baton agent's socket ", path_,
                                     " belongs to uid 65534 (mode 0600")));
  EXPECT_THAT(status.message(), HasSubstr("this trainer runs as uid 0"));
  EXPECT_THAT(status.message(), HasSubstr("Run the trainer as uid 65534"));
  EXPECT_THAT(status.message(), HasSubstr("--trainer_group="));
  EXPECT_THAT(status.message(), HasSubstr("runAsUser"));
}

TEST_F(SocketAccessTest, GroupSocketAdmitsItsMembersOnly) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to give the socket away";
  ASSERT_EQ(chown(path_.c_str(), 65534, getegid()), 0);
  ASSERT_EQ(chmod(path_.c_str(), 0660), 0);
  EXPECT_TRUE(CheckSocketAccess(path_).ok()) << "this process is in the group";
  ASSERT_EQ(chown(path_.c_str(), 65534, 65534), 0);
  ASSERT_EQ(chmod(path_.c_str(), 0660), 0);
  const absl::Status status = CheckSocketAccess(path_);
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(status.message(), HasSubstr("members of group 65534"));
  EXPECT_THAT(status.message(), HasSubstr("or in group 65534"));
}

}  // namespace
}  // namespace baton::client
