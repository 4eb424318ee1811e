#include "agent/transport/gloo/gloo_store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gloo/common/error.h"

namespace baton::agent {

GlooStore::GlooStore(std::shared_ptr<KeyValueStore> store, std::string prefix,
                     const Deadline& deadline)
    : store_(std::move(store)),
      prefix_(std::move(prefix)),
      deadline_(deadline) {}

std::string GlooStore::FullKey(const std::string& key) const {
  return absl::StrCat(prefix_, "/", key);
}

absl::Status GlooStore::first_error() const {
  absl::MutexLock lock(&mu_);
  return first_error_;
}

void GlooStore::Fail(const absl::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    if (first_error_.ok()) first_error_ = status;
  }
  throw gloo::IoException(status.ToString());
}

void GlooStore::set(const std::string& key, const std::vector<char>& data) {
  const absl::Status status =
      store_->Set(FullKey(key), std::string(data.begin(), data.end()));
  if (!status.ok()) Fail(status);
}

std::vector<std::string> GlooStore::Fetch(const std::vector<std::string>& keys,
                                          std::chrono::milliseconds timeout) {
  const std::chrono::milliseconds left =
      absl::ToChronoMilliseconds(deadline_.Left());
  timeout = std::max(std::chrono::milliseconds(0), std::min(timeout, left));
  std::vector<std::string> full_keys;
  full_keys.reserve(keys.size());
  for (const std::string& key : keys) full_keys.push_back(FullKey(key));
  absl::StatusOr<std::vector<std::string>> values =
      store_->Get(full_keys, timeout);
  if (!values.ok()) Fail(values.status());
  if (values->size() != keys.size()) {
    Fail(absl::InternalError(absl::StrCat(
        "the rendezvous store answered ", values->size(), " values for ",
        keys.size(), " keys under \"", prefix_, "/\"")));
  }
  return *std::move(values);
}

std::vector<char> GlooStore::get(const std::string& key) {
  {
    absl::MutexLock lock(&mu_);
    auto it = fetched_.find(key);
    if (it != fetched_.end()) {
      std::vector<char> value(it->second.begin(), it->second.end());
      fetched_.erase(it);
      return value;
    }
  }
  const std::vector<std::string> values =
      Fetch({key}, std::chrono::milliseconds::max());
  return std::vector<char>(values[0].begin(), values[0].end());
}

void GlooStore::wait(const std::vector<std::string>& keys) {
  wait(keys, std::chrono::milliseconds::max());
}

void GlooStore::wait(const std::vector<std::string>& keys,
                     const std::chrono::milliseconds& timeout) {
  if (keys.empty()) return;
  std::vector<std::string> values = Fetch(keys, timeout);
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < keys.size(); ++i) {
    fetched_.insert_or_assign(keys[i], std::move(values[i]));
  }
}

}  // namespace baton::agent
