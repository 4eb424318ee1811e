#include "baton/session.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>

#include "absl/base/thread_annotations.h"
#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "client/declaration.h"
#include "common/tensor_retired.h"

namespace baton::client {
namespace {

std::string ShapeText(const google::protobuf::RepeatedField<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

std::string SpecText(const v1::TensorSpec& spec) {
  return absl::StrCat(
      v1::DataType_Name(spec.dtype()), ShapeText(spec.shape()), " ",
      v1::CollectiveOp_Name(spec.op()),
      spec.memory() == v1::MEMORY_KIND_CUDA ? " in CUDA memory" : "");
}

bool SameSpec(const v1::TensorSpec& a, const v1::TensorSpec& b) {
  return a.dtype() == b.dtype() && a.op() == b.op() &&
         a.memory() == b.memory() &&
         std::equal(a.shape().begin(), a.shape().end(), b.shape().begin(),
                    b.shape().end());
}

v1::TensorSpec MakeSpec(const std::string& name, v1::DataType dtype,
                        const std::vector<int64_t>& shape, v1::CollectiveOp op,
                        v1::MemoryKind memory) {
  v1::TensorSpec spec;
  spec.set_name(name);
  spec.set_dtype(dtype);
  spec.set_op(op);
  spec.set_memory(memory);
  for (int64_t d : shape) spec.add_shape(d);
  return spec;
}

v1::CudaBuffer MakeCudaBuffer(const DeviceBuffer& buffer) {
  v1::CudaBuffer cuda;
  cuda.set_pci_bus_id(buffer.pci_bus_id);
  cuda.set_memory_handle(buffer.memory_handle);
  cuda.set_offset(buffer.offset);
  cuda.set_event_handle(buffer.event_handle);
  return cuda;
}

// Checks a launcher's RANK / WORLD_SIZE against what the job assigned.
absl::Status CheckLauncherVariable(const char* variable, int64_t assigned) {
  const char* value = std::getenv(variable);
  if (value == nullptr || *value == '\0') return absl::OkStatus();
  int64_t parsed = 0;
  if (!absl::SimpleAtoi(value, &parsed)) {
    return absl::InvalidArgumentError(absl::StrCat("environment variable ",
                                                   variable, "=\"", value,
                                                   "\" is not an integer"));
  }
  if (parsed != assigned) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the launcher set ", variable, "=", parsed, " but the job assigned ",
        assigned, ": start trainers so that LOCAL_RANK, LOCAL_WORLD_SIZE and ",
        "the nodes' join order give the launcher's ranks, or unset ",
        variable));
  }
  return absl::OkStatus();
}

// One operation as the caller started it.
struct OperationRequest {
  // Name, dtype, shape, collective and memory.
  v1::TensorSpec spec;
  // Host memory: where the input is read, and where Synchronize writes the
  // result (nullptr: nowhere).
  const void* input = nullptr;
  void* output = nullptr;
  // CUDA memory: where the tensor lives (its index is not used).
  v1::CudaBuffer cuda;
  bool average = false;
  v1::ReduceOp reduce_op = v1::REDUCE_OP_SUM;
  int32_t root_rank = 0;
};

}  // namespace
}  // namespace baton::client

namespace baton {

using client::CheckDeclaration;
using client::CheckLauncherVariable;
using client::MakeCudaBuffer;
using client::MakeSpec;
using client::OperationRequest;
using client::SameCudaBuffer;
using client::SameSpec;
using client::ShapeText;
using client::SpecText;

// One started operation: the client's handle plus what Synchronize needs to
// deliver the result into the user's buffer exactly once. baton/session.h
// declares it, opaque, as what an OperationHandle points to.
class Operation {
 public:
  Operation(std::string name, std::shared_ptr<Handle> handle,
            std::shared_ptr<Tensor> tensor, void* destination)
      : name(std::move(name)),
        handle(std::move(handle)),
        tensor(std::move(tensor)),
        destination(destination) {}

  const std::string name;
  const std::shared_ptr<Handle> handle;
  const std::shared_ptr<Tensor> tensor;
  // Where the result goes; nullptr when there is nothing to copy (the
  // broadcast root already holds the result).
  void* const destination;

