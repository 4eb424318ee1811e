// The scheduler's pieces: the negotiation vector, the launch queue, and the
// data plane run as N nodes (threads) over real gloo and negotiation rounds
// (TcpRounds, TcpTreeRounds) on loopback.
#include "agent/scheduler/scheduler.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <future>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "agent/scheduler/launch_queue.h"
#include "agent/scheduler/negotiation.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/agent/fake_negotiation.h"
#include "tests/unit/agent/transport/gloo_cluster.h"

namespace baton::agent {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::shared_ptr<Operation> Op(uint32_t tensor_id, int32_t priority,
                              int64_t step, int64_t bytes,
                              int64_t partition_bytes = 0) {
  auto op = std::make_shared<Operation>();
  op->id = tensor_id * 1000 + static_cast<uint64_t>(step) + 1;
  op->tensor_id = tensor_id;
  op->tensor_name = "t" + std::to_string(tensor_id);
  op->priority = priority;
  op->step = step;
  op->size_bytes = bytes;
  op->partition_bytes = partition_bytes;
  return op;
}

// Queues `op` in the partitions it asks for (LaunchQueue takes the size the
// scheduler agreed; these tests give it per operation).
void AddOp(LaunchQueue& queue, std::shared_ptr<Operation> op) {
  const int64_t partition_bytes = op->partition_bytes;
  queue.Add(std::move(op), partition_bytes);
}

// The element-wise minimum of several nodes' vectors.
std::vector<int64_t> Min(const std::vector<std::vector<int64_t>>& vectors) {
  std::vector<int64_t> out = vectors[0];
  for (const auto& v : vectors) {
    for (size_t i = 0; i < out.size(); ++i) out[i] = std::min(out[i], v[i]);
  }
  return out;
}

TEST(NegotiationTest, AgreesOnTensorsReadyEverywhereWithTheSameKey) {
  absl::flat_hash_map<uint32_t, std::shared_ptr<const Operation>> a, b;
  a[0] = Op(0, 0, 5, 8);
  b[0] = Op(0, 0, 5, 8);
  a[1] = Op(1, 1, 5, 8);  // not ready on b
  a[2] = Op(2, 2, 5, 8);
  b[2] = Op(2, 2, 6, 8);  // a different step
  Negotiation::LocalState sa, sb;
  sa.ready = &a;
  sb.ready = &b;
  sa.known_tensors = 3;
  sb.known_tensors = 2;
  sa.free_credit = 100;
  sb.free_credit = 40;
  sa.in_flight_bytes = 7;
  sa.pending = 3;
  sb.pending = 2;
  std::vector<int64_t> va, vb;
  Negotiation::Encode(sa, 3, &va);
  Negotiation::Encode(sb, 3, &vb);
  const Negotiation::Outcome out = Negotiation::Decode(Min({va, vb}), 3);
  EXPECT_FALSE(out.mode_mismatch);
  EXPECT_FALSE(out.someone_leaving);
  EXPECT_EQ(out.known_tensors, 2);
  EXPECT_EQ(out.min_free_credit, 40);
  EXPECT_EQ(out.max_in_flight_bytes, 7);
  EXPECT_EQ(out.max_pending, 3);
  ASSERT_EQ(out.agreed.size(), 1u);
  EXPECT_EQ(out.agreed[0].tensor_id, 0u);
  ASSERT_EQ(out.mismatches.size(), 1u);
  EXPECT_EQ(out.mismatches[0].tensor_id, 2u);
  EXPECT_EQ(Negotiation::DescribeKey(v1::COLLECTIVE_OP_PUSH_PULL,
                                     out.mismatches[0].min_key),
            "step 5, sum");
  EXPECT_EQ(Negotiation::DescribeKey(v1::COLLECTIVE_OP_PUSH_PULL,
                                     out.mismatches[0].max_key),
            "step 6, sum");
}

// Every node proposes a partition size and a credit (its PartitionTuner's):
// every node decodes the same minima, which it applies from that round on.
TEST(NegotiationTest, ProposedPartitionAndCreditAgreeOnTheMinimum) {
  absl::flat_hash_map<uint32_t, std::shared_ptr<const Operation>> none;
  Negotiation::LocalState sa, sb;
  sa.ready = &none;
  sb.ready = &none;
  sa.partition_bytes = 1 << 20;
  sa.credit_bytes = 5 << 20;
  sb.partition_bytes = 4 << 20;
  sb.credit_bytes = 2 << 20;
  std::vector<int64_t> va, vb;
  Negotiation::Encode(sa, 0, &va);
  Negotiation::Encode(sb, 0, &vb);
  const Negotiation::Outcome out = Negotiation::Decode(Min({va, vb}), 0);
  EXPECT_EQ(out.partition_bytes, 1 << 20);
  EXPECT_EQ(out.credit_bytes, 2 << 20);
}

TEST(NegotiationTest, AverageAndRootAreDistinguishedAndDescribed) {
  auto sum = Op(0, 0, 3, 8);
  auto average = Op(0, 0, 3, 8);
  average->average = true;
  auto bcast = Op(0, 0, 3, 8);
  bcast->kind = v1::COLLECTIVE_OP_BROADCAST;
  bcast->root_rank = 9;
  EXPECT_NE(Negotiation::KeyOf(*sum), Negotiation::KeyOf(*average));
  auto max = Op(0, 0, 3, 8);
  max->reduce_op = v1::REDUCE_OP_MAX;
  EXPECT_NE(Negotiation::KeyOf(*max), Negotiation::KeyOf(*sum));
  EXPECT_NE(Negotiation::KeyOf(*max), Negotiation::KeyOf(*average));
  EXPECT_EQ(Negotiation::DescribeKey(v1::COLLECTIVE_OP_PUSH_PULL,
                                     Negotiation::KeyOf(*average)),
            "step 3, average");
  EXPECT_EQ(Negotiation::DescribeKey(v1::COLLECTIVE_OP_PUSH_PULL,
                                     Negotiation::KeyOf(*max)),
            "step 3, max");
  EXPECT_EQ(Negotiation::DescribeKey(v1::COLLECTIVE_OP_BROADCAST,
                                     Negotiation::KeyOf(*bcast)),
            "step 3, root rank 9");
  auto last = Op(0, 0, Negotiation::kMaxStep, 8);
  last->kind = v1::COLLECTIVE_OP_BROADCAST;
  last->root_rank = Negotiation::kMaxRootRank;
  EXPECT_GT(Negotiation::KeyOf(*last), 0);
}

TEST(NegotiationTest, ModeMismatchAndLeavingAreSeenByEveryone) {
  Negotiation::LocalState sa, sb;
  sb.mode = SchedulingMode::kFifo;
  sb.leaving = true;
  std::vector<int64_t> va, vb;
  Negotiation::Encode(sa, 0, &va);
  Negotiation::Encode(sb, 0, &vb);
  const Negotiation::Outcome out = Negotiation::Decode(Min({va, vb}), 0);
  EXPECT_TRUE(out.mode_mismatch);
  EXPECT_TRUE(out.someone_leaving);
}

std::vector<std::string> Order(const std::vector<PartitionTask>& tasks) {
  std::vector<std::string> out;
  for (const auto& t : tasks) {
    out.push_back(t.op->tensor_name + "/" + std::to_string(t.partition));
  }
  return out;
}

TEST(LaunchQueueTest, OrdersByPriorityThenPartitionWithinCredit) {
  LaunchQueue queue;
  AddOp(queue, Op(1, 1, 0, 40, 10));  // 4 partitions of 10
  AddOp(queue, Op(0, 0, 0, 15, 10));  // 2 partitions: 10, 5
  EXPECT_EQ(queue.size(), 6u);
  // 25 bytes of credit: t0/0 (10), t0/1 (5), t1/0 (10).
  EXPECT_THAT(Order(queue.Admit(25, false)),
              ElementsAre("t0/0", "t0/1", "t1/0"));
  // Partition 1 of t1 no longer fits in 9 bytes; nothing smaller overtakes.
  EXPECT_TRUE(queue.Admit(9, false).empty());
  // With nothing in flight anywhere one partition is always admitted.
  EXPECT_THAT(Order(queue.Admit(0, true)), ElementsAre("t1/1"));
  // An urgent tensor goes before the rest of the large one.
  AddOp(queue, Op(0, 0, 1, 4, 10));
  EXPECT_THAT(Order(queue.Admit(100, false)),
              ElementsAre("t0/0", "t1/2", "t1/3"));
  EXPECT_TRUE(queue.empty());
}

TEST(LaunchQueueTest, ClearReturnsEachQueuedOperationOnce) {
  LaunchQueue queue;
  AddOp(queue, Op(1, 1, 0, 40, 10));
  AddOp(queue, Op(2, 2, 0, 8, 10));
  EXPECT_EQ(queue.Clear().size(), 2u);
  EXPECT_TRUE(queue.empty());
}

// Each launch as "t0/0+t1/0".
std::vector<std::string> Launches(const std::vector<Launch>& launches) {
  std::vector<std::string> out;
  for (const Launch& launch : launches) {
    std::string text;
    for (const std::string& task : Order(launch)) {
      text += (text.empty() ? "" : "+") + task;
    }
    out.push_back(text);
  }
  return out;
}

TEST(FuseSmallTensorsTest, FusesRunsOfSmallWholeTensorsAlike) {
  LaunchQueue queue;
  AddOp(queue, Op(0, 0, 0, 8));
  AddOp(queue, Op(1, 1, 0, 16));
  AddOp(queue, Op(2, 2, 0, 64, 32));  // two partitions: never fused
  AddOp(queue, Op(3, 3, 0, 8));
  auto int32 = Op(4, 4, 0, 8);
  int32->dtype = v1::DATA_TYPE_INT32;  // another type: a launch of its own
  AddOp(queue, int32);
  auto averaged = Op(5, 5, 0, 8);
  averaged->average = true;  // another flag
  AddOp(queue, averaged);
  AddOp(queue, Op(6, 6, 0, 8));
  AddOp(queue, Op(7, 7, 0, 40));  // above the tensor limit
  AddOp(queue, Op(8, 8, 0, 8));
  auto broadcast = Op(9, 9, 0, 8);
  broadcast->kind = v1::COLLECTIVE_OP_BROADCAST;
  AddOp(queue, broadcast);
  AddOp(queue, Op(10, 10, 0, 8));
  AddOp(queue, Op(11, 11, 0, 8));
  AddOp(queue, Op(12, 12, 0, 8));
  auto device = Op(13, 13, 0, 8);
  device->on_device = true;
  AddOp(queue, device);
  std::vector<PartitionTask> admitted = queue.Admit(1 << 20, false);
  EXPECT_THAT(
      Launches(FuseSmallTensors(admitted, /*max_tensor_bytes=*/32,
                                /*max_launch_bytes=*/24)),
      ElementsAre("t0/0+t1/0", "t2/0", "t2/1", "t3/0", "t4/0", "t5/0", "t6/0",
                  "t7/0", "t8/0", "t9/0", "t10/0+t11/0+t12/0", "t13/0"));
  // Off: every partition alone, in the same order.
  EXPECT_EQ(FuseSmallTensors(admitted, 0, 1 << 20).size(), admitted.size());
}

// One node of a data-plane test: its data plane, buffers and trace.
struct Node {
  // Declared before the plane, which records into it.
  TimelineRecorder timeline{1000};
  std::unique_ptr<Scheduler> plane;
  std::FILE* trace = nullptr;
  std::mutex mu;
  std::map<uint64_t, absl::Status> done;
  std::condition_variable cv;
  absl::Status stopped;
  // Callbacks::round_exchanged: per round, whether this node started it.
  std::vector<bool> rounds_started;
  // Callbacks::bytes_skipped, summed.
  std::atomic<int64_t> skipped{0};

