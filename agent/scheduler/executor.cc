#include "agent/scheduler/executor.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "agent/reduce.h"
#include "common/thread_name.h"
#include "glog/logging.h"

namespace baton::agent {

Executor::Executor(ExecutorOptions options,
                   std::vector<std::unique_ptr<Communicator>> data,
                   Returned returned)
    : options_(std::move(options)), returned_(std::move(returned)) {
  CHECK(!data.empty()) << "an executor needs at least one communicator";
  absl::MutexLock lock(&mu_);
  // Room for the device worker, so that no worker's address moves.
  workers_.reserve(data.size() + 1);
  host_workers_ = data.size();
  for (auto& comm : data) {
    auto worker = std::make_unique<Worker>();
    worker->comm = std::move(comm);
    workers_.push_back(std::move(worker));
  }
  for (size_t i = 0; i < host_workers_; ++i) {
    StartWorker(workers_[i].get(), absl::StrCat("baton-data-", i));
  }
}

Executor::~Executor() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    if (!stopped_) {
      stopped_ = true;
      stop_status_ = absl::CancelledError("the executor was destroyed");
    }
    for (auto& worker : workers_) {
      worker->cv.SignalAll();
      threads.push_back(std::move(worker->thread));
    }
  }
  for (std::thread& thread : threads) thread.join();
}

void Executor::StartWorker(Worker* worker, std::string name) {
  ++workers_running_;
  worker->thread = std::thread([this, worker, name = std::move(name)] {
    SetThreadName(name);
    WorkerLoop(worker);
  });
}

void Executor::AttachDevices(DeviceGroup device) {
  CHECK(device.comm != nullptr) << "a device group needs a communicator";
  absl::MutexLock lock(&mu_);
  CHECK(device_worker_ == nullptr) << "devices attached twice";
  cross_node_ = device.cross_node;
  device_memory_ = device.memory;
  auto worker = std::make_unique<Worker>();
  worker->comm = std::move(device.host);
  worker->device = std::move(device.comm);
  Worker* w = worker.get();
  device_worker_ = w;
  workers_.push_back(std::move(worker));
  // Stopped already: the group is aborted like one that was there when it
  // stopped, and the worker exits at once.
  if (stopped_ && drop_) w->device->Abort(stop_status_);
  StartWorker(w, "baton-gpu");
}

bool Executor::has_devices() const {
  absl::MutexLock lock(&mu_);
  return device_worker_ != nullptr;
}

void Executor::Queue(Launch launch, int32_t channel) {
  absl::MutexLock lock(&mu_);
  DCHECK(!stopped_) << "launch queued after Stop";
  Worker* worker = static_cast<size_t>(channel) == host_workers_
                       ? device_worker_
                       : workers_[channel].get();
  CHECK(worker != nullptr) << "a CUDA launch without devices";
  for (PartitionTask& task : launch) task.channel = channel;
  worker->queue.push_back(std::move(launch));
  worker->cv.Signal();
}

absl::Status Executor::RunInline(const PartitionTask& task) {
  Worker* worker;
  {
    absl::MutexLock lock(&mu_);
    worker = workers_[0].get();
  }
  const int64_t started_us = NowUs();
  int64_t reduced_us = started_us;
  const absl::Status status = Execute(*worker, task, &reduced_us);
  Record(task, started_us, reduced_us, NowUs(), status.ok());
  return status;
}

void Executor::Stop(const absl::Status& status, bool drop) {
  absl::MutexLock lock(&mu_);
  if (stopped_) return;
  stopped_ = true;
  stop_status_ = status;
  drop_ = drop;
  for (auto& worker : workers_) worker->cv.SignalAll();
  if (!drop) return;
  for (auto& worker : workers_) {
    if (worker->comm != nullptr) worker->comm->Abort(status);
    if (worker->device != nullptr) worker->device->Abort(status);
  }
}

bool Executor::finished() const {
  absl::MutexLock lock(&mu_);
  return workers_running_ == 0;
}

