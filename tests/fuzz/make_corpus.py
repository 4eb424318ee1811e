#!/usr/bin/python3
"""Writes the fuzz targets' seed corpora (tests/fuzz/corpus/<target>/).

Each seed is an input that reaches a deep state the fuzzer would take long to
find on its own: a sealed job with a plan and reports, a restart with every
member rejoining, a re-form after a lost node, an elastic join, authentic
introductions under the targets' fixed secret, attached trainers with
declared tensors and ring entries. The input formats are described at the
top of each target's source. Protobuf messages are encoded with protoc from
text format, so the script needs nothing beyond Debian's protoc.

    tests/fuzz/make_corpus.py        rewrites every seed it owns (seed-*)

Inputs the fuzzer found and that are kept (crashes turned regression tests,
see docs/fuzzing.md) have other names and are left alone.
"""
import hashlib
import hmac
import os
import struct
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus")
PROTOS = os.path.join(ROOT, "protos")


def encode(message_type, proto, text):
    """The wire bytes of `text` (protobuf text format) as baton.v1.<type>."""
    return subprocess.run(
        ["protoc", "-I", PROTOS, "--encode=baton.v1." + message_type, proto],
        input=text.encode(), stdout=subprocess.PIPE, check=True).stdout


def write(target, name, data):
    directory = os.path.join(CORPUS, target)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "seed-" + name), "wb") as f:
        f.write(bytes(data))


# --- coordinator_fuzz: a script of actions (tests/fuzz/coordinator_fuzz.cc).
CONNECT, JOIN, REJOIN, LEAVE, HEARTBEAT, MANIFEST, REPORT, ADMIT, TIMELINE, \
    CLOSE, TICK, STORE, STATUS, RESTART = range(14)


def connect(agent, mode=0):
    return [CONNECT, agent, mode]


def join(agent, job, local_size, expected, min_nodes=0, partition=0):
    # port bit, local_size-1, expected-1, min_nodes, partition index,
    # last_generation bit
    return [JOIN, agent, job, 0, local_size - 1, expected - 1, min_nodes,
            partition, 0]


def rejoin(agent, job):
    return [REJOIN, agent, job]


def leave(agent, job, finished):
    return [LEAVE, agent, job, 1, 1 if finished else 0, 0 if finished else 1]


def manifest(agent, job, tensors):
    """tensors: (table byte, first dim - 1[, second dim - 1])."""
    out = [MANIFEST, agent, job, 1, len(tensors)]
    for t in tensors:
        out += list(t)
    return out


def report(agent, job, ranks, advance=1):
    out = [REPORT, agent, job, 1, 1]  # current generation, own ranks
    for _ in range(ranks):
        out += [advance, 1]
    out += [1, 0, 0, 1, 10, 0]  # one pending tensor
    out += [2, 0, 1, 1]  # stats
    out += [1, 0, 3, 100, 0, 200, 0]  # one latency
    return out


def timeline_reply(agent, partitions):
    out = [TIMELINE, agent, 0, partitions]
    for p in range(partitions):
        # tensor id, name, step, partitions - 1, partition, bytes (2),
        # submitted (2), done (3), ok
        out += [1, 1, p, 1, p, 0, 4, 1, 0, 9, 0, 0, 1]
    return out + [0]


def tick(seconds=0, heartbeat=True):
    if seconds == 0:
        return [TICK, 3 | (0 if heartbeat else 4)]
    return [TICK, 2 | (0 if heartbeat else 4), seconds]


def store(kind, job, agent, *args):
    return [STORE, kind, job, agent, 1] + list(args)


def status(job, kind, *args):
    return [STATUS, job, kind] + list(args)


TENSORS = [(0x00, 63), (0x25, 15, 3), (0x42, 7)]


def sealed_pair():
    """n0 and n1 join j0 (two trainers each) and exchange manifests."""
    s = connect(0) + connect(1)
    s += join(0, 0, 2, 2) + join(1, 0, 2, 2)
    s += tick()
    s += manifest(0, 0, TENSORS) + manifest(1, 0, TENSORS)
    s += report(0, 0, 2) + report(1, 0, 2)
    return s


