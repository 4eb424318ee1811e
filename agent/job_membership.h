#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "agent/job_environment.h"
#include "agent/job_generation.h"
#include "agent/job_trainers.h"
#include "agent/scheduler/scheduler.h"
#include "agent/scheduler/timeline_recorder.h"
#include "agent/transport/transport.h"
#include "baton/v1/coordinator.pb.h"
#include "common/clock.h"

namespace baton::agent {

// The coordinator's side of one job on this node and the generations it
// seals: joining (again on a new session), the membership, the tensor plan
// and the manifest, generation aborts, and each generation's data plane:
// connecting it (the `Scheduler`, and the CUDA tensors' `DeviceGroup`) on
// connector threads, so the job thread never blocks on peers, and retiring
// it. When a data plane fails on its own, the failures of its operations
// are held until the coordinator names a lost node or the grace period
// (the liveness timeout) ends; then this node leaves and joins again.
//
// Job thread only; the connector threads and the data planes reach it only
// through Callbacks::post. It reaches the job's operations and the job
// itself only through Callbacks.
class JobMembership : public JobGeneration {
 public:
  // Wired by AgentJob.
  struct Callbacks {
    // Runs `task` on the job thread (AgentJob::Post); from any thread.
    std::function<void(std::function<void()>)> post;
    // Ends the job on this node (AgentJob::End).
    std::function<void(const absl::Status&)> end;
    // Scheduler::Callbacks::op_done, on a data-plane thread
    // (JobOperations::OpDone).
    std::function<void(uint64_t id, absl::Status status)> op_done;
    // The rest go to the job's operations (JobOperations), on the job
    // thread. A data plane, its GPU communicators or the plan arrived (or
    // the GPU communicators failed): submit what waits.
    std::function<void()> submit_waiting;
    // Fails every operation of `generation` now (only those no data plane
    // holds: `only_waiting`).
    std::function<void(int64_t generation, const absl::Status& status,
                       bool only_waiting)>
        fail_generation;
    // The data plane's failure was explained (or its grace period ended):
    // the failures held meanwhile are reported now
    // (JobOperations::ReleaseHeld).
    std::function<void()> release_held;
    // The nodes declared tensor `index` differently: its operation fails
    // now unless a data plane holds it.
    std::function<void(int32_t index, const absl::Status& status)> mismatch;
  };

  // `env` and `trainers` outlive it.
  JobMembership(std::string job, const JobEnvironment& env,
                JobTrainers* trainers, Callbacks callbacks);
  // StopDataPlanes, then closes the launch trace.
  ~JobMembership() override;

  JobMembership(const JobMembership&) = delete;
  JobMembership& operator=(const JobMembership&) = delete;

  // Joins the connector threads and destroys every data plane, which then
  // reports nothing more. After the job thread stopped.
  void StopDataPlanes();

  // Every local rank attached: join the job.
  void Join();
  void HandleCoordinatorMessage(const v1::CoordinatorMessage& message);
  // A coordinator session (re)opened; `restarted`: a new coordinator
  // process, which must be told the job's state.
  void HandleSession(bool restarted);
  // Tells the coordinator the tensors every local rank declared, if there
  // are new ones and a generation runs.
  void SendManifest();
  // Tells the coordinator this node leaves the job (`finished`: its
  // trainers are done), if it joined. A finished node's data plane stops
  // after the round that carries this, without an abort.
  void Leave(const absl::Status& status, bool finished);
  // The job ended on this node: its data plane is aborted with `status`,
  // held failures are dropped (the caller fails every operation).
  void End(const absl::Status& status);
  // A local trainer is gone without detaching: this node leaves the
  // generation (the other nodes' operations fail, ABORTED, and the job
  // re-forms), aborts its data plane and held failures with `status`, and
  // waits for every local rank again (kAttaching; Join once they are).
  // The caller fails every operation.
  void LoseTrainer(const absl::Status& status);
  // A trainer reached a commit while nodes wait to join `generation`: ask
  // the coordinator to admit them (once per generation).
  void AdmitJoins(int64_t generation);
  // The held failures' grace period, and retired data planes that finished.
  void OnTimer(absl::Time now);
  // When the held failures are reported if no lost node is named first;
  // none when nothing is held.
  std::optional<absl::Time> failure_deadline() const;

