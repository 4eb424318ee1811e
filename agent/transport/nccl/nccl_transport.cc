#include "agent/transport/nccl/nccl_transport.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "agent/transport/nccl/local_gpus.h"
#include "agent/transport/nccl/nccl_communicator.h"

namespace baton::agent {
namespace {

std::string DevicesKey(const std::string& prefix, int node_rank) {
  return StoreKey(prefix, absl::StrCat("nccl/devices/", node_rank));
}

std::string GroupKey(const std::string& prefix, const std::string& name,
                     const std::string& key) {
  return StoreKey(prefix, absl::StrCat("nccl/", name, "/", key));
}

// The node ranks other than `self` among `num_nodes` whose `key(rank)` is
// not in the store now (asked without waiting), as "node rank(s) 1, 2".
std::string MissingNodes(KeyValueStore& store, int num_nodes, int self,
                         const std::function<std::string(int)>& key) {
  std::vector<int> missing;
  for (int rank = 0; rank < num_nodes; ++rank) {
    if (rank == self) continue;
    const auto probe = store.Get({key(rank)}, std::chrono::milliseconds(0));
    if (probe.status().code() == absl::StatusCode::kDeadlineExceeded) {
      missing.push_back(rank);
    }
  }
  if (missing.empty()) return "";
  return absl::StrCat("node rank(s) ", absl::StrJoin(missing, ", "));
}

// `status` from the store, with `what` in front; the code is kept.
absl::Status StoreError(const std::string& what, const absl::Status& status) {
  return absl::Status(status.code(),
                      absl::StrCat(what, " failed: ", status.message()));
}

}  // namespace

NcclTransport::Factory NcclTransport::MakeFactory(gpu::GpuApi* api,
                                                  std::vector<int> ordinals) {
  return [api,
          ordinals = std::move(ordinals)](const std::vector<int>& local_devices)
             -> absl::StatusOr<std::unique_ptr<DeviceTransport>> {
    Options options;
    for (int index : local_devices) {
      if (index < 0 || index >= static_cast<int>(ordinals.size())) {
        return absl::InvalidArgumentError(
            absl::StrCat("local device ", index, " is not one of the agent's ",
                         ordinals.size(), " GPUs"));
      }
      options.devices.push_back(ordinals[index]);
    }
    auto transport = Create(api, std::move(options));
    if (!transport.ok()) return transport.status();
    return std::unique_ptr<DeviceTransport>(std::move(*transport));
  };
}

absl::StatusOr<std::unique_ptr<NcclTransport>> NcclTransport::Create(
    gpu::GpuApi* api, Options options) {
  if (api == nullptr) {
    return absl::InvalidArgumentError("NcclTransport::Create: api is null");
  }
  if (options.devices.empty()) {
    return absl::InvalidArgumentError(
        "the NCCL transport needs at least one CUDA device");
  }
  const absl::StatusOr<int> count = CountCudaDevices(*api);
  if (!count.ok()) return count.status();
  for (size_t i = 0; i < options.devices.size(); ++i) {
    const int device = options.devices[i];
    if (device < 0 || device >= *count) {
      return absl::InvalidArgumentError(
          absl::StrCat("CUDA device ", device,
                       " does not exist: this machine "
                       "has ",
                       *count, " (0..", *count - 1, ")"));
    }
    if (std::find(options.devices.begin(), options.devices.begin() + i,
                  device) != options.devices.begin() + i) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CUDA device ", device,
          " is listed twice: NCCL allows one rank per GPU in a group"));
    }
  }
  Clock* clock = options.clock != nullptr ? options.clock : Clock::Real();
  return std::unique_ptr<NcclTransport>(
      new NcclTransport(api, std::move(options.devices), clock));
}

NcclTransport::NcclTransport(gpu::GpuApi* api, std::vector<int> devices,
                             Clock* clock)
    : api_(api), devices_(std::move(devices)), clock_(clock) {}

std::chrono::milliseconds NcclTransport::Left(absl::Time deadline) const {
  return std::max(absl::ToChronoMilliseconds(deadline - clock_->Now()),
                  std::chrono::milliseconds(0));
}