int64_t Executor::NowUs() const {
  return absl::ToUnixMicros(options_.clock->Now());
}

void Executor::WorkerLoop(Worker* worker) {
  while (true) {
    Launch launch;
    bool drop = false;
    {
      absl::MutexLock lock(&mu_);
      // Once stopped nothing new is queued: run (or drop) the rest, exit.
      while (worker->queue.empty() && !stopped_) worker->cv.Wait(&mu_);
      if (worker->queue.empty()) break;
      launch = std::move(worker->queue.front());
      worker->queue.pop_front();
      drop = drop_;
    }
    absl::Status status = absl::CancelledError("not started");
    if (!drop) {
      const bool host = worker->device == nullptr;
      // Host launches running now, this one included.
      const int running_at_start = host ? ++host_running_ : 0;
      const int64_t started_us = NowUs();
      int64_t reduced_us = started_us;
      // Only this thread runs collectives on worker->comm, or resets it.
      const uint64_t skipped_before =
          host && worker->comm != nullptr ? worker->comm->skipped_bytes() : 0;
      status = launch.size() == 1
                   ? Execute(*worker, launch.front(), &reduced_us)
                   : ExecuteFused(*worker, launch, &reduced_us);
      const int64_t done_us = NowUs();
      const int running_at_end = host ? host_running_-- : 0;
      int64_t bytes = 0;
      for (const PartitionTask& task : launch) {
        Record(task, started_us, reduced_us, done_us, status.ok());
        bytes += task.length;
      }
      const int64_t skipped =
          host && worker->comm != nullptr
              ? static_cast<int64_t>(worker->comm->skipped_bytes() -
                                     skipped_before)
              : 0;
      if (skipped > 0 && options_.bytes_skipped) {
        options_.bytes_skipped(skipped);
      }
      // The tuner's model is the ring allreduce's: other collectives' times
      // would read as a different link rate.
      if (options_.tuner != nullptr && status.ok() && host &&
          options_.num_nodes > 1 &&
          launch.front().op->kind == v1::COLLECTIVE_OP_PUSH_PULL) {
        // The channels share one link: while this collective ran, about
        // that many collectives' bytes crossed it, so that is what its time
        // measures (queueing behind the others is not latency).
        const double sharing = (running_at_start + running_at_end) / 2.0;
        // Only what crossed the wire takes time: of a ring allreduce's
        // 2(n-1)/n x bytes, less the blocks of zeros left out.
        const double wire = 2.0 * (options_.num_nodes - 1) /
                            options_.num_nodes * static_cast<double>(bytes);
        const double sent =
            wire > 0 ? std::max(0.0, 1.0 - static_cast<double>(skipped) / wire)
                     : 1.0;
        options_.tuner->Add(
            {static_cast<int64_t>(static_cast<double>(bytes) * sent * sharing),
             absl::Microseconds(done_us - reduced_us)});
      }
    }
    returned_(std::move(launch), std::move(status), drop);
  }
  // Closing the connections now (not at destruction) makes peers still
  // blocked on this node fail at once; Stop reaches them under mu_.
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<DeviceCommunicator> device;
  {
    absl::MutexLock lock(&mu_);
    comm = std::move(worker->comm);
    device = std::move(worker->device);
  }
  comm.reset();
  device.reset();
  absl::MutexLock lock(&mu_);
  --workers_running_;
}

absl::Status Executor::Failed(const absl::Status& status,
                              const std::string& what) const {
  return TransportError(status, what, options_.node_names, options_.node_rank);
}

