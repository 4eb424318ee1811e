#include "agent/data_plane.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "agent/reduce.h"
#include "common/thread_name.h"
#include "glog/logging.h"

namespace baton::agent {
namespace {

const char* KindName(v1::CollectiveOp kind) {
  return kind == v1::COLLECTIVE_OP_BROADCAST ? "broadcast" : "push_pull";
}

}  // namespace

const char* GpuCrossNodeName(GpuCrossNode mode) {
  return mode == GpuCrossNode::kGloo ? "gloo" : "nccl";
}

DataPlane::DataPlane(DataPlaneOptions options,
                     std::unique_ptr<NegotiationWire> negotiation,
                     std::vector<std::unique_ptr<Communicator>> data,
                     Callbacks callbacks, DeviceGroup device)
    : options_(std::move(options)),
      callbacks_(std::move(callbacks)),
      negotiation_(std::move(negotiation)) {
  CHECK(!data.empty()) << "a data plane needs at least one communicator";
  std::lock_guard<std::mutex> lock(mu_);
  // Room for the device worker: Submit reads workers_[0] while the job's
  // thread may attach it.
  workers_.reserve(data.size() + 1);
  for (auto& comm : data) {
    auto worker = std::make_unique<Worker>();
    worker->comm = std::move(comm);
    workers_.push_back(std::move(worker));
  }
  host_workers_ = workers_.size();
  threads_running_ = static_cast<int>(workers_.size()) + 1;
  for (size_t i = 0; i < workers_.size(); ++i) {
    Worker* w = workers_[i].get();
    w->thread = std::thread([this, w, i] {
      SetThreadName(absl::StrCat("baton-data-", i));
      WorkerLoop(w);
    });
  }
  scheduler_ = std::thread([this] {
    SetThreadName("baton-schedule");
    SchedulerLoop();
  });
  if (device.comm != nullptr) AttachDevicesLocked(std::move(device));
}

void DataPlane::AttachDevices(DeviceGroup device) {
  CHECK(device.comm != nullptr) << "a device group needs a communicator";
  std::lock_guard<std::mutex> lock(mu_);
  CHECK(device_worker_ == nullptr) << "devices attached twice";
  if (exit_workers_) return;  // being destroyed; the group closes here
  AttachDevicesLocked(std::move(device));
}

bool DataPlane::has_devices() const {
  std::lock_guard<std::mutex> lock(mu_);
  return device_worker_ != nullptr;
}

void DataPlane::AttachDevicesLocked(DeviceGroup device) {
  cross_node_ = device.cross_node;
  device_memory_ = device.memory;
  auto worker = std::make_unique<Worker>();
  worker->comm = std::move(device.host);
  worker->device = std::move(device.comm);
  Worker* w = worker.get();
  device_worker_ = w;
  workers_.push_back(std::move(worker));
  ++threads_running_;
  // Stopped already: the worker exits at once; the group is aborted like
  // one that was there when it stopped.
  if (stopped_ && drop_queued_) w->device->Abort(stop_status_);
  w->thread = std::thread([this, w] {
    SetThreadName("baton-gpu");
    WorkerLoop(w);
  });
}

DataPlane::~DataPlane() {
  Abort(absl::CancelledError(
      absl::StrCat("the agent stopped job \"", options_.job, "\"")));
  scheduler_.join();
  {
    std::lock_guard<std::mutex> lock(mu_);
    exit_workers_ = true;
    for (auto& worker : workers_) worker->cv.notify_all();
  }
  for (auto& worker : workers_) worker->thread.join();
}

namespace {

int64_t NowUs() { return absl::ToUnixMicros(absl::Now()); }

}  // namespace

void DataPlane::Submit(std::shared_ptr<const Operation> op) {
  Done done;
  uint64_t inline_seq = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) {
      done.emplace_back(op->id, stop_status_);
    } else if (op->on_device && device_worker_ == nullptr) {
      done.emplace_back(
          op->id,
          OpFailure(*op, absl::FailedPreconditionError(absl::StrCat(
                             "job \"", options_.job, "\" generation ",
                             options_.generation,
                             " has no GPU communicator on this node"))));
    } else if (!op->on_device && options_.num_nodes == 1 &&
               op->size_bytes <= kInlineBytes && submitted_.empty() &&
               queue_.empty() && in_flight_bytes_ == 0) {
      // A small operation of a single-node job with nothing ahead of it:
      // there is nothing to agree on and no order to keep, so it runs here
      // rather than two thread hops away (latency of small push_pulls).
      inline_seq = launch_seq_++;
      LaunchTrace(PartitionTask{op, 0, 0, op->size_bytes}, inline_seq);
      done.emplace_back(op->id, absl::OkStatus());
    } else {
      DCHECK(!submitted_.contains(op->tensor_id))
          << "two operations of tensor " << op->tensor_name << " submitted";
      ops_[op->id] = OpState{op, 0, 0, absl::OkStatus(), NowUs(), 0};
      submitted_[op->tensor_id] = std::move(op);
      WakeSchedulerLocked();
    }
  }
  if (!done.empty() && done[0].second.ok()) {
    const Operation& inline_op = *op;
    const int64_t start_us = NowUs();
    PartitionTask task{op,         0,  0,       inline_op.size_bytes,
                       inline_seq, -1, start_us};
    int64_t reduced_us = 0;
    done[0].second = Execute(*workers_[0], task, &reduced_us);
    Record(task, start_us, start_us, start_us, reduced_us, NowUs(),
           done[0].second.ok());
    std::lock_guard<std::mutex> lock(mu_);
    if (done[0].second.ok()) bytes_done_ += inline_op.size_bytes;
  }
  Report(done);
}