absl::Status NcclTransport::AgreeOnDevices(const ConnectRequest& request,
                                           absl::Time deadline) const {
  const int local = static_cast<int>(devices_.size());
  const std::string what =
      absl::StrCat("agreeing on the devices per node among ", request.num_nodes,
                   " nodes (node rank ", request.node_rank, ", keys under \"",
                   request.prefix, "\")");
  if (absl::Status s = request.store->Set(
          DevicesKey(request.prefix, request.node_rank), std::to_string(local));
      !s.ok()) {
    return StoreError(what, s);
  }
  std::vector<std::string> keys;
  for (int rank = 0; rank < request.num_nodes; ++rank) {
    keys.push_back(DevicesKey(request.prefix, rank));
  }
  const absl::StatusOr<std::vector<std::string>> counts =
      request.store->Get(keys, Left(deadline));
  if (counts.status().code() == absl::StatusCode::kDeadlineExceeded) {
    const std::string missing = MissingNodes(
        *request.store, request.num_nodes, request.node_rank,
        [&](int rank) { return DevicesKey(request.prefix, rank); });
    return absl::DeadlineExceededError(
        absl::StrCat(what, " timed out after ", request.timeout.count(),
                     " ms: ", missing.empty() ? "a peer" : missing,
                     " did not publish their device count (",
                     counts.status().message(), ")"));
  }
  if (!counts.ok()) return StoreError(what, counts.status());
  for (int rank = 0; rank < request.num_nodes; ++rank) {
    int theirs = 0;
    if (!absl::SimpleAtoi((*counts)[rank], &theirs)) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, ": node rank ", rank, " published \"",
                       (*counts)[rank], "\" as its device count"));
    }
    if (theirs != local) {
      return absl::FailedPreconditionError(absl::StrCat(
          what, ": node rank ", rank, " drives ", theirs,
          " CUDA device(s) and this node ", local,
          "; NCCL's ranks are node rank x devices per node + local index, so "
          "every node must drive the same number of devices"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<gpu::NcclUniqueId> NcclTransport::ExchangeUniqueId(
    const ConnectRequest& request, const std::string& name,
    absl::Time deadline) const {
  const std::string key = GroupKey(request.prefix, name, "unique_id");
  const std::string what =
      absl::StrCat("exchanging the unique id of NCCL group ", name,
                   " (node rank ", request.node_rank, ", key \"", key, "\")");
  gpu::NcclUniqueId id;
  if (request.node_rank == 0) {
    const gpu::NcclResult result = api_->GetUniqueId(&id);
    if (result != gpu::NcclResult::kSuccess) {
      return NcclError(*api_, absl::StrCat(what, ": ncclGetUniqueId"), result,
                       nullptr);
    }
    const absl::Status set =
        request.store->Set(key, std::string(id.bytes.data(), id.bytes.size()));
    if (!set.ok()) return StoreError(what, set);
    return id;
  }
  const absl::StatusOr<std::vector<std::string>> value =
      request.store->Get({key}, Left(deadline));
  if (value.status().code() == absl::StatusCode::kDeadlineExceeded) {
    return absl::DeadlineExceededError(
        absl::StrCat(what, " timed out after ", request.timeout.count(),
                     " ms: node rank 0 did not publish it (",
                     value.status().message(), ")"));
  }
  if (!value.ok()) return StoreError(what, value.status());
  const std::string& bytes = value->front();
  if (bytes.size() != id.bytes.size()) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": node rank 0 published ", bytes.size(),
                     " bytes, NCCL's id has ", id.bytes.size(),
                     " (do the nodes run different baton builds?)"));
  }
  std::copy(bytes.begin(), bytes.end(), id.bytes.begin());
  return id;
}

absl::StatusOr<std::unique_ptr<DeviceCommunicator>> NcclTransport::Initialize(
    const std::string& name, const std::string& what, int node_rank,
    int num_nodes, const gpu::NcclUniqueId& id, absl::Time deadline,
    std::chrono::milliseconds timeout,
    const std::function<std::string()>& missing) const {
  const int local = static_cast<int>(devices_.size());
  std::vector<NcclLocalRank> ranks(devices_.size());
  for (size_t i = 0; i < ranks.size(); ++i) {
    NcclLocalRank& rank = ranks[i];
    rank.device = devices_[i];
    gpu::CudaError error = api_->SetDevice(rank.device);
    if (error == gpu::kCudaSuccess) error = api_->StreamCreate(&rank.stream);
    if (error == gpu::kCudaSuccess) error = api_->EventCreate(&rank.done);
    if (error != gpu::kCudaSuccess) {
      ReleaseLocalRanks(*api_, ranks);
      return CudaError(*api_,
                       absl::StrCat(what, ": creating a stream and an event"),
                       rank.device, error);
    }
  }
  // One thread initializing several ranks must do it inside one group.
  gpu::NcclResult result = api_->GroupStart();
  if (result != gpu::NcclResult::kSuccess) {
    ReleaseLocalRanks(*api_, ranks);
    return NcclError(*api_, absl::StrCat(what, ": ncclGroupStart"), result,
                     nullptr);
  }
  absl::Status status;
  for (size_t i = 0; i < ranks.size() && result == gpu::NcclResult::kSuccess;
       ++i) {
    const gpu::CudaError error = api_->SetDevice(ranks[i].device);
    if (error != gpu::kCudaSuccess) {
      status = CudaError(*api_, what, ranks[i].device, error);
      break;
    }
    result = api_->CommInitRankNonBlocking(&ranks[i].comm, num_nodes * local,
                                           id, node_rank * local + i);
    if (result == gpu::NcclResult::kInProgress) {
      result = gpu::NcclResult::kSuccess;
    }
    if (result != gpu::NcclResult::kSuccess) {
      status = NcclError(*api_, absl::StrCat(what, ": ncclCommInitRankConfig"),
                         result, ranks[i].comm);
    }
  }
  result = api_->GroupEnd();
  if (status.ok() && result != gpu::NcclResult::kSuccess &&
      result != gpu::NcclResult::kInProgress) {
    status = NcclError(*api_, absl::StrCat(what, ": ncclGroupEnd"), result,
                       ranks.front().comm);
  }
  if (status.ok()) {
    absl::Mutex mu;
    status = PollUntilDone(*clock_, deadline, mu, nullptr, [&] {
      return NcclStatesSettled(*api_, ranks, what);
    });
  }
  if (status.code() == absl::StatusCode::kDeadlineExceeded &&
      status.message().empty()) {
    const std::string who = missing();
    status = absl::DeadlineExceededError(absl::StrCat(
        what, " timed out after ", timeout.count(), " ms: ",
        who.empty() ? "every node started NCCL's initialization and it did "
                      "not finish (can the nodes reach each other on "
                      "NCCL_SOCKET_IFNAME? NCCL_DEBUG=INFO says more)"
                    : absl::StrCat(who,
                                   " did not start NCCL's "
                                   "initialization")));
  }
  if (!status.ok()) {
    ReleaseLocalRanks(*api_, ranks);
    return status;
  }
  return std::make_unique<NcclCommunicator>(api_, clock_, name, node_rank,
                                            num_nodes, std::move(ranks));
}

