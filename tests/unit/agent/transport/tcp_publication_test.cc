// What a node publishes for a peer set, as its peers parse it
// (agent/transport/tcp/tcp_publication.h).
#include "agent/transport/tcp/tcp_publication.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace baton::agent::tcp {
namespace {

TEST(PublicationTest, ParsesWhatANodePublishes) {
  Link a;
  a.id = 0x1f;
  a.sent = 12;
  Link b;
  b.id = 0xfeedfacecafebeef;
  b.sent = 0;
  const std::string text = Publication("10.0.0.7", 4242, {a, b});
  EXPECT_EQ(text, "10.0.0.7 4242 1f:12 feedfacecafebeef:0");
  absl::StatusOr<Published> parsed = ParsePublication(text, "negotiation");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->host, "10.0.0.7");
  EXPECT_EQ(parsed->port, 4242);
  EXPECT_EQ(parsed->kept, (std::map<uint64_t, uint64_t>{
                              {0x1f, 12}, {0xfeedfacecafebeef, 0}}));
}

TEST(PublicationTest, RefusesWhatNoNodePublishesQuotingIt) {
  for (const std::string text :
       {"", "host", " 80", "host 0", "host 65536", "host 80 0:1",
        "host 80 xyz:1", "host 80 1f", "host 80 1f:-1", "host 80 1f:1 1f:2",
        "host 80 1f:1:2"}) {
    absl::StatusOr<Published> parsed = ParsePublication(text, "data");
    ASSERT_FALSE(parsed.ok()) << "\"" << text << "\"";
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(parsed.status().message().rfind(
                  "published data address \"" + text + "\" is not", 0),
              0u)
        << parsed.status();
  }
}

}  // namespace
}  // namespace baton::agent::tcp
