// FakeGpuApi's NCCL: groups, group calls and collectives.
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/reduce.h"
#include "baton/v1/common.pb.h"
#include "tests/unit/agent/transport/fake_gpu_api.h"

namespace baton::agent {

namespace {

v1::DataType ToDataType(gpu::NcclDataType type) {
  switch (type) {
    case gpu::NcclDataType::kInt8:
      return v1::DATA_TYPE_INT8;
    case gpu::NcclDataType::kUint8:
      return v1::DATA_TYPE_UINT8;
    case gpu::NcclDataType::kInt32:
      return v1::DATA_TYPE_INT32;
    case gpu::NcclDataType::kInt64:
      return v1::DATA_TYPE_INT64;
    case gpu::NcclDataType::kFloat16:
      return v1::DATA_TYPE_FLOAT16;
    case gpu::NcclDataType::kFloat32:
      return v1::DATA_TYPE_FLOAT32;
    case gpu::NcclDataType::kFloat64:
      return v1::DATA_TYPE_FLOAT64;
    case gpu::NcclDataType::kBfloat16:
      return v1::DATA_TYPE_BFLOAT16;
  }
  return v1::DATA_TYPE_UNSPECIFIED;
}

}  // namespace

void FakeGpuApi::Compute(FakeNcclFabric::Pending& p, int kind) {
  const int ranks = static_cast<int>(p.send.size());
  const v1::DataType dtype = ToDataType(p.type);
  const size_t bytes = p.count * ElementSize(dtype);
  std::vector<char> result(bytes);
  if (kind == 1) {  // broadcast
    std::memcpy(result.data(), p.send[p.root], bytes);
  } else {
    const v1::ReduceOp op = p.op == gpu::NcclRedOp::kMin   ? v1::REDUCE_OP_MIN
                            : p.op == gpu::NcclRedOp::kMax ? v1::REDUCE_OP_MAX
                            : p.op == gpu::NcclRedOp::kProd
                                ? v1::REDUCE_OP_PRODUCT
                                : v1::REDUCE_OP_SUM;
    ReduceInto(op, dtype, result.data(), p.send.data(), ranks, p.count);
    if (p.op == gpu::NcclRedOp::kAvg) {
      DivideInPlace(dtype, result.data(), p.count, ranks);
    }
  }
  for (int rank = 0; rank < ranks; ++rank) {
    if (kind == 2 && rank != p.root) continue;  // reduce: the root only
    std::memcpy(p.receive[rank], result.data(), bytes);
  }
}

gpu::NcclResult FakeGpuApi::GetVersion(int* version) {
  *version = 22809;
  return gpu::NcclResult::kSuccess;
}

gpu::NcclResult FakeGpuApi::GetUniqueId(gpu::NcclUniqueId* id) {
  absl::MutexLock lock(&mu_);
  id->bytes.fill(0);
  const std::string name = absl::StrCat("fake-nccl-", fabric_->next_id_++);
  std::copy(name.begin(), name.end(), id->bytes.begin());
  return gpu::NcclResult::kSuccess;
}

gpu::NcclResult FakeGpuApi::CommInitRankNonBlocking(gpu::NcclComm* handle,
                                                    int ranks,
                                                    const gpu::NcclUniqueId& id,
                                                    int rank) {
  absl::MutexLock lock(&mu_);
  const std::string key(id.bytes.data(), id.bytes.size());
  std::shared_ptr<FakeNcclFabric::Group>& group = fabric_->groups_[key];
  if (group == nullptr) group = std::make_shared<FakeNcclFabric::Group>(ranks);
  if (static_cast<int>(group->members.size()) != ranks || rank < 0 ||
      rank >= ranks) {
    Misuse(absl::StrCat("ncclCommInitRank of rank ", rank, " of ", ranks,
                        " in a group of ", group->members.size()));
    return gpu::NcclResult::kInvalidArgument;
  }
  auto comm = std::make_unique<Comm>();
  comm->group = group;
  comm->rank = rank;
  comm->device = CurrentDevice();
  comm->joined = !stall_init_;
  if (comm->joined) {
    FakeNcclFabric::Group::Member& member = group->members[rank];
    if (member.joined) {
      Misuse(absl::StrCat("rank ", rank, " initialized twice"));
      return gpu::NcclResult::kInvalidUsage;
    }
    member = {this, comm->device, true};
    ++group->joined;
  }
  *handle = ToHandle<gpu::NcclComm>(comm.get());
  comms_.push_back(std::move(comm));
  group_calls_[std::this_thread::get_id()].had_calls = true;
  return gpu::NcclResult::kInProgress;
}

gpu::NcclResult FakeGpuApi::Enqueue(Collective c, gpu::NcclComm comm_handle,
                                    gpu::Stream stream_handle) {
  static constexpr const char* kNames[] = {"ncclAllReduce", "ncclBroadcast",
                                           "ncclReduce"};
  const char* call = kNames[c.kind];
  absl::MutexLock lock(&mu_);
  c.comm = FindComm(comm_handle, call);
  c.stream = FindStream(stream_handle, call);
  if (c.comm == nullptr || c.stream == nullptr) {
    return gpu::NcclResult::kInvalidArgument;
  }
  Comm* comm = c.comm;
  if (!comm->ready || !comm->unlaunched.empty()) {
    Misuse(absl::StrCat(call, " while the communicator is not ready"));
    return gpu::NcclResult::kInvalidUsage;
  }
  if (comm->error != gpu::NcclResult::kSuccess) return comm->error;
  if (c.stream->device != comm->device) {
    Misuse(absl::StrCat(call, " on a stream of another device"));
    return gpu::NcclResult::kInvalidArgument;
  }
  const size_t bytes = c.count * ElementSize(ToDataType(c.type));
  if (!IsDeviceMemory(c.send, bytes, comm->device) ||
      !IsDeviceMemory(c.receive, bytes, comm->device)) {
    comm->last_error = absl::StrCat(
        "fake NCCL: ", call, " of ", bytes,
        " bytes: a buffer is not memory of CUDA device ", comm->device);
    return gpu::NcclResult::kInvalidArgument;
  }
  c.sequence = comm->next_sequence++;
  c.hang = hang_;
  c.fail = fail_;
  GroupCall& group = group_calls_[std::this_thread::get_id()];
  group.had_calls = true;
  if (group.depth > 0) {
    group.held.push_back(c);
    return gpu::NcclResult::kSuccess;
  }
  comm->unlaunched.emplace_back(c.stream,
                                [this, c] { RunCollective(c.comm, c); });
  return gpu::NcclResult::kInProgress;
}

void FakeGpuApi::RunCollective(Comm* comm, const Collective& c) {
  if (comm->aborted || stopping_) return;
  if (c.fail != gpu::NcclResult::kSuccess) {
    comm->error = c.fail;
    comm->last_error = "fake NCCL: injected failure";
    return;
  }
  ++waiting_collectives_;
  if (c.hang) {
    const auto aborted = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return comm->aborted || stopping_;
    };
    mu_.Await(absl::Condition(&aborted));
    --waiting_collectives_;
    return;
  }
  FakeNcclFabric::Group& group = *comm->group;
  const int ranks = static_cast<int>(group.members.size());
  FakeNcclFabric::Pending& p = group.collectives[c.sequence];
  if (p.arrived == 0) {
    p.kind = c.kind;
    p.count = c.count;
    p.type = c.type;
    p.op = c.op;
    p.root = c.root;
    p.send.assign(ranks, nullptr);
    p.receive.assign(ranks, nullptr);
  } else if (p.kind != c.kind || p.count != c.count || p.type != c.type ||
             p.op != c.op || p.root != c.root) {
    comm->error = gpu::NcclResult::kInvalidUsage;
    comm->last_error = absl::StrCat("fake NCCL: rank ", comm->rank,
                                    " called another collective than its "
                                    "peers as collective ",
                                    c.sequence);
    --waiting_collectives_;
    return;
  }
  p.send[comm->rank] = c.send;
  p.receive[comm->rank] = c.receive;
  if (++p.arrived == ranks) {
    Compute(p, p.kind);
    p.done = true;
  }
  const auto finished = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return p.done || comm->aborted || stopping_;
  };
  mu_.Await(absl::Condition(&finished));
  --waiting_collectives_;
  if (++p.departed == ranks) group.collectives.erase(c.sequence);
}

