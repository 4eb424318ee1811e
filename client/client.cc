#include "baton/client.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <functional>
#include <map>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "baton/v1/trainer.grpc.pb.h"
#include "client/declaration.h"
#include "client/socket_access.h"
#include "common/shm.h"
#include "common/shm_channel.h"
#include "common/tensor_retired.h"
#include "common/thread_name.h"
#include "grpcpp/grpcpp.h"

namespace baton::client {
namespace {

// Reads an integer variable; `fallback` when unset.
absl::StatusOr<int64_t> IntFromEnv(const char* name, int64_t fallback) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return fallback;
  int64_t parsed = 0;
  if (!absl::SimpleAtoi(value, &parsed)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "environment variable ", name, "=\"", value, "\" is not an integer"));
  }
  return parsed;
}

std::string StringFromEnv(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value == nullptr || *value == '\0' ? fallback : value;
}

// In both: `why` is gRPC's words, when it gave any.
absl::Status SessionClosed(const std::string& socket,
                           const std::string& why = "") {
  return absl::UnavailableError(absl::StrCat(
      "the session with the baton agent on ", socket, " is closed",
      why.empty() ? "" : absl::StrCat(" (", why, ")"),
      ": the agent stopped, or ended this trainer's session (its log says "
      "why); restart the trainer"));
}

absl::Status AgentUnreachable(const std::string& socket,
                              const std::string& why) {
  return absl::UnavailableError(
      absl::StrCat("cannot reach the baton agent on ", socket,
                   why.empty() ? "" : absl::StrCat(" (", why, ")"),
                   ": is baton-agent running there (BATON_AGENT_SOCKET)?"));
}

// Waits with `mu` held until `cond` holds (true) or `deadline` passes
// (false). absl::Mutex times its waits on the wall clock, which can be
// slewed: a wait that ends before the deadline on the steady clock waits
// again for the rest, so no timeout ends early.
bool AwaitUntil(absl::Mutex& mu, const absl::Condition& cond,
                std::chrono::steady_clock::time_point deadline)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
  while (!cond.Eval()) {
    const auto left = deadline - std::chrono::steady_clock::now();
    if (left <= std::chrono::steady_clock::duration::zero()) return false;
    mu.AwaitWithTimeout(cond, absl::FromChrono(left));
  }
  return true;
}

// How long a request to the agent waits for its answer (the agent answers
// on its job thread at once; only a stuck agent takes this long).
constexpr std::chrono::milliseconds kReplyTimeout{60000};

// How often a wait that the caller can interrupt asks whether it was.
constexpr std::chrono::milliseconds kInterruptSlice{100};

// AwaitUntil `timeout` from now.
bool AwaitFor(absl::Mutex& mu, const absl::Condition& cond,
              std::chrono::milliseconds timeout)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
  return AwaitUntil(mu, cond, std::chrono::steady_clock::now() + timeout);
}

}  // namespace

// The consumer side of the trainer channel's completion ring. The client's
// completer thread drains it while nobody waits; a thread in Handle::Wait
// drains it itself, so a completion wakes the waiter directly instead of
// the completer, which would then wake the waiter. One consumer at a time
// (the ring has a single consumer).
class CompletionRing {
 public:
  // `take` removes and returns the pending handle of (index, step), or null.
  using Take =
      std::function<std::shared_ptr<Handle>(int32_t index, int64_t step)>;

  CompletionRing(TrainerChannel* channel, Take take)
      : channel_(channel), take_(std::move(take)) {}

  // Finishes the handles of every completion in the ring now, unless
  // another thread is at it.
  void TryDrain() ABSL_LOCKS_EXCLUDED(drain_mu_) {
    if (!drain_mu_.TryLock()) return;
    if (!closed_) DrainLocked();
    drain_mu_.Unlock();
  }

