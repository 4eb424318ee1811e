// The /metrics endpoint both binaries serve: flag validation, serving on a
// free port, and a clear error for a port in use.
#include "common/metrics.h"

#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/counter.h"
#include "prometheus/registry.h"
#include "tests/integration/metrics_scrape.h"

namespace baton {
namespace {

using ::testing::HasSubstr;
using ::testing::Optional;
using ::testing::StartsWith;

TEST(ValidateMetricsListenTest, AcceptsEmptyAndHostPortWithPortZero) {
  EXPECT_TRUE(ValidateMetricsListen("").ok());
  EXPECT_TRUE(ValidateMetricsListen("0.0.0.0:9100").ok());
  EXPECT_TRUE(ValidateMetricsListen("127.0.0.1:0").ok());
  EXPECT_TRUE(ValidateMetricsListen("localhost:9100").ok());
}

TEST(ValidateMetricsListenTest, RejectsBadAddressesNamingTheFlag) {
  for (const char* bad : {"9100", ":9100", "host:", "host:65536", "a b:1"}) {
    absl::Status status = ValidateMetricsListen(bad);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(status.message(), HasSubstr("--metrics_listen")) << bad;
    EXPECT_THAT(status.message(), HasSubstr("expected host:port")) << bad;
  }
  EXPECT_THAT(ValidateMetricsListen("[::1]:9100").message(),
              HasSubstr("give an IPv4 address or a host name"));
}

TEST(MetricsEndpointTest, ServesItsCollectablesOnAFreePort) {
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint =
      MetricsEndpoint::Start("127.0.0.1:0");
  ASSERT_TRUE(endpoint.ok()) << endpoint.status();
  const int port = (*endpoint)->port();
  EXPECT_GT(port, 0);
  EXPECT_EQ((*endpoint)->url(),
            "http://127.0.0.1:" + std::to_string(port) + "/metrics");

  auto registry = std::make_shared<prometheus::Registry>();
  prometheus::BuildCounter()
      .Name("baton_test_events_total")
      .Help("Events.")
      .Register(*registry)
      .Add({{"job_name", "j1"}})
      .Increment(3);
  (*endpoint)->Add(registry);

  absl::StatusOr<std::string> text = HttpGet((*endpoint)->url());
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_THAT(SampleValue(*text, "baton_test_events_total{job_name=\"j1\"}"),
              Optional(3.0));
}

TEST(MetricsEndpointTest, PortInUseIsUnavailableNamingTheFlag) {
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> first =
      MetricsEndpoint::Start("127.0.0.1:0");
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string address = "127.0.0.1:" + std::to_string((*first)->port());
  absl::StatusOr<std::unique_ptr<MetricsEndpoint>> second =
      MetricsEndpoint::Start(address);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(second.status().message()),
              StartsWith("cannot serve metrics on " + address));
  EXPECT_THAT(second.status().message(),
              HasSubstr("choose another --metrics_listen"));
}

}  // namespace
}  // namespace baton