  absl::Status WaitDone(uint64_t id) {
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, std::chrono::seconds(30),
                     [&] { return done.count(id) > 0; })) {
      return absl::DeadlineExceededError("op never finished");
    }
    return done[id];
  }
  std::string Trace() {
    std::fflush(trace);
    std::rewind(trace);
    std::string text;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), trace)) > 0)
      text.append(buf, n);
    return text;
  }
};

// Where the data plane's tests run their negotiation.
enum class RoundsOn {
  kAllToAll,  // TcpRounds
  kTree,      // TcpTreeRounds of fanout 2, so that 3 nodes make a tree
  kFake,      // an in-process fake of NegotiationWire
};

// The data plane's tests run three times: the negotiation over real TCP
// (all to all and along a tree) and over the fake, with the data over TCP
// rings.
class SchedulerTest : public ::testing::TestWithParam<RoundsOn> {
 protected:
  bool fake_negotiation() const { return GetParam() == RoundsOn::kFake; }

  void Start(int nodes, SchedulerOptions base) {
    cluster_ = std::make_unique<Cluster>(nodes, DataTransport::kTcp);
    cluster_->negotiation.wire = GetParam() == RoundsOn::kTree
                                     ? NegotiationChoice::Wire::kTree
                                     : NegotiationChoice::Wire::kAllToAll;
    cluster_->negotiation.fanout = 2;
    if (fake_negotiation()) {
      auto hub = std::make_shared<FakeNegotiationHub>(nodes);
      for (int rank = 0; rank < nodes; ++rank) {
        cluster_->negotiations[rank] =
            std::make_unique<FakeNegotiation>(hub, rank);
      }
    } else {
      ASSERT_TRUE(cluster_->ConnectNegotiation());
    }
    ASSERT_TRUE(cluster_->Connect(2));
    for (int rank = 0; rank < nodes; ++rank) {
      auto node = std::make_unique<Node>();
      node->trace = std::tmpfile();
      SchedulerOptions options = base;
      options.node_rank = rank;
      options.num_nodes = nodes;
      // One trainer per node, unless the test lays out its own.
      if (base.local_sizes.empty()) options.world_size = nodes;
      options.launch_trace = node->trace;
      options.timeline = &node->timeline;
      Node* n = node.get();
      Scheduler::Callbacks callbacks;
      callbacks.op_done = [n](uint64_t id, absl::Status status) {
        std::lock_guard<std::mutex> lock(n->mu);
        n->done[id] = status;
        n->cv.notify_all();
      };
      callbacks.stopped = [n](absl::Status status) {
        std::lock_guard<std::mutex> lock(n->mu);
        n->stopped = status;
      };
      callbacks.round_exchanged = [n](absl::Duration d, bool started) {
        EXPECT_GE(d, absl::ZeroDuration());
        std::lock_guard<std::mutex> lock(n->mu);
        n->rounds_started.push_back(started);
      };
      callbacks.bytes_skipped = [n](int64_t bytes) {
        EXPECT_GT(bytes, 0);
        n->skipped += bytes;
      };
      auto& comms = cluster_->communicators[rank];
      auto negotiation = std::move(cluster_->negotiations[rank]);
      std::vector<std::unique_ptr<Communicator>> data;
      data.push_back(std::move(comms[0]));
      data.push_back(std::move(comms[1]));
      node->plane = std::make_unique<Scheduler>(options, std::move(negotiation),
                                                std::move(data), callbacks);
      nodes_.push_back(std::move(node));
    }
  }
  void TearDown() override {
    for (auto& node : nodes_) {
      node->plane.reset();
      std::fclose(node->trace);
    }
  }