gpu::NcclResult FakeGpuApi::AllReduce(const void* send, void* receive,
                                      size_t count, gpu::NcclDataType type,
                                      gpu::NcclRedOp op, gpu::NcclComm comm,
                                      gpu::Stream stream) {
  return Enqueue({Collective::kAllReduce, send, receive, count, type, op, 0},
                 comm, stream);
}

gpu::NcclResult FakeGpuApi::Broadcast(const void* send, void* receive,
                                      size_t count, gpu::NcclDataType type,
                                      int root, gpu::NcclComm comm,
                                      gpu::Stream stream) {
  return Enqueue({Collective::kBroadcast, send, receive, count, type,
                  gpu::NcclRedOp::kSum, root},
                 comm, stream);
}

gpu::NcclResult FakeGpuApi::Reduce(const void* send, void* receive,
                                   size_t count, gpu::NcclDataType type,
                                   gpu::NcclRedOp op, int root,
                                   gpu::NcclComm comm, gpu::Stream stream) {
  return Enqueue({Collective::kReduce, send, receive, count, type, op, root},
                 comm, stream);
}

gpu::NcclResult FakeGpuApi::GroupStart() {
  absl::MutexLock lock(&mu_);
  GroupCall& group = group_calls_[std::this_thread::get_id()];
  if (group.depth++ == 0) group.had_calls = false;
  return gpu::NcclResult::kSuccess;
}

