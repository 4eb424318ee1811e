#include "coordinator/grpc/agent_session_service.h"

#include <glog/logging.h>

#include <deque>
#include <memory>
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
    grpc::ServerAsyncReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>;

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
// The async API never calls back into the caller of an operation (results
// come through the completion queue), so operations are started with mu_
// held. The coordinator may keep the channel after its stream ended: Detach
// cuts it off, after which nothing is started and everything is dropped.
class StreamChannel final : public AgentChannel {
 public:
  // `written` and `finished` are the stream's tags for its writes and its
  // Finish.
  StreamChannel(SessionStream* stream, CompletionTag* written,
                CompletionTag* finished)
      : written_(written), finished_(finished), stream_(stream) {}

  void Send(OutboundMessage message) override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (stream_ == nullptr || finish_requested_) return;
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
    absl::MutexLock lock(&mu_);
    if (stream_ != nullptr && drop_queued) outbound_.clear();
    if (stream_ == nullptr || finish_requested_) return;
    finish_requested_ = true;
    finish_status_ = std::move(status);
    Advance();
  }

  void OnWriteDone(bool ok) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
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

  void OnFinishDone() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    finish_in_flight_ = false;
  }

  // True once the stream is being finished: no more reads are needed.
  bool finishing() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return finish_requested_;
  }

  // The stream is done: nothing more is started, and what is queued is
  // dropped.
  void Detach() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    stream_ = nullptr;
    outbound_.clear();
  }

  // Detached, and no write or Finish of it is still pending.
  bool Idle() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return stream_ == nullptr && !write_in_flight_ && !finish_in_flight_;
  }

 private:
  // Starts the next write, or the Finish once the queue is empty, unless a
  // write is in flight.
  void Advance() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (stream_ == nullptr || write_in_flight_ || finish_called_) return;
    if (!outbound_.empty()) {
      write_in_flight_ = true;
      in_flight_ = WireBytes(outbound_.front());
      outbound_.pop_front();
      stream_->Write(in_flight_, written_);
      return;
    }
    if (finish_requested_) {
      finish_called_ = true;
      finish_in_flight_ = true;
      stream_->Finish(finish_status_, finished_);
    }
  }

  // Constant after construction.
  CompletionTag* const written_;
  CompletionTag* const finished_;

  mutable absl::Mutex mu_;
  // Null once detached.
  SessionStream* stream_ ABSL_GUARDED_BY(mu_);
  std::deque<OutboundMessage> outbound_ ABSL_GUARDED_BY(mu_);
  // The message being written; untouched until its write completes.
  grpc::ByteBuffer in_flight_ ABSL_GUARDED_BY(mu_);
  bool write_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_requested_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status finish_status_ ABSL_GUARDED_BY(mu_);
  bool finish_called_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_in_flight_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

// One AgentSession stream, from the request for it to its end. Handlers only
// translate and Post to the loop; they never block. Every completion of one
// stream arrives on its queue's one thread, so the handlers never overlap;
// writes and the Finish are started from other threads too, through the
// channel. Deletes itself once the call is done and no operation of it is
// pending.
class AgentSessionService::Call {
 public:
  // Awaits the next stream on `queue`.
  Call(AgentSessionService* service, grpc::ServerCompletionQueue* queue)
      : service_(service), queue_(queue) {
    context_.AsyncNotifyWhenDone(&done_tag_);
    service_->RequestAgentSession(&context_, &stream_, queue_, queue_,
                                  &arrived_tag_);
  }

 private:
  void OnArrived(bool ok) {
    if (!ok) {
      // The server is shutting down: no stream came, and none will.
      delete this;
      return;
    }
    service_->AwaitNextCall(queue_);
    id_ = SessionId(
        service_->next_session_id_.fetch_add(1, std::memory_order_relaxed));
    channel_ = std::make_shared<StreamChannel>(&stream_, &written_tag_,
                                               &finished_tag_);
    std::shared_ptr<AgentChannel> channel = channel_;
    service_->loop_->Post([coordinator = service_->coordinator_, id = id_,
                           channel,
                           identity = PeerIdentityOf(context_)]() mutable {
      coordinator->OnSessionOpened(id, channel, std::move(identity));
    });
    StartRead();
  }