  // A float32 push_pull on `node` whose input is (rank + 1) * (i + 1).
  std::shared_ptr<Operation> SumOp(int rank, uint32_t tensor, int32_t priority,
                                   int64_t step, int64_t elements,
                                   int64_t partition_bytes) {
    auto op = Op(tensor, priority, step, elements * 4, partition_bytes);
    std::unique_lock<std::mutex> lock(buffers_mu_);  // nodes run in threads
    auto& buffers = buffers_[{rank, tensor}];
    lock.unlock();
    buffers.first.resize(elements);
    buffers.second.assign(elements, -1.0f);
    for (int64_t i = 0; i < elements; ++i) {
      buffers.first[i] = static_cast<float>((rank + 1) * (i % 100 + 1));
    }
    op->inputs = {reinterpret_cast<const uint8_t*>(buffers.first.data())};
    op->output = reinterpret_cast<uint8_t*>(buffers.second.data());
    return op;
  }
  const std::vector<float>& Output(int rank, uint32_t tensor) {
    std::lock_guard<std::mutex> lock(buffers_mu_);
    return buffers_[{rank, tensor}].second;
  }

  std::unique_ptr<Cluster> cluster_;
  std::vector<std::unique_ptr<Node>> nodes_;
  std::map<std::pair<int, uint32_t>,
           std::pair<std::vector<float>, std::vector<float>>>
      buffers_;
  // Guards the map (not the buffers: each belongs to one node).
  std::mutex buffers_mu_;
};

