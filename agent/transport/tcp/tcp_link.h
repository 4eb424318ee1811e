#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>

namespace baton::agent::tcp {

// One TCP connection between two agents of a job, and the bytes that crossed
// it each way since it was last handed to a communicator.
//
// The counts are what lets two surviving nodes keep their connection through
// a re-form: an operation aborted half-way leaves bytes in flight that the
// receiver never read, and before the next generation's first byte the
// receiver skips exactly the number its peer says it sent, less what it read
// (ConnectPeers). A connection on which an error or the end of the stream was
// seen is `broken` and never kept.
struct Link {
  int fd = -1;
  // Chosen at random by the node that connected; the same on both ends, so
  // two nodes that both kept a connection know it is this one.
  uint64_t id = 0;
  uint64_t sent = 0;
  uint64_t received = 0;
  bool broken = false;
};

// send(2) on the link's non-blocking socket, counting the bytes the kernel
// took. A failure other than EAGAIN/EINTR marks the link broken (errno is
// left as send(2) set it).
ssize_t Send(Link& link, const void* data, size_t bytes);

// sendmsg(2) of `count` buffers in order, otherwise as Send.
ssize_t SendVector(Link& link, const iovec* buffers, int count);

// recv(2) on the link's non-blocking socket, counting the bytes read. The end
// of the stream (0) and a failure other than EAGAIN/EINTR mark the link
// broken (errno is left as recv(2) set it).
ssize_t Receive(Link& link, void* data, size_t bytes);

// Marks the link broken and shuts it down, so that the peer's next read or
// write on it fails at once. The fd stays open until the owner closes it.
void ShutDown(Link& link);

}  // namespace baton::agent::tcp
