// TokenTable: the --tokens_file format; every malformed case names its
// line and the fix.

#include "coordinator/token_table.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton::coordinator {
namespace {

using ::testing::HasSubstr;

constexpr char kRead[] = "read-token-0123456789";
constexpr char kAdmin[] = "admin-token-0123456789";

absl::StatusOr<TokenTable> Parse(const std::string& text) {
  return TokenTable::Parse(text, "/etc/baton/tokens");
}

TEST(TokenTableTest, FindsEachTokenWithItsScopeAndName) {
  absl::StatusOr<TokenTable> table =
      Parse(absl::StrCat("# operators\n\nread   alice ", kRead,
                         "\n\tadmin\tbob\t", kAdmin, "  \n"));
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->size(), 2u);
  const TokenTable::Entry* alice = table->Find(kRead);
  ASSERT_NE(alice, nullptr);
  EXPECT_EQ(alice->name, "alice");
  EXPECT_EQ(alice->scope, TokenScope::kRead);
  const TokenTable::Entry* bob = table->Find(kAdmin);
  ASSERT_NE(bob, nullptr);
  EXPECT_EQ(bob->name, "bob");
  EXPECT_EQ(bob->scope, TokenScope::kAdmin);
}

TEST(TokenTableTest, AnUnknownTokenIsNotFound) {
  absl::StatusOr<TokenTable> table = Parse(absl::StrCat("read alice ", kRead));
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->Find("read-token-012345678"), nullptr);  // a prefix
  EXPECT_EQ(table->Find(absl::StrCat(kRead, "x")), nullptr);
  EXPECT_EQ(table->Find(""), nullptr);
  EXPECT_EQ(TokenTable().Find(kRead), nullptr);
}

struct Malformed {
  const char* text;
  const char* line;
  const char* says;
};

TEST(TokenTableTest, MalformedLinesNameTheLineAndTheFix) {
  const std::string read = absl::StrCat("read alice ", kRead, "\n");
  const Malformed cases[] = {
      {"read alice\n", "line 1", "has 2 words: write \"SCOPE NAME TOKEN\""},
      {"# c\nread alice tok en-0123456789abcdef\n", "line 2", "has 4 words"},
      {"write alice 0123456789abcdef0\n", "line 1",
       "unknown scope \"write\": the scope is read or admin"},
      {"admin bob short\n", "line 1",
       "the token of \"bob\" has 5 characters, fewer than 16"},
  };
  for (const Malformed& c : cases) {
    absl::StatusOr<TokenTable> table = Parse(c.text);
    ASSERT_FALSE(table.ok()) << c.text;
    EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(
        table.status().message(),
        HasSubstr(absl::StrCat("--tokens_file /etc/baton/tokens ", c.line)));
    EXPECT_THAT(table.status().message(), HasSubstr(c.says));
  }
  absl::StatusOr<TokenTable> duplicate =
      Parse(absl::StrCat(read, "admin bob ", kRead, "\n"));
  ASSERT_FALSE(duplicate.ok());
  EXPECT_THAT(duplicate.status().message(),
              HasSubstr("line 2: the token of \"bob\" is also the token of "
                        "\"alice\": give each holder a token of their own"));
  // No line holds a token.
  EXPECT_THAT(read, HasSubstr(kRead));
  EXPECT_THAT(duplicate.status().message(), ::testing::Not(HasSubstr(kRead)));
}

TEST(TokenTableTest, AFileWithoutTokensIsAnError) {
  for (const char* text : {"", "\n\n", "# only a comment\n"}) {
    absl::StatusOr<TokenTable> table = Parse(text);
    ASSERT_FALSE(table.ok());
    EXPECT_THAT(table.status().message(),
                HasSubstr("--tokens_file /etc/baton/tokens holds no tokens"));
  }
}

TEST(TokenTableTest, AnUnreadableFileIsAnError) {
  absl::StatusOr<TokenTable> table =
      TokenTable::Load(::testing::TempDir() + "/no-such-tokens");
  ASSERT_FALSE(table.ok());
  EXPECT_THAT(table.status().message(), HasSubstr("cannot be read"));
  EXPECT_THAT(table.status().message(), HasSubstr("no-such-tokens"));
}

}  // namespace
}  // namespace baton::coordinator
