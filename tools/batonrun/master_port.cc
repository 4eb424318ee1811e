#include "tools/batonrun/master_port.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <random>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace baton::batonrun {
namespace {

// Linux's default ephemeral range starts here; used when /proc says nothing.
constexpr int kDefaultEphemeralLow = 32768;
// Ports below this are left alone (well-known and commonly configured
// services, torchrun's 29500 included).
constexpr int kLowestPort = 20000;

int EphemeralLow() {
  int low = kDefaultEphemeralLow;
  int high = 0;
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(f, "%d %d", &low, &high) != 2) low = kDefaultEphemeralLow;
    std::fclose(f);
  }
  return low;
}

// True when `port` can be bound on the wildcard address of `family` (an
// address family the host lacks counts as free). No SO_REUSEADDR: a port
// in TIME_WAIT counts as taken.
bool FreeOn(int family, int port) {
  const int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return true;
  bool free = false;
  if (family == AF_INET6) {
    const int on = 1;
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &on, sizeof(on));
    sockaddr_in6 address{};
    address.sin6_family = AF_INET6;
    address.sin6_addr = in6addr_any;
    address.sin6_port = htons(static_cast<uint16_t>(port));
    free =
        bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  } else {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_ANY);
    address.sin_port = htons(static_cast<uint16_t>(port));
    free =
        bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  }
  close(fd);
  return free;
}

}  // namespace

absl::StatusOr<int> ChooseMasterPort() {
  const int high = EphemeralLow() - 1;
  if (high < kLowestPort) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the kernel's ephemeral ports start at ", high + 1,
        " (net.ipv4.ip_local_port_range), leaving no port in ", kLowestPort,
        ".. for MASTER_PORT that the cluster's own sockets cannot take; "
        "raise the range's start"));
  }
  const int count = high - kLowestPort + 1;
  std::random_device seed;
  const int start = std::uniform_int_distribution<int>(0, count - 1)(seed);
  for (int i = 0; i < count; ++i) {
    const int port = kLowestPort + (start + i) % count;
    if (FreeOn(AF_INET, port) && FreeOn(AF_INET6, port)) return port;
  }
  return absl::FailedPreconditionError(
      absl::StrCat("no free TCP port in ", kLowestPort, "..", high,
                   " for MASTER_PORT (torch.distributed's rendezvous)"));
}

}  // namespace baton::batonrun
