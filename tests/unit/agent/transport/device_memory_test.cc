// CudaDeviceMemory against the fake CUDA runtime: a trainer's allocations
// and ready events exported through (fake) CUDA IPC and opened by the agent.
// The fake maps an allocation at its own address, so the agent's view and
// the trainer's are the same bytes, and it records IPC misuse (a handle
// opened twice, a close of memory it did not open or with another device
// current), which every test checks for at the end.
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "agent/transport/nccl/cuda_device_memory.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/agent/transport/fake_gpu_api.h"

namespace baton::agent {
namespace {

using std::chrono::milliseconds;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using SteadyClock = std::chrono::steady_clock;

// Bounds every wait meant to succeed, and how late a timeout may surface.
constexpr milliseconds kLongWait{10000};
constexpr milliseconds kFailFast{3000};

// The fake's bus ids: CUDA device d is "0000:0<d + 1>:00.0".
constexpr char kBusId0[] = "0000:01:00.0";
constexpr char kBusId1[] = "0000:02:00.0";
constexpr char kBusId2[] = "0000:03:00.0";

std::string HandleBytes(const std::array<char, gpu::kCudaIpcHandleBytes>& a) {
  return std::string(a.data(), a.size());
}

// A node with 3 GPUs whose agent drives CUDA devices 2 and 0, in that order
// (local devices 0 and 1); device 1 belongs to nobody. The test plays the
// trainer on the same fake, exporting its allocations and events.
class DeviceMemoryTest : public ::testing::Test {
 protected:
  DeviceMemoryTest()
      : api_(std::make_shared<FakeNcclFabric>(),
             FakeGpuApi::Options{3, gpu::kCudaSuccess}) {}

  void SetUp() override {
    auto memory = CreateCudaDeviceMemory(&api_, {2, 0});
    ASSERT_TRUE(memory.ok()) << memory.status();
    memory_ = std::move(memory).value();
  }

  // Checks that the agent closed everything it opened and misused nothing.
  void TearDown() override {
    memory_.reset();
    EXPECT_EQ(api_.live_ipc_mappings(), 0);
    for (gpu::Stream stream : streams_) {
      api_.ReleaseStream(stream);
      EXPECT_EQ(api_.StreamSynchronize(stream), gpu::kCudaSuccess);
      EXPECT_EQ(api_.StreamDestroy(stream), gpu::kCudaSuccess);
    }
    for (gpu::Event event : events_) {
      EXPECT_EQ(api_.EventDestroy(event), gpu::kCudaSuccess);
    }
    for (void* allocation : allocations_) {
      EXPECT_EQ(api_.Free(allocation), gpu::kCudaSuccess);
    }
    EXPECT_THAT(api_.misuses(), IsEmpty());
    EXPECT_EQ(api_.live_events(), 0);
    EXPECT_EQ(api_.live_streams(), 0);
  }

  // The trainer's allocation of `bytes` on CUDA device `device`, byte i
  // holding i % 251.
  char* Allocate(int device, size_t bytes) {
    EXPECT_EQ(api_.SetDevice(device), gpu::kCudaSuccess);
    void* allocation = nullptr;
    EXPECT_EQ(api_.Malloc(&allocation, bytes), gpu::kCudaSuccess);
    allocations_.push_back(allocation);
    char* base = static_cast<char*>(allocation);
    for (size_t i = 0; i < bytes; ++i) base[i] = static_cast<char>(i % 251);
    return base;
  }

  // What the trainer declares for `bytes` bytes at `offset` in `base`.
  DeviceBufferSpec Spec(char* base, int64_t offset, int64_t bytes,
                        std::string pci_bus_id = "") {
    DeviceBufferSpec spec;
    spec.pci_bus_id = std::move(pci_bus_id);
    spec.memory_handle = HandleBytes(api_.ExportMemory(base).bytes);
    spec.offset = offset;
    spec.bytes = bytes;
    return spec;
  }

  // A trainer's stream on `device` whose work waits until ReleaseStream
  // (a kernel still running), and an event recorded on it after that work,
  // exported into `spec`.
  gpu::Stream RecordPendingEvent(int device, DeviceBufferSpec& spec) {
    EXPECT_EQ(api_.SetDevice(device), gpu::kCudaSuccess);
    gpu::Stream stream = nullptr;
    gpu::Event event = nullptr;
    EXPECT_EQ(api_.StreamCreate(&stream), gpu::kCudaSuccess);
    EXPECT_EQ(api_.EventCreate(&event), gpu::kCudaSuccess);
    streams_.push_back(stream);
    events_.push_back(event);
    api_.HoldStream(stream);
    EXPECT_EQ(api_.EventRecord(event, stream), gpu::kCudaSuccess);
    spec.event_handle = HandleBytes(api_.ExportEvent(event).bytes);
    return stream;
  }

