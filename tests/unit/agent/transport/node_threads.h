#pragma once

#include <chrono>
#include <functional>
#include <thread>
#include <vector>

// Transport tests run N nodes as N threads of one process.

namespace baton::agent {

// Runs fn(rank) on `nodes` threads and joins them.
inline void OnEveryNode(int nodes, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int rank = 0; rank < nodes; ++rank) threads.emplace_back(fn, rank);
  for (std::thread& thread : threads) thread.join();
}

// Real time since `start`, for bounds on how long a failure takes.
inline std::chrono::milliseconds Since(
    std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - start);
}

}  // namespace baton::agent
