// The client's checks of where declared tensors live (host memory or a CUDA
// buffer), before anything is sent to the agent.
#include "client/declaration.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton::client {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

v1::TensorSpec Spec(const std::string& name, v1::MemoryKind memory) {
  v1::TensorSpec spec;
  spec.set_name(name);
  spec.set_dtype(v1::DATA_TYPE_FLOAT32);
  spec.add_shape(4);
  spec.set_op(v1::COLLECTIVE_OP_PUSH_PULL);
  spec.set_memory(memory);
  return spec;
}

v1::CudaBuffer Buffer(int32_t index) {
  v1::CudaBuffer buffer;
  buffer.set_index(index);
  buffer.set_memory_handle(std::string(kCudaIpcHandleBytes, 'm'));
  buffer.set_offset(512);
  buffer.set_event_handle(std::string(kCudaIpcHandleBytes, 'e'));
  return buffer;
}

const v1::TensorSpec kHost = Spec("host", v1::MEMORY_KIND_HOST);
const v1::TensorSpec kCuda = Spec("gpu", v1::MEMORY_KIND_CUDA);

TEST(CheckDeclarationTest, AcceptsHostTensorsAndOneBufferPerCudaTensor) {
  EXPECT_TRUE(CheckDeclaration({kHost}, {}).ok());
  EXPECT_TRUE(CheckDeclaration({}, {}).ok());
  v1::CudaBuffer at_zero = Buffer(1);
  at_zero.set_offset(0);
  at_zero.set_pci_bus_id("0000:3b:00.0");
  EXPECT_TRUE(
      CheckDeclaration({kHost, kCuda, Spec("gpu2", v1::MEMORY_KIND_CUDA)},
                       {Buffer(2), at_zero})
          .ok());
}

TEST(CheckDeclarationTest, HandlesMustBeSixtyFourBytesNamingTheField) {
  v1::CudaBuffer short_memory = Buffer(0);
  short_memory.set_memory_handle("0123456789ab");
  absl::Status status = CheckDeclaration({kCuda}, {short_memory});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "tensor \"gpu\": CudaBuffer.memory_handle is 12 bytes; it must be "
            "a cudaIpcMemHandle_t (64 bytes)");

  v1::CudaBuffer long_event = Buffer(0);
  long_event.set_event_handle(std::string(65, 'e'));
  status = CheckDeclaration({kCuda}, {long_event});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "tensor \"gpu\": CudaBuffer.event_handle is 65 bytes; it must be "
            "a cudaIpcEventHandle_t (64 bytes)");

  v1::CudaBuffer no_event = Buffer(0);
  no_event.clear_event_handle();
  EXPECT_THAT(CheckDeclaration({kCuda}, {no_event}).message(),
              HasSubstr("CudaBuffer.event_handle is 0 bytes"));
}

TEST(CheckDeclarationTest, OffsetMustNotBeNegative) {
  v1::CudaBuffer negative = Buffer(0);
  negative.set_offset(-8);
  absl::Status status = CheckDeclaration({kCuda}, {negative});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "tensor \"gpu\": CudaBuffer.offset is -8; it must be >= 0");
}

TEST(CheckDeclarationTest, EveryCudaTensorHasExactlyOneBufferAndNoHostOneHas) {
  absl::Status missing = CheckDeclaration({kHost, kCuda}, {});
  EXPECT_EQ(missing.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(missing.message(),
              AllOf(HasSubstr("tensor \"gpu\" is in CUDA memory"),
                    HasSubstr("has no CudaBuffer"),
                    HasSubstr("memory_handle, offset and event_handle")));

  absl::Status twice = CheckDeclaration({kHost, kCuda}, {Buffer(1), Buffer(1)});
  EXPECT_EQ(twice.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(twice.message(),
            "tensor \"gpu\" has two CudaBuffers (cuda_buffers[0] and [1]); "
            "give exactly one");

  absl::Status on_host =
      CheckDeclaration({kHost, kCuda}, {Buffer(1), Buffer(0)});
  EXPECT_EQ(on_host.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(on_host.message(),
              AllOf(HasSubstr("tensor \"host\" is in host memory"),
                    HasSubstr("cuda_buffers[1]"),
                    HasSubstr("only for MEMORY_KIND_CUDA tensors")));
}

TEST(CheckDeclarationTest, BufferIndexMustNameATensorOfTheDeclaration) {
  for (int32_t index : {2, -1}) {
    absl::Status status = CheckDeclaration({kHost, kCuda}, {Buffer(index)});
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(status.message(),
              "cuda_buffers[0]: CudaBuffer.index " + std::to_string(index) +
                  " is outside the declaration's tensors 0..1");
  }
}

TEST(CheckDeclarationTest, UnknownMemoryKindIsRefused) {
  v1::TensorSpec spec = kHost;
  spec.set_memory(static_cast<v1::MemoryKind>(7));
  absl::Status status = CheckDeclaration({spec}, {});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "tensor \"host\": TensorSpec.memory is 7; use MEMORY_KIND_HOST or "
            "MEMORY_KIND_CUDA");
}

TEST(SameCudaBufferTest, ComparesEveryFieldButTheIndex) {
  EXPECT_TRUE(SameCudaBuffer(Buffer(0), Buffer(3)));
  v1::CudaBuffer other = Buffer(0);
  other.set_offset(0);
  EXPECT_FALSE(SameCudaBuffer(Buffer(0), other));
  other = Buffer(0);
  other.set_event_handle(std::string(kCudaIpcHandleBytes, 'x'));
  EXPECT_FALSE(SameCudaBuffer(Buffer(0), other));
  other = Buffer(0);
  other.set_pci_bus_id("0000:3b:00.0");
  EXPECT_FALSE(SameCudaBuffer(Buffer(0), other));
}

}  // namespace
}  // namespace baton::client
