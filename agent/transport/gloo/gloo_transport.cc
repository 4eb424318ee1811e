#include "agent/transport/gloo/gloo_transport.h"

#include <signal.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agent/reduce.h"
#include "agent/transport/gloo/gloo_store.h"
#include "agent/transport/tcp/tcp_negotiation.h"
#include "agent/transport/tcp/tcp_peers.h"
#include "gloo/allgatherv.h"
#include "gloo/allreduce.h"
#include "gloo/alltoallv.h"
#include "gloo/broadcast.h"
#include "gloo/rendezvous/context.h"
#include "gloo/transport/tcp/device.h"

namespace baton::agent {
namespace {

// Runs `fn` with a pointer type whose size is `element_size` (1, 2, 4 or 8),
// for gloo's typed setOutput. The type only tells gloo the element size;
// the reduce function gives the arithmetic.
template <typename Fn>
void WithElementType(size_t element_size, Fn&& fn) {
  switch (element_size) {
    case 1:
      fn(static_cast<uint8_t*>(nullptr));
      return;
    case 2:
      fn(static_cast<uint16_t*>(nullptr));
      return;
    case 4:
      fn(static_cast<uint32_t*>(nullptr));
      return;
    default:
      fn(static_cast<uint64_t*>(nullptr));
      return;
  }
}

// The tag gloo sees: the caller's tag mixed with the operation's size in
// bytes and its data type (0 for a broadcast). gloo matches a send to a
// receive by tag; when two nodes disagree on an operation's size or type
// the messages differ in size, and a larger message reaching a smaller
// receive makes gloo's event-loop thread throw, which ends the process
// (std::terminate). With size and type in the tag the two sides never match
// and the operation fails with a timeout instead. For one (size, type),
// distinct caller tags stay distinct.
uint32_t WireTag(uint32_t tag, size_t bytes, int dtype) {
  uint64_t h =
      (static_cast<uint64_t>(bytes) * 31 + static_cast<uint64_t>(dtype)) *
      0x9e3779b97f4a7c15ull;
  h ^= h >> 29;
  return tag ^ static_cast<uint32_t>(h >> 32);
}

// What an exception from gloo says.
std::string CurrentExceptionText() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

// gloo reports a step that ran out of time as "Timed out ..." (an
// IoException like every other transport error).
bool IsGlooTimeout(const std::string& text) {
  return absl::StrContains(text, "Timed out") ||
         absl::StrContains(text, "timed out") ||
         absl::StrContains(text, "Connect timeout");
}

// The error for a failed connectFullMesh of communicator `name`. When the
// store timed out, asks it (without waiting) which peers' addresses are
// missing, so that the message names them.
absl::Status ConnectError(const ConnectRequest& request,
                          const std::string& name, const std::string& prefix,
                          const GlooStore& store,
                          const std::string& gloo_text) {
  const std::string what =
      absl::StrCat("connecting communicator ", name, " of ", request.num_nodes,
                   " nodes (node rank ", request.node_rank, ", keys under \"",
                   prefix, "/\")");
  const absl::Status store_error = store.first_error();
  if (store_error.ok()) {
    const std::string message = absl::StrCat(what, " failed: ", gloo_text);
    return IsGlooTimeout(gloo_text) ? absl::DeadlineExceededError(message)
                                    : absl::UnavailableError(message);
  }
  if (store_error.code() != absl::StatusCode::kDeadlineExceeded) {
    return absl::Status(store_error.code(),
                        absl::StrCat(what, " failed: ", store_error.message()));
  }
  std::vector<int> missing;
  for (int rank = 0; rank < request.num_nodes; ++rank) {
    if (rank == request.node_rank) continue;
    const auto probe = request.store->Get({store.FullKey(std::to_string(rank))},
                                          std::chrono::milliseconds(0));
    if (probe.status().code() == absl::StatusCode::kDeadlineExceeded) {
      missing.push_back(rank);
    }
  }
  const std::string who =
      missing.empty()
          ? std::string("a peer")
          : absl::StrCat("node rank(s) ", absl::StrJoin(missing, ", "));
  return absl::DeadlineExceededError(absl::StrCat(
      what, " timed out after ", request.timeout.count(), " ms: ", who,
      " did not publish their gloo address (", store_error.message(), ")"));
}

}  // namespace

// ---------------------------------------------------------------------------
// GlooTransport

absl::StatusOr<std::unique_ptr<GlooTransport>> GlooTransport::Create(
    const std::string& hostname, Options options) {
  if (options.max_segment_bytes < 8) {
    return absl::InvalidArgumentError(
        absl::StrCat("GlooTransport::Options.max_segment_bytes is ",
                     options.max_segment_bytes, ": give 8 or more"));
  }
  if (options.clock == nullptr) {
    return absl::InvalidArgumentError("GlooTransport::Options.clock is null");
  }
  if (hostname.empty()) {
    return absl::InvalidArgumentError(
        "the gloo transport needs the hostname or IP address to bind");
  }
  // A write to a connection the peer closed must fail with EPIPE on this
  // node, not end the process.
  ::signal(SIGPIPE, SIG_IGN);
  const absl::StatusOr<std::vector<std::string>> addresses =
      tcp::NumericAddresses(hostname);
  if (!addresses.ok()) return addresses.status();
  std::string errors;
  for (const std::string& address : *addresses) {
    try {
      gloo::transport::tcp::attr attr;
      attr.hostname = address;
      std::shared_ptr<gloo::transport::Device> device =
          gloo::transport::tcp::CreateDevice(attr);
      return std::unique_ptr<GlooTransport>(
          new GlooTransport(std::move(device), address, options));
    } catch (...) {
      absl::StrAppend(&errors, errors.empty() ? "" : "; ", address, ": ",
                      CurrentExceptionText());
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "cannot create the gloo TCP device on \"", hostname, "\": ", errors));
}

GlooTransport::GlooTransport(std::shared_ptr<gloo::transport::Device> device,
                             std::string address, Options options)
    : device_(std::move(device)),
      address_(std::move(address)),
      options_(options) {}

absl::StatusOr<std::unique_ptr<NegotiationWire>>
GlooTransport::ConnectNegotiation(const ConnectRequest& request) {
  return ConnectTcpNegotiation(request, address_, options_.clock,
                               /*pool=*/nullptr);
}

GlooTransport::~GlooTransport() = default;

absl::StatusOr<std::vector<std::unique_ptr<Communicator>>>
GlooTransport::Connect(const ConnectRequest& request) {
  if (absl::Status valid = ValidateConnectRequest(request); !valid.ok()) {
    return valid;
  }
  const Deadline deadline(*options_.clock, absl::FromChrono(request.timeout));
  std::vector<std::unique_ptr<Communicator>> communicators;
  communicators.reserve(request.count);
  for (int i = 0; i < request.count; ++i) {
    const std::string name = absl::StrCat("c", i);
    const std::string prefix = StoreKey(request.prefix, name);
    GlooStore store(request.store, prefix, deadline);
    const std::chrono::milliseconds left =
        absl::ToChronoMilliseconds(deadline.Left());
    try {
      auto context = std::make_shared<gloo::rendezvous::Context>(
          request.node_rank, request.num_nodes);
      // Bounds each store wait (GlooStore also stops at the deadline) and
      // each connection; gloo waits up to 5x this for a peer that published
      // its address but never connects.
      context->setTimeout(std::max(left, std::chrono::milliseconds(1)));
      std::shared_ptr<gloo::transport::Device> device = device_;
      context->connectFullMesh(store, device);
      communicators.push_back(std::make_unique<GlooCommunicator>(
          std::move(context), name, options_.max_segment_bytes));
    } catch (...) {
      return ConnectError(request, name, prefix, store, CurrentExceptionText());
    }
  }
  return communicators;
}

// ---------------------------------------------------------------------------
// GlooCommunicator

GlooCommunicator::GlooCommunicator(std::shared_ptr<gloo::Context> context,
                                   std::string name, size_t max_segment_bytes)
    : context_(std::move(context)),
      name_(std::move(name)),
      rank_(context_->rank),
      size_(context_->size),
      max_segment_bytes_(max_segment_bytes) {}

GlooCommunicator::~GlooCommunicator() = default;

std::string GlooCommunicator::Describe() const {
  return absl::StrCat("communicator ", name_, " of ", size_,
                      " nodes (node rank ", rank_, ")");
}

template <typename Op>
absl::Status GlooCommunicator::Run(const std::string& what, Op&& op) {
  std::string text;
  try {
    op();
    return absl::OkStatus();
  } catch (...) {
    text = CurrentExceptionText();
  }
  const absl::Status status =
      IsGlooTimeout(text) ? absl::DeadlineExceededError(absl::StrCat(
                                what, " on ", Describe(), " timed out: ", text))
                          : absl::UnavailableError(absl::StrCat(
                                what, " on ", Describe(), " failed: ", text));
  poison_.Set(status);
  // Peers blocked on this node fail now instead of after their timeout.
  try {
    context_->closeConnections();
  } catch (...) {
    // The connections are already broken; nothing more to close.
  }
  return status;
}

absl::Status GlooCommunicator::Allreduce(void* data, size_t count,
                                         v1::DataType dtype,
                                         const CollectiveOptions& options) {
  if (absl::Status valid =
          poison_.CheckAllreduce(data, count, dtype, options, Describe());
      !valid.ok()) {
    return valid;
  }
  if (count == 0) return absl::OkStatus();
  const size_t element_size = ElementSize(dtype);
  const PairwiseSum reduce = PairwiseFor(options.op, dtype);
  if (options.input != nullptr && options.input != data) {
    std::memcpy(data, options.input, count * element_size);
  }
  const std::string what =
      absl::StrCat(AllreduceName(options.op), " of ", count * element_size,
                   " bytes (", DataTypeName(dtype), ")");
  return Run(what, [&] {
    gloo::AllreduceOptions opts(context_);
    WithElementType(element_size, [&](auto* type) {
      using T = std::remove_pointer_t<decltype(type)>;
      opts.setOutput(static_cast<T*>(data), count);
    });
    opts.setReduceFunction(reduce);
    // Nodes that disagree on the op never match either (a timeout).
    opts.setTag(WireTag(options.tag, count * element_size,
                        static_cast<int>(dtype) | options.op << 8));
    opts.setTimeout(options.timeout);
    opts.setMaxSegmentSize(max_segment_bytes_);
    gloo::allreduce(opts);
    if (options.divisor > 1) {
      DivideInPlace(dtype, data, count, options.divisor);
    }
  });
}

absl::Status GlooCommunicator::Broadcast(void* data, size_t bytes, int root,
                                         const CollectiveOptions& options) {
  if (absl::Status valid =
          poison_.CheckBroadcast(data, bytes, root, size_, options, Describe());
      !valid.ok()) {
    return valid;
  }
  if (bytes == 0) return absl::OkStatus();
  const std::string what =
      absl::StrCat("broadcast of ", bytes, " bytes from node rank ", root);
  return Run(what, [&] {
    gloo::BroadcastOptions opts(context_);
    opts.setOutput(static_cast<uint8_t*>(data), bytes);
    opts.setRoot(root);
    opts.setTag(WireTag(options.tag, bytes, 0));
    opts.setTimeout(options.timeout);
    gloo::broadcast(opts);
  });
}

absl::Status GlooCommunicator::Allgather(void* data,
                                         absl::Span<const size_t> lengths,
                                         const CollectiveOptions& options) {
  if (absl::Status valid =
          poison_.CheckAllgather(data, lengths, size_, options, Describe());
      !valid.ok()) {
    return valid;
  }
  size_t total = 0;
  size_t offset = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    if (static_cast<int>(i) == rank_) offset = total;
    total += lengths[i];
  }
  if (total == 0 || size_ == 1) return absl::OkStatus();
  auto* bytes = static_cast<uint8_t*>(data);
  // gloo copies the input into the output: not from where it already is.
  std::vector<uint8_t> mine(bytes + offset, bytes + offset + lengths[rank_]);
  const std::string what = absl::StrCat("allgather of ", total, " bytes");
  return Run(what, [&] {
    gloo::AllgathervOptions opts(context_);
    opts.setInput(mine.data(), mine.size());
    opts.setOutput(bytes, std::vector<size_t>(lengths.begin(), lengths.end()));
    // Members that disagree on the lengths never match (a timeout).
    opts.setTag(
        WireTag(options.tag, total, static_cast<int>(LengthsHash(lengths))));
    opts.setTimeout(options.timeout);
    gloo::allgatherv(opts);
  });
}