  void OnRead(bool ok) {
    read_pending_ = false;
    if (!ok) {
      PostClosed("the agent closed its stream");
      channel_->RequestFinish(grpc::Status::OK, /*drop_queued=*/false);
      MaybeEnd();
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
      MaybeEnd();
      return;
    }
    service_->loop_->Post([coordinator = service_->coordinator_, id = id_,
                           message = std::move(message),
                           arrived = service_->clock_->Now()]() {
      coordinator->OnAgentMessage(id, message);
      coordinator->MessageHandled(arrived);
    });
    if (!channel_->finishing()) StartRead();
    MaybeEnd();
  }

  void OnWritten(bool ok) {
    channel_->OnWriteDone(ok);
    MaybeEnd();
  }

  void OnFinished(bool /*ok*/) {
    channel_->OnFinishDone();
    MaybeEnd();
  }

  // The call is over: its status went out, or it was cancelled (the agent
  // went away, or the server's shutdown deadline passed).
  void OnDone(bool /*ok*/) {
    done_ = true;
    if (context_.IsCancelled()) {
      PostClosed(
          "the stream was cancelled (the agent went away, or the coordinator "
          "is shutting down)");
    }
    channel_->Detach();
    PostClosed("the stream ended");
    MaybeEnd();
  }

  void StartRead() {
    read_pending_ = true;
    stream_.Read(&inbound_, &read_tag_);
  }

  void MaybeEnd() {
    if (done_ && !read_pending_ && channel_->Idle()) delete this;
  }

  void PostClosed(std::string why) {
    service_->loop_->Post(
        [coordinator = service_->coordinator_, id = id_,
         why = std::move(why)]() { coordinator->OnSessionClosed(id, why); });
  }

  // Constant after construction.
  AgentSessionService* const service_;
  grpc::ServerCompletionQueue* const queue_;

  grpc::ServerContext context_;
  SessionStream stream_{&context_};
  MethodTag<Call> arrived_tag_{this, &Call::OnArrived};
  MethodTag<Call> read_tag_{this, &Call::OnRead};
  MethodTag<Call> written_tag_{this, &Call::OnWritten};
  MethodTag<Call> finished_tag_{this, &Call::OnFinished};
  MethodTag<Call> done_tag_{this, &Call::OnDone};

  // Set when the stream arrives; then constant.
  SessionId id_{0};
  std::shared_ptr<StreamChannel> channel_;

  // Only touched by the handlers (on the queue's thread).
  grpc::ByteBuffer inbound_;
  bool read_pending_ = false;
  bool done_ = false;
};

AgentSessionService::AgentSessionService(ControlLoop* loop,
                                         Coordinator* coordinator, Clock* clock,
                                         size_t queues)
    : loop_(loop),
      coordinator_(coordinator),
      clock_(clock),
      queue_count_(queues) {
  CHECK_GT(queues, 0u) << "the agent sessions need a completion queue";
}

AgentSessionService::~AgentSessionService() { Shutdown(); }

void AgentSessionService::AddQueues(grpc::ServerBuilder& builder) {
  CHECK(queues_ == nullptr) << "AgentSessionService::AddQueues called twice";
  queues_ = CompletionQueuePool::ForServer(builder, queue_count_);
}

void AgentSessionService::Start() {
  CHECK(queues_ != nullptr) << "AgentSessionService::Start before AddQueues";
  {
    absl::MutexLock lock(&mu_);
    accepting_ = true;
  }
  // Several requests per queue, each renewed as its stream arrives: a
  // thousand agents reconnecting at once (a coordinator restart) are
  // matched without each waiting for the previous one's handling.
  for (size_t i = 0; i < queues_->size(); ++i) {
    for (int k = 0; k < kRequestsPerQueue; ++k) {
      AwaitNextCall(queues_->server_queue(i));
    }
  }
  queues_->Start("baton-sessions");
}

void AgentSessionService::AwaitNextCall(grpc::ServerCompletionQueue* queue) {
  absl::MutexLock lock(&mu_);
  // A request on a queue that is shut down would abort the process.
  if (accepting_) new Call(this, queue);
}

void AgentSessionService::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    accepting_ = false;
  }
  if (queues_ != nullptr) queues_->Shutdown();
}

}  // namespace baton::coordinator
