#include "coordinator/grpc/call_authorizer.h"

#include <glog/logging.h>
#include <sys/stat.h>

#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/grpc_util.h"

namespace baton::coordinator {
namespace {

// The connection property naming the holder of an admin token that
// authorized an Admin call (CallAuthorizer::AdminName).
constexpr char kAdminNameProperty[] = "baton_admin_token_name";

enum class MethodClass { kAgent, kStatus, kAdmin, kHealth, kOther };

MethodClass Classify(absl::string_view method) {
  if (method == "/baton.v1.Coordinator/AgentSession" ||
      absl::StartsWith(method, "/baton.v1.RendezvousStore/")) {
    return MethodClass::kAgent;
  }
  if (absl::StartsWith(method, "/baton.v1.Status/") ||
      absl::StartsWith(method, "/grpc.reflection.v1alpha.ServerReflection/") ||
      absl::StartsWith(method, "/grpc.reflection.v1.ServerReflection/")) {
    return MethodClass::kStatus;
  }
  if (absl::StartsWith(method, "/baton.v1.Admin/")) return MethodClass::kAdmin;
  if (absl::StartsWith(method, "/grpc.health.v1.Health/")) {
    return MethodClass::kHealth;
  }
  return MethodClass::kOther;
}

// The modification time of `path`; InfinitePast when it cannot be read.
absl::Time Modified(const std::string& path) {
  struct stat info {};
  if (stat(path.c_str(), &info) != 0) return absl::InfinitePast();
  return absl::TimeFromTimespec(info.st_mtim);
}

std::string Value(const grpc::string_ref& ref) {
  return std::string(ref.data(), ref.size());
}

}  // namespace

absl::Status AuthorizeCall(absl::string_view method, bool verified_certificate,
                           PresentedToken token, absl::string_view token_name) {
  const MethodClass kind = Classify(method);
  if (kind == MethodClass::kHealth) return absl::OkStatus();
  if (token == PresentedToken::kUnknown) {
    return absl::UnauthenticatedError(absl::StrCat(
        method,
        ": the bearer token is not one the coordinator's --tokens_file "
        "lists: check --token_file (BATON_TOKEN_FILE) and ask the "
        "coordinator's operator for a token"));
  }
  switch (kind) {
    case MethodClass::kAgent:
      if (verified_certificate) return absl::OkStatus();
      return absl::UnauthenticatedError(absl::StrCat(
          method,
          " needs the node's client certificate (--tls_cert and --tls_key, "
          "signed by the cluster's CA); a token is not enough"));
    case MethodClass::kStatus:
      if (verified_certificate || token == PresentedToken::kRead ||
          token == PresentedToken::kAdmin) {
        return absl::OkStatus();
      }
      return absl::UnauthenticatedError(absl::StrCat(
          method,
          " needs a client certificate (--tls_cert and --tls_key) or a "
          "bearer token of scope read or admin (--token_file)"));
    case MethodClass::kAdmin:
      if (token == PresentedToken::kAdmin) return absl::OkStatus();
      if (token == PresentedToken::kRead) {
        return absl::PermissionDeniedError(absl::StrCat(
            method, ": the token of \"", token_name,
            "\" has scope read; this needs a token of scope admin"));
      }
      return absl::UnauthenticatedError(absl::StrCat(
          method, " needs a bearer token of scope admin (--token_file)",
          verified_certificate ? "; a client certificate is not enough" : ""));
    case MethodClass::kHealth:
      return absl::OkStatus();
    case MethodClass::kOther:
      break;
  }
  return absl::PermissionDeniedError(
      absl::StrCat(method, " is not a method this coordinator serves"));
}

CallAuthorizer::CallAuthorizer(std::string tokens_path,
                               std::shared_ptr<const TokenTable> tokens,
                               absl::Duration refresh)
    : tokens_path_(std::move(tokens_path)),
      refresh_(refresh),
      tokens_(std::move(tokens)),
      last_check_(absl::Now()) {
  if (!tokens_path_.empty()) modified_ = Modified(tokens_path_);
}

std::shared_ptr<const TokenTable> CallAuthorizer::CurrentTokens() {
  const absl::Time now = absl::Now();
  {
    absl::MutexLock lock(&mu_);
    if (tokens_path_.empty() || now - last_check_ < refresh_) return tokens_;
    last_check_ = now;
    const absl::Time modified = Modified(tokens_path_);
    if (modified == modified_) return tokens_;
    modified_ = modified;
  }
  absl::StatusOr<TokenTable> loaded = TokenTable::Load(tokens_path_);
  absl::MutexLock lock(&mu_);
  if (!loaded.ok()) {
    LOG(ERROR) << "keeping the " << tokens_->size()
               << " tokens loaded before: " << loaded.status().message();
    return tokens_;
  }
  LOG(INFO) << "--tokens_file " << tokens_path_
            << " changed: " << loaded->size() << " tokens now";
  tokens_ = std::make_shared<const TokenTable>(*std::move(loaded));
  return tokens_;
}

grpc::Status CallAuthorizer::Process(const InputMetadata& auth_metadata,
                                     grpc::AuthContext* context,
                                     OutputMetadata* consumed_auth_metadata,
                                     OutputMetadata* /*response_metadata*/) {
  std::string method;
  std::string authorization;
  bool has_authorization = false;
  for (const auto& [key, value] : auth_metadata) {
    if (key == ":path") method = Value(value);
    if (key == "authorization") {
      has_authorization = true;
      authorization = Value(value);
      consumed_auth_metadata->emplace("authorization", authorization);
    }
  }
  PresentedToken token = PresentedToken::kNone;
  // Holds the table `entry` points into, should a reload replace it.
  std::shared_ptr<const TokenTable> tokens;
  const TokenTable::Entry* entry = nullptr;
  if (has_authorization) {
    token = PresentedToken::kUnknown;
    constexpr absl::string_view kBearer = "Bearer ";
    tokens = CurrentTokens();
    if (absl::StartsWith(authorization, kBearer)) {
      entry =
          tokens->Find(absl::string_view(authorization).substr(kBearer.size()));
    }
    if (entry != nullptr) {
      token = entry->scope == TokenScope::kAdmin ? PresentedToken::kAdmin
                                                 : PresentedToken::kRead;
    }
  }
  absl::Status decided;
  std::string who;
  {
    absl::MutexLock lock(&mu_);
    const bool verified = context->IsPeerAuthenticated();
    decided = AuthorizeCall(method, verified, token,
                            entry != nullptr ? entry->name : "");
    if (decided.ok()) {
      // Only a connection without a certificate carries the name: it can
      // run no AgentSession, whose handler reads the context unlocked.
      if (token == PresentedToken::kAdmin && !verified &&
          absl::StartsWith(method, "/baton.v1.Admin/")) {
        bool known = false;
        for (const grpc::string_ref& name :
             context->FindPropertyValues(kAdminNameProperty)) {
          known = known || Value(name) == entry->name;
        }
        if (!known) context->AddProperty(kAdminNameProperty, entry->name);
      }
      return grpc::Status::OK;
    }
    std::vector<std::string> names;
    for (const grpc::string_ref& name :
         context->FindPropertyValues("x509_common_name")) {
      names.push_back(Value(name));
    }
    who = absl::StrCat(
        verified ? absl::StrCat("certificate CN=", absl::StrJoin(names, ","))
                 : "no certificate",
        ", ",
        token == PresentedToken::kNone ? "no token"
        : entry == nullptr
            ? "an unknown token"
            : absl::StrCat("the token of \"", entry->name, "\" (",
                           TokenScopeName(entry->scope), ")"));
  }
  LogRefusal(method, who, decided);
  return ToGrpcStatus(decided);
}

void CallAuthorizer::LogRefusal(absl::string_view method,
                                const std::string& who,
                                const absl::Status& refusal) {
  const std::string key = absl::StrCat(method, " ", who);
  const absl::Time now = absl::Now();
  int suppressed = 0;
  {
    absl::MutexLock lock(&log_mu_);
    // Bounded: a flood of distinct methods cannot grow it without end.
    if (logged_.size() > 1000) logged_.clear();
    Logged& logged = logged_[key];
    if (now - logged.last < kLogInterval) {
      ++logged.suppressed;
      return;
    }
    suppressed = logged.suppressed;
    logged = Logged{now, 0};
  }
  LOG(WARNING) << "refused a call (" << who << "): " << refusal
               << (suppressed > 0
                       ? absl::StrCat(" (and ", suppressed,
                                      " like it in the last ",
                                      absl::FormatDuration(kLogInterval), ")")
                       : "");
}

std::string CallAuthorizer::AdminName(const grpc::AuthContext& context) const {
  absl::MutexLock lock(&mu_);
  const std::vector<grpc::string_ref> names =
      context.FindPropertyValues(kAdminNameProperty);
  return names.size() == 1 ? Value(names.front()) : "";
}

}  // namespace baton::coordinator
