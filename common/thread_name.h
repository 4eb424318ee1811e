#pragma once

#include <string_view>

namespace baton {

// Names the calling thread for top -H, perf and gdb (Linux keeps the first
// 15 bytes). Threads inherit their creator's name otherwise, so every
// long-lived thread of baton names itself.
void SetThreadName(std::string_view name);

}  // namespace baton
