#include "agent/scheduler/scheduler.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/thread_name.h"
#include "glog/logging.h"

namespace baton::agent {
namespace {

// The smallest partition the tuner chooses: a fused launch's size. Each
// collective costs CPU on the trainers' cores (wake-ups, a round, the
// ring's steps); below this, on the 2-core machines measured, that CPU and
// not the link set the pace (MobileNetV2 at 770 Mbit/s: 256 KiB partitions
// ran 0.89x fifo).
constexpr int64_t kMinTunedPartitionBytes = 1 << 20;

// A tuner when baton chooses the partition size or the credit: priority
// mode with collectives across nodes to measure.
std::unique_ptr<PartitionTuner> MakeTuner(const SchedulerOptions& options,
                                          size_t channels) {
  if (options.mode != SchedulingMode::kPriority || options.num_nodes < 2 ||
      !(options.tune_partition_bytes || options.tune_credit_bytes)) {
    return nullptr;
  }
  PartitionTuner::Options tuner;
  tuner.channels = static_cast<int>(channels);
  if (options.partition_bytes > 0) {
    tuner.initial_partition_bytes = options.partition_bytes;
  }
  tuner.initial_credit_bytes =
      std::max(options.credit_bytes, tuner.initial_partition_bytes);
  tuner.min_partition_bytes =
      std::min(kMinTunedPartitionBytes, tuner.initial_partition_bytes);
  tuner.max_partition_bytes =
      std::max(tuner.max_partition_bytes, tuner.initial_partition_bytes);
  return std::make_unique<PartitionTuner>(tuner);
}

}  // namespace

Scheduler::Scheduler(SchedulerOptions options,
                     std::unique_ptr<NegotiationWire> negotiation,
                     std::vector<std::unique_ptr<Communicator>> data,
                     Callbacks callbacks, DeviceGroup device)
    : options_(std::move(options)),
      callbacks_(std::move(callbacks)),
      tuner_(MakeTuner(options_, data.size())),
      negotiation_(std::move(negotiation)),
      partition_bytes_(options_.partition_bytes),
      credit_bytes_(options_.credit_bytes) {
  ExecutorOptions executor = options_;
  executor.tuner = tuner_.get();
  executor.bytes_skipped = callbacks_.bytes_skipped;
  if (tuner_ != nullptr) {
    tuner_->SetApplied({std::max<int64_t>(partition_bytes_, 8),
                        std::max(credit_bytes_, partition_bytes_)});
  }
  executor_ = std::make_unique<Executor>(
      std::move(executor), std::move(data),
      [this](Launch launch, absl::Status status, bool dropped) {
        OnReturned(std::move(launch), std::move(status), dropped);
      });
  if (device.comm != nullptr) executor_->AttachDevices(std::move(device));
  scheduler_ = std::thread([this] {
    SetThreadName("baton-schedule");
    SchedulerLoop();
  });
}

Scheduler::~Scheduler() {
  Abort(absl::CancelledError(
      absl::StrCat("the agent stopped job \"", options_.job, "\"")));
  scheduler_.join();
  // Joins the workers; they report their last launches into this object.
  executor_.reset();
}

void Scheduler::AttachDevices(DeviceGroup device) {
  executor_->AttachDevices(std::move(device));
}

bool Scheduler::has_devices() const { return executor_->has_devices(); }

int64_t Scheduler::NowUs() const {
  return absl::ToUnixMicros(options_.clock->Now());
}

void Scheduler::Submit(std::shared_ptr<const Operation> op) {
  Done done;
  bool run_inline = false;
  PartitionTask inline_task;
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) {
      done.emplace_back(op->id, stop_status_);
    } else if (op->on_device && !executor_->has_devices()) {
      done.emplace_back(
          op->id,
          OperationFailure(*op, absl::FailedPreconditionError(absl::StrCat(
                                    "job \"", options_.job, "\" generation ",
                                    options_.generation,
                                    " has no GPU communicator on this node"))));
    } else if (!op->on_device && options_.num_nodes == 1 &&
               op->size_bytes <= kInlineBytes && submitted_.empty() &&
               queue_.empty() && in_flight_bytes_ == 0) {
      // A small operation of a single-node job with nothing ahead of it:
      // there is nothing to agree on and no order to keep, so it runs here
      // rather than two thread hops away (latency of small push_pulls).
      const int64_t now_us = NowUs();
      inline_task = PartitionTask{op, 0, 0, op->size_bytes};
      inline_task.seq = launch_seq_++;
      inline_task.channel = 0;
      inline_task.submitted_us = now_us;
      inline_task.agreed_us = now_us;
      inline_task.launched_us = now_us;
      LaunchTrace(inline_task, inline_task.seq);
      run_inline = true;
    } else {
      DCHECK(!submitted_.contains(op->tensor_id))
          << "two operations of tensor " << op->tensor_name << " submitted";
      ops_[op->id] = OpState{op, 0, 0, absl::OkStatus(), NowUs(), 0};
      submitted_[op->tensor_id] = std::move(op);
      WakeSchedulerLocked();
    }
  }
  if (run_inline) {
    absl::Status status = executor_->RunInline(inline_task);
    if (status.ok()) {
      absl::MutexLock lock(&mu_);
      bytes_done_ += op->size_bytes;
    }
    done.emplace_back(op->id, std::move(status));
  }
  Report(done);
}

