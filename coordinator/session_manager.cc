#include "coordinator/session_manager.h"

#include <utility>

#include "glog/logging.h"

namespace baton::coordinator {

Session& SessionManager::Open(SessionId id,
                              std::shared_ptr<AgentChannel> channel,
                              absl::Time now) {
  auto [it, inserted] = sessions_.try_emplace(id);
  DCHECK(inserted) << "session " << id << " opened twice";
  Session& session = it->second;
  session.id = id;
  session.channel = std::move(channel);
  session.opened = now;
  session.last_seen = now;
  return session;
}

Session* SessionManager::Find(SessionId id) {
  auto it = sessions_.find(id);
  return it == sessions_.end() ? nullptr : &it->second;
}

const Session* SessionManager::Find(SessionId id) const {
  auto it = sessions_.find(id);
  return it == sessions_.end() ? nullptr : &it->second;
}

std::string SessionManager::AgentKey(const std::string& node_name,
                                     const std::string& agent_instance) {
  return node_name + '\0' + agent_instance;
}

Session* SessionManager::SetIdentity(Session& session, const v1::Hello& hello) {
  session.node_name = hello.node_name();
  session.agent_instance = hello.agent_instance();
  session.agent_version = hello.agent_version();
  SessionId& indexed =
      by_agent_[AgentKey(session.node_name, session.agent_instance)];
  Session* previous = indexed != session.id ? Find(indexed) : nullptr;
  indexed = session.id;
  return previous;
}

void SessionManager::Remove(SessionId id) {
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return;
  if (it->second.said_hello()) {
    auto agent = by_agent_.find(
        AgentKey(it->second.node_name, it->second.agent_instance));
    if (agent != by_agent_.end() && agent->second == id) by_agent_.erase(agent);
  }
  sessions_.erase(it);
}

void SessionManager::Send(SessionId id, OutboundMessage message) {
  if (Session* session = Find(id)) session->channel->Send(std::move(message));
}

std::vector<SessionId> SessionManager::Silent(absl::Time now,
                                              absl::Duration timeout) const {
  std::vector<SessionId> silent;
  for (const auto& [id, session] : sessions_) {
    if (now - session.last_seen > timeout) silent.push_back(id);
  }
  return silent;
}

std::vector<SessionId> SessionManager::All() const {
  std::vector<SessionId> all;
  all.reserve(sessions_.size());
  for (const auto& [id, session] : sessions_) all.push_back(id);
  return all;
}

}  // namespace baton::coordinator