def coordinator_seeds():
    s = sealed_pair()
    write("coordinator_fuzz", "seal", s + status(0, 0) + status(0, 2))
    write("coordinator_fuzz", "store",
          s + store(0, 0, 0, 0, 2, 7, 7) + store(1, 0, 1, 0, 1, 0, 1, 2)
          + store(2, 0, 0, 1, 5) + store(1, 0, 1, 2, 2, 3, 2, 0, 1) + tick(2))
    write("coordinator_fuzz", "restart",
          s + report(0, 0, 2) + report(1, 0, 2) + [RESTART]
          + report(0, 0, 2) + report(1, 0, 2) + status(0, 1))
    write("coordinator_fuzz", "timeline",
          s + status(0, 3, 0, 2) + timeline_reply(0, 2) + timeline_reply(1, 0)
          + tick(4))
    # Three nodes, min 2: n2's session ends, the job re-forms with n0, n1;
    # n2 comes back and waits for a commit, which n0 admits.
    t = connect(0) + connect(1) + connect(2)
    for a in range(3):
        t += join(a, 1, 1, 3, 2)
    t += manifest(0, 1, TENSORS[:1]) + manifest(1, 1, TENSORS[:1])
    t += manifest(2, 1, TENSORS[:1])
    t += [CLOSE, 2, 0] + tick()
    write("coordinator_fuzz", "reform", t + report(0, 1, 1) + status(1, 1))
    t += connect(2) + join(2, 1, 1, 3, 2) + [ADMIT, 0, 1, 1] + tick()
    write("coordinator_fuzz", "grow", t + report(0, 1, 1) + [RESTART]
          + report(2, 1, 1))
    # Liveness: nobody heartbeats for 8 s.
    write("coordinator_fuzz", "silence", s + tick(8, heartbeat=False)
          + connect(0) + rejoin(0, 0) + tick(70))
    # Every node finishes; n0 joins the name's next run while n1 finishes.
    f = s + leave(0, 0, True) + join(0, 0, 2, 2) + leave(1, 0, True)
    write("coordinator_fuzz", "finish", f + connect(1) + join(1, 0, 2, 2)
          + status(0, 0))
    # A node reconnects with a new session (the old one left open) and
    # rejoins; another agent restarts (a new instance) and joins again.
    write("coordinator_fuzz", "reconnect", s + connect(0, 0) + rejoin(0, 0)
          + connect(1, 3) + join(1, 0, 2, 2) + tick(1))
    # Disagreeing manifests, and a join that disagrees with the job.
    m = connect(0) + connect(1) + join(0, 0, 2, 2) + join(1, 0, 2, 2)
    write("coordinator_fuzz", "mismatch",
          m + manifest(0, 0, TENSORS) + manifest(1, 0, [(0x04, 63)])
          + connect(2) + join(2, 0, 1, 3) + status(0, 2))


# --- proto_fuzz: a type byte, then the message (tests/fuzz/proto_fuzz.cc).
def proto_seeds():
    c, r, s = "baton/v1/coordinator.proto", "baton/v1/rendezvous.proto", \
        "baton/v1/status.proto"
    agent = {
        "heartbeat": "seq: 9 heartbeat { sent_unix_us: 5 }",
        "report": "seq: 9 step_report { job: 'j0' generation: 1 "
                  "ranks { rank: 0 completed_step: 3 submitted_step: 4 } "
                  "ranks { rank: 1 completed_step: 3 } "
                  "pending { tensor_id: 1 step: 4 submitted_ranks: 0 waiting_ms: 20000 } "
                  "stats { queue_depth: 2 tensor_latencies { tensor_id: 1 count: 2 mean_us: 5 } } }",
        "manifest": "seq: 9 manifest { job: 'j0' generation: 1 tensors { name: 'w' "
                    "dtype: DATA_TYPE_FLOAT32 shape: 1024 op: COLLECTIVE_OP_PUSH_PULL } "
                    "tensors { name: 'b' dtype: DATA_TYPE_FLOAT16 shape: [2, 3] "
                    "op: COLLECTIVE_OP_BROADCAST } }",
        "leave": "seq: 9 leave { job: 'j0' generation: 1 reason: 'crash' }",
        "join": "seq: 9 join { job: 'j1' data_address: 'n0.example:7000' "
                "local_size: 1 expected_nodes: 2 min_nodes: 1 partition_bytes: 64 }",
        "rejoin": "seq: 9 rejoin { membership { job: 'j0' generation: 1 world_size: 4 "
                  "nodes { node_name: 'n0' data_address: 'n0.example:7000' node_rank: 0 "
                  "local_size: 2 } nodes { node_name: 'n1' data_address: 'n1.example:7000' "
                  "node_rank: 1 local_size: 2 rank_offset: 2 } "
                  "store_prefix: 'baton/j0/1/' data_plane_secret: "
                  "'0123456789abcdef0123456789abcdef' } completed_step: 2 "
                  "expected_nodes: 2 }",
        "admit": "seq: 9 admit_joins { job: 'j0' generation: 1 }",
        "timeline": "seq: 9 timeline_reply { request_id: 1 job: 'j0' partitions { "
                    "tensor_id: 1 tensor: 'w' step: 2 num_partitions: 2 done_us: 9 ok: true } }",
    }
    for name, text in agent.items():
        write("proto_fuzz", "agent-" + name, [0] + list(encode("AgentMessage", c, text)))
    write("proto_fuzz", "first-hello", [1] + list(encode(
        "AgentMessage", c, "seq: 1 hello { node_name: 'n2' agent_instance: 'i-n2' "
        "agent_version: 'v' }")))
    write("proto_fuzz", "store-set", [2] + list(encode(
        "StoreSetRequest", r, "scope { job: 'j0' generation: 1 } key: 'a' value: 'xyz'")))
    write("proto_fuzz", "store-get", [3] + list(encode(
        "StoreGetRequest", r, "scope { job: 'j0' generation: 1 } keys: 'k' keys: 'a' "
        "wait_timeout_ms: 100")))
    write("proto_fuzz", "store-add", [4] + list(encode(
        "StoreAddRequest", r, "scope { job: 'j0' generation: 1 } key: 'c' delta: 3")))
    write("proto_fuzz", "list-jobs", [5])
    write("proto_fuzz", "get-job", [6] + list(encode("GetJobRequest", s, "job: 'j0'")))
    write("proto_fuzz", "timeline", [7] + list(encode(
        "GetTimelineRequest", s, "job: 'j0' first_step: 1 last_step: 5")))


