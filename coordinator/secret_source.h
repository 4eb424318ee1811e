#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace baton::coordinator {

// The size of Membership.data_plane_secret.
inline constexpr size_t kDataPlaneSecretBytes = 32;

// Where the coordinator draws each generation's data-plane secret
// (Membership.data_plane_secret). Like Clock, an interface so that tests and
// fuzzers run on a deterministic one.
class SecretSource {
 public:
  virtual ~SecretSource() = default;
  // `bytes` bytes no party outside this coordinator and the generation's
  // members can guess.
  virtual std::string Draw(size_t bytes) = 0;
};

// libcrypto's CSPRNG (RAND_bytes). Thread-safe; lives for the process. A
// failing RAND_bytes stops the process: a guessable secret would let anyone
// who reaches the agents' data ports join their rings.
SecretSource* CryptoSecretSource();

// Deterministic bytes from a counter (not secret): for tests and fuzzers.
// Any 256 consecutive draws differ from each other.
class CountingSecretSource : public SecretSource {
 public:
  std::string Draw(size_t bytes) override;
  int64_t draws() const { return draws_; }

 private:
  int64_t draws_ = 0;
};

}  // namespace baton::coordinator
