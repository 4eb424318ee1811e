#pragma once

#include <cstdint>
#include <string>

#include "agent/bench/negotiation_workload.h"
#include "agent/bench/simulated_network.h"

namespace baton::agent::sim {

// How the nodes exchange their vectors in a round.
enum class RoundProtocol {
  // Today's TcpRounds: a node entering a round (its own news, or the first
  // vector of the round from a peer) encodes and sends its vector to every
  // other node in rank order, reads the N-1 vectors of the others, takes
  // their minimum and decodes. N x (N-1) messages.
  kAllToAll,
  // TcpTreeRounds on the NegotiationTree (root 0, children r * fanout + 1
  // ..): a node entering a round (its own news, or the first word of the
  // round from a neighbour) encodes and sends a join word to its parent and
  // to each child, a leaf its vector with the join to its parent; once its
  // children's vectors are in, a node sends the minimum of theirs and its
  // own to its parent; the root's minimum is the result, which it sends to
  // its children and every node forwards to its own before decoding. Three
  // messages on an edge to a leaf, four on any other.
  kTree,
};

// Which nodes have news and start the rounds.
enum class RoundStarters {
  // The last node (a leaf of the tree, the deepest one): the others join.
  kLeaf,
  // Every node at once.
  kAll,
};

const char* RoundProtocolName(RoundProtocol protocol);
const char* RoundStartersName(RoundStarters starters);

struct SimulationConfig {
  int nodes = 64;
  RoundProtocol protocol = RoundProtocol::kTree;
  int fanout = 4;
  RoundStarters starters = RoundStarters::kLeaf;
  // Rounds one after another: the starters start the next as soon as they
  // decoded (and launched from) the previous one.
  int rounds = 5;
  NetworkProfile network;
  RoundCosts costs;
  WorkloadOptions workload;
};

struct SimulationResult {
  // Round 0, the network idle: from the first node's start (before its
  // encode) to the last node's decode, virtual microseconds.
  double first_round_us = 0;
  // The same for every round, averaged: rounds one after another overlap.
  double mean_round_us = 0;
  // Rounds completed per second of virtual time, one after another (start
  // of round 0 to the last decode of the last round).
  double rounds_per_s = 0;
  // Round 0's messages and the bytes baton writes for them (count words and
  // vectors; not the framing).
  int64_t messages = 0;
  int64_t bytes = 0;
  // Decodes that differed from the first node's of their round, and nodes
  // whose launches (partitions, order, fusion) differ from node 0's: 0 and
  // 0 when every node agreed.
  int64_t outcome_mismatches = 0;
  int64_t launch_mismatches = 0;
  // Agreed tensors and launches on node 0 over all rounds.
  int64_t agreed = 0;
  int64_t launches = 0;
  // Tree: edges from the root to the deepest node; 0 for the all-to-all.
  int depth = 0;
};

// Runs `config.rounds` rounds among `config.nodes` simulated nodes (the real
// negotiation, NegotiationWorkload; the simulated wire, SimulatedNetwork)
// and measures them. CHECK-fails on a configuration it cannot run (fewer
// than 2 nodes, a tree's fanout below 2 or above 64).
SimulationResult Simulate(const SimulationConfig& config);

}  // namespace baton::agent::sim
