#include "agent/bench/negotiation_workload.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace baton::agent::sim {
namespace {

// As Scheduler's kFuseTensorBytes and kFuseLaunchBytes (private there).
constexpr int64_t kFuseTensorBytes = 256 << 10;
constexpr int64_t kFuseLaunchBytes = 1 << 20;

uint64_t Mix(uint64_t h, uint64_t v) {
  // splitmix64 of the running hash and the next value.
  uint64_t z = h ^ (v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

double MedianUs(std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

template <typename F>
double TimeUs(const F& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace

std::vector<std::pair<std::string, int64_t>> ResNet50Parameters() {
  std::vector<std::pair<std::string, int64_t>> out;
  const auto conv = [&](const std::string& name, int64_t out_ch, int64_t in_ch,
                        int64_t k) {
    out.emplace_back(name + ".weight", 4 * out_ch * in_ch * k * k);
  };
  const auto bn = [&](const std::string& name, int64_t ch) {
    out.emplace_back(name + ".weight", 4 * ch);
    out.emplace_back(name + ".bias", 4 * ch);
  };
  conv("conv1", 64, 3, 7);
  bn("bn1", 64);
  const int64_t widths[] = {64, 128, 256, 512};
  const int blocks[] = {3, 4, 6, 3};
  int64_t in_ch = 64;
  for (int layer = 0; layer < 4; ++layer) {
    const int64_t w = widths[layer];
    for (int b = 0; b < blocks[layer]; ++b) {
      const std::string block = absl::StrCat("layer", layer + 1, ".", b);
      conv(block + ".conv1", w, in_ch, 1);
      bn(block + ".bn1", w);
      conv(block + ".conv2", w, w, 3);
      bn(block + ".bn2", w);
      conv(block + ".conv3", 4 * w, w, 1);
      bn(block + ".bn3", 4 * w);
      if (b == 0) {
        conv(block + ".downsample.0", 4 * w, in_ch, 1);
        bn(block + ".downsample.1", 4 * w);
      }
      in_ch = 4 * w;
    }
  }
  out.emplace_back("fc.weight", 4 * 1000 * 2048);
  out.emplace_back("fc.bias", 4 * 1000);
  return out;
}

NegotiationWorkload::NegotiationWorkload(int nodes, WorkloadOptions options)
    : options_(options), nodes_(nodes) {
  CHECK_GT(options_.tensors, 0);
  CHECK_GT(options_.ready_per_round, 0);
  const auto resnet = ResNet50Parameters();
  for (int32_t i = 0; i < options_.tensors; ++i) {
    const auto& [name, bytes] = resnet[i % resnet.size()];
    plan_.push_back({i < static_cast<int32_t>(resnet.size())
                         ? name
                         : absl::StrCat(name, "#", i / resnet.size()),
                     bytes});
  }
  for (int n = 0; n < nodes; ++n) {
    // The nodes propose different sizes: the round agrees on the minima.
    nodes_[n].partition_bytes = (int64_t{4} + n % 3) << 20;
    nodes_[n].credit_bytes = (int64_t{16} + n % 5) << 20;
  }
}

size_t NegotiationWorkload::vector_size() const {
  return Negotiation::VectorSize(options_.tensors);
}

std::shared_ptr<const Operation> NegotiationWorkload::OperationOf(
    uint32_t tensor, int64_t step) {
  std::shared_ptr<const Operation>& slot = operations_[{tensor, step}];
  if (slot == nullptr) {
    auto op = std::make_shared<Operation>();
    op->id = next_op_id_++;
    op->tensor_id = tensor;
    op->tensor_name = plan_[tensor].name;
    op->priority = static_cast<int32_t>(tensor);
    op->step = step;
    op->kind = v1::COLLECTIVE_OP_PUSH_PULL;
    op->dtype = v1::DATA_TYPE_FLOAT32;
    op->average = true;
    op->size_bytes = plan_[tensor].bytes;
    // Microseconds since the epoch, later for later tensors of a step.
    op->ready_unix_us = 1'700'000'000'000'000 + step * 1'000'000 +
                        (options_.tensors - tensor) * 100;
    slot = std::move(op);
  }
  return slot;
}

bool NegotiationWorkload::Straggles(int node, uint32_t tensor,
                                    int64_t step) const {
  if (options_.straggle_one_in <= 0) return false;
  const uint64_t h = Mix(Mix(Mix(0, node), tensor), step);
  return h % static_cast<uint64_t>(options_.straggle_one_in) == 0;
}

void NegotiationWorkload::SubmitReady(int node, int64_t round) {
  NodeState& state = nodes_[node];
  CHECK_EQ(round, state.next_round) << "node " << node << " skipped a round";
  ++state.next_round;
  // This round's slice of the backward order, step after step.
  const int64_t per_round = options_.ready_per_round;
  const int64_t tensors = options_.tensors;
  for (int64_t p = round * per_round; p < (round + 1) * per_round; ++p) {
    const int64_t step = p / tensors;
    const auto tensor = static_cast<uint32_t>(tensors - 1 - p % tensors);
    state.late.emplace_back(tensor, Straggles(node, tensor, step)
                                        ? -(step + 1)  // a round late
                                        : step);
  }
  // A tensor's next step waits until its previous one launched (a trainer
  // computes step s + 1 from step s's result); a straggler's tensor waits
  // one round (its step is stored negated until then).
  std::vector<std::pair<uint32_t, int64_t>> still_late;
  absl::flat_hash_map<uint32_t, bool> blocked;
  for (auto& [tensor, step] : state.late) {
    if (step < 0) {
      still_late.emplace_back(tensor, -step - 1);
      blocked[tensor] = true;
      continue;
    }
    if (blocked.contains(tensor) || state.ready.contains(tensor) ||
        state.queued.contains(tensor)) {
      still_late.emplace_back(tensor, step);
      blocked[tensor] = true;
      continue;
    }
    state.ready[tensor] = OperationOf(tensor, step);
  }
  state.late = std::move(still_late);
}

void NegotiationWorkload::Encode(int node, int64_t round,
                                 std::vector<int64_t>* vec) {
  SubmitReady(node, round);
  NodeState& state = nodes_[node];
  Negotiation::LocalState local;
  local.mode = SchedulingMode::kPriority;
  local.known_tensors = options_.tensors;
  local.free_credit = state.credit_bytes;  // launches complete at once
  local.in_flight_bytes = 0;
  local.pending = static_cast<int64_t>(state.ready.size());
  local.partition_bytes = state.partition_bytes;
  local.credit_bytes = state.credit_bytes;
  local.ready = &state.ready;
  Negotiation::Encode(local, options_.tensors, vec);
}

void NegotiationWorkload::Combine(const std::vector<int64_t>& in,
                                  std::vector<int64_t>* out) {
  DCHECK_EQ(in.size(), out->size());
  int64_t* o = out->data();
  const int64_t* i = in.data();
  for (size_t k = 0, n = out->size(); k < n; ++k) o[k] = std::min(o[k], i[k]);
}

uint64_t NegotiationWorkload::HashOutcome(const Negotiation::Outcome& out) {
  uint64_t h = 0;
  for (int64_t v : {int64_t{out.mode_mismatch}, int64_t{out.someone_leaving},
                    int64_t{out.known_tensors}, out.min_free_credit,
                    out.max_in_flight_bytes, out.max_pending,
                    out.partition_bytes, out.credit_bytes}) {
    h = Mix(h, static_cast<uint64_t>(v));
  }
  for (const auto& a : out.agreed) {
    h = Mix(Mix(h, a.tensor_id), static_cast<uint64_t>(a.ready_unix_us));
  }
  for (const auto& m : out.mismatches) {
    h = Mix(Mix(Mix(h, m.tensor_id), static_cast<uint64_t>(m.min_key)),
            static_cast<uint64_t>(m.max_key));
  }
  return h;
}

void NegotiationWorkload::Decode(int node, int64_t round,
                                 const std::vector<int64_t>& vec) {
  const Negotiation::Outcome outcome =
      Negotiation::Decode(vec, options_.tensors);
  RoundRecord& record = rounds_[round];
  const uint64_t hash = HashOutcome(outcome);
  if (record.decoded == 0) {
    record.outcome_hash = hash;
  } else if (record.outcome_hash != hash) {
    ++outcome_mismatches_;
  }
  if (++record.decoded == static_cast<int>(nodes_.size())) rounds_.erase(round);

  // Scheduler::Round, priority mode.
  NodeState& state = nodes_[node];
  std::vector<std::shared_ptr<const Operation>> agreed;
  for (const Negotiation::Agreed& a : outcome.agreed) {
    auto it = state.ready.find(a.tensor_id);
    if (it == state.ready.end()) continue;
    agreed.push_back(it->second);
    state.ready.erase(it);
  }
  if (node == 0) agreed_ += static_cast<int64_t>(agreed.size());
  state.partition_bytes = outcome.partition_bytes;
  state.credit_bytes = outcome.credit_bytes;
  for (auto& op : agreed) {
    const uint32_t tensor = op->tensor_id;
    state.queued[tensor] +=
        state.queue.Add(std::move(op), state.partition_bytes);
  }
  std::vector<PartitionTask> admitted = state.queue.Admit(
      outcome.min_free_credit, outcome.max_in_flight_bytes == 0);
  const int64_t fuse = nodes_.size() > 1 ? kFuseTensorBytes : 0;
  for (const Launch& launch :
       FuseSmallTensors(std::move(admitted), fuse, kFuseLaunchBytes)) {
    state.launch_hash = Mix(state.launch_hash, launch.size());
    ++state.launches;
    for (const PartitionTask& task : launch) {
      for (int64_t v : {static_cast<int64_t>(state.launch_seq++),
                        int64_t{task.op->tensor_id}, task.op->step,
                        int64_t{task.partition}, task.offset, task.length}) {
        state.launch_hash = Mix(state.launch_hash, static_cast<uint64_t>(v));
      }
      auto it = state.queued.find(task.op->tensor_id);
      if (--it->second == 0) state.queued.erase(it);
    }
  }
}

int64_t NegotiationWorkload::launch_mismatches() const {
  int64_t differ = 0;
  for (const NodeState& state : nodes_) {
    if (state.launch_hash != nodes_[0].launch_hash ||
        state.launches != nodes_[0].launches) {
      ++differ;
    }
  }
  return differ;
}

RoundCosts NegotiationWorkload::Calibrate(const WorkloadOptions& options,
                                          int repeats) {
  CHECK_GT(repeats, 0);
  WorkloadOptions full = options;
  full.ready_per_round = options.tensors;
  full.straggle_one_in = 0;
  NegotiationWorkload workload(2, full);
  std::vector<int64_t> vec;
  workload.Encode(0, 0, &vec);
  NodeState& state = workload.nodes_[0];
  Negotiation::LocalState local;
  local.mode = SchedulingMode::kPriority;
  local.known_tensors = full.tensors;
  local.free_credit = state.credit_bytes;
  local.pending = static_cast<int64_t>(state.ready.size());
  local.partition_bytes = state.partition_bytes;
  local.credit_bytes = state.credit_bytes;
  local.ready = &state.ready;
  std::vector<std::shared_ptr<const Operation>> ops;
  for (const auto& [tensor, op] : state.ready) ops.push_back(op);
  std::sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) {
    return a->tensor_id < b->tensor_id;
  });

  std::vector<double> encode, combine, decode, plan;
  std::vector<int64_t> other = vec;
  int64_t sink = 0;
  for (int r = 0; r < repeats; ++r) {
    encode.push_back(
        TimeUs([&] { Negotiation::Encode(local, full.tensors, &vec); }));
    combine.push_back(TimeUs([&] { Combine(other, &vec); }));
    decode.push_back(TimeUs([&] {
      sink += static_cast<int64_t>(
          Negotiation::Decode(vec, full.tensors).agreed.size());
    }));
    plan.push_back(TimeUs([&] {
      LaunchQueue queue;
      for (const auto& op : ops) queue.Add(op, state.partition_bytes);
      sink += static_cast<int64_t>(
          FuseSmallTensors(queue.Admit(state.credit_bytes, true),
                           kFuseTensorBytes, kFuseLaunchBytes)
              .size());
    }));
  }
  CHECK_GT(sink, 0);
  return RoundCosts{MedianUs(encode), MedianUs(combine), MedianUs(decode),
                    MedianUs(plan)};
}

}  // namespace baton::agent::sim
