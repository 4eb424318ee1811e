// The data plane's TCP introductions (tcp_introduction.h): their wire
// layout and MACs as pure functions, and ConnectPeers refusing whoever does
// not hold the generation's secret while the real peers connect. Real TCP on
// loopback, one thread per node, an in-memory store.

#include "agent/transport/tcp/tcp_introduction.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "agent/transport/memory_key_value_store.h"
#include "agent/transport/tcp/tcp_transport.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/agent/transport/node_threads.h"

namespace baton::agent {
namespace {

using tcp::Introduction;
using tcp::ReceivedIntroduction;
using ::testing::HasSubstr;
using Verdict = tcp::ReceivedIntroduction::Verdict;

constexpr std::chrono::milliseconds kTimeout{10000};
// For connects that are meant to fail on a missing peer: the ranks that
// wait for it give up after this (a bound, not a measured time).
constexpr std::chrono::milliseconds kRefusedTimeout{3000};
constexpr char kPrefix[] = "baton/job/1/data";
// The negotiation rounds' keys: "<prefix>/rounds/<rank>".
constexpr char kRoundsPrefix[] = "baton/job/1/data/rounds";

std::string Secret(char fill) { return std::string(32, fill); }

// 0x00, 0x01, ... 0x1f: the secret of the known-answer vectors below.
std::string CountingSecret() {
  std::string secret;
  for (int i = 0; i < 32; ++i) secret.push_back(static_cast<char>(i));
  return secret;
}

// --- The wire, as pure functions ---------------------------------------------

// The layout docs/protocol.md describes, and MACs computed independently
// (Python's hmac over the same input): a change here is a protocol change.
TEST(TcpIntroductionTest, WireLayoutAndMacsAreTheDocumentedOnes) {
  const Introduction introduction = {2, tcp::PrefixHash(kRoundsPrefix),
                                     0x0102030405060708ull};
  EXPECT_EQ(introduction.prefix_hash, 0xaf528f3b8f450deeull);
  absl::StatusOr<std::string> bytes =
      tcp::EncodeIntroduction(introduction, kRoundsPrefix, CountingSecret());
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  ASSERT_EQ(bytes->size(), tcp::kIntroductionBytes);
  EXPECT_EQ(absl::BytesToHexString(*bytes),
            absl::StrCat(absl::BytesToHexString("BRN2"), "00000002",
                         "af528f3b8f450dee", "0102030405060708",
                         "ac3f29e56c3ac4f0a9aa90faa7b4bf99"
                         "ec48dadb2ec1e7f853e4daca37f2de6d"));
  absl::StatusOr<std::string> reply = tcp::EncodeIntroductionReply(
      kRoundsPrefix, 0, 0x0102030405060708ull, CountingSecret());
  ASSERT_TRUE(reply.ok()) << reply.status();
  ASSERT_EQ(reply->size(), tcp::kIntroductionReplyBytes);
  EXPECT_EQ(absl::BytesToHexString(*reply),
            absl::StrCat(absl::BytesToHexString("BRNA"),
                         "961bf14d230fb140733f203e7fd0aab9"
                         "9b53adb6d8a7091042c57e9d0e933654"));
}

TEST(TcpIntroductionTest, OnlyTheSecretsHolderIntroducesItself) {
  const std::string secret = Secret('s');
  const Introduction sent = {3, tcp::PrefixHash(kRoundsPrefix), 77};
  const std::string bytes =
      tcp::EncodeIntroduction(sent, kRoundsPrefix, secret).value();

  ReceivedIntroduction read =
      tcp::ReadIntroduction(bytes, kRoundsPrefix, secret);
  EXPECT_EQ(read.verdict, Verdict::kAuthentic);
  EXPECT_EQ(read.introduction.rank, 3);
  EXPECT_EQ(read.introduction.link_id, 77u);

  // Another secret: refused, though what it claims is still readable.
  read = tcp::ReadIntroduction(bytes, kRoundsPrefix, Secret('t'));
  EXPECT_EQ(read.verdict, Verdict::kBadMac);
  EXPECT_EQ(read.introduction.rank, 3);
  // Each field the MAC covers, changed in flight.
  for (const size_t offset : {size_t{7}, size_t{23}, size_t{40}}) {
    std::string changed = bytes;
    changed[offset] ^= 1;
    EXPECT_EQ(tcp::ReadIntroduction(changed, kRoundsPrefix, secret).verdict,
              Verdict::kBadMac)
        << "byte " << offset;
  }
  // Another peer set or generation.
  EXPECT_EQ(
      tcp::ReadIntroduction(bytes, "baton/job/2/data/rounds", secret).verdict,
      Verdict::kOtherPrefix);
  // Not this protocol: the old 24-byte introduction, a short read, a magic.
  EXPECT_EQ(
      tcp::ReadIntroduction(bytes.substr(0, 24), kRoundsPrefix, secret).verdict,
      Verdict::kMalformed);
  std::string old_magic = bytes;
  old_magic[3] = 'D';
  EXPECT_EQ(tcp::ReadIntroduction(old_magic, kRoundsPrefix, secret).verdict,
            Verdict::kMalformed);
}

TEST(TcpIntroductionTest, OnlyTheSecretsHolderAnswers) {
  const std::string secret = Secret('s');
  const std::string reply =
      tcp::EncodeIntroductionReply(kRoundsPrefix, 1, 99, secret).value();
  EXPECT_TRUE(
      tcp::VerifyIntroductionReply(reply, kRoundsPrefix, 1, 99, secret));
  EXPECT_FALSE(
      tcp::VerifyIntroductionReply(reply, kRoundsPrefix, 1, 99, Secret('t')));
  EXPECT_FALSE(
      tcp::VerifyIntroductionReply(reply, kRoundsPrefix, 2, 99, secret));
  EXPECT_FALSE(
      tcp::VerifyIntroductionReply(reply, kRoundsPrefix, 1, 98, secret));
  EXPECT_FALSE(tcp::VerifyIntroductionReply(reply, "baton/job/2/data/rounds", 1,
                                            99, secret));
  EXPECT_FALSE(tcp::VerifyIntroductionReply(reply.substr(0, 35), kRoundsPrefix,
                                            1, 99, secret));
  // An introduction's MAC reflected back is no answer (another domain tag).
  const std::string introduction =
      tcp::EncodeIntroduction({1, tcp::PrefixHash(kRoundsPrefix), 99},
                              kRoundsPrefix, secret)
          .value();
  EXPECT_FALSE(tcp::VerifyIntroductionReply("BRNA" + introduction.substr(24),
                                            kRoundsPrefix, 1, 99, secret));
}

// --- Connecting --------------------------------------------------------------

std::unique_ptr<TcpTransport> NewTransport() {
  auto transport = TcpTransport::Create("127.0.0.1");
  EXPECT_TRUE(transport.ok()) << transport.status();
  return std::move(transport).value();
}

ConnectRequest Request(int rank, int nodes, std::string secret,
                       std::shared_ptr<KeyValueStore> store,
                       std::chrono::milliseconds timeout = kTimeout) {
  ConnectRequest request;
  request.node_rank = rank;
  request.num_nodes = nodes;
  request.prefix = kPrefix;
  request.store = std::move(store);
  request.count = 2;
  request.timeout = timeout;
  request.secret = std::move(secret);
  return request;
}

// glog's lines while it is installed.
class LogLines : public google::LogSink {
 public:
  LogLines() { google::AddLogSink(this); }
  ~LogLines() override { google::RemoveLogSink(this); }

