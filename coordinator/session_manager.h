#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "baton/v1/coordinator.pb.h"
#include "common/ids.h"
#include "coordinator/agent_channel.h"

namespace baton::coordinator {

// One agent's stream to the coordinator.
// Who a session's transport says the agent is. With mutual TLS: the DNS
// names of the client certificate it verified, one of which must be the
// node name the agent says hello with. Plain data, so that the managers
// never see gRPC types.
struct PeerIdentity {
  // A verified client certificate came with the session (TLS is on).
  bool verified = false;
  std::vector<std::string> dns_names;
};

struct Session {
  SessionId id;
  std::shared_ptr<AgentChannel> channel;
  PeerIdentity identity;
  // Empty until the agent's Hello.
  std::string node_name;
  std::string agent_instance;
  std::string agent_version;
  absl::Time opened;
  // Any message from the agent moves this.
  absl::Time last_seen;
  // Jobs this session is a member of.
  absl::btree_set<std::string> jobs;

  bool said_hello() const { return !node_name.empty(); }
};

// Owns the agent sessions: their channels, identities and liveness.
//
// Not thread-safe: owned by the coordinator's control loop.
class SessionManager {
 public:
  SessionManager() = default;

  // Registers a new stream. `id` must be new.
  Session& Open(SessionId id, std::shared_ptr<AgentChannel> channel,
                absl::Time now);
  // nullptr when unknown (closed).
  Session* Find(SessionId id);
  const Session* Find(SessionId id) const;
  // Records the identity from the agent's Hello. Returns the session that
  // had the same (node, instance) before, if any: the agent reconnected and
  // that older session is now superseded (it is no longer indexed).
  Session* SetIdentity(Session& session, const v1::Hello& hello);
  // Forgets the session; does not close its channel.
  void Remove(SessionId id);

  // Queues `message` on the session's channel; no-op for unknown sessions.
  void Send(SessionId id, OutboundMessage message);

  // Sessions silent for longer than `timeout` at `now`.
  std::vector<SessionId> Silent(absl::Time now, absl::Duration timeout) const;

  std::vector<SessionId> All() const;
  size_t size() const { return sessions_.size(); }

 private:
  static std::string AgentKey(const std::string& node_name,
                              const std::string& agent_instance);

  absl::flat_hash_map<SessionId, Session> sessions_;
  // (node, instance) -> the newest session of that agent.
  absl::flat_hash_map<std::string, SessionId> by_agent_;
};

}  // namespace baton::coordinator
