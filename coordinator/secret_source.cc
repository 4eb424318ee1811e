#include "coordinator/secret_source.h"

#include <openssl/rand.h>

#include "glog/logging.h"

namespace baton::coordinator {
namespace {

class CryptoSource : public SecretSource {
 public:
  std::string Draw(size_t bytes) override {
    std::string secret(bytes, '\0');
    CHECK_EQ(RAND_bytes(reinterpret_cast<unsigned char*>(secret.data()),
                        static_cast<int>(secret.size())),
             1)
        << "RAND_bytes failed to draw a data-plane secret: libcrypto has no "
           "entropy source";
    return secret;
  }
};

}  // namespace

SecretSource* CryptoSecretSource() {
  static CryptoSource* const source = new CryptoSource;
  return source;
}

std::string CountingSecretSource::Draw(size_t bytes) {
  ++draws_;
  std::string secret(bytes, '\0');
  for (size_t i = 0; i < bytes; ++i) {
    secret[i] =
        static_cast<char>((draws_ * 131 + static_cast<int64_t>(i)) & 0xff);
  }
  return secret;
}

}  // namespace baton::coordinator
