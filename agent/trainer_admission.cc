#include "agent/trainer_admission.h"

#include <grp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace baton::agent {
namespace {

// The group entry of `name` (or of `gid` when `name` is null); false when
// there is none.
bool LookUpGroup(const char* name, gid_t gid, struct group* entry,
                 std::vector<char>* buffer) {
  buffer->resize(16384);
  while (true) {
    struct group* found = nullptr;
    const int err =
        name != nullptr
            ? getgrnam_r(name, entry, buffer->data(), buffer->size(), &found)
            : getgrgid_r(gid, entry, buffer->data(), buffer->size(), &found);
    if (err == ERANGE && buffer->size() < (1u << 22)) {
      buffer->resize(buffer->size() * 2);
      continue;
    }
    return err == 0 && found != nullptr;
  }
}

}  // namespace

TrainerAdmission TrainerAdmission::ForThisProcess(std::optional<gid_t> group) {
  TrainerAdmission admission;
  admission.uid = geteuid();
  admission.group = group;
  return admission;
}

absl::StatusOr<PeerCredentials> ReadPeerCredentials(int fd) {
  struct ucred cred = {};
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return absl::InternalError(
        absl::StrCat("reading the peer's credentials (SO_PEERCRED) failed: ",
                     std::strerror(errno)));
  }
  PeerCredentials peer;
  peer.pid = cred.pid;
  peer.uid = cred.uid;
  peer.gid = cred.gid;
  std::vector<gid_t> groups(64);
  while (true) {
    socklen_t bytes = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &bytes) == 0) {
      groups.resize(bytes / sizeof(gid_t));
      peer.groups = std::move(groups);
      break;
    }
    // ERANGE: `bytes` is what the list needs. Anything else (an old kernel):
    // only the primary group counts.
    if (errno != ERANGE || bytes <= groups.size() * sizeof(gid_t)) break;
    groups.resize(bytes / sizeof(gid_t));
  }
  return peer;
}

bool Admits(const TrainerAdmission& admission, const PeerCredentials& peer) {
  if (peer.uid == admission.uid) return true;
  if (!admission.group.has_value()) return false;
  const gid_t group = *admission.group;
  return peer.gid == group || std::find(peer.groups.begin(), peer.groups.end(),
                                        group) != peer.groups.end();
}

std::string DescribeRefusal(const TrainerAdmission& admission,
                            const PeerCredentials& peer,
                            const std::string& socket_path) {
  const std::string admits =
      admission.group.has_value()
          ? absl::StrCat("uid ", admission.uid, " and group ",
                         GroupText(*admission.group))
          : absl::StrCat("uid ", admission.uid, " only");
  return absl::StrCat(
      "refused trainer pid ", peer.pid, " (uid ", peer.uid, ", gid ", peer.gid,
      ") on ", socket_path, ": this agent admits ", admits,
      ". Run the trainer ", "as uid ", admission.uid,
      ", or start the agent with --trainer_group=",
      "<a group of the trainer>; on Kubernetes give the agent's and the ",
      "trainer's pods the same runAsUser, or the same fsGroup with ",
      "--trainer_group=<that fsGroup>");
}

absl::StatusOr<gid_t> ResolveTrainerGroup(const std::string& value) {
  struct group entry;
  std::vector<char> buffer;
  if (LookUpGroup(value.c_str(), 0, &entry, &buffer)) return entry.gr_gid;
  uint32_t gid = 0;
  // A number needs no entry in this node's group database: a Kubernetes
  // fsGroup usually has none in the agent's image.
  if (absl::SimpleAtoi(value, &gid) && gid != static_cast<uint32_t>(-1)) {
    return static_cast<gid_t>(gid);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--trainer_group=\"", value,
                   "\" is neither a group of this node nor a numeric gid: give "
                   "the trainers' group name or gid"));
}

std::string GroupText(gid_t gid) {
  struct group entry;
  std::vector<char> buffer;
  if (LookUpGroup(nullptr, gid, &entry, &buffer)) {
    return absl::StrCat(gid, " (", entry.gr_name, ")");
  }
  return absl::StrCat(gid);
}

}  // namespace baton::agent
