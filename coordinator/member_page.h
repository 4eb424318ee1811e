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
//
// MemberPage decides where a page starts and how many members it holds; the
// job's owner (JobManager::FillStatus) keeps its members in this order and
// fills only those, so a page costs O(page size), not O(members).

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
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

  // Every member on one page (the coordinator's own callers).
  static MemberPage All();
  // The first page of the default size (Status.ListJobs, for every job).
  static MemberPage First();
  // No member: the job's own fields only (the metrics).
  static MemberPage None();
  // The page `request` asks for: INVALID_ARGUMENT for a negative page_size
  // or a token that does not decode. Whether the token fits the job is
  // checked by Check.
  static absl::StatusOr<MemberPage> FromRequest(
      const v1::GetJobRequest& request);

  // A part of this page, for building it a chunk at a time (JobPageBuilder):
  // at most `size` members, ending early once they serialize to
  // `max_bytes`, after the member `token` (the previous chunk's
  // next_page_token; empty: where this page starts). `first` when it may
  // hold the page's first member, which a page keeps whatever its size.
  // Errors as FromRequest's for a bad token.
  absl::StatusOr<MemberPage> Chunk(const std::string& job, int32_t size,
                                   size_t max_bytes, const std::string& token,
                                   bool first) const;

  // `status` holds the job's own fields (its generation and state): ABORTED
  // for a token of another generation or state, whose order no longer
  // holds.
  absl::Status Check(const v1::JobStatus& status) const;

  // The most members the page holds.
  int32_t size() const { return size_; }
  // Whether the member comes after the previous page's last one in page
  // order (node_rank < 0: not sealed), so on this page or a later one.
  // Every member does on the first page.
  bool Follows(int32_t node_rank, absl::string_view node_name) const;
  // Where the page's unsealed members start: after this name; null when
  // they start at the first (the previous page, if any, ended on a sealed
  // member).
  const std::string* unsealed_after() const {
    return has_cursor_ && after_rank_ < 0 ? &after_name_ : nullptr;
  }

  // Once the page's members are filled in page order, `more` when members
  // follow them: ends the page at kMaxBytes and sets next_page_token when
  // members remain after it.
  void Finish(bool more, v1::JobStatus* status) const;

 private:
  MemberPage(int32_t size, bool unbounded)
      : size_(size), unbounded_(unbounded) {}

  int32_t size_;
  // All(): no size or byte limit.
  bool unbounded_;
  // Otherwise the page ends once its members serialize to this many bytes,
  // keeping its first member (unless keep_first_ is false) whatever its size.
  size_t max_bytes_ = kMaxBytes;
  bool keep_first_ = true;
  // From the token; none on the first page.
  bool has_cursor_ = false;
  std::string token_;
  std::string job_;
  int64_t generation_ = 0;
  int32_t state_ = 0;
  int32_t after_rank_ = -1;
  std::string after_name_;
};

}  // namespace baton::coordinator