void DataPlane::SetKnownTensors(int32_t count) {
  std::lock_guard<std::mutex> lock(mu_);
  if (count > known_tensors_) {
    known_tensors_ = count;
    WakeSchedulerLocked();
  }
}

void DataPlane::Leave() {
  std::lock_guard<std::mutex> lock(mu_);
  leaving_ = true;
  WakeSchedulerLocked();
}

void DataPlane::WakeSchedulerLocked() {
  dirty_ = true;
  scheduler_cv_.notify_one();
  if (negotiation_ != nullptr) negotiation_->Interrupt();
}

void DataPlane::Abort(absl::Status status) {
  Done done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopped_) StopLocked(std::move(status), /*drain=*/false, done);
  }
  Report(done);
}

DataPlane::Stats DataPlane::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  Stats stats;
  stats.queue_depth = static_cast<int64_t>(ops_.size() + queue_.size());
  stats.bytes_in_flight = in_flight_bytes_;
  stats.bytes_done = bytes_done_;
  stats.rounds = rounds_;
  return stats;
}

bool DataPlane::finished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return threads_running_ == 0;
}

void DataPlane::SchedulerLoop() {
  std::vector<int64_t> vec;
  int32_t body = 0;
  while (Round(vec, body)) {
  }
  // Closing the connections now (not at destruction) makes peers still
  // blocked on this node fail at once instead of at their timeout.
  std::unique_ptr<NegotiationWire> negotiation;
  {
    std::lock_guard<std::mutex> lock(mu_);
    negotiation = std::move(negotiation_);
  }
  negotiation.reset();
  std::lock_guard<std::mutex> lock(mu_);
  --threads_running_;
}

bool DataPlane::AwaitNews(std::unique_lock<std::mutex>& lock, int32_t body) {
  const auto news = [this] { return dirty_ || stopped_ || leaving_; };
  if (options_.num_nodes == 1) {
    scheduler_cv_.wait(lock, news);
    return !stopped_;
  }
  // Nobody polls: a node with news starts the round, which wakes the
  // others (ARCHITECTURE.md, the ordering contract).
  while (!news()) {
    NegotiationWire* negotiation = negotiation_.get();
    lock.unlock();
    absl::StatusOr<bool> started =
        negotiation->AwaitRound(Negotiation::VectorSize(body));
    lock.lock();
    if (!started.ok()) {
      lock.unlock();
      NegotiationFailed(started.status());
      lock.lock();
      return false;
    }
    if (*started) break;
  }
  return !stopped_;
}

