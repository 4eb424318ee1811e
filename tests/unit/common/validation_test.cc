#include "common/validation.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using ::testing::HasSubstr;

TEST(ValidateIdentifierTest, AcceptsKubernetesStyleNames) {
  EXPECT_TRUE(ValidateIdentifier("x", "node-3.rack_2:a").ok());
  EXPECT_TRUE(ValidateIdentifier("x", std::string(128, 'a')).ok());
}

TEST(ValidateIdentifierTest, RejectsEmptyLongAndOddCharactersNamingTheField) {
  absl::Status empty = ValidateIdentifier("JoinJob.job", "");
  EXPECT_EQ(empty.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(empty.message(), HasSubstr("JoinJob.job is empty"));
  EXPECT_THAT(ValidateIdentifier("f", std::string(129, 'a')).message(),
              HasSubstr("f is 129 characters long; the limit is 128"));
  absl::Status space = ValidateIdentifier("Hello.node_name", "my node");
  EXPECT_THAT(space.message(),
              HasSubstr("Hello.node_name \"my node\" has a character outside"));
}

TEST(ValidateIdentifierTest, QuotesHostileValuesSafely) {
  const std::string hostile = std::string("a\n\x01") + std::string(100, 'b');
  absl::Status status = ValidateIdentifier("f", hostile);
  EXPECT_THAT(status.message(), HasSubstr("\"a??bbb"));
  EXPECT_THAT(status.message(), HasSubstr("...\""));
  EXPECT_LT(status.message().size(), 200u);
}

TEST(ValidateTensorNameTest, AcceptsPrintableAndRejectsControlCharacters) {
  EXPECT_TRUE(ValidateTensorName("t", "Gradient.layer1/weight [0]").ok());
  EXPECT_FALSE(ValidateTensorName("t", "").ok());
  EXPECT_FALSE(ValidateTensorName("t", std::string(257, 'w')).ok());
  EXPECT_THAT(ValidateTensorName("t", "a\tb").message(),
              HasSubstr("non-printable"));
}

TEST(ValidateHostPortTest, AcceptsHostnamesIpv4AndBracketedIpv6) {
  EXPECT_TRUE(ValidateHostPort("a", "10.0.0.1:7000").ok());
  EXPECT_TRUE(ValidateHostPort("a", "node-1.cluster.local:65535").ok());
  EXPECT_TRUE(ValidateHostPort("a", "[fe80::1]:1").ok());
}

TEST(ValidateHostPortTest, RejectsMissingPartsAndBadPorts) {
  for (const char* bad : {"", "host", ":80", "host:", "host:0", "host:65536",
                          "host:http", "fe80::1:80", "a b:80"}) {
    absl::Status status = ValidateHostPort("--listen", bad);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(status.message(), HasSubstr("--listen")) << bad;
    EXPECT_THAT(status.message(), HasSubstr("expected host:port")) << bad;
  }
}

TEST(ValidateHostPortTest, PortZeroOnlyWhereAllowed) {
  EXPECT_TRUE(ValidateHostPort("a", "10.0.0.1:0", PortZero::kAllowed).ok());
  absl::Status status = ValidateHostPort("a", "10.0.0.1:0");
  EXPECT_THAT(status.message(), HasSubstr("port outside 1..65535"));
  status = ValidateHostPort("a", "10.0.0.1:65536", PortZero::kAllowed);
  EXPECT_THAT(status.message(), HasSubstr("port outside 0..65535"));
}

}  // namespace
}  // namespace baton