  absl::Mutex mu;
  bool delivered ABSL_GUARDED_BY(mu) = false;
  absl::Status outcome ABSL_GUARDED_BY(mu);
};

class Session::Impl {
 public:
  explicit Impl(std::unique_ptr<Client> client) : client_(std::move(client)) {}

  absl::Status Declare(const std::vector<v1::TensorSpec>& specs,
                       const std::vector<v1::CudaBuffer>& cuda_buffers)
      ABSL_LOCKS_EXCLUDED(declare_mu_, mu_) {
    if (absl::Status s = CheckDeclaration(specs, cuda_buffers); !s.ok()) {
      return s;
    }
    // Checked above: at most one buffer per spec, and only for CUDA specs.
    std::map<int32_t, const v1::CudaBuffer*> buffer_of;
    for (const v1::CudaBuffer& buffer : cuda_buffers) {
      buffer_of[buffer.index()] = &buffer;
    }
    // One declaration at a time: the agent numbers tensors in request order.
    absl::MutexLock declare_lock(&declare_mu_);
    std::vector<v1::TensorSpec> fresh;
    std::vector<v1::CudaBuffer> fresh_buffers;
    {
      absl::MutexLock lock(&mu_);
      if (closed_) return Closed();
      for (size_t i = 0; i < specs.size(); ++i) {
        const v1::TensorSpec& spec = specs[i];
        auto found = buffer_of.find(static_cast<int32_t>(i));
        const v1::CudaBuffer* buffer =
            found != buffer_of.end() ? found->second : nullptr;
        // The name's latest version: declared before, or earlier in this
        // request.
        const v1::TensorSpec* known = nullptr;
        const v1::CudaBuffer* known_buffer = nullptr;
        if (auto it = tensors_.find(spec.name()); it != tensors_.end()) {
          known = &it->second->spec();
          auto cuda = cuda_buffers_.find(spec.name());
          if (cuda != cuda_buffers_.end()) known_buffer = &cuda->second;
        }
        for (size_t f = 0; f < fresh.size(); ++f) {
          if (fresh[f].name() != spec.name()) continue;
          known = &fresh[f];
          known_buffer = nullptr;
          for (const v1::CudaBuffer& b : fresh_buffers) {
            if (b.index() == static_cast<int32_t>(f)) known_buffer = &b;
          }
        }
        if (known != nullptr && retired_.count(spec.name()) == 0 &&
            SameUse(*known, known_buffer, spec, buffer)) {
          continue;  // declared alike: nothing to do
        }
        // New, or declared anew: the name's next version, once nothing of
        // the current one is in flight here.
        if (known != nullptr) {
          if (absl::Status s = CheckNothingInFlight(*known, spec); !s.ok()) {
            return s;
          }
        }
        if (buffer != nullptr) {
          v1::CudaBuffer& added = fresh_buffers.emplace_back(*buffer);
          added.set_index(static_cast<int32_t>(fresh.size()));
        }
        v1::TensorSpec& next = fresh.emplace_back(spec);
        next.set_version(known == nullptr ? 0 : known->version() + 1);
      }
    }
    if (fresh.empty()) return absl::OkStatus();
    absl::StatusOr<std::vector<std::shared_ptr<Tensor>>> declared =
        client_->Declare(fresh, fresh_buffers);
    if (!declared.ok()) return declared.status();
    absl::MutexLock lock(&mu_);
    // A name's latest version replaces the one before; its steps start over.
    for (std::shared_ptr<Tensor>& tensor : *declared) {
      const std::string name = tensor->spec().name();
      cuda_buffers_.erase(name);
      retired_.erase(name);
      // 0, except where this trainer replaces a lost one and joins the
      // others at their step, or above the step floor (SetStepFloor).
      next_step_[name] = Reserved(name)
                             ? tensor->next_step()
                             : std::max(tensor->next_step(), step_floor_);
      tensors_[name] = std::move(tensor);
    }
    for (const v1::CudaBuffer& buffer : fresh_buffers) {
      v1::CudaBuffer& kept =
          cuda_buffers_[fresh[static_cast<size_t>(buffer.index())].name()];
      kept = buffer;
      kept.clear_index();
    }
    return absl::OkStatus();
  }

