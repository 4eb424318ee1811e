// The coordinator's method table (AuthorizeCall): every class of method
// against every combination of client certificate and token.

#include "coordinator/grpc/call_authorizer.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton::coordinator {
namespace {

using ::testing::HasSubstr;

constexpr absl::StatusCode kOk = absl::StatusCode::kOk;
constexpr absl::StatusCode kUnauthenticated =
    absl::StatusCode::kUnauthenticated;
constexpr absl::StatusCode kDenied = absl::StatusCode::kPermissionDenied;

constexpr PresentedToken kTokens[] = {
    PresentedToken::kNone, PresentedToken::kRead, PresentedToken::kAdmin,
    PresentedToken::kUnknown};

// One class of methods: what each token gets without a certificate and
// with one (indexed as kTokens).
struct Row {
  const char* method;
  absl::StatusCode without_cert[4];
  absl::StatusCode with_cert[4];
};

//                                      none      read      admin     wrong
const Row kTable[] = {
    {"/baton.v1.Coordinator/AgentSession",
     {kUnauthenticated, kUnauthenticated, kUnauthenticated, kUnauthenticated},
     {kOk, kOk, kOk, kUnauthenticated}},
    {"/baton.v1.RendezvousStore/Get",
     {kUnauthenticated, kUnauthenticated, kUnauthenticated, kUnauthenticated},
     {kOk, kOk, kOk, kUnauthenticated}},
    {"/baton.v1.Status/GetJob",
     {kUnauthenticated, kOk, kOk, kUnauthenticated},
     {kOk, kOk, kOk, kUnauthenticated}},
    {"/baton.v1.Status/GetTimeline",
     {kUnauthenticated, kOk, kOk, kUnauthenticated},
     {kOk, kOk, kOk, kUnauthenticated}},
    {"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
     {kUnauthenticated, kOk, kOk, kUnauthenticated},
     {kOk, kOk, kOk, kUnauthenticated}},
    {"/baton.v1.Admin/CancelJob",
     {kUnauthenticated, kDenied, kOk, kUnauthenticated},
     {kUnauthenticated, kDenied, kOk, kUnauthenticated}},
    {"/grpc.health.v1.Health/Check",
     {kOk, kOk, kOk, kOk},
     {kOk, kOk, kOk, kOk}},
    {"/grpc.health.v1.Health/Watch",
     {kOk, kOk, kOk, kOk},
     {kOk, kOk, kOk, kOk}},
    {"/baton.v1.TrainerService/TrainerSession",
     {kDenied, kDenied, kDenied, kUnauthenticated},
     {kDenied, kDenied, kDenied, kUnauthenticated}},
    {"/baton.v1.Coordinator/Other",
     {kDenied, kDenied, kDenied, kUnauthenticated},
     {kDenied, kDenied, kDenied, kUnauthenticated}},
    {"",
     {kDenied, kDenied, kDenied, kUnauthenticated},
     {kDenied, kDenied, kDenied, kUnauthenticated}},
};

TEST(CallAuthorizerTest, MethodTable) {
  for (const Row& row : kTable) {
    for (int t = 0; t < 4; ++t) {
      for (const bool cert : {false, true}) {
        const absl::Status status =
            AuthorizeCall(row.method, cert, kTokens[t], "carol");
        EXPECT_EQ(status.code(), cert ? row.with_cert[t] : row.without_cert[t])
            << row.method << " cert=" << cert << " token=" << t << ": "
            << status;
      }
    }
  }
}

TEST(CallAuthorizerTest, AgentMethodsSayACertificateIsNeeded) {
  const absl::Status status =
      AuthorizeCall("/baton.v1.Coordinator/AgentSession", false,
                    PresentedToken::kAdmin, "carol");
  EXPECT_THAT(status.message(),
              HasSubstr("/baton.v1.Coordinator/AgentSession needs the node's "
                        "client certificate"));
  EXPECT_THAT(status.message(), HasSubstr("a token is not enough"));
}

TEST(CallAuthorizerTest, AReadTokenOnAdminNamesItsHolderAndTheScopeNeeded) {
  const absl::Status status = AuthorizeCall("/baton.v1.Admin/CancelJob", false,
                                            PresentedToken::kRead, "carol");
  EXPECT_THAT(status.message(),
              HasSubstr("the token of \"carol\" has scope read; this needs a "
                        "token of scope admin"));
}

TEST(CallAuthorizerTest, MissingCredentialsSayWhatToGive) {
  EXPECT_THAT(AuthorizeCall("/baton.v1.Status/ListJobs", false,
                            PresentedToken::kNone, "")
                  .message(),
              HasSubstr("needs a client certificate (--tls_cert and "
                        "--tls_key) or a bearer token of scope read or admin "
                        "(--token_file)"));
  EXPECT_THAT(AuthorizeCall("/baton.v1.Admin/CancelJob", true,
                            PresentedToken::kNone, "")
                  .message(),
              HasSubstr("needs a bearer token of scope admin (--token_file); "
                        "a client certificate is not enough"));
  EXPECT_THAT(AuthorizeCall("/baton.v1.Status/ListJobs", true,
                            PresentedToken::kUnknown, "")
                  .message(),
              HasSubstr("the bearer token is not one the coordinator's "
                        "--tokens_file lists"));
}

}  // namespace
}  // namespace baton::coordinator