TEST_P(SchedulerTest, RandomSubmissionOrderGivesOneLaunchOrderAndRightSums) {
  SchedulerOptions options;
  options.credit_bytes = 8192;
  Start(3, options);
  constexpr int kTensors = 12;
  for (auto& node : nodes_) node->plane->SetKnownTensors(kTensors);
  // Each node submits in its own random order, with random pauses.
  OnEveryNode(3, [&](int rank) {
    std::vector<uint32_t> order(kTensors);
    for (uint32_t t = 0; t < kTensors; ++t) order[t] = t;
    std::mt19937 rng(rank + 1);
    std::shuffle(order.begin(), order.end(), rng);
    for (uint32_t t : order) {
      nodes_[rank]->plane->Submit(
          SumOp(rank, t, static_cast<int32_t>(t), 0, 1000 + 300 * t, 1024));
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % 2000));
    }
  });
  for (int rank = 0; rank < 3; ++rank) {
    for (uint32_t t = 0; t < kTensors; ++t) {
      ASSERT_TRUE(nodes_[rank]->WaitDone(t * 1000 + 1).ok());
      const std::vector<float>& out = Output(rank, t);
      for (size_t i = 0; i < out.size(); ++i) {
        ASSERT_EQ(out[i], 6.0f * (i % 100 + 1))
            << "tensor " << t << " [" << i << "]";
      }
    }
  }
  const std::string first = nodes_[0]->Trace();
  EXPECT_THAT(first, HasSubstr("tensor=11"));
  EXPECT_EQ(nodes_[1]->Trace(), first);
  EXPECT_EQ(nodes_[2]->Trace(), first);

  // The timeline: every partition once, its phases in order, in the same
  // launch order on every node, spread over the two data channels.
  size_t partitions = 0;
  for (uint32_t t = 0; t < kTensors; ++t) {
    partitions += ((1000 + 300 * t) * 4 + 1023) / 1024;
  }
  std::vector<std::string> orders;
  for (int rank = 0; rank < 3; ++rank) {
    bool truncated = true;
    std::vector<v1::PartitionTrace> records =
        nodes_[rank]->timeline.Query(0, 0, &truncated);
    EXPECT_FALSE(truncated);
    ASSERT_EQ(records.size(), partitions) << "node " << rank;
    std::sort(records.begin(), records.end(), [](const auto& a, const auto& b) {
      return a.launch_seq() < b.launch_seq();
    });
    std::string order;
    for (const v1::PartitionTrace& r : records) {
      EXPECT_TRUE(r.ok());
      // A launch goes to the channel of its first partition's sequence
      // number (fused launches carry several): the same on every node.
      EXPECT_GE(r.channel(), 0);
      EXPECT_LT(r.channel(), 2);
      EXPECT_EQ(r.kind(), "push_pull");
      EXPECT_EQ(r.tensor(), "t" + std::to_string(r.tensor_id()));
      EXPECT_GT(r.submitted_us(), 0);
      const std::vector<int64_t> phases = {r.submitted_us(), r.agreed_us(),
                                           r.launched_us(),  r.started_us(),
                                           r.reduced_us(),   r.done_us()};
      EXPECT_TRUE(std::is_sorted(phases.begin(), phases.end()))
          << r.ShortDebugString();
      absl::StrAppend(&order, r.tensor_id(), "/", r.partition(), "@",
                      r.channel(), " ");
    }
    orders.push_back(order);
  }
  EXPECT_EQ(orders[1], orders[0]);
  EXPECT_EQ(orders[2], orders[0]);
}

// Allgather with 2, 1 and 2 trainers on the nodes (world 5): each node's
// inputs land at their global ranks' places on every node, for a whole
// tensor (gathered in the output itself) and one cut in partitions
// (gathered packed, then spread); both share the launch order.
TEST_P(SchedulerTest, AllgatherPlacesEveryRanksSliceWholeAndInPartitions) {
  SchedulerOptions options;
  options.local_sizes = {2, 1, 2};
  options.world_size = 5;
  Start(3, options);
  const int32_t offsets[] = {0, 2, 3};
  const int64_t bytes[] = {3000, 4000};    // one rank's slice, per tensor
  const int64_t partitions[] = {1024, 0};  // 3 partitions, and whole
  // Rank r's byte i: distinct for every (rank, byte) below 5 x 4000.
  auto value = [](int64_t r, int64_t i) {
    return static_cast<uint8_t>((r * 131 + i * 7) % 251);
  };
  std::vector<std::vector<std::vector<uint8_t>>> inputs(3), outputs(3);
  for (auto& node : nodes_) node->plane->SetKnownTensors(2);
  for (int node = 0; node < 3; ++node) {
    for (uint32_t t = 0; t < 2; ++t) {
      auto& in =
          inputs[node].emplace_back(bytes[t] * options.local_sizes[node]);
      for (int32_t local = 0; local < options.local_sizes[node]; ++local) {
        for (int64_t i = 0; i < bytes[t]; ++i) {
          in[local * bytes[t] + i] = value(offsets[node] + local, i);
        }
      }
      outputs[node].emplace_back(bytes[t] * 5, 0xee);
    }
  }
  OnEveryNode(3, [&](int node) {
    for (uint32_t t = 0; t < 2; ++t) {
      auto op = Op(t, static_cast<int32_t>(t), 0, bytes[t], partitions[t]);
      op->kind = v1::COLLECTIVE_OP_ALLGATHER;
      op->dtype = v1::DATA_TYPE_UINT8;
      op->rank_offset = offsets[node];
      for (int32_t local = 0; local < options.local_sizes[node]; ++local) {
        op->inputs.push_back(inputs[node][t].data() + local * bytes[t]);
      }
      op->output = outputs[node][t].data();
      nodes_[node]->plane->Submit(std::move(op));
    }
  });
  for (int node = 0; node < 3; ++node) {
    for (uint32_t t = 0; t < 2; ++t) {
      ASSERT_TRUE(nodes_[node]->WaitDone(t * 1000 + 1).ok());
      const std::vector<uint8_t>& out = outputs[node][t];
      for (int64_t r = 0; r < 5; ++r) {
        for (int64_t i = 0; i < bytes[t]; ++i) {
          ASSERT_EQ(out[r * bytes[t] + i], value(r, i))
              << "node " << node << " tensor " << t << " rank " << r << " byte "
              << i;
        }
      }
    }
  }
  const std::string first = nodes_[0]->Trace();
  EXPECT_EQ(nodes_[1]->Trace(), first);
  EXPECT_EQ(nodes_[2]->Trace(), first);
}