  // Copies a host input in (a CUDA one is the caller's to write) and starts
  // the operation; Synchronize copies a host result out.
  absl::StatusOr<OperationHandle> Start(const OperationRequest& request)
      ABSL_LOCKS_EXCLUDED(declare_mu_, mu_) {
    const v1::TensorSpec& spec = request.spec;
    const std::string& name = spec.name();
    const v1::CollectiveOp op = spec.op();
    const bool on_device = spec.memory() == v1::MEMORY_KIND_CUDA;
    const int64_t element = ElementSize(spec.dtype());
    if (element == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", name, "\": unsupported dtype ",
                       v1::DataType_Name(spec.dtype()),
                       "; use float32/64, float16, bfloat16, int32/64, "
                       "uint8, int8 or int16"));
    }
    int64_t elements = 1;
    for (int64_t d : spec.shape()) {
      if (d < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor \"", name, "\": shape ",
                         ShapeText(spec.shape()), " has a negative dimension"));
      }
      elements *= d;
    }
    std::vector<v1::CudaBuffer> cuda_buffers;
    if (on_device) {
      cuda_buffers.push_back(request.cuda);
      cuda_buffers.back().set_index(0);
      if (absl::Status s = CheckDeclaration({spec}, cuda_buffers); !s.ok()) {
        return s;
      }
    } else if ((request.input == nullptr || request.output == nullptr) &&
               elements > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor \"", name, "\": the ",
          request.input == nullptr ? "buffer's data" : "output", " is null"));
    }
    const int32_t root_rank = request.root_rank;
    if (op == v1::COLLECTIVE_OP_BROADCAST &&
        (root_rank < 0 || root_rank >= client_->size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("broadcast of \"", name, "\": root rank ", root_rank,
                       " is outside the job's ranks 0..", client_->size() - 1));
    }

    std::shared_ptr<Tensor> tensor;
    const v1::CudaBuffer* declared_buffer = nullptr;
    bool retired = false;  // its latest declaration was retired
    {
      absl::MutexLock lock(&mu_);
      if (closed_) return Closed();
      auto pending = in_flight_.find(name);
      if (pending != in_flight_.end()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "tensor \"", name, "\" already has an operation in flight (step ",
            pending->second->handle->step(),
            "): synchronize it before starting the next one"));
      }
      // Held from here until the operation is in flight, so that a second
      // thread starting the same name cannot overwrite this one's input.
      if (!starting_.insert(name).second) {
        return absl::FailedPreconditionError(absl::StrCat(
            "tensor \"", name,
            "\" is being started by another thread; start each name from one "
            "thread at a time"));
      }
      auto it = tensors_.find(name);
      if (it != tensors_.end()) tensor = it->second;
      retired = retired_.count(name) > 0;
      // Entries are never removed, so the pointer stays valid.
      auto cuda = cuda_buffers_.find(name);
      if (cuda != cuda_buffers_.end()) declared_buffer = &cuda->second;
    }
    absl::Cleanup release_name = [&] {
      absl::MutexLock lock(&mu_);
      starting_.erase(name);
    };
    // Declared on first use, and anew (its next version) when used with
    // another spec or CUDA buffer than its latest declaration, or retired.
    if (tensor == nullptr || retired ||
        !SameUse(tensor->spec(), declared_buffer, spec,
                 on_device ? &cuda_buffers.front() : nullptr)) {
      if (absl::Status s = Declare({spec}, cuda_buffers); !s.ok()) return s;
      absl::MutexLock lock(&mu_);
      tensor = tensors_.at(name);
      declared_buffer = nullptr;
      auto cuda = cuda_buffers_.find(name);
      if (cuda != cuda_buffers_.end()) declared_buffer = &cuda->second;
    }

    const bool is_root =
        op == v1::COLLECTIVE_OP_BROADCAST && client_->rank() == root_rank;
    // A caller that keeps its data in the input region (Regions) has
    // nothing to copy.
    if (!on_device && (op != v1::COLLECTIVE_OP_BROADCAST || is_root) &&
        request.input != tensor->input()) {
      std::memcpy(tensor->input(), request.input,
                  static_cast<size_t>(tensor->input_bytes()));
    }
    absl::MutexLock lock(&mu_);
    if (closed_) return Closed();
    int64_t& step = next_step_[name];
    absl::StatusOr<std::shared_ptr<Handle>> handle;
    switch (op) {
      case v1::COLLECTIVE_OP_BROADCAST:
        handle = client_->BroadcastAsync(*tensor, step, root_rank);
        break;
      case v1::COLLECTIVE_OP_ALLGATHER:
      case v1::COLLECTIVE_OP_ALLTOALL:
        handle = client_->AllgatherAsync(*tensor, step);
        break;
      default:  // push-pull and reduce-scatter enqueue alike
        handle = client_->PushPullAsync(*tensor, step, request.average,
                                        request.reduce_op);
    }
    if (!handle.ok()) return handle.status();
    ++step;
    // A CUDA result is already in the caller's buffer when it completes.
    auto operation = std::make_shared<Operation>(
        name, std::move(*handle), tensor,
        is_root || on_device ? nullptr : request.output);
    in_flight_.emplace(name, operation);
    starting_.erase(name);
    std::move(release_name).Cancel();
    return operation;
  }

  absl::StatusOr<HostRegions> Regions(const std::string& name) const
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto it = tensors_.find(name);
    if (it == tensors_.end()) {
      return absl::NotFoundError(absl::StrCat(
          "tensor \"", name, "\" is not declared: declare it first"));
    }
    const Tensor& tensor = *it->second;
    if (tensor.input() == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "tensor \"", name,
          "\" is in CUDA memory: it has no shared-memory regions"));
    }
    return HostRegions{tensor.input(), tensor.output(), tensor.size_bytes(),
                       tensor.input_bytes()};
  }

  absl::Status Synchronize(const OperationHandle& operation,
                           std::chrono::milliseconds timeout)
      ABSL_LOCKS_EXCLUDED(mu_) {
    if (operation == nullptr) {
      return absl::InvalidArgumentError("Synchronize: the handle is null");
    }
    absl::Status status = operation->handle->Wait(timeout);
    if (StillInFlight(status)) {
      if (!operation->handle->Poll()) {
        return client::StillInFlightError(
            absl::StrCat("tensor \"", operation->name, "\" step ",
                         operation->handle->step(), " did not complete within ",
                         timeout.count(), " ms; it is still in flight"));
      }
      // It finished just after the wait gave up: its own outcome, not the
      // wait's (Python waits in 100 ms slices, so this is not rare).
      status = operation->handle->Wait(std::chrono::milliseconds(0));
    }
    absl::MutexLock op_lock(&operation->mu);
    if (operation->delivered) return operation->outcome;
    if (status.ok() && operation->destination != nullptr &&
        operation->destination != operation->tensor->output()) {
      std::memcpy(operation->destination, operation->tensor->output(),
                  static_cast<size_t>(operation->tensor->size_bytes()));
    }
    operation->delivered = true;
    operation->outcome = status;
    if (IsTensorRetired(status)) {
      // Nodes declared this version differently: the next operation on the
      // name declares it anew.
      absl::MutexLock lock(&mu_);
      auto declared = tensors_.find(operation->name);
      if (declared != tensors_.end() && declared->second == operation->tensor) {
        retired_.insert(operation->name);
      }
    }
    Retire(operation);
    if (!status.ok()) Rewind(*operation);
    return status;
  }

  // `may_finish`: leave as finished when everything drained (false: the
  // trainer is giving up, and the job must not count it as done).
  absl::Status Shutdown(std::chrono::milliseconds drain_timeout,
                        bool may_finish = true) ABSL_LOCKS_EXCLUDED(mu_) {
    std::vector<OperationHandle> pending;
    {
      absl::MutexLock lock(&mu_);
      if (closed_) return Closed();
      closed_ = true;
      for (auto& [name, operation] : in_flight_) pending.push_back(operation);
    }
    const auto deadline = std::chrono::steady_clock::now() + drain_timeout;
    int unfinished = 0;
    std::string first_unfinished;
    for (const OperationHandle& operation : pending) {
      // Rounded up: the drain never ends before its timeout.
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (operation->handle->Wait(std::max(left, std::chrono::milliseconds(0)))
              .ok() ||
          operation->handle->Poll()) {
        continue;
      }
      if (unfinished++ == 0) {
        first_unfinished = absl::StrCat("\"", operation->name, "\" step ",
                                        operation->handle->step());
      }
    }
    absl::Status status;
    if (unfinished > 0) {
      status = absl::AbortedError(absl::StrCat(
          "shut down with ", unfinished, " operation(s) still in flight after ",
          drain_timeout.count(), " ms (first: tensor ", first_unfinished,
          "); they were abandoned and their buffers keep their input"));
      for (const OperationHandle& operation : pending) {
        operation->handle->Finish(status, 0);
      }
    }
    // A trainer that leaves with work unfinished is not done: the job sees a
    // failure instead of a clean finish.
    absl::Status detached =
        client_->Detach(/*finished=*/may_finish && unfinished == 0);
    if (!status.ok()) return status;
    return detached;
  }

  int64_t NextStep() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    int64_t next = step_floor_;
    for (const auto& [name, step] : next_step_) {
      if (!Reserved(name)) next = std::max(next, step);
    }
    return next;
  }

  void SetStepFloor(int64_t floor) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    step_floor_ = std::max(step_floor_, floor);
    for (auto& [name, step] : next_step_) {
      if (!Reserved(name)) step = std::max(step, step_floor_);
    }
  }

  bool closed() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return closed_;
  }

  // Lives as long as the session, so rank() and size() stay readable
  // after Shutdown.
  const std::unique_ptr<Client> client_;

 private:
  static absl::Status Closed() {
    return absl::FailedPreconditionError(
        "the baton session is shut down; call Init again to start a new one");
  }

  // Names that start with "baton." are baton's own (baton.torch.elastic's
  // per-generation agreement): the step floor does not apply to them.
  static bool Reserved(const std::string& name) {
    return absl::StartsWith(name, "baton.");
  }

  // Whether a use of a declared name (`buffer` null for host memory)
  // matches its latest declaration; when not, the use declares it anew.
  static bool SameUse(const v1::TensorSpec& declared,
                      const v1::CudaBuffer* declared_buffer,
                      const v1::TensorSpec& used,
                      const v1::CudaBuffer* buffer) {
    return SameSpec(declared, used) &&
           (declared_buffer == nullptr || buffer == nullptr ||
            SameCudaBuffer(*declared_buffer, *buffer));
  }

  // A name is declared anew (`used`) only when no operation of its latest
  // declaration (`declared`) is in flight: that one reads and writes the
  // old buffers until it is synchronized.
  absl::Status CheckNothingInFlight(const v1::TensorSpec& declared,
                                    const v1::TensorSpec& used) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto pending = in_flight_.find(used.name());
    if (pending == in_flight_.end()) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        "tensor \"", used.name(), "\" is declared anew as ", SpecText(used),
        " while its operation as ", SpecText(declared), " (step ",
        pending->second->handle->step(),
        ") is in flight: synchronize that one first (a name may change its "
        "dtype, shape, collective or memory between operations, not during "
        "one)"));
  }

  // A failed operation's step is the name's next one again (the agent takes
  // a failed step again), so every rank that retries stays in step however
  // often its attempts fail before the job is whole again.
  void Rewind(const Operation& operation) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto tensor = tensors_.find(operation.name);
    auto step = next_step_.find(operation.name);
    if (tensor == tensors_.end() || tensor->second != operation.tensor ||
        step == next_step_.end() ||
        step->second != operation.handle->step() + 1) {
      return;  // declared anew, or started again, meanwhile
    }
    step->second = operation.handle->step();
  }

  void Retire(const OperationHandle& operation) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto it = in_flight_.find(operation->name);
    if (it != in_flight_.end() && it->second == operation) in_flight_.erase(it);
  }

  // One declaration at a time: held across the agent's round trip.
  absl::Mutex declare_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  mutable absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, std::shared_ptr<Tensor>> tensors_ ABSL_GUARDED_BY(mu_);
  // Where each declared CUDA tensor lives (index cleared).
  std::map<std::string, v1::CudaBuffer> cuda_buffers_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> next_step_ ABSL_GUARDED_BY(mu_);
  // No name's next step is below it (SetStepFloor), reserved names aside.
  int64_t step_floor_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, OperationHandle> in_flight_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> starting_ ABSL_GUARDED_BY(mu_);
  // Names whose latest declaration is retired (common/tensor_retired.h):
  // their next operation declares them anew.
  std::set<std::string> retired_ ABSL_GUARDED_BY(mu_);
};