void Executor::Record(const PartitionTask& task, int64_t started_us,
                      int64_t reduced_us, int64_t done_us, bool ok) const {
  if (options_.timeline == nullptr) return;
  const Operation& op = *task.op;
  v1::PartitionTrace trace;
  trace.set_tensor_id(op.tensor_id);
  trace.set_tensor(op.tensor_name);
  trace.set_step(op.step);
  trace.set_partition(task.partition);
  trace.set_num_partitions(task.num_partitions);
  trace.set_bytes(task.length);
  trace.set_priority(op.priority);
  trace.set_kind(CollectiveName(op.kind));
  trace.set_generation(options_.generation);
  trace.set_channel(task.channel);
  trace.set_launch_seq(task.seq);
  trace.set_submitted_us(task.submitted_us);
  trace.set_agreed_us(task.agreed_us);
  trace.set_launched_us(task.launched_us);
  trace.set_started_us(started_us);
  trace.set_reduced_us(reduced_us);
  trace.set_done_us(done_us);
  trace.set_ok(ok);
  options_.timeline->Add(std::move(trace));
}

absl::Status Executor::Execute(Worker& worker, const PartitionTask& task,
                               int64_t* reduced_us) {
  const Operation& op = *task.op;
  if (op.on_device) return ExecuteOnDevice(worker, task, reduced_us);
  const size_t element = ElementSize(op.dtype);
  const size_t count = static_cast<size_t>(task.length) / element;
  uint8_t* out = op.output + task.offset;
  CollectiveOptions opts;
  opts.timeout = options_.op_timeout;
  absl::Status status;
  if (op.kind == v1::COLLECTIVE_OP_ALLGATHER) {
    status = ExecuteAllgather(worker, task, opts, reduced_us);
  } else if (op.kind == v1::COLLECTIVE_OP_REDUCE_SCATTER) {
    status = ExecuteReduceScatter(worker, task, opts, reduced_us);
  } else if (op.kind == v1::COLLECTIVE_OP_ALLTOALL) {
    status = ExecuteAlltoall(worker, task, opts, reduced_us);
  } else if (op.kind == v1::COLLECTIVE_OP_BROADCAST) {
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
      ReduceInto(op.reduce_op, op.dtype, out, srcs.data(), n, count);
    }
    *reduced_us = NowUs();
    if (cross) {
      opts.op = op.reduce_op;
      if (average) opts.divisor = options_.world_size;
      status = worker.comm->Allreduce(out, count, op.dtype, opts);
    } else if (average) {
      DivideInPlace(op.dtype, out, count, options_.world_size);
    }
  }
  if (!status.ok()) return Failed(status, Describe(task));
  return status;
}

absl::InlinedVector<size_t, 16> Executor::NodeSpans(size_t per_rank) const {
  const size_t world = static_cast<size_t>(options_.world_size);
  absl::InlinedVector<size_t, 16> spans(options_.num_nodes,
                                        world / options_.num_nodes * per_rank);
  for (size_t n = 0; n < options_.local_sizes.size(); ++n) {
    spans[n] = static_cast<size_t>(options_.local_sizes[n]) * per_rank;
  }
  return spans;
}

absl::Status Executor::ExecuteAllgather(Worker& worker,
                                        const PartitionTask& task,
                                        const CollectiveOptions& opts,
                                        int64_t* reduced_us) {
  // Ranks sit in node order (rank_offset), so each node's ranks are one
  // span of the result. A whole tensor gathers in the output itself; a
  // partition's pieces lie `block` apart there, so they gather packed in
  // the worker's buffer and are spread out afterwards.
  const Operation& op = *task.op;
  const size_t piece = static_cast<size_t>(task.length);
  const size_t block = static_cast<size_t>(op.size_bytes);
  const size_t world = static_cast<size_t>(options_.world_size);
  const bool whole = piece == block;
  if (!whole && worker.fused.size() < piece * world) {
    worker.fused.resize(piece * world);
  }
  uint8_t* gathered = whole ? op.output : worker.fused.data();
  for (size_t i = 0; i < op.inputs.size(); ++i) {
    std::memcpy(gathered + (op.rank_offset + i) * piece,
                op.inputs[i] + task.offset, piece);
  }
  *reduced_us = NowUs();
  if (options_.num_nodes > 1) {
    const absl::Status status =
        worker.comm->Allgather(gathered, NodeSpans(piece), opts);
    if (!status.ok()) return status;
  }
  if (!whole) {
    for (size_t r = 0; r < world; ++r) {
      std::memcpy(op.output + r * block + task.offset, gathered + r * piece,
                  piece);
    }
  }
  return absl::OkStatus();
}