// Reduce-scatter with 2, 1 and 2 trainers on the nodes (world 5), averaged
// over int32 values: each local trainer gets its global rank's slice of the
// mean, whole and in partitions.
TEST_P(SchedulerTest, ReduceScatterGivesEachTrainerItsRanksSlice) {
  SchedulerOptions options;
  options.local_sizes = {2, 1, 2};
  options.world_size = 5;
  Start(3, options);
  const int32_t offsets[] = {0, 2, 3};
  const int64_t elements[] = {700, 1000};  // one rank's slice, per tensor
  const int64_t partitions[] = {1024, 0};  // 3 partitions, and whole
  // Rank r's element i of the whole tensor (5 slices).
  auto value = [](int64_t r, int64_t i) {
    return static_cast<int32_t>((r + 1) * 10 + i % 97);
  };
  std::vector<std::vector<std::vector<int32_t>>> inputs(3), outputs(3);
  for (auto& node : nodes_) node->plane->SetKnownTensors(2);
  for (int node = 0; node < 3; ++node) {
    for (uint32_t t = 0; t < 2; ++t) {
      auto& in = inputs[node].emplace_back(5 * elements[t] *
                                           options.local_sizes[node]);
      for (int32_t local = 0; local < options.local_sizes[node]; ++local) {
        for (int64_t i = 0; i < 5 * elements[t]; ++i) {
          in[local * 5 * elements[t] + i] = value(offsets[node] + local, i);
        }
      }
      outputs[node].emplace_back(elements[t] * options.local_sizes[node], -1);
    }
  }
  OnEveryNode(3, [&](int node) {
    for (uint32_t t = 0; t < 2; ++t) {
      auto op =
          Op(t, static_cast<int32_t>(t), 0, elements[t] * 4, partitions[t]);
      op->kind = v1::COLLECTIVE_OP_REDUCE_SCATTER;
      op->dtype = v1::DATA_TYPE_INT32;
      op->average = true;
      op->rank_offset = offsets[node];
      for (int32_t local = 0; local < options.local_sizes[node]; ++local) {
        op->inputs.push_back(reinterpret_cast<const uint8_t*>(
            inputs[node][t].data() + local * 5 * elements[t]));
      }
      op->output = reinterpret_cast<uint8_t*>(outputs[node][t].data());
      nodes_[node]->plane->Submit(std::move(op));
    }
  });
  for (int node = 0; node < 3; ++node) {
    for (uint32_t t = 0; t < 2; ++t) {
      ASSERT_TRUE(nodes_[node]->WaitDone(t * 1000 + 1).ok());
      for (int32_t local = 0; local < options.local_sizes[node]; ++local) {
        const int64_t rank = offsets[node] + local;
        for (int64_t i = 0; i < elements[t]; ++i) {
          const int64_t at = rank * elements[t] + i;
          int64_t sum = 0;
          for (int64_t r = 0; r < 5; ++r) sum += value(r, at);
          ASSERT_EQ(outputs[node][t][local * elements[t] + i], sum / 5)
              << "node " << node << " tensor " << t << " rank " << rank
              << " element " << i;
        }
      }
    }
  }
}

