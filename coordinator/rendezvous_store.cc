#include "coordinator/rendezvous_store.h"

#include <glog/logging.h>

#include <cstdint>
#include <map>
#include <set>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace baton::coordinator {
namespace {

// A timeout names this many missing keys, then only counts the rest: a Get
// may wait on a thousand keys, and the error should stay readable.
constexpr size_t kMaxNamedKeys = 5;

// Quotes a user-supplied key or value for an error message without echoing
// kilobytes or control characters back.
std::string Quote(absl::string_view value) {
  constexpr size_t kMaxQuoted = 64;
  std::string out = "\"";
  for (size_t i = 0; i < value.size() && i < kMaxQuoted; ++i) {
    const char c = value[i];
    out += absl::ascii_isprint(static_cast<unsigned char>(c)) ? c : '?';
  }
  if (value.size() > kMaxQuoted) absl::StrAppend(&out, "...");
  return out + "\"";
}

absl::Status ValidateKey(absl::string_view what, absl::string_view key) {
  if (key.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is empty: give a key of 1..",
                     RendezvousStore::kMaxKeyBytes, " bytes"));
  }
  if (key.size() > RendezvousStore::kMaxKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " ", Quote(key), " is ", key.size(), " bytes long; the limit is ",
        RendezvousStore::kMaxKeyBytes));
  }
  return absl::OkStatus();
}

// Strict decimal int64: an optional '-' and digits, nothing else. Values are
// shared with gloo and NCCL bootstrap code, so "12 " or "+3" written by Set
// is not silently taken for a counter.
bool ParseDecimalInt64(absl::string_view text, int64_t* out) {
  absl::string_view digits = text;
  if (!digits.empty() && digits.front() == '-') digits.remove_prefix(1);
  if (digits.empty()) return false;
  for (char c : digits) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  return absl::SimpleAtoi(text, out);
}

// Names the keys a Get still waits for: the first few, in request order, and
// a count of the rest.
std::string DescribeMissing(const std::vector<std::string>& missing,
                            size_t total_keys) {
  std::string out =
      absl::StrCat("still missing ", missing.size(), " of ", total_keys,
                   total_keys == 1 ? " key" : " keys", ": ");
  for (size_t i = 0; i < missing.size() && i < kMaxNamedKeys; ++i) {
    absl::StrAppend(&out, i == 0 ? "" : ", ", Quote(missing[i]));
  }
  if (missing.size() > kMaxNamedKeys) {
    absl::StrAppend(&out, " and ", missing.size() - kMaxNamedKeys, " more");
  }
  return out;
}

// A resolved Get whose callback runs after the store's state is consistent
// again: callbacks may re-enter the store, even remove the job.
struct PendingCallback {
  RendezvousStore::GetCallback done;
  absl::StatusOr<std::vector<std::string>> result;
};

void RunCallbacks(std::vector<PendingCallback> callbacks) {
  for (PendingCallback& callback : callbacks) {
    callback.done(std::move(callback.result));
  }
}

}  // namespace

// One job's open scope: its keys and the Gets waiting on them.
struct RendezvousStore::Scope {
  struct Waiter {
    std::vector<std::string> keys;
    // Distinct keys not set yet; the waiter is woken when this reaches 0.
    size_t missing = 0;
    absl::Time deadline;
    int64_t wait_timeout_ms = 0;
    GetCallback done;
  };

  Scope(std::string job_name, int64_t gen)
      : job(std::move(job_name)), generation(gen) {}

  // The keys of `waiter` not set yet, in request order, without repeats.
  std::vector<std::string> MissingKeys(const Waiter& waiter) const {
    std::vector<std::string> missing;
    absl::flat_hash_set<absl::string_view> seen;
    for (const std::string& key : waiter.keys) {
      if (!values.contains(key) && seen.insert(key).second) {
        missing.push_back(key);
      }
    }
    return missing;
  }

  std::vector<std::string> ValuesOf(
      const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    out.reserve(keys.size());
    for (const std::string& key : keys) {
      auto it = values.find(key);
      DCHECK(it != values.end());
      out.push_back(it->second);
    }
    return out;
  }

  // Unlinks waiter `id` from every index and hands back its callback.
  Waiter Detach(uint64_t id) {
    auto it = waiters.find(id);
    DCHECK(it != waiters.end());
    Waiter waiter = std::move(it->second);
    waiters.erase(it);
    deadlines.erase({waiter.deadline, id});
    for (const std::string& key : waiter.keys) {
      auto by_key = waiters_by_key.find(key);
      if (by_key == waiters_by_key.end()) continue;
      by_key->second.erase(id);
      if (by_key->second.empty()) waiters_by_key.erase(by_key);
    }
    return waiter;
  }