absl::Status Executor::ExecuteReduceScatter(Worker& worker,
                                            const PartitionTask& task,
                                            CollectiveOptions opts,
                                            int64_t* reduced_us) {
  // Every rank's slice of this partition, reduced over the local inputs,
  // packed in rank order in the worker's buffer (ranks sit in node order,
  // so each node's are one span); the nodes reduce-scatter the spans, and
  // each local trainer's slice goes to its place in the output.
  const Operation& op = *task.op;
  const size_t piece = static_cast<size_t>(task.length);
  const size_t slice = static_cast<size_t>(op.size_bytes);
  const size_t world = static_cast<size_t>(options_.world_size);
  const size_t element = ElementSize(op.dtype);
  const size_t n = op.inputs.size();
  if (worker.fused.size() < piece * world) worker.fused.resize(piece * world);
  uint8_t* packed = worker.fused.data();
  absl::InlinedVector<const void*, 8> srcs(n);
  for (size_t r = 0; r < world; ++r) {
    for (size_t i = 0; i < n; ++i) {
      srcs[i] = op.inputs[i] + r * slice + task.offset;
    }
    ReduceInto(op.reduce_op, op.dtype, packed + r * piece, srcs.data(), n,
               piece / element);
  }
  *reduced_us = NowUs();
  const bool average = op.average && options_.world_size > 1;
  uint8_t* mine = packed + static_cast<size_t>(op.rank_offset) * piece;
  if (options_.num_nodes > 1) {
    const absl::InlinedVector<size_t, 16> counts = NodeSpans(piece / element);
    opts.op = op.reduce_op;
    if (average) opts.divisor = options_.world_size;
    const absl::Status status =
        worker.comm->ReduceScatter(packed, counts, op.dtype, opts);
    if (!status.ok()) return status;
  } else if (average) {
    DivideInPlace(op.dtype, mine, n * piece / element, options_.world_size);
  }
  for (size_t i = 0; i < n; ++i) {
    std::memcpy(op.output + i * slice + task.offset, mine + i * piece, piece);
  }
  return absl::OkStatus();
}

