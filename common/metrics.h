#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace prometheus {
class Collectable;
class Exposer;
}  // namespace prometheus

namespace baton {

// The label that names a baton job in every metric. Not "job": Prometheus
// gives every scraped series a `job` label of its own (the scrape config's
// job), and would rename ours to `exported_job`.
inline constexpr char kJobLabel[] = "job_name";

// Checks the value of a --metrics_listen flag: empty (no endpoint) or
// host:port with an IPv4 address or a host name (port 0 picks a free port).
// INVALID_ARGUMENT names the flag and says what to give.
absl::Status ValidateMetricsListen(absl::string_view value);

// For main(): prints "metrics on URL" on stdout (after the ready line, where
// tests and operators look for the bound port); nothing for an empty URL
// (no endpoint).
void PrintMetricsUrl(const std::string& url);

// An HTTP endpoint that serves GET /metrics in the Prometheus text format,
// for the coordinator and the agents alike. Each scrape asks every added
// collectable for its metrics, on one of the endpoint's own threads.
//
// Start, Add and the destructor are called from one thread (the owner's).
// Destroying it stops serving and waits for scrapes in progress: destroy it
// before anything its collectables read.
class MetricsEndpoint {
 public:
  // Serves on `listen_address` ("host:port", validated by
  // ValidateMetricsListen; port 0 picks a free port). UNAVAILABLE when the
  // address cannot be bound (not local, or the port is in use).
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(
      const std::string& listen_address);

  ~MetricsEndpoint();
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  // Serves `collectable`'s metrics from the next scrape on; the endpoint
  // keeps it alive.
  void Add(std::shared_ptr<prometheus::Collectable> collectable);

  // The bound port, and "http://HOST:PORT/metrics" with it.
  int port() const { return port_; }
  const std::string& url() const { return url_; }

 private:
  MetricsEndpoint(std::unique_ptr<prometheus::Exposer> exposer, int port,
                  std::string url);

  // Set at construction; reset first by the destructor.
  std::unique_ptr<prometheus::Exposer> exposer_;
  // Constant after construction.
  const int port_;
  const std::string url_;
  // Only touched by Add; the exposer holds weak pointers to these.
  std::vector<std::shared_ptr<prometheus::Collectable>> collectables_;
};

}  // namespace baton