void Scheduler::SetKnownTensors(int32_t count) {
  absl::MutexLock lock(&mu_);
  if (count > known_tensors_) {
    known_tensors_ = count;
    WakeSchedulerLocked();
  }
}

void Scheduler::Leave() {
  absl::MutexLock lock(&mu_);
  leaving_ = true;
  WakeSchedulerLocked();
}

void Scheduler::WakeSchedulerLocked() {
  dirty_ = true;
  news_.Signal();
  if (negotiation_ != nullptr) negotiation_->Interrupt();
}

void Scheduler::Abort(absl::Status status) {
  Done done;
  {
    absl::MutexLock lock(&mu_);
    if (!stopped_) StopLocked(std::move(status), /*drain=*/false, done);
  }
  Report(done);
}

Scheduler::Stats Scheduler::stats() const {
  absl::MutexLock lock(&mu_);
  Stats stats;
  stats.queue_depth = static_cast<int64_t>(ops_.size() + queue_.size());
  stats.bytes_in_flight = in_flight_bytes_;
  stats.bytes_done = bytes_done_;
  stats.rounds = rounds_;
  stats.partition_bytes = partition_bytes_;
  stats.credit_bytes = credit_bytes_;
  stats.partition_tuned = tuner_ != nullptr && options_.tune_partition_bytes;
  stats.credit_tuned = tuner_ != nullptr && options_.tune_credit_bytes;
  stats.retunes = retunes_;
  return stats;
}

bool Scheduler::finished() const {
  {
    absl::MutexLock lock(&mu_);
    if (scheduler_running_) return false;
  }
  return executor_->finished();
}

void Scheduler::SchedulerLoop() {
  std::vector<int64_t> vec;
  int32_t body = 0;
  while (Round(vec, body)) {
  }
  // Closing the connections now (not at destruction) makes peers still
  // blocked on this node fail at once instead of at their timeout.
  std::unique_ptr<NegotiationWire> negotiation;
  {
    absl::MutexLock lock(&mu_);
    negotiation = std::move(negotiation_);
  }
  negotiation.reset();
  absl::MutexLock lock(&mu_);
  scheduler_running_ = false;
}

bool Scheduler::AwaitNews(int32_t body) {
  const auto news = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return dirty_ || stopped_ || leaving_;
  };
  if (options_.num_nodes == 1) {
    while (!news()) news_.Wait(&mu_);
    return !stopped_;
  }
  // Nobody polls: a node with news starts the round, which wakes the
  // others (ARCHITECTURE.md, the ordering contract).
  while (!news()) {
    NegotiationWire* negotiation = negotiation_.get();
    mu_.Unlock();
    absl::StatusOr<bool> started =
        negotiation->AwaitRound(Negotiation::VectorSize(body));
    if (!started.ok()) {
      NegotiationFailed(started.status());
      mu_.Lock();
      return false;
    }
    mu_.Lock();
    if (*started) break;
  }
  return !stopped_;
}

void Scheduler::NegotiationFailed(absl::Status status) {
  Done done;
  bool stopped_now = false;
  {
    absl::MutexLock lock(&mu_);
    if (!stopped_) {
      StopLocked(TransportError(
                     status,
                     absl::StrCat("negotiation round of job \"", options_.job,
                                  "\" generation ", options_.generation),
                     options_.node_names, options_.node_rank),
                 /*drain=*/false, done);
      stopped_now = true;
      stop_unreported_ = true;
      status = stop_status_;
    }
  }
  if (stopped_now) ReportStop(status, done);
  Report(done);
}