  using google::LogSink::send;
  void send(google::LogSeverity, const char*, const char*, int,
            const google::LogMessageTime&, const char* message,
            size_t length) override {
    absl::MutexLock lock(&mu_);
    lines_.emplace_back(message, length);
  }
  // The lines containing `text`.
  std::vector<std::string> With(const std::string& text) const {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> found;
    for (const std::string& line : lines_) {
      if (line.find(text) != std::string::npos) found.push_back(line);
    }
    return found;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<std::string> lines_ ABSL_GUARDED_BY(mu_);
};

class SharedSecretTest : public ::testing::TestWithParam<int> {};

// Every node holds the generation's secret: the negotiation and two rings
// connect, and their collectives are exact.
TEST_P(SharedSecretTest, ConnectsAndCollectivesAreExact) {
  const int size = GetParam();
  auto store = std::make_shared<MemoryKeyValueStore>();
  std::vector<std::unique_ptr<TcpTransport>> transports(size);
  for (auto& transport : transports) transport = NewTransport();
  constexpr size_t kCount = (size_t{1} << 16) + 3;
  OnEveryNode(size, [&](int rank) {
    const ConnectRequest request = Request(rank, size, Secret('s'), store);
    auto rounds = transports[rank]->ConnectNegotiation(request);
    ASSERT_TRUE(rounds.ok()) << "rank " << rank << ": " << rounds.status();
    auto rings = transports[rank]->Connect(request);
    ASSERT_TRUE(rings.ok()) << "rank " << rank << ": " << rings.status();
    for (auto& ring : *rings) {
      std::vector<float> data(kCount);
      for (size_t i = 0; i < kCount; ++i) {
        data[i] = static_cast<float>((i + rank) % 7);
      }
      ASSERT_TRUE(ring->Allreduce(data.data(), kCount, v1::DATA_TYPE_FLOAT32,
                                  CollectiveOptions{kTimeout, 0})
                      .ok());
      for (size_t i = 0; i < kCount; ++i) {
        float expected = 0;
        for (int r = 0; r < size; ++r) expected += (i + r) % 7;
        ASSERT_EQ(data[i], expected) << "rank " << rank << " element " << i;
      }
    }
    std::vector<int64_t> words = {rank + 10, 100 - rank};
    ASSERT_TRUE((*rounds)
                    ->ExchangeMin(words.data(), words.size(),
                                  CollectiveOptions{kTimeout, 0})
                    .ok());
    EXPECT_EQ(words, (std::vector<int64_t>{10, 100 - (size - 1)}))
        << "rank " << rank;
  });
}

INSTANTIATE_TEST_SUITE_P(Nodes, SharedSecretTest,
                         ::testing::Values(1, 2, 3, 4));

// (world size, the rank holding another secret).
class WrongSecretTest : public ::testing::TestWithParam<std::tuple<int, int>> {
};

// One node holds another secret (say, a node of another generation): its
// peers refuse its introductions and it refuses theirs, and every connect
// that needs it fails naming it. Lower ranks wait for it to connect until
// their timeout; higher ranks learn at once that it did not prove the
// secret.
TEST_P(WrongSecretTest, ItsPeersRefuseItAndSayWhy) {
  const int size = std::get<0>(GetParam());
  const int wrong = std::get<1>(GetParam());
  auto store = std::make_shared<MemoryKeyValueStore>();
  std::vector<std::unique_ptr<TcpTransport>> transports(size);
  for (auto& transport : transports) transport = NewTransport();
  LogLines log;
  std::vector<absl::Status> statuses(size);
  OnEveryNode(size, [&](int rank) {
    const std::string secret = Secret(rank == wrong ? 'w' : 's');
    statuses[rank] = transports[rank]
                         ->ConnectNegotiation(Request(rank, size, secret, store,
                                                      kRefusedTimeout))
                         .status();
  });
  const std::string refused =
      "did not prove this generation's secret, the first from 127.0.0.1:";
  for (int rank = 0; rank < size; ++rank) {
    SCOPED_TRACE(absl::StrCat("rank ", rank));
    const absl::Status& status = statuses[rank];
    if (rank < wrong) {
      EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
      EXPECT_THAT(status.message(),
                  HasSubstr(absl::StrCat("node rank(s) ", wrong,
                                         " did not connect (refused 1 ")));
      EXPECT_THAT(status.message(), HasSubstr(refused));
      EXPECT_THAT(status.message(),
                  HasSubstr(absl::StrCat("claiming node rank ", wrong)));
    } else if (rank > wrong) {
      EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
      EXPECT_THAT(status.message(), HasSubstr(absl::StrCat("node rank ", wrong,
                                                           " at 127.0.0.1:")));
      EXPECT_THAT(status.message(),
                  HasSubstr("did not prove this generation's secret"));
    } else if (rank + 1 < size) {
      // It refused every higher rank's introduction in turn.
      EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
      EXPECT_THAT(status.message(), HasSubstr(refused));
    } else {
      // The last rank accepts nobody: rank 0 closed on its introduction.
      EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
      EXPECT_THAT(status.message(), HasSubstr("node rank 0 at 127.0.0.1:"));
      EXPECT_THAT(status.message(),
                  HasSubstr("did not prove this generation's secret: it "
                            "closed the connection"));
    }
  }
  // Each refusing connect logged it once, naming where it came from.
  if (wrong > 0) {
    EXPECT_EQ(
        log.With(absl::StrCat("claiming to be node rank ", wrong, ": ")).size(),
        static_cast<size_t>(wrong));
  }
  EXPECT_EQ(log.With("refused a connection from 127.0.0.1:").size(),
            static_cast<size_t>(wrong + (wrong + 1 < size ? 1 : 0)));
}

INSTANTIATE_TEST_SUITE_P(Nodes, WrongSecretTest,
                         ::testing::Values(std::make_tuple(2, 0),
                                           std::make_tuple(2, 1),
                                           std::make_tuple(3, 1),
                                           std::make_tuple(4, 3)));

// "<host> <port>" that a node published under `key`, once it is there.
int PublishedPort(KeyValueStore& store, const std::string& key) {
  auto entries = store.Get({key}, kTimeout);
  EXPECT_TRUE(entries.ok()) << entries.status();
  if (!entries.ok()) return 0;
  const std::vector<std::string> parts = absl::StrSplit((*entries)[0], ' ');
  int port = 0;
  EXPECT_TRUE(parts.size() >= 2 && absl::SimpleAtoi(parts[1], &port))
      << (*entries)[0];
  return port;
}

// A blocking loopback connection to `port`; -1 on failure.
int ConnectTo(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) !=
      0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// "127.0.0.1:<port>" of this end of `fd`.
std::string LocalAddress(int fd) {
  struct sockaddr_in address = {};
  socklen_t length = sizeof address;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  return absl::StrCat("127.0.0.1:", ntohs(address.sin_port));
}

// Someone who reaches rank 0's negotiation port and knows the protocol, but
// not the secret, introduces itself as rank 1 before the real rank 1 does:
// rank 0 closes that connection and logs it, and the real peers connect.
TEST(ForgedIntroductionTest, IsRefusedWhileTheRealPeersConnect) {
  constexpr int kSize = 3;
  auto store = std::make_shared<MemoryKeyValueStore>();
  std::vector<std::unique_ptr<TcpTransport>> transports(kSize);
  for (auto& transport : transports) transport = NewTransport();
  LogLines log;
  std::vector<absl::Status> statuses(kSize);
  const auto connect = [&](int rank) {
    statuses[rank] =
        transports[rank]
            ->ConnectNegotiation(Request(rank, kSize, Secret('s'), store))
            .status();
  };
  std::thread first(connect, 0);
  const int port = PublishedPort(*store, absl::StrCat(kRoundsPrefix, "/0"));
  const int forged = ConnectTo(port);
  ASSERT_GE(forged, 0);
  const std::string introduction =
      tcp::EncodeIntroduction({1, tcp::PrefixHash(kRoundsPrefix), 42},
                              kRoundsPrefix, Secret('x'))
          .value();
  ASSERT_EQ(::send(forged, introduction.data(), introduction.size(), 0),
            static_cast<ssize_t>(introduction.size()));
  // Queued before the real peers connect: rank 0 reads it first.
  std::thread second(connect, 1);
  std::thread third(connect, 2);
  first.join();
  second.join();
  third.join();
  for (int rank = 0; rank < kSize; ++rank) {
    EXPECT_TRUE(statuses[rank].ok())
        << "rank " << rank << ": " << statuses[rank];
  }
  // Closed without an answer.
  struct pollfd pfd = {forged, POLLIN, 0};
  ASSERT_EQ(::poll(&pfd, 1, static_cast<int>(kTimeout.count())), 1);
  char byte = 0;
  EXPECT_LE(::recv(forged, &byte, 1, 0), 0);
  const std::vector<std::string> lines = log.With(
      absl::StrCat("refused a connection from ", LocalAddress(forged),
                   " claiming to be node rank 1: its introduction did not "
                   "prove this generation's secret"));
  EXPECT_EQ(lines.size(), 1u);
  ::close(forged);
}

// A listener that is not a member (it published rank 0's address, but does
// not hold the secret) accepts the real rank 1 and answers with a proof made
// with another secret: rank 1's connect fails naming it.
TEST(ForgedReplyTest, FailsTheConnectingNode) {
  auto store = std::make_shared<MemoryKeyValueStore>();
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(
      ::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address),
      0);
  ASSERT_EQ(::listen(listener, 4), 0);
  socklen_t length = sizeof address;
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length);
  const int port = ntohs(address.sin_port);
  ASSERT_TRUE(store
                  ->Set(absl::StrCat(kRoundsPrefix, "/0"),
                        absl::StrCat("127.0.0.1 ", port))
                  .ok());

