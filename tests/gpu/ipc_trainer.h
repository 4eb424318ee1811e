#pragma once

#include <cstdint>
#include <string>
#include <vector>

// A trainer in another process, for the GPU tests of the agent's CUDA IPC
// path (this is the trainer's side; trainer_process.h is the test's): it
// holds float32 tensors in one cudaMalloc allocation on CUDA device 0 and an
// interprocess ready event, exports both handles, and writes and checks its
// tensors when the test says so, as a trainer's backward pass and its
// optimizer would. It talks to the test over two pipes, one text line per
// command and reply (line_pipe.h):
//
//   trainer -> test, once    ready <memory handle, hex> <event handle, hex>
//                                  <PCI bus id>
//                            unsupported <why>   (no CUDA IPC here)
//                            error <why>
//   test -> trainer          write <tensor> <multiplier>
//                            check <tensor> <multiplier>
//                            quit
//   trainer -> test          ok | error <why>
//
// `write` fills the tensor with TensorValue(multiplier, i) (cudaMemcpy from
// the host) and records the ready event after the copy; `check` copies it
// back and compares; `quit` destroys the event, frees the memory and exits
// 0. A trainer whose test goes away (end of its command pipe) frees its
// memory and exits.

namespace baton::agent {

// argv[1] of a trainer: the flag, then its tensors' element counts
// ("--baton_ipc_trainer=262147,1001").
inline constexpr char kTrainerFlag[] = "--baton_ipc_trainer=";

// Byte offsets of float32 tensors of `elements` elements packed into one
// allocation, each aligned to 512 bytes; the last entry is the allocation's
// size.
std::vector<int64_t> TensorOffsets(const std::vector<int64_t>& elements);

// Element i of a tensor written with `multiplier`: multiplier x (i % 7 + 1),
// an integer, exact in float32 for the multipliers the tests use.
float TensorValue(int64_t multiplier, int64_t i);

// The trainer's ends of its pipes (the test's posix_spawn puts them there).
inline constexpr int kTrainerCommandFd = 3;
inline constexpr int kTrainerReplyFd = 4;

// Runs this process as a trainer (main, when argv[1] starts with
// kTrainerFlag; `layout` is what follows it): commands on
// kTrainerCommandFd, replies on kTrainerReplyFd. Returns the exit code.
int RunTrainer(const std::string& layout);

}  // namespace baton::agent
