#include "agent/rendezvous_client.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/grpc_util.h"

namespace baton::agent {
namespace {

using std::chrono::milliseconds;

// Rounded up: a wait that asks for the time left never ends before the
// deadline.
milliseconds Until(const Deadline& deadline) {
  return std::max(milliseconds(0),
                  absl::ToChronoMilliseconds(
                      absl::Ceil(deadline.Left(), absl::Milliseconds(1))));
}

// Retries UNAVAILABLE with exponential backoff until `deadline`.
class Backoff {
 public:
  Backoff(milliseconds initial, milliseconds max)
      : next_(std::max(initial, milliseconds(1))), max_(max) {}

  // Sleeps before the next attempt, at most until `deadline` (so the last
  // attempt is made at the deadline); false once the deadline has passed.
  bool Wait(const Deadline& deadline) {
    const absl::Duration left = deadline.Left();
    if (left <= absl::ZeroDuration()) return false;
    absl::SleepFor(std::min(absl::FromChrono(next_), left));
    next_ = std::min(next_ * 2, max_);
    return true;
  }

 private:
  milliseconds next_;
  const milliseconds max_;
};

}  // namespace

RendezvousClient::RendezvousClient(std::shared_ptr<grpc::Channel> channel,
                                   std::string job, int64_t generation,
                                   Options options)
    : stub_(v1::RendezvousStore::NewStub(channel)),
      job_(std::move(job)),
      generation_(generation),
      options_(options) {}

std::string RendezvousClient::DescribeGet(
    const std::vector<std::string>& keys) const {
  constexpr size_t kNamed = 5;
  std::vector<std::string> named;
  for (size_t i = 0; i < keys.size() && i < kNamed; ++i) {
    named.push_back(absl::StrCat("\"", keys[i], "\""));
  }
  if (keys.size() > kNamed) {
    named.push_back(absl::StrCat("and ", keys.size() - kNamed, " more"));
  }
  return absl::StrCat("StoreGet of ", keys.size(), " key(s) (",
                      absl::StrJoin(named, ", "), ") for job \"", job_,
                      "\" generation ", generation_);
}

absl::Status RendezvousClient::Set(const std::string& key,
                                   const std::string& value) {
  v1::StoreSetRequest request;
  request.mutable_scope()->set_job(job_);
  request.mutable_scope()->set_generation(generation_);
  request.set_key(key);
  request.set_value(value);
  Clock& clock = *options_.clock;
  const Deadline deadline(clock, absl::FromChrono(options_.set_timeout));
  Backoff backoff(options_.initial_backoff, options_.max_backoff);
  for (;;) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(
        clock.Now() + absl::FromChrono(options_.rpc_margin)));
    v1::StoreSetResponse response;
    const absl::Status status =
        FromGrpcStatus(stub_->Set(&context, request, &response));
    if (status.code() != absl::StatusCode::kUnavailable) return status;
    if (!backoff.Wait(deadline)) {
      return absl::UnavailableError(absl::StrCat(
          "StoreSet of key \"", key, "\" for job \"", job_, "\" generation ",
          generation_, ": the coordinator stayed unavailable for ",
          options_.set_timeout.count(), " ms: ", status.message()));
    }
  }
}

absl::StatusOr<std::vector<std::string>> RendezvousClient::Get(
    const std::vector<std::string>& keys, milliseconds timeout) {
  // A year stands for "forever" and keeps the deadline arithmetic finite.
  timeout = std::clamp(timeout, milliseconds(0),
                       milliseconds(std::chrono::hours(24 * 365)));
  v1::StoreGetRequest request;
  request.mutable_scope()->set_job(job_);
  request.mutable_scope()->set_generation(generation_);
  for (const std::string& key : keys) request.add_keys(key);
  Clock& clock = *options_.clock;
  const Deadline deadline(clock, absl::FromChrono(timeout));
  Backoff backoff(options_.initial_backoff, options_.max_backoff);
  for (;;) {
    const milliseconds wait = std::min(Until(deadline), kMaxServerWait);
    request.set_wait_timeout_ms(wait.count());
    grpc::ClientContext context;
    const absl::Time rpc_deadline =
        clock.Now() + absl::FromChrono(wait + options_.rpc_margin);
    context.set_deadline(absl::ToChronoTime(rpc_deadline));
    v1::StoreGetResponse response;
    const absl::Status status =
        FromGrpcStatus(stub_->Get(&context, request, &response));
    if (status.ok()) {
      if (response.values_size() != static_cast<int>(keys.size())) {
        return absl::InternalError(
            absl::StrCat(DescribeGet(keys), ": the coordinator answered ",
                         response.values_size(), " values"));
      }
      std::vector<std::string> values(response.values().begin(),
                                      response.values().end());
      return values;
    }
    switch (status.code()) {
      case absl::StatusCode::kDeadlineExceeded:
        // The server's wait ended with time left (a slice of a longer
        // wait): ask again. Otherwise its answer names the missing keys.
        if (Until(deadline) > milliseconds(0)) continue;
        if (clock.Now() >= rpc_deadline) {
          return absl::DeadlineExceededError(absl::StrCat(
              DescribeGet(keys), ": no answer from the coordinator within ",
              (wait + options_.rpc_margin).count(), " ms"));
        }
        return status;
      case absl::StatusCode::kUnavailable:
        if (backoff.Wait(deadline)) continue;
        return absl::UnavailableError(absl::StrCat(
            DescribeGet(keys), ": the coordinator was unavailable until the ",
            timeout.count(), " ms timeout: ", status.message()));
      default:
        return status;
    }
  }
}

}  // namespace baton::agent