  // Drains as completions arrive until `done()`, `deadline`, or Close().
  void Await(const std::function<bool()>& done,
             std::chrono::steady_clock::time_point deadline)
      ABSL_LOCKS_EXCLUDED(mu_, drain_mu_) {
    {
      absl::MutexLock lock(&mu_);
      ++waiters_;
    }
    while (!done()) {
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) break;
      uint32_t seen = 0;
      if (!Drain(&seen)) break;
      if (done()) break;
      channel_->completion_bell.Wait(
          seen, std::min<std::chrono::microseconds>(
                    std::chrono::duration_cast<std::chrono::microseconds>(
                        deadline - now),
                    kLongestSleep));
    }
    absl::MutexLock lock(&mu_);
    // The completer looks again within kLongestSleep by itself: waking it
    // after every Wait would cost a thread wake-up per operation.
    if (--waiters_ == 0 && stopping_) cv_.SignalAll();
  }

  // The completer thread: drains while no thread waits, until Close().
  void Serve() ABSL_LOCKS_EXCLUDED(mu_, drain_mu_) {
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        if (waiters_ > 0 && !stopping_) {
          cv_.WaitWithTimeout(&mu_, absl::FromChrono(kLongestSleep));
        }
        if (stopping_) return;
        if (waiters_ > 0) continue;
      }
      uint32_t seen = 0;
      if (!Drain(&seen)) return;
      channel_->completion_bell.Wait(seen, kLongestSleep);
    }
  }

  // A handle finished another way (a failure, the session's end): waiters
  // blocked on the bell look again.
  void Wake() { channel_->completion_bell.Ring(); }

  // Before the channel is unmapped: nobody touches it after this returns
  // (pending handles must be finished already, so waiters leave).
  void Close() ABSL_LOCKS_EXCLUDED(mu_, drain_mu_) {
    {
      absl::MutexLock lock(&drain_mu_);
      closed_ = true;
    }
    channel_->completion_bell.Ring();
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    cv_.SignalAll();
    while (waiters_ > 0) cv_.Wait(&mu_);
  }

 private:
  // Bounds every sleep on the bell, as a guard against a lost wake-up.
  static constexpr std::chrono::microseconds kLongestSleep{100000};

  // Drains, with `*seen` the bell's value from before: a completion pushed
  // after the drain rings past it. False once closed.
  bool Drain(uint32_t* seen) ABSL_LOCKS_EXCLUDED(drain_mu_) {
    absl::MutexLock lock(&drain_mu_);
    if (closed_) return false;
    *seen = channel_->completion_bell.Snapshot();
    DrainLocked();
    return true;
  }

  void DrainLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(drain_mu_) {
    ChannelEntry entry;
    while (channel_->completions.Pop(&entry)) {
      std::shared_ptr<Handle> handle = take_(entry.index, entry.step);
      if (handle != nullptr) handle->Finish(absl::OkStatus(), entry.value);
    }
  }

  TrainerChannel* const channel_;
  const Take take_;
  absl::Mutex drain_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  bool closed_ ABSL_GUARDED_BY(drain_mu_) = false;
  absl::Mutex mu_;
  // Signalled only when Close() may return, not when waiters_ drops to 0
  // (why a CondVar and not Mutex::Await, which would wake the completer each
  // time the last waiter leaves).
  absl::CondVar cv_;
  int waiters_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace baton::client

