#pragma once

#include <string>

#include "absl/status/status.h"

namespace baton::client {

// Whether the agent at `socket` can admit this process, judged from the
// socket file before connecting: the agent admits its own uid (the socket's
// owner) and, when the socket is group-writable (--trainer_group), the
// members of its group. The agent refuses anyone else by closing the
// connection, which a trainer would only see as "Socket closed"; this says
// why instead. PERMISSION_DENIED naming the path, its owner, this process's
// uid and the fix; OK when the process may attach, and when the socket does
// not exist (connecting then says that no agent runs there).
absl::Status CheckSocketAccess(const std::string& socket);

}  // namespace baton::client
