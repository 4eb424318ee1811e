// baton._baton: the Python binding of baton::Session.
//
// It takes raw pointers, dtypes and shapes from Python (and, for CUDA
// tensors, CUDA IPC handles as bytes) and never links libtorch or CUDA, so
// one build serves any torch version; baton/torch/ turns tensors into those
// arguments. Every call that can wait releases the GIL.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "baton/job_status.h"
#include "baton/session.h"
#include "baton/status_format.h"
#include "common/tensor_retired.h"

namespace py = pybind11;

namespace baton::client {
namespace {

// What Python holds for a started operation (Operation itself is opaque).
struct PyOperation {
  OperationHandle handle;
  std::string name;
};

// One of a host tensor's shared-memory regions as a Python buffer (bytes,
// writable), for torch.frombuffer. It keeps the Session alive, so that the
// mapping outlives every tensor made from it.
struct SharedRegion {
  uint8_t* data = nullptr;
  int64_t bytes = 0;
  bool writable = false;
  py::object session;
};

// Carries an absl::Status to the exception translator. `job_failure`: the
// status is how an operation ended (the job failed it), not a refusal of
// the call, whatever its code.
struct StatusError {
  absl::Status status;
  bool job_failure = false;
};

void Check(const absl::Status& status) {
  if (!status.ok()) throw StatusError{status};
}

template <typename T>
T Check(absl::StatusOr<T> value) {
  if (!value.ok()) throw StatusError{value.status()};
  return std::move(*value);
}

// The one place that decides which Python exception a failure raises
// (docs/api.md, Errors). A call refused for how it was made (its
// arguments, the session's state, a name in flight) raises ValueError, as
// Horovod does: nothing was started, no other rank waits on it, fix the
// call. A wait that ran out of the caller's own timeout raises
// TimeoutError. Everything the job did (an operation that failed, the
// agent gone, a node lost, a timeout inside the job) raises BatonError.
PyObject* ExceptionType(const StatusError& e, PyObject* baton_error) {
  if (e.job_failure) return baton_error;
  switch (e.status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kOutOfRange:
      return PyExc_ValueError;
    case absl::StatusCode::kDeadlineExceeded:
      return PyExc_TimeoutError;
    default:
      return baton_error;
  }
}

// How often a blocking call looks for a signal (Ctrl-C): Python runs its
// handlers only between bytecodes, so a call that waits in C++ for longer
// would hold KeyboardInterrupt back until it returns.
constexpr std::chrono::milliseconds kSignalSlice{100};

// Runs the pending signal handlers with the GIL held; a handler that
// raised (KeyboardInterrupt) propagates from here.
void CheckSignals() {
  py::gil_scoped_acquire acquire;
  if (PyErr_CheckSignals() != 0) throw py::error_already_set();
}

// Calls `wait(slice)` without the GIL, with slices of at most kSignalSlice,
// until it returns a value or `timeout` passed (then nullopt); signal
// handlers run between the slices.
template <typename Wait>
auto InSlices(std::chrono::milliseconds timeout, Wait wait)
    -> decltype(wait(timeout)) {
  py::gil_scoped_release release;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    auto done =
        wait(std::clamp(left, std::chrono::milliseconds(0), kSignalSlice));
    if (done.has_value() || left <= kSignalSlice) return done;
    CheckSignals();
  }
}

// Waits for `operation` up to `timeout`, in slices between which signal
// handlers run. An interrupted wait leaves the operation in flight:
// synchronize it again, or shutdown abandons it.
absl::Status SynchronizeInterruptibly(Session& session,
                                      const PyOperation& operation,
                                      std::chrono::milliseconds timeout) {
  const std::optional<absl::Status> done = InSlices(
      timeout,
      [&](std::chrono::milliseconds slice) -> std::optional<absl::Status> {
        // Not a Poll after the slice: the operation may complete between
        // the two, and the slice's timeout is no outcome of it.
        absl::Status status = session.Synchronize(operation.handle, slice);
        if (StillInFlight(status)) return std::nullopt;
        return status;
      });
  if (!done.has_value()) {
    return absl::DeadlineExceededError(
        absl::StrCat("tensor \"", operation.name, "\" did not complete within ",
                     timeout.count(), " ms; it is still in flight"));
  }
  // A failure now is how the job ended the operation.
  if (!done->ok()) throw StatusError{*done, /*job_failure=*/true};
  return *done;
}

// Session::WaitForGeneration in the same slices: the new generation, a
// TimeoutError when none came within `timeout`, BatonError when the job
// ended meanwhile.
int64_t WaitForGenerationInterruptibly(Session& session, int64_t after,
                                       std::chrono::milliseconds timeout) {
  const std::optional<absl::StatusOr<int64_t>> done =
      InSlices(timeout,
               [&](std::chrono::milliseconds slice)
                   -> std::optional<absl::StatusOr<int64_t>> {
                 absl::StatusOr<int64_t> generation =
                     session.WaitForGeneration(after, slice);
                 if (absl::IsDeadlineExceeded(generation.status()))
                   return std::nullopt;
                 return generation;
               });
  if (!done.has_value()) {
    throw StatusError{absl::DeadlineExceededError(
        absl::StrCat("the job ran no generation after ", after, " within ",
                     timeout.count(), " ms"))};
  }
  if (!done->ok()) throw StatusError{done->status(), /*job_failure=*/true};
  return **done;
}

Buffer MakeBuffer(uintptr_t data, int dtype, std::vector<int64_t> shape) {
  Buffer buffer;
  buffer.data = reinterpret_cast<void*>(data);
  buffer.dtype = static_cast<v1::DataType>(dtype);
  buffer.shape = std::move(shape);
  return buffer;
}

DeviceBuffer MakeDeviceBuffer(int dtype, std::vector<int64_t> shape,
                              const py::bytes& memory_handle, int64_t offset,
                              const py::bytes& event_handle,
                              std::string pci_bus_id) {
  DeviceBuffer buffer;
  buffer.dtype = static_cast<v1::DataType>(dtype);
  buffer.shape = std::move(shape);
  buffer.memory_handle = memory_handle.cast<std::string>();
  buffer.offset = offset;
  buffer.event_handle = event_handle.cast<std::string>();
  buffer.pci_bus_id = std::move(pci_bus_id);
  return buffer;
}

// (name, dtype, shape, op) or (name, dtype, shape, op, memory).
v1::TensorSpec SpecFromTuple(const py::tuple& tensor) {
  if (tensor.size() != 4 && tensor.size() != 5) {
    throw py::value_error(
        "declare: each tensor is (name, dtype, shape, op) or (name, dtype, "
        "shape, op, memory), not a tuple of " +
        std::to_string(tensor.size()));
  }
  v1::TensorSpec spec;
  spec.set_name(tensor[0].cast<std::string>());
  spec.set_dtype(static_cast<v1::DataType>(tensor[1].cast<int>()));
  for (int64_t d : tensor[2].cast<std::vector<int64_t>>()) spec.add_shape(d);
  spec.set_op(static_cast<v1::CollectiveOp>(tensor[3].cast<int>()));
  if (tensor.size() == 5) {
    spec.set_memory(static_cast<v1::MemoryKind>(tensor[4].cast<int>()));
  }
  return spec;
}

std::chrono::milliseconds Millis(double seconds) {
  if (seconds < 0) seconds = 0;
  // Beyond a day means "no deadline" for every caller here.
  if (seconds > 86400.0) seconds = 86400.0;
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
}

std::unique_ptr<Session> InitSession(py::object attach_timeout) {
  absl::StatusOr<ClientOptions> options = ClientOptions::FromEnvironment();
  Check(options.status());
  if (!attach_timeout.is_none()) {
    options->attach_timeout = Millis(attach_timeout.cast<double>());
  }
  // What a signal handler raised while the attach waited: the attach ends
  // (the agent sees this trainer leave) and it is raised here.
  auto interrupted = std::make_shared<std::optional<py::error_already_set>>();
  options->interrupted = [interrupted]() {
    py::gil_scoped_acquire acquire;
    if (PyErr_CheckSignals() == 0) return absl::OkStatus();
    interrupted->emplace();
    return absl::CancelledError("interrupted while attaching");
  };
  absl::StatusOr<std::unique_ptr<Session>> session;
  {
    py::gil_scoped_release release;
    session = Session::Init(*options);
  }
  if (interrupted->has_value()) throw std::move(**interrupted);
  std::unique_ptr<Session> attached = Check(std::move(session));
  // torchrun's or batonrun's RANK / WORLD_SIZE must be what the job assigned.
  Check(attached->CheckLauncherEnvironment());
  return attached;
}

}  // namespace
}  // namespace baton::client