Session::Session(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Session::~Session() {
  if (!impl_->closed()) {
    impl_->Shutdown(std::chrono::seconds(10)).IgnoreError();
  }
}

absl::StatusOr<std::unique_ptr<Session>> Session::Init(
    const ClientOptions& options) {
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  if (!client.ok()) return client.status();
  return std::unique_ptr<Session>(
      new Session(std::make_unique<Impl>(std::move(*client))));
}

absl::StatusOr<std::unique_ptr<Session>> Session::Init() {
  absl::StatusOr<ClientOptions> options = ClientOptions::FromEnvironment();
  if (!options.ok()) return options.status();
  absl::StatusOr<std::unique_ptr<Session>> session = Init(*options);
  if (!session.ok()) return session;
  if (absl::Status status = (*session)->CheckLauncherEnvironment();
      !status.ok()) {
    return status;
  }
  return session;
}

absl::Status Session::CheckLauncherEnvironment() {
  absl::Status status = CheckLauncherVariable("RANK", rank());
  if (status.ok()) status = CheckLauncherVariable("WORLD_SIZE", size());
  if (!status.ok()) {
    impl_->Shutdown(std::chrono::seconds(0), /*may_finish=*/false)
        .IgnoreError();
  }
  return status;
}

int32_t Session::rank() const { return impl_->client_->rank(); }
int32_t Session::size() const { return impl_->client_->size(); }
int32_t Session::local_rank() const { return impl_->client_->local_rank(); }
int32_t Session::local_size() const { return impl_->client_->local_size(); }
int64_t Session::generation() const { return impl_->client_->generation(); }

absl::StatusOr<int64_t> Session::WaitForGeneration(
    int64_t after, std::chrono::milliseconds timeout) {
  return impl_->client_->WaitForGeneration(after, timeout);
}

void Session::FenceGeneration(int64_t generation) {
  impl_->client_->Fence(generation);
}

bool Session::JoinPending() const { return impl_->client_->JoinPending(); }

absl::Status Session::AdmitJoins() { return impl_->client_->AdmitJoins(); }

int64_t Session::NextStep() const { return impl_->NextStep(); }

void Session::SetStepFloor(int64_t floor) { impl_->SetStepFloor(floor); }

absl::Status Session::DeclareTensors(
    const std::vector<v1::TensorSpec>& specs,
    const std::vector<v1::CudaBuffer>& cuda_buffers) {
  return impl_->Declare(specs, cuda_buffers);
}

absl::Status Session::DeclareTensor(const std::string& name, v1::DataType dtype,
                                    const std::vector<int64_t>& shape,
                                    v1::CollectiveOp op) {
  return impl_->Declare(
      {MakeSpec(name, dtype, shape, op, v1::MEMORY_KIND_HOST)}, {});
}

absl::Status Session::DeclareTensor(const std::string& name,
                                    const DeviceBuffer& buffer,
                                    v1::CollectiveOp op) {
  v1::CudaBuffer cuda = MakeCudaBuffer(buffer);
  cuda.set_index(0);
  return impl_->Declare(
      {MakeSpec(name, buffer.dtype, buffer.shape, op, v1::MEMORY_KIND_CUDA)},
      {cuda});
}

absl::StatusOr<OperationHandle> Session::PushPullAsync(const std::string& name,
                                                       const Buffer& buffer,
                                                       bool average,
                                                       v1::ReduceOp op) {
  return PushPullAsync(name, buffer, buffer.data, average, op);
}

absl::StatusOr<OperationHandle> Session::PushPullAsync(const std::string& name,
                                                       const Buffer& buffer,
                                                       void* output,
                                                       bool average,
                                                       v1::ReduceOp op) {
  OperationRequest request;
  request.spec = MakeSpec(name, buffer.dtype, buffer.shape,
                          v1::COLLECTIVE_OP_PUSH_PULL, v1::MEMORY_KIND_HOST);
  request.input = buffer.data;
  request.output = output;
  request.average = average;
  request.reduce_op = op;
  return impl_->Start(request);
}

absl::StatusOr<OperationHandle> Session::BroadcastAsync(const std::string& name,
                                                        const Buffer& buffer,
                                                        int32_t root_rank) {
  OperationRequest request;
  request.spec = MakeSpec(name, buffer.dtype, buffer.shape,
                          v1::COLLECTIVE_OP_BROADCAST, v1::MEMORY_KIND_HOST);
  request.input = buffer.data;
  request.output = buffer.data;
  request.root_rank = root_rank;
  return impl_->Start(request);
}

absl::StatusOr<OperationHandle> Session::AllgatherAsync(const std::string& name,
                                                        const Buffer& buffer,
                                                        void* output) {
  std::vector<int64_t> gathered = {size()};
  gathered.insert(gathered.end(), buffer.shape.begin(), buffer.shape.end());
  OperationRequest request;
  request.spec = MakeSpec(name, buffer.dtype, gathered,
                          v1::COLLECTIVE_OP_ALLGATHER, v1::MEMORY_KIND_HOST);
  request.input = buffer.data;
  request.output = output;
  return impl_->Start(request);
}

absl::StatusOr<std::vector<int64_t>> Session::RankStacked(
    const std::string& what, const std::string& name,
    const Buffer& buffer) const {
  const int32_t world = size();
  if (buffer.shape.empty() || buffer.shape[0] % world != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " of \"", name, "\": the buffer's shape [",
        absl::StrJoin(buffer.shape, ", "), "] does not split into ", world,
        " equal parts along its first dimension; give a multiple of the "
        "world size"));
  }
  std::vector<int64_t> stacked = {world, buffer.shape[0] / world};
  stacked.insert(stacked.end(), buffer.shape.begin() + 1, buffer.shape.end());
  return stacked;
}

