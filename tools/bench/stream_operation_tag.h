// StreamOperationTag: the completion tag of one kind of operation on an
// async gRPC stream (its reads, its writes, its finish), calling back the
// object that owns the stream.

#pragma once

#include "common/completion_queue_pool.h"

namespace baton::bench {

// Calls `owner->*on_complete(ok)` when the operation it tagged completes.
// A stream keeps one per kind of operation: gRPC allows one of each in
// flight, so a tag is reused once its previous operation completed. Lives
// inside its owner, which must outlive every operation it tagged.
template <typename Owner>
class StreamOperationTag final : public CompletionTag {
 public:
  StreamOperationTag(Owner* owner, void (Owner::*on_complete)(bool))
      : owner_(owner), on_complete_(on_complete) {}

  void Complete(bool ok) override { (owner_->*on_complete_)(ok); }

 private:
  Owner* const owner_;
  void (Owner::*const on_complete_)(bool);
};

}  // namespace baton::bench