  std::unique_ptr<TcpTransport> transport = NewTransport();
  absl::Status status;
  std::thread node([&] {
    status = transport->ConnectNegotiation(Request(1, 2, Secret('s'), store))
                 .status();
  });
  const int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
  ASSERT_GE(fd, 0);
  std::string received(tcp::kIntroductionBytes, '\0');
  ASSERT_EQ(::recv(fd, received.data(), received.size(), MSG_WAITALL),
            static_cast<ssize_t>(received.size()));
  // What the real node sent is a valid introduction of rank 1.
  const ReceivedIntroduction read =
      tcp::ReadIntroduction(received, kRoundsPrefix, Secret('s'));
  ASSERT_EQ(read.verdict, Verdict::kAuthentic);
  EXPECT_EQ(read.introduction.rank, 1);
  const std::string reply =
      tcp::EncodeIntroductionReply(kRoundsPrefix, 0, read.introduction.link_id,
                                   Secret('x'))
          .value();
  ASSERT_EQ(::send(fd, reply.data(), reply.size(), 0),
            static_cast<ssize_t>(reply.size()));
  node.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(status.message(),
              HasSubstr(absl::StrCat(
                  "node rank 0 at 127.0.0.1:", port,
                  " did not prove this generation's secret: its answer to "
                  "this node's introduction does not verify")));
  ::close(fd);
  ::close(listener);
}

}  // namespace
}  // namespace baton::agent
