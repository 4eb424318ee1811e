// Tells ThreadSanitizer about synchronization that happens inside Debian's
// uninstrumented abseil and gRPC, for tools/dev/sanitize tsan (which builds
// this library and loads it with LD_PRELOAD). Without it TSan sees none of
// it, and reports a race for every access those libraries order.
//
// absl::Mutex and absl::CondVar synchronize with atomics and futexes inside
// libabsl_synchronization. This library interposes their entry points,
// describes each with the __tsan_mutex_* annotations (the ones abseil makes
// itself when it is built with TSan) and calls the real function. gRPC's own
// calls go through the PLT and are interposed too, so its locks count.
// The *WithTimeout variants are not interposed: abseil 20220623 implements
// each by calling its *WithDeadline twin through the PLT, which is.
// A wait (Await, CondVar::Wait) is modelled as a writer's unlock and relock:
// waiting while holding only a reader lock is not supported (neither baton
// nor gRPC does it).
//
// gRPC hands a batch of operations to its core with grpc_call_start_batch
// (or a server's request for a new call) and a tag, and gives them back when
// a completion queue returns an event with that tag; the callback API runs
// reactions from threads that poll such a queue. In between, the core
// synchronizes with atomics TSan cannot see, so the inline C++ halves of an
// operation (grpcpp's CallOpSet, CallbackWithSuccessTag) would race with
// each other. Here, starting a batch releases its tag and the completion
// acquires it: the happens-before edge gRPC guarantees.
//
// A server reactor's OnDone runs after the last of its callbacks, counted
// down with an atomic (ServerCallbackCall::callbacks_outstanding_). The
// reactions' decrements are inline and instrumented, but libgrpc++ makes
// some itself (after OnCancel), and the one that reaches zero hands OnDone
// to another thread through ScheduleOnDone. Here, ScheduleOnDone acquires
// the counter, as the last decrement really did. Not covered: what an
// OnCancel reaction does without a lock before libgrpc++'s decrement (ours
// takes the stream's lock, which orders it anyway).
//
// The __tsan_* functions are weak: outside a TSan process (ctest itself,
// when LD_PRELOAD is set for the whole run) they are null, and nothing here
// is called anyway, since such a process uses neither abseil nor gRPC.

#include <dlfcn.h>
#include <grpc/grpc.h>
#include <grpcpp/support/server_callback.h>
#include <sanitizer/tsan_interface.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/base/options.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

#pragma weak __tsan_acquire
#pragma weak __tsan_release
#pragma weak __tsan_mutex_destroy
#pragma weak __tsan_mutex_pre_lock
#pragma weak __tsan_mutex_post_lock
#pragma weak __tsan_mutex_pre_unlock
#pragma weak __tsan_mutex_post_unlock

static_assert(ABSL_OPTION_USE_INLINE_NAMESPACE == 1,
              "the mangled names below assume abseil's inline namespace");

#define BATON_STRINGIFY_INNER(x) #x
#define BATON_STRINGIFY(x) BATON_STRINGIFY_INNER(x)

