#pragma once

#include <grpcpp/grpcpp.h>

#include <cstddef>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace baton {

// What a completion queue hands back: every tag given to a gRPC async
// operation served by a CompletionQueuePool is one of these, and the pool's
// thread calls Complete with the operation's outcome.
class CompletionTag {
 public:
  virtual void Complete(bool ok) = 0;

 protected:
  ~CompletionTag() = default;
};

// The tag of one kind of operation on a stream (its reads, its writes, its
// Finish): calls `owner->*on_complete(ok)`. gRPC allows one operation of
// each kind in flight, so a stream keeps one such tag per kind inside
// itself and reuses it; the owner outlives every operation it tagged.
template <typename Owner>
class MethodTag final : public CompletionTag {
 public:
  MethodTag(Owner* owner, void (Owner::*on_complete)(bool))
      : owner_(owner), on_complete_(on_complete) {}

  void Complete(bool ok) override { (owner_->*on_complete_)(ok); }

 private:
  Owner* const owner_;
  void (Owner::*const on_complete_)(bool);
};

// Several gRPC completion queues, each drained by a thread of its own.
//
// Why not the callback API: it puts every operation of the process on one
// completion queue, and the libgrpc Debian ships is built without NDEBUG,
// so each completed operation searches that queue's list of outstanding
// tags linearly. With one stream per agent the list is as long as the node
// count: at 10,000 streams a third of a process's CPU went there
// (docs/benchmarks.md, "Coordinator at scale"). Spreading the streams over
// several queues divides the search by their number; with a release libgrpc
// it costs nothing either way.
//
// Tags must outlive their operation's completion. Thread-safe.
class CompletionQueuePool {
 public:
  // Server queues, added to `builder` before BuildAndStart (gRPC requires
  // it). Start() them after the server started.
  static std::unique_ptr<CompletionQueuePool> ForServer(
      grpc::ServerBuilder& builder, size_t queues);
  // Client queues.
  explicit CompletionQueuePool(size_t queues);

  CompletionQueuePool(const CompletionQueuePool&) = delete;
  CompletionQueuePool& operator=(const CompletionQueuePool&) = delete;
  // Shuts down and drains the queues if Shutdown was not called.
  ~CompletionQueuePool();

  // Starts one thread per queue, named `thread_name` (at most 15 bytes
  // show). Call once.
  void Start(const std::string& thread_name);

  size_t size() const { return queues_.size(); }
  grpc::CompletionQueue* queue(size_t i) const { return queues_[i].get(); }
  // For a pool made by ForServer only.
  grpc::ServerCompletionQueue* server_queue(size_t i) const;

  // Shuts every queue down and waits until each thread has delivered its
  // queue's last completion. For a server's queues, call it after the
  // server's Shutdown returned: gRPC fails the operations still pending
  // then, so every tag completes. Idempotent.
  void Shutdown();

 private:
  CompletionQueuePool() = default;

  bool server_ = false;
  std::vector<std::unique_ptr<grpc::CompletionQueue>> queues_;
  std::vector<std::thread> threads_;
  bool shut_down_ = false;
};

}  // namespace baton
