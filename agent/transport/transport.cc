#include "agent/transport/transport.h"

#include <cstring>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "agent/reduce.h"
#include "agent/transport/device_communicator.h"

namespace baton::agent {

absl::Status ValidateConnectRequest(const ConnectRequest& request) {
  if (request.num_nodes < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ConnectRequest.num_nodes is ", request.num_nodes, ": give 1 or more"));
  }
  if (request.node_rank < 0 || request.node_rank >= request.num_nodes) {
    return absl::InvalidArgumentError(
        absl::StrCat("ConnectRequest.node_rank is ", request.node_rank,
                     ": give 0..", request.num_nodes - 1));
  }
  if (request.count < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ConnectRequest.count is ", request.count, ": give 1 or more"));
  }
  if (request.store == nullptr) {
    return absl::InvalidArgumentError("ConnectRequest.store is null");
  }
  if (request.prefix.empty()) {
    return absl::InvalidArgumentError(
        "ConnectRequest.prefix is empty: give a prefix unique to this "
        "generation and rebuild");
  }
  if (request.timeout <= std::chrono::milliseconds(0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("ConnectRequest.timeout is ", request.timeout.count(),
                     " ms: give a positive timeout"));
  }
  return absl::OkStatus();
}

std::string StoreKey(const std::string& prefix, const std::string& key) {
  if (prefix.empty() || absl::EndsWith(prefix, "/")) {
    return absl::StrCat(prefix, key);
  }
  return absl::StrCat(prefix, "/", key);
}

absl::StatusOr<std::string> NodeRankZeroValue(const ConnectRequest& request,
                                              const std::string& name,
                                              const std::string& mine) {
  const std::string key = StoreKey(request.prefix, name);
  if (request.node_rank == 0) {
    if (absl::Status status = request.store->Set(key, mine); !status.ok()) {
      return status;
    }
    return mine;
  }
  absl::StatusOr<std::vector<std::string>> values =
      request.store->Get({key}, request.timeout);
  if (!values.ok()) return values.status();
  return (*values)[0];
}

absl::Status CheckAllreduceArguments(const void* data, size_t count,
                                     v1::DataType dtype,
                                     const CollectiveOptions& options,
                                     const std::string& on) {
  const size_t element = ElementSize(dtype);
  if (element == 0 || PairwiseSumFor(dtype) == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "allreduce on ", on, ": unsupported data type ", DataTypeName(dtype)));
  }
  if (!v1::ReduceOp_IsValid(options.op) ||
      !ReduceOpApplies(options.op, dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "allreduce on ", on, ": reduce op ", ReduceOpName(options.op), " (",
        static_cast<int>(options.op), ") does not apply to ",
        DataTypeName(dtype), " (the bitwise ops take integers only)"));
  }
  if (options.divisor < 1 ||
      (options.divisor > 1 && options.op != v1::REDUCE_OP_SUM)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "allreduce on ", on, ": CollectiveOptions.divisor is ", options.divisor,
        " with reduce op ", ReduceOpName(options.op),
        "; give 1 or more, and more than 1 only for a sum (an average)"));
  }
  if (count == 0) return absl::OkStatus();
  if (data == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "allreduce of ", count, " elements on ", on, ": data is null"));
  }
  if (count > std::numeric_limits<size_t>::max() / element) {
    return absl::InvalidArgumentError(
        absl::StrCat("allreduce of ", count, " elements of ",
                     DataTypeName(dtype), " on ", on, ": the size overflows"));
  }
  return absl::OkStatus();
}

absl::Status CheckBroadcastArguments(const void* data, size_t bytes, int root,
                                     int size, const std::string& on) {
  if (root < 0 || root >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("broadcast on ", on, ": root ", root,
                     " is not a node rank (0..", size - 1, ")"));
  }
  if (bytes > 0 && data == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "broadcast of ", bytes, " bytes on ", on, ": data is null"));
  }
  return absl::OkStatus();
}

std::string DataTypeName(v1::DataType dtype) {
  const std::string& name = v1::DataType_Name(dtype);
  if (name.empty()) return absl::StrCat("data type ", static_cast<int>(dtype));
  return absl::AsciiStrToLower(absl::StripPrefix(name, "DATA_TYPE_"));
}

absl::Status Communicator::Allgather(void* data,
                                     absl::Span<const size_t> lengths,
                                     const CollectiveOptions& options) {
  (void)data;
  (void)lengths;
  (void)options;
  return absl::UnimplementedError(
      "allgather is not implemented by this transport; use the TCP rings "
      "(--data_transport=tcp) or gloo");
}

absl::Status Communicator::Alltoall(const void* send, void* recv,
                                    absl::Span<const size_t> lengths,
                                    const CollectiveOptions& options) {
  (void)send;
  (void)recv;
  (void)lengths;
  (void)options;
  return absl::UnimplementedError(
      "alltoall is not implemented by this transport; use the TCP rings "
      "(--data_transport=tcp) or gloo");
}

