// baton._baton: the Python binding of baton::Session.
//
// It takes raw pointers, dtypes and shapes from Python (and, for CUDA
// tensors, CUDA IPC handles as bytes) and never links libtorch or CUDA, so
// one build serves any torch version; baton/torch/ turns tensors into those
// arguments. Every call that can wait releases the GIL.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "baton/job_status.h"
#include "baton/session.h"
#include "baton/status_format.h"

namespace py = pybind11;

namespace baton::client {
namespace {

// What Python holds for a started operation (Operation itself is opaque).
struct PyOperation {
  OperationHandle handle;
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

// Carries an absl::Status to the exception translator.
struct StatusError {
  absl::Status status;
};

void Check(const absl::Status& status) {
  if (!status.ok()) throw StatusError{status};
}

template <typename T>
T Check(absl::StatusOr<T> value) {
  if (!value.ok()) throw StatusError{value.status()};
  return std::move(*value);
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
  py::gil_scoped_release release;
  std::unique_ptr<Session> session = Check(Session::Init(*options));
  return session;
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
  namespace v1 = baton::v1;

  m.doc() = "baton's trainer client (use baton.torch for PyTorch)";

  static py::exception<StatusError> error(m, "BatonError", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      const std::string text = std::string(e.status.message());
      switch (e.status.code()) {
        case absl::StatusCode::kInvalidArgument:
          PyErr_SetString(PyExc_ValueError, text.c_str());
          break;
        case absl::StatusCode::kDeadlineExceeded:
          PyErr_SetString(PyExc_TimeoutError, text.c_str());
          break;
        default: {
          py::object exc = py::handle(error.ptr())(py::str(text));
          exc.attr("code") = py::str(absl::StatusCodeToString(e.status.code()));
          PyErr_SetObject(error.ptr(), exc.ptr());
          break;
        }
      }
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
  m.attr("PUSH_PULL") = static_cast<int>(v1::COLLECTIVE_OP_PUSH_PULL);
  m.attr("BROADCAST") = static_cast<int>(v1::COLLECTIVE_OP_BROADCAST);
  m.attr("MEMORY_HOST") = static_cast<int>(v1::MEMORY_KIND_HOST);
  m.attr("MEMORY_CUDA") = static_cast<int>(v1::MEMORY_KIND_CUDA);

  py::class_<PyOperation>(m, "Operation",
                          "A started push-pull or broadcast (opaque).");

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
             std::vector<int64_t> shape, bool average, uintptr_t output) {
            baton::Buffer buffer = MakeBuffer(data, dtype, std::move(shape));
            py::gil_scoped_release release;
            return PyOperation{Check(s.PushPullAsync(
                name, buffer, reinterpret_cast<void*>(output), average))};
          },
          py::arg("name"), py::arg("data"), py::arg("dtype"), py::arg("shape"),
          py::arg("average"), py::arg("output"),
          "Copies `data` in and starts the push-pull; synchronize() writes "
          "the result to `output`.")
      .def(
          "host_regions",
          [](py::object self, const std::string& name) {
            Session& s = self.cast<Session&>();
            const baton::HostRegions regions = Check(s.Regions(name));
            return py::make_tuple(
                SharedRegion{regions.input, regions.size_bytes, true, self},
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
            return PyOperation{
                Check(s.BroadcastAsync(name, buffer, root_rank))};
          },
          py::arg("name"), py::arg("data"), py::arg("dtype"), py::arg("shape"),
          py::arg("root_rank"))
      .def(
          "push_pull_device_async",
          [](Session& s, const std::string& name, int dtype,
             std::vector<int64_t> shape, bool average,
             const py::bytes& memory_handle, int64_t offset,
             const py::bytes& event_handle, std::string pci_bus_id) {
            baton::DeviceBuffer buffer =
                MakeDeviceBuffer(dtype, std::move(shape), memory_handle, offset,
                                 event_handle, std::move(pci_bus_id));
            py::gil_scoped_release release;
            return PyOperation{Check(s.PushPullAsync(name, buffer, average))};
          },
          py::arg("name"), py::arg("dtype"), py::arg("shape"),
          py::arg("average"), py::arg("memory_handle"), py::arg("offset"),
          py::arg("event_handle"), py::arg("pci_bus_id") = "",
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
            return PyOperation{
                Check(s.BroadcastAsync(name, buffer, root_rank))};
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
            py::gil_scoped_release release;
            Check(s.Synchronize(op.handle, Millis(timeout)));
          },
          py::arg("operation"), py::arg("timeout") = 86400.0,
          "Waits (timeout in seconds) and writes the result into the output.")
      .def(
          "shutdown",
          [](Session& s, double drain_timeout) {
            py::gil_scoped_release release;
            Check(s.Shutdown(Millis(drain_timeout)));
          },
          py::arg("drain_timeout") = 60.0);

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
