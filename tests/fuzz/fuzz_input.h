#pragma once

// What every fuzz target shares: reading a libFuzzer input front to back as
// small decisions (so the seed scripts in tests/fuzz/make_corpus.py can write
// inputs by hand), quieting the libraries' logs, and stopping on a broken
// invariant.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "glog/logging.h"
#include "google/protobuf/stubs/logging.h"

namespace baton::fuzz {

// An input read front to back. Past its end every read gives 0 (and empty
// strings), so any prefix of an input is an input too.
class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  bool empty() const { return pos_ >= size_; }
  // How many bytes were read.
  size_t pos() const { return pos_ < size_ ? pos_ : size_; }
  const uint8_t* data() const { return data_; }
  uint8_t Byte() { return empty() ? 0 : data_[pos_++]; }
  // In 0..n-1 (n > 0).
  uint32_t Below(uint32_t n) { return Byte() % n; }
  bool Bit() { return (Byte() & 1) != 0; }
  // `bytes` bytes, little-endian, as a signed value.
  int64_t Int(int bytes) {
    uint64_t value = 0;
    for (int i = 0; i < bytes; ++i) {
      value |= static_cast<uint64_t>(Byte()) << (8 * i);
    }
    return static_cast<int64_t>(value);
  }
  // A length byte (at most `max`), then that many bytes.
  std::string String(size_t max) {
    size_t length = Byte() % (max + 1);
    std::string out;
    while (length-- > 0 && !empty()) out.push_back(static_cast<char>(Byte()));
    return out;
  }
  // The bytes not read yet.
  std::string Rest() {
    std::string out(reinterpret_cast<const char*>(data_) + pos_,
                    empty() ? 0 : size_ - pos_);
    pos_ = size_;
    return out;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// glog and protobuf print a line for every rejected input (protobuf for
// each string field with invalid UTF-8): at thousands of inputs a second
// that is the fuzzer's whole time. Errors and worse still print.
inline void QuietLogs() {
  FLAGS_logtostderr = true;
  FLAGS_minloglevel = google::GLOG_ERROR;
  google::protobuf::SetLogHandler(nullptr);
}

// A broken invariant: libFuzzer keeps the input that got here as a crash.
[[noreturn]] inline void Broken(const std::string& target,
                                const std::string& what) {
  std::fprintf(stderr, "%s: invariant broken: %s\n", target.c_str(),
               what.c_str());
  std::abort();
}

}  // namespace baton::fuzz
