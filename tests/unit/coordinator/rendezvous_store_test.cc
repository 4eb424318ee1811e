#include "coordinator/rendezvous_store.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

const absl::Time kT0 = absl::FromUnixSeconds(1700000000);

v1::StoreScope Scope(const std::string& job, int64_t generation) {
  v1::StoreScope scope;
  scope.set_job(job);
  scope.set_generation(generation);
  return scope;
}

v1::StoreSetRequest SetRequest(const std::string& job, int64_t generation,
                               const std::string& key,
                               const std::string& value) {
  v1::StoreSetRequest request;
  *request.mutable_scope() = Scope(job, generation);
  request.set_key(key);
  request.set_value(value);
  return request;
}

v1::StoreAddRequest AddRequest(const std::string& job, int64_t generation,
                               const std::string& key, int64_t delta) {
  v1::StoreAddRequest request;
  *request.mutable_scope() = Scope(job, generation);
  request.set_key(key);
  request.set_delta(delta);
  return request;
}

v1::StoreGetRequest GetRequest(const std::string& job, int64_t generation,
                               const std::vector<std::string>& keys,
                               int64_t wait_timeout_ms) {
  v1::StoreGetRequest request;
  *request.mutable_scope() = Scope(job, generation);
  for (const std::string& key : keys) request.add_keys(key);
  request.set_wait_timeout_ms(wait_timeout_ms);
  return request;
}

// Records what a Get's callback received and how often it ran. The record is
// shared with the callback, so a Get still waiting when the test ends may be
// answered by the store's destructor after the test's locals are gone.
class GetResult {
 public:
  RendezvousStore::GetCallback Callback() {
    return [record = record_](absl::StatusOr<std::vector<std::string>> values) {
      ++record->calls;
      record->result = std::move(values);
    };
  }
  int calls() const { return record_->calls; }
  const absl::StatusOr<std::vector<std::string>>& result() const {
    return *record_->result;
  }
  absl::StatusCode code() const { return result().status().code(); }
  std::string message() const {
    return std::string(result().status().message());
  }

 private:
  struct Record {
    int calls = 0;
    std::optional<absl::StatusOr<std::vector<std::string>>> result;
  };
  std::shared_ptr<Record> record_ = std::make_shared<Record>();
};

class RendezvousStoreTest : public ::testing::Test {
 protected:
  void SetUp() override { store_.OpenGeneration("job", 1); }

  // A Get that must resolve at once.
  absl::StatusOr<std::vector<std::string>> GetNow(
      const v1::StoreGetRequest& request) {
    GetResult got;
    store_.Get(request, kT0, got.Callback());
    EXPECT_EQ(got.calls(), 1);
    return got.result();
  }

  RendezvousStore store_;
};

TEST_F(RendezvousStoreTest, SetThenGetReturnsValuesInKeyOrder) {
  ASSERT_TRUE(store_.Set(SetRequest("job", 1, "a", "alpha")).ok());
  ASSERT_TRUE(store_.Set(SetRequest("job", 1, "b", "beta")).ok());
  auto values = GetNow(GetRequest("job", 1, {"b", "a", "b"}, 0));
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_THAT(*values, ElementsAre("beta", "alpha", "beta"));
  EXPECT_EQ(store_.WaitingGets(), 0u);
}

TEST_F(RendezvousStoreTest, SetOverwritesAndKeepsBinaryValues) {
  const std::string binary("\0\x01\xff", 3);
  ASSERT_TRUE(store_.Set(SetRequest("job", 1, "k", "old")).ok());
  ASSERT_TRUE(store_.Set(SetRequest("job", 1, "k", binary)).ok());
  auto values = GetNow(GetRequest("job", 1, {"k"}, 0));
  ASSERT_TRUE(values.ok());
  EXPECT_THAT(*values, ElementsAre(binary));
}

TEST_F(RendezvousStoreTest, EmptyValueIsAValue) {
  ASSERT_TRUE(store_.Set(SetRequest("job", 1, "k", "")).ok());
  auto values = GetNow(GetRequest("job", 1, {"k"}, 0));
  ASSERT_TRUE(values.ok());
  EXPECT_THAT(*values, ElementsAre(""));
}