namespace {

// The next definition of the function called `name`: the real one.
template <typename Fn>
Fn Real(const std::string& name) {
  void* real = dlsym(RTLD_NEXT, name.c_str());
  if (real == nullptr) {
    std::fprintf(stderr, "tsan_sync_annotations: %s not found: %s\n",
                 name.c_str(), dlerror());
    std::abort();
  }
  return reinterpret_cast<Fn>(real);
}

// The real abseil function whose mangled name is "_ZN4absl<ns>" + `rest`,
// where <ns> is abseil's inline namespace as it is mangled ("7debian3").
template <typename Fn>
Fn RealAbsl(const char* rest) {
  const char* ns = BATON_STRINGIFY(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  return Real<Fn>("_ZN4absl" + std::to_string(std::strlen(ns)) + ns + rest);
}

void BeforeLock(void* mu, unsigned flags) { __tsan_mutex_pre_lock(mu, flags); }
void AfterLock(void* mu, unsigned flags) {
  __tsan_mutex_post_lock(mu, flags, 0);
}
void BeforeUnlock(void* mu, unsigned flags) {
  __tsan_mutex_pre_unlock(mu, flags);
}
void AfterUnlock(void* mu, unsigned flags) {
  __tsan_mutex_post_unlock(mu, flags);
}

// A try-lock: `acquired` says whether it took the mutex.
void AfterTryLock(void* mu, unsigned flags, bool acquired) {
  flags |= __tsan_mutex_try_lock;
  if (!acquired) flags |= __tsan_mutex_try_lock_failed;
  AfterLock(mu, flags);
}

// Runs `wait`, which releases `mu` and takes it again before returning, as
// an unlock followed by a lock.
template <typename Wait>
auto AsUnlockAndRelock(void* mu, Wait wait) {
  BeforeUnlock(mu, 0);
  const auto result = wait();
  AfterUnlock(mu, 0);
  BeforeLock(mu, 0);
  AfterLock(mu, 0);
  return result;
}

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

Mutex::~Mutex() {
  static const auto real = RealAbsl<void (*)(Mutex*)>("5MutexD2Ev");
  __tsan_mutex_destroy(this, 0);
  real(this);
}

void Mutex::Lock() {
  static const auto real = RealAbsl<void (*)(Mutex*)>("5Mutex4LockEv");
  BeforeLock(this, 0);
  real(this);
  AfterLock(this, 0);
}

void Mutex::ReaderLock() {
  static const auto real = RealAbsl<void (*)(Mutex*)>("5Mutex10ReaderLockEv");
  BeforeLock(this, __tsan_mutex_read_lock);
  real(this);
  AfterLock(this, __tsan_mutex_read_lock);
}

bool Mutex::TryLock() {
  static const auto real = RealAbsl<bool (*)(Mutex*)>("5Mutex7TryLockEv");
  BeforeLock(this, __tsan_mutex_try_lock);
  const bool acquired = real(this);
  AfterTryLock(this, 0, acquired);
  return acquired;
}

bool Mutex::ReaderTryLock() {
  static const auto real =
      RealAbsl<bool (*)(Mutex*)>("5Mutex13ReaderTryLockEv");
  BeforeLock(this, __tsan_mutex_try_read_lock);
  const bool acquired = real(this);
  AfterTryLock(this, __tsan_mutex_read_lock, acquired);
  return acquired;
}

void Mutex::Unlock() {
  static const auto real = RealAbsl<void (*)(Mutex*)>("5Mutex6UnlockEv");
  BeforeUnlock(this, 0);
  real(this);
  AfterUnlock(this, 0);
}

void Mutex::ReaderUnlock() {
  static const auto real = RealAbsl<void (*)(Mutex*)>("5Mutex12ReaderUnlockEv");
  BeforeUnlock(this, __tsan_mutex_read_lock);
  real(this);
  AfterUnlock(this, __tsan_mutex_read_lock);
}

// The LockWhen family always returns holding the mutex (the result is the
// condition's value).

void Mutex::LockWhen(const Condition& cond) {
  static const auto real = RealAbsl<void (*)(Mutex*, const Condition&)>(
      "5Mutex8LockWhenERKNS0_9ConditionE");
  BeforeLock(this, 0);
  real(this, cond);
  AfterLock(this, 0);
}

void Mutex::ReaderLockWhen(const Condition& cond) {
  static const auto real = RealAbsl<void (*)(Mutex*, const Condition&)>(
      "5Mutex14ReaderLockWhenERKNS0_9ConditionE");
  BeforeLock(this, __tsan_mutex_read_lock);
  real(this, cond);
  AfterLock(this, __tsan_mutex_read_lock);
}

bool Mutex::LockWhenWithDeadline(const Condition& cond, Time deadline) {
  static const auto real = RealAbsl<bool (*)(Mutex*, const Condition&, Time)>(
      "5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  BeforeLock(this, 0);
  const bool result = real(this, cond, deadline);
  AfterLock(this, 0);
  return result;
}

bool Mutex::ReaderLockWhenWithDeadline(const Condition& cond, Time deadline) {
  static const auto real = RealAbsl<bool (*)(Mutex*, const Condition&, Time)>(
      "5Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  BeforeLock(this, __tsan_mutex_read_lock);
  const bool result = real(this, cond, deadline);
  AfterLock(this, __tsan_mutex_read_lock);
  return result;
}

void Mutex::Await(const Condition& cond) {
  static const auto real = RealAbsl<void (*)(Mutex*, const Condition&)>(
      "5Mutex5AwaitERKNS0_9ConditionE");
  AsUnlockAndRelock(this, [&] {
    real(this, cond);
    return true;
  });
}

bool Mutex::AwaitWithDeadline(const Condition& cond, Time deadline) {
  static const auto real = RealAbsl<bool (*)(Mutex*, const Condition&, Time)>(
      "5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return AsUnlockAndRelock(this, [&] { return real(this, cond, deadline); });
}

void CondVar::Wait(Mutex* mu) {
  static const auto real =
      RealAbsl<void (*)(CondVar*, Mutex*)>("7CondVar4WaitEPNS0_5MutexE");
  AsUnlockAndRelock(mu, [&] {
    real(this, mu);
    return true;
  });
}

bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  static const auto real = RealAbsl<bool (*)(CondVar*, Mutex*, Time)>(
      "7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  return AsUnlockAndRelock(mu, [&] { return real(this, mu, deadline); });
}

ABSL_NAMESPACE_END
}  // namespace absl

// gRPC's completion queues.

namespace {

// Operations started with `tag` are complete when an event with `tag` comes
// out of a completion queue.
void StartedWithTag(void* tag) {
  if (tag != nullptr) __tsan_release(tag);
}

grpc_event Completed(grpc_event event) {
  if (event.type == GRPC_OP_COMPLETE && event.tag != nullptr) {
    __tsan_acquire(event.tag);
  }
  return event;
}

}  // namespace

extern "C" {

grpc_call_error grpc_call_start_batch(grpc_call* call, const grpc_op* ops,
                                      size_t nops, void* tag, void* reserved) {
  static const auto real =
      Real<decltype(&grpc_call_start_batch)>("grpc_call_start_batch");
  StartedWithTag(tag);
  return real(call, ops, nops, tag, reserved);
}

grpc_call_error grpc_server_request_call(
    grpc_server* server, grpc_call** call, grpc_call_details* details,
    grpc_metadata_array* request_metadata,
    grpc_completion_queue* cq_bound_to_call,
    grpc_completion_queue* cq_for_notification, void* tag_new) {
  static const auto real =
      Real<decltype(&grpc_server_request_call)>("grpc_server_request_call");
  StartedWithTag(tag_new);
  return real(server, call, details, request_metadata, cq_bound_to_call,
              cq_for_notification, tag_new);
}

grpc_call_error grpc_server_request_registered_call(
    grpc_server* server, void* registered_method, grpc_call** call,
    gpr_timespec* deadline, grpc_metadata_array* request_metadata,
    grpc_byte_buffer** optional_payload,
    grpc_completion_queue* cq_bound_to_call,
    grpc_completion_queue* cq_for_notification, void* tag_new) {
  static const auto real = Real<decltype(&grpc_server_request_registered_call)>(
      "grpc_server_request_registered_call");
  StartedWithTag(tag_new);
  return real(server, registered_method, call, deadline, request_metadata,
              optional_payload, cq_bound_to_call, cq_for_notification, tag_new);
}

grpc_event grpc_completion_queue_next(grpc_completion_queue* cq,
                                      gpr_timespec deadline, void* reserved) {
  static const auto real =
      Real<decltype(&grpc_completion_queue_next)>("grpc_completion_queue_next");
  return Completed(real(cq, deadline, reserved));
}

grpc_event grpc_completion_queue_pluck(grpc_completion_queue* cq, void* tag,
                                       gpr_timespec deadline, void* reserved) {
  static const auto real = Real<decltype(&grpc_completion_queue_pluck)>(
      "grpc_completion_queue_pluck");
  return Completed(real(cq, tag, deadline, reserved));
}

}  // extern "C"

// gRPC's server reactors.

namespace {

// The data of grpc::internal::ServerCallbackCall, whose members are private
// (grpcpp/support/server_callback.h, gRPC 1.51).
struct ServerCallbackCallLayout {
  void* vtable;
  std::atomic_int on_cancel_conditions_remaining;
  std::atomic_int callbacks_outstanding;
};
static_assert(sizeof(ServerCallbackCallLayout) ==
                  sizeof(grpc::internal::ServerCallbackCall),
              "grpc::internal::ServerCallbackCall changed: update the layout");

}  // namespace

namespace grpc {
namespace internal {

void ServerCallbackCall::ScheduleOnDone(bool inline_ondone) {
  static const auto real = Real<void (*)(ServerCallbackCall*, bool)>(
      "_ZN4grpc8internal18ServerCallbackCall14ScheduleOnDoneEb");
  __tsan_acquire(&reinterpret_cast<ServerCallbackCallLayout*>(this)
                      ->callbacks_outstanding);
  real(this, inline_ondone);
}

}  // namespace internal
}  // namespace grpc