  FakeGpuApi api_;
  std::unique_ptr<DeviceMemory> memory_;
  std::vector<void*> allocations_;
  std::vector<gpu::Stream> streams_;
  std::vector<gpu::Event> events_;
};

// --- Devices and opening
// ------------------------------------------------------

TEST_F(DeviceMemoryTest, DevicesAreTheBusIdsInLocalOrder) {
  EXPECT_THAT(memory_->devices(), ElementsAre(kBusId2, kBusId0));
}

TEST_F(DeviceMemoryTest, OpensOnTheDeviceTheBusIdNames) {
  char* base = Allocate(0, 1024);
  auto buffer = memory_->Open(Spec(base, 100, 200, kBusId0));
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  EXPECT_EQ((*buffer)->local_device(), 1);
  EXPECT_EQ((*buffer)->bytes(), 200u);
  const char* data = static_cast<const char*>((*buffer)->data());
  EXPECT_EQ(data[0], static_cast<char>(100));
  EXPECT_EQ(data[199], static_cast<char>(299 % 251));
  EXPECT_EQ(api_.ipc_opens(), 1);
  EXPECT_EQ(api_.live_ipc_mappings(), 1);
}

TEST_F(DeviceMemoryTest, BusIdsCompareByValueNotSpelling) {
  char* base = Allocate(0, 64);
  // nvidia-smi's 8-digit domain, and none.
  for (const std::string id : {"00000000:01:00.0", "01:00.0"}) {
    auto buffer = memory_->Open(Spec(base, 0, 64, id));
    ASSERT_TRUE(buffer.ok()) << id << ": " << buffer.status();
    EXPECT_EQ((*buffer)->local_device(), 1) << id;
  }
  // Another function of the same device is another device.
  EXPECT_EQ(memory_->Open(Spec(base, 0, 64, "0000:01:00.1")).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Without a bus id the memory is opened with the first driven device
// current, and again on its own device when that is another one.
TEST_F(DeviceMemoryTest, WithoutBusIdFindsTheDeviceOfTheMemory) {
  char* on_first = Allocate(2, 64);
  auto first = memory_->Open(Spec(on_first, 0, 64));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ((*first)->local_device(), 0);
  EXPECT_EQ(api_.ipc_opens(), 1);

  char* on_second = Allocate(0, 64);
  auto second = memory_->Open(Spec(on_second, 8, 16));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ((*second)->local_device(), 1);
  EXPECT_EQ((*second)->data(), on_second + 8);
  EXPECT_EQ(api_.ipc_opens(), 3);
  EXPECT_EQ(api_.live_ipc_mappings(), 2);
}

TEST_F(DeviceMemoryTest, TensorsOfOneAllocationShareOneMapping) {
  char* base = Allocate(0, 1024);
  auto first = memory_->Open(Spec(base, 0, 256, kBusId0));
  auto second = memory_->Open(Spec(base, 256, 768));
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(api_.ipc_opens(), 1);
  EXPECT_EQ((*second)->local_device(), 1);
  EXPECT_EQ(static_cast<char*>((*second)->data()) -
                static_cast<char*>((*first)->data()),
            256);

  first->reset();
  EXPECT_EQ(api_.live_ipc_mappings(), 1);
  second->reset();
  EXPECT_EQ(api_.live_ipc_mappings(), 0);

  // Opened anew once closed.
  auto again = memory_->Open(Spec(base, 0, 8, kBusId0));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(api_.ipc_opens(), 2);
}

TEST_F(DeviceMemoryTest, BuffersOutliveTheDeviceMemory) {
  char* base = Allocate(2, 64);
  auto buffer = memory_->Open(Spec(base, 0, 64));
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  memory_.reset();
  EXPECT_EQ(api_.live_ipc_mappings(), 1);
  buffer->reset();
  EXPECT_EQ(api_.live_ipc_mappings(), 0);
}

// Threads opening and dropping tensors of one allocation at once: it is
// never open twice, and closed at the end.
TEST_F(DeviceMemoryTest, ConcurrentOpensAndReleasesOfOneAllocation) {
  char* base = Allocate(0, 4096);
  const DeviceBufferSpec spec = Spec(base, 0, 4096);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        auto buffer = memory_->Open(spec);
        ASSERT_TRUE(buffer.ok()) << buffer.status();
        ASSERT_EQ((*buffer)->local_device(), 1);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(api_.live_ipc_mappings(), 0);
  EXPECT_GE(api_.ipc_opens(), 2);
}

// --- Refused tensors
// ----------------------------------------------------------

TEST_F(DeviceMemoryTest, RefusesMalformedSpecsNamingTheField) {
  char* base = Allocate(2, 64);
  DeviceBufferSpec short_handle = Spec(base, 0, 64);
  short_handle.memory_handle.resize(12);
  EXPECT_EQ(memory_->Open(short_handle).status(),
            absl::InvalidArgumentError(
                "CudaBuffer.memory_handle is 12 bytes; give the 64-byte "
                "cudaIpcMemHandle_t"));

  const absl::Status negative_offset =
      memory_->Open(Spec(base, -1, 64)).status();
  EXPECT_EQ(negative_offset.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(negative_offset.message(), HasSubstr("CudaBuffer.offset is -1"));

  for (int64_t bytes : {0, -8}) {
    const absl::Status empty = memory_->Open(Spec(base, 0, bytes)).status();
    EXPECT_EQ(empty.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(empty.message(), HasSubstr("size (bytes) is"));
  }

  DeviceBufferSpec long_event = Spec(base, 0, 64);
  long_event.event_handle = std::string(65, 'e');
  EXPECT_EQ(memory_->OpenEvent(long_event).status(),
            absl::InvalidArgumentError(
                "CudaBuffer.event_handle is 65 bytes; give the 64-byte "
                "cudaIpcEventHandle_t"));
  EXPECT_EQ(api_.ipc_opens(), 0);
}

TEST_F(DeviceMemoryTest, RefusesABusIdThisAgentDoesNotDrive) {
  char* base = Allocate(1, 64);
  const absl::Status status =
      memory_->Open(Spec(base, 0, 64, kBusId1)).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              HasSubstr("CudaBuffer.pci_bus_id \"0000:02:00.0\" is not a "
                        "device this agent drives (it drives 0000:03:00.0, "
                        "0000:01:00.0); start the agent with the trainers' "
                        "GPUs visible"));
  EXPECT_EQ(api_.ipc_opens(), 0);
}

TEST_F(DeviceMemoryTest, RefusesMemoryOnADeviceThisAgentDoesNotDrive) {
  char* base = Allocate(1, 64);
  const absl::Status status = memory_->Open(Spec(base, 0, 64)).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              HasSubstr("memory is on CUDA device 1 (PCI 0000:02:00.0), which "
                        "this agent does not drive (it drives 0000:03:00.0, "
                        "0000:01:00.0)"));
  EXPECT_EQ(api_.live_ipc_mappings(), 0);
}

TEST_F(DeviceMemoryTest, RefusesABusIdOfAnotherDeviceThanTheMemorys) {
  char* base = Allocate(0, 64);
  const absl::Status status =
      memory_->Open(Spec(base, 0, 64, kBusId2)).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              HasSubstr("CudaBuffer.pci_bus_id names local device 0 (CUDA "
                        "device 2, PCI 0000:03:00.0), but the tensor's memory "
                        "is on local device 1"));
  EXPECT_EQ(api_.live_ipc_mappings(), 0);

  // Nor may a second tensor of an open allocation name another device.
  auto open = memory_->Open(Spec(base, 0, 8, kBusId0));
  ASSERT_TRUE(open.ok()) << open.status();
  const int opens = api_.ipc_opens();
  EXPECT_EQ(memory_->Open(Spec(base, 8, 8, kBusId2)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(api_.ipc_opens(), opens);
  EXPECT_EQ(api_.live_ipc_mappings(), 1);
}

TEST_F(DeviceMemoryTest, HandleThatDoesNotOpenIsUnavailableWithCudasError) {
  DeviceBufferSpec spec;
  spec.memory_handle = std::string(gpu::kCudaIpcHandleBytes, 'x');
  spec.bytes = 64;
  const absl::Status status = memory_->Open(spec).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.message(),
              HasSubstr("cudaIpcOpenMemHandle of CudaBuffer.memory_handle on "
                        "local device 0 (CUDA device 2, PCI 0000:03:00.0) "
                        "failed: invalid argument (cudaErrorInvalidValue)"));

  // The allocation of a handle the trainer has freed since.
  char* base = Allocate(0, 64);
  const DeviceBufferSpec freed = Spec(base, 0, 64, kBusId0);
  ASSERT_EQ(api_.Free(base), gpu::kCudaSuccess);
  allocations_.pop_back();
  EXPECT_THAT(memory_->Open(freed).status().message(),
              HasSubstr("cudaIpcOpenMemHandle of CudaBuffer.memory_handle on "
                        "local device 1"));
}

TEST(CreateCudaDeviceMemoryTest, RefusesBadDeviceLists) {
  FakeGpuApi api(std::make_shared<FakeNcclFabric>(),
                 FakeGpuApi::Options{2, gpu::kCudaSuccess});
  EXPECT_EQ(CreateCudaDeviceMemory(&api, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateCudaDeviceMemory(&api, {1, 0, 1}).status(),
            absl::InvalidArgumentError("CUDA device 1 is listed twice"));
  EXPECT_EQ(CreateCudaDeviceMemory(&api, {2}).status(),
            absl::InvalidArgumentError(
                "CUDA device 2 does not exist: this machine has 2 (0..1)"));
  FakeGpuApi no_driver(
      std::make_shared<FakeNcclFabric>(),
      FakeGpuApi::Options{2, gpu::kCudaErrorInsufficientDriver});
  const absl::Status status = CreateCudaDeviceMemory(&no_driver, {0}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.message(), HasSubstr("no CUDA device"));
}

// --- Ready events
// -------------------------------------------------------------

TEST_F(DeviceMemoryTest, WaitReturnsOnceTheTrainersWorkIsDone) {
  char* base = Allocate(0, 64);
  DeviceBufferSpec spec = Spec(base, 0, 64);
  gpu::Stream stream = RecordPendingEvent(0, spec);
  auto buffer = memory_->Open(spec);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  auto event = memory_->OpenEvent(spec);
  ASSERT_TRUE(event.ok()) << event.status();

  std::atomic<bool> released{false};
  std::thread trainer([&] {
    std::this_thread::sleep_for(milliseconds(50));
    released = true;
    api_.ReleaseStream(stream);
  });
  EXPECT_TRUE((*event)->Wait(kLongWait).ok());
  EXPECT_TRUE(released);
  trainer.join();
  // An event that has passed stays passed.
  EXPECT_TRUE((*event)->Wait(milliseconds(0)).ok());
}

TEST_F(DeviceMemoryTest, WaitTimesOutNamingTheTimeout) {
  char* base = Allocate(2, 64);
  DeviceBufferSpec spec = Spec(base, 0, 64, kBusId2);
  gpu::Stream stream = RecordPendingEvent(2, spec);
  auto event = memory_->OpenEvent(spec);
  ASSERT_TRUE(event.ok()) << event.status();

  const auto start = SteadyClock::now();
  const absl::Status status = (*event)->Wait(milliseconds(50));
  const auto waited = SteadyClock::now() - start;
  EXPECT_EQ(status, absl::DeadlineExceededError(
                        "the trainer's ready event did not complete within "
                        "50 ms"));
  EXPECT_GE(waited, milliseconds(50));
  EXPECT_LT(waited, kFailFast);

  api_.ReleaseStream(stream);
  EXPECT_TRUE((*event)->Wait(kLongWait).ok());
}

// Without a bus id and without an open buffer, OpenEvent finds the device by
// opening the memory for a moment; with an open buffer it uses its device.
TEST_F(DeviceMemoryTest, OpenEventFindsTheTensorsDevice) {
  char* base = Allocate(0, 64);
  DeviceBufferSpec spec = Spec(base, 0, 64);
  RecordPendingEvent(0, spec);
  auto lone = memory_->OpenEvent(spec);
  ASSERT_TRUE(lone.ok()) << lone.status();
  EXPECT_EQ(api_.ipc_opens(), 2);
  EXPECT_EQ(api_.live_ipc_mappings(), 0);

  auto buffer = memory_->Open(spec);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  const int opens = api_.ipc_opens();
  auto with_buffer = memory_->OpenEvent(spec);
  ASSERT_TRUE(with_buffer.ok()) << with_buffer.status();
  EXPECT_EQ(api_.ipc_opens(), opens);
  // The trainer's event and the two opened here.
  EXPECT_EQ(api_.live_events(), 3);
  lone->reset();
  with_buffer->reset();
  EXPECT_EQ(api_.live_events(), 1);
}

TEST_F(DeviceMemoryTest, EventHandleThatDoesNotOpenIsUnavailable) {
  char* base = Allocate(2, 64);
  DeviceBufferSpec spec = Spec(base, 0, 64, kBusId2);
  spec.event_handle = std::string(gpu::kCudaIpcHandleBytes, 'x');
  const absl::Status status = memory_->OpenEvent(spec).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.message(),
              HasSubstr("cudaIpcOpenEventHandle of CudaBuffer.event_handle on "
                        "local device 0 (CUDA device 2, PCI 0000:03:00.0) "
                        "failed: invalid argument (cudaErrorInvalidValue)"));
}

// --- Copies
// -------------------------------------------------------------------

TEST_F(DeviceMemoryTest, CopiesBothWays) {
  char* base = Allocate(0, 1024);
  auto buffer = memory_->Open(Spec(base, 24, 1000));
  ASSERT_TRUE(buffer.ok()) << buffer.status();

  std::vector<char> host(1000);
  ASSERT_TRUE(
      memory_->CopyToHost(host.data(), (*buffer)->data(), host.size(), 1).ok());
  for (size_t i = 0; i < host.size(); ++i) {
    ASSERT_EQ(host[i], static_cast<char>((i + 24) % 251)) << "byte " << i;
  }

  std::vector<char> result(1000);
  for (size_t i = 0; i < result.size(); ++i) {
    result[i] = static_cast<char>(255 - i % 200);
  }
  ASSERT_TRUE(
      memory_->CopyToDevice((*buffer)->data(), result.data(), result.size(), 1)
          .ok());
  EXPECT_EQ(std::vector<char>(base + 24, base + 1024), result);
  // The bytes before the tensor are the trainer's own.
  EXPECT_EQ(base[23], static_cast<char>(23));
}

TEST_F(DeviceMemoryTest, CopyRefusesALocalDeviceOutOfRange) {
  char host[8] = {};
  char* base = Allocate(2, 8);
  for (int local : {-1, 2}) {
    const absl::Status status = memory_->CopyToHost(host, base, 8, local);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(),
                HasSubstr(absl::StrCat("local device ", local,
                                       " is out of range; this agent drives 2 "
                                       "(0..1)")));
    EXPECT_EQ(memory_->CopyToDevice(base, host, 8, local).code(),
              absl::StatusCode::kInvalidArgument);
  }
}

TEST_F(DeviceMemoryTest, CopyFailureIsUnavailableNamingTheCopyAndDevice) {
  char host[16] = {};
  char* base = Allocate(0, 16);
  api_.FailMemcpy(gpu::kCudaErrorInvalidValue);
  EXPECT_EQ(memory_->CopyToHost(host, base, 16, 1),
            absl::UnavailableError(
                "copy from device to host of 16 bytes on local device 1 (CUDA "
                "device 0, PCI 0000:01:00.0): cudaMemcpy failed: invalid "
                "argument (cudaErrorInvalidValue)"));
  EXPECT_THAT(memory_->CopyToDevice(base, host, 16, 0).message(),
              HasSubstr("copy from host to device of 16 bytes on local device "
                        "0 (CUDA device 2"));
}

// --- The fake's CUDA IPC rules
// -------------------------------------------------

// The checks every test above relies on: the fake flags what CUDA punishes.
TEST(FakeCudaIpcTest, FlagsADoubleOpenAndClosingWhatIsNotOpen) {
  FakeGpuApi api(std::make_shared<FakeNcclFabric>(),
                 FakeGpuApi::Options{2, gpu::kCudaSuccess});
  void* allocation = nullptr;
  ASSERT_EQ(api.Malloc(&allocation, 64), gpu::kCudaSuccess);
  const gpu::IpcMemHandle handle = api.ExportMemory(allocation);
  void* opened = nullptr;
  ASSERT_EQ(api.IpcOpenMemHandle(&opened, handle), gpu::kCudaSuccess);
  int device = -1;
  EXPECT_EQ(api.PointerGetDevice(static_cast<char*>(opened) + 10, &device),
            gpu::kCudaSuccess);
  EXPECT_EQ(device, 0);
  void* twice = nullptr;
  EXPECT_NE(api.IpcOpenMemHandle(&twice, handle), gpu::kCudaSuccess);
  ASSERT_EQ(api.SetDevice(1), gpu::kCudaSuccess);
  EXPECT_EQ(api.IpcCloseMemHandle(opened), gpu::kCudaSuccess);
  EXPECT_NE(api.IpcCloseMemHandle(opened), gpu::kCudaSuccess);
  EXPECT_EQ(api.Free(allocation), gpu::kCudaSuccess);
  EXPECT_THAT(
      api.misuses(),
      ElementsAre(
          "cudaIpcOpenMemHandle of a handle this process has open already",
          "cudaIpcCloseMemHandle with device 1 current of memory opened with "
          "device 0 current",
          "cudaIpcCloseMemHandle of a pointer cudaIpcOpenMemHandle did not "
          "return, or closed already"));
}

}  // namespace
}  // namespace baton::agent
