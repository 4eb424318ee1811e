#include "common/metrics.h"

#include <cstdio>
#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/validation.h"
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"

namespace baton {
namespace {

// Threads serving scrapes: one Prometheus server and a person with curl.
constexpr size_t kServerThreads = 2;

}  // namespace

absl::Status ValidateMetricsListen(absl::string_view value) {
  if (value.empty()) return absl::OkStatus();
  if (absl::Status status =
          ValidateHostPort("--metrics_listen", value, PortZero::kAllowed);
      !status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        status.message(), " (port 0 picks a free port; empty: no endpoint)"));
  }
  if (value.front() == '[') {
    // The HTTP server (civetweb, as packaged) binds IPv4 only.
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics_listen \"", value,
        "\" is an IPv6 address, which the metrics endpoint cannot serve on: "
        "give an IPv4 address or a host name"));
  }
  return absl::OkStatus();
}

void PrintMetricsUrl(const std::string& url) {
  if (!url.empty()) std::printf("metrics on %s\n", url.c_str());
}

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& listen_address) {
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    exposer =
        std::make_unique<prometheus::Exposer>(listen_address, kServerThreads);
  } catch (const std::exception&) {
    // The exception says only "possible problem binding to port".
    return absl::UnavailableError(absl::StrCat(
        "cannot serve metrics on ", listen_address,
        ": the address is not a local address of this host, or the port is "
        "in use; choose another --metrics_listen"));
  }
  const std::vector<int> ports = exposer->GetListeningPorts();
  if (ports.empty()) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", listen_address,
                     ": no port was bound; choose another --metrics_listen"));
  }
  const int port = ports.front();
  std::string url = absl::StrCat(
      "http://", listen_address.substr(0, listen_address.rfind(':')), ":", port,
      "/metrics");
  return std::unique_ptr<MetricsEndpoint>(
      new MetricsEndpoint(std::move(exposer), port, std::move(url)));
}

MetricsEndpoint::MetricsEndpoint(std::unique_ptr<prometheus::Exposer> exposer,
                                 int port, std::string url)
    : exposer_(std::move(exposer)), port_(port), url_(std::move(url)) {}

MetricsEndpoint::~MetricsEndpoint() {
  // Joins the server threads, so no scrape outlives the collectables.
  exposer_.reset();
}

void MetricsEndpoint::Add(
    std::shared_ptr<prometheus::Collectable> collectable) {
  exposer_->RegisterCollectable(collectable);
  collectables_.push_back(std::move(collectable));
}

}  // namespace baton