absl::StatusOr<OperationHandle> Session::ReduceScatterAsync(
    const std::string& name, const Buffer& buffer, void* output, bool average,
    v1::ReduceOp op) {
  absl::StatusOr<std::vector<int64_t>> stacked =
      RankStacked("reduce_scatter", name, buffer);
  if (!stacked.ok()) return stacked.status();
  OperationRequest request;
  request.spec =
      MakeSpec(name, buffer.dtype, *stacked, v1::COLLECTIVE_OP_REDUCE_SCATTER,
               v1::MEMORY_KIND_HOST);
  request.input = buffer.data;
  request.output = output;
  request.average = average;
  request.reduce_op = op;
  return impl_->Start(request);
}

absl::StatusOr<OperationHandle> Session::AlltoallAsync(const std::string& name,
                                                       const Buffer& buffer,
                                                       void* output) {
  absl::StatusOr<std::vector<int64_t>> stacked =
      RankStacked("alltoall", name, buffer);
  if (!stacked.ok()) return stacked.status();
  OperationRequest request;
  request.spec = MakeSpec(name, buffer.dtype, *stacked,
                          v1::COLLECTIVE_OP_ALLTOALL, v1::MEMORY_KIND_HOST);
  request.input = buffer.data;
  request.output = output;
  return impl_->Start(request);
}

