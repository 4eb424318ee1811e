#include "common/shm_channel.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
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
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::microseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return;
    const timespec ts{static_cast<time_t>(left.count() / 1000000),
                      static_cast<long>(left.count() % 1000000) * 1000};
    // Returns at once (EAGAIN) when the bell already moved on. A signal
    // handled by this thread ends the wait early (EINTR) with the bell
    // unchanged: sleep again for the time left.
    if (Futex(&bell, FUTEX_WAIT, seen, &ts) == 0 || errno != EINTR) return;
    if (bell.load(std::memory_order_acquire) != seen) return;
  }
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
  const uint64_t tail = tail_.load(std::memory_order_acquire);
  // tail - head > kCapacity: a corrupt ring (Corrupt()), nothing to take.
  if (head == tail || tail - head > kCapacity) return false;
  *entry = entries_[head % kCapacity];
  head_.store(head + 1, std::memory_order_release);
  return true;
}

}  // namespace baton
