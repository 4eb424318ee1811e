#include "tests/gpu/ipc_trainer.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "agent/transport/nccl/cuda_nccl_api.h"
#include "agent/transport/nccl/gpu_api.h"
#include "common/status_macros.h"
#include "tests/gpu/line_pipe.h"

namespace baton::agent {
namespace {

using std::chrono::milliseconds;

constexpr int64_t kAlignment = 512;

// A trainer's CUDA state: one allocation holding its tensors, an
// interprocess ready event, both exported.
class Trainer {
 public:
  ~Trainer() { Stop().IgnoreError(); }

  // Makes the allocation and the event on device 0 and exports them.
  // FAILED_PRECONDITION when this machine cannot share CUDA memory
  // between processes.
  absl::Status Start(std::vector<int64_t> elements) {
    absl::StatusOr<gpu::GpuApi*> api = gpu::LoadCudaNcclApi();
    if (!api.ok()) return api.status();
    api_ = *api;
    elements_ = std::move(elements);
    offsets_ = TensorOffsets(elements_);
    BATON_RETURN_IF_ERROR(Cuda(api_->SetDevice(0), "cudaSetDevice(0)"));
    void* base = nullptr;
    BATON_RETURN_IF_ERROR(
        Cuda(api_->Malloc(&base, static_cast<size_t>(offsets_.back())),
             absl::StrCat("cudaMalloc of ", offsets_.back(), " bytes")));
    base_ = static_cast<char*>(base);
    BATON_RETURN_IF_ERROR(
        Cuda(api_->EventCreateInterprocess(&event_),
             "cudaEventCreateWithFlags(cudaEventInterprocess | "
             "cudaEventDisableTiming)"));
    BATON_RETURN_IF_ERROR(Cuda(api_->IpcGetMemHandle(&memory_handle_, base_),
                               "cudaIpcGetMemHandle"));
    BATON_RETURN_IF_ERROR(Cuda(api_->IpcGetEventHandle(&event_handle_, event_),
                               "cudaIpcGetEventHandle"));
    gpu::DeviceProperties properties;
    BATON_RETURN_IF_ERROR(Cuda(api_->GetDeviceProperties(0, &properties),
                               "cudaGetDeviceProperties(0)"));
    pci_bus_id_ = properties.pci_bus_id;
    return absl::OkStatus();
  }

  std::string ReadyLine() const {
    return absl::StrCat(
        "ready ",
        absl::BytesToHexString(absl::string_view(memory_handle_.bytes.data(),
                                                 memory_handle_.bytes.size())),
        " ",
        absl::BytesToHexString(absl::string_view(event_handle_.bytes.data(),
                                                 event_handle_.bytes.size())),
        " ", pci_bus_id_);
  }

  // The backward pass: the tensor's new value, then the ready event
  // recorded after it. cudaMemcpy from pageable host memory runs on the
  // legacy default stream and may return before its copy has landed; the
  // event is recorded on that stream, so it completes only after the copy.
  absl::Status Write(int tensor, int64_t multiplier) {
    BATON_RETURN_IF_ERROR(CheckIndex(tensor));
    std::vector<float> host(static_cast<size_t>(elements_[tensor]));
    for (size_t i = 0; i < host.size(); ++i) {
      host[i] = TensorValue(multiplier, static_cast<int64_t>(i));
    }
    BATON_RETURN_IF_ERROR(
        Cuda(api_->Memcpy(base_ + offsets_[tensor], host.data(),
                          host.size() * sizeof(float)),
             "cudaMemcpy to the device"));
    return Cuda(api_->EventRecord(event_, /*legacy default stream*/ nullptr),
                "cudaEventRecord");
  }

  // The tensor holds TensorValue(multiplier, i) everywhere, or an error
  // naming the first wrong element.
  absl::Status Check(int tensor, int64_t multiplier) {
    BATON_RETURN_IF_ERROR(CheckIndex(tensor));
    std::vector<float> host(static_cast<size_t>(elements_[tensor]));
    BATON_RETURN_IF_ERROR(Download(tensor, host));
    const std::string wrong = Mismatch(host, multiplier);
    if (wrong.empty()) return absl::OkStatus();
    // Tell a result that was still on its way from one that is wrong.
    std::this_thread::sleep_for(milliseconds(200));
    BATON_RETURN_IF_ERROR(Download(tensor, host));
    const std::string later = Mismatch(host, multiplier);
    return absl::UnavailableError(absl::StrCat(
        "tensor ", tensor, " (", host.size(), " float32): ", wrong,
        later.empty() ? "; 200 ms later it was right: the result reached the "
                        "trainer's memory after the operation was reported "
                        "done"
                      : absl::StrCat("; 200 ms later still: ", later)));
  }

  // Destroys the event and frees the memory.
  absl::Status Stop() {
    absl::Status status;
    if (event_ != nullptr) {
      status.Update(Cuda(api_->EventDestroy(event_), "cudaEventDestroy"));
      event_ = nullptr;
    }
    if (base_ != nullptr) {
      status.Update(Cuda(api_->Free(base_), "cudaFree"));
      base_ = nullptr;
    }
    return status;
  }

