#pragma once

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <utility>

namespace baton {

// A value of type T that only compares with ids of the same Tag, so a session
// id cannot be passed where a tensor id is expected.
template <typename Tag, typename T>
class StrongId {
 public:
  using ValueType = T;

  StrongId() = default;
  explicit StrongId(T value) : value_(std::move(value)) {}

  const T& value() const { return value_; }

  friend bool operator==(const StrongId& a, const StrongId& b) {
    return a.value_ == b.value_;
  }
  friend bool operator!=(const StrongId& a, const StrongId& b) {
    return a.value_ != b.value_;
  }
  friend bool operator<(const StrongId& a, const StrongId& b) {
    return a.value_ < b.value_;
  }
  friend std::ostream& operator<<(std::ostream& os, const StrongId& id) {
    return os << id.value_;
  }
  template <typename H>
  friend H AbslHashValue(H h, const StrongId& id) {
    return H::combine(std::move(h), id.value_);
  }

 private:
  T value_{};
};

using JobName = StrongId<struct JobNameTag, std::string>;
using NodeName = StrongId<struct NodeNameTag, std::string>;
using SessionId = StrongId<struct SessionIdTag, uint64_t>;
using Generation = StrongId<struct GenerationTag, int64_t>;
using TensorId = StrongId<struct TensorIdTag, uint32_t>;
using Rank = StrongId<struct RankTag, int32_t>;

}  // namespace baton