absl::Status GlooCommunicator::Alltoall(const void* send, void* recv,
                                        absl::Span<const size_t> lengths,
                                        const CollectiveOptions& options) {
  if (absl::Status valid = poison_.CheckAlltoall(send, recv, lengths, rank_,
                                                 size_, options, Describe());
      !valid.ok()) {
    return valid;
  }
  const size_t n = static_cast<size_t>(size_);
  const size_t me = static_cast<size_t>(rank_);
  std::vector<int64_t> sent(n);
  std::vector<int64_t> received(n);
  size_t total = 0;
  for (size_t other = 0; other < n; ++other) {
    sent[other] = static_cast<int64_t>(lengths[me * n + other]);
    received[other] = static_cast<int64_t>(lengths[other * n + me]);
  }
  for (size_t length : lengths) total += length;
  if (total == 0) return absl::OkStatus();
  if (size_ == 1) {
    std::memcpy(recv, send, lengths[0]);
    return absl::OkStatus();
  }
  const std::string what = absl::StrCat("alltoall of ", total, " bytes");
  return Run(what, [&] {
    gloo::AlltoallvOptions opts(context_);
    // gloo only reads the input.
    opts.setInput(static_cast<uint8_t*>(const_cast<void*>(send)), sent);
    opts.setOutput(static_cast<uint8_t*>(recv), received);
    // Members that disagree on the lengths never match (a timeout).
    opts.setTag(
        WireTag(options.tag, total, static_cast<int>(LengthsHash(lengths))));
    opts.setTimeout(options.timeout);
    gloo::alltoallv(opts);
  });
}

}  // namespace baton::agent