namespace baton {

using client::AgentUnreachable;
using client::AwaitFor;
using client::AwaitUntil;
using client::CheckDeclaration;
using client::CompletionRing;
using client::IntFromEnv;
using client::kInterruptSlice;
using client::kReplyTimeout;
using client::SessionClosed;
using client::StringFromEnv;

absl::StatusOr<ClientOptions> ClientOptions::FromEnvironment() {
  ClientOptions o;
  o.socket = StringFromEnv("BATON_AGENT_SOCKET", o.socket);
  o.job = StringFromEnv("BATON_JOB", "");
  // Under torchrun the job is its run (--rdzv_id), the same on every node.
  if (o.job.empty()) o.job = StringFromEnv("TORCHELASTIC_RUN_ID", "");
  if (o.job.empty()) {
    return absl::InvalidArgumentError(
        "BATON_JOB is not set (nor torchrun's TORCHELASTIC_RUN_ID): name the "
        "job this trainer belongs to");
  }
  absl::StatusOr<int64_t> v = IntFromEnv("LOCAL_RANK", 0);
  if (!v.ok()) return v.status();
  o.local_rank = static_cast<int32_t>(*v);
  v = IntFromEnv("LOCAL_WORLD_SIZE", 1);
  if (!v.ok()) return v.status();
  o.local_size = static_cast<int32_t>(*v);
  absl::StatusOr<int64_t> world = IntFromEnv("WORLD_SIZE", o.local_size);
  if (!world.ok()) return world.status();
  v = IntFromEnv("BATON_NODES", o.local_size > 0 ? *world / o.local_size : 1);
  if (!v.ok()) return v.status();
  o.expected_nodes = static_cast<int32_t>(*v);
  v = IntFromEnv("BATON_MIN_NODES", 0);
  if (!v.ok()) return v.status();
  o.min_nodes = static_cast<int32_t>(*v);
  v = IntFromEnv("GROUP_RANK", -1);
  if (!v.ok()) return v.status();
  if (*v < -1 || *v >= o.expected_nodes) {
    return absl::InvalidArgumentError(
        absl::StrCat("environment variable GROUP_RANK=", *v, " must be in 0..",
                     o.expected_nodes - 1, " (the job's nodes - 1), or unset"));
  }
  o.node_rank = static_cast<int32_t>(*v);
  v = IntFromEnv("BATON_PARTITION_BYTES", 0);
  if (!v.ok()) return v.status();
  o.partition_bytes = *v;
  o.scheduling = StringFromEnv("BATON_SCHEDULING", "");
  v = IntFromEnv("BATON_SHM_CHANNEL", 1);
  if (!v.ok()) return v.status();
  o.shm_channel = *v != 0;
  return o;
}

Handle::Handle(int32_t index, int64_t step,
               std::shared_ptr<CompletionRing> ring)
    : index_(index), step_(step), ring_(std::move(ring)) {}

Handle::~Handle() = default;

bool Handle::Done() const {
  absl::MutexLock lock(&mu_);
  return done_;
}

bool Handle::Poll() const {
  if (ring_ != nullptr && !Done()) ring_->TryDrain();
  return Done();
}

namespace {
// The payload that marks a wait's timeout (StillInFlight).
constexpr char kStillInFlightUrl[] = "baton.dev/still-in-flight";
}  // namespace

absl::Status client::StillInFlightError(std::string message) {
  absl::Status status = absl::DeadlineExceededError(std::move(message));
  status.SetPayload(kStillInFlightUrl, absl::Cord());
  return status;
}

bool StillInFlight(const absl::Status& status) {
  return absl::IsDeadlineExceeded(status) &&
         status.GetPayload(kStillInFlightUrl).has_value();
}

absl::Status Handle::Wait(std::chrono::milliseconds timeout) const {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  if (ring_ != nullptr) ring_->Await([this] { return Done(); }, deadline);
  absl::MutexLock lock(&mu_);
  if (!AwaitUntil(mu_, absl::Condition(&done_), deadline)) {
    return client::StillInFlightError(
        absl::StrCat("tensor #", index_, " step ", step_,
                     " did not complete within ", timeout.count(), " ms"));
  }
  return status_;
}

int64_t Handle::generation() const {
  absl::MutexLock lock(&mu_);
  return generation_;
}

void Handle::Finish(absl::Status status, int64_t generation) {
  absl::MutexLock lock(&mu_);
  if (done_) return;
  done_ = true;
  status_ = std::move(status);
  generation_ = generation;
}

class Client::Impl {
 public:
  absl::Status Start(const ClientOptions& options) {
    shm_channel_wanted_ = options.shm_channel;
    socket_ = options.socket;
    // The agent refuses a trainer of another user by closing the
    // connection, which gRPC reports only as "Socket closed".
    if (absl::Status s = client::CheckSocketAccess(options.socket); !s.ok()) {
      return s;
    }
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(16 << 20);
    channel_ = grpc::CreateCustomChannel(
        "unix:" + options.socket, grpc::InsecureChannelCredentials(), args);
    stub_ = v1::TrainerService::NewStub(channel_);
    stream_ = stub_->TrainerSession(&context_);
    v1::TrainerRequest request;
    v1::AttachRequest* attach = request.mutable_attach();
    attach->set_job(options.job);
    attach->set_local_rank(options.local_rank);
    attach->set_local_size(options.local_size);
    attach->set_expected_nodes(options.expected_nodes);
    attach->set_min_nodes(options.min_nodes);
    if (options.node_rank >= 0) attach->set_node_rank(options.node_rank);
    attach->set_partition_bytes(options.partition_bytes);
    attach->set_scheduling(options.scheduling);
    attach->set_pid(getpid());
    if (!Write(request)) return AgentUnreachable(options.socket, "");
    reader_ = std::thread([this] {
      SetThreadName("baton-reader");
      ReadLoop();
    });
    const auto deadline =
        std::chrono::steady_clock::now() + options.attach_timeout;
    const auto formed = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return attached_ || !stream_status_.ok();
    };
    // In slices, so that `interrupted` is asked while the job forms.
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        if (AwaitUntil(mu_, absl::Condition(&formed),
                       std::min(deadline, std::chrono::steady_clock::now() +
                                              kInterruptSlice))) {
          if (!attached_) return stream_status_;
          return absl::OkStatus();
        }
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("job \"", options.job, "\" was not formed within ",
                         options.attach_timeout.count(),
                         " ms: are all its nodes' trainers started?"));
      }
      if (options.interrupted) {
        if (absl::Status s = options.interrupted(); !s.ok()) return s;
      }
    }
  }

  ~Impl() {
    context_.TryCancel();
    if (reader_.joinable()) reader_.join();
    // The reader finished every pending handle: waiters leave.
    if (completions_ != nullptr) completions_->Close();
    if (completer_.joinable()) completer_.join();
  }

  // Maps the agent's shared-memory fast path, once.
  void MapChannel(const v1::Attached& attached)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!shm_channel_wanted_ || trainer_channel_ != nullptr ||
        attached.channel_shm_name().empty()) {
      return;
    }
    auto bell =
        SharedMemory::Open(attached.doorbell_shm_name(),
                           static_cast<size_t>(attached.doorbell_shm_bytes()));
    auto channel =
        SharedMemory::Open(attached.channel_shm_name(),
                           static_cast<size_t>(attached.channel_shm_bytes()));
    if (!bell.ok() || !channel.ok() ||
        channel->size() < sizeof(TrainerChannel) ||
        bell->size() < sizeof(Doorbell)) {
      return;  // enqueue over the stream instead
    }
    doorbell_memory_ = std::move(*bell);
    channel_memory_ = std::move(*channel);
    doorbell_ = reinterpret_cast<Doorbell*>(doorbell_memory_.data());
    trainer_channel_ =
        reinterpret_cast<TrainerChannel*>(channel_memory_.data());
    completions_ = std::make_shared<CompletionRing>(
        trainer_channel_, [this](int32_t index, int64_t step) {
          return TakeHandle(index, step);
        });
    completer_ = std::thread([this] {
      SetThreadName("baton-complete");
      completions_->Serve();
    });
  }

  // The pending handle of (index, step), removed; null when there is none.
  std::shared_ptr<Handle> TakeHandle(int32_t index, int64_t step)
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto it = handles_.find({index, step});
    if (it == handles_.end()) return nullptr;
    std::shared_ptr<Handle> handle = std::move(it->second);
    handles_.erase(it);
    return handle;
  }

  bool Write(v1::TrainerRequest& request) ABSL_LOCKS_EXCLUDED(write_mu_) {
    absl::MutexLock lock(&write_mu_);
    request.set_seq(++seq_);
    return stream_->Write(request);
  }

  void ReadLoop() ABSL_LOCKS_EXCLUDED(mu_) {
    v1::TrainerEvent event;
    while (stream_->Read(&event)) Dispatch(event);
    const grpc::Status status = stream_->Finish();
    absl::Status lost;
    std::map<std::pair<int32_t, int64_t>, std::shared_ptr<Handle>> handles;
    {
      absl::MutexLock lock(&mu_);
      lost = SessionEnded(status);
      stream_status_ = lost;
      stream_ended_.store(true, std::memory_order_release);
      handles.swap(handles_);
    }
    for (auto& [key, handle] : handles) handle->Finish(lost, 0);
    if (completions_ != nullptr) completions_->Wake();
  }

  // What every call still waiting on the session gets once the stream
  // ended. A killed agent, or none at the socket, ends it with UNAVAILABLE
  // in gRPC's words ("Socket closed"): name the agent and what to do.
  absl::Status SessionEnded(const grpc::Status& status) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (status.ok()) {
      return absl::UnavailableError("the agent ended this trainer's session");
    }
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE) {
      return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                          status.error_message());
    }
    return attached_ ? SessionClosed(socket_, status.error_message())
                     : AgentUnreachable(socket_, status.error_message());
  }

  void Dispatch(const v1::TrainerEvent& event) ABSL_LOCKS_EXCLUDED(mu_) {
    if (event.has_completion() || event.has_failed()) {
      Complete(event);
      return;
    }
    absl::MutexLock lock(&mu_);
    switch (event.body_case()) {
      case v1::TrainerEvent::kAttached:
        attached_ = true;
        info_ = event.attached();
        MapChannel(info_);
        break;
      case v1::TrainerEvent::kDeclared:
      case v1::TrainerEvent::kError:
        replies_[event.reply_to()] = event;
        break;
      case v1::TrainerEvent::kJoinPending:
        join_pending_generation_ = event.join_pending().generation();
        break;
      default:
        break;
    }
  }

  // A completion or a failure: finishes its handle, if still pending.
  void Complete(const v1::TrainerEvent& event) ABSL_LOCKS_EXCLUDED(mu_) {
    const bool ok = event.has_completion();
    std::shared_ptr<Handle> handle =
        ok ? TakeHandle(event.completion().index(), event.completion().step())
           : TakeHandle(event.failed().index(), event.failed().step());
    if (handle == nullptr) return;
    if (ok) {
      handle->Finish(absl::OkStatus(), event.completion().generation());
    } else {
      const v1::OperationFailed& failed = event.failed();
      handle->Finish(
          failed.retired()
              ? TensorRetiredError(failed.message())
              : absl::Status(static_cast<absl::StatusCode>(failed.code()),
                             failed.message()),
          failed.generation());
    }
    // A waiter may be asleep on the channel's bell.
    if (completions_ != nullptr) completions_->Wake();
  }

  absl::StatusOr<v1::TrainerEvent> Call(v1::TrainerRequest& request)
      ABSL_LOCKS_EXCLUDED(mu_) {
    if (!Write(request)) {
      return SessionClosed(socket_);
    }
    const uint64_t seq = request.seq();
    absl::MutexLock lock(&mu_);
    const auto answered = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return replies_.count(seq) > 0 || !stream_status_.ok();
    };
    if (!AwaitFor(mu_, absl::Condition(&answered), kReplyTimeout)) {
      return absl::UnavailableError(absl::StrCat(
          "the baton agent on ", socket_, " did not answer request ", seq,
          " within ", kReplyTimeout.count(),
          " ms: it is stuck or overloaded (its log says); restart the "
          "trainer"));
    }
    auto it = replies_.find(seq);
    if (it == replies_.end()) return stream_status_;
    v1::TrainerEvent reply = std::move(it->second);
    replies_.erase(it);
    return reply;
  }

  absl::StatusOr<std::shared_ptr<Handle>> Enqueue(const Tensor& tensor,
                                                  int64_t step, bool average,
                                                  v1::ReduceOp op, int32_t root)
      ABSL_LOCKS_EXCLUDED(mu_, write_mu_) {
    if (!v1::ReduceOp_IsValid(op)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "push_pull of tensor \"", tensor.spec().name(), "\": reduce op ",
          static_cast<int>(op),
          " is not one of REDUCE_OP_SUM (0) .. REDUCE_OP_BXOR (6)"));
    }
    if (average && op != v1::REDUCE_OP_SUM) {
      return absl::InvalidArgumentError(absl::StrCat(
          "push_pull of tensor \"", tensor.spec().name(), "\": average with ",
          v1::ReduceOp_Name(op),
          "; average applies to a sum only: pass REDUCE_OP_SUM, or average "
          "= false"));
    }
    auto handle = std::make_shared<Handle>(tensor.index(), step, completions_);
    {
      absl::MutexLock lock(&mu_);
      if (!stream_status_.ok()) return stream_status_;
      if (!handles_.emplace(std::make_pair(tensor.index(), step), handle)
               .second) {
        return absl::FailedPreconditionError(
            absl::StrCat("tensor \"", tensor.spec().name(), "\" step ", step,
                         " is already pending"));
      }
    }
    if (trainer_channel_ != nullptr) {
      ChannelEntry entry{tensor.index(),
                         (average ? kChannelAverage : 0) |
                             static_cast<int32_t>(op) << kChannelReduceOpShift,
                         step, root, fence_.load(std::memory_order_relaxed)};
      {
        // One producer at a time; a full ring (1024 operations outstanding)
        // drains as the agent catches up.
        absl::MutexLock lock(&write_mu_);
        while (!trainer_channel_->requests.Push(entry)) {
          // An agent that is gone never drains it: its stream has ended.
          if (stream_ended_.load(std::memory_order_acquire)) {
            absl::MutexLock handles_lock(&mu_);
            handles_.erase({tensor.index(), step});
            return stream_status_;
          }
          doorbell_->Ring();
          std::this_thread::yield();
        }
      }
      doorbell_->Ring();
      return handle;
    }
    v1::TrainerRequest request;
    v1::EnqueueRequest* enqueue = request.mutable_enqueue();
    enqueue->set_index(tensor.index());
    enqueue->set_step(step);
    enqueue->set_average(average);
    enqueue->set_reduce_op(op);
    enqueue->set_root_rank(root);
    enqueue->set_generation(fence_.load(std::memory_order_relaxed));
    if (!Write(request)) {
      absl::MutexLock lock(&mu_);
      handles_.erase({tensor.index(), step});
      return SessionClosed(socket_);
    }
    return handle;
  }

  // The generation enqueues are fenced to (Client::Fence); 0 for none.
  std::atomic<int64_t> fence_{0};
  std::string socket_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::TrainerService::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<
      grpc::ClientReaderWriter<v1::TrainerRequest, v1::TrainerEvent>>
      stream_;
  std::thread reader_;

  // Serializes the stream's writes and the channel's pushes.
  absl::Mutex write_mu_;
  uint64_t seq_ ABSL_GUARDED_BY(write_mu_) = 0;

  mutable absl::Mutex mu_;
  bool attached_ ABSL_GUARDED_BY(mu_) = false;
  // The generation nodes wait to join (TrainerEvent.join_pending); 0 for
  // none.
  int64_t join_pending_generation_ ABSL_GUARDED_BY(mu_) = 0;
  v1::Attached info_ ABSL_GUARDED_BY(mu_);
  absl::Status stream_status_ ABSL_GUARDED_BY(mu_);
  // stream_status_ is set: for a thread that must not wait for mu_.
  std::atomic<bool> stream_ended_{false};
  std::map<uint64_t, v1::TrainerEvent> replies_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<int32_t, int64_t>, std::shared_ptr<Handle>> handles_
      ABSL_GUARDED_BY(mu_);
  std::vector<SharedMemory> mappings_ ABSL_GUARDED_BY(mu_);

  // The fast path (set once, under mu_, before any enqueue uses it).
  SharedMemory doorbell_memory_;
  SharedMemory channel_memory_;
  Doorbell* doorbell_ = nullptr;
  TrainerChannel* trainer_channel_ = nullptr;
  std::shared_ptr<CompletionRing> completions_;
  std::thread completer_;
  bool shm_channel_wanted_ = true;
};

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(
    const ClientOptions& options) {
  auto impl = std::make_unique<Impl>();
  absl::Status status = impl->Start(options);
  if (!status.ok()) return status;
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

int32_t Client::rank() const {
  absl::MutexLock lock(&impl_->mu_);
  return impl_->info_.rank();
}
int32_t Client::size() const {
  absl::MutexLock lock(&impl_->mu_);
  return impl_->info_.size();
}
int32_t Client::local_rank() const {
  absl::MutexLock lock(&impl_->mu_);
  return impl_->info_.local_rank();
}
int32_t Client::local_size() const {
  absl::MutexLock lock(&impl_->mu_);
  return impl_->info_.local_size();
}
int64_t Client::generation() const {
  absl::MutexLock lock(&impl_->mu_);
  return impl_->info_.generation();
}

absl::StatusOr<std::vector<std::shared_ptr<Tensor>>> Client::Declare(
    const std::vector<v1::TensorSpec>& specs,
    const std::vector<v1::CudaBuffer>& cuda_buffers) {
  if (absl::Status s = CheckDeclaration(specs, cuda_buffers); !s.ok()) {
    return s;
  }
  v1::TrainerRequest request;
  v1::DeclareRequest* declare = request.mutable_declare();
  for (const v1::TensorSpec& spec : specs) *declare->add_tensors() = spec;
  for (const v1::CudaBuffer& buffer : cuda_buffers) {
    *declare->add_cuda_buffers() = buffer;
  }
  absl::StatusOr<v1::TrainerEvent> reply = impl_->Call(request);
  if (!reply.ok()) return reply.status();
  if (reply->has_error()) {
    return absl::Status(static_cast<absl::StatusCode>(reply->error().code()),
                        reply->error().message());
  }
  std::vector<std::shared_ptr<Tensor>> tensors;
  for (const v1::DeclaredTensor& d : reply->declared().tensors()) {
    const v1::TensorSpec& spec = specs[tensors.size()];
    if (spec.memory() == v1::MEMORY_KIND_CUDA) {
      // An agent that predates CUDA tensors ignores TensorSpec.memory and
      // would run the collective on shared memory nobody writes.
      if (!d.shm_name().empty()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "the baton agent on ", impl_->socket_, " answered CUDA tensor \"",
            spec.name(),
            "\" with shared memory: it predates CUDA tensors; upgrade "
            "baton-agent"));
      }
      tensors.push_back(std::make_shared<Tensor>(d.index(), spec,
                                                 d.size_bytes(), d.size_bytes(),
                                                 nullptr, 0, 0, d.next_step()));
      continue;
    }
    absl::StatusOr<SharedMemory> memory =
        SharedMemory::Open(d.shm_name(), static_cast<size_t>(d.shm_bytes()));
    if (!memory.ok()) return memory.status();
    uint8_t* base = memory->data();
    {
      absl::MutexLock lock(&impl_->mu_);
      impl_->mappings_.push_back(std::move(*memory));
    }
    // An agent that predates allgather sends no input_bytes: its inputs
    // are the result's size.
    const int64_t input_bytes =
        d.input_bytes() > 0 || spec.op() == v1::COLLECTIVE_OP_ALLGATHER
            ? d.input_bytes()
            : d.size_bytes();
    tensors.push_back(std::make_shared<Tensor>(
        d.index(), spec, d.size_bytes(), input_bytes, base, d.input_offset(),
        d.output_offset(), d.next_step()));
  }
  return tensors;
}

