#pragma once

// Paging of a job's members for Status.GetJob (AIP-158): which members one
// page holds, and the page token that says where the next page starts.
//
// The order is fixed by the members themselves: sealed members by node
// rank, then joined-but-unsealed ones by name. A token names the job, the
// generation and state its page saw, and the last member it held (rank and
// name), not an index, so members that leave between pages shift nothing.
// The coordinator keeps no paging state: a token stays good across a
// restart. A token of another membership (the job moved to another
// generation, or sealed its generation, since the page) is refused with
// ABORTED: its order no longer holds, so the caller starts again.

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "baton/v1/status.pb.h"

namespace baton::coordinator {

class MemberPage {
 public:
  static constexpr int32_t kDefaultSize = 1000;
  static constexpr int32_t kMaxSize = 5000;
  // A page ends early once its members serialize to this many bytes (at
  // least one member per page), well under gRPC's default 4 MiB limit on
  // what a client receives.
  static constexpr size_t kMaxBytes = size_t{2} << 20;

  // Every member on one page (the coordinator's own callers, ListJobs).
  static MemberPage All();
  // The page `request` asks for: INVALID_ARGUMENT for a negative page_size
  // or a token that does not decode. Whether the token fits the job is
  // checked by Select.
  static absl::StatusOr<MemberPage> FromRequest(
      const v1::GetJobRequest& request);

  // `status` holds the whole job (every member, its generation and state).
  // Orders the members, sets total_members and keeps only this page's.
  // INVALID_ARGUMENT for a token of another job, ABORTED for a token of
  // another generation or state.
  absl::Status Select(v1::JobStatus* status);
  // Once the kept members are filled in: ends the page at kMaxBytes and
  // sets next_page_token when members remain after it.
  void Finish(v1::JobStatus* status) const;

 private:
  MemberPage(int32_t size, bool unbounded)
      : size_(size), unbounded_(unbounded) {}

  int32_t size_;
  // All(): no size or byte limit.
  bool unbounded_;
  // From the token; none on the first page.
  bool has_cursor_ = false;
  std::string token_;
  std::string job_;
  int64_t generation_ = 0;
  int32_t state_ = 0;
  int32_t after_rank_ = -1;
  std::string after_name_;
  // Set by Select: members past the page remain.
  bool more_ = false;
};

}  // namespace baton::coordinator