PYBIND11_MODULE(_baton, m) {
  using baton::Session;
  using baton::client::Check;
  using baton::client::InitSession;
  using baton::client::MakeBuffer;
  using baton::client::MakeDeviceBuffer;
  using baton::client::Millis;
  using baton::client::PyOperation;
  using baton::client::SharedRegion;
  using baton::client::SpecFromTuple;
  using baton::client::StatusError;
  using baton::client::SynchronizeInterruptibly;
  using baton::client::WaitForGenerationInterruptibly;
  namespace v1 = baton::v1;

  m.doc() = "baton's trainer client (use baton.torch for PyTorch)";

  static py::exception<StatusError> error(m, "BatonError", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      PyObject* type = baton::client::ExceptionType(e, error.ptr());
      py::object exc =
          py::handle(type)(py::str(std::string(e.status.message())));
      exc.attr("code") = py::str(absl::StatusCodeToString(e.status.code()));
      // The ranks declared the tensor differently: its next operation
      // declares it anew (baton.torch forgets an unnamed call's name).
      exc.attr("retired") = py::bool_(baton::IsTensorRetired(e.status));
      PyErr_SetObject(type, exc.ptr());
    }
  });

  m.attr("FLOAT32") = static_cast<int>(v1::DATA_TYPE_FLOAT32);
  m.attr("FLOAT64") = static_cast<int>(v1::DATA_TYPE_FLOAT64);
  m.attr("FLOAT16") = static_cast<int>(v1::DATA_TYPE_FLOAT16);
  m.attr("BFLOAT16") = static_cast<int>(v1::DATA_TYPE_BFLOAT16);
  m.attr("INT32") = static_cast<int>(v1::DATA_TYPE_INT32);
  m.attr("INT64") = static_cast<int>(v1::DATA_TYPE_INT64);
  m.attr("UINT8") = static_cast<int>(v1::DATA_TYPE_UINT8);
  m.attr("INT8") = static_cast<int>(v1::DATA_TYPE_INT8);
  m.attr("INT16") = static_cast<int>(v1::DATA_TYPE_INT16);
  m.attr("PUSH_PULL") = static_cast<int>(v1::COLLECTIVE_OP_PUSH_PULL);
  m.attr("BROADCAST") = static_cast<int>(v1::COLLECTIVE_OP_BROADCAST);
  m.attr("ALLGATHER") = static_cast<int>(v1::COLLECTIVE_OP_ALLGATHER);
  m.attr("REDUCE_SCATTER") = static_cast<int>(v1::COLLECTIVE_OP_REDUCE_SCATTER);
  m.attr("ALLTOALL") = static_cast<int>(v1::COLLECTIVE_OP_ALLTOALL);
  m.attr("REDUCE_SUM") = static_cast<int>(v1::REDUCE_OP_SUM);
  m.attr("REDUCE_MIN") = static_cast<int>(v1::REDUCE_OP_MIN);
  m.attr("REDUCE_MAX") = static_cast<int>(v1::REDUCE_OP_MAX);
  m.attr("REDUCE_PRODUCT") = static_cast<int>(v1::REDUCE_OP_PRODUCT);
  m.attr("REDUCE_BAND") = static_cast<int>(v1::REDUCE_OP_BAND);
  m.attr("REDUCE_BOR") = static_cast<int>(v1::REDUCE_OP_BOR);
  m.attr("REDUCE_BXOR") = static_cast<int>(v1::REDUCE_OP_BXOR);
  m.attr("MEMORY_HOST") = static_cast<int>(v1::MEMORY_KIND_HOST);
  m.attr("MEMORY_CUDA") = static_cast<int>(v1::MEMORY_KIND_CUDA);

  py::class_<PyOperation>(m, "Operation",
                          "A started collective operation (opaque).");

  py::class_<SharedRegion>(m, "SharedRegion", py::buffer_protocol(),
                           "A tensor's shared-memory region (a "
                           "buffer of bytes; keeps the session alive).")
      .def_buffer([](SharedRegion& r) {
        return py::buffer_info(r.data, 1,
                               py::format_descriptor<uint8_t>::format(), 1,
                               {r.bytes}, {1}, !r.writable);
      })
      .def("__len__", [](const SharedRegion& r) { return r.bytes; });

  py::class_<Session>(m, "Session")
      .def_static("init", &InitSession, py::arg("attach_timeout") = py::none(),
                  "Attaches to this node's agent (configured by the "
                  "environment: BATON_AGENT_SOCKET, BATON_JOB, LOCAL_RANK, "
                  "...) and waits until the job is formed.")
      .def("rank", &Session::rank)
      .def("size", &Session::size)
      .def("local_rank", &Session::local_rank)
      .def("local_size", &Session::local_size)
      .def("generation", &Session::generation,
           "The job's generation this session is in (rank() and size() "
           "describe it).")
      .def(
          "wait_for_generation",
          [](Session& s, int64_t after, double timeout) {
            return WaitForGenerationInterruptibly(s, after, Millis(timeout));
          },
          py::arg("after"), py::arg("timeout"),
          "Waits (timeout in seconds) until the job runs a generation newer "
          "than `after`; returns it. TimeoutError when none came, BatonError "
          "when the job ended.")
      .def("fence_generation", &Session::FenceGeneration, py::arg("generation"),
           "Operations started from now on run only in `generation` (0: "
           "any); later, they fail with ABORTED.")
      .def("join_pending", &Session::JoinPending,
           "Whether nodes wait to join the running generation (admitted at "
           "the next commit: admit_joins).")
      .def(
          "admit_joins", [](Session& s) { Check(s.AdmitJoins()); },
          "Asks for the waiting nodes to be admitted now: the generation "
          "ends.")
      .def("next_step", &Session::NextStep,
           "The highest step a tensor's next operation takes.")
      .def("set_step_floor", &Session::SetStepFloor, py::arg("floor"),
           "Raises every tensor's next step to at least `floor`, also for "
           "names first used later (names starting with \"baton.\" aside).")
      .def(
          "declare",
          [](Session& s, const std::vector<py::tuple>& tensors,
             const std::vector<std::tuple<int32_t, py::bytes, int64_t,
                                          py::bytes, std::string>>&
                 cuda_buffers) {
            std::vector<v1::TensorSpec> specs;
            for (const py::tuple& tensor : tensors) {
              specs.push_back(SpecFromTuple(tensor));
            }
            std::vector<v1::CudaBuffer> buffers;
            for (const auto& [index, memory_handle, offset, event_handle,
                              pci_bus_id] : cuda_buffers) {
              v1::CudaBuffer& buffer = buffers.emplace_back();
              buffer.set_index(index);
              buffer.set_memory_handle(memory_handle.cast<std::string>());
              buffer.set_offset(offset);
              buffer.set_event_handle(event_handle.cast<std::string>());
              buffer.set_pci_bus_id(pci_bus_id);
            }
            py::gil_scoped_release release;
            Check(s.DeclareTensors(specs, buffers));
          },
          py::arg("tensors"),
          py::arg("cuda_buffers") =
              std::vector<std::tuple<int32_t, py::bytes, int64_t, py::bytes,
                                     std::string>>(),
          "Declares [(name, dtype, shape, op[, memory])] in order, in one "
          "round trip. Each tensor of memory MEMORY_CUDA takes one of "
          "cuda_buffers: (index in tensors, memory_handle (64 bytes), "
          "offset, event_handle (64 bytes), pci_bus_id).")
      .def(
          "push_pull_async",
          [](Session& s, const std::string& name, uintptr_t data, int dtype,
             std::vector<int64_t> shape, bool average, uintptr_t output,
             int op) {
            baton::Buffer buffer = MakeBuffer(data, dtype, std::move(shape));
            py::gil_scoped_release release;
            return PyOperation{
                Check(s.PushPullAsync(name, buffer,
                                      reinterpret_cast<void*>(output), average,
                                      static_cast<v1::ReduceOp>(op))),
                name};
          },
          py::arg("name"), py::arg("data"), py::arg("dtype"), py::arg("shape"),
          py::arg("average"), py::arg("output"),
          py::arg("op") = static_cast<int>(v1::REDUCE_OP_SUM),
          "Copies `data` in and starts the push-pull (op: REDUCE_SUM, "
          "REDUCE_MIN, ...); synchronize() writes the result to `output`.")
      .def(
          "host_regions",
          [](py::object self, const std::string& name) {
            Session& s = self.cast<Session&>();
            const baton::HostRegions regions = Check(s.Regions(name));
            return py::make_tuple(
                SharedRegion{regions.input, regions.input_bytes, true, self},
                SharedRegion{const_cast<uint8_t*>(regions.output),
                             regions.size_bytes, true, self});
          },
          py::arg("name"),
          "(input, result): a declared host tensor's shared-memory regions as "
          "buffers (both writable for torch.frombuffer). push_pull_async with "
          "data = the input region copies "
          "nothing in, with output = the result region nothing out. The "
          "result region is the agent's to write: read it only.")
      .def(
          "broadcast_async",
          [](Session& s, const std::string& name, uintptr_t data, int dtype,
             std::vector<int64_t> shape, int32_t root_rank) {
            baton::Buffer buffer = MakeBuffer(data, dtype, std::move(shape));
            py::gil_scoped_release release;
            return PyOperation{Check(s.BroadcastAsync(name, buffer, root_rank)),
                               name};
          },
          py::arg("name"), py::arg("data"), py::arg("dtype"), py::arg("shape"),
          py::arg("root_rank"))
      .def(
          "allgather_async",
          [](Session& s, const std::string& name, uintptr_t data, int dtype,
             std::vector<int64_t> shape, uintptr_t output) {
            baton::Buffer buffer = MakeBuffer(data, dtype, std::move(shape));
            py::gil_scoped_release release;
            return PyOperation{
                Check(s.AllgatherAsync(name, buffer,
                                       reinterpret_cast<void*>(output))),
                name};
          },
          py::arg("name"), py::arg("data"), py::arg("dtype"), py::arg("shape"),
          py::arg("output"),
          "Copies `data` in and starts the allgather; synchronize() writes "
          "every rank's data, in rank order, to `output` (size() times as "
          "many bytes).")
      .def(
          "reduce_scatter_async",
          [](Session& s, const std::string& name, uintptr_t data, int dtype,
             std::vector<int64_t> shape, uintptr_t output, bool average,
             int op) {
            baton::Buffer buffer = MakeBuffer(data, dtype, std::move(shape));
            py::gil_scoped_release release;
            return PyOperation{
                Check(s.ReduceScatterAsync(
                    name, buffer, reinterpret_cast<void*>(output), average,
                    static_cast<v1::ReduceOp>(op))),
                name};
          },
          py::arg("name"), py::arg("data"), py::arg("dtype"), py::arg("shape"),
          py::arg("output"), py::arg("average"),
          py::arg("op") = static_cast<int>(v1::REDUCE_OP_SUM),
          "Copies `data` in (its first dimension a multiple of size()) and "
          "starts the reduce-scatter; synchronize() writes this rank's part "
          "(1/size() of the bytes) to `output`.")
      .def(
          "alltoall_async",
          [](Session& s, const std::string& name, uintptr_t data, int dtype,
             std::vector<int64_t> shape, uintptr_t output) {
            baton::Buffer buffer = MakeBuffer(data, dtype, std::move(shape));
            py::gil_scoped_release release;
            return PyOperation{
                Check(s.AlltoallAsync(name, buffer,
                                      reinterpret_cast<void*>(output))),
                name};
          },
          py::arg("name"), py::arg("data"), py::arg("dtype"), py::arg("shape"),
          py::arg("output"),
          "Copies `data` in (its first dimension a multiple of size(), one "
          "block per rank) and starts the alltoall; synchronize() writes "
          "block r of every rank r, in rank order, to `output` (as many "
          "bytes as `data`).")
      .def(
          "push_pull_device_async",
          [](Session& s, const std::string& name, int dtype,
             std::vector<int64_t> shape, bool average,
             const py::bytes& memory_handle, int64_t offset,
             const py::bytes& event_handle, std::string pci_bus_id, int op) {
            baton::DeviceBuffer buffer =
                MakeDeviceBuffer(dtype, std::move(shape), memory_handle, offset,
                                 event_handle, std::move(pci_bus_id));
            py::gil_scoped_release release;
            return PyOperation{
                Check(s.PushPullAsync(name, buffer, average,
                                      static_cast<v1::ReduceOp>(op))),
                name};
          },
          py::arg("name"), py::arg("dtype"), py::arg("shape"),
          py::arg("average"), py::arg("memory_handle"), py::arg("offset"),
          py::arg("event_handle"), py::arg("pci_bus_id") = "",
          py::arg("op") = static_cast<int>(v1::REDUCE_OP_SUM),
          "Starts the push-pull of a CUDA tensor in place in its buffer "
          "(CUDA IPC handles as bytes): write the input and record the "
          "event first; once synchronize() returns, the result is there.")
      .def(
          "broadcast_device_async",
          [](Session& s, const std::string& name, int dtype,
             std::vector<int64_t> shape, int32_t root_rank,
             const py::bytes& memory_handle, int64_t offset,
             const py::bytes& event_handle, std::string pci_bus_id) {
            baton::DeviceBuffer buffer =
                MakeDeviceBuffer(dtype, std::move(shape), memory_handle, offset,
                                 event_handle, std::move(pci_bus_id));
            py::gil_scoped_release release;
            return PyOperation{Check(s.BroadcastAsync(name, buffer, root_rank)),
                               name};
          },
          py::arg("name"), py::arg("dtype"), py::arg("shape"),
          py::arg("root_rank"), py::arg("memory_handle"), py::arg("offset"),
          py::arg("event_handle"), py::arg("pci_bus_id") = "",
          "Starts the broadcast of a CUDA tensor in place in its buffer.")
      .def(
          "poll",
          [](const Session& s, const PyOperation& op) {
            return s.Poll(op.handle);
          },
          py::arg("operation"))
      .def(
          "synchronize",
          [](Session& s, const PyOperation& op, double timeout) {
            Check(SynchronizeInterruptibly(s, op, Millis(timeout)));
          },
          py::arg("operation"), py::arg("timeout") = 86400.0,
          "Waits (timeout in seconds) and writes the result into the output. "
          "A signal handler that raises (Ctrl-C: KeyboardInterrupt) ends the "
          "wait within 0.1 s and leaves the operation in flight.")
      .def(
          "shutdown",
          [](Session& s, double drain_timeout) {
            py::gil_scoped_release release;
            Check(s.Shutdown(Millis(drain_timeout)));
          },
          py::arg("drain_timeout") = 60.0,
          "Waits up to drain_timeout for what is in flight (not "
          "interruptible: baton.torch.shutdown drains first, in slices), "
          "then leaves the job.");

  m.def(
      "job_status_text",
      [](const std::string& address, const std::string& job,
         int64_t min_global_step, double wait) {
        py::gil_scoped_release release;
        return baton::FormatJob(
            Check(baton::FetchJobStatus(address, job, min_global_step,
                                        Millis(wait))),
            absl::Now());
      },
      py::arg("address"), py::arg("job"), py::arg("min_global_step") = -1,
      py::arg("wait") = 3.0,
      "The job's status from the coordinator at `address`, as `batonctl "
      "status JOB` prints it.");
}