# --- introduction_fuzz (tests/fuzz/introduction_fuzz.cc).
PREFIX = b"baton/j0/1/negotiation"
SECRET = bytes(range(1, 33))


def prefix_hash(prefix):
    h = 0xcbf29ce484222325
    for c in prefix:
        h ^= c
        h = (h * 0x100000001b3) & 0xffffffffffffffff
    return h


def mac(tag, rank, link_id):
    data = tag + PREFIX + struct.pack(">IQ", rank & 0xffffffff, link_id)
    return hmac.new(SECRET, data, hashlib.sha256).digest()


def introduction_seeds():
    for rank, link in [(1, 0x1234), (7, 0xfeedfacecafebeef)]:
        intro = b"BRN2" + struct.pack(">IQQ", rank, prefix_hash(PREFIX), link) \
            + mac(b"baton/intro/v1", rank, link)
        write("introduction_fuzz", "intro-%d" % rank, [0] + list(intro))
        reply = b"BRNA" + mac(b"baton/accept/v1", rank, link)
        write("introduction_fuzz", "reply-%d" % rank,
              [1] + list(struct.pack("<iQ", rank, link)) + list(reply))
    write("introduction_fuzz", "intro-other-prefix",
          [0] + list(b"BRN2" + struct.pack(">IQQ", 2, 99, 5) + bytes(32)))
    for i, text in enumerate([b"10.0.0.1 4242", b"::1 65535 1f:0 abc:123456",
                              b"host 80 ffffffffffffffff:18446744073709551615"]):
        write("introduction_fuzz", "publication-%d" % i, [2] + list(text))
    write("introduction_fuzz", "round-trip",
          [3] + list(struct.pack("<iQ", 3, 77)) + [len(PREFIX)] + list(PREFIX)
          + [32] + list(SECRET) + [30, 1])


# --- trainer_protocol_fuzz (tests/fuzz/trainer_protocol_fuzz.cc).
def request(stream, text):
    body = encode("TrainerRequest", "baton/v1/trainer.proto", text)
    return [0, stream] + list(struct.pack("<H", len(body))) + list(body)


def ring(stream, mode, head, tail, entries):
    out = [1, stream, mode] + list(struct.pack("<QQ", head, tail)) + [len(entries)]
    for index, flags, step, value, generation in entries:
        out += list(struct.pack("<iiqqq", index, flags, step, value, generation))
    return out


def trainer_seeds():
    attach = ("seq: 1 attach { job: 'j' local_rank: %d local_size: 2 expected_nodes: 2 "
              "partition_bytes: 64 scheduling: 'fifo' pid: 7 }")
    declare = ("seq: 2 declare { tensors { name: 'w' dtype: DATA_TYPE_FLOAT32 shape: [16, 4] "
               "op: COLLECTIVE_OP_PUSH_PULL } tensors { name: 'b' dtype: DATA_TYPE_INT64 "
               "shape: 8 op: COLLECTIVE_OP_BROADCAST } }")
    s = [4]  # world size 4
    s += request(0, attach % 0) + request(1, attach % 1)
    s += request(0, declare) + request(1, declare)
    write("trainer_protocol_fuzz", "declared", s)
    e = s + request(0, "seq: 3 enqueue { index: 0 step: 0 average: true }")
    e += request(1, "seq: 3 enqueue { index: 0 step: 0 average: true }")
    e += request(0, "seq: 4 enqueue { index: 1 step: 0 root_rank: 3 generation: 1 }")
    write("trainer_protocol_fuzz", "enqueued", e)
    write("trainer_protocol_fuzz", "ring-push",
          s + ring(0, 1, 0, 0, [(0, 1, 0, 0, 0), (1, 0, 0, 2, 0)])
          + ring(1, 1, 0, 0, [(0, 1, 0, 0, 0)]) + [2])
    write("trainer_protocol_fuzz", "ring-raw",
          s + ring(0, 0, 1020, 1026, [(0, 0, 1, 0, 0), (0, 0, 2, 0, 0)]))
    write("trainer_protocol_fuzz", "detach",
          s + request(0, "seq: 5 detach { finished: true }")
          + request(1, "seq: 5 detach { reason: 'crash' }")
          + request(2, attach % 1) + request(2, declare))
    write("trainer_protocol_fuzz", "bad-attach",
          [0] + request(0, "seq: 1 attach { job: 'j' local_rank: 3 local_size: 2 "
                        "expected_nodes: 1 }")
          + request(1, "seq: 1 declare { }"))


def main():
    coordinator_seeds()
    proto_seeds()
    introduction_seeds()
    trainer_seeds()
    return 0


if __name__ == "__main__":
    sys.exit(main())
