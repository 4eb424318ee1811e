// Every message the coordinator accepts, as raw bytes from the network. The
// first byte picks the message type; the rest is parsed as that message and,
// when it parses, handed to the coordinator's entry point for it: an
// AgentMessage to OnAgentMessage (from a session that said hello and whose
// node is a member of the running job "j0", or as a session's first
// message), the store requests to StoreSet/StoreGet/StoreAdd and the status
// requests to ListJobs/GetJob/GetTensors/GetTimeline. Parsing alone would
// cover nothing of baton's (Debian's libprotobuf is not instrumented).
//
// Each input starts from the same state: nodes n0 and n1 joined job j0
// (generation 1 sealed), both sent a manifest of one tensor, and key "k" is
// set in the generation's store.

#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "baton/v1/coordinator.pb.h"
#include "baton/v1/rendezvous.pb.h"
#include "baton/v1/status.pb.h"
#include "common/clock.h"
#include "coordinator/coordinator.h"
#include "tests/fuzz/fuzz_input.h"
#include "tests/unit/coordinator/recording_agent.h"

namespace baton::coordinator {
namespace {

enum MessageType : uint8_t {
  kAgentMessage,
  kFirstAgentMessage,
  kStoreSet,
  kStoreGet,
  kStoreAdd,
  kListJobs,
  kGetJob,
  kGetTimeline,
  kTypeCount,
};

class Fixture {
 public:
  Fixture() : coordinator_(options_, &clock_, &secrets_) {
    for (int k = 0; k < 2; ++k) {
      agents_[k] = Connect(k == 0 ? "n0" : "n1");
      v1::AgentMessage join;
      join.mutable_join()->set_job("j0");
      join.mutable_join()->set_data_address(k == 0 ? "n0.example:7000"
                                                   : "n1.example:7000");
      join.mutable_join()->set_local_size(2);
      join.mutable_join()->set_expected_nodes(2);
      Send(agents_[k], join);
    }
    for (Agent& agent : agents_) {
      v1::AgentMessage manifest;
      manifest.mutable_manifest()->set_job("j0");
      manifest.mutable_manifest()->set_generation(1);
      v1::TensorSpec* t = manifest.mutable_manifest()->add_tensors();
      t->set_name("w");
      t->set_dtype(v1::DATA_TYPE_FLOAT32);
      t->add_shape(1024);
      t->set_op(v1::COLLECTIVE_OP_PUSH_PULL);
      Send(agent, manifest);
    }
    v1::StoreSetRequest set;
    set.mutable_scope()->set_job("j0");
    set.mutable_scope()->set_generation(1);
    set.set_key("k");
    set.set_value("v");
    coordinator_.StoreSet(set, {}, [](absl::Status) {});
  }

  void Run(uint8_t type, const std::string& bytes) {
    switch (type) {
      case kAgentMessage:
      case kFirstAgentMessage: {
        v1::AgentMessage message;
        if (!message.ParseFromString(bytes)) return;
        if (type == kFirstAgentMessage) {
          Agent fresh = Connect("");
          coordinator_.OnAgentMessage(fresh.id, message);
        } else {
          coordinator_.OnAgentMessage(agents_[0].id, message);
        }
        break;
      }
      case kStoreSet: {
        v1::StoreSetRequest request;
        if (!request.ParseFromString(bytes)) return;
        coordinator_.StoreSet(request, {}, [](absl::Status) {});
        break;
      }
      case kStoreGet: {
        v1::StoreGetRequest request;
        if (!request.ParseFromString(bytes)) return;
        coordinator_.StoreGet(request, {},
                              [](absl::StatusOr<std::vector<std::string>>) {});
        break;
      }
      case kStoreAdd: {
        v1::StoreAddRequest request;
        if (!request.ParseFromString(bytes)) return;
        coordinator_.StoreAdd(request, {}, [](absl::StatusOr<int64_t>) {});
        break;
      }
      case kListJobs: {
        v1::ListJobsRequest request;
        if (!request.ParseFromString(bytes)) return;
        coordinator_.ListJobs();
        break;
      }
      case kGetJob: {
        v1::GetJobRequest request;
        if (!request.ParseFromString(bytes)) return;
        coordinator_.GetJob(request).IgnoreError();
        coordinator_.GetTensors(request.job()).IgnoreError();
        break;
      }
      case kGetTimeline: {
        v1::GetTimelineRequest request;
        if (!request.ParseFromString(bytes)) return;
        coordinator_.GetTimeline(request, [](absl::StatusOr<v1::Timeline>) {});
        break;
      }
      default:
        return;
    }
    // What the message left behind: status, and the deadlines it set.
    coordinator_.ListJobs();
    coordinator_.GetTensors("j0").IgnoreError();
    clock_.Advance(Coordinator::kTimelineReplyTimeout);
    coordinator_.Tick();
  }

 private:
  // A session that said hello as `node` (none when empty).
  Agent Connect(const std::string& node) {
    Agent agent;
    agent.node = node;
    agent.id = SessionId(next_session_++);
    agent.channel = std::make_shared<RecordingChannel>();
    coordinator_.OnSessionOpened(agent.id, agent.channel);
    if (!node.empty()) {
      v1::AgentMessage hello;
      hello.mutable_hello()->set_node_name(node);
      hello.mutable_hello()->set_agent_instance("i-" + node);
      Send(agent, hello);
    }
    return agent;
  }

  void Send(Agent& agent, v1::AgentMessage message) {
    message.set_seq(++agent.seq);
    coordinator_.OnAgentMessage(agent.id, message);
  }

  FakeClock clock_;
  CountingSecretSource secrets_;
  CoordinatorOptions options_;
  Coordinator coordinator_;
  Agent agents_[2];
  uint64_t next_session_ = 1;
};

}  // namespace
}  // namespace baton::coordinator

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  baton::fuzz::QuietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  baton::coordinator::Fixture fixture;
  fixture.Run(data[0] % baton::coordinator::kTypeCount,
              std::string(reinterpret_cast<const char*>(data) + 1, size - 1));
  return 0;
}