namespace {

// *total = the sum of `values`; false when it overflows.
bool SumFits(absl::Span<const size_t> values, size_t* total) {
  *total = 0;
  for (size_t value : values) {
    if (value > std::numeric_limits<size_t>::max() - *total) return false;
    *total += value;
  }
  return true;
}

}  // namespace

absl::Status Communicator::ReduceScatter(void* data,
                                         absl::Span<const size_t> counts,
                                         v1::DataType dtype,
                                         const CollectiveOptions& options) {
  if (absl::Status valid = CheckReduceScatterArguments(
          data, counts, dtype, size(), options, "this communicator");
      !valid.ok()) {
    return valid;
  }
  size_t total = 0;
  for (size_t count : counts) total += count;
  return Allreduce(data, total, dtype, options);
}

absl::Status CheckReduceScatterArguments(const void* data,
                                         absl::Span<const size_t> counts,
                                         v1::DataType dtype, int size,
                                         const CollectiveOptions& options,
                                         const std::string& on) {
  if (counts.size() != static_cast<size_t>(size)) {
    return absl::InvalidArgumentError(
        absl::StrCat("reduce-scatter on ", on, ": ", counts.size(),
                     " counts for ", size, " members; give one per member"));
  }
  size_t total = 0;
  if (!SumFits(counts, &total)) {
    return absl::InvalidArgumentError(
        absl::StrCat("reduce-scatter on ", on, ": the counts overflow"));
  }
  return CheckAllreduceArguments(data, total, dtype, options, on);
}

absl::Status CheckAllgatherArguments(const void* data,
                                     absl::Span<const size_t> lengths, int size,
                                     const std::string& on) {
  if (lengths.size() != static_cast<size_t>(size)) {
    return absl::InvalidArgumentError(
        absl::StrCat("allgather on ", on, ": ", lengths.size(), " lengths for ",
                     size, " members; give one per member"));
  }
  size_t total = 0;
  if (!SumFits(lengths, &total)) {
    return absl::InvalidArgumentError(
        absl::StrCat("allgather on ", on, ": the lengths overflow"));
  }
  if (total > 0 && data == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "allgather of ", total, " bytes on ", on, ": data is null"));
  }
  return absl::OkStatus();
}

absl::Status CheckAlltoallArguments(const void* send, const void* recv,
                                    absl::Span<const size_t> lengths, int rank,
                                    int size, const std::string& on) {
  const size_t n = static_cast<size_t>(size);
  if (lengths.size() != n * n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "alltoall on ", on, ": ", lengths.size(), " lengths for ", size,
        " members; give one per pair of members (", n * n, ")"));
  }
  size_t total = 0;
  if (!SumFits(lengths, &total)) {
    return absl::InvalidArgumentError(
        absl::StrCat("alltoall on ", on, ": the lengths overflow"));
  }
  size_t sent = 0;
  size_t received = 0;
  for (size_t other = 0; other < n; ++other) {
    sent += lengths[static_cast<size_t>(rank) * n + other];
    received += lengths[other * n + static_cast<size_t>(rank)];
  }
  if ((sent > 0 && send == nullptr) || (received > 0 && recv == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "alltoall sending ", sent, " and receiving ", received, " bytes on ",
        on, ": ", send == nullptr ? "send" : "recv", " is null"));
  }
  return absl::OkStatus();
}

uint32_t LengthsHash(absl::Span<const size_t> lengths) {
  uint64_t hash = 1469598103934665603ull;
  for (size_t length : lengths) hash = (hash ^ length) * 1099511628211ull;
  return static_cast<uint32_t>(hash ^ (hash >> 32));
}

std::string AllreduceName(v1::ReduceOp op) {
  if (op == v1::REDUCE_OP_SUM) return "allreduce";
  return absl::StrCat("allreduce (", ReduceOpName(op), ")");
}

DeviceReduceOp DeviceReduceOpOf(v1::ReduceOp op) {
  switch (op) {
    case v1::REDUCE_OP_MIN:
      return DeviceReduceOp::kMin;
    case v1::REDUCE_OP_MAX:
      return DeviceReduceOp::kMax;
    case v1::REDUCE_OP_PRODUCT:
      return DeviceReduceOp::kProduct;
    default:
      return DeviceReduceOp::kSum;
  }
}

const char* DeviceReduceOpName(DeviceReduceOp op) {
  switch (op) {
    case DeviceReduceOp::kSum:
      return "sum";
    case DeviceReduceOp::kAverage:
      return "average";
    case DeviceReduceOp::kMin:
      return "min";
    case DeviceReduceOp::kMax:
      return "max";
    case DeviceReduceOp::kProduct:
      return "product";
  }
  return "unknown";
}

}  // namespace baton::agent