bool Scheduler::Round(std::vector<int64_t>& vec, int32_t& body) {
  const bool single = options_.num_nodes == 1;
  // What this node said it had in flight: credit freed during the exchange
  // is seen only by the next round.
  int64_t encoded_in_flight = 0;
  bool started = false;
  {
    absl::MutexLock lock(&mu_);
    if (!AwaitNews(body)) return false;
    started = dirty_ || leaving_;
    dirty_ = false;
    Negotiation::LocalState state;
    state.mode = options_.mode;
    state.known_tensors = known_tensors_;
    state.free_credit = credit_bytes_ - in_flight_bytes_;
    const PartitionTuner::Proposal proposal = ProposalLocked();
    state.partition_bytes = proposal.partition_bytes;
    state.credit_bytes = proposal.credit_bytes;
    state.in_flight_bytes = in_flight_bytes_;
    state.pending = static_cast<int64_t>(submitted_.size());
    state.leaving = leaving_;
    state.ready = &submitted_;
    // A single node needs no agreement: its body covers every known tensor.
    if (single) body = known_tensors_;
    Negotiation::Encode(state, body, &vec);
    encoded_in_flight = in_flight_bytes_;
  }

  if (!single) {
    CollectiveOptions opts;
    opts.timeout = options_.op_timeout;
    // Only this thread resets the wire, so it is used here unlocked.
    NegotiationWire* negotiation;
    {
      absl::MutexLock lock(&mu_);
      negotiation = negotiation_.get();
    }
    const absl::Time exchange_start = options_.clock->Now();
    const absl::Status status =
        negotiation->ExchangeMin(vec.data(), vec.size(), opts);
    if (!status.ok()) {
      NegotiationFailed(status);
      return false;
    }
    if (callbacks_.round_exchanged) {
      callbacks_.round_exchanged(options_.clock->Now() - exchange_start,
                                 started);
    }
  }
  const Negotiation::Outcome outcome = Negotiation::Decode(vec, body);

  Done done;
  bool stopped_now = false;
  absl::Status stop_status;
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return false;
    ++rounds_;
    const bool freed_meanwhile = in_flight_bytes_ < encoded_in_flight;
    if (outcome.mode_mismatch) {
      StopLocked(absl::FailedPreconditionError(absl::StrCat(
                     "the nodes of job \"", options_.job,
                     "\" disagree on the scheduling mode (this node: ",
                     SchedulingModeName(options_.mode),
                     "): give every trainer the same BATON_SCHEDULING, or "
                     "every agent the same --scheduling")),
                 /*drain=*/true, done);
      stopped_now = true;
      stop_unreported_ = true;
      stop_status = stop_status_;
    } else {
      for (const Negotiation::Mismatch& m : outcome.mismatches) {
        auto it = submitted_.find(m.tensor_id);
        if (it == submitted_.end()) continue;
        const std::shared_ptr<const Operation> op = it->second;
        submitted_.erase(it);
        ops_[op->id].status = absl::FailedPreconditionError(absl::StrCat(
            CollectiveName(op->kind), " of tensor \"", op->tensor_name,
            "\": the nodes enqueued different operations (",
            Negotiation::DescribeKey(op->kind, m.min_key), " on some, ",
            Negotiation::DescribeKey(op->kind, m.max_key),
            " on others); every rank must enqueue the same step with the "
            "same average flag, reduce op and root rank"));
        MaybeFinishLocked(op->id, done);
      }
      std::vector<std::shared_ptr<const Operation>> agreed;
      std::vector<int64_t> ready_times;
      const int64_t agreed_us = NowUs();
      for (const Negotiation::Agreed& a : outcome.agreed) {
        auto it = submitted_.find(a.tensor_id);
        if (it == submitted_.end()) continue;
        ops_[it->second->id].agreed_us = agreed_us;
        agreed.push_back(it->second);
        ready_times.push_back(a.ready_unix_us);
        submitted_.erase(it);
      }
      if (options_.mode == SchedulingMode::kFifo) {
        std::vector<size_t> order(agreed.size());
        for (size_t i = 0; i < order.size(); ++i) order[i] = i;
        std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
          return ready_times[a] < ready_times[b];
        });
        for (size_t i : order) {
          const auto& op = agreed[i];
          LaunchLocked({PartitionTask{op, 0, 0, op->size_bytes}});
        }
      } else {
        // From this round on every node partitions and admits alike.
        ApplyLocked(outcome.partition_bytes, outcome.credit_bytes);
        for (auto& op : agreed) {
          OpState& state = ops_[op->id];
          const int64_t partition_bytes =
              op->partition_bytes > 0 ? op->partition_bytes : partition_bytes_;
          state.partitions = queue_.Add(std::move(op), partition_bytes);
        }
        std::vector<PartitionTask> admitted = queue_.Admit(
            outcome.min_free_credit, outcome.max_in_flight_bytes == 0);
        for (Launch& launch :
             FuseSmallTensors(std::move(admitted),
                              options_.num_nodes > 1 ? kFuseTensorBytes : 0,
                              kFuseLaunchBytes)) {
          LaunchLocked(std::move(launch));
        }
      }
      // An operation of a tensor the body did not cover yet waits for the
      // next round, which nothing else may start.
      if (outcome.known_tensors != body && !submitted_.empty()) dirty_ = true;
      // Partitions that returned during the exchange freed credit this
      // round could not use, and their return asked for no round (the
      // queue was empty then, or the round was already running): without
      // one, queued partitions could wait with nothing in flight anywhere.
      if (freed_meanwhile && !queue_.empty()) dirty_ = true;
      body = outcome.known_tensors;
      if (outcome.someone_leaving) {
        StopLocked(absl::FailedPreconditionError(absl::StrCat(
                       "a node left job \"", options_.job, "\" generation ",
                       options_.generation,
                       " (its trainers finished or detached); operations "
                       "enqueued after that cannot complete")),
                   /*drain=*/true, done);
        stopped_now = true;
        stop_unreported_ = true;
        stop_status = stop_status_;
      }
    }
  }
  // The owner hears why the data plane stopped before the failed
  // operations, so that it can explain them.
  if (stopped_now) ReportStop(stop_status, done);
  Report(done);
  return !stopped_now;
}

