#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <queue>
#include <utility>
#include <vector>

namespace baton::agent::sim {

// What one message and one node cost on the simulated network
// (negotiation_sim --help names the flags that set these).
struct NetworkProfile {
  // One way, first bit sent to first bit received.
  double latency_us = 25;
  // Each node's link, in each direction (full duplex).
  double gbit_per_s = 10;
  // Framing each message adds on the wire (Ethernet, IP, TCP headers): only
  // the transfer time counts it, not the bytes reported per round.
  int64_t header_bytes = 66;
  // CPU of the sending and of the receiving thread per message (send(2),
  // poll(2) and recv(2)); the simulation binary measures them on loopback.
  double send_cpu_us = 2;
  double recv_cpu_us = 2;
};

// A message of a negotiation round between two simulated nodes. `payload`
// is shared by every copy of one vector sent (the all-to-all sends the same
// vector N-1 times); null for a wake.
struct SimulatedMessage {
  int from = 0;
  int to = 0;
  int64_t round = 0;
  int kind = 0;
  std::shared_ptr<const std::vector<int64_t>> payload;
  // What baton writes: the count word plus the vector (8 for a wake).
  int64_t bytes = 0;
};

// Receives what the network delivers, on the simulation's one thread.
class SimulatedReceiver {
 public:
  virtual ~SimulatedReceiver() = default;
  // `message` reached its destination's socket at virtual time `now_us`
  // (last bit received); reading it is the receiver's to charge.
  virtual void OnMessage(const SimulatedMessage& message, double now_us) = 0;
  // A timer set with SimulatedNetwork::At fired.
  virtual void OnTimer(int node, int64_t tag, double now_us) = 0;
};

// A discrete-event model of N nodes on one switch, in virtual microseconds
// and on one thread: each node has one thread (a CPU timeline: work queues
// behind earlier work, FIFO) and one full-duplex link. A message leaves its
// sender's link after the sends queued before it (the link serialises at
// gbit_per_s), arrives latency_us later, and is received after the messages
// that reached the destination's link before it. The switch itself never
// queues. Deterministic: ties are broken in the order events were made.
//
// Not thread-safe.
class SimulatedNetwork {
 public:
  SimulatedNetwork(int nodes, NetworkProfile profile,
                   SimulatedReceiver* receiver);

  int nodes() const { return static_cast<int>(cpu_free_.size()); }
  const NetworkProfile& profile() const { return profile_; }

  // `node`'s thread works `cost_us` from `ready_us` or once it is free,
  // whichever is later; returns when the work ends.
  double Compute(int node, double ready_us, double cost_us);
  // The sender's thread spends send_cpu_us handing `message` to its link
  // (from `ready_us`, as Compute); returns when the thread is free again.
  // The receiver's OnMessage runs when the message has been received.
  double Send(double ready_us, SimulatedMessage message);
  // OnTimer(node, tag) at `at_us`.
  void At(int node, int64_t tag, double at_us);

  // Runs events until none is left; returns the last event's time.
  double Run();

  // Messages sent, and their bytes, per round.
  const std::vector<int64_t>& messages_per_round() const {
    return messages_per_round_;
  }
  const std::vector<int64_t>& bytes_per_round() const {
    return bytes_per_round_;
  }

 private:
  enum class EventKind : uint8_t { kLinkFree, kWireArrive, kReceived, kTimer };
  struct Event {
    double time_us;
    uint64_t seq;
    EventKind kind;
    int node;
    // kWireArrive: the message's slot; kTimer: the tag; kLinkFree,
    // kReceived: unused.
    int64_t value;
    bool operator>(const Event& other) const {
      return time_us != other.time_us ? time_us > other.time_us
                                      : seq > other.seq;
    }
  };
  struct InFlight {
    SimulatedMessage message;
    // When the sender's thread handed it to the link, and when the link put
    // its last bit on the wire.
    double handed_us = 0;
    double sent_us = 0;
  };
  // A node's sending link: messages handed over and not yet sent, by slot.
  // One kLinkFree event at a time per busy link keeps the event queue at
  // O(nodes) even when every node hands over N-1 messages at once.
  struct Link {
    std::deque<int64_t> queue;
    double free_us = 0;
    bool armed = false;
  };
  // A node's receiving link: messages being received, by slot, with the
  // time each is complete (in order: the link receives one at a time). One
  // kReceived event at a time per busy link, as for sending: many nodes
  // sending to one at once (the all-to-all's rank order) queue here.
  struct Inbound {
    std::deque<std::pair<double, int64_t>> queue;
    double free_us = 0;
    bool armed = false;
  };

  void Push(double time_us, EventKind kind, int node, int64_t value);
  // The link of `node` puts its next message on the wire at `now_us`.
  void SendNext(int node, double now_us);
  double TransferUs(int64_t bytes) const;

  const NetworkProfile profile_;
  SimulatedReceiver* const receiver_;
  std::vector<double> cpu_free_;
  std::vector<Link> tx_;
  std::vector<Inbound> rx_;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events_;
  uint64_t next_seq_ = 0;
  // Messages on the wire, by slot; free slots are reused.
  std::vector<InFlight> in_flight_;
  std::vector<int64_t> free_slots_;
  std::vector<int64_t> messages_per_round_;
  std::vector<int64_t> bytes_per_round_;
};

}  // namespace baton::agent::sim
