// The TLS helpers (common/tls.h) on real certificates: the files a process
// is given are checked before it starts, each problem named in one line.

#include "common/tls.h"

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(absl::StrCat(::testing::TempDir(), "/tls_test"));
    const std::string command = absl::StrCat(BATON_MAKE_TEST_CERTS, " ", *dir_,
                                             " n1 n2 >/dev/null 2>&1");
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
  }
  static void TearDownTestSuite() { delete dir_; }

  static std::string Path(const std::string& name) {
    return absl::StrCat(*dir_, "/", name);
  }
  // NAME.pem as both certificate and key, the cluster's CA.
  static TlsFiles Files(const std::string& name) {
    TlsFiles files;
    files.cert = files.key = Path(name + ".pem");
    files.ca = Path("ca.crt");
    return files;
  }

  static std::string* dir_;
};
std::string* TlsTest::dir_ = nullptr;

TEST_F(TlsTest, GoodFilesPassSeparateOrCombined) {
  EXPECT_TRUE(CheckTlsFiles(Files("n1")).ok()) << CheckTlsFiles(Files("n1"));
  TlsFiles separate;
  separate.cert = Path("coordinator.crt");
  separate.key = Path("coordinator.key");
  separate.ca = Path("ca.crt");
  EXPECT_TRUE(CheckTlsFiles(separate).ok()) << CheckTlsFiles(separate);
  EXPECT_TRUE(CheckTlsFiles(TlsFiles{}).ok()) << "none given: plaintext";
}

TEST_F(TlsTest, EachProblemIsOneLineNamingTheFlagAndFile) {
  TlsFiles partial = Files("n1");
  partial.ca.clear();
  EXPECT_THAT(std::string(CheckTlsFiles(partial).message()),
              HasSubstr("--tls_ca is missing"));

  TlsFiles expired = Files("expired/n1");
  const absl::Status late = CheckTlsFiles(expired);
  EXPECT_EQ(late.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(late.message()), HasSubstr("expired at"));
  EXPECT_THAT(std::string(late.message()), HasSubstr("2020"));

  const absl::Status stranger = CheckTlsFiles(Files("wrong/n1"));
  EXPECT_THAT(std::string(stranger.message()),
              HasSubstr("is not signed by --tls_ca"));

  TlsFiles mismatched = Files("n1");
  mismatched.key = Path("n2.key");
  EXPECT_THAT(std::string(CheckTlsFiles(mismatched).message()),
              HasSubstr("is not the key of --tls_cert"));

  TlsFiles missing = Files("n1");
  missing.cert = Path("nope.crt");
  EXPECT_THAT(std::string(CheckTlsFiles(missing).message()),
              HasSubstr("--tls_cert " + Path("nope.crt") + " cannot be read"));

  TlsFiles not_a_cert = Files("n1");
  not_a_cert.ca = Path("n1.key");
  EXPECT_THAT(std::string(CheckTlsFiles(not_a_cert).message()),
              HasSubstr("holds no PEM certificate"));

  TlsFiles slow = Files("n1");
  slow.refresh_s = 0;
  EXPECT_THAT(std::string(CheckTlsFiles(slow).message()),
              HasSubstr("--tls_refresh_s=0"));
}

TEST_F(TlsTest, CertificateDnsNamesAreItsSubjectAltNames) {
  absl::StatusOr<std::vector<std::string>> node =
      CertificateDnsNames(Path("n1.crt"));
  ASSERT_TRUE(node.ok()) << node.status();
  EXPECT_THAT(*node, ElementsAre("n1"));
  // The coordinator's IP entry is not a DNS name.
  absl::StatusOr<std::vector<std::string>> coordinator =
      CertificateDnsNames(Path("coordinator.pem"));
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  EXPECT_THAT(*coordinator, ElementsAre("localhost"));
  EXPECT_FALSE(CertificateDnsNames(Path("nope.crt")).ok());
}

TEST(TlsAddressTest, OnlyLoopbackAddressesAreLoopback) {
  for (const char* loopback :
       {"127.0.0.1:50051", "127.1.2.3:0", "[::1]:50051", "localhost:1",
        "LOCALHOST:1", "unix:/tmp/x.sock", "127.0.0.1", "::1"}) {
    EXPECT_TRUE(IsLoopbackAddress(loopback)) << loopback;
  }
  for (const char* exposed :
       {"0.0.0.0:50051", "[::]:50051", "10.0.0.1:50051", ":50051", "",
        "coordinator:50051", "128.0.0.1:1", "[::2]:1", "localhost.evil:1"}) {
    EXPECT_FALSE(IsLoopbackAddress(exposed)) << exposed;
  }
}

}  // namespace
}  // namespace baton