void DataPlane::NegotiationFailed(absl::Status status) {
  Done done;
  bool stopped_now = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopped_) {
      StopLocked(
          TransportError(
              status, absl::StrCat("negotiation round of job \"", options_.job,
                                   "\" generation ", options_.generation)),
          /*drain=*/false, done);
      stopped_now = true;
      status = stop_status_;
    }
  }
  if (stopped_now && callbacks_.stopped) callbacks_.stopped(status);
  Report(done);
}

bool DataPlane::Round(std::vector<int64_t>& vec, int32_t& body) {
  const bool single = options_.num_nodes == 1;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!AwaitNews(lock, body)) return false;
    dirty_ = false;
    Negotiation::LocalState state;
    state.mode = options_.mode;
    state.known_tensors = known_tensors_;
    state.free_credit = options_.credit_bytes - in_flight_bytes_;
    state.in_flight_bytes = in_flight_bytes_;
    state.pending = static_cast<int64_t>(submitted_.size());
    state.leaving = leaving_;
    state.ready = &submitted_;
    // A single node needs no agreement: its body covers every known tensor.
    if (single) body = known_tensors_;
    Negotiation::Encode(state, body, &vec);
  }

  if (!single) {
    CollectiveOptions opts;
    opts.timeout = options_.op_timeout;
    const absl::Status status =
        negotiation_->ExchangeMin(vec.data(), vec.size(), opts);
    if (!status.ok()) {
      NegotiationFailed(status);
      return false;
    }
  }
  const Negotiation::Outcome outcome = Negotiation::Decode(vec, body);

  Done done;
  bool stopped_now = false;
  absl::Status stop_status;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return false;
    ++rounds_;
    if (outcome.mode_mismatch) {
      StopLocked(absl::FailedPreconditionError(absl::StrCat(
                     "the nodes of job \"", options_.job,
                     "\" disagree on the scheduling mode (this node: ",
                     SchedulingModeName(options_.mode),
                     "): give every trainer the same BATON_SCHEDULING, or "
                     "every agent the same --scheduling")),
                 /*drain=*/true, done);
      stopped_now = true;
      stop_status = stop_status_;
    } else {
      for (const Negotiation::Mismatch& m : outcome.mismatches) {
        auto it = submitted_.find(m.tensor_id);
        if (it == submitted_.end()) continue;
        const std::shared_ptr<const Operation> op = it->second;
        submitted_.erase(it);
        ops_[op->id].status = absl::FailedPreconditionError(absl::StrCat(
            KindName(op->kind), " of tensor \"", op->tensor_name,
            "\": the nodes enqueued different operations (",
            Negotiation::DescribeKey(m.min_key), " on some, ",
            Negotiation::DescribeKey(m.max_key),
            " on others); every rank must enqueue the same step with the "
            "same average flag and root rank"));
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
        for (auto& op : agreed) queue_.Add(std::move(op));
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
      body = outcome.known_tensors;
      if (outcome.someone_leaving) {
        StopLocked(absl::FailedPreconditionError(absl::StrCat(
                       "a node left job \"", options_.job, "\" generation ",
                       options_.generation,
                       " (its trainers finished or detached); operations "
                       "enqueued after that cannot complete")),
                   /*drain=*/true, done);
        stopped_now = true;
        stop_status = stop_status_;
      }
    }
  }
  // The owner hears why the data plane stopped before the failed
  // operations, so that it can explain them.
  if (stopped_now && callbacks_.stopped) callbacks_.stopped(stop_status);
  Report(done);
  return !stopped_now;
}

void DataPlane::LaunchLocked(Launch launch) {
  // A fused launch goes where its first partition's sequence number says.
  const bool on_device = launch.front().op->on_device;
  const int32_t channel =
      on_device ? static_cast<int32_t>(host_workers_)
                : static_cast<int32_t>(launch_seq_ % host_workers_);
  const int64_t now_us = NowUs();
  for (PartitionTask& task : launch) {
    OpState& state = ops_[task.op->id];
    ++state.launched;
    in_flight_bytes_ += task.length;
    const uint64_t seq = launch_seq_++;
    LaunchTrace(task, seq);
    task.seq = seq;
    task.channel = channel;
    task.launched_us = now_us;
  }
  Worker& worker = *workers_[channel];
  worker.queue.push_back(std::move(launch));
  worker.cv.notify_one();
}

