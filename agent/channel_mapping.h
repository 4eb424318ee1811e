#pragma once

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/shm.h"
#include "common/shm_channel.h"

namespace baton::agent {

// A trainer's shared-memory channel (common/shm_channel.h), mapped by the
// agent. Its request ring is drained by the job thread alone; its
// completion ring is shared with the data plane's threads, which push
// successful completions into it themselves (JobOperations::OpDone), one
// producer at a time.
struct ChannelMapping {
  SharedMemory memory;
  TrainerChannel* channel = nullptr;
  // One producer of completions at a time.
  absl::Mutex completions_mu;

  // Pushes `entry` and rings the trainer's bell; false when the ring is
  // full (then the completion goes over the stream). Thread-safe.
  bool Complete(const ChannelEntry& entry) ABSL_LOCKS_EXCLUDED(completions_mu);
};

}  // namespace baton::agent
