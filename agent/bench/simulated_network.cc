#include "agent/bench/simulated_network.h"

#include <algorithm>
#include <utility>

#include "glog/logging.h"

namespace baton::agent::sim {

SimulatedNetwork::SimulatedNetwork(int nodes, NetworkProfile profile,
                                   SimulatedReceiver* receiver)
    : profile_(profile),
      receiver_(receiver),
      cpu_free_(nodes, 0.0),
      tx_(nodes),
      rx_(nodes) {
  CHECK_GT(nodes, 0);
  CHECK_GT(profile_.gbit_per_s, 0) << "a link needs a positive rate";
  CHECK_GE(profile_.latency_us, 0);
}

double SimulatedNetwork::TransferUs(int64_t bytes) const {
  // Gbit/s is bits per nanosecond: bytes * 8 / rate ns.
  return static_cast<double>(bytes + profile_.header_bytes) * 8.0 /
         (profile_.gbit_per_s * 1e3);
}

double SimulatedNetwork::Compute(int node, double ready_us, double cost_us) {
  double& free = cpu_free_[node];
  free = std::max(free, ready_us) + cost_us;
  return free;
}

double SimulatedNetwork::Send(double ready_us, SimulatedMessage message) {
  const int from = message.from;
  DCHECK_NE(from, message.to);
  const double handed_us = Compute(from, ready_us, profile_.send_cpu_us);
  const size_t round = static_cast<size_t>(message.round);
  if (messages_per_round_.size() <= round) {
    messages_per_round_.resize(round + 1, 0);
    bytes_per_round_.resize(round + 1, 0);
  }
  ++messages_per_round_[round];
  bytes_per_round_[round] += message.bytes;
  int64_t slot;
  if (free_slots_.empty()) {
    slot = static_cast<int64_t>(in_flight_.size());
    in_flight_.emplace_back();
  } else {
    slot = free_slots_.back();
    free_slots_.pop_back();
  }
  in_flight_[slot] = InFlight{std::move(message), handed_us, 0};
  // The link sends in the order the thread handed messages over.
  Link& link = tx_[from];
  link.queue.push_back(slot);
  if (!link.armed) {
    link.armed = true;
    Push(std::max(handed_us, link.free_us), EventKind::kLinkFree, from, 0);
  }
  return handed_us;
}

void SimulatedNetwork::SendNext(int node, double now_us) {
  Link& link = tx_[node];
  const int64_t slot = link.queue.front();
  link.queue.pop_front();
  InFlight& flight = in_flight_[slot];
  link.free_us = now_us + TransferUs(flight.message.bytes);
  flight.sent_us = link.free_us;
  // The destination's link takes messages in the order their first bits
  // arrive; the switch does not queue.
  Push(now_us + profile_.latency_us, EventKind::kWireArrive, flight.message.to,
       slot);
  if (link.queue.empty()) {
    link.armed = false;
  } else {
    Push(std::max(link.free_us, in_flight_[link.queue.front()].handed_us),
         EventKind::kLinkFree, node, 0);
  }
}

void SimulatedNetwork::At(int node, int64_t tag, double at_us) {
  Push(at_us, EventKind::kTimer, node, tag);
}

void SimulatedNetwork::Push(double time_us, EventKind kind, int node,
                            int64_t value) {
  events_.push(Event{time_us, next_seq_++, kind, node, value});
}

double SimulatedNetwork::Run() {
  double now_us = 0;
  while (!events_.empty()) {
    const Event event = events_.top();
    events_.pop();
    now_us = event.time_us;
    switch (event.kind) {
      case EventKind::kLinkFree:
        SendNext(event.node, now_us);
        break;
      case EventKind::kWireArrive: {
        InFlight& flight = in_flight_[event.value];
        // Received at the sender's pace, or after what the destination's
        // link is still receiving, at its own.
        Inbound& in = rx_[event.node];
        in.free_us = std::max(flight.sent_us + profile_.latency_us,
                              in.free_us + TransferUs(flight.message.bytes));
        in.queue.emplace_back(in.free_us, event.value);
        if (!in.armed) {
          in.armed = true;
          Push(in.free_us, EventKind::kReceived, event.node, 0);
        }
        break;
      }
      case EventKind::kReceived: {
        Inbound& in = rx_[event.node];
        const int64_t slot = in.queue.front().second;
        in.queue.pop_front();
        if (in.queue.empty()) {
          in.armed = false;
        } else {
          Push(in.queue.front().first, EventKind::kReceived, event.node, 0);
        }
        SimulatedMessage message = std::move(in_flight_[slot].message);
        free_slots_.push_back(slot);
        receiver_->OnMessage(message, now_us);
        break;
      }
      case EventKind::kTimer:
        receiver_->OnTimer(event.node, event.value, now_us);
        break;
    }
  }
  return now_us;
}

}  // namespace baton::agent::sim
