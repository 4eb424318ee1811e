// The negotiation rounds at 2 to 4,096 nodes, simulated in one process
// (issue 20): the real Negotiation::Encode, min-combining, Decode and the
// scheduler's launch planning on every simulated node, on a simulated wire
// (NetworkProfile: latency, link rate, each node's link serialising its
// sends and its receives; the CPU per message measured on loopback here),
// for today's all-to-all and the NegotiationTree at several fanouts.
// docs/benchmarks.md, "Negotiation at scale (issue 20)", says what is real
// and what is modelled.
//
// Prints the calibration, a markdown table (one row per protocol, starters
// and node count: round latency, rounds per second one after another,
// messages and bytes per round) and per protocol the fits of the round
// latency against log2(N) and against N. Exits 1 when any node decoded a
// round differently or launched differently from the others.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "agent/bench/negotiation_simulation.h"
#include "gflags/gflags.h"
#include "glog/logging.h"

DEFINE_string(nodes, "2,4,8,16,64,128,256,512,1024,2048,4096",
              "node counts, comma-separated");
DEFINE_string(protocols, "all_to_all,tree", "all_to_all and/or tree");
DEFINE_string(fanouts, "2,4,8", "the tree's fanouts");
DEFINE_string(starters, "leaf,all",
              "who starts the rounds: leaf (the last node) and/or all");
DEFINE_int32(rounds, 5, "rounds one after another per tree setting");
DEFINE_int32(all_to_all_rounds, 2,
             "rounds one after another per all-to-all setting (each is "
             "N x (N-1) messages and vector minima to simulate)");
DEFINE_int32(max_all_to_all_nodes, 4096,
             "larger all-to-all settings are left out (each round is "
             "N x (N-1) messages to simulate)");
DEFINE_double(latency_us, 25, "one-way latency per message");
DEFINE_double(gbit_per_s, 10, "each node's link rate, each direction");
DEFINE_int64(header_bytes, 66, "framing per message on the wire");
DEFINE_double(send_cpu_us, -1,
              "CPU per message sent; negative: measured on loopback TCP");
DEFINE_double(recv_cpu_us, -1,
              "CPU per message received (poll + recv); negative: measured");
DEFINE_double(encode_us, -1,
              "CPU of Negotiation::Encode per node and round; negative: "
              "measured");
DEFINE_double(combine_us, -1,
              "CPU of the minimum of one received vector; negative: measured");
DEFINE_double(decode_us, -1, "CPU of Negotiation::Decode; negative: measured");
DEFINE_double(plan_us, -1,
              "CPU of the launch planning after a round; negative: measured");
DEFINE_bool(calibrate_only, false,
            "print the measured costs as flags for later runs (so that "
            "several runs use the same costs), and exit");
DEFINE_int32(tensors, 161, "tensors in the plan (ResNet-50: 161)");
DEFINE_int32(ready_per_round, 161, "tensors that become ready per round");
DEFINE_int64(straggle_one_in, 0,
             "a node submits a tensor a round late with probability 1/this");
DEFINE_int32(calibration_repeats, 501, "runs of each timed call per batch");
DEFINE_int32(calibration_batches, 9,
             "batches of timed calls; each cost is the lowest batch median "
             "(on a shared machine, the batches that ran undisturbed)");

namespace baton::agent::sim {
namespace {

std::vector<int> ParseInts(const std::string& flag, const std::string& text) {
  std::vector<int> out;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int v = 0;
    if (!absl::SimpleAtoi(part, &v)) {
      LOG(FATAL) << "--" << flag << "=" << text << ": give integers, e.g. 2,4";
    }
    out.push_back(v);
  }
  return out;
}

// Median CPU of send(2), and of poll(2) + recv(2), for one message of
// `bytes` on a loopback TCP connection: what a node's thread spends per
// message of a round.
std::pair<double, double> MeasureSocketCostUs(int64_t bytes, int repeats) {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  PCHECK(listener >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  PCHECK(::bind(listener, reinterpret_cast<sockaddr*>(&addr), len) == 0);
  PCHECK(::listen(listener, 1) == 0);
  PCHECK(::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) ==
         0);
  const int a = ::socket(AF_INET, SOCK_STREAM, 0);
  PCHECK(::connect(a, reinterpret_cast<sockaddr*>(&addr), len) == 0);
  const int b = ::accept(listener, nullptr, nullptr);
  PCHECK(b >= 0);
  const int one = 1;
  ::setsockopt(a, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  std::vector<char> buf(bytes, 1);
  std::vector<double> send_us, recv_us;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    PCHECK(::send(a, buf.data(), buf.size(), 0) == bytes);
    const auto t1 = std::chrono::steady_clock::now();
    pollfd pfd{b, POLLIN, 0};
    PCHECK(::poll(&pfd, 1, 1000) == 1);
    PCHECK(::recv(b, buf.data(), buf.size(), MSG_WAITALL) == bytes);
    const auto t2 = std::chrono::steady_clock::now();
    send_us.push_back(
        std::chrono::duration<double, std::micro>(t1 - t0).count());
    recv_us.push_back(
        std::chrono::duration<double, std::micro>(t2 - t1).count());
  }
  ::close(a);
  ::close(b);
  ::close(listener);
  std::sort(send_us.begin(), send_us.end());
  std::sort(recv_us.begin(), recv_us.end());
  return {send_us[repeats / 2], recv_us[repeats / 2]};
}

// Least squares y = a + b x; returns b and R^2.
std::pair<double, double> Fit(const std::vector<double>& x,
                              const std::vector<double>& y) {
  const double n = static_cast<double>(x.size());
  double sx = 0, sy = 0, sxx = 0, sxy = 0, syy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    sx += x[i];
    sy += y[i];
    sxx += x[i] * x[i];
    sxy += x[i] * y[i];
    syy += y[i] * y[i];
  }
  const double b = (n * sxy - sx * sy) / (n * sxx - sx * sx);
  const double r = (n * sxy - sx * sy) /
                   std::sqrt((n * sxx - sx * sx) * (n * syy - sy * sy));
  return {b, r * r};
}

