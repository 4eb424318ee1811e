// baton-bench-negotiation-rounds: the latency of the scheduler's
// negotiation rounds on the all-to-all wire (TcpRounds) and along a tree
// (TcpTreeRounds), side by side, for each node count of --nodes and vector
// size of --words: N nodes as N threads of this process, each with its own
// TcpTransport on 127.0.0.1, connected through an in-memory store.
//
// Two patterns, each --rounds rounds after --warmup untimed ones:
// - lockstep: every node calls ExchangeMin back to back (every node has
//   news every round); timed on node rank 0, from its call to its return.
// - one_starts: node (round mod N) starts the round while every other node
//   waits in AwaitRound and joins when the round reaches it (the
//   scheduler's idle nodes); timed on the starter.
// Prints one CSV line per (pattern, nodes, words, wire):
// pattern,nodes,words,wire,fanout,rounds,p50_us,p99_us,mean_us
// (tools/bench/negotiation/run_rounds makes a table of it).
//
// Threads share the machine's cores: with more nodes than cores, rounds
// measure the scheduler of the operating system as much as the wire.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "agent/transport/memory_key_value_store.h"
#include "agent/transport/negotiation_wire.h"
#include "agent/transport/tcp/tcp_transport.h"
#include "gflags/gflags.h"
#include "glog/logging.h"

DEFINE_string(nodes, "2,4,8,16,32", "Node counts, comma-separated");
DEFINE_string(words, "64,4096", "Vector sizes in int64 words");
DEFINE_string(wires, "all_to_all,tree", "Wires: all_to_all and/or tree");
DEFINE_string(patterns, "lockstep,one_starts",
              "Patterns: lockstep and/or one_starts");
DEFINE_int32(fanout, 4, "Children per node of the tree");
DEFINE_int32(rounds, 2000, "Timed rounds per configuration");
DEFINE_int32(warmup, 100, "Untimed rounds first");

