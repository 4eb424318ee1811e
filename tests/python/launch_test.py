#!/usr/bin/python3
"""Any script starts under baton's launch paths (issue 34, part 1): the
trainers (launch_trainer.py) are scripts as users write them, and the test
checks each one's exit and what it printed. One scenario per run (the
argument), so that ctest runs them as separate tests:

  plain      batonrun --nodes 2 --procs-per-node 2, a DDP script over gloo
             with no baton in it; every rank ends 0
  ddp_first  the same with a script that calls init_process_group("gloo")
             first (batonrun starts every node at once, so it finds its
             peers), then bt.init() and baton's DDP comm hook: baton's
             ranks are the launcher's, the parameters DDP's over gloo
  uncaught   a script whose gradient hook raises in backward, uncaught, on
             every rank (baton's gradients in shared memory): every trainer
             exits 1 at once, and so does batonrun (torch 1.13 used to wait
             forever at exit freeing the interrupted backward pass)
  baton_lost batonrun --nodes 3 --min-nodes 1, DDP on the "baton" backend:
             the last node's trainer kills itself; the others' backward
             raises, naming the node, long before the group's timeout
  torchrun   a coordinator and two agents running (as the DaemonSet would
             on a cluster), and the ddp_first script started with exactly
             the environment torchrun gives its workers (Debian's torchrun
             fails on Python 3.11 before it starts a worker), node 1's
             trainers before node 0's: GROUP_RANK places the nodes

Every wait is bounded, so that a broken build fails instead of hanging."""

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

BATONRUN = os.environ["BATONRUN"]
BIN = os.path.dirname(BATONRUN)
TRAINER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "launch_trainer.py")
TIMEOUT = 240


def check(condition, what, output):
    if not condition:
        raise AssertionError("%s\n--- output:\n%s" % (what, output))


def expect_ranks(mode, out, world):
    for rank in range(world):
        check("%s ok rank %d of %d" % (mode, rank, world) in out, "rank %d did not finish" % rank, out)


def batonrun(mode):
    done = subprocess.run(
        [BATONRUN, "--nodes", "2", "--procs-per-node", "2", "--job", "launch-" + mode.replace("_", "-"),
         "--", sys.executable, TRAINER, mode],
        capture_output=True, text=True, timeout=TIMEOUT,
    )
    output = done.stdout + done.stderr
    check(done.returncode == 0, "batonrun exited %d" % done.returncode, output)
    expect_ranks(mode, done.stdout, 4)


def test_plain():
    batonrun("plain")


def test_ddp_first():
    batonrun("ddp_first")


def test_uncaught():
    done = subprocess.run(
        [BATONRUN, "--nodes", "2", "--procs-per-node", "1", "--job", "launch-uncaught",
         "--", sys.executable, TRAINER, "hook_error"],
        capture_output=True, text=True, timeout=TIMEOUT,
    )
    output = done.stdout + done.stderr
    check(done.returncode == 1, "batonrun exited %d, not 1" % done.returncode, output)
    check("a user's gradient hook failed" in output, "no trainer reported the hook's error", output)
    check(re.search(r"^batonrun: rank [01] \(pid \d+\) exited with code 1; stopped the others$",
                    done.stderr, re.MULTILINE), "batonrun did not name a rank that exited 1", output)


