#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "baton/v1/coordinator.grpc.pb.h"

namespace baton {

// A fake agent for integration tests: a real gRPC client holding one
// AgentSession stream to a coordinator over a real channel. A reader thread
// collects everything the coordinator sends; tests wait for the messages
// they expect, each wait with a deadline.
//
// Thread-safe: Send and its helpers may be called from any thread (the
// optional heartbeat thread sends too).
class TestAgent {
 public:
  TestAgent() = default;
  TestAgent(const TestAgent&) = delete;
  TestAgent& operator=(const TestAgent&) = delete;
  // Stops heartbeats and cancels the stream if it is still open.
  ~TestAgent();

  // Connects to `address`, opens the session, sends Hello and waits up to
  // `timeout` for session_accepted. Call once per TestAgent.
  absl::Status Connect(const std::string& address, const std::string& node_name,
                       const std::string& instance = "test-instance",
                       absl::Duration timeout = absl::Seconds(10));

  // A connected agent sending heartbeats every 200 ms (instance "i-<node>"
  // unless given); a failed connect fails the current test.
  static std::unique_ptr<TestAgent> Connected(const std::string& address,
                                              const std::string& node_name,
                                              const std::string& instance = "");

  // Sends `message` with the next seq, which it returns; 0 when the stream
  // is no longer writable.
  uint64_t Send(v1::AgentMessage message);

  // Convenience senders; each returns the seq like Send.
  uint64_t Join(const std::string& job, const std::string& data_address,
                int32_t local_size, int32_t expected_nodes,
                int32_t min_nodes = 0, int64_t partition_bytes = 0);
  uint64_t Heartbeat();
  uint64_t Manifest(const std::string& job, int64_t generation,
                    const std::vector<v1::TensorSpec>& tensors);
  // `ranks`: (global rank, last completed step) per local rank.
  uint64_t StepReport(const std::string& job, int64_t generation,
                      const std::vector<std::pair<int32_t, int64_t>>& ranks,
                      const std::vector<v1::PendingTensor>& pending = {});
  uint64_t Leave(const std::string& job, int64_t generation, bool finished,
                 const std::string& reason = "");

  // Returns the first received message that `pred` accepts, removing it from
  // the received list (messages before it stay for later waits). nullopt
  // after `timeout`, or as soon as the stream ended with no match.
  std::optional<v1::CoordinatorMessage> WaitFor(
      const std::function<bool(const v1::CoordinatorMessage&)>& pred,
      absl::Duration timeout = absl::Seconds(10));
  // WaitFor a message with the given body.
  std::optional<v1::CoordinatorMessage> WaitForBody(
      v1::CoordinatorMessage::BodyCase body,
      absl::Duration timeout = absl::Seconds(10));
  // WaitFor the reply (any body) to request `seq`.
  std::optional<v1::CoordinatorMessage> WaitForReply(
      uint64_t seq, absl::Duration timeout = absl::Seconds(10));

  // WaitFor the membership of `generation`; an empty one (and a test
  // failure) when it does not come.
  v1::Membership AwaitMembership(int64_t generation = 1,
                                 absl::Duration timeout = absl::Seconds(10));

  // Messages received and not yet consumed by a wait, oldest first.
  std::vector<v1::CoordinatorMessage> Received() const;

  // Waits up to `timeout` for the coordinator to end the stream; its status,
  // or nullopt if it is still open.
  std::optional<grpc::Status> WaitForStreamEnd(
      absl::Duration timeout = absl::Seconds(10));

  // Half-closes (WritesDone) and waits up to `timeout` for the coordinator to
  // end the stream, cancelling it after that. Returns the final status.
  grpc::Status CloseStream(absl::Duration timeout = absl::Seconds(10));
  // Cancels the stream at once, as a crashed agent would. Returns the final
  // status (CANCELLED).
  grpc::Status Abort();

  // Sends a heartbeat every `interval` from a background thread until
  // StopHeartbeats, the stream's end or destruction.
  void StartHeartbeats(absl::Duration interval);
  void StopHeartbeats();

  // The final status once the stream ended.
  std::optional<grpc::Status> final_status() const;
  // From Connect.
  const v1::SessionAccepted& session_accepted() const {
    return session_accepted_;
  }
  uint64_t session_id() const { return session_accepted_.session_id(); }
  const std::string& node_name() const { return node_name_; }

 private:
  void ReadLoop();
  // Joins the reader (after its stream ended) and the heartbeat thread.
  void JoinThreads();
  // Cancels the call, if it is not over yet.
  void Cancel();

  // Set by Connect; constant once it returns.
  bool started_ = false;
  std::string node_name_;
  v1::SessionAccepted session_accepted_;
  std::thread reader_;

  // Serializes writes (gRPC allows one at a time) and seq assignment. The
  // reader reads `stream_` without the lock (only it may reset it) and
  // releases the stream, stub and channel when the stream ends.
  absl::Mutex write_mu_;
  // Lock order: write_mu_, then context_mu_. TryCancel takes only
  // context_mu_, so it can unblock a write that holds write_mu_.
  absl::Mutex context_mu_ ABSL_ACQUIRED_AFTER(write_mu_);
  std::unique_ptr<grpc::ClientContext> context_ ABSL_GUARDED_BY(context_mu_);
  std::shared_ptr<grpc::Channel> channel_ ABSL_GUARDED_BY(write_mu_);
  std::unique_ptr<v1::Coordinator::Stub> stub_ ABSL_GUARDED_BY(write_mu_);
  std::unique_ptr<
      grpc::ClientReaderWriter<v1::AgentMessage, v1::CoordinatorMessage>>
      stream_ ABSL_GUARDED_BY(write_mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(write_mu_) = 0;
  bool writes_done_ ABSL_GUARDED_BY(write_mu_) = false;

  mutable absl::Mutex mu_;
  std::deque<v1::CoordinatorMessage> received_ ABSL_GUARDED_BY(mu_);
  std::optional<grpc::Status> final_status_ ABSL_GUARDED_BY(mu_);
  bool stop_heartbeats_ ABSL_GUARDED_BY(mu_) = false;

  // Started and joined by the test's thread.
  std::thread heartbeats_;
};

}  // namespace baton
