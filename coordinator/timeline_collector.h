#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "baton/v1/coordinator.pb.h"
#include "baton/v1/status.pb.h"

namespace baton::coordinator {

// Gathers a job's timeline (batonctl timeline): one TimelineRequest per
// connected member, the agents' TimelineReply messages merged into one
// Timeline, finished when every asked member answered or at the deadline
// (members that did not answer are listed as missing).
//
// Not thread-safe: runs on the coordinator's control loop.
class TimelineCollector {
 public:
  using Done = std::function<void(absl::StatusOr<v1::Timeline>)>;

  // One member of the job as the request sees it.
  struct Node {
    std::string name;
    int32_t node_rank = -1;
    // False: not asked, listed as missing at once.
    bool connected = false;
  };

  // Starts a request for `request`'s steps; returns its id, to put in the
  // TimelineRequest sent to each connected node. `done` runs exactly once
  // (from Start itself when no node can answer).
  uint64_t Start(const v1::GetTimelineRequest& request,
                 const std::vector<Node>& nodes, absl::Time deadline,
                 Done done);

  // An agent's answer; ignored when the request finished already.
  void OnReply(const std::string& node_name, const v1::TimelineReply& reply);

  // Finishes the requests whose deadline passed.
  void Tick(absl::Time now);

  // Fails every pending request with `status` (the coordinator stops).
  void Abort(const absl::Status& status);

  size_t pending() const { return pending_.size(); }

 private:
  struct Pending {
    v1::Timeline timeline;
    // Node name -> its entry in timeline.nodes, until it answers.
    absl::flat_hash_map<std::string, int> waiting;
    absl::Time deadline;
    Done done;
  };

  void MaybeFinish(uint64_t id);

  uint64_t next_id_ = 1;
  absl::flat_hash_map<uint64_t, Pending> pending_;
};

}  // namespace baton::coordinator
