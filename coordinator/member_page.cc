#include "coordinator/member_page.h"

#include <algorithm>
#include <limits>
#include <tuple>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace baton::coordinator {
namespace {

// Version tag of the token's layout.
constexpr absl::string_view kTokenTag = "m1";

// Sealed members by node rank, then unsealed ones by name.
auto Key(int32_t node_rank, absl::string_view node_name) {
  const bool unsealed = node_rank < 0;
  return std::make_tuple(unsealed, unsealed ? 0 : node_rank, node_name);
}

// The token as errors quote it: a long one shortened.
std::string Quoted(const std::string& token) {
  constexpr size_t kShown = 48;
  return absl::StrCat("\"", token.substr(0, kShown),
                      token.size() > kShown ? "..." : "", "\"");
}

std::string Encode(const v1::JobStatus& status, const v1::MemberStatus& last) {
  return absl::WebSafeBase64Escape(
      absl::StrCat(kTokenTag, ":", status.generation(), ":",
                   static_cast<int>(status.state()), ":", last.node_rank(), ":",
                   status.job().size(), ":", status.job(), last.node_name()));
}

std::string StateWord(int32_t state) {
  return v1::JobState_IsValid(state)
             ? v1::JobState_Name(static_cast<v1::JobState>(state))
             : absl::StrCat(state);
}

}  // namespace

MemberPage MemberPage::All() {
  return MemberPage(std::numeric_limits<int32_t>::max(), /*unbounded=*/true);
}

MemberPage MemberPage::First() {
  return MemberPage(kDefaultSize, /*unbounded=*/false);
}

MemberPage MemberPage::None() { return MemberPage(0, /*unbounded=*/false); }

absl::StatusOr<MemberPage> MemberPage::FromRequest(
    const v1::GetJobRequest& request) {
  if (request.page_size() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GetJobRequest.page_size is ", request.page_size(), ": give 1..",
        kMaxSize, " members per page, or 0 for the default ", kDefaultSize));
  }
  MemberPage page(request.page_size() == 0
                      ? kDefaultSize
                      : std::min(request.page_size(), kMaxSize),
                  /*unbounded=*/false);
  if (request.page_token().empty()) return page;
  const absl::Status bad = absl::InvalidArgumentError(absl::StrCat(
      "GetJobRequest.page_token ", Quoted(request.page_token()),
      " is not a page token this coordinator issued for job \"", request.job(),
      "\": ask for the first page again (an empty page_token) and pass each "
      "page's next_page_token unchanged"));
  std::string raw;
  if (!absl::WebSafeBase64Unescape(request.page_token(), &raw)) return bad;
  std::vector<absl::string_view> parts =
      absl::StrSplit(raw, absl::MaxSplits(':', 5));
  int64_t generation = 0;
  int32_t state = 0, rank = 0;
  size_t job_size = 0;
  if (parts.size() != 6 || parts[0] != kTokenTag ||
      !absl::SimpleAtoi(parts[1], &generation) ||
      !absl::SimpleAtoi(parts[2], &state) ||
      !absl::SimpleAtoi(parts[3], &rank) ||
      !absl::SimpleAtoi(parts[4], &job_size) || job_size > parts[5].size()) {
    return bad;
  }
  page.has_cursor_ = true;
  page.token_ = request.page_token();
  page.generation_ = generation;
  page.state_ = state;
  page.after_rank_ = rank;
  page.job_ = std::string(parts[5].substr(0, job_size));
  page.after_name_ = std::string(parts[5].substr(job_size));
  if (page.job_ != request.job()) {
    return absl::InvalidArgumentError(
        absl::StrCat("GetJobRequest.page_token ", Quoted(page.token_),
                     " is a page token of job \"", page.job_,
                     "\", not of job \"", request.job(),
                     "\": ask for the first page again (an empty page_token)"));
  }
  return page;
}

absl::StatusOr<MemberPage> MemberPage::Chunk(const std::string& job,
                                             int32_t size, size_t max_bytes,
                                             const std::string& token,
                                             bool first) const {
  MemberPage chunk = *this;
  if (!token.empty()) {
    v1::GetJobRequest request;
    request.set_job(job);
    request.set_page_token(token);
    absl::StatusOr<MemberPage> after = FromRequest(request);
    if (!after.ok()) return after.status();
    chunk = *std::move(after);
  }
  chunk.size_ = size;
  chunk.unbounded_ = false;
  chunk.max_bytes_ = max_bytes;
  chunk.keep_first_ = first;
  return chunk;
}

absl::Status MemberPage::Check(const v1::JobStatus& status) const {
  if (!has_cursor_ || (generation_ == status.generation() &&
                       state_ == static_cast<int32_t>(status.state()))) {
    return absl::OkStatus();
  }
  return absl::AbortedError(absl::StrCat(
      "the members of job \"", status.job(), "\" changed since the page of ",
      "page_token ", Quoted(token_), " (it was generation ", generation_, ", ",
      StateWord(state_), "; now generation ", status.generation(), ", ",
      StateWord(status.state()),
      "): fetch them again from the first page (an empty page_token)"));
}

bool MemberPage::Follows(int32_t node_rank, absl::string_view node_name) const {
  return !has_cursor_ ||
         Key(after_rank_, after_name_) < Key(node_rank, node_name);
}

void MemberPage::Finish(bool more, v1::JobStatus* status) const {
  auto* members = status->mutable_members();
  if (!unbounded_) {
    size_t bytes = 0;
    for (int i = 0; i < members->size(); ++i) {
      bytes += members->Get(i).ByteSizeLong();
      if (bytes > max_bytes_ && (i > 0 || !keep_first_)) {
        members->DeleteSubrange(i, members->size() - i);
        more = true;
        break;
      }
    }
  }
  if (more && !members->empty()) {
    status->set_next_page_token(Encode(*status, *members->rbegin()));
  }
}

}  // namespace baton::coordinator
