// baton._baton: the Python binding of baton::Session.
//
// It takes raw pointers, dtypes and shapes from Python and never links
// libtorch, so one build serves any torch version; baton/torch/ turns
// tensors into those arguments. Every call that can wait releases the GIL.

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

namespace baton {
namespace {

// What Python holds for a started operation (Operation itself is opaque).
struct PyOperation {
  OperationHandle handle;
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
}  // namespace baton

PYBIND11_MODULE(_baton, m) {
  using baton::Check;
  using baton::MakeBuffer;
  using baton::Millis;
  using baton::Session;
  namespace v1 = baton::v1;

  m.doc() = "baton's trainer client (use baton.torch for PyTorch)";

  static py::exception<baton::StatusError> error(m, "BatonError",
                                                 PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const baton::StatusError& e) {
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

  py::class_<baton::PyOperation>(m, "Operation",
                                 "A started push-pull or broadcast (opaque).");

  py::class_<Session>(m, "Session")
      .def_static("init", &baton::InitSession,
                  py::arg("attach_timeout") = py::none(),
                  "Attaches to this node's agent (configured by the "
                  "environment: BATON_AGENT_SOCKET, BATON_JOB, LOCAL_RANK, "
                  "...) and waits until the job is formed.")
      .def("rank", &Session::rank)
      .def("size", &Session::size)
      .def("local_rank", &Session::local_rank)
      .def("local_size", &Session::local_size)
      .def(
          "declare",
          [](Session& s,
             const std::vector<std::tuple<
                 std::string, int, std::vector<int64_t>, int>>& tensors) {
            std::vector<v1::TensorSpec> specs;
            for (const auto& [name, dtype, shape, op] : tensors) {
              v1::TensorSpec& spec = specs.emplace_back();
              spec.set_name(name);
              spec.set_dtype(static_cast<v1::DataType>(dtype));
              spec.set_op(static_cast<v1::CollectiveOp>(op));
              for (int64_t d : shape) spec.add_shape(d);
            }
            py::gil_scoped_release release;
            Check(s.DeclareTensors(specs));
          },
          py::arg("tensors"),
          "Declares [(name, dtype, shape, op)] in order, in one round trip.")
      .def(
          "push_pull_async",
          [](Session& s, const std::string& name, uintptr_t data, int dtype,
             std::vector<int64_t> shape, bool average, uintptr_t output) {
            baton::Buffer buffer = MakeBuffer(data, dtype, std::move(shape));
            py::gil_scoped_release release;
            return baton::PyOperation{Check(s.PushPullAsync(
                name, buffer, reinterpret_cast<void*>(output), average))};
          },
          py::arg("name"), py::arg("data"), py::arg("dtype"), py::arg("shape"),
          py::arg("average"), py::arg("output"),
          "Copies `data` in and starts the push-pull; synchronize() writes "
          "the result to `output`.")
      .def(
          "broadcast_async",
          [](Session& s, const std::string& name, uintptr_t data, int dtype,
             std::vector<int64_t> shape, int32_t root_rank) {
            baton::Buffer buffer = MakeBuffer(data, dtype, std::move(shape));
            py::gil_scoped_release release;
            return baton::PyOperation{
                Check(s.BroadcastAsync(name, buffer, root_rank))};
          },
          py::arg("name"), py::arg("data"), py::arg("dtype"), py::arg("shape"),
          py::arg("root_rank"))
      .def(
          "poll",
          [](const Session& s, const baton::PyOperation& op) {
            return s.Poll(op.handle);
          },
          py::arg("operation"))
      .def(
          "synchronize",
          [](Session& s, const baton::PyOperation& op, double timeout) {
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