struct Series {
  std::string name;
  std::vector<double> n, latency;
};

int Main() {
  const std::vector<int> node_counts = ParseInts("nodes", FLAGS_nodes);
  const std::vector<int> fanouts = ParseInts("fanouts", FLAGS_fanouts);
  std::vector<RoundProtocol> protocols;
  for (absl::string_view p : absl::StrSplit(FLAGS_protocols, ',')) {
    if (p == "all_to_all") {
      protocols.push_back(RoundProtocol::kAllToAll);
    } else if (p == "tree") {
      protocols.push_back(RoundProtocol::kTree);
    } else {
      LOG(FATAL) << "--protocols: unknown \"" << p
                 << "\" (give all_to_all and/or tree)";
    }
  }
  std::vector<RoundStarters> starters;
  for (absl::string_view s : absl::StrSplit(FLAGS_starters, ',')) {
    if (s == "leaf") {
      starters.push_back(RoundStarters::kLeaf);
    } else if (s == "all") {
      starters.push_back(RoundStarters::kAll);
    } else {
      LOG(FATAL) << "--starters: unknown \"" << s
                 << "\" (give leaf and/or all)";
    }
  }

  SimulationConfig base;
  base.rounds = FLAGS_rounds;
  base.workload.tensors = FLAGS_tensors;
  base.workload.ready_per_round = FLAGS_ready_per_round;
  base.workload.straggle_one_in = FLAGS_straggle_one_in;
  base.network.latency_us = FLAGS_latency_us;
  base.network.gbit_per_s = FLAGS_gbit_per_s;
  base.network.header_bytes = FLAGS_header_bytes;
  const int64_t message_bytes =
      8 * (1 + static_cast<int64_t>(Negotiation::VectorSize(FLAGS_tensors)));
  const auto given = [](double flag) { return flag >= 0; };
  const bool all_given = given(FLAGS_encode_us) && given(FLAGS_combine_us) &&
                         given(FLAGS_decode_us) && given(FLAGS_plan_us) &&
                         given(FLAGS_send_cpu_us) && given(FLAGS_recv_cpu_us);
  double send_us = 0, recv_us = 0;
  for (int batch = 0;
       !all_given && batch < std::max(1, FLAGS_calibration_batches); ++batch) {
    const RoundCosts costs = NegotiationWorkload::Calibrate(
        base.workload, FLAGS_calibration_repeats);
    const auto [send, recv] =
        MeasureSocketCostUs(message_bytes, FLAGS_calibration_repeats);
    const auto lowest = [batch](double& into, double v) {
      into = batch == 0 ? v : std::min(into, v);
    };
    lowest(base.costs.encode_us, costs.encode_us);
    lowest(base.costs.combine_us, costs.combine_us);
    lowest(base.costs.decode_us, costs.decode_us);
    lowest(base.costs.plan_us, costs.plan_us);
    lowest(send_us, send);
    lowest(recv_us, recv);
  }
  const auto choose = [&](double flag, double measured) {
    return given(flag) ? flag : measured;
  };
  base.costs.encode_us = choose(FLAGS_encode_us, base.costs.encode_us);
  base.costs.combine_us = choose(FLAGS_combine_us, base.costs.combine_us);
  base.costs.decode_us = choose(FLAGS_decode_us, base.costs.decode_us);
  base.costs.plan_us = choose(FLAGS_plan_us, base.costs.plan_us);
  base.network.send_cpu_us = choose(FLAGS_send_cpu_us, send_us);
  base.network.recv_cpu_us = choose(FLAGS_recv_cpu_us, recv_us);
  if (FLAGS_calibrate_only) {
    std::printf(
        "--encode_us=%.3f --combine_us=%.3f --decode_us=%.3f --plan_us=%.3f "
        "--send_cpu_us=%.3f --recv_cpu_us=%.3f\n",
        base.costs.encode_us, base.costs.combine_us, base.costs.decode_us,
        base.costs.plan_us, base.network.send_cpu_us, base.network.recv_cpu_us);
    return 0;
  }

  std::printf(
      "Wire: %.3g us latency, %.3g Gbit/s per link and direction, %lld bytes "
      "of framing per message.\n"
      "Per node (%s): encode %.2f us, combine one vector %.2f us, decode "
      "%.2f us, launch planning %.2f us; per message send %.2f us, "
      "poll+recv %.2f us (loopback TCP). Vector: %d tensors, %lld bytes with "
      "its count word.\n\n",
      FLAGS_latency_us, FLAGS_gbit_per_s,
      static_cast<long long>(FLAGS_header_bytes),
      all_given ? "wall time of the real calls, measured earlier and given as "
                  "flags"
                : "wall time of the real calls on this machine, the lowest "
                  "median of the calibration batches, unless given as flags",
      base.costs.encode_us, base.costs.combine_us, base.costs.decode_us,
      base.costs.plan_us, base.network.send_cpu_us, base.network.recv_cpu_us,
      FLAGS_tensors, static_cast<long long>(message_bytes));
  std::printf(
      "| protocol | started by | N | depth | round latency | latency / "
      "log2(N) | rounds/s one after another | messages/round | bytes/round |\n"
      "|---|---|---:|---:|---:|---:|---:|---:|---:|\n");
  std::fflush(stdout);

  bool consistent = true;
  std::vector<Series> series;
  for (RoundProtocol protocol : protocols) {
    const std::vector<int> protocol_fanouts =
        protocol == RoundProtocol::kTree ? fanouts : std::vector<int>{0};
    for (int fanout : protocol_fanouts) {
      for (RoundStarters who : starters) {
        Series s;
        s.name = protocol == RoundProtocol::kTree
                     ? "tree, fanout " + std::to_string(fanout)
                     : "all-to-all";
        s.name += std::string(", started by ") + RoundStartersName(who);
        for (int nodes : node_counts) {
          if (protocol == RoundProtocol::kAllToAll &&
              nodes > FLAGS_max_all_to_all_nodes) {
            continue;
          }
          SimulationConfig config = base;
          config.nodes = nodes;
          config.protocol = protocol;
          config.fanout = std::max(fanout, 2);
          config.starters = who;
          if (protocol == RoundProtocol::kAllToAll) {
            config.rounds = FLAGS_all_to_all_rounds;
          }
          const SimulationResult r = Simulate(config);
          if (r.outcome_mismatches != 0 || r.launch_mismatches != 0) {
            consistent = false;
            std::fprintf(stderr,
                         "%s, N=%d: %lld decodes differed, %lld nodes "
                         "launched differently\n",
                         s.name.c_str(), nodes,
                         static_cast<long long>(r.outcome_mismatches),
                         static_cast<long long>(r.launch_mismatches));
          }
          const double log2n = std::log2(static_cast<double>(nodes));
          std::printf(
              "| %s | %s | %d | %s | %.0f us | %.1f us | %.0f | %lld | %lld "
              "|\n",
              protocol == RoundProtocol::kTree
                  ? ("tree/" + std::to_string(fanout)).c_str()
                  : "all-to-all",
              RoundStartersName(who), nodes,
              protocol == RoundProtocol::kTree ? std::to_string(r.depth).c_str()
                                               : "1",
              r.first_round_us, r.first_round_us / log2n, r.rounds_per_s,
              static_cast<long long>(r.messages),
              static_cast<long long>(r.bytes));
          std::fflush(stdout);
          if (nodes >= 64) {
            s.n.push_back(nodes);
            s.latency.push_back(r.first_round_us);
          }
        }
        series.push_back(std::move(s));
      }
    }
  }

  std::printf(
      "\nFits of the round latency over N >= 64 (R^2: 1 is a perfect fit):\n\n"
      "| protocol | us per doubling of N | R^2 against log2(N) | us per node "
      "| R^2 against N | latency/log2(N), largest over smallest |\n"
      "|---|---:|---:|---:|---:|---:|\n");
  for (const Series& s : series) {
    if (s.n.size() < 3) continue;
    std::vector<double> log2n, per_log;
    for (size_t i = 0; i < s.n.size(); ++i) {
      log2n.push_back(std::log2(s.n[i]));
      per_log.push_back(s.latency[i] / log2n.back());
    }
    const auto [slope_log, r2_log] = Fit(log2n, s.latency);
    const auto [slope_n, r2_n] = Fit(s.n, s.latency);
    const auto [lo, hi] = std::minmax_element(per_log.begin(), per_log.end());
    std::printf("| %s | %.1f | %.3f | %.3f | %.3f | %.2f |\n", s.name.c_str(),
                slope_log, r2_log, slope_n, r2_n, *hi / *lo);
  }
  if (!consistent) {
    std::fprintf(stderr, "negotiation_sim: nodes disagreed (see above)\n");
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace baton::agent::sim

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "simulates the negotiation rounds at many nodes; see the file comment");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  return baton::agent::sim::Main();
}
