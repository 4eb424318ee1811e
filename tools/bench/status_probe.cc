#include "tools/bench/status_probe.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace baton::bench {

JobFetch FetchJob(StatusClient& client, const std::string& job,
                  int32_t page_size) {
  JobFetch fetch;
  v1::GetJobRequest request;
  request.set_job(job);
  request.set_page_size(page_size);
  google::protobuf::RepeatedPtrField<v1::MemberStatus> members;
  const absl::Time start = absl::Now();
  for (;;) {
    const absl::Time asked = absl::Now();
    absl::StatusOr<v1::JobStatus> page = client.GetJobPage(request);
    fetch.pages.push_back(absl::Now() - asked);
    if (!page.ok()) {
      fetch.status = page.status();
      break;
    }
    fetch.bytes += static_cast<int64_t>(page->ByteSizeLong());
    const std::string next = page->next_page_token();
    for (v1::MemberStatus& m : *page->mutable_members()) {
      members.Add(std::move(m));
    }
    page->clear_members();
    fetch.job = *std::move(page);
    if (next.empty()) break;
    if (next == request.page_token() ||
        static_cast<int>(fetch.pages.size()) > fetch.job.total_members()) {
      fetch.status = absl::InternalError(absl::StrCat(
          "Status/GetJob of job \"", job, "\" kept answering with more pages"));
      break;
    }
    request.set_page_token(next);
  }
  fetch.total = absl::Now() - start;
  fetch.job.mutable_members()->Swap(&members);
  fetch.job.clear_next_page_token();
  return fetch;
}

StatusProbe::StatusProbe(StatusClient* client, std::string job,
                         int32_t page_size, absl::Duration interval)
    : client_(client),
      job_(std::move(job)),
      page_size_(page_size),
      interval_(interval),
      thread_([this] { Run(); }) {}

void StatusProbe::Stop() {
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (thread_.joinable()) thread_.join();
}

StatusProbe::Summary StatusProbe::Take() const {
  absl::MutexLock lock(&mu_);
  Summary summary = summary_;
  std::sort(summary.fetch_ms.begin(), summary.fetch_ms.end());
  std::sort(summary.page_ms.begin(), summary.page_ms.end());
  return summary;
}

void StatusProbe::Run() {
  absl::Time next = absl::Now();
  while (!stop_.WaitForNotificationWithDeadline(next)) {
    next += interval_;
    JobFetch fetch = FetchJob(*client_, job_, page_size_);
    absl::MutexLock lock(&mu_);
    ++summary_.fetches;
    if (!fetch.status.ok()) {
      if (summary_.failures++ == 0) {
        summary_.first_failure = fetch.status.ToString();
      }
      continue;
    }
    summary_.fetch_ms.push_back(absl::ToDoubleMilliseconds(fetch.total));
    for (absl::Duration page : fetch.pages) {
      summary_.page_ms.push_back(absl::ToDoubleMilliseconds(page));
    }
    summary_.pages_per_fetch = static_cast<int>(fetch.pages.size());
    summary_.bytes_per_fetch = fetch.bytes;
    summary_.members = fetch.job.members_size();
  }
}

}  // namespace baton::bench
