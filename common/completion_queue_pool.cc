#include "common/completion_queue_pool.h"

#include <glog/logging.h>

#include <utility>

#include "common/thread_name.h"

namespace baton {

std::unique_ptr<CompletionQueuePool> CompletionQueuePool::ForServer(
    grpc::ServerBuilder& builder, size_t queues) {
  CHECK_GT(queues, 0u) << "a completion queue pool needs a queue";
  std::unique_ptr<CompletionQueuePool> pool(new CompletionQueuePool());
  pool->server_ = true;
  for (size_t i = 0; i < queues; ++i) {
    pool->queues_.push_back(builder.AddCompletionQueue());
  }
  return pool;
}

CompletionQueuePool::CompletionQueuePool(size_t queues) {
  CHECK_GT(queues, 0u) << "a completion queue pool needs a queue";
  for (size_t i = 0; i < queues; ++i) {
    queues_.push_back(std::make_unique<grpc::CompletionQueue>());
  }
}

CompletionQueuePool::~CompletionQueuePool() { Shutdown(); }

grpc::ServerCompletionQueue* CompletionQueuePool::server_queue(size_t i) const {
  CHECK(server_) << "server_queue of a client completion queue pool";
  return static_cast<grpc::ServerCompletionQueue*>(queues_[i].get());
}

void CompletionQueuePool::Start(const std::string& thread_name) {
  CHECK(threads_.empty() && !shut_down_)
      << "CompletionQueuePool::Start called twice or after Shutdown";
  for (const std::unique_ptr<grpc::CompletionQueue>& queue : queues_) {
    threads_.emplace_back([cq = queue.get(), thread_name] {
      SetThreadName(thread_name);
      void* tag = nullptr;
      bool ok = false;
      // Next returns false once the queue is shut down and drained.
      while (cq->Next(&tag, &ok))
        static_cast<CompletionTag*>(tag)->Complete(ok);
    });
  }
}

void CompletionQueuePool::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  for (const std::unique_ptr<grpc::CompletionQueue>& queue : queues_) {
    queue->Shutdown();
  }
  if (threads_.empty()) {
    // Never started: drain here, as gRPC requires before destruction.
    for (const std::unique_ptr<grpc::CompletionQueue>& queue : queues_) {
      void* tag = nullptr;
      bool ok = false;
      while (queue->Next(&tag, &ok)) {
        static_cast<CompletionTag*>(tag)->Complete(ok);
      }
    }
    return;
  }
  for (std::thread& thread : threads_) thread.join();
}

}  // namespace baton