  // Detaches every waiter (in arrival order) with `status`.
  void FailAll(const absl::Status& status,
               std::vector<PendingCallback>* callbacks) {
    for (auto& [id, waiter] : waiters) {
      callbacks->push_back({std::move(waiter.done), status});
    }
    waiters.clear();
    waiters_by_key.clear();
    deadlines.clear();
  }

  // Stores key = value (the caller checked the limits) and detaches the
  // waiters this completed, with their values.
  void Put(const std::string& key, std::string value,
           std::vector<PendingCallback>* callbacks) {
    auto [it, inserted] = values.try_emplace(key);
    if (inserted) {
      bytes += key.size();
    } else {
      bytes -= it->second.size();
    }
    bytes += value.size();
    it->second = std::move(value);

    auto by_key = waiters_by_key.find(key);
    if (by_key == waiters_by_key.end()) return;
    // Only this key's waiters are touched: a Set costs O(its waiters), not
    // O(all waiters), however many Gets wait on other keys.
    std::set<uint64_t> waiting = std::move(by_key->second);
    waiters_by_key.erase(by_key);
    for (uint64_t id : waiting) {
      Waiter& waiter = waiters.at(id);
      DCHECK_GT(waiter.missing, 0u);
      if (--waiter.missing > 0) continue;
      Waiter done = Detach(id);
      std::vector<std::string> result = ValuesOf(done.keys);
      callbacks->push_back({std::move(done.done), std::move(result)});
    }
  }

  // Checks that setting `key` to a value of `value_size` bytes stays within
  // the scope's limits.
  absl::Status CheckRoom(const std::string& key, size_t value_size) const {
    auto it = values.find(key);
    if (it == values.end() && values.size() >= kMaxKeysPerScope) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the store of job \"", job, "\" generation ", generation, " holds ",
          values.size(), " keys, the limit; cannot add key ", Quote(key)));
    }
    const size_t new_bytes = bytes -
                             (it == values.end() ? 0 : it->second.size()) +
                             (it == values.end() ? key.size() : 0) + value_size;
    if (new_bytes > kMaxBytesPerScope) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the store of job \"", job, "\" generation ", generation, " holds ",
          bytes, " bytes; setting key ", Quote(key), " to ", value_size,
          " bytes would pass the limit of ", kMaxBytesPerScope, " bytes"));
    }
    return absl::OkStatus();
  }

  const std::string job;
  const int64_t generation;
  // Set once the generation was aborted; requests then get ABORTED with it.
  absl::Status abort_reason;

  absl::flat_hash_map<std::string, std::string> values;
  // Sum of key and value sizes, checked against kMaxBytesPerScope.
  size_t bytes = 0;

  uint64_t next_waiter_id = 1;
  // Ordered by id, so waiters resolved together are called in arrival order.
  std::map<uint64_t, Waiter> waiters;
  // Each missing key -> the waiters that still need it.
  absl::flat_hash_map<std::string, std::set<uint64_t>> waiters_by_key;
  // Expiry order for Tick.
  std::set<std::pair<absl::Time, uint64_t>> deadlines;
};

namespace {

// Status for a request whose generation is not the open, live scope.
absl::Status CheckGeneration(const std::string& job, int64_t requested,
                             int64_t open, const absl::Status& abort_reason) {
  const std::string aborted =
      abort_reason.ok()
          ? ""
          : absl::StrCat(", which was aborted (", abort_reason.message(), ")");
  if (requested < open) {
    return absl::AbortedError(
        absl::StrCat("store request for job \"", job, "\" generation ",
                     requested, " is stale: the job is at generation ", open,
                     aborted, "; re-sync with the latest membership"));
  }
  if (requested > open) {
    return absl::FailedPreconditionError(absl::StrCat(
        "store request for job \"", job, "\" generation ", requested,
        " is ahead of the store, which is at generation ", open,
        ": wait for the membership of generation ", requested,
        " before using the store"));
  }
  if (!abort_reason.ok()) {
    return absl::AbortedError(absl::StrCat(
        "store request for job \"", job, "\" generation ", requested,
        ": generation ", open, " was aborted (", abort_reason.message(),
        "); re-sync with the latest membership"));
  }
  return absl::OkStatus();
}

}  // namespace

RendezvousStore::RendezvousStore() = default;

RendezvousStore::~RendezvousStore() {
  // Every Get is answered exactly once, even at shutdown: its RPC is waiting
  // for the answer. A callback may re-enter the store, so drain until empty.
  while (!jobs_.empty()) {
    absl::flat_hash_map<std::string, std::unique_ptr<Scope>> jobs;
    jobs.swap(jobs_);
    std::vector<PendingCallback> callbacks;
    for (auto& [job, scope] : jobs) {
      scope->FailAll(absl::UnavailableError(
                         "the coordinator is shutting down; retry the Get "
                         "once it is back"),
                     &callbacks);
    }
    RunCallbacks(std::move(callbacks));
  }
}

