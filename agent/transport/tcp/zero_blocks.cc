#include "agent/transport/tcp/zero_blocks.h"

#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"

namespace baton::agent {
namespace {

bool AllZero(const uint8_t* p, size_t n) {
  size_t i = 0;
  for (; i + sizeof(uint64_t) <= n; i += sizeof(uint64_t)) {
    uint64_t word;
    std::memcpy(&word, p + i, sizeof word);
    if (word != 0) return false;
  }
  for (; i < n; ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}

}  // namespace

size_t ZeroBlocks::Scan(const uint8_t* data, size_t bytes,
                        std::vector<uint8_t>* bitmap) {
  const size_t count = Count(bytes);
  bitmap->assign(BitmapBytes(bytes), 0);
  size_t present = 0;
  for (size_t b = 0; b < count; ++b) {
    if (!AllZero(data + b * kBlockBytes, Length(bytes, b))) {
      (*bitmap)[b / 8] |= static_cast<uint8_t>(1u << (b % 8));
      ++present;
    }
  }
  return present;
}

absl::StatusOr<std::vector<uint32_t>> ZeroBlocks::Present(
    const std::vector<uint8_t>& bitmap, size_t bytes, uint64_t declared) {
  const size_t count = Count(bytes);
  if (bitmap.size() != BitmapBytes(bytes) || declared > count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a bitmap of ", bitmap.size(), " bytes declaring ", declared,
        " blocks for ", bytes, " bytes (", count, " blocks)"));
  }
  std::vector<uint32_t> present;
  present.reserve(declared);
  for (size_t b = 0; b < bitmap.size() * 8; ++b) {
    if ((bitmap[b / 8] >> (b % 8) & 1) == 0) continue;
    if (b >= count || present.size() == declared) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a bitmap for ", bytes, " bytes (", count, " blocks) marks ",
          b >= count
              ? absl::StrCat("block ", b, " past the last one")
              : absl::StrCat("more than the ", declared, " blocks declared")));
    }
    present.push_back(static_cast<uint32_t>(b));
  }
  if (present.size() != declared) {
    return absl::InvalidArgumentError(
        absl::StrCat("a bitmap for ", bytes, " bytes marks ", present.size(),
                     " blocks where ", declared, " were declared"));
  }
  return present;
}

bool ZeroBlocks::WorthSkipping(size_t bytes, size_t present) {
  const size_t count = Count(bytes);
  if (count > std::numeric_limits<uint32_t>::max()) return false;
  const size_t zero = count - present;
  return zero > 0 && zero * 8 >= count;
}

}  // namespace baton::agent
