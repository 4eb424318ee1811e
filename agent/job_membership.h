#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "agent/job_data_plane.h"
#include "agent/job_environment.h"
#include "agent/job_generation.h"
#include "agent/job_trainers.h"
#include "agent/scheduler/scheduler.h"
#include "baton/v1/coordinator.pb.h"
#include "common/clock.h"

namespace baton::agent {

// The coordinator's side of one job on this node and the generations it
// seals: joining (again on a new session), the membership, the tensor plan
// and the manifest, and generation aborts. It tells the job's data plane
// (JobDataPlane, which it owns) of each generation and plan, and publishes
// the generation to the job's operations (JobGeneration).
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
  void StopDataPlanes() { data_plane_.Stop(); }

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
  // The data plane's timers (JobDataPlane::OnTimer).
  void OnTimer(absl::Time now) { data_plane_.OnTimer(now); }
  // When the held failures are reported if no lost node is named first;
  // none when nothing is held.
  std::optional<absl::Time> failure_deadline() const {
    return data_plane_.failure_deadline();
  }

  // JobGeneration.
  State state() const override { return state_; }
  const std::optional<v1::Membership>& membership() const override {
    return membership_;
  }
  int64_t partition_bytes() const override { return partition_bytes_; }
  Scheduler* data_plane() const override { return data_plane_.current(); }
  const absl::Status* aborted(int64_t generation) const override;
  const std::optional<absl::Status>& data_plane_stopped() const override {
    return data_plane_.stopped();
  }
  const absl::Status* devices_failed() const override {
    return data_plane_.devices_failed();
  }
  bool holds_failures() const override { return data_plane_.holds_failures(); }

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
  // The data plane's failure was not explained within its grace period:
  // leave and join again, which forces a new generation.
  void OnGraceEnded(const absl::Status& status);

  // Constant after construction.
  const std::string job_;
  const JobEnvironment& env_;
  const AgentConfig& config_;
  JobTrainers& trainers_;
  const Callbacks callbacks_;

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
  // Generation aborted by the coordinator -> the status its operations fail
  // with (names the lost node).
  absl::flat_hash_map<int64_t, absl::Status> aborted_;
  // Declared last: destroyed first (its connector threads and data planes
  // report into the state above until they are gone).
  JobDataPlane data_plane_;
};

}  // namespace baton::agent