namespace baton::agent {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<int> Ints(const std::string& list) {
  std::vector<int> out;
  for (const absl::string_view part : absl::StrSplit(list, ',')) {
    int value = 0;
    if (!absl::SimpleAtoi(part, &value) || value < 1) {
      std::fprintf(stderr, "not a positive number: \"%s\"\n",
                   std::string(part).c_str());
      std::exit(2);
    }
    out.push_back(value);
  }
  return out;
}

std::vector<std::string> Names(const std::string& list) {
  return absl::StrSplit(list, ',');
}

// `nodes` connected wires of `choice`, or an empty vector after printing why.
std::vector<std::unique_ptr<NegotiationWire>> Connect(
    int nodes, const NegotiationChoice& choice,
    std::vector<std::unique_ptr<TcpTransport>>& transports) {
  auto store = std::make_shared<MemoryKeyValueStore>();
  std::vector<std::unique_ptr<NegotiationWire>> wires(nodes);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < nodes; ++rank) {
    threads.emplace_back([&, rank] {
      ConnectRequest request;
      request.node_rank = rank;
      request.num_nodes = nodes;
      request.prefix = "bench/rounds";
      request.store = store;
      request.timeout = std::chrono::seconds(60);
      request.secret = std::string(32, 'b');
      request.negotiation = choice;
      auto wire = transports[rank]->ConnectNegotiation(request);
      if (!wire.ok()) {
        std::fprintf(stderr, "node %d: %s\n", rank,
                     wire.status().ToString().c_str());
        return;
      }
      wires[rank] = std::move(wire).value();
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const auto& wire : wires) {
    if (wire == nullptr) return {};
  }
  return wires;
}

// One configuration; the latencies of the timed rounds in microseconds.
std::vector<double> Run(std::vector<std::unique_ptr<NegotiationWire>>& wires,
                        size_t words, bool lockstep) {
  const int nodes = static_cast<int>(wires.size());
  const int total = FLAGS_warmup + FLAGS_rounds;
  std::vector<double> latencies;
  latencies.reserve(FLAGS_rounds);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < nodes; ++rank) {
    threads.emplace_back([&, rank] {
      NegotiationWire& wire = *wires[rank];
      std::vector<int64_t> data(words);
      const CollectiveOptions options{std::chrono::seconds(60), 0};
      for (int round = 0; round < total; ++round) {
        const bool starts = lockstep ? rank == 0 : round % nodes == rank;
        if (!lockstep && !starts) {
          const absl::StatusOr<bool> started = wire.AwaitRound(words);
          if (!started.ok() || !*started) {
            std::fprintf(stderr, "node %d: wait: %s\n", rank,
                         started.status().ToString().c_str());
            std::exit(1);
          }
        }
        for (size_t i = 0; i < words; ++i) {
          data[i] = static_cast<int64_t>((i + rank + round) % 97);
        }
        const auto start = Clock::now();
        const absl::Status status =
            wire.ExchangeMin(data.data(), words, options);
        const auto took = Clock::now() - start;
        if (!status.ok()) {
          std::fprintf(stderr, "node %d: %s\n", rank,
                       status.ToString().c_str());
          std::exit(1);
        }
        if (starts && round >= FLAGS_warmup) {
          latencies.push_back(
              std::chrono::duration<double, std::micro>(took).count());
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  return latencies;
}

double Percentile(std::vector<double> values, double p) {
  std::sort(values.begin(), values.end());
  const size_t index = std::min(
      values.size() - 1, static_cast<size_t>(p * (values.size() - 1) + 0.5));
  return values[index];
}

int Main() {
  const std::vector<int> node_counts = Ints(FLAGS_nodes);
  const std::vector<int> sizes = Ints(FLAGS_words);
  int most = 0;
  for (const int n : node_counts) most = std::max(most, n);
  std::vector<std::unique_ptr<TcpTransport>> transports;
  for (int rank = 0; rank < most; ++rank) {
    auto transport = TcpTransport::Create("127.0.0.1");
    if (!transport.ok()) {
      std::fprintf(stderr, "%s\n", transport.status().ToString().c_str());
      return 1;
    }
    transports.push_back(std::move(transport).value());
  }
  std::printf("pattern,nodes,words,wire,fanout,rounds,p50_us,p99_us,mean_us\n");
  for (const std::string& pattern : Names(FLAGS_patterns)) {
    for (const int nodes : node_counts) {
      for (const int words : sizes) {
        for (const std::string& name : Names(FLAGS_wires)) {
          NegotiationChoice choice;
          absl::StatusOr<NegotiationChoice::Wire> wire =
              NegotiationChoice::ParseWire(name);
          if (!wire.ok() || *wire == NegotiationChoice::Wire::kAuto) {
            std::fprintf(stderr, "--wires: \"%s\"\n", name.c_str());
            return 2;
          }
          choice.wire = *wire;
          choice.fanout = FLAGS_fanout;
          std::vector<std::unique_ptr<NegotiationWire>> wires =
              Connect(nodes, choice, transports);
          if (wires.empty()) return 1;
          const std::vector<double> latencies =
              Run(wires, static_cast<size_t>(words), pattern == "lockstep");
          double sum = 0;
          for (const double l : latencies) sum += l;
          std::printf(
              "%s,%d,%d,%s,%d,%zu,%.1f,%.1f,%.1f\n", pattern.c_str(), nodes,
              words, name.c_str(),
              choice.wire == NegotiationChoice::Wire::kTree ? FLAGS_fanout : 0,
              latencies.size(), Percentile(latencies, 0.5),
              Percentile(latencies, 0.99), sum / latencies.size());
          std::fflush(stdout);
        }
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace baton::agent

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "baton-bench-negotiation-rounds: round latency of the all-to-all and "
      "tree negotiation wires on loopback");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  FLAGS_minloglevel = google::GLOG_WARNING;  // no line per connect
  return baton::agent::Main();
}
