#include "common/thread_name.h"

#include <pthread.h>

#include <string>

namespace baton {

void SetThreadName(std::string_view name) {
  // The kernel's limit: 16 bytes with the terminating NUL.
  const std::string truncated(name.substr(0, 15));
  pthread_setname_np(pthread_self(), truncated.c_str());
}

}  // namespace baton
