#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/transport/key_value_store.h"
#include "baton/v1/rendezvous.grpc.pb.h"
#include "common/clock.h"

namespace baton::agent {

// The coordinator's RendezvousStore service as a KeyValueStore, for one
// scope {job, generation}. Keys and values are passed through unchanged
// (values are bytes).
//
// Every RPC has a deadline: the server-side wait plus `rpc_margin`. A Get
// that waits longer than the server allows (600 s) is split into slices.
// UNAVAILABLE (the coordinator restarting or shutting down) is retried with
// exponential backoff until the call's timeout (Get) or `set_timeout` (Set);
// after it the last UNAVAILABLE is returned. Every other error is returned
// as the coordinator sent it: ABORTED when the generation ended, NOT_FOUND
// while a restarted coordinator has not rebuilt the job yet (keys written
// before a restart are gone: the caller reconnects its data plane),
// DEADLINE_EXCEEDED naming the keys still missing.
//
// Thread-safe.
class RendezvousClient : public KeyValueStore {
 public:
  struct Options {
    // Added to each RPC's deadline beyond the server-side wait: network and
    // the coordinator's tick (a wait expires up to one tick late).
    std::chrono::milliseconds rpc_margin{5000};
    // How long a Set keeps retrying while the coordinator is unavailable.
    std::chrono::milliseconds set_timeout{60000};
    // Backoff between retries of UNAVAILABLE: doubles from initial to max.
    std::chrono::milliseconds initial_backoff{50};
    std::chrono::milliseconds max_backoff{2000};
    // Measures every timeout, and gives the RPCs' deadlines (so a fake one
    // must read close to the real time); must outlive the client.
    Clock* clock = Clock::Real();
  };

  // The coordinator's cap on StoreGetRequest.wait_timeout_ms.
  static constexpr std::chrono::milliseconds kMaxServerWait{600000};

  RendezvousClient(std::shared_ptr<grpc::Channel> channel, std::string job,
                   int64_t generation, Options options);
  RendezvousClient(std::shared_ptr<grpc::Channel> channel, std::string job,
                   int64_t generation)
      : RendezvousClient(std::move(channel), std::move(job), generation,
                         Options()) {}

  absl::Status Set(const std::string& key, const std::string& value) override;

  absl::StatusOr<std::vector<std::string>> Get(
      const std::vector<std::string>& keys,
      std::chrono::milliseconds timeout) override;

  const std::string& job() const { return job_; }
  int64_t generation() const { return generation_; }

 private:
  // "StoreGet of 2 keys ("a", "b") for job "j" generation 3".
  std::string DescribeGet(const std::vector<std::string>& keys) const;

  // Constant after construction.
  const std::unique_ptr<v1::RendezvousStore::Stub> stub_;
  const std::string job_;
  const int64_t generation_;
  const Options options_;
};

}  // namespace baton::agent