absl::Status Executor::ExecuteAlltoall(Worker& worker,
                                       const PartitionTask& task,
                                       const CollectiveOptions& opts,
                                       int64_t* reduced_us) {
  // Block d of local trainer i's input goes to rank d, as block
  // rank_offset + i of its output. Node s's chunk for node m holds, for
  // each of m's ranks in order, this partition of the block from each of
  // s's ranks in order: piece * trainers(s) * trainers(m) bytes.
  const Operation& op = *task.op;
  const size_t piece = static_cast<size_t>(task.length);
  const size_t block = static_cast<size_t>(op.size_bytes);
  const size_t world = static_cast<size_t>(options_.world_size);
  const size_t nodes = static_cast<size_t>(options_.num_nodes);
  const size_t n = op.inputs.size();
  const absl::InlinedVector<size_t, 16> trainers = NodeSpans(1);
  absl::InlinedVector<size_t, 16> first(nodes + 1, 0);  // a node's first rank
  for (size_t m = 0; m < nodes; ++m) first[m + 1] = first[m] + trainers[m];
  std::vector<size_t> lengths(nodes * nodes);
  for (size_t s = 0; s < nodes; ++s) {
    for (size_t m = 0; m < nodes; ++m) {
      lengths[s * nodes + m] = piece * trainers[s] * trainers[m];
    }
  }
  *reduced_us = NowUs();
  if (n == 1 && piece == block && nodes > 1) {
    // Laid out as the nodes exchange them already.
    return worker.comm->Alltoall(op.inputs[0], op.output, lengths, opts);
  }
  const size_t bytes = piece * n * world;
  if (worker.fused.size() < 2 * bytes) worker.fused.resize(2 * bytes);
  uint8_t* packed = worker.fused.data();
  uint8_t* at = packed;
  for (size_t d = 0; d < world; ++d) {
    for (size_t i = 0; i < n; ++i) {
      std::memcpy(at, op.inputs[i] + d * block + task.offset, piece);
      at += piece;
    }
  }
  uint8_t* received = packed;
  if (nodes > 1) {
    received = packed + bytes;
    const absl::Status status =
        worker.comm->Alltoall(packed, received, lengths, opts);
    if (!status.ok()) return status;
  }
  // From node s: for each local trainer j, the pieces of s's ranks.
  at = received;
  for (size_t s = 0; s < nodes; ++s) {
    for (size_t j = 0; j < n; ++j) {
      uint8_t* output = op.output + j * world * block;
      for (size_t source = first[s]; source < first[s + 1]; ++source) {
        std::memcpy(output + source * block + task.offset, at, piece);
        at += piece;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Executor::ExecuteFused(Worker& worker, const Launch& launch,
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
    ReduceInto(op.reduce_op, op.dtype, packed + at, srcs.data(), n,
               static_cast<size_t>(task.length) / element);
    at += static_cast<size_t>(task.length);
  }
  *reduced_us = NowUs();
  CollectiveOptions opts;
  opts.timeout = options_.op_timeout;
  opts.op = first.reduce_op;
  if (first.average && options_.world_size > 1) {
    opts.divisor = options_.world_size;
  }
  const absl::Status status =
      worker.comm->Allreduce(packed, total / element, first.dtype, opts);
  if (!status.ok()) return Failed(status, DescribeFused(launch));
  at = 0;
  for (const PartitionTask& task : launch) {
    std::memcpy(task.op->output + task.offset, packed + at,
                static_cast<size_t>(task.length));
    at += static_cast<size_t>(task.length);
  }
  return absl::OkStatus();
}

absl::Status Executor::AbortedBeforeWriteBack() const {
  absl::MutexLock lock(&mu_);
  if (stopped_ && drop_) return stop_status_;
  return absl::OkStatus();
}

absl::Status Executor::ExecuteOnDevice(Worker& worker,
                                       const PartitionTask& task,
                                       int64_t* reduced_us) {
  const Operation& op = *task.op;
  DeviceCommunicator& device = *worker.device;
  const int local = device.local_devices();
  // Named only on failure: this runs for every partition.
  const auto fail = [&](const absl::Status& status) {
    return Failed(status, Describe(task));
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
      status =
          device.DeviceAllreduce(buffers, count, op.dtype,
                                 op.average ? DeviceReduceOp::kAverage
                                            : DeviceReduceOpOf(op.reduce_op),
                                 opts);
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
    status =
        device.DeviceReduce(buffers, count, op.dtype,
                            average && !cross ? DeviceReduceOp::kAverage
                                              : DeviceReduceOpOf(op.reduce_op),
                            /*root=*/0, opts);
  }
  *reduced_us = NowUs();
  if (status.ok() && cross) {
    status = device_memory_->CopyToHost(stage, buffers[0], bytes, 0);
    if (status.ok()) {
      opts.op = op.reduce_op;
      if (average) opts.divisor = options_.world_size;
      status = worker.comm->Allreduce(stage, count, op.dtype, opts);
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

std::string Executor::Describe(const PartitionTask& task) const {
  const Operation& op = *task.op;
  return absl::StrCat(CollectiveName(op.kind), " of tensor \"", op.tensor_name,
                      "\" step ", op.step, " partition ", task.partition + 1,
                      "/", task.num_partitions, " (", task.length,
                      " bytes) in job \"", options_.job, "\" generation ",
                      options_.generation);
}

std::string Executor::DescribeFused(const Launch& launch) const {
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

}  // namespace baton::agent
