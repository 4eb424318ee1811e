#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace baton {

// The fast path for a trainer's per-step traffic (ARCHITECTURE.md, "Two
// planes"): enqueues and completions travel through single-producer /
// single-consumer rings in shared memory, with futex doorbells, instead of
// gRPC messages. Attach, declarations, failures (they carry text) and
// everything else stay on the gRPC stream.
//
// Two shared-memory objects per job on a node:
// - the job's Doorbell: one word every producer (trainers, the agent's own
//   threads) bumps after publishing work for the job's thread;
// - per trainer, a TrainerChannel: the request ring (trainer -> agent) and
//   the completion ring with its own doorbell (agent -> trainer).
// The layout is the protocol: both sides are built from this header.

// One ring slot. Requests: index, step, flags (kAverage), root. Completions:
// index, step, generation.
struct ChannelEntry {
  int32_t index;
  int32_t flags;
  int64_t step;
  int64_t value;  // requests: root rank; completions: generation
  // Requests: the fenced generation (EnqueueRequest.generation), 0 for
  // none; completions: unused.
  int64_t generation;
};
static_assert(sizeof(ChannelEntry) == 32);

// Request flags: bit 0 the average flag, bits 4..7 the push-pull's reduce op
// (v1::ReduceOp; 0 is a sum).
inline constexpr int32_t kChannelAverage = 1;
inline constexpr int32_t kChannelReduceOpShift = 4;
inline constexpr int32_t kChannelReduceOpMask = 0xf << kChannelReduceOpShift;

// Wakes a waiter blocked in Wait. Process-shared.
struct Doorbell {
  alignas(64) std::atomic<uint32_t> bell{0};

  // Publishes "something changed" and wakes every waiter.
  void Ring();
  // Returns the current value; pass it to Wait to sleep until it changes.
  uint32_t Snapshot() const { return bell.load(std::memory_order_acquire); }
  // Sleeps until the bell differs from `seen` or `timeout` passes.
  void Wait(uint32_t seen, std::chrono::microseconds timeout) const;
};

class ChannelRing {
 public:
  static constexpr uint64_t kCapacity = 1024;

  // Producer side: false when full.
  bool Push(const ChannelEntry& entry);
  // Consumer side: false when empty, and when Corrupt() (then nothing is
  // popped: the slots past the capacity were never published).
  bool Pop(ChannelEntry* entry);
  // The entries pushed and not popped: tail - head. Both live in memory the
  // other process maps read-write, so this is what that process wrote, not
  // necessarily at most kCapacity.
  uint64_t Size() const {
    return tail_.load(std::memory_order_acquire) -
           head_.load(std::memory_order_acquire);
  }
  // Size() > kCapacity: no producer that follows the protocol makes this
  // (Push refuses past kCapacity); the other process wrote head or tail.
  bool Corrupt() const { return Size() > kCapacity; }
  bool Empty() const {
    return head_.load(std::memory_order_acquire) ==
           tail_.load(std::memory_order_acquire);
  }

 private:
  alignas(64) std::atomic<uint64_t> head_{0};  // next to pop
  alignas(64) std::atomic<uint64_t> tail_{0};  // next to push
  alignas(64) ChannelEntry entries_[kCapacity];
};

struct TrainerChannel {
  ChannelRing requests;
  ChannelRing completions;
  Doorbell completion_bell;
};

static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

}  // namespace baton