TEST_F(RendezvousStoreTest, GetWithoutWaitNamesMissingKeys) {
  ASSERT_TRUE(store_.Set(SetRequest("job", 1, "a", "1")).ok());
  auto values = GetNow(GetRequest("job", 1, {"a", "b", "c"}, 0));
  EXPECT_EQ(values.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(values.status().message(),
              HasSubstr("still missing 2 of 3 keys: \"b\", \"c\""));
  EXPECT_THAT(values.status().message(), HasSubstr("wait_timeout_ms is 0"));
  EXPECT_EQ(store_.WaitingGets(), 0u);
}

TEST_F(RendezvousStoreTest, WaitingGetIsWokenBySetWithTheValue) {
  GetResult got;
  store_.Get(GetRequest("job", 1, {"nccl_id"}, 5000), kT0, got.Callback());
  EXPECT_EQ(got.calls(), 0);
  EXPECT_EQ(store_.WaitingGets(), 1u);

  ASSERT_TRUE(store_.Set(SetRequest("job", 1, "nccl_id", "id-bytes")).ok());
  ASSERT_EQ(got.calls(), 1);
  ASSERT_TRUE(got.result().ok()) << got.result().status();
  EXPECT_THAT(*got.result(), ElementsAre("id-bytes"));
  EXPECT_EQ(store_.WaitingGets(), 0u);

  // Resolved callbacks never run again, not even on a later timeout.
  store_.Tick(kT0 + absl::Seconds(10));
  EXPECT_EQ(got.calls(), 1);
}

TEST_F(RendezvousStoreTest, MultiKeyWaitIsWokenOnlyByTheLastMissingKey) {
  ASSERT_TRUE(store_.Set(SetRequest("job", 1, "rank0", "addr0")).ok());
  GetResult got;
  store_.Get(GetRequest("job", 1, {"rank0", "rank1", "rank2", "rank1"}, 5000),
             kT0, got.Callback());

  ASSERT_TRUE(store_.Set(SetRequest("job", 1, "rank2", "addr2")).ok());
  EXPECT_EQ(got.calls(), 0);
  // Setting a key twice, or an unrelated key, does not count as progress.
  ASSERT_TRUE(store_.Set(SetRequest("job", 1, "rank2", "addr2b")).ok());
  ASSERT_TRUE(store_.Set(SetRequest("job", 1, "other", "x")).ok());
  EXPECT_EQ(got.calls(), 0);
  EXPECT_EQ(store_.WaitingGets(), 1u);

  ASSERT_TRUE(store_.Set(SetRequest("job", 1, "rank1", "addr1")).ok());
  ASSERT_EQ(got.calls(), 1);
  ASSERT_TRUE(got.result().ok());
  EXPECT_THAT(*got.result(), ElementsAre("addr0", "addr1", "addr2b", "addr1"));
}

TEST_F(RendezvousStoreTest, OneSetWakesEveryWaiterOnThatKeyInArrivalOrder) {
  // Shared with the callbacks, which outlive this test body in the fixture.
  auto order = std::make_shared<std::vector<int>>();
  for (int i = 0; i < 3; ++i) {
    store_.Get(GetRequest("job", 1, {"k"}, 5000), kT0,
               [order, i](absl::StatusOr<std::vector<std::string>> values) {
                 EXPECT_TRUE(values.ok());
                 order->push_back(i);
               });
  }
  GetResult other;
  store_.Get(GetRequest("job", 1, {"k", "j"}, 5000), kT0, other.Callback());
  ASSERT_TRUE(store_.Set(SetRequest("job", 1, "k", "v")).ok());
  EXPECT_THAT(*order, ElementsAre(0, 1, 2));
  EXPECT_EQ(other.calls(), 0);
  EXPECT_EQ(store_.WaitingGets(), 1u);
}

TEST_F(RendezvousStoreTest, ManyWaitersEachWokenByTheirOwnLastKey) {
  constexpr int kWaiters = 1000;
  std::vector<GetResult> got(kWaiters);
  for (int i = 0; i < kWaiters; ++i) {
    store_.Get(GetRequest("job", 1, {"common", absl::StrCat("rank", i)}, 5000),
               kT0, got[i].Callback());
  }
  ASSERT_TRUE(store_.Set(SetRequest("job", 1, "common", "c")).ok());
  EXPECT_EQ(store_.WaitingGets(), static_cast<size_t>(kWaiters));
  for (int i = kWaiters - 1; i >= 0; --i) {
    ASSERT_TRUE(store_
                    .Set(SetRequest("job", 1, absl::StrCat("rank", i),
                                    absl::StrCat("addr", i)))
                    .ok());
    ASSERT_EQ(got[i].calls(), 1) << i;
    EXPECT_THAT(*got[i].result(), ElementsAre("c", absl::StrCat("addr", i)));
    if (i > 0) {
      EXPECT_EQ(got[i - 1].calls(), 0);
    }
    EXPECT_EQ(store_.WaitingGets(), static_cast<size_t>(i));
  }
}

TEST_F(RendezvousStoreTest, AddWakesWaiters) {
  GetResult got;
  store_.Get(GetRequest("job", 1, {"counter"}, 5000), kT0, got.Callback());
  auto sum = store_.Add(AddRequest("job", 1, "counter", 7));
  ASSERT_TRUE(sum.ok());
  ASSERT_EQ(got.calls(), 1);
  ASSERT_TRUE(got.result().ok());
  EXPECT_THAT(*got.result(), ElementsAre("7"));
}

TEST_F(RendezvousStoreTest, TimeoutExpiresAtTickNamingMissingKeys) {
  ASSERT_TRUE(store_.Set(SetRequest("job", 1, "a", "1")).ok());
  GetResult got;
  store_.Get(GetRequest("job", 1, {"a", "b"}, 3000), kT0, got.Callback());

  store_.Tick(kT0 + absl::Milliseconds(2999));
  EXPECT_EQ(got.calls(), 0);
  // The deadline itself expires the wait.
  store_.Tick(kT0 + absl::Milliseconds(3000));
  ASSERT_EQ(got.calls(), 1);
  EXPECT_EQ(got.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(got.message(), HasSubstr("timed out after 3000 ms"));
  EXPECT_THAT(got.message(), HasSubstr("still missing 1 of 2 keys: \"b\""));
  EXPECT_THAT(got.message(), Not(HasSubstr("\"a\"")));
  EXPECT_EQ(store_.WaitingGets(), 0u);

  // The expired waiter is gone from the key index too.
  ASSERT_TRUE(store_.Set(SetRequest("job", 1, "b", "2")).ok());
  EXPECT_EQ(got.calls(), 1);
}

TEST_F(RendezvousStoreTest, TimeoutNamesFirstFiveMissingKeysAndCountsTheRest) {
  std::vector<std::string> keys;
  for (int i = 0; i < 12; ++i) keys.push_back(absl::StrCat("k", i));
  GetResult got;
  store_.Get(GetRequest("job", 1, keys, 100), kT0, got.Callback());
  store_.Tick(kT0 + absl::Seconds(1));
  ASSERT_EQ(got.calls(), 1);
  EXPECT_THAT(got.message(),
              HasSubstr("still missing 12 of 12 keys: \"k0\", \"k1\", \"k2\", "
                        "\"k3\", \"k4\" and 7 more"));
  EXPECT_THAT(got.message(), Not(HasSubstr("\"k5\"")));
}

TEST_F(RendezvousStoreTest, TickExpiresOnlyDueWaiters) {
  GetResult soon, later;
  store_.Get(GetRequest("job", 1, {"x"}, 1000), kT0, soon.Callback());
  store_.Get(GetRequest("job", 1, {"x"}, 1000), kT0 + absl::Seconds(5),
             later.Callback());
  store_.Tick(kT0 + absl::Seconds(2));
  EXPECT_EQ(soon.calls(), 1);
  EXPECT_EQ(later.calls(), 0);
  EXPECT_EQ(store_.WaitingGets(), 1u);
  ASSERT_TRUE(store_.Set(SetRequest("job", 1, "x", "v")).ok());
  ASSERT_EQ(later.calls(), 1);
  EXPECT_TRUE(later.result().ok());
}

TEST_F(RendezvousStoreTest, OpeningANewerGenerationAbortsWaitersAndDropsKeys) {
  ASSERT_TRUE(store_.Set(SetRequest("job", 1, "a", "1")).ok());
  GetResult got;
  store_.Get(GetRequest("job", 1, {"b"}, 5000), kT0, got.Callback());

  store_.OpenGeneration("job", 2);
  ASSERT_EQ(got.calls(), 1);
  EXPECT_EQ(got.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(got.message(),
              HasSubstr("moved on from generation 1 to generation 2"));
  EXPECT_EQ(store_.WaitingGets(), 0u);

  // Generation 2 does not see generation 1's keys.
  auto values = GetNow(GetRequest("job", 2, {"a"}, 0));
  EXPECT_EQ(values.status().code(), absl::StatusCode::kDeadlineExceeded);

  // Generation 1 requests are now stale.
  absl::Status stale = store_.Set(SetRequest("job", 1, "a", "1"));
  EXPECT_EQ(stale.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(stale.message(),
            "store request for job \"job\" generation 1 is stale: the job is "
            "at generation 2; re-sync with the latest membership");
}

TEST_F(RendezvousStoreTest, ReopeningTheSameGenerationKeepsKeys) {
  ASSERT_TRUE(store_.Set(SetRequest("job", 1, "a", "1")).ok());
  store_.OpenGeneration("job", 1);
  store_.OpenGeneration("job", 0);  // Late: ignored.
  auto values = GetNow(GetRequest("job", 1, {"a"}, 0));
  ASSERT_TRUE(values.ok());
  EXPECT_THAT(*values, ElementsAre("1"));
}

TEST_F(RendezvousStoreTest, AbortFailsWaitersAndLaterRequestsWithTheReason) {
  GetResult got;
  store_.Get(GetRequest("job", 1, {"b"}, 5000), kT0, got.Callback());

  store_.AbortGeneration("job", 1, absl::AbortedError("node n3 was lost"));
  ASSERT_EQ(got.calls(), 1);
  EXPECT_EQ(got.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(got.message(), HasSubstr("node n3 was lost"));
  EXPECT_THAT(got.message(), HasSubstr("generation 1"));

  absl::Status set = store_.Set(SetRequest("job", 1, "b", "x"));
  EXPECT_EQ(set.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(set.message(),
            "store request for job \"job\" generation 1: generation 1 was "
            "aborted (node n3 was lost); re-sync with the latest membership");

  GetResult after;
  store_.Get(GetRequest("job", 1, {"b"}, 5000), kT0, after.Callback());
  ASSERT_EQ(after.calls(), 1);
  EXPECT_EQ(after.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(store_.WaitingGets(), 0u);

  // A second abort keeps the first reason.
  store_.AbortGeneration("job", 1, absl::AbortedError("something else"));
  EXPECT_THAT(store_.Add(AddRequest("job", 1, "c", 1)).status().message(),
              HasSubstr("node n3 was lost"));

  // The next generation works again.
  store_.OpenGeneration("job", 2);
  EXPECT_TRUE(store_.Set(SetRequest("job", 2, "b", "x")).ok());
}

TEST_F(RendezvousStoreTest, StaleRequestAfterAbortedNewerGenerationNamesBoth) {
  store_.OpenGeneration("job", 2);
  store_.AbortGeneration("job", 2, absl::AbortedError("node n1 left"));
  absl::Status status = store_.Set(SetRequest("job", 1, "k", "v"));
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(status.message(),
            "store request for job \"job\" generation 1 is stale: the job is "
            "at generation 2, which was aborted (node n1 left); re-sync with "
            "the latest membership");
}

TEST_F(RendezvousStoreTest, AbortOfAnOlderGenerationIsIgnored) {
  store_.OpenGeneration("job", 2);
  GetResult got;
  store_.Get(GetRequest("job", 2, {"k"}, 5000), kT0, got.Callback());
  store_.AbortGeneration("job", 1, absl::AbortedError("late"));
  EXPECT_EQ(got.calls(), 0);
  EXPECT_TRUE(store_.Set(SetRequest("job", 2, "k", "v")).ok());
  EXPECT_EQ(got.calls(), 1);
}

TEST_F(RendezvousStoreTest, AbortOfANewerGenerationEndsTheOpenOne) {
  GetResult got;
  store_.Get(GetRequest("job", 1, {"k"}, 5000), kT0, got.Callback());
  store_.AbortGeneration("job", 2, absl::AbortedError("reforming"));
  ASSERT_EQ(got.calls(), 1);
  EXPECT_EQ(got.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(store_.Set(SetRequest("job", 1, "k", "v")).code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(store_.Set(SetRequest("job", 2, "k", "v")).code(),
            absl::StatusCode::kAborted);
}

TEST_F(RendezvousStoreTest, RemoveJobFailsWaitersWithWhy) {
  GetResult got;
  store_.Get(GetRequest("job", 1, {"k"}, 5000), kT0, got.Callback());
  store_.RemoveJob("job", absl::NotFoundError("job \"job\" finished"));
  ASSERT_EQ(got.calls(), 1);
  EXPECT_EQ(got.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(got.message(), "job \"job\" finished");
  EXPECT_EQ(store_.WaitingGets(), 0u);
  EXPECT_EQ(store_.Set(SetRequest("job", 1, "k", "v")).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(RendezvousStoreTest, JobsAreIsolated) {
  store_.OpenGeneration("other", 7);
  GetResult got;
  store_.Get(GetRequest("other", 7, {"k"}, 5000), kT0, got.Callback());
  ASSERT_TRUE(store_.Set(SetRequest("job", 1, "k", "mine")).ok());
  EXPECT_EQ(got.calls(), 0);
  store_.OpenGeneration("job", 2);
  store_.RemoveJob("job", absl::CancelledError("gone"));
  EXPECT_EQ(got.calls(), 0);
  EXPECT_EQ(store_.WaitingGets(), 1u);
  ASSERT_TRUE(store_.Set(SetRequest("other", 7, "k", "theirs")).ok());
  ASSERT_EQ(got.calls(), 1);
  EXPECT_THAT(*got.result(), ElementsAre("theirs"));
}

TEST_F(RendezvousStoreTest, AddStoresDecimalAsciiAndSums) {
  auto first = store_.Add(AddRequest("job", 1, "n", 5));
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(*first, 5);
  auto second = store_.Add(AddRequest("job", 1, "n", -12));
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(*second, -7);
  auto values = GetNow(GetRequest("job", 1, {"n"}, 0));
  ASSERT_TRUE(values.ok());
  EXPECT_THAT(*values, ElementsAre("-7"));

  // A value written by Set is added to when it is a decimal integer.
  ASSERT_TRUE(store_.Set(SetRequest("job", 1, "m", "40")).ok());
  auto third = store_.Add(AddRequest("job", 1, "m", 2));
  ASSERT_TRUE(third.ok());
  EXPECT_EQ(*third, 42);

  // Delta 0 on an absent key creates it as "0".
  auto zero = store_.Add(AddRequest("job", 1, "z", 0));
  ASSERT_TRUE(zero.ok());
  EXPECT_EQ(*zero, 0);
  EXPECT_THAT(*GetNow(GetRequest("job", 1, {"z"}, 0)), ElementsAre("0"));
}

TEST_F(RendezvousStoreTest, AddToNonIntegerIsFailedPrecondition) {
  for (const std::string value : {"abc", "12 ", "+3", "", "-", "1e3"}) {
    ASSERT_TRUE(store_.Set(SetRequest("job", 1, "k", value)).ok());
    auto sum = store_.Add(AddRequest("job", 1, "k", 1));
    EXPECT_EQ(sum.status().code(), absl::StatusCode::kFailedPrecondition)
        << value;
    EXPECT_THAT(sum.status().message(),
                HasSubstr(absl::StrCat("key \"k\" of job \"job\" holds \"",
                                       value, "\", not a decimal integer")));
  }
  // The failed Add left the value alone.
  EXPECT_THAT(*GetNow(GetRequest("job", 1, {"k"}, 0)), ElementsAre("1e3"));
}

TEST_F(RendezvousStoreTest, AddOverflowIsOutOfRange) {
  ASSERT_TRUE(
      store_.Set(SetRequest("job", 1, "k", "9223372036854775807")).ok());
  auto sum = store_.Add(AddRequest("job", 1, "k", 1));
  EXPECT_EQ(sum.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(sum.status().message(),
              HasSubstr("adding 1 to 9223372036854775807"));
  ASSERT_TRUE(
      store_.Set(SetRequest("job", 1, "k", "-9223372036854775808")).ok());
  EXPECT_EQ(store_.Add(AddRequest("job", 1, "k", -1)).status().code(),
            absl::StatusCode::kOutOfRange);
  // A value past int64 is not an integer Add can use.
  ASSERT_TRUE(
      store_.Set(SetRequest("job", 1, "k", "9223372036854775808")).ok());
  EXPECT_EQ(store_.Add(AddRequest("job", 1, "k", 0)).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(RendezvousStoreTest, ScopeErrorsInCheckOrder) {
  absl::Status empty_job = store_.Set(SetRequest("", 1, "", ""));
  EXPECT_EQ(empty_job.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(empty_job.message(), HasSubstr("StoreScope.job is empty"));

  absl::Status unknown = store_.Set(SetRequest("nope", 1, "", ""));
  EXPECT_EQ(unknown.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(unknown.message(),
            "job \"nope\" has no sealed generation yet: wait for the "
            "membership before using the store");

  // The generation is checked before the key.
  store_.OpenGeneration("job", 3);
  EXPECT_EQ(store_.Set(SetRequest("job", 2, "", "")).code(),
            absl::StatusCode::kAborted);
  absl::Status ahead = store_.Set(SetRequest("job", 4, "", ""));
  EXPECT_EQ(ahead.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(ahead.message(),
              HasSubstr("generation 4 is ahead of the store, which is at "
                        "generation 3"));
  EXPECT_EQ(store_.Set(SetRequest("job", 3, "", "")).code(),
            absl::StatusCode::kInvalidArgument);

  GetResult got;
  store_.Get(GetRequest("nope", 1, {"k"}, 10), kT0, got.Callback());
  ASSERT_EQ(got.calls(), 1);
  EXPECT_EQ(got.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store_.Add(AddRequest("job", 2, "k", 1)).status().code(),
            absl::StatusCode::kAborted);
}

TEST_F(RendezvousStoreTest, KeyAndValueLimits) {
  absl::Status empty_key = store_.Set(SetRequest("job", 1, "", "v"));
  EXPECT_EQ(empty_key.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(empty_key.message(),
            "StoreSetRequest.key is empty: give a key of 1..512 bytes");

  const std::string max_key(RendezvousStore::kMaxKeyBytes, 'k');
  EXPECT_TRUE(store_.Set(SetRequest("job", 1, max_key, "v")).ok());
  absl::Status long_key = store_.Set(SetRequest("job", 1, max_key + "k", "v"));
  EXPECT_EQ(long_key.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(long_key.message(), HasSubstr("StoreSetRequest.key"));
  EXPECT_THAT(long_key.message(),
              HasSubstr("is 513 bytes long; the limit is 512"));

  const std::string max_value(RendezvousStore::kMaxValueBytes, 'v');
  EXPECT_TRUE(store_.Set(SetRequest("job", 1, "big", max_value)).ok());
  absl::Status big = store_.Set(SetRequest("job", 1, "big", max_value + "v"));
  EXPECT_EQ(big.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(big.message(),
            "StoreSetRequest.value of key \"big\" is 1048577 bytes; the limit "
            "is 1048576");

  absl::Status add_key = store_.Add(AddRequest("job", 1, "", 1)).status();
  EXPECT_EQ(add_key.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(add_key.message(), HasSubstr("StoreAddRequest.key is empty"));
}

TEST_F(RendezvousStoreTest, GetRequestLimits) {
  auto no_keys = GetNow(GetRequest("job", 1, {}, 0));
  EXPECT_EQ(no_keys.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(no_keys.status().message(),
            "StoreGetRequest.keys is empty: ask for 1..1024 keys");

  std::vector<std::string> too_many(RendezvousStore::kMaxKeysPerGet + 1, "k");
  auto many = GetNow(GetRequest("job", 1, too_many, 0));
  EXPECT_EQ(many.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(many.status().message(),
            "StoreGetRequest.keys has 1025 keys; the limit is 1024");

  auto bad_key = GetNow(GetRequest("job", 1, {"a", ""}, 0));
  EXPECT_EQ(bad_key.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_key.status().message(),
              HasSubstr("StoreGetRequest.keys[1] is empty"));

  auto negative = GetNow(GetRequest("job", 1, {"a"}, -1));
  EXPECT_EQ(negative.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(negative.status().message(),
            "StoreGetRequest.wait_timeout_ms is -1; give 0..600000 (0 = do "
            "not wait)");
  auto too_long =
      GetNow(GetRequest("job", 1, {"a"}, RendezvousStore::kMaxWaitMs + 1));
  EXPECT_EQ(too_long.status().code(), absl::StatusCode::kInvalidArgument);

  // The largest wait is accepted and expires exactly at its deadline.
  GetResult longest;
  store_.Get(GetRequest("job", 1, {"a"}, RendezvousStore::kMaxWaitMs), kT0,
             longest.Callback());
  store_.Tick(kT0 + absl::Milliseconds(RendezvousStore::kMaxWaitMs - 1));
  EXPECT_EQ(longest.calls(), 0);
  store_.Tick(kT0 + absl::Milliseconds(RendezvousStore::kMaxWaitMs));
  EXPECT_EQ(longest.calls(), 1);
  EXPECT_EQ(store_.WaitingGets(), 0u);
}

TEST_F(RendezvousStoreTest, ScopeKeyCountLimitIsResourceExhausted) {
  for (size_t i = 0; i < RendezvousStore::kMaxKeysPerScope; ++i) {
    ASSERT_TRUE(store_.Set(SetRequest("job", 1, absl::StrCat(i), "")).ok());
  }
  absl::Status full = store_.Set(SetRequest("job", 1, "one-more", "v"));
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(full.message(), HasSubstr("job \"job\""));
  EXPECT_THAT(full.message(), HasSubstr("100000 keys"));
  EXPECT_EQ(store_.Add(AddRequest("job", 1, "one-more", 1)).status().code(),
            absl::StatusCode::kResourceExhausted);
  // Overwriting an existing key still works when the scope is full.
  EXPECT_TRUE(store_.Set(SetRequest("job", 1, "0", "new")).ok());
  // A new generation starts empty.
  store_.OpenGeneration("job", 2);
  EXPECT_TRUE(store_.Set(SetRequest("job", 2, "one-more", "v")).ok());
}

TEST_F(RendezvousStoreTest, ScopeByteLimitIsResourceExhausted) {
  const std::string value(RendezvousStore::kMaxValueBytes, 'v');
  const size_t fits = RendezvousStore::kMaxBytesPerScope / (value.size() + 3);
  for (size_t i = 0; i < fits; ++i) {
    ASSERT_TRUE(
        store_.Set(SetRequest("job", 1, absl::StrCat("k", 10 + i), value))
            .ok());
  }
  absl::Status full = store_.Set(SetRequest("job", 1, "last", value));
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(full.message(), HasSubstr("job \"job\""));
  EXPECT_THAT(full.message(), HasSubstr("limit of 67108864 bytes"));
  // Shrinking a value frees room for the next one.
  ASSERT_TRUE(store_.Set(SetRequest("job", 1, "k10", "small")).ok());
  EXPECT_TRUE(store_.Set(SetRequest("job", 1, "last", value)).ok());
}

// Callbacks re-entering the store. Each test declares its store after the
// state the callbacks touch, so a Get left waiting by a bug is answered by the
// store's destructor while that state is still alive.

TEST(RendezvousStoreReentryTest, CallbackMayIssueAnotherGet) {
  GetResult inner, outer_second, sibling;
  int outer_calls = 0;
  RendezvousStore store;
  store.OpenGeneration("job", 1);
  ASSERT_TRUE(store.Set(SetRequest("job", 1, "b", "beta")).ok());
  store.Get(
      GetRequest("job", 1, {"a"}, 5000), kT0,
      [&](absl::StatusOr<std::vector<std::string>> values) {
        ++outer_calls;
        ASSERT_TRUE(values.ok());
        // Resolves at once, from inside the Set that woke us.
        store.Get(GetRequest("job", 1, {"a", "b"}, 0), kT0, inner.Callback());
        // Waits for a key set later.
        store.Get(GetRequest("job", 1, {"c"}, 5000), kT0,
                  outer_second.Callback());
      });
  // A second waiter on the same key, resolved by the same Set.
  store.Get(GetRequest("job", 1, {"a"}, 5000), kT0, sibling.Callback());

  ASSERT_TRUE(store.Set(SetRequest("job", 1, "a", "alpha")).ok());
  EXPECT_EQ(outer_calls, 1);
  EXPECT_EQ(sibling.calls(), 1);
  ASSERT_EQ(inner.calls(), 1);
  EXPECT_THAT(*inner.result(), ElementsAre("alpha", "beta"));
  EXPECT_EQ(outer_second.calls(), 0);
  EXPECT_EQ(store.WaitingGets(), 1u);

  ASSERT_TRUE(store.Set(SetRequest("job", 1, "c", "gamma")).ok());
  ASSERT_EQ(outer_second.calls(), 1);
  EXPECT_THAT(*outer_second.result(), ElementsAre("gamma"));
}

TEST(RendezvousStoreReentryTest, CallbackMaySetAndWakeOthers) {
  GetResult second;
  RendezvousStore store;
  store.OpenGeneration("job", 1);
  store.Get(GetRequest("job", 1, {"a"}, 5000), kT0,
            [&](absl::StatusOr<std::vector<std::string>> values) {
              ASSERT_TRUE(values.ok());
              EXPECT_TRUE(store.Set(SetRequest("job", 1, "b", "2")).ok());
            });
  store.Get(GetRequest("job", 1, {"b"}, 5000), kT0, second.Callback());
  ASSERT_TRUE(store.Set(SetRequest("job", 1, "a", "1")).ok());
  ASSERT_EQ(second.calls(), 1);
  EXPECT_THAT(*second.result(), ElementsAre("2"));
  EXPECT_EQ(store.WaitingGets(), 0u);
}

TEST(RendezvousStoreReentryTest, CallbackMayRemoveTheJobDuringAbort) {
  int first_calls = 0;
  absl::Status first_status;
  GetResult second;
  RendezvousStore store;
  store.OpenGeneration("job", 1);
  store.Get(GetRequest("job", 1, {"a"}, 5000), kT0,
            [&](absl::StatusOr<std::vector<std::string>> values) {
              ++first_calls;
              first_status = values.status();
              store.RemoveJob("job", absl::CancelledError("removed"));
            });
  store.Get(GetRequest("job", 1, {"a"}, 5000), kT0, second.Callback());
  store.OpenGeneration("job", 2);
  EXPECT_EQ(first_calls, 1);
  EXPECT_EQ(first_status.code(), absl::StatusCode::kAborted);
  // The second waiter was already resolved by the generation change, not by
  // the RemoveJob the first callback issued.
  ASSERT_EQ(second.calls(), 1);
  EXPECT_EQ(second.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(store.WaitingGets(), 0u);
  EXPECT_EQ(store.Set(SetRequest("job", 2, "a", "1")).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(RendezvousStoreReentryTest, CallbackMayWaitAgainDuringTick) {
  int timeouts = 0;
  std::vector<absl::StatusCode> codes;
  RendezvousStore::GetCallback retry;
  RendezvousStore store;
  store.OpenGeneration("job", 1);
  retry = [&](absl::StatusOr<std::vector<std::string>> values) {
    codes.push_back(values.status().code());
    if (++timeouts < 3) {
      store.Get(GetRequest("job", 1, {"k"}, 1000), kT0, retry);
    }
  };
  store.Get(GetRequest("job", 1, {"k"}, 1000), kT0, retry);
  // A re-issued Get with an already-passed deadline waits for the next Tick.
  store.Tick(kT0 + absl::Seconds(1));
  EXPECT_EQ(timeouts, 1);
  EXPECT_EQ(store.WaitingGets(), 1u);
  store.Tick(kT0 + absl::Seconds(1));
  store.Tick(kT0 + absl::Seconds(1));
  EXPECT_EQ(timeouts, 3);
  EXPECT_THAT(codes, ElementsAre(absl::StatusCode::kDeadlineExceeded,
                                 absl::StatusCode::kDeadlineExceeded,
                                 absl::StatusCode::kDeadlineExceeded));
  EXPECT_EQ(store.WaitingGets(), 0u);
}

TEST(RendezvousStoreShutdownTest, DestructionAnswersWaitingGets) {
  GetResult got;
  {
    RendezvousStore store;
    store.OpenGeneration("job", 1);
    store.Get(GetRequest("job", 1, {"k"}, 5000), kT0, got.Callback());
  }
  ASSERT_EQ(got.calls(), 1);
  EXPECT_EQ(got.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(got.message(), HasSubstr("shutting down"));
}

}  // namespace
}  // namespace baton::coordinator