absl::StatusOr<OperationHandle> Session::PushPullAsync(
    const std::string& name, const DeviceBuffer& buffer, bool average,
    v1::ReduceOp op) {
  OperationRequest request;
  request.spec = MakeSpec(name, buffer.dtype, buffer.shape,
                          v1::COLLECTIVE_OP_PUSH_PULL, v1::MEMORY_KIND_CUDA);
  request.cuda = MakeCudaBuffer(buffer);
  request.average = average;
  request.reduce_op = op;
  return impl_->Start(request);
}

absl::StatusOr<OperationHandle> Session::BroadcastAsync(
    const std::string& name, const DeviceBuffer& buffer, int32_t root_rank) {
  OperationRequest request;
  request.spec = MakeSpec(name, buffer.dtype, buffer.shape,
                          v1::COLLECTIVE_OP_BROADCAST, v1::MEMORY_KIND_CUDA);
  request.cuda = MakeCudaBuffer(buffer);
  request.root_rank = root_rank;
  return impl_->Start(request);
}

absl::StatusOr<HostRegions> Session::Regions(const std::string& name) const {
  return impl_->Regions(name);
}

bool Session::Poll(const OperationHandle& handle) const {
  return handle != nullptr && handle->handle->Poll();
}

absl::Status Session::Synchronize(const OperationHandle& handle,
                                  std::chrono::milliseconds timeout) {
  return impl_->Synchronize(handle, timeout);
}

