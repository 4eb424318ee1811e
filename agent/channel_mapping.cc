#include "agent/channel_mapping.h"

namespace baton::agent {

bool ChannelMapping::Complete(const ChannelEntry& entry) {
  absl::MutexLock lock(&completions_mu);
  if (!channel->completions.Push(entry)) return false;
  channel->completion_bell.Ring();
  return true;
}

}  // namespace baton::agent