// Alltoall with 2, 1 and 2 trainers on the nodes (world 5): block d of rank
// s's input lands as block s of rank d's output, for a whole tensor (node
// 1, with one trainer, exchanges its input and output as they are; the
// others pack) and one cut in partitions.
TEST_P(SchedulerTest, AlltoallSendsEveryRanksBlockToItsRank) {
  SchedulerOptions options;
  options.local_sizes = {2, 1, 2};
  options.world_size = 5;
  Start(3, options);
  const int32_t offsets[] = {0, 2, 3};
  const int64_t bytes[] = {3000, 4000};    // one block, per tensor
  const int64_t partitions[] = {1024, 0};  // 3 partitions, and whole
  // Byte i of the block rank s sends rank d.
  auto value = [](int64_t s, int64_t d, int64_t i) {
    return static_cast<uint8_t>((s * 131 + d * 17 + i * 7) % 251);
  };
  std::vector<std::vector<std::vector<uint8_t>>> inputs(3), outputs(3);
  for (auto& node : nodes_) node->plane->SetKnownTensors(2);
  for (int node = 0; node < 3; ++node) {
    for (uint32_t t = 0; t < 2; ++t) {
      const int64_t whole = 5 * bytes[t];
      auto& in = inputs[node].emplace_back(whole * options.local_sizes[node]);
      for (int32_t local = 0; local < options.local_sizes[node]; ++local) {
        for (int64_t d = 0; d < 5; ++d) {
          for (int64_t i = 0; i < bytes[t]; ++i) {
            in[local * whole + d * bytes[t] + i] =
                value(offsets[node] + local, d, i);
          }
        }
      }
      outputs[node].emplace_back(whole * options.local_sizes[node], 0xee);
    }
  }
  OnEveryNode(3, [&](int node) {
    for (uint32_t t = 0; t < 2; ++t) {
      auto op = Op(t, static_cast<int32_t>(t), 0, bytes[t], partitions[t]);
      op->kind = v1::COLLECTIVE_OP_ALLTOALL;
      op->dtype = v1::DATA_TYPE_UINT8;
      op->rank_offset = offsets[node];
      for (int32_t local = 0; local < options.local_sizes[node]; ++local) {
        op->inputs.push_back(inputs[node][t].data() + local * 5 * bytes[t]);
      }
      op->output = outputs[node][t].data();
      nodes_[node]->plane->Submit(std::move(op));
    }
  });
  for (int node = 0; node < 3; ++node) {
    for (uint32_t t = 0; t < 2; ++t) {
      ASSERT_TRUE(nodes_[node]->WaitDone(t * 1000 + 1).ok());
      const std::vector<uint8_t>& out = outputs[node][t];
      for (int32_t local = 0; local < options.local_sizes[node]; ++local) {
        const int64_t d = offsets[node] + local;
        for (int64_t s = 0; s < 5; ++s) {
          for (int64_t i = 0; i < bytes[t]; ++i) {
            ASSERT_EQ(out[(local * 5 + s) * bytes[t] + i], value(s, d, i))
                << "node " << node << " tensor " << t << " rank " << d
                << " from rank " << s << " byte " << i;
          }
        }
      }
    }
  }
  const std::string first = nodes_[0]->Trace();
  EXPECT_EQ(nodes_[1]->Trace(), first);
  EXPECT_EQ(nodes_[2]->Trace(), first);
}

// With tuning on, the nodes change partition size and credit only together:
// however their timings differ, every node launches the same partitions in
// the same order, every sum is right, and the values in force are the same.
TEST_P(SchedulerTest, TunedPartitionsAreTheSameOnEveryNode) {
  SchedulerOptions options;
  options.partition_bytes = 64 << 10;
  options.credit_bytes = 256 << 10;
  options.tune_partition_bytes = true;
  options.tune_credit_bytes = true;
  Start(2, options);
  constexpr int kTensors = 8;
  constexpr int kSteps = 12;
  for (auto& node : nodes_) node->plane->SetKnownTensors(kTensors);
  OnEveryNode(2, [&](int rank) {
    for (int64_t step = 0; step < kSteps; ++step) {
      for (uint32_t t = 0; t < kTensors; ++t) {
        // 4 KiB to 512 KiB: the tuner sees several sizes.
        nodes_[rank]->plane->Submit(SumOp(rank, t, static_cast<int32_t>(t),
                                          step, int64_t{1024} << t,
                                          /*partition_bytes=*/0));
      }
      for (uint32_t t = 0; t < kTensors; ++t) {
        const absl::Status done = nodes_[rank]->WaitDone(t * 1000 + step + 1);
        ASSERT_TRUE(done.ok()) << "node " << rank << " tensor " << t << " step "
                               << step << ": " << done;
        const std::vector<float>& out = Output(rank, t);
        for (size_t i = 0; i < out.size(); ++i) {
          ASSERT_EQ(out[i], 3.0f * (i % 100 + 1))
              << "tensor " << t << " step " << step << " [" << i << "]";
        }
      }
    }
  });
  EXPECT_EQ(nodes_[1]->Trace(), nodes_[0]->Trace());
  const Scheduler::Stats a = nodes_[0]->plane->stats();
  const Scheduler::Stats b = nodes_[1]->plane->stats();
  EXPECT_TRUE(a.partition_tuned && a.credit_tuned);
  EXPECT_EQ(a.partition_bytes, b.partition_bytes);
  EXPECT_EQ(a.credit_bytes, b.credit_bytes);
  EXPECT_EQ(a.retunes, b.retunes);
  EXPECT_GE(a.credit_bytes, a.partition_bytes);
}

TEST(TimelineRecorderTest, KeepsTheNewestRecordsAndSaysWhenItDropped) {
  TimelineRecorder recorder(3);
  for (int64_t step = 0; step < 5; ++step) {
    v1::PartitionTrace trace;
    trace.set_step(step);
    recorder.Add(trace);
  }
  bool truncated = false;
  std::vector<v1::PartitionTrace> all = recorder.Query(0, 10, &truncated);
  EXPECT_TRUE(truncated);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].step(), 2);
  EXPECT_EQ(all[2].step(), 4);
  EXPECT_EQ(recorder.Query(2, 3, &truncated).size(), 2u);
  EXPECT_FALSE(truncated);  // steps 2..3 were never dropped
  EXPECT_TRUE(recorder.Query(1, 2, &truncated).size() == 1u && truncated);
}