absl::StatusOr<std::shared_ptr<Handle>> Client::PushPullAsync(
    const Tensor& tensor, int64_t step, bool average, v1::ReduceOp op) {
  return impl_->Enqueue(tensor, step, average, op, 0);
}

absl::StatusOr<std::shared_ptr<Handle>> Client::BroadcastAsync(
    const Tensor& tensor, int64_t step, int32_t root_rank) {
  return impl_->Enqueue(tensor, step, false, v1::REDUCE_OP_SUM, root_rank);
}

absl::StatusOr<std::shared_ptr<Handle>> Client::AllgatherAsync(
    const Tensor& tensor, int64_t step) {
  return impl_->Enqueue(tensor, step, false, v1::REDUCE_OP_SUM, 0);
}

bool Client::JoinPending() const {
  absl::MutexLock lock(&impl_->mu_);
  return impl_->join_pending_generation_ != 0 &&
         impl_->join_pending_generation_ == impl_->info_.generation();
}

absl::Status Client::AdmitJoins() {
  v1::TrainerRequest request;
  request.mutable_admit_joins()->set_generation(generation());
  if (!impl_->Write(request)) return SessionClosed(impl_->socket_);
  return absl::OkStatus();
}

void Client::Fence(int64_t generation) {
  impl_->fence_.store(generation, std::memory_order_relaxed);
}

