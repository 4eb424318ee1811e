#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace baton::agent {

// A failure one node of a tree round saw, as it travels to the nodes that
// could not see it (TcpTreeRounds): who saw it (the reporter), what failed
// and the node ranks at fault. Each node that receives it forwards it to
// its other tree neighbours, so that every node's error names the node at
// fault: "node rank 7 closed its connection (its agent left the job or
// failed) (reported by node rank 1)".
//
// On the wire, in place of a message's count word: a negative word,
// -(words that follow), then the reporter, the reason, two values and the
// subjects, one word each (host byte order, like the rounds).
struct RoundNotice {
  enum class Reason : int64_t {
    // The subject's connection ended (its agent left or failed).
    kClosed = 1,
    // The reporter could not send to or read from the subject.
    kUnreachable = 2,
    // The subject's round has `a` words, the reporter's `b`.
    kMismatch = 3,
    // The reporter's round timed out after `a` ms waiting for the subjects.
    kTimedOut = 4,
    // The subject sent a word the reporter cannot read (`a`): the streams
    // are out of step.
    kUnreadable = 5,
  };
  // Words after the header besides the subjects.
  static constexpr size_t kFixedWords = 4;

  int reporter = -1;
  Reason reason = Reason::kClosed;
  int64_t a = 0;
  int64_t b = 0;
  std::vector<int> subjects;
  // The reporter's own account (an errno text); stays on the reporter.
  std::string detail;

  // The header word and the words after it.
  std::vector<int64_t> Encode() const;
  // The `count` words after a header of a round among `size` nodes;
  // INVALID_ARGUMENT naming what does not parse.
  static absl::StatusOr<RoundNotice> Decode(const int64_t* words, size_t count,
                                            int size);
  // The error this notice means on node rank `self`, starting with `what`
  // (the call it ended): UNAVAILABLE for a node gone, FAILED_PRECONDITION
  // for a mismatch or an unreadable message, DEADLINE_EXCEEDED for a
  // timeout; "(reported by node rank <r>)" ends it unless `self` reported.
  absl::Status ToStatus(const std::string& what, int self) const;
};

}  // namespace baton::agent