absl::Status Session::PushPull(const std::string& name, const Buffer& buffer,
                               bool average, v1::ReduceOp op) {
  absl::StatusOr<OperationHandle> handle =
      PushPullAsync(name, buffer, average, op);
  if (!handle.ok()) return handle.status();
  return Synchronize(*handle);
}

absl::Status Session::Broadcast(const std::string& name, const Buffer& buffer,
                                int32_t root_rank) {
  absl::StatusOr<OperationHandle> handle =
      BroadcastAsync(name, buffer, root_rank);
  if (!handle.ok()) return handle.status();
  return Synchronize(*handle);
}

absl::Status Session::Alltoall(const std::string& name, const Buffer& buffer,
                               void* output) {
  absl::StatusOr<OperationHandle> handle = AlltoallAsync(name, buffer, output);
  if (!handle.ok()) return handle.status();
  return Synchronize(*handle);
}

absl::Status Session::Allgather(const std::string& name, const Buffer& buffer,
                                void* output) {
  absl::StatusOr<OperationHandle> handle = AllgatherAsync(name, buffer, output);
  if (!handle.ok()) return handle.status();
  return Synchronize(*handle);
}

absl::Status Session::ReduceScatter(const std::string& name,
                                    const Buffer& buffer, void* output,
                                    bool average, v1::ReduceOp op) {
  absl::StatusOr<OperationHandle> handle =
      ReduceScatterAsync(name, buffer, output, average, op);
  if (!handle.ok()) return handle.status();
  return Synchronize(*handle);
}