void Scheduler::LaunchLocked(Launch launch) {
  // A fused launch goes where its first partition's sequence number says.
  const bool on_device = launch.front().op->on_device;
  const size_t channels = executor_->host_channels();
  const int32_t channel = on_device
                              ? static_cast<int32_t>(channels)
                              : static_cast<int32_t>(launch_seq_ % channels);
  const int64_t now_us = NowUs();
  for (PartitionTask& task : launch) {
    OpState& state = ops_[task.op->id];
    ++state.launched;
    in_flight_bytes_ += task.length;
    const uint64_t seq = launch_seq_++;
    LaunchTrace(task, seq);
    task.seq = seq;
    task.submitted_us = state.submitted_us;
    task.agreed_us = state.agreed_us;
    task.launched_us = now_us;
  }
  executor_->Queue(std::move(launch), channel);
}

void Scheduler::LaunchTrace(const PartitionTask& task, uint64_t seq) {
  if (options_.launch_trace != nullptr) {
    std::fprintf(options_.launch_trace,
                 "generation=%lld seq=%llu tensor=%u step=%lld partition=%d "
                 "bytes=%lld\n",
                 static_cast<long long>(options_.generation),
                 static_cast<unsigned long long>(seq), task.op->tensor_id,
                 static_cast<long long>(task.op->step), task.partition,
                 static_cast<long long>(task.length));
    std::fflush(options_.launch_trace);
  }
}

void Scheduler::OnReturned(Launch launch, absl::Status status, bool dropped) {
  Done done;
  bool failed_now = false;
  absl::Status stop_status;
  {
    absl::MutexLock lock(&mu_);
    for (const PartitionTask& task : launch) {
      in_flight_bytes_ -= task.length;
      OpState& state = ops_[task.op->id];
      ++state.returned;
      if (status.ok()) {
        bytes_done_ += task.length;
      } else if (dropped) {
        if (state.status.ok()) {
          state.status = OperationFailure(*task.op, stop_status_);
        }
      } else {
        // After Abort a collective fails because of it (an aborted NCCL
        // communicator or TCP ring): the abort's reason is the operation's.
        if (state.status.ok()) {
          state.status = stopped_ && !drain_
                             ? OperationFailure(*task.op, stop_status_)
                             : status;
        }
        if (!stopped_) {
          StopLocked(status, /*drain=*/false, done);
          failed_now = true;
          stop_unreported_ = true;
          stop_status = stop_status_;
        }
      }
      MaybeFinishLocked(task.op->id, done);
    }
    // Freed credit matters only to partitions waiting for it; the queue
    // is the same on every node, so when it is empty no node needs a
    // round for this.
    if (!queue_.empty()) WakeSchedulerLocked();
  }
  if (failed_now) ReportStop(stop_status, done);
  Report(done);
}