 private:
  absl::Status Cuda(gpu::CudaError error, absl::string_view call) const {
    if (error == gpu::kCudaSuccess) return absl::OkStatus();
    const std::string text = api_->CudaErrorText(error);
    const std::string message = absl::StrCat(call, " failed: ", text);
    // No CUDA IPC on this machine (or no second process on this GPU):
    // nothing the agent could do either.
    if (absl::StrContains(text, "(cudaErrorNotSupported)") ||
        absl::StrContains(text, "(cudaErrorDevicesUnavailable)")) {
      return absl::FailedPreconditionError(message);
    }
    return absl::UnavailableError(message);
  }

  absl::Status CheckIndex(int tensor) const {
    if (tensor < 0 || tensor >= static_cast<int>(elements_.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("no tensor ", tensor, "; there are ", elements_.size()));
    }
    return absl::OkStatus();
  }

  absl::Status Download(int tensor, std::vector<float>& host) const {
    return Cuda(api_->Memcpy(host.data(), base_ + offsets_[tensor],
                             host.size() * sizeof(float)),
                "cudaMemcpy to the host");
  }

  // "" when `host` holds TensorValue(multiplier, i) everywhere; otherwise
  // the first wrong element, what multiplier it looks like, and how many.
  static std::string Mismatch(const std::vector<float>& host,
                              int64_t multiplier) {
    size_t wrong = 0;
    size_t first = 0;
    for (size_t i = 0; i < host.size(); ++i) {
      if (host[i] == TensorValue(multiplier, static_cast<int64_t>(i))) continue;
      if (wrong++ == 0) first = i;
    }
    if (wrong == 0) return "";
    const float want = TensorValue(multiplier, static_cast<int64_t>(first));
    return absl::StrCat("element ", first, " is ", host[first], ", expected ",
                        want, " (as if the multiplier were ",
                        host[first] / static_cast<float>(first % 7 + 1),
                        " instead of ", multiplier, "); ", wrong, " of ",
                        host.size(), " elements wrong");
  }

  gpu::GpuApi* api_ = nullptr;
  std::vector<int64_t> elements_;
  std::vector<int64_t> offsets_;
  char* base_ = nullptr;
  gpu::Event event_ = nullptr;
  gpu::IpcMemHandle memory_handle_;
  gpu::IpcEventHandle event_handle_;
  std::string pci_bus_id_;
};

}  // namespace

std::vector<int64_t> TensorOffsets(const std::vector<int64_t>& elements) {
  std::vector<int64_t> offsets;
  int64_t offset = 0;
  for (int64_t count : elements) {
    offsets.push_back(offset);
    const int64_t end = offset + count * static_cast<int64_t>(sizeof(float));
    offset = (end + kAlignment - 1) / kAlignment * kAlignment;
  }
  offsets.push_back(offset);
  return offsets;
}

float TensorValue(int64_t multiplier, int64_t i) {
  return static_cast<float>(multiplier * (i % 7 + 1));
}

int RunTrainer(const std::string& layout) {
  const std::string who = absl::StrCat("trainer (pid ", ::getpid(), ")");
  const auto reply = [](absl::string_view line) {
    return WriteLine(kTrainerReplyFd, line);
  };
  std::vector<int64_t> elements;
  for (absl::string_view field : absl::StrSplit(layout, ',')) {
    int64_t count = 0;
    if (!absl::SimpleAtoi(field, &count) || count <= 0) {
      reply(absl::StrCat("error bad tensor layout \"", layout, "\""));
      return 2;
    }
    elements.push_back(count);
  }
  Trainer trainer;
  if (const absl::Status started = trainer.Start(std::move(elements));
      !started.ok()) {
    reply(absl::StrCat(
        absl::IsFailedPrecondition(started) ? "unsupported " : "error ",
        started.message()));
    return 1;
  }
  if (!reply(trainer.ReadyLine())) {
    std::fprintf(stderr, "%s: cannot answer the test: %s\n", who.c_str(),
                 std::strerror(errno));
    return 1;
  }
  std::string buffered;
  for (;;) {
    const absl::StatusOr<std::string> line =
        ReadLine(kTrainerCommandFd, buffered, milliseconds(-1));
    if (!line.ok()) {
      std::fprintf(stderr, "%s: the test went away (%s); freeing and exiting\n",
                   who.c_str(), std::string(line.status().message()).c_str());
      trainer.Stop().IgnoreError();
      return 3;
    }
    const std::vector<std::string> words = absl::StrSplit(*line, ' ');
    int tensor = 0;
    int64_t multiplier = 0;
    const bool has_arguments = words.size() == 3 &&
                               absl::SimpleAtoi(words[1], &tensor) &&
                               absl::SimpleAtoi(words[2], &multiplier);
    absl::Status status;
    if (words[0] == "quit") {
      status = trainer.Stop();
      reply(status.ok() ? "ok" : absl::StrCat("error ", status.message()));
      return status.ok() ? 0 : 1;
    } else if (words[0] == "write" && has_arguments) {
      status = trainer.Write(tensor, multiplier);
    } else if (words[0] == "check" && has_arguments) {
      status = trainer.Check(tensor, multiplier);
    } else {
      status = absl::InvalidArgumentError(
          absl::StrCat("unknown command \"", *line, "\""));
    }
    if (!reply(status.ok() ? "ok" : absl::StrCat("error ", status.message()))) {
      std::fprintf(stderr, "%s: cannot answer the test: %s\n", who.c_str(),
                   std::strerror(errno));
      trainer.Stop().IgnoreError();
      return 3;
    }
  }
}

}  // namespace baton::agent
