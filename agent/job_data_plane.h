#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "agent/job_environment.h"
#include "agent/job_trainers.h"
#include "agent/scheduler/scheduler.h"
#include "agent/scheduler/timeline_recorder.h"
#include "agent/transport/transport.h"
#include "baton/v1/coordinator.pb.h"
#include "common/clock.h"

namespace baton::agent {

// The data plane of one job on this node, generation after generation:
// connecting each sealed generation's (the `Scheduler`, and the CUDA
// tensors' `DeviceGroup` once the plan has a CUDA tensor) on connector
// threads, so that the job thread never blocks on peers; retiring it; and
// what it reports of itself. When it stops on its own (a communicator
// failed), the failures of its operations are held for a grace period (the
// liveness timeout) in which the coordinator usually names a lost node;
// when the period ends first, Callbacks::grace_ended. When it stops because
// a node left or the nodes disagree, nothing more runs in the generation
// (stopped()).
//
// Job thread only; the connector threads and the data planes reach it only
// through Callbacks::post. JobMembership owns it and tells it of
// generations and plans.
class JobDataPlane {
 public:
  struct Callbacks {
    // Runs `task` on the job thread (AgentJob::Post); from any thread.
    std::function<void(std::function<void()>)> post;
    // Scheduler::Callbacks::op_done, on a data-plane thread
    // (JobOperations::OpDone).
    std::function<void(uint64_t id, absl::Status status)> op_done;
    // A data plane or its GPU communicators arrived, or the communicators
    // failed: submit what waits (JobOperations::SubmitWaiting).
    std::function<void()> submit_waiting;
    // Fails the operations of `generation` that no data plane holds
    // (JobOperations::FailGeneration, only_waiting).
    std::function<void(int64_t generation, const absl::Status& status)>
        fail_waiting;
    // The failures held meanwhile are reported now
    // (JobOperations::ReleaseHeld).
    std::function<void()> release_held;
    // The data plane's own failure was not explained within the grace
    // period: a new generation is the way out (JobMembership leaves and
    // joins again).
    std::function<void(const absl::Status& status)> grace_ended;
  };

  // `env` and `trainers` outlive it.
  JobDataPlane(std::string job, const JobEnvironment& env,
               JobTrainers* trainers, Callbacks callbacks);
  // Stop, then closes the launch trace.
  ~JobDataPlane();

  JobDataPlane(const JobDataPlane&) = delete;
  JobDataPlane& operator=(const JobDataPlane&) = delete;

  // Joins the connector threads and destroys every data plane, which then
  // reports nothing more. After the job thread stopped.
  void Stop();

  // Generation `membership` was sealed: connects its data plane (the
  // previous one must be retired).
  void Connect(const v1::Membership& membership);
  // A plan (the tensors every node know, the partition size), for this
  // generation and the next; connects the GPU communicators once it has a
  // CUDA tensor.
  void SetPlan(const v1::TensorPlan& plan);
  // This node leaves the job with its trainers finished: every node stops
  // after the round that carries the news, without an abort.
  void Leave();
  // Aborts the current data plane, if any, with `status`, ends the
  // generation's stop and grace period, and reports what was held
  // (Callbacks::release_held). Nothing of it runs on.
  void Retire(const absl::Status& status);
  // The grace period; and retired data planes whose threads exited go.
  void OnTimer(absl::Time now);
  // When the grace period ends; none when nothing is held.
  std::optional<absl::Time> failure_deadline() const;

  // The current generation's data plane; null when none is connected.
  Scheduler* current() const { return data_plane_.get(); }
  // Set when the data plane stopped for good in this generation (a node
  // left, or the nodes disagree on the mode).
  const std::optional<absl::Status>& stopped() const { return stopped_; }
  // Why this generation's GPU communicators could not be connected; null
  // when they were not tried or did not fail.
  const absl::Status* devices_failed() const;
  // The grace period runs: the operations' failures are held.
  bool holds_failures() const { return failure_.has_value(); }
  // The recent partitions' phases of every generation (batonctl timeline).
  const TimelineRecorder& timeline() const { return timeline_; }
  // "<job>/<purpose>": the key under which the transport keeps this job's
  // connections of `purpose` between generations (ConnectRequest.reuse_key);
  // "<job>/" for all of them.
  std::string LinkKey(const std::string& purpose) const;

 private:
  // On a connector thread: the data communicators every node builds (node
  // rank 0's --data_channels, published in the store).
  absl::StatusOr<int> AgreeOnChannels(const ConnectRequest& request) const;
  void OnConnected(int64_t generation,
                   absl::StatusOr<DataConnections> connections);
  void OnStopped(Scheduler* plane, int64_t generation, absl::Status status);
  void MaybeConnectDevices();
  void OnDevicesConnected(int64_t generation,
                          absl::StatusOr<DeviceGroup> group);
  // "job=J gen=G node=N " for log lines.
  std::string LogPrefix() const;

  // Constant after construction.
  const std::string job_;
  const JobEnvironment& env_;
  const AgentConfig& config_;
  Clock& clock_;
  JobTrainers& trainers_;
  const Callbacks callbacks_;
  std::FILE* launch_trace_ = nullptr;
  // Before the data planes: they record into it until they are destroyed.
  TimelineRecorder timeline_{static_cast<size_t>(config_.timeline_records)};

  // Owned by the job thread.
  // The generation being connected or running (none: between generations).
  std::optional<v1::Membership> membership_;
  // From the latest plan: its partition size (0 before the plan), the
  // tensors it covers, and whether one is in CUDA memory.
  int64_t partition_bytes_ = 0;
  int32_t known_tensors_ = 0;
  bool has_cuda_ = false;
  std::unique_ptr<Scheduler> data_plane_;
  // The generation whose device group is connecting or attached (-1: none),
  // and why connecting it failed (CUDA operations of that generation fail
  // with it).
  int64_t devices_generation_ = -1;
  std::optional<absl::Status> devices_failed_;
  // Data planes of earlier generations, until their threads exit.
  std::vector<std::unique_ptr<Scheduler>> retired_;
  std::optional<absl::Status> stopped_;
  // Set while the data plane's own failure waits for an explanation, until
  // failure_deadline_.
  std::optional<absl::Status> failure_;
  absl::Time failure_deadline_;

  // Connects run on their own threads; joined by Stop.
  std::vector<std::thread> connectors_;
};

}  // namespace baton::agent