// Small tensors agreed in one round fuse into launches of one collective
// each, alike on every node, and every tensor still gets its own sum.
TEST_P(SchedulerTest, SmallTensorsAgreedTogetherFuseIntoOneCollective) {
  Start(3, SchedulerOptions());
  constexpr int kTensors = 20;
  // Nothing is agreed before the plan covers the tensors: all of them are
  // submitted first, then agreed in one round.
  OnEveryNode(3, [&](int rank) {
    for (uint32_t t = 0; t < kTensors; ++t) {
      nodes_[rank]->plane->Submit(
          SumOp(rank, t, static_cast<int32_t>(t), 0, 250 + t, 0));
    }
  });
  for (auto& node : nodes_) node->plane->SetKnownTensors(kTensors);
  std::vector<std::string> launches;
  for (int rank = 0; rank < 3; ++rank) {
    for (uint32_t t = 0; t < kTensors; ++t) {
      ASSERT_TRUE(nodes_[rank]->WaitDone(t * 1000 + 1).ok());
      const std::vector<float>& out = Output(rank, t);
      for (size_t i = 0; i < out.size(); ++i) {
        ASSERT_EQ(out[i], 6.0f * static_cast<float>(i % 100 + 1))
            << "node " << rank << " tensor " << t << " index " << i;
      }
    }
    bool truncated = true;
    std::vector<v1::PartitionTrace> records =
        nodes_[rank]->timeline.Query(0, 0, &truncated);
    ASSERT_EQ(records.size(), static_cast<size_t>(kTensors));
    std::sort(records.begin(), records.end(), [](const auto& a, const auto& b) {
      return a.launch_seq() < b.launch_seq();
    });
    // A fused launch: consecutive records started together on one channel.
    std::string text;
    int64_t fused = 0;
    for (size_t i = 0; i < records.size(); ++i) {
      const bool joins =
          i > 0 && records[i].started_us() == records[i - 1].started_us() &&
          records[i].channel() == records[i - 1].channel();
      if (joins) ++fused;
      absl::StrAppend(&text, joins ? "+" : " ", records[i].tensor_id());
    }
    EXPECT_GT(fused, 0) << "node " << rank << ":" << text;
    launches.push_back(text);
  }
  EXPECT_EQ(launches[1], launches[0]);
  EXPECT_EQ(launches[2], launches[0]);
}

// A tensor that is mostly blocks of zeros (as a dense embedding's gradient):
// the rings leave them out, the sum is right, and each node reports what it
// did not send (the agent's baton_data_skipped_bytes_total).
TEST_P(SchedulerTest, BlocksOfZerosAreLeftOutAndReported) {
  Start(2, SchedulerOptions());
  constexpr int64_t kElements = 1 << 18;  // 1 MiB of float32
  constexpr int64_t kKept = 256;          // every 64th block of 1 KiB is data
  nodes_[0]->plane->SetKnownTensors(1);
  nodes_[1]->plane->SetKnownTensors(1);
  OnEveryNode(2, [&](int rank) {
    std::shared_ptr<Operation> op = SumOp(rank, 0, 0, 0, kElements, 0);
    auto* input =
        const_cast<float*>(reinterpret_cast<const float*>(op->inputs[0]));
    for (int64_t i = 0; i < kElements; ++i) {
      if (i / kKept % 64 != 0) input[i] = 0;
    }
    nodes_[rank]->plane->Submit(std::move(op));
  });
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(nodes_[rank]->WaitDone(1).ok());
    const std::vector<float>& out = Output(rank, 0);
    for (int64_t i = 0; i < kElements; ++i) {
      const float expected =
          i / kKept % 64 != 0 ? 0.0f : 3.0f * static_cast<float>(i % 100 + 1);
      ASSERT_EQ(out[i], expected) << "node " << rank << " index " << i;
    }
    // Each node sends half of the 1 MiB twice (reduce-scatter, allgather);
    // 63 of every 64 blocks stay home.
    EXPECT_GT(nodes_[rank]->skipped.load(), kElements * 4 / 2)
        << "node " << rank;
  }
}

// Every node reports each round it ran (the agent's
// baton_negotiation_round_seconds), and only rounds that a node with news
// started exist: nobody polls.
TEST_P(SchedulerTest, EveryRoundIsReportedAndWasStartedBySomeNode) {
  Start(2, SchedulerOptions());
  constexpr int kTensors = 6;
  for (auto& node : nodes_) node->plane->SetKnownTensors(kTensors);
  OnEveryNode(2, [&](int rank) {
    for (uint32_t t = 0; t < kTensors; ++t) {
      nodes_[rank]->plane->Submit(
          SumOp(rank, t, static_cast<int32_t>(t), 0, 64, 0));
      std::this_thread::sleep_for(std::chrono::microseconds(300 * rank));
    }
  });
  for (int rank = 0; rank < 2; ++rank) {
    for (uint32_t t = 0; t < kTensors; ++t) {
      ASSERT_TRUE(nodes_[rank]->WaitDone(t * 1000 + 1).ok());
    }
  }
  std::vector<std::vector<bool>> started(2);
  for (int rank = 0; rank < 2; ++rank) {
    // The round that agreed the last tensor was reported before its
    // operation completed, and nothing asks for a round after it.
    const int64_t rounds = nodes_[rank]->plane->stats().rounds;
    std::lock_guard<std::mutex> lock(nodes_[rank]->mu);
    started[rank] = nodes_[rank]->rounds_started;
    EXPECT_EQ(static_cast<int64_t>(started[rank].size()), rounds)
        << "node " << rank;
  }
  ASSERT_EQ(started[0].size(), started[1].size());
  ASSERT_FALSE(started[0].empty());
  for (size_t i = 0; i < started[0].size(); ++i) {
    EXPECT_TRUE(started[0][i] || started[1][i]) << "round " << i;
  }
}

