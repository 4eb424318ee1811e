#pragma once

// The text batonctl (and baton.job_status_text) prints for the coordinator's
// Status service: fixed,
// grep-friendly sections, "(none)" where a section is empty. Every function
// is pure: "now" is an argument, so the output of a given response is fixed.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "baton/v1/status.pb.h"
#include "google/protobuf/message.h"

namespace baton {

// `bytes` with a binary unit: "512 B", "1.5 KiB", "4.0 MiB".
std::string FormatBytes(double bytes);

// A duration in microseconds: "850 us", "1.2 ms", "3.40 s".
std::string FormatMicros(int64_t micros);

// How long before `now` a unix-ms time was: "12s ago", "5m3s ago", "2h1m
// ago"; "-" for 0 (never).
std::string FormatAgo(int64_t unix_ms, absl::Time now);

// The proto's name in lower case: "running", "reforming", ...
std::string JobStateName(v1::JobState state);

// `batonctl status JOB`: the sections State, Membership, Re-forms (the
// nodes lost and joined, and the last kRecentReforms re-forms), Step,
// Scheduling, Stalls, Mismatches and Recent events (the last kRecentEvents)
// of one job. The Membership and Scheduling tables show at most
// `max_members` nodes: past that, the disconnected, unsealed and lagging
// ones first, then the others in rank order, and a line that counts the
// rest and names `batonctl members`.
inline constexpr int kShownMembers = 20;
std::string FormatJob(const v1::JobStatus& job, absl::Time now,
                      int max_members = kShownMembers);
inline constexpr int kRecentEvents = 10;
inline constexpr int kRecentReforms = 5;

// `batonctl status`: FormatJob for every job, separated by a blank line.
std::string FormatJobs(const v1::ListJobsResponse& jobs, absl::Time now,
                       int max_members = kShownMembers);

// `batonctl jobs`: one line per job (name, state, generation, world size,
// global step) under a header.
std::string FormatJobList(const v1::ListJobsResponse& jobs);

// `batonctl members JOB`: the Membership table of FormatJob, every node.
std::string FormatMembers(const v1::JobStatus& job, absl::Time now);

// `batonctl tensors JOB`: the plan line, then one line per tensor.
std::string FormatTensors(const v1::TensorsStatus& tensors);

// `batonctl events JOB`: every event the coordinator keeps, oldest first.
std::string FormatEvents(const v1::JobStatus& job, absl::Time now);

// `--json`: the message in the proto3 JSON mapping with the proto's field
// names and every field printed, defaults included (int64 fields are JSON
// strings, enums their value names). `multiline` indents it; otherwise one
// line.
absl::StatusOr<std::string> ToJson(const google::protobuf::Message& message,
                                   bool multiline);

}  // namespace baton