void Scheduler::StopLocked(absl::Status status, bool drain, Done& done) {
  stopped_ = true;
  stop_status_ = std::move(status);
  drain_ = drain;
  std::vector<uint64_t> unlaunched;
  for (auto& [tensor_id, op] : submitted_) {
    ops_[op->id].status = OperationFailure(*op, stop_status_);
    unlaunched.push_back(op->id);
  }
  submitted_.clear();
  for (const auto& op : queue_.Clear()) {
    OpState& state = ops_[op->id];
    if (state.status.ok()) state.status = OperationFailure(*op, stop_status_);
    unlaunched.push_back(op->id);
  }
  for (uint64_t id : unlaunched) MaybeFinishLocked(id, done);
  news_.SignalAll();
  if (negotiation_ != nullptr) {
    // Draining, the rounds go on until every node stopped; otherwise a
    // round in progress ends now, and the connections come free for the
    // next generation (TcpTransport keeps them).
    if (drain) {
      negotiation_->Interrupt();
    } else {
      negotiation_->Abort(stop_status_);
    }
  }
  executor_->Stop(stop_status_, /*drop=*/!drain);
}

void Scheduler::MaybeFinishLocked(uint64_t op_id, Done& done) {
  auto it = ops_.find(op_id);
  if (it == ops_.end()) return;
  OpState& state = it->second;
  if (state.returned < state.launched) return;
  const bool complete = state.launched == state.partitions;
  if (state.status.ok() && !complete) {
    if (!stopped_) return;  // more partitions to launch
    state.status = OperationFailure(*state.op, stop_status_);
  }
  done.emplace_back(op_id, std::move(state.status));
  ops_.erase(it);
}

PartitionTuner::Proposal Scheduler::ProposalLocked() const {
  PartitionTuner::Proposal proposal{partition_bytes_, credit_bytes_};
  if (tuner_ == nullptr) return proposal;
  const PartitionTuner::Proposal tuned = tuner_->Propose();
  if (options_.tune_partition_bytes) {
    proposal = tuned;
  } else if (options_.tune_credit_bytes) {
    // The partition is the user's: every channel busy and one queued.
    proposal.credit_bytes =
        static_cast<int64_t>(executor_->host_channels() + 1) * partition_bytes_;
  }
  if (!options_.tune_credit_bytes) {
    proposal.credit_bytes = credit_bytes_;
  } else if (options_.num_nodes > 1) {
    // Never below a fused launch per channel: a smaller credit splits the
    // runs of small tensors that fuse into one collective, and the
    // collectives' CPU, not the link, then sets the pace (MobileNetV2 at
    // 500 Mbit/s ran 0.64x fifo with a 1.25 MiB credit).
    proposal.credit_bytes = std::max(
        proposal.credit_bytes,
        static_cast<int64_t>(executor_->host_channels()) * kFuseLaunchBytes);
  }
  return proposal;
}

void Scheduler::ApplyLocked(int64_t partition_bytes, int64_t credit_bytes) {
  if (partition_bytes == partition_bytes_ && credit_bytes == credit_bytes_) {
    return;
  }
  LOG(INFO) << "job=" << options_.job << " gen=" << options_.generation
            << " node=" << options_.node_rank << " partitions of "
            << partition_bytes << " bytes (were " << partition_bytes_
            << "), credit " << credit_bytes << " bytes (was " << credit_bytes_
            << ") from round " << rounds_;
  partition_bytes_ = partition_bytes;
  credit_bytes_ = credit_bytes;
  ++retunes_;
  if (tuner_ != nullptr) tuner_->SetApplied({partition_bytes, credit_bytes});
}

void Scheduler::Report(Done& done) {
  {
    absl::MutexLock lock(&mu_);
    if (stop_unreported_) {
      for (auto& item : done) stop_unreported_done_.push_back(std::move(item));
      done.clear();
      return;
    }
  }
  for (auto& [id, status] : done) callbacks_.op_done(id, std::move(status));
  done.clear();
}

void Scheduler::ReportStop(const absl::Status& status, Done& done) {
  if (callbacks_.stopped) callbacks_.stopped(status);
  absl::MutexLock lock(&mu_);
  stop_unreported_ = false;
  for (auto& item : stop_unreported_done_) done.push_back(std::move(item));
  stop_unreported_done_.clear();
}

}  // namespace baton::agent