absl::StatusOr<std::vector<std::unique_ptr<DeviceCommunicator>>>
NcclTransport::ConnectDevices(const ConnectRequest& request) {
  if (absl::Status valid = ValidateConnectRequest(request); !valid.ok()) {
    return valid;
  }
  const absl::Time deadline = clock_->Now() + absl::FromChrono(request.timeout);
  if (absl::Status s = AgreeOnDevices(request, deadline); !s.ok()) return s;
  std::vector<std::unique_ptr<DeviceCommunicator>> communicators;
  for (int i = 0; i < request.count; ++i) {
    const std::string name = absl::StrCat("c", i);
    const absl::StatusOr<gpu::NcclUniqueId> id =
        ExchangeUniqueId(request, name, deadline);
    if (!id.ok()) return id.status();
    const std::string what = absl::StrCat(
        "connecting NCCL group ", name, " of ", request.num_nodes, " nodes x ",
        devices_.size(), " device(s) (node rank ", request.node_rank,
        ", keys under \"", GroupKey(request.prefix, name, ""), "\")");
    const auto started = [&](int rank) {
      return GroupKey(request.prefix, name, absl::StrCat("started/", rank));
    };
    if (absl::Status s = request.store->Set(started(request.node_rank), "");
        !s.ok()) {
      return StoreError(what, s);
    }
    absl::StatusOr<std::unique_ptr<DeviceCommunicator>> communicator =
        Initialize(name, what, request.node_rank, request.num_nodes, *id,
                   deadline, request.timeout, [&] {
                     return MissingNodes(*request.store, request.num_nodes,
                                         request.node_rank, started);
                   });
    if (!communicator.ok()) return communicator.status();
    communicators.push_back(std::move(communicator).value());
  }
  return communicators;
}

absl::StatusOr<std::unique_ptr<NegotiationWire>>
NcclTransport::ConnectNegotiation(const ConnectRequest&) {
  return absl::UnimplementedError(
      "negotiation rounds run on host TCP connections "
      "(GlooTransport::ConnectNegotiation), never on NCCL");
}

absl::StatusOr<std::vector<std::unique_ptr<Communicator>>>
NcclTransport::Connect(const ConnectRequest& request) {
  absl::StatusOr<std::vector<std::unique_ptr<DeviceCommunicator>>> connected =
      ConnectDevices(request);
  if (!connected.ok()) return connected.status();
  std::vector<std::unique_ptr<Communicator>> communicators;
  for (auto& communicator : *connected) {
    communicators.push_back(std::move(communicator));
  }
  return communicators;
}

absl::StatusOr<std::unique_ptr<DeviceCommunicator>> NcclTransport::ConnectLocal(
    std::chrono::milliseconds timeout) {
  if (timeout <= std::chrono::milliseconds(0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("connecting the local NCCL group: the timeout is ",
                     timeout.count(), " ms; give a positive timeout"));
  }
  const std::string what = absl::StrCat("connecting the local NCCL group of ",
                                        devices_.size(), " device(s)");
  gpu::NcclUniqueId id;
  const gpu::NcclResult result = api_->GetUniqueId(&id);
  if (result != gpu::NcclResult::kSuccess) {
    return NcclError(*api_, absl::StrCat(what, ": ncclGetUniqueId"), result,
                     nullptr);
  }
  return Initialize("local", what, 0, 1, id,
                    clock_->Now() + absl::FromChrono(timeout), timeout,
                    [] { return std::string(); });
}

}  // namespace baton::agent
