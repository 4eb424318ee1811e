#include "agent/transport/tcp/round_notice.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace baton::agent {

std::vector<int64_t> RoundNotice::Encode() const {
  std::vector<int64_t> words = {
      -static_cast<int64_t>(kFixedWords + subjects.size()), reporter,
      static_cast<int64_t>(reason), a, b};
  words.insert(words.end(), subjects.begin(), subjects.end());
  return words;
}

absl::StatusOr<RoundNotice> RoundNotice::Decode(const int64_t* words,
                                                size_t count, int size) {
  if (count < kFixedWords || count > kFixedWords + size) {
    return absl::InvalidArgumentError(
        absl::StrCat("a failure notice of ", count, " words"));
  }
  RoundNotice notice;
  if (words[0] < 0 || words[0] >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("a failure notice from node rank ", words[0]));
  }
  notice.reporter = static_cast<int>(words[0]);
  if (words[1] < static_cast<int64_t>(Reason::kClosed) ||
      words[1] > static_cast<int64_t>(Reason::kUnreadable)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a failure notice of reason ", words[1]));
  }
  notice.reason = static_cast<Reason>(words[1]);
  notice.a = words[2];
  notice.b = words[3];
  for (size_t i = kFixedWords; i < count; ++i) {
    if (words[i] < 0 || words[i] >= size) {
      return absl::InvalidArgumentError(
          absl::StrCat("a failure notice naming node rank ", words[i]));
    }
    notice.subjects.push_back(static_cast<int>(words[i]));
  }
  return notice;
}

absl::Status RoundNotice::ToStatus(const std::string& what, int self) const {
  const std::string subject =
      absl::StrCat("node rank ", subjects.empty() ? -1 : subjects.front());
  const std::string reporter_name =
      reporter == self ? "this node" : absl::StrCat("node rank ", reporter);
  const std::string reported =
      reporter == self
          ? ""
          : absl::StrCat(" (reported by node rank ", reporter, ")");
  switch (reason) {
    case Reason::kClosed:
    case Reason::kUnreachable: {
      std::string why = detail;
      if (why.empty()) {
        why = reason == Reason::kClosed
                  ? "closed its connection (its agent left the job or failed)"
                  : "is unreachable";
      }
      return absl::UnavailableError(
          absl::StrCat(what, ": ", subject, " ", why, reported));
    }
    case Reason::kMismatch:
      return absl::FailedPreconditionError(absl::StrCat(
          what, ": ", subject, " sent a vector of ", a, " words, ",
          reporter_name, " one of ", b,
          " (the nodes disagree on the plan: they must run one build of "
          "baton and the same coordinator plan)",
          reported));
    case Reason::kTimedOut:
      return absl::DeadlineExceededError(absl::StrCat(
          what, " timed out after ", a, " ms waiting for node rank(s) ",
          absl::StrJoin(subjects, ", "), reported));
    case Reason::kUnreadable:
      return absl::FailedPreconditionError(absl::StrCat(
          what, ": ", subject, " sent a word ", reporter_name, " cannot read (",
          a, ") where a message begins: the streams are out of step",
          reported));
  }
  return absl::InternalError(absl::StrCat(what, ": a failure notice of reason ",
                                          static_cast<int64_t>(reason)));
}

}  // namespace baton::agent
