#include "common/shm_channel.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <climits>

namespace baton {
namespace {

// Shared (not FUTEX_PRIVATE) futexes: the word lives in memory mapped by
// several processes.
long Futex(const std::atomic<uint32_t>* word, int op, uint32_t value,
           const timespec* timeout) {
  return syscall(SYS_futex, reinterpret_cast<const uint32_t*>(word), op, value,
                 timeout, nullptr, 0);
}

}  // namespace

void Doorbell::Ring() {
  bell.fetch_add(1, std::memory_order_acq_rel);
  Futex(&bell, FUTEX_WAKE, INT_MAX, nullptr);
}

void Doorbell::Wait(uint32_t seen, std::chrono::microseconds timeout) const {
  if (timeout.count() <= 0) return;
  const timespec ts{static_cast<time_t>(timeout.count() / 1000000),
                    static_cast<long>(timeout.count() % 1000000) * 1000};
  // Returns at once (EAGAIN) when the bell already moved on.
  Futex(&bell, FUTEX_WAIT, seen, &ts);
}

bool ChannelRing::Push(const ChannelEntry& entry) {
  const uint64_t tail = tail_.load(std::memory_order_relaxed);
  if (tail - head_.load(std::memory_order_acquire) >= kCapacity) return false;
  entries_[tail % kCapacity] = entry;
  tail_.store(tail + 1, std::memory_order_release);
  return true;
}

bool ChannelRing::Pop(ChannelEntry* entry) {
  const uint64_t head = head_.load(std::memory_order_relaxed);
  if (head == tail_.load(std::memory_order_acquire)) return false;
  *entry = entries_[head % kCapacity];
  head_.store(head + 1, std::memory_order_release);
  return true;
}

}  // namespace baton
