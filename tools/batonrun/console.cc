#include "tools/batonrun/console.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <mutex>

namespace baton::batonrun {
namespace {

// Held while one line is written, to stdout or stderr.
std::mutex output_mu;

}  // namespace

void Say(const std::string& text) {
  std::lock_guard<std::mutex> lock(output_mu);
  std::fprintf(stderr, "batonrun: %s\n", text.c_str());
}

void PrefixLines(int fd, std::string tag) {
  std::string line;
  char chunk[4096];
  const auto flush = [&] {
    std::lock_guard<std::mutex> lock(output_mu);
    std::fprintf(stdout, "[%s] %s\n", tag.c_str(), line.c_str());
    std::fflush(stdout);
    line.clear();
  };
  for (;;) {
    const ssize_t n = read(fd, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    for (ssize_t i = 0; i < n; ++i) {
      if (chunk[i] == '\n') {
        flush();
      } else {
        line.push_back(chunk[i]);
      }
    }
  }
  if (!line.empty()) flush();
  close(fd);
}

}  // namespace baton::batonrun