gpu::NcclResult FakeGpuApi::GroupEnd() {
  absl::MutexLock lock(&mu_);
  GroupCall& group = group_calls_[std::this_thread::get_id()];
  if (group.depth == 0) {
    Misuse("ncclGroupEnd without ncclGroupStart");
    return gpu::NcclResult::kInvalidUsage;
  }
  if (--group.depth > 0) return gpu::NcclResult::kSuccess;
  for (const Collective& c : group.held) {
    c.comm->unlaunched.emplace_back(c.stream,
                                    [this, c] { RunCollective(c.comm, c); });
  }
  group.held.clear();
  return group.had_calls ? gpu::NcclResult::kInProgress
                         : gpu::NcclResult::kSuccess;
}

gpu::NcclResult FakeGpuApi::CommGetAsyncError(gpu::NcclComm handle,
                                              gpu::NcclResult* state) {
  absl::MutexLock lock(&mu_);
  Comm* comm = FindComm(handle, "ncclCommGetAsyncError");
  if (comm == nullptr) return gpu::NcclResult::kInvalidArgument;
  if (!comm->ready) {
    FakeNcclFabric::Group& group = *comm->group;
    if (!comm->joined ||
        group.joined < static_cast<int>(group.members.size())) {
      *state = gpu::NcclResult::kInProgress;
      return gpu::NcclResult::kSuccess;
    }
    comm->ready = true;
    for (size_t other = 0; other < group.members.size(); ++other) {
      const FakeNcclFabric::Group::Member& member = group.members[other];
      if (static_cast<int>(other) != comm->rank && member.api == this &&
          member.device == comm->device) {
        comm->error = gpu::NcclResult::kInvalidUsage;
        comm->last_error = absl::StrCat("Duplicate GPU detected : rank ",
                                        comm->rank, " and rank ", other,
                                        " both on CUDA device ", comm->device);
      }
    }
  }
  if (!comm->unlaunched.empty()) {
    for (auto& [stream, task] : comm->unlaunched) {
      Push(stream, std::move(task));
    }
    comm->unlaunched.clear();
    *state = gpu::NcclResult::kInProgress;
    return gpu::NcclResult::kSuccess;
  }
  *state = comm->error;
  return gpu::NcclResult::kSuccess;
}

gpu::NcclResult FakeGpuApi::CommAbort(gpu::NcclComm handle) {
  absl::MutexLock lock(&mu_);
  Comm* comm = FindComm(handle, "ncclCommAbort");
  if (comm == nullptr) return gpu::NcclResult::kInvalidArgument;
  comm->aborted = true;
  ++aborted_comms_;
  return gpu::NcclResult::kSuccess;
}

std::string FakeGpuApi::NcclErrorText(gpu::NcclResult result) {
  switch (result) {
    case gpu::NcclResult::kSuccess:
      return "no error";
    case gpu::NcclResult::kUnhandledCudaError:
      return "unhandled cuda error";
    case gpu::NcclResult::kSystemError:
      return "unhandled system error";
    case gpu::NcclResult::kInternalError:
      return "internal error";
    case gpu::NcclResult::kInvalidArgument:
      return "invalid argument";
    case gpu::NcclResult::kInvalidUsage:
      return "invalid usage";
    case gpu::NcclResult::kRemoteError:
      return "remote process exited or there was a network error";
    case gpu::NcclResult::kInProgress:
      return "NCCL operation in progress";
  }
  return "unknown result code";
}

std::string FakeGpuApi::NcclLastError(gpu::NcclComm handle) {
  absl::MutexLock lock(&mu_);
  for (auto& comm : comms_) {
    if (ToHandle<gpu::NcclComm>(comm.get()) == handle) return comm->last_error;
  }
  return "";
}

}  // namespace baton::agent
