#include "coordinator/grpc/agent_session_service.h"

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/grpc_util.h"
#include "common/ids.h"
#include "common/tls.h"
#include "coordinator/agent_channel.h"
#include "coordinator/grpc/peer_identity.h"

namespace baton::coordinator {
namespace {

using SessionStream =
    grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>;

// A byte buffer over the message's shared wire bytes: no copy; the slice keeps
// the message alive until gRPC is done with it.
grpc::ByteBuffer WireBytes(const OutboundMessage& message) {
  const std::string& bytes = message->Serialized();
  auto* keep_alive = new OutboundMessage(message);
  grpc::Slice slice(
      const_cast<char*>(bytes.data()), bytes.size(),
      [](void* owner) { delete static_cast<OutboundMessage*>(owner); },
      keep_alive);
  return grpc::ByteBuffer(&slice, 1);
}

// The outbound half of one stream: a queue with exactly one write in flight,
// and the one place that decides when the stream is finished, so that Finish
// is called exactly once and never while a write is outstanding.
//
// gRPC calls (StartWrite, Finish) are made outside mu_: a reaction may run on
// another thread at any time after them, and must be free to take mu_.
// Calling them through the raw reactor pointer outside the lock is safe
// because the reactor cannot reach OnDone before Finish, and only the thread
// that claimed the Finish (under mu_) calls it, after the last write's
// OnWriteDone.
class StreamChannel final : public AgentChannel {
 public:
  explicit StreamChannel(SessionStream* stream) : stream_(stream) {}

  void Send(OutboundMessage message) override ABSL_LOCKS_EXCLUDED(mu_) {
    mu_.Lock();
    if (stream_ == nullptr || finish_requested_) {
      mu_.Unlock();
      return;
    }
    outbound_.push_back(std::move(message));
    Advance();
  }

  void Close(const absl::Status& status) override {
    RequestFinish(ToGrpcStatus(status), /*drop_queued=*/false);
  }

  // Finishes with `status` once the queued messages are written, or at once
  // with `drop_queued` (the stream is broken: they could not be delivered).
  // Only the first request counts.
  void RequestFinish(grpc::Status status, bool drop_queued)
      ABSL_LOCKS_EXCLUDED(mu_) {
    mu_.Lock();
    if (stream_ != nullptr && drop_queued) outbound_.clear();
    if (stream_ == nullptr || finish_requested_) {
      mu_.Unlock();
      return;
    }
    finish_requested_ = true;
    finish_status_ = std::move(status);
    Advance();
  }

  void OnWriteDone(bool ok) ABSL_LOCKS_EXCLUDED(mu_) {
    mu_.Lock();
    write_in_flight_ = false;
    in_flight_.Clear();
    if (!ok) {
      // No later write can succeed; the stream still has to be finished.
      outbound_.clear();
      if (!finish_requested_) {
        finish_requested_ = true;
        finish_status_ =
            grpc::Status(grpc::StatusCode::CANCELLED,
                         "writing to the agent failed: the stream is broken");
      }
    }
    Advance();
  }

  // True once the stream is being finished: no more reads are needed.
  bool finishing() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return finish_requested_;
  }

  // Called from the reactor's OnDone: everything later is dropped.
  void Detach() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    stream_ = nullptr;
    outbound_.clear();
  }

 private:
  // Starts the next write, or the Finish once the queue is empty, unless a
  // write is in flight. Called with mu_ held; releases it before calling
  // into the stream.
  void Advance() ABSL_UNLOCK_FUNCTION(mu_) {
    SessionStream* const stream = stream_;
    if (stream == nullptr || write_in_flight_ || finish_called_) {
      mu_.Unlock();
      return;
    }
    if (!outbound_.empty()) {
      write_in_flight_ = true;
      in_flight_ = WireBytes(outbound_.front());
      outbound_.pop_front();
      const grpc::ByteBuffer* bytes = &in_flight_;
      mu_.Unlock();
      stream->StartWrite(bytes);
      return;
    }
    if (finish_requested_) {
      finish_called_ = true;
      grpc::Status status = finish_status_;
      mu_.Unlock();
      stream->Finish(std::move(status));
      return;
    }
    mu_.Unlock();
  }