TEST_P(SchedulerTest, MismatchedStepsFailOnEveryNodeAndOthersGoOn) {
  Start(2, SchedulerOptions());
  for (auto& node : nodes_) node->plane->SetKnownTensors(2);
  nodes_[0]->plane->Submit(SumOp(0, 0, 0, 4, 16, 0));
  nodes_[1]->plane->Submit(SumOp(1, 0, 0, 5, 16, 0));
  nodes_[0]->plane->Submit(SumOp(0, 1, 1, 0, 16, 0));
  nodes_[1]->plane->Submit(SumOp(1, 1, 1, 0, 16, 0));
  absl::Status a = nodes_[0]->WaitDone(0 * 1000 + 5);
  absl::Status b = nodes_[1]->WaitDone(0 * 1000 + 6);
  EXPECT_EQ(a.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(a.message(), HasSubstr("step 4, sum on some, step 5, sum"));
  EXPECT_EQ(b.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(nodes_[0]->WaitDone(1000 + 1).ok());
  EXPECT_TRUE(nodes_[1]->WaitDone(1000 + 1).ok());
}

// Nobody polls: idle nodes run no rounds at all, and a node whose operation
// arrives last starts the round that agrees it (the others wait for it).
TEST_P(SchedulerTest, IdleNodesRunNoRoundsAndTheLastSubmitterStartsOne) {
  Start(3, SchedulerOptions());
  for (auto& node : nodes_) node->plane->SetKnownTensors(1);
  const auto rounds = [&](int rank) {
    return nodes_[rank]->plane->stats().rounds;
  };
  // The plan's news settles in a few rounds, the same ones on every node:
  // wait until every node has counted the same ones and a node with news
  // left would have started its round (bounded).
  const auto same = [&] {
    return rounds(0) > 0 && rounds(1) == rounds(0) && rounds(2) == rounds(0);
  };
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  int64_t seen = -1;
  while (absl::Now() < deadline && !(same() && rounds(0) == seen)) {
    seen = same() ? rounds(0) : -1;
    absl::SleepFor(absl::Milliseconds(50));
  }
  const int64_t settled = rounds(0);
  EXPECT_GE(settled, 1);
  // Nothing new happens: no node may start a round.
  absl::SleepFor(absl::Milliseconds(300));
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(rounds(rank), settled) << "node " << rank << " polled";
  }

  nodes_[0]->plane->Submit(SumOp(0, 0, 0, 0, 16, 0));
  nodes_[1]->plane->Submit(SumOp(1, 0, 0, 0, 16, 0));
  absl::SleepFor(absl::Milliseconds(100));
  nodes_[2]->plane->Submit(SumOp(2, 0, 0, 0, 16, 0));
  for (int rank = 0; rank < 3; ++rank) {
    ASSERT_TRUE(nodes_[rank]->WaitDone(1).ok()) << "node " << rank;
    EXPECT_EQ(Output(rank, 0)[1], 12.0f) << "(1 + 2 + 3) x 2";
  }
  // One round per submitting node at most (two may share one).
  absl::SleepFor(absl::Milliseconds(100));
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_LE(rounds(rank) - settled, 3) << "node " << rank;
    EXPECT_EQ(rounds(rank), rounds(0)) << "node " << rank;
  }
}

TEST_P(SchedulerTest, AbortFailsWhatIsPendingWithTheGivenStatus) {
  Start(2, SchedulerOptions());
  for (auto& node : nodes_) node->plane->SetKnownTensors(1);
  // Only node 0 submits: the operation can never be agreed.
  nodes_[0]->plane->Submit(SumOp(0, 0, 0, 0, 16, 0));
  nodes_[0]->plane->Abort(absl::AbortedError("node n2 was lost"));
  absl::Status status = nodes_[0]->WaitDone(1);
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(status.message(), HasSubstr("n2 was lost"));
  // Submitting after the abort fails at once with the same status.
  nodes_[0]->plane->Submit(SumOp(0, 0, 0, 1, 16, 0));
  EXPECT_EQ(nodes_[0]->WaitDone(2).code(), absl::StatusCode::kAborted);
}

TEST_P(SchedulerTest, ALeavingNodeStopsEveryNodeAfterTheSameRound) {
  Start(2, SchedulerOptions());
  for (auto& node : nodes_) node->plane->SetKnownTensors(1);
  nodes_[1]->plane->Submit(SumOp(1, 0, 0, 0, 16, 0));
  nodes_[0]->plane->Leave();
  absl::Status status = nodes_[1]->WaitDone(1);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("a node left"));
  for (auto& node : nodes_) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (!node->plane->finished() && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    EXPECT_TRUE(node->plane->finished());
  }
}

INSTANTIATE_TEST_SUITE_P(Negotiation, SchedulerTest,
                         ::testing::Values(RoundsOn::kAllToAll, RoundsOn::kTree,
                                           RoundsOn::kFake),
                         [](const ::testing::TestParamInfo<RoundsOn>& info) {
                           switch (info.param) {
                             case RoundsOn::kAllToAll:
                               return "Tcp";
                             case RoundsOn::kTree:
                               return "TcpTree";
                             case RoundsOn::kFake:
                               return "Fake";
                           }
                           return "Unknown";
                         });

}  // namespace
}  // namespace baton::agent