void DataPlane::LaunchTrace(const PartitionTask& task, uint64_t seq) {
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

void DataPlane::StopLocked(absl::Status status, bool drain, Done& done) {
  stopped_ = true;
  stop_status_ = std::move(status);
  drop_queued_ = !drain;
  for (auto& [tensor_id, op] : submitted_) {
    ops_[op->id].status = OpFailure(*op, stop_status_);
  }
  std::vector<uint64_t> unlaunched;
  for (auto& [tensor_id, op] : submitted_) unlaunched.push_back(op->id);
  submitted_.clear();
  for (const auto& op : queue_.Clear()) {
    OpState& state = ops_[op->id];
    if (state.status.ok()) state.status = OpFailure(*op, stop_status_);
    unlaunched.push_back(op->id);
  }
  for (uint64_t id : unlaunched) MaybeFinishLocked(id, done);
  scheduler_cv_.notify_all();
  if (negotiation_ != nullptr) negotiation_->Interrupt();
  for (auto& worker : workers_) worker->cv.notify_all();
  // A collective in flight may wait for peers that may never come: NCCL's
  // and the TCP rings' end at once when aborted (gloo's at their timeout).
  if (!drain) {
    for (auto& worker : workers_) {
      if (worker->comm != nullptr) worker->comm->Abort(stop_status_);
    }
    if (device_worker_ != nullptr && device_worker_->device != nullptr) {
      device_worker_->device->Abort(stop_status_);
    }
  }
}

void DataPlane::MaybeFinishLocked(uint64_t op_id, Done& done) {
  auto it = ops_.find(op_id);
  if (it == ops_.end()) return;
  OpState& state = it->second;
  if (state.returned < state.launched) return;
  const bool complete = state.launched == state.op->NumPartitions();
  if (state.status.ok() && !complete) {
    if (!stopped_) return;  // more partitions to launch
    state.status = OpFailure(*state.op, stop_status_);
  }
  done.emplace_back(op_id, std::move(state.status));
  ops_.erase(it);
}

void DataPlane::Report(Done& done) {
  for (auto& [id, status] : done) callbacks_.op_done(id, std::move(status));
  done.clear();
}

void DataPlane::WorkerLoop(Worker* worker) {
  while (true) {
    Launch launch;
    bool drop = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Once scheduling stopped nothing new is queued: drain and exit.
      worker->cv.wait(lock, [&] {
        return !worker->queue.empty() || exit_workers_ || stopped_;
      });
      if (worker->queue.empty()) break;
      launch = std::move(worker->queue.front());
      worker->queue.pop_front();
      drop = drop_queued_;
    }
    const int64_t started_us = NowUs();
    int64_t reduced_us = 0;
    absl::Status status = drop ? absl::CancelledError("not started")
                          : launch.size() == 1
                              ? Execute(*worker, launch.front(), &reduced_us)
                              : ExecuteFused(*worker, launch, &reduced_us);
    const int64_t done_us = NowUs();
    Done done;
    bool failed_now = false;
    absl::Status stop_status;
    std::vector<std::pair<int64_t, int64_t>> times;  // submitted, agreed
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const PartitionTask& task : launch) {
        in_flight_bytes_ -= task.length;
        OpState& state = ops_[task.op->id];
        times.emplace_back(state.submitted_us, state.agreed_us);
        ++state.returned;
        if (status.ok()) {
          bytes_done_ += task.length;
        } else if (drop) {
          if (state.status.ok()) {
            state.status = OpFailure(*task.op, stop_status_);
          }
        } else {
          // After Abort a collective fails because of it (an aborted NCCL
          // communicator): the abort's reason is the operation's.
          if (state.status.ok()) {
            state.status = stopped_ && drop_queued_
                               ? OpFailure(*task.op, stop_status_)
                               : status;
          }
          if (!stopped_) {
            StopLocked(status, /*drain=*/false, done);
            failed_now = true;
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
    if (!drop) {
      for (size_t i = 0; i < launch.size(); ++i) {
        Record(launch[i], times[i].first, times[i].second, started_us,
               reduced_us, done_us, status.ok());
      }
    }
    if (failed_now && callbacks_.stopped) callbacks_.stopped(stop_status);
    Report(done);
  }
  // As in SchedulerLoop; StopLocked reaches the communicators under mu_.
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<DeviceCommunicator> device;
  {
    std::lock_guard<std::mutex> lock(mu_);
    comm = std::move(worker->comm);
    device = std::move(worker->device);
  }
  comm.reset();
  device.reset();
  std::lock_guard<std::mutex> lock(mu_);
  --threads_running_;
}

absl::Status DataPlane::TransportError(const absl::Status& status,
                                       const std::string& what) const {
  std::string peers;
  for (size_t rank = 0; rank < options_.node_names.size(); ++rank) {
    if (static_cast<int32_t>(rank) == options_.node_rank) continue;
    absl::StrAppend(&peers, peers.empty() ? "" : ", ",
                    options_.node_names[rank]);
  }
  return absl::Status(
      status.code(),
      absl::StrCat(what, ": ", status.message(),
                   peers.empty() ? "" : absl::StrCat(" (peers: ", peers, ")")));
}

absl::Status DataPlane::OpFailure(const Operation& op,
                                  const absl::Status& status) {
  return absl::Status(
      status.code(),
      absl::StrCat(KindName(op.kind), " of tensor \"", op.tensor_name,
                   "\" step ", op.step, " failed: ", status.message()));
}

std::string DataPlane::Describe(const PartitionTask& task) const {
  const Operation& op = *task.op;
  return absl::StrCat(KindName(op.kind), " of tensor \"", op.tensor_name,
                      "\" step ", op.step, " partition ", task.partition + 1,
                      "/", op.NumPartitions(), " (", task.length,
                      " bytes) in job \"", options_.job, "\" generation ",
                      options_.generation);
}

std::string DataPlane::DescribeFused(const Launch& launch) const {
  std::string tensors;
  int64_t bytes = 0;
  for (const PartitionTask& task : launch) {
    absl::StrAppend(&tensors, tensors.empty() ? "" : ", ", "\"",
                    task.op->tensor_name, "\" step ", task.op->step);
    bytes += task.length;
  }
  return absl::StrCat("fused push_pull of ", launch.size(), " tensors (",
                      tensors, "; ", bytes, " bytes) in job \"", options_.job,
                      "\" generation ", options_.generation);
}

void DataPlane::Record(const PartitionTask& task, int64_t submitted_us,
                       int64_t agreed_us, int64_t started_us,
                       int64_t reduced_us, int64_t done_us, bool ok) const {
  if (options_.timeline == nullptr) return;
  const Operation& op = *task.op;
  v1::PartitionTrace trace;
  trace.set_tensor_id(op.tensor_id);
  trace.set_tensor(op.tensor_name);
  trace.set_step(op.step);
  trace.set_partition(task.partition);
  trace.set_num_partitions(op.NumPartitions());
  trace.set_bytes(task.length);
  trace.set_priority(op.priority);
  trace.set_kind(KindName(op.kind));
  trace.set_generation(options_.generation);
  trace.set_channel(task.channel);
  trace.set_launch_seq(task.seq);
  trace.set_submitted_us(submitted_us);
  trace.set_agreed_us(agreed_us);
  trace.set_launched_us(task.launched_us);
  trace.set_started_us(started_us);
  trace.set_reduced_us(reduced_us);
  trace.set_done_us(done_us);
  trace.set_ok(ok);
  options_.timeline->Add(std::move(trace));
}

absl::Status DataPlane::Execute(Worker& worker, const PartitionTask& task,
                                int64_t* reduced_us) {
  const Operation& op = *task.op;
  if (op.on_device) return ExecuteOnDevice(worker, task, reduced_us);
  const size_t element = ElementSize(op.dtype);
  const size_t count = static_cast<size_t>(task.length) / element;
  uint8_t* out = op.output + task.offset;
  CollectiveOptions opts;
  opts.timeout = options_.op_timeout;
  absl::Status status;
  if (op.kind == v1::COLLECTIVE_OP_BROADCAST) {
    uint8_t* data = out;
    if (op.root_local >= 0 && op.inputs.size() == 1) {
      // The root is its node's only trainer: it holds the result already,
      // and nobody here reads the output. Peers get the input itself (gloo
      // only reads the root's buffer), without a copy.
      data = const_cast<uint8_t*>(op.inputs[op.root_local]) + task.offset;
    } else if (op.root_local >= 0 && op.inputs[op.root_local] != op.output) {
      std::memcpy(out, op.inputs[op.root_local] + task.offset, task.length);
    }
    *reduced_us = NowUs();
    if (options_.num_nodes > 1) {
      status = worker.comm->Broadcast(data, task.length, op.root_node, opts);
    }
  } else {
    const size_t n = op.inputs.size();
    const bool cross = options_.num_nodes > 1;
    const bool average = op.average && options_.world_size > 1;
    if (cross && n == 1) {
      // One local trainer: the allreduce reads its input and writes the
      // output (no local copy).
      opts.input = op.inputs[0] + task.offset;
    } else if (!(n == 1 && op.inputs[0] == op.output)) {
      absl::InlinedVector<const void*, 8> srcs(n);
      for (size_t i = 0; i < n; ++i) srcs[i] = op.inputs[i] + task.offset;
      SumInto(op.dtype, out, srcs.data(), n, count);
    }
    *reduced_us = NowUs();
    if (cross) {
      if (average) opts.divisor = options_.world_size;
      status = worker.comm->AllreduceSum(out, count, op.dtype, opts);
    } else if (average) {
      DivideInPlace(op.dtype, out, count, options_.world_size);
    }
  }
  if (!status.ok()) return TransportError(status, Describe(task));
  return status;
}

absl::Status DataPlane::ExecuteFused(Worker& worker, const Launch& launch,
                                     int64_t* reduced_us) {
  // FuseSmallTensors: host push-pulls of whole tensors, one data type and
  // average flag, more than one node.
  const Operation& first = *launch.front().op;
  const size_t element = ElementSize(first.dtype);
  size_t total = 0;
  for (const PartitionTask& task : launch) {
    total += static_cast<size_t>(task.length);
  }
  if (worker.fused.size() < total) worker.fused.resize(total);
  uint8_t* packed = worker.fused.data();
  size_t at = 0;
  for (const PartitionTask& task : launch) {
    const Operation& op = *task.op;
    const size_t n = op.inputs.size();
    absl::InlinedVector<const void*, 8> srcs(n);
    for (size_t i = 0; i < n; ++i) srcs[i] = op.inputs[i] + task.offset;
    SumInto(op.dtype, packed + at, srcs.data(), n,
            static_cast<size_t>(task.length) / element);
    at += static_cast<size_t>(task.length);
  }
  *reduced_us = NowUs();
  CollectiveOptions opts;
  opts.timeout = options_.op_timeout;
  if (first.average && options_.world_size > 1) {
    opts.divisor = options_.world_size;
  }
  const absl::Status status =
      worker.comm->AllreduceSum(packed, total / element, first.dtype, opts);
  if (!status.ok()) return TransportError(status, DescribeFused(launch));
  at = 0;
  for (const PartitionTask& task : launch) {
    std::memcpy(task.op->output + task.offset, packed + at,
                static_cast<size_t>(task.length));
    at += static_cast<size_t>(task.length);
  }
  return absl::OkStatus();
}

absl::Status DataPlane::AbortedBeforeWriteBack() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_ && drop_queued_) return stop_status_;
  return absl::OkStatus();
}