  mutable absl::Mutex mu_;
  // Null once the reactor is done.
  SessionStream* stream_ ABSL_GUARDED_BY(mu_);
  std::deque<OutboundMessage> outbound_ ABSL_GUARDED_BY(mu_);
  // The message being written; untouched until its OnWriteDone.
  grpc::ByteBuffer in_flight_ ABSL_GUARDED_BY(mu_);
  bool write_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_requested_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status finish_status_ ABSL_GUARDED_BY(mu_);
  bool finish_called_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

// One AgentSession stream. Reactions only translate and Post to the loop;
// they never block. Deletes itself in OnDone.
class AgentSessionService::Reactor final : public SessionStream {
 public:
  Reactor(AgentSessionService* service, SessionId id, PeerIdentity identity)
      : service_(service),
        id_(id),
        channel_(std::make_shared<StreamChannel>(this)) {
    std::shared_ptr<AgentChannel> channel = channel_;
    service_->loop_->Post([coordinator = service_->coordinator_, id = id_,
                           channel, identity = std::move(identity)]() mutable {
      coordinator->OnSessionOpened(id, channel, std::move(identity));
    });
    StartRead(&inbound_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      PostClosed("the agent closed its stream");
      channel_->RequestFinish(grpc::Status::OK, /*drop_queued=*/false);
      return;
    }
    v1::AgentMessage message;
    const grpc::Status parsed =
        grpc::SerializationTraits<v1::AgentMessage>::Deserialize(&inbound_,
                                                                 &message);
    inbound_.Clear();
    if (!parsed.ok()) {
      PostClosed("it sent a message that is not an AgentMessage");
      channel_->RequestFinish(
          grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                       "could not parse an AgentMessage from the stream (" +
                           parsed.error_message() +
                           "): the agent and coordinator speak different "
                           "protocols; check their versions"),
          /*drop_queued=*/false);
      return;
    }
    service_->loop_->Post([coordinator = service_->coordinator_, id = id_,
                           message = std::move(message)]() {
      coordinator->OnAgentMessage(id, message);
    });
    if (!channel_->finishing()) StartRead(&inbound_);
  }

  void OnWriteDone(bool ok) override { channel_->OnWriteDone(ok); }

  void OnCancel() override {
    PostClosed(
        "the stream was cancelled (the agent went away, or the coordinator "
        "is shutting down)");
    channel_->RequestFinish(
        grpc::Status(grpc::StatusCode::CANCELLED, "the stream was cancelled"),
        /*drop_queued=*/true);
  }

  void OnDone() override {
    channel_->Detach();
    PostClosed("the stream ended");
    delete this;
  }

 private:
  void PostClosed(std::string why) {
    service_->loop_->Post(
        [coordinator = service_->coordinator_, id = id_,
         why = std::move(why)]() { coordinator->OnSessionClosed(id, why); });
  }

  // Constant after construction.
  AgentSessionService* const service_;
  const SessionId id_;
  const std::shared_ptr<StreamChannel> channel_;

  // Only touched by StartRead and OnReadDone, which never overlap.
  grpc::ByteBuffer inbound_;
};

AgentSessionService::AgentSessionService(ControlLoop* loop,
                                         Coordinator* coordinator)
    : loop_(loop), coordinator_(coordinator) {}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
AgentSessionService::AgentSession(grpc::CallbackServerContext* context) {
  const SessionId id(next_session_id_.fetch_add(1, std::memory_order_relaxed));
  return new Reactor(this, id, PeerIdentityOf(*context));
}

}  // namespace baton::coordinator