absl::Status Session::PushPull(const std::string& name,
                               const DeviceBuffer& buffer, bool average,
                               v1::ReduceOp op) {
  absl::StatusOr<OperationHandle> handle =
      PushPullAsync(name, buffer, average, op);
  if (!handle.ok()) return handle.status();
  return Synchronize(*handle);
}

absl::Status Session::Broadcast(const std::string& name,
                                const DeviceBuffer& buffer, int32_t root_rank) {
  absl::StatusOr<OperationHandle> handle =
      BroadcastAsync(name, buffer, root_rank);
  if (!handle.ok()) return handle.status();
  return Synchronize(*handle);
}

absl::Status Session::BroadcastParameters(
    const std::vector<std::pair<std::string, Buffer>>& params,
    int32_t root_rank) {
  std::vector<v1::TensorSpec> specs;
  for (const auto& [name, buffer] : params) {
    specs.push_back(MakeSpec(absl::StrCat("Parameter.", name), buffer.dtype,
                             buffer.shape, v1::COLLECTIVE_OP_BROADCAST,
                             v1::MEMORY_KIND_HOST));
  }
  if (absl::Status s = impl_->Declare(specs, {}); !s.ok()) return s;
  std::vector<OperationHandle> handles;
  absl::Status first_error;
  for (size_t i = 0; i < params.size(); ++i) {
    absl::StatusOr<OperationHandle> handle =
        BroadcastAsync(specs[i].name(), params[i].second, root_rank);
    if (!handle.ok()) {
      first_error = handle.status();
      break;
    }
    handles.push_back(std::move(*handle));
  }
  // Everything started is synchronized, even after an error, so no buffer
  // is written behind the caller's back.
  for (const OperationHandle& handle : handles) {
    absl::Status s = Synchronize(handle);
    if (first_error.ok()) first_error = s;
  }
  return first_error;
}

absl::Status Session::Shutdown(std::chrono::milliseconds drain_timeout) {
  return impl_->Shutdown(drain_timeout);
}

}  // namespace baton
