#include "coordinator/job_page_builder.h"

#include <algorithm>
#include <utility>

namespace baton::coordinator {

JobPageBuilder::JobPageBuilder(v1::GetJobRequest request, int32_t chunk_members)
    : request_(std::move(request)),
      chunk_members_(std::max(1, chunk_members)),
      page_(MemberPage::FromRequest(request_)) {
  Restart();
}

void JobPageBuilder::Restart() {
  built_.reset();
  if (page_.ok()) members_left_ = page_->size();
  bytes_left_ = MemberPage::kMaxBytes;
}

bool JobPageBuilder::Step(const Coordinator& coordinator) {
  if (!page_.ok()) {
    error_ = page_.status();
    return true;
  }
  const bool first = !built_.has_value();
  absl::StatusOr<MemberPage> chunk = page_->Chunk(
      request_.job(), std::min(members_left_, chunk_members_), bytes_left_,
      first ? std::string() : built_->next_page_token(),
      first || built_->members().empty());
  absl::StatusOr<v1::JobStatus> part =
      chunk.ok() ? coordinator.JobStatusPage(request_.job(), *chunk)
                 : chunk.status();
  if (!part.ok()) {
    if (!first && absl::IsAborted(part.status()) && restarts_ < kMaxRestarts) {
      // The job changed between two chunks: their members may not fit one
      // order. Build the page again from its start.
      ++restarts_;
      Restart();
      return false;
    }
    error_ = part.status();
    return true;
  }
  const int asked = chunk->size();
  const int got = part->members_size();
  for (const v1::MemberStatus& member : part->members()) {
    bytes_left_ -= std::min(bytes_left_, member.ByteSizeLong());
  }
  members_left_ -= got;
  if (first) {
    built_ = *std::move(part);
  } else if (got > 0) {
    for (v1::MemberStatus& member : *part->mutable_members()) {
      *built_->add_members() = std::move(member);
    }
    built_->set_next_page_token(part->next_page_token());
  }
  // Fewer than asked: no member follows, or the bytes ran out (the token
  // of the last chunk with members then says where the next page starts).
  return got < asked || members_left_ <= 0 || built_->next_page_token().empty();
}

absl::StatusOr<v1::JobStatus> JobPageBuilder::Take() {
  if (!error_.ok()) return error_;
  return *std::move(built_);
}

}  // namespace baton::coordinator
