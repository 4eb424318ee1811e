#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "baton/v1/status.pb.h"
#include "coordinator/coordinator.h"
#include "coordinator/member_page.h"

namespace baton::coordinator {

// Builds one Status.GetJob page a chunk of members at a time, one control
// loop task per chunk, so that the agents' messages queued meanwhile are
// handled between the chunks: a page of 1,000 members holds none of them up
// for more than one chunk's members (measured in docs/benchmarks.md,
// "Coordinator at scale").
//
// The page is the one Coordinator::GetJob(request) gives at once: the same
// members, the same next_page_token, the job's own fields from its first
// chunk. Should the job move to another generation or state between two
// chunks (the later chunk's token is then ABORTED), the page is built again
// from its start, up to kMaxRestarts times; then the ABORTED is the answer.
//
// Not thread-safe: Step runs on the control loop.
class JobPageBuilder {
 public:
  static constexpr int32_t kChunkMembers = 250;
  static constexpr int kMaxRestarts = 3;

  // `chunk_members`: members per chunk (tests give a few).
  explicit JobPageBuilder(v1::GetJobRequest request,
                          int32_t chunk_members = kChunkMembers);

  // Builds the next chunk; true once the page is complete (or failed).
  bool Step(const Coordinator& coordinator);

  // Once Step returned true: the page, or why there is none.
  absl::StatusOr<v1::JobStatus> Take();

 private:
  // Forgets what was built and starts again from the page's start.
  void Restart();

  const v1::GetJobRequest request_;
  const int32_t chunk_members_;
  // The whole page's, from the request; its error ends the build at once.
  absl::StatusOr<MemberPage> page_;
  int restarts_ = 0;
  // The page so far; nullopt before the first chunk.
  std::optional<v1::JobStatus> built_;
  int32_t members_left_ = 0;
  size_t bytes_left_ = 0;
  absl::Status error_;
};

}  // namespace baton::coordinator