void RendezvousStore::OpenGeneration(const std::string& job,
                                     int64_t generation) {
  std::unique_ptr<Scope>& scope = jobs_[job];
  if (scope != nullptr && generation <= scope->generation) {
    // A repeated or late open: the scope (and its keys) stays as it is, and
    // an aborted generation stays aborted.
    return;
  }
  std::vector<PendingCallback> callbacks;
  if (scope != nullptr) {
    scope->FailAll(
        absl::AbortedError(absl::StrCat(
            "job \"", job, "\" moved on from generation ", scope->generation,
            " to generation ", generation,
            " while this Get waited; re-sync with the latest membership")),
        &callbacks);
  }
  scope = std::make_unique<Scope>(job, generation);
  RunCallbacks(std::move(callbacks));
}

void RendezvousStore::AbortGeneration(const std::string& job,
                                      int64_t generation,
                                      const absl::Status& why) {
  const absl::Status reason =
      why.ok() ? absl::AbortedError("generation aborted") : why;
  std::unique_ptr<Scope>& scope = jobs_[job];
  if (scope != nullptr && generation < scope->generation) return;
  if (scope != nullptr && generation == scope->generation &&
      !scope->abort_reason.ok()) {
    return;  // The first reason is the one agents need to see.
  }
  std::vector<PendingCallback> callbacks;
  if (scope != nullptr) {
    scope->FailAll(absl::AbortedError(absl::StrCat(
                       "job \"", job, "\" generation ", scope->generation,
                       " was aborted while this Get waited (", reason.message(),
                       "); re-sync with the latest membership")),
                   &callbacks);
  }
  if (scope == nullptr || generation > scope->generation) {
    // Aborting a generation the store never opened still ends every older
    // one, and requests for it must get ABORTED rather than wait for it.
    scope = std::make_unique<Scope>(job, generation);
  }
  scope->abort_reason = reason;
  scope->values.clear();
  scope->bytes = 0;
  RunCallbacks(std::move(callbacks));
}

void RendezvousStore::RemoveJob(const std::string& job,
                                const absl::Status& why) {
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return;
  std::unique_ptr<Scope> scope = std::move(it->second);
  jobs_.erase(it);
  std::vector<PendingCallback> callbacks;
  scope->FailAll(why.ok() ? absl::AbortedError(
                                absl::StrCat("job \"", job, "\" was removed"))
                          : why,
                 &callbacks);
  RunCallbacks(std::move(callbacks));
}

namespace {

// Resolves the request's scope in the order every request is checked: job
// name, known job, generation.
template <typename Scope>
absl::StatusOr<Scope*> FindScope(
    const absl::flat_hash_map<std::string, std::unique_ptr<Scope>>& jobs,
    const v1::StoreScope& request_scope) {
  if (request_scope.job().empty()) {
    return absl::InvalidArgumentError(
        "StoreScope.job is empty: name the job whose store to use");
  }
  auto it = jobs.find(request_scope.job());
  if (it == jobs.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job \"", request_scope.job(),
        "\" has no sealed generation yet: wait for the membership before "
        "using the store"));
  }
  Scope* scope = it->second.get();
  absl::Status status =
      CheckGeneration(request_scope.job(), request_scope.generation(),
                      scope->generation, scope->abort_reason);
  if (!status.ok()) return status;
  return scope;
}

}  // namespace

absl::Status RendezvousStore::Set(const v1::StoreSetRequest& request) {
  absl::StatusOr<Scope*> scope = FindScope(jobs_, request.scope());
  if (!scope.ok()) return scope.status();
  absl::Status status = ValidateKey("StoreSetRequest.key", request.key());
  if (!status.ok()) return status;
  if (request.value().size() > kMaxValueBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "StoreSetRequest.value of key ", Quote(request.key()), " is ",
        request.value().size(), " bytes; the limit is ", kMaxValueBytes));
  }
  status = (*scope)->CheckRoom(request.key(), request.value().size());
  if (!status.ok()) return status;
  std::vector<PendingCallback> callbacks;
  (*scope)->Put(request.key(), request.value(), &callbacks);
  RunCallbacks(std::move(callbacks));
  return absl::OkStatus();
}

