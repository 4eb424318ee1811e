#include "coordinator/reform_log.h"

#include <utility>

#include "glog/logging.h"

namespace baton::coordinator {

const char* ReformCauseName(ReformCause cause) {
  switch (cause) {
    case ReformCause::kLost:
      return "lost";
    case ReformCause::kLeft:
      return "left";
    case ReformCause::kJoined:
      return "joined";
  }
  return "unknown";
}

void ReformLog::Start(absl::Time now, int64_t aborted, int64_t new_generation,
                      ReformCause cause, const std::string& node_name,
                      const std::string& reason, int32_t nodes_before) {
  DCHECK(!open_) << "a re-form started while another was open";
  if (open_) Close(now, nodes_before, "superseded by the next re-form");
  v1::Reform record;
  record.set_aborted_generation(aborted);
  record.set_new_generation(new_generation);
  record.set_cause(ReformCauseName(cause));
  record.set_node_name(node_name);
  record.set_reason(reason);
  record.set_started_unix_ms(absl::ToUnixMillis(now));
  record.set_nodes_before(nodes_before);
  records_.push_back(std::move(record));
  while (static_cast<int>(records_.size()) > kKept) records_.pop_front();
  open_ = true;
  started_ = now;
}

void ReformLog::Sealed(absl::Time now, int32_t nodes) {
  if (!open_) return;
  sealed_seconds_.Observe(now - started_);
  Close(now, nodes, "sealed");
}

void ReformLog::Ended(absl::Time now, int32_t nodes,
                      const std::string& outcome) {
  if (open_) Close(now, nodes, outcome);
}

void ReformLog::Close(absl::Time now, int32_t nodes,
                      const std::string& outcome) {
  v1::Reform& record = records_.back();
  record.set_duration_ms(absl::ToInt64Milliseconds(now - started_));
  record.set_nodes_after(nodes);
  record.set_outcome(outcome);
  open_ = false;
}

void ReformLog::Fill(absl::Time now, int32_t nodes_now,
                     v1::JobStatus* status) const {
  for (const v1::Reform& record : records_) *status->add_reforms() = record;
  if (open_) {
    v1::Reform& last = *status->mutable_reforms(status->reforms_size() - 1);
    last.set_duration_ms(absl::ToInt64Milliseconds(now - started_));
    last.set_nodes_after(nodes_now);
  }
}

}  // namespace baton::coordinator