absl::Status DataPlane::ExecuteOnDevice(Worker& worker,
                                        const PartitionTask& task,
                                        int64_t* reduced_us) {
  const Operation& op = *task.op;
  DeviceCommunicator& device = *worker.device;
  const int local = device.local_devices();
  // Named only on failure: this runs for every partition.
  const auto fail = [&](const absl::Status& status) {
    return TransportError(status, Describe(task));
  };
  if (static_cast<int>(op.device_buffers.size()) != local) {
    return absl::InternalError(
        absl::StrCat(Describe(task), ": ", op.device_buffers.size(),
                     " CUDA buffers for ", local, " local GPUs"));
  }
  CollectiveOptions opts;
  opts.timeout = options_.op_timeout;
  // ByteScheduler's ready events: the trainers' streams have written the
  // inputs.
  for (DeviceEvent* ready : op.ready) {
    if (ready == nullptr) continue;
    absl::Status status = ready->Wait(options_.op_timeout);
    if (!status.ok()) {
      return absl::Status(status.code(),
                          absl::StrCat(Describe(task), ": ", status.message()));
    }
  }
  absl::InlinedVector<void*, 8> buffers(local);
  for (int i = 0; i < local; ++i) {
    buffers[i] = op.device_buffers[i] + task.offset;
  }
  const size_t element = ElementSize(op.dtype);
  const size_t count = static_cast<size_t>(task.length) / element;
  const size_t bytes = static_cast<size_t>(task.length);
  const bool cross = options_.num_nodes > 1;
  uint8_t* stage = op.output == nullptr ? nullptr : op.output + task.offset;
  absl::Status status;
  if (cross_node_ == GpuCrossNode::kNccl) {
    *reduced_us = NowUs();
    if (op.kind == v1::COLLECTIVE_OP_BROADCAST) {
      const int root = op.root_node * local + op.root_local;
      status = device.DeviceBroadcast(buffers, bytes, root, opts);
    } else {
      status = device.DeviceAllreduce(
          buffers, count, op.dtype,
          op.average ? DeviceReduceOp::kAverage : DeviceReduceOp::kSum, opts);
    }
    return status.ok() ? status : fail(status);
  }

  // The hierarchical path: this node's GPUs agree among themselves with
  // NCCL; the nodes agree on host memory over gloo.
  if (cross && (stage == nullptr || worker.comm == nullptr ||
                device_memory_ == nullptr)) {
    return absl::InternalError(absl::StrCat(
        Describe(task), ": the hierarchical path has no host stage"));
  }
  if (op.kind == v1::COLLECTIVE_OP_BROADCAST) {
    int from = 0;  // the local device that holds the result
    if (op.root_node == options_.node_rank) {
      from = op.root_local;
      if (cross) {
        status = device_memory_->CopyToHost(stage, buffers[from], bytes, from);
        if (status.ok()) {
          status = worker.comm->Broadcast(stage, bytes, op.root_node, opts);
        }
      }
    } else {
      status = worker.comm->Broadcast(stage, bytes, op.root_node, opts);
      if (status.ok()) status = AbortedBeforeWriteBack();
      if (status.ok()) {
        status = device_memory_->CopyToDevice(buffers[0], stage, bytes, 0);
      }
    }
    *reduced_us = NowUs();
    if (status.ok() && local > 1) {
      status = device.DeviceBroadcast(buffers, bytes, from, opts);
    }
    return status.ok() ? status : fail(status);
  }
  // Alone, the node's average is the job's: NCCL divides. Across nodes the
  // host divides the job's sum.
  const bool average = op.average && options_.world_size > 1;
  if (local > 1) {
    status = device.DeviceReduce(
        buffers, count, op.dtype,
        average && !cross ? DeviceReduceOp::kAverage : DeviceReduceOp::kSum,
        /*root=*/0, opts);
  }
  *reduced_us = NowUs();
  if (status.ok() && cross) {
    status = device_memory_->CopyToHost(stage, buffers[0], bytes, 0);
    if (status.ok()) {
      if (average) opts.divisor = options_.world_size;
      status = worker.comm->AllreduceSum(stage, count, op.dtype, opts);
    }
    if (status.ok()) status = AbortedBeforeWriteBack();
    if (status.ok()) {
      status = device_memory_->CopyToDevice(buffers[0], stage, bytes, 0);
    }
  }
  if (status.ok() && local > 1) {
    status = device.DeviceBroadcast(buffers, bytes, /*root=*/0, opts);
  }
  return status.ok() ? status : fail(status);
}

}  // namespace baton::agent