def test_baton_lost():
    done = subprocess.run(
        [BATONRUN, "--nodes", "3", "--procs-per-node", "1", "--min-nodes", "1", "--job", "launch-baton-lost",
         "--", sys.executable, TRAINER, "baton_lost"],
        capture_output=True, text=True, timeout=TIMEOUT,
    )
    output = done.stdout + done.stderr
    for rank in (0, 1):
        # Bounded far below the group's 60 s timeout: baton's liveness, not
        # the timeout, ended the call.
        found = re.search(r"^\[%d\] baton_lost rank %d: backward raised after ([0-9.]+) s: .*node n3 was lost"
                          % (rank, rank), done.stdout, re.MULTILINE)
        check(found and float(found.group(1)) < 30, "rank %d's backward did not raise naming node n3" % rank, output)
    check(done.returncode == 0, "batonrun exited %d" % done.returncode, output)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ready_line(process, prefix, deadline):
    """The rest of the first line of `process`'s stdout that starts with
    `prefix`; fails at `deadline` (a reader thread waits, so that a process
    that hangs without printing cannot block the test)."""
    found = []

    def read():
        for line in process.stdout:
            if line.startswith(prefix):
                found.append(line[len(prefix):].split()[0])
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(max(0.0, deadline - time.monotonic()))
    if not found:
        raise AssertionError("%s did not print %r within its deadline" % (process.args[0], prefix))
    return found[0]


def test_torchrun():
    workdir = tempfile.mkdtemp(prefix="launch-torchrun-")
    processes = []
    try:
        deadline = time.monotonic() + 30
        coordinator = subprocess.Popen(
            [os.path.join(BIN, "baton-coordinator"), "--listen=127.0.0.1:0"],
            stdout=subprocess.PIPE, stderr=open(os.path.join(workdir, "coordinator.log"), "w"), text=True)
        processes.append(coordinator)
        address = ready_line(coordinator, "baton-coordinator listening on ", deadline)
        sockets = []
        for node in range(2):
            sock = os.path.join(workdir, "agent%d.sock" % node)
            agent = subprocess.Popen(
                [os.path.join(BIN, "baton-agent"), "--coordinator=" + address, "--node=host%d" % node,
                 "--socket=" + sock],
                stdout=subprocess.PIPE, stderr=open(os.path.join(workdir, "agent%d.log" % node), "w"), text=True)
            processes.append(agent)
            ready_line(agent, "baton-agent ", deadline)
            sockets.append(sock)
        master_port = free_port()
        trainers = []
        # Node 1 first: its agent joins first, yet its ranks are 2 and 3.
        for node in (1, 0):
            for local in range(2):
                env = dict(os.environ)
                for name in ("BATON_JOB", "BATON_NODES", "BATON_COORDINATOR"):
                    env.pop(name, None)
                env.update({
                    # What batonrun adds for its trainers; torchrun users set it.
                    "MALLOC_MMAP_THRESHOLD_": "4294967296", "MALLOC_TRIM_THRESHOLD_": "4294967296",
                    "BATON_AGENT_SOCKET": sockets[node],
                    # torchrun's worker environment, as its elastic agent sets it.
                    "RANK": str(2 * node + local), "LOCAL_RANK": str(local), "GROUP_RANK": str(node),
                    "ROLE_RANK": str(2 * node + local), "ROLE_NAME": "default",
                    "LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "4", "ROLE_WORLD_SIZE": "4", "GROUP_WORLD_SIZE": "2",
                    "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master_port),
                    "TORCHELASTIC_RUN_ID": "launch-torchrun", "TORCHELASTIC_RESTART_COUNT": "0",
                    "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_USE_AGENT_STORE": "False",
                })
                trainers.append(subprocess.Popen([sys.executable, TRAINER, "ddp_first"], env=env,
                                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
            time.sleep(1)
        processes += trainers
        output = ""
        codes = []
        for trainer in trainers:
            out, _ = trainer.communicate(timeout=TIMEOUT)
            output += out
            codes.append(trainer.returncode)
        check(codes == [0, 0, 0, 0], "trainers exited %s" % codes, output)
        expect_ranks("ddp_first", output, 4)
    finally:
        for process in reversed(processes):
            if process.poll() is None:
                process.kill()
                process.wait(timeout=30)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) != 2 or "test_" + sys.argv[1] not in globals():
        sys.exit("usage: launch_test.py plain|ddp_first|uncaught|baton_lost|torchrun")
    start = time.monotonic()
    globals()["test_" + sys.argv[1]]()
    print("ok %s (%.1f s)" % (sys.argv[1], time.monotonic() - start))