absl::StatusOr<int64_t> Client::WaitForGeneration(
    int64_t after, std::chrono::milliseconds timeout) {
  Impl& impl = *impl_;
  absl::MutexLock lock(&impl.mu_);
  const auto changed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(impl.mu_) {
    return impl.info_.generation() > after || !impl.stream_status_.ok();
  };
  AwaitFor(impl.mu_, absl::Condition(&changed), timeout);
  if (impl.info_.generation() > after) return impl.info_.generation();
  if (!impl.stream_status_.ok()) return impl.stream_status_;
  return absl::DeadlineExceededError(
      absl::StrCat("job \"", impl.info_.job(), "\" ran no generation after ",
                   after, " within ", timeout.count(), " ms"));
}

absl::Status Client::Detach(bool finished, std::chrono::milliseconds timeout) {
  v1::TrainerRequest request;
  request.mutable_detach()->set_finished(finished);
  if (!impl_->Write(request)) {
    return SessionClosed(impl_->socket_);
  }
  Impl& impl = *impl_;
  {
    absl::MutexLock write_lock(&impl.write_mu_);
    impl.stream_->WritesDone();
  }
  absl::MutexLock lock(&impl.mu_);
  const auto closed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(impl.mu_) {
    return !impl.stream_status_.ok();
  };
  if (!AwaitFor(impl.mu_, absl::Condition(&closed), timeout)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "the baton agent did not close the session within ", timeout.count(),
        " ms of the detach; it may not have received it (its log says)"));
  }
  return absl::OkStatus();
}

}  // namespace baton
