#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace baton::agent {

// Who may attach to the agent's trainer socket: processes running as the
// agent's own effective uid and, with --trainer_group, processes whose
// primary or supplementary groups include that group. Root gets no
// exception: a root trainer is admitted only by an agent running as root
// (or through the group). Constant after construction.
struct TrainerAdmission {
  uid_t uid = 0;
  std::optional<gid_t> group;

  // This process's effective uid, and `group`.
  static TrainerAdmission ForThisProcess(std::optional<gid_t> group);
};

// The process at the other end of a unix socket connection, as the kernel
// recorded it when that process connected.
struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;  // its effective gid
  // Its supplementary groups (SO_PEERGROUPS); empty where the kernel does
  // not tell them (before Linux 4.13).
  std::vector<gid_t> groups;
};

// SO_PEERCRED (and SO_PEERGROUPS) of an accepted unix socket; INTERNAL with
// the errno text when the kernel does not answer.
absl::StatusOr<PeerCredentials> ReadPeerCredentials(int fd);

bool Admits(const TrainerAdmission& admission, const PeerCredentials& peer);

// The agent's log line for a refused connection: who connected, whom the
// agent admits, and how to make them agree.
std::string DescribeRefusal(const TrainerAdmission& admission,
                            const PeerCredentials& peer,
                            const std::string& socket_path);

// --trainer_group's value: a group name, or a numeric gid. INVALID_ARGUMENT
// naming the flag when it is neither a group of this node nor a number.
absl::StatusOr<gid_t> ResolveTrainerGroup(const std::string& value);

// "100 (users)", or "100" when the node has no name for it.
std::string GroupText(gid_t gid);

}  // namespace baton::agent
