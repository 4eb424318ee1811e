#pragma once

// Agents as the coordinator sees them in tests and fuzzers: a session whose
// channel records every message the coordinator sent it. No gtest here:
// tests/unit/coordinator/coordinator_harness.h (the unit tests' fixture) and
// tests/fuzz/coordinator_fuzz.cc both build on it.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "baton/v1/common.pb.h"
#include "baton/v1/coordinator.pb.h"
#include "common/ids.h"
#include "coordinator/agent_channel.h"

namespace baton::coordinator {

class RecordingChannel : public AgentChannel {
 public:
  void Send(OutboundMessage message) override {
    if (!closed) messages.push_back(message->message());
  }
  void Close(const absl::Status& status) override {
    if (closed) return;
    closed = true;
    close_status = status;
  }

  std::vector<v1::CoordinatorMessage> messages;
  bool closed = false;
  absl::Status close_status;
};

// The membership's node names, in rank order.
inline std::vector<std::string> NodeNames(const v1::Membership& membership) {
  std::vector<std::string> names;
  for (const auto& node : membership.nodes()) names.push_back(node.node_name());
  return names;
}

struct Agent {
  std::string node;
  SessionId id;
  std::shared_ptr<RecordingChannel> channel;
  uint64_t seq = 0;

  // Messages of one kind, in arrival order.
  std::vector<v1::CoordinatorMessage> Received(
      v1::CoordinatorMessage::BodyCase kind) const {
    std::vector<v1::CoordinatorMessage> out;
    for (const auto& m : channel->messages) {
      if (m.body_case() == kind) out.push_back(m);
    }
    return out;
  }
  v1::Error LastError() const {
    auto errors = Received(v1::CoordinatorMessage::kError);
    return errors.empty() ? v1::Error() : errors.back().error();
  }
};

}  // namespace baton::coordinator
