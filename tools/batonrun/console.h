#pragma once

// batonrun's console: its own lines on stderr ("batonrun: ..."), and its
// trainers' output on stdout, each line prefixed with the trainer's tag.
// One lock serializes both, so no two lines interleave. Thread-safe.

#include <string>

namespace baton::batonrun {

// Writes "batonrun: <text>" and a newline to stderr.
void Say(const std::string& text);

// Copies `fd` to stdout line by line, each line as "[<tag>] <line>", until
// the pipe closes (the writer and every process sharing the pipe ended);
// then closes `fd`. A last line without a newline is written too. Runs on a
// thread of its own per trainer.
void PrefixLines(int fd, std::string tag);

}  // namespace baton::batonrun
