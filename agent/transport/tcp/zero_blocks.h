#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace baton::agent {

// A ring step's data cut into blocks of kBlockBytes (the last one shorter),
// so that blocks whose bytes are all zero need not cross the wire. An
// allreduce step sends either every byte ("dense"), or a bitmap of the
// blocks that hold a nonzero byte followed by those blocks only ("sparse").
// The gradient of a dense nn.Embedding is the case this is for: only the
// rows of the tokens in the batch are nonzero (OmniReduce, SIGCOMM 2021,
// skips zero blocks the same way).
//
// Skipping is exact: a block left out is one whose addition would change
// nothing, so the sum is the dense ring's bit for bit, except that a result
// of zero may keep the sign of the addend (-0.0 + +0.0 is +0.0 in IEEE
// arithmetic; a skipped +0.0 leaves -0.0). Only all-bits-zero blocks are
// skipped: -0.0 is data.
class ZeroBlocks {
 public:
  static constexpr size_t kBlockBytes = 1024;

  // Blocks of `bytes` (the last one may be shorter).
  static size_t Count(size_t bytes) {
    return (bytes + kBlockBytes - 1) / kBlockBytes;
  }
  static size_t BitmapBytes(size_t bytes) { return (Count(bytes) + 7) / 8; }
  // The length of block `block` of `bytes`.
  static size_t Length(size_t bytes, size_t block) {
    const size_t at = block * kBlockBytes;
    return bytes - at < kBlockBytes ? bytes - at : kBlockBytes;
  }

  // Sender: marks in `bitmap` (BitmapBytes(bytes) bytes; bit i of byte i/8,
  // lowest first) the blocks of data[0, bytes) that hold a nonzero byte, and
  // returns their number. A block whose first word is nonzero costs one
  // read, so scanning dense data is cheap.
  static size_t Scan(const uint8_t* data, size_t bytes,
                     std::vector<uint8_t>* bitmap);

  // Receiver: the indices of the blocks `bitmap` marks, for a step of
  // `bytes`, in order; INVALID_ARGUMENT when it marks a block past the last
  // one, or not `declared` blocks (what the sender's preamble said).
  static absl::StatusOr<std::vector<uint32_t>> Present(
      const std::vector<uint8_t>& bitmap, size_t bytes, uint64_t declared);

  // Whether it is worth sending `present` of Count(bytes) blocks sparse: at
  // least one block in eight is zero (below that, the bitmap, the extra
  // system calls and the scattered additions cost more than the bytes).
  static bool WorthSkipping(size_t bytes, size_t present);
};

}  // namespace baton::agent