absl::StatusOr<int64_t> RendezvousStore::Add(
    const v1::StoreAddRequest& request) {
  absl::StatusOr<Scope*> scope = FindScope(jobs_, request.scope());
  if (!scope.ok()) return scope.status();
  absl::Status status = ValidateKey("StoreAddRequest.key", request.key());
  if (!status.ok()) return status;

  int64_t current = 0;
  auto it = (*scope)->values.find(request.key());
  if (it != (*scope)->values.end() &&
      !ParseDecimalInt64(it->second, &current)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "key ", Quote(request.key()), " of job \"", request.scope().job(),
        "\" holds ", Quote(it->second),
        ", not a decimal integer; StoreAdd only adds to integers"));
  }
  int64_t sum = 0;
  if (__builtin_add_overflow(current, request.delta(), &sum)) {
    return absl::OutOfRangeError(
        absl::StrCat("adding ", request.delta(), " to ", current, " under key ",
                     Quote(request.key()), " of job \"", request.scope().job(),
                     "\" overflows int64"));
  }
  std::string value = absl::StrCat(sum);
  status = (*scope)->CheckRoom(request.key(), value.size());
  if (!status.ok()) return status;
  std::vector<PendingCallback> callbacks;
  (*scope)->Put(request.key(), std::move(value), &callbacks);
  RunCallbacks(std::move(callbacks));
  return sum;
}

void RendezvousStore::Get(const v1::StoreGetRequest& request, absl::Time now,
                          GetCallback done) {
  absl::StatusOr<Scope*> found = FindScope(jobs_, request.scope());
  if (!found.ok()) {
    done(found.status());
    return;
  }
  Scope& scope = **found;
  if (request.keys().empty()) {
    done(absl::InvalidArgumentError(
        absl::StrCat("StoreGetRequest.keys is empty: ask for 1..",
                     kMaxKeysPerGet, " keys")));
    return;
  }
  if (request.keys_size() > kMaxKeysPerGet) {
    done(absl::InvalidArgumentError(
        absl::StrCat("StoreGetRequest.keys has ", request.keys_size(),
                     " keys; the limit is ", kMaxKeysPerGet)));
    return;
  }
  for (int i = 0; i < request.keys_size(); ++i) {
    absl::Status status = ValidateKey(
        absl::StrCat("StoreGetRequest.keys[", i, "]"), request.keys(i));
    if (!status.ok()) {
      done(status);
      return;
    }
  }
  if (request.wait_timeout_ms() < 0 || request.wait_timeout_ms() > kMaxWaitMs) {
    done(absl::InvalidArgumentError(absl::StrCat(
        "StoreGetRequest.wait_timeout_ms is ", request.wait_timeout_ms(),
        "; give 0..", kMaxWaitMs, " (0 = do not wait)")));
    return;
  }

  Scope::Waiter waiter;
  waiter.keys.assign(request.keys().begin(), request.keys().end());
  std::vector<std::string> missing = scope.MissingKeys(waiter);
  if (missing.empty()) {
    done(scope.ValuesOf(waiter.keys));
    return;
  }
  if (request.wait_timeout_ms() == 0) {
    done(absl::DeadlineExceededError(
        absl::StrCat("StoreGet for job \"", scope.job, "\" generation ",
                     scope.generation, " did not wait (wait_timeout_ms is 0); ",
                     DescribeMissing(missing, waiter.keys.size()))));
    return;
  }
  const uint64_t id = scope.next_waiter_id++;
  waiter.missing = missing.size();
  waiter.deadline = now + absl::Milliseconds(request.wait_timeout_ms());
  waiter.wait_timeout_ms = request.wait_timeout_ms();
  waiter.done = std::move(done);
  for (const std::string& key : missing) scope.waiters_by_key[key].insert(id);
  scope.deadlines.insert({waiter.deadline, id});
  scope.waiters.emplace(id, std::move(waiter));
}

void RendezvousStore::Tick(absl::Time now) {
  std::vector<PendingCallback> callbacks;
  for (auto& [job, scope] : jobs_) {
    while (!scope->deadlines.empty() &&
           scope->deadlines.begin()->first <= now) {
      const uint64_t id = scope->deadlines.begin()->second;
      std::vector<std::string> missing =
          scope->MissingKeys(scope->waiters.at(id));
      Scope::Waiter waiter = scope->Detach(id);
      callbacks.push_back(
          {std::move(waiter.done),
           absl::DeadlineExceededError(absl::StrCat(
               "StoreGet for job \"", job, "\" generation ", scope->generation,
               " timed out after ", waiter.wait_timeout_ms, " ms; ",
               DescribeMissing(missing, waiter.keys.size())))});
    }
  }
  RunCallbacks(std::move(callbacks));
}

size_t RendezvousStore::WaitingGets() const {
  size_t waiting = 0;
  for (const auto& [job, scope] : jobs_) waiting += scope->waiters.size();
  return waiting;
}

}  // namespace baton::coordinator
