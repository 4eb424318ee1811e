#include "client/socket_access.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace baton::client {
namespace {

constexpr char kFix[] =
    "on Kubernetes give the agent's and the trainer's pods the same "
    "runAsUser, or the same fsGroup with the agent's "
    "--trainer_group=<that fsGroup>";

// Whether this process runs with `gid` as its effective or a supplementary
// group, as the agent sees it (SO_PEERCRED, SO_PEERGROUPS).
bool InGroup(gid_t gid) {
  if (getegid() == gid) return true;
  const int count = getgroups(0, nullptr);
  if (count <= 0) return false;
  std::vector<gid_t> groups(static_cast<size_t>(count));
  const int got = getgroups(count, groups.data());
  if (got < 0) return false;
  groups.resize(static_cast<size_t>(got));
  return std::find(groups.begin(), groups.end(), gid) != groups.end();
}

}  // namespace

absl::Status CheckSocketAccess(const std::string& socket) {
  const uid_t uid = geteuid();
  struct stat st;
  if (stat(socket.c_str(), &st) != 0) {
    if (errno != EACCES) return absl::OkStatus();
    return absl::PermissionDeniedError(absl::StrCat(
        "cannot reach the baton agent's socket ", socket, " as uid ", uid,
        ": a directory on its path is not searchable by this user (",
        std::strerror(EACCES),
        "); let the trainer's user through that directory (it needs x "
        "permission), or run the trainer as the agent's user; ",
        kFix));
  }
  if (st.st_uid == uid) return absl::OkStatus();
  if ((st.st_mode & S_IWGRP) != 0 && InGroup(st.st_gid)) {
    return absl::OkStatus();
  }
  const bool group_socket = (st.st_mode & S_IWGRP) != 0;
  return absl::PermissionDeniedError(absl::StrCat(
      "the baton agent's socket ", socket, " belongs to uid ", st.st_uid,
      absl::StrFormat(" (mode %04o, group %d)", st.st_mode & 07777, st.st_gid),
      " and this trainer runs as uid ", uid, " (gid ", getegid(),
      "): the agent admits only its own uid",
      group_socket ? absl::StrCat(" and members of group ", st.st_gid)
                   : std::string(" (no --trainer_group)"),
      ", so it would close this trainer's connection. Run the trainer as uid ",
      st.st_uid,
      group_socket
          ? absl::StrCat(" or in group ", st.st_gid)
          : std::string(", or start the agent with --trainer_group=<a group "
                        "of this trainer>"),
      "; ", kFix));
}

}  // namespace baton::client