  // JobGeneration.
  State state() const override { return state_; }
  const std::optional<v1::Membership>& membership() const override {
    return membership_;
  }
  int64_t partition_bytes() const override { return partition_bytes_; }
  Scheduler* data_plane() const override { return data_plane_.get(); }
  const absl::Status* aborted(int64_t generation) const override;
  const std::optional<absl::Status>& data_plane_stopped() const override {
    return data_plane_stopped_;
  }
  const absl::Status* devices_failed() const override;
  bool holds_failures() const override {
    return data_plane_failure_.has_value();
  }

  int32_t node_rank() const { return node_rank_; }
  int32_t rank_offset() const { return rank_offset_; }

  // "job=J gen=G node=N " for this job's log lines, with "rank=R " (the
  // global rank) for `local_rank` once a generation is sealed.
  std::string JobLogPrefix(int32_t local_rank = -1) const;

 private:
  void HandleMembership(const v1::Membership& membership);
  void HandlePlan(const v1::TensorPlan& plan);
  void HandleGenerationAborted(const v1::GenerationAborted& aborted);
  // Ends the running generation `a` names with `status`: its data plane,
  // held failures and operations, and tells the trainers.
  void AbortGeneration(const v1::GenerationAborted& a,
                       const absl::Status& status);
  // Every declared tensor without an id that the plan names takes its id
  // and priority from it.
  void AssignPlannedIds();
  void HandleError(uint64_t reply_to, const v1::Error& error);
  void SendJoin();
  void SendAttached();
  v1::Attached AttachedFor(int32_t local_rank) const;
  void ConnectDataPlane();
  // On a connector thread: the data communicators every node builds (node
  // rank 0's --data_channels, published in the store).
  absl::StatusOr<int> AgreeOnChannels(const ConnectRequest& request) const;
  void OnDataPlaneConnected(int64_t generation,
                            absl::StatusOr<DataConnections> connections);
  void OnDataPlaneStopped(Scheduler* plane, absl::Status status);
  // Connects the CUDA tensors' communicators of this generation once the
  // plan has a CUDA tensor (every node sees the same plan, so every node
  // connects them); on a connector thread.
  void MaybeConnectDevices();
  void OnDevicesConnected(int64_t generation,
                          absl::StatusOr<DeviceGroup> group);
  void RetireDataPlane(absl::Status status);
  // The data plane's failure is explained, or will never be: what was held
  // meanwhile is reported now (Callbacks::release_held).
  void ReleaseHeld();
  // "<job>/<purpose>": the key under which the transport keeps this job's
  // connections of `purpose` between generations (ConnectRequest.reuse_key).
  std::string LinkKey(const std::string& purpose) const;

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
  State state_ = State::kAttaching;
  int32_t manifest_sent_ = 0;
  uint64_t join_seq_ = 0;
  // The coordinator accepted a join of this job: before that, and before
  // the first membership, coordinator messages for the name are the
  // previous run's (this job is the name's next run on this node).
  bool join_accepted_ = false;
  uint64_t manifest_seq_ = 0;
  uint64_t rejoin_seq_ = 0;
  // The generation the last rejoin re-reported: its acceptance sends the
  // manifest.
  int64_t rejoined_generation_ = 0;
  // This node's view of the sealed generation (common/membership_view.h).
  std::optional<v1::Membership> membership_;
  // The generation this node last asked the coordinator to admit joiners
  // in (AdmitJoins).
  int64_t admitted_generation_ = 0;
  int32_t node_rank_ = -1;
  int32_t rank_offset_ = 0;
  std::optional<v1::TensorPlan> plan_;
  int64_t partition_bytes_ = 0;
  std::unique_ptr<Scheduler> data_plane_;
  // The generation whose device group is connecting or attached (-1: none),
  // and why connecting it failed (CUDA operations of that generation fail
  // with it).
  int64_t devices_generation_ = -1;
  std::optional<absl::Status> devices_failed_;
  // Data planes of aborted generations, until their threads exit.
  std::vector<std::unique_ptr<Scheduler>> retired_;
  // Generation aborted by the coordinator -> the status its operations fail
  // with (names the lost node).
  absl::flat_hash_map<int64_t, absl::Status> aborted_;
  // Set when the data plane failed on its own: operation failures are held
  // until the coordinator names a lost node or the grace period ends.
  std::optional<absl::Status> data_plane_failure_;
  absl::Time failure_deadline_;
  std::optional<absl::Status> data_plane_stopped_;

  // Data-plane connects run on their own threads; joined by
  // StopDataPlanes.
  std::vector<std::thread> connectors_;
};

}  // namespace baton::agent
