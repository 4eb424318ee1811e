#include "common/shm.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

bool Exists(const std::string& name) {
  return access(absl::StrCat("/dev/shm", name).c_str(), F_OK) == 0;
}

// A pid that certainly runs no process any more: a child that has exited
// and been reaped.
int DeadPid() {
  const pid_t child = fork();
  if (child == 0) _exit(0);
  int status = 0;
  waitpid(child, &status, 0);
  return static_cast<int>(child);
}

TEST(SharedMemoryTest, RemoveOrphansTakesDeadAndOwnPidsAndSparesTheLiving) {
  const int own = static_cast<int>(getpid());
  const int dead = DeadPid();
  const int alive = static_cast<int>(getppid());
  const std::string suffix = absl::StrCat(".shm_test.", own);
  const std::string own_name = absl::StrCat("/baton.", own, suffix);
  const std::string dead_name = absl::StrCat("/baton.", dead, suffix);
  const std::string alive_name = absl::StrCat("/baton.", alive, suffix);
  const std::string other_name = absl::StrCat("/notbaton.", dead, suffix);
  {
    auto a = SharedMemory::Create(own_name, 64);
    auto b = SharedMemory::Create(dead_name, 64);
    auto c = SharedMemory::Create(alive_name, 64);
    auto d = SharedMemory::Create(other_name, 64);
    ASSERT_TRUE(a.ok() && b.ok() && c.ok() && d.ok());
  }
  EXPECT_GE(SharedMemory::RemoveOrphans(own), 2);
  EXPECT_FALSE(Exists(own_name)) << "a predecessor with this process's pid";
  EXPECT_FALSE(Exists(dead_name)) << "its process is gone";
  EXPECT_TRUE(Exists(alive_name)) << "its process still runs";
  EXPECT_TRUE(Exists(other_name)) << "not baton's";
  EXPECT_TRUE(SharedMemory::Unlink(alive_name).ok());
  EXPECT_TRUE(SharedMemory::Unlink(other_name).ok());
}

struct stat StatShm(const std::string& name) {
  struct stat st = {};
  EXPECT_EQ(stat(absl::StrCat("/dev/shm", name).c_str(), &st), 0) << name;
  return st;
}

TEST(SharedMemoryTest, CreatedOwnerOnlyWhateverTheUmask) {
  const std::string name = absl::StrCat("/baton.", getpid(), ".shm_test.mode");
  const mode_t old_umask = umask(0);
  auto memory = SharedMemory::Create(name, 64);
  umask(old_umask);
  ASSERT_TRUE(memory.ok()) << memory.status();
  const struct stat st = StatShm(name);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  EXPECT_EQ(st.st_uid, geteuid());
  EXPECT_TRUE(SharedMemory::Unlink(name).ok());
}

TEST(SharedMemoryTest, CreatedForAGroupIs0660AndOwnedByIt) {
  const std::string name = absl::StrCat("/baton.", getpid(), ".shm_test.grp");
  const gid_t group = getegid();
  auto memory = SharedMemory::Create(name, 64, group);
  ASSERT_TRUE(memory.ok()) << memory.status();
  const struct stat st = StatShm(name);
  EXPECT_EQ(st.st_mode & 07777, 0660u);
  EXPECT_EQ(st.st_gid, group);
  EXPECT_TRUE(SharedMemory::Unlink(name).ok());
}

TEST(SharedMemoryTest, AGroupThisUserCannotGiveItToIsRefusedAndNothingLeft) {
  if (geteuid() == 0) GTEST_SKIP() << "root may give a file to any group";
  const std::string name = absl::StrCat("/baton.", getpid(), ".shm_test.bad");
  // Group 0 (root): this non-root user is not in it on a normal system.
  auto memory = SharedMemory::Create(name, 64, 0);
  ASSERT_FALSE(memory.ok());
  EXPECT_EQ(memory.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(memory.status().message().find("--trainer_group"),
            std::string::npos)
      << memory.status();
  EXPECT_FALSE(Exists(name));
}

}  // namespace
}  // namespace baton
