// The baton-coordinator binary as operators and agents see it: standard
// services, and a clean, bounded shutdown.

#include <google/protobuf/unknown_field_set.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "baton/v1/coordinator.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/coordinator_process.h"
#include "tests/integration/test_agent.h"

namespace baton {
namespace {

using ::google::protobuf::UnknownField;
using ::google::protobuf::UnknownFieldSet;
using ::testing::Contains;

grpc::ByteBuffer ToByteBuffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

std::string ToBytes(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (!buffer.Dump(&slices).ok()) return bytes;
  for (const grpc::Slice& slice : slices) {
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return bytes;
}

// The length-delimited values of field `number` in an encoded message.
std::vector<std::string> BytesFields(const std::string& encoded, int number) {
  UnknownFieldSet fields;
  std::vector<std::string> values;
  if (!fields.ParseFromString(encoded)) return values;
  for (int i = 0; i < fields.field_count(); ++i) {
    const UnknownField& field = fields.field(i);
    if (field.number() == number &&
        field.type() == UnknownField::TYPE_LENGTH_DELIMITED) {
      values.push_back(field.length_delimited());
    }
  }
  return values;
}

// Waits for the completion of `tag` on `cq` until `deadline`; returns its ok.
bool AwaitTag(grpc::CompletionQueue* cq, void* tag, absl::Time deadline) {
  void* got = nullptr;
  bool ok = false;
  const grpc::CompletionQueue::NextStatus status =
      cq->AsyncNext(&got, &ok, absl::ToChronoTime(deadline));
  return status == grpc::CompletionQueue::GOT_EVENT && got == tag && ok;
}

class CoordinatorIntegrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const absl::Status started = coordinator_.Start();
    ASSERT_TRUE(started.ok()) << started;
    channel_ = grpc::CreateChannel(coordinator_.address(),
                                   grpc::InsecureChannelCredentials());
  }

  CoordinatorProcess coordinator_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(CoordinatorIntegrationTest, HealthServiceAnswersServing) {
  grpc::GenericStub stub(channel_);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  // grpc.health.v1.HealthCheckRequest with an empty service: the whole
  // server. Encoded, that is an empty message.
  const grpc::ByteBuffer request = ToByteBuffer("");
  grpc::ByteBuffer response;
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(),
                 &request, &response, [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  // The context's deadline bounds the call; the callback always comes.
  done.WaitForNotification();
  ASSERT_TRUE(status.ok()) << status.error_code() << ": "
                           << status.error_message();

  // HealthCheckResponse.status (field 1) is SERVING (1).
  UnknownFieldSet fields;
  ASSERT_TRUE(fields.ParseFromString(ToBytes(response)));
  ASSERT_EQ(fields.field_count(), 1);
  EXPECT_EQ(fields.field(0).number(), 1);
  ASSERT_EQ(fields.field(0).type(), UnknownField::TYPE_VARINT);
  EXPECT_EQ(fields.field(0).varint(), 1u) << "expected SERVING";
}

TEST_F(CoordinatorIntegrationTest, ReflectionListsTheCoordinatorServices) {
  grpc::GenericStub stub(channel_);
  grpc::ClientContext context;
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  context.set_deadline(absl::ToChronoTime(deadline));
  grpc::CompletionQueue cq;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call = stub.PrepareCall(
      &context,
      "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  int start_tag, write_tag, read_tag, writes_done_tag, finish_tag;
  call->StartCall(&start_tag);
  ASSERT_TRUE(AwaitTag(&cq, &start_tag, deadline));
  // ServerReflectionRequest{list_services: ""} (field 7, empty string).
  call->Write(ToByteBuffer(std::string("\x3a\x00", 2)), &write_tag);
  ASSERT_TRUE(AwaitTag(&cq, &write_tag, deadline));
  grpc::ByteBuffer response;
  call->Read(&response, &read_tag);
  ASSERT_TRUE(AwaitTag(&cq, &read_tag, deadline));
  call->WritesDone(&writes_done_tag);
  ASSERT_TRUE(AwaitTag(&cq, &writes_done_tag, deadline));
  grpc::Status status;
  call->Finish(&status, &finish_tag);
  ASSERT_TRUE(AwaitTag(&cq, &finish_tag, deadline));
  EXPECT_TRUE(status.ok()) << status.error_message();
  cq.Shutdown();
  void* ignored_tag;
  bool ignored_ok;
  while (cq.Next(&ignored_tag, &ignored_ok)) {
  }

  // ServerReflectionResponse.list_services_response (6) ->
  // ListServiceResponse.service (1) -> ServiceResponse.name (1).
  std::vector<std::string> names;
  for (const std::string& list : BytesFields(ToBytes(response), 6)) {
    for (const std::string& service : BytesFields(list, 1)) {
      for (const std::string& name : BytesFields(service, 1)) {
        names.push_back(name);
      }
    }
  }
  EXPECT_THAT(names, Contains("baton.v1.Coordinator"));
  EXPECT_THAT(names, Contains("baton.v1.RendezvousStore"));
  EXPECT_THAT(names, Contains("baton.v1.Status"));
  EXPECT_THAT(names, Contains("grpc.health.v1.Health"));
}

TEST_F(CoordinatorIntegrationTest,
       SigtermTellsAgentsAndExitsCleanlyWithinFiveSeconds) {
  TestAgent agent;
  const absl::Status connected = agent.Connect(coordinator_.address(), "n1");
  ASSERT_TRUE(connected.ok()) << connected;
  agent.StartHeartbeats(absl::Milliseconds(500));

  const ProcessExit exit = coordinator_.Terminate();
  EXPECT_TRUE(exit.exited) << exit.ToString();
  EXPECT_EQ(exit.exit_code, 0) << exit.ToString();
  EXPECT_LT(exit.elapsed, absl::Seconds(5)) << exit.ToString();

  const std::optional<v1::CoordinatorMessage> shutdown =
      agent.WaitForBody(v1::CoordinatorMessage::kShutdown, absl::Seconds(2));
  ASSERT_TRUE(shutdown.has_value()) << "the agent got no shutdown message";
  EXPECT_FALSE(shutdown->shutdown().reason().empty());
  const std::optional<grpc::Status> end =
      agent.WaitForStreamEnd(absl::Seconds(2));
  ASSERT_TRUE(end.has_value()) << "the agent's stream did not end";
  EXPECT_EQ(end->error_code(), grpc::StatusCode::UNAVAILABLE)
      << end->error_message();
}

}  // namespace
}  // namespace baton
