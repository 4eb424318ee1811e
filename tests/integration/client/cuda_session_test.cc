// baton::Session with CUDA tensors (DeviceBuffer) against a real coordinator
// and baton-agent on loopback, on a machine without a GPU: what the client
// checks itself, and what a CPU-only agent answers.
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "baton/session.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/agent/local_cluster.h"

namespace baton {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// Well-formed handles: the client cannot tell them from real ones.
DeviceBuffer WellFormed(std::vector<int64_t> shape) {
  DeviceBuffer buffer;
  buffer.dtype = v1::DATA_TYPE_FLOAT32;
  buffer.shape = std::move(shape);
  buffer.memory_handle = std::string(64, '\x11');
  buffer.offset = 256;
  buffer.event_handle = std::string(64, '\x22');
  return buffer;
}

class CudaSessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(cluster_.Start(1).ok());
    absl::StatusOr<std::unique_ptr<Session>> session =
        Session::Init(cluster_.TrainerOptions(1, "cuda"));
    ASSERT_TRUE(session.ok()) << session.status();
    session_ = std::move(*session);
  }

  // The session still runs host tensors (nothing above broke it).
  void ExpectHostPushPullWorks(const std::string& name) {
    std::vector<float> values = {1, 2, 3};
    absl::Status status = session_->PushPull(
        name, Buffer{values.data(), v1::DATA_TYPE_FLOAT32, {3}}, false);
    EXPECT_TRUE(status.ok()) << status;
    EXPECT_EQ(values, (std::vector<float>{1, 2, 3}));
  }

  LocalCluster cluster_;
  std::unique_ptr<Session> session_;
};

TEST_F(CudaSessionTest,
       MalformedBuffersAreRefusedNamingTheFieldBeforeTheAgent) {
  DeviceBuffer short_handle = WellFormed({4});
  short_handle.memory_handle = "not a handle";
  auto started = session_->PushPullAsync("g", short_handle, false);
  EXPECT_EQ(started.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(started.status().message(),
            "tensor \"g\": CudaBuffer.memory_handle is 12 bytes; it must be a "
            "cudaIpcMemHandle_t (64 bytes)");

  DeviceBuffer no_event = WellFormed({4});
  no_event.event_handle.clear();
  absl::Status declared =
      session_->DeclareTensor("g", no_event, v1::COLLECTIVE_OP_BROADCAST);
  EXPECT_EQ(declared.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(declared.message(),
              HasSubstr("CudaBuffer.event_handle is 0 bytes"));

  DeviceBuffer negative = WellFormed({4});
  negative.offset = -1;
  auto broadcast = session_->BroadcastAsync("g", negative, 0);
  EXPECT_EQ(broadcast.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(broadcast.status().message(),
              HasSubstr("CudaBuffer.offset is -1; it must be >= 0"));

  v1::TensorSpec cuda_spec;
  cuda_spec.set_name("h");
  cuda_spec.set_dtype(v1::DATA_TYPE_FLOAT32);
  cuda_spec.add_shape(2);
  cuda_spec.set_op(v1::COLLECTIVE_OP_PUSH_PULL);
  cuda_spec.set_memory(v1::MEMORY_KIND_CUDA);
  absl::Status without_buffer = session_->DeclareTensors({cuda_spec});
  EXPECT_EQ(without_buffer.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(without_buffer.message(),
              AllOf(HasSubstr("tensor \"h\" is in CUDA memory"),
                    HasSubstr("has no CudaBuffer")));

  v1::TensorSpec host_spec = cuda_spec;
  host_spec.set_memory(v1::MEMORY_KIND_HOST);
  v1::CudaBuffer buffer;
  buffer.set_index(0);
  buffer.set_memory_handle(std::string(64, 'm'));
  buffer.set_event_handle(std::string(64, 'e'));
  absl::Status on_host = session_->DeclareTensors({host_spec}, {buffer});
  EXPECT_EQ(on_host.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(on_host.message(),
              HasSubstr("tensor \"h\" is in host memory (TensorSpec.memory "
                        "MEMORY_KIND_HOST) but has a CudaBuffer"));

  // None of it reached the agent: "g" and "h" are still free names.
  ExpectHostPushPullWorks("g");
  ExpectHostPushPullWorks("h");
}

// A host tensor's name used for a CUDA tensor is declared anew (its next
// version); this CPU-only agent refuses that, and the refusal leaves the
// host tensor as it was.
TEST_F(CudaSessionTest, ANameMovedToCudaMemoryIsDeclaredAnew) {
  ExpectHostPushPullWorks("host");
  auto as_cuda = session_->PushPullAsync("host", WellFormed({3}), false);
  EXPECT_EQ(as_cuda.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(as_cuda.status().message()), HasSubstr("GPU"));
  ExpectHostPushPullWorks("host");
}

// Needs the agent's side of issue 8: a CPU-only agent refuses CUDA tensors
// as a request error (the session stays usable for host tensors).
TEST_F(CudaSessionTest, CpuAgentRefusesCudaTensorsNamingTheGpuTransport) {
  absl::Status declared = session_->DeclareTensor("gpu", WellFormed({1024}),
                                                  v1::COLLECTIVE_OP_PUSH_PULL);
  EXPECT_EQ(declared.code(), absl::StatusCode::kFailedPrecondition) << declared;
  EXPECT_THAT(std::string(declared.message()), HasSubstr("GPU"));

  // First use declares, and is refused the same way; nothing was enqueued.
  auto started = session_->PushPullAsync("gpu", WellFormed({1024}), true);
  EXPECT_EQ(started.status().code(), absl::StatusCode::kFailedPrecondition)
      << started.status();
  EXPECT_THAT(std::string(started.status().message()), HasSubstr("GPU"));

  ExpectHostPushPullWorks("host");
  EXPECT_TRUE(session_->Shutdown(std::chrono::seconds(10)).ok());
}

}  // namespace
}  // namespace baton
