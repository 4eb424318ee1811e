#!/usr/bin/python3
"""The trainer of elastic_test.py: a small deterministic model trained under
baton.torch.elastic, one trainer per node (batonrun --procs-per-node 1).

Every rank's batch is a function of (step, rank, size) only, and the model
has one parameter tensor (one push-pull per step, always partitioned the
same way with BATON_PARTITION_BYTES fixed and partition tuning off), so a
run from a given state with a given world size gives the same bits
whatever happened before: the test compares an elastic run with an
undisturbed one started from the state the elastic run last synchronized.

Environment (set by elastic_test.py):
  ELASTIC_OUT      directory for what the test checks
  ELASTIC_STEPS    steps in all
  ELASTIC_KILL     "NODE:STEP": in its first life, the trainer of node NODE
                   kills its agent and then itself (SIGKILL) after STEP
  ELASTIC_KILL_AGENT  "0": the trainer kills only itself (its agent stays)
  ELASTIC_FREEZE   "NODE:STEP:SECONDS": in its first life, the trainer of
                   node NODE stops its agent and then itself (SIGSTOP) after
                   STEP, and a process it started beforehand continues both
                   (SIGCONT) SECONDS later: a node frozen by the kernel
  ELASTIC_FREEZE_WHAT  "coordinator": that trainer freezes the coordinator
                   instead (default "node": its agent and itself)
  ELASTIC_WRAP     NODE: that node's rank runs the trainer as a child and
                   starts it again once killed (the trainer-only case)
  ELASTIC_WAIT     "SIZE:STEP": at STEP, a rank of a job smaller than SIZE
                   waits (bounded) until the job re-forms (a node joined)
  ELASTIC_RESUME   a state file to start from (the undisturbed run)
  ELASTIC_STEP_SECONDS  compute time of a step (a sleep), 0 by default
"""

import faulthandler
import os
import signal
import subprocess
import sys
import time

import torch

import baton.torch as bt
import baton.torch.elastic as elastic

FEATURES, OUTPUTS, BATCH = 24, 8, 16
COMMIT_EVERY = int(os.environ.get("ELASTIC_COMMIT_EVERY", "4"))
WAIT_FOR = 120.0  # never reached when things work
# Compute time a step takes besides its communication.
STEP_SECONDS = float(os.environ.get("ELASTIC_STEP_SECONDS", "0"))


def batch(step, rank, size):
    g = torch.Generator().manual_seed(1000003 * step + 7919 * rank + size)
    x = torch.randn(BATCH, FEATURES, generator=g, dtype=torch.float64)
    y = torch.randn(BATCH, OUTPUTS, generator=g, dtype=torch.float64)
    return x, y


def node_of(socket):
    """"3" for batonrun's .../agent3.sock."""
    return os.path.basename(socket).replace("agent", "").replace(".sock", "")


def processes():
    """(pid, argv, parent pid) of every process this one can see."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % entry, "rb") as f:
                argv = f.read().split(b"\0")
            with open("/proc/%s/stat" % entry) as f:
                parent = int(f.read().rsplit(") ", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        yield int(entry), argv, parent


def coordinator_pid():
    """The job's baton-coordinator (batonrun's embedded one: the only one
    whose parent is this trainer's batonrun)."""
    for pid, argv, parent in processes():
        if argv[0].endswith(b"baton-coordinator") and parent == os.getppid():
            return pid
    raise RuntimeError("no baton-coordinator beside this trainer")


def agent_pid(socket):
    """The baton-agent serving `socket` (its command line names it)."""
    for pid, argv, _ in processes():
        if argv[0].endswith(b"baton-agent") and ("--socket=" + socket).encode() in argv:
            return pid
    raise RuntimeError("no baton-agent serves %s" % socket)


def freeze(pids, seconds):
    """Has a process in a session of its own (so that nothing stops it with
    us) stop `pids` (SIGSTOP) a moment from now, while this one goes on
    training (mid-step, as an operator's or the kernel's freeze comes), and
    continue them `seconds` later."""
    listed = " ".join(str(p) for p in pids)
    subprocess.Popen(
        ["/bin/sh", "-c", "sleep 0.02; kill -STOP %s; sleep %s; kill -CONT %s" % (listed, seconds, listed)],
        start_new_session=True,
    )


def wrapper():
    """Node ELASTIC_WRAP's rank under batonrun: runs the trainer as a child
    and starts it again once it was killed, so the node's agent stays and
    only its trainer is replaced (batonrun starts each trainer once)."""
    env = dict(os.environ)
    del env["ELASTIC_WRAP"]
    first = subprocess.run([sys.executable, __file__], env=env, timeout=600)
    if first.returncode != -signal.SIGKILL:
        return first.returncode
    return subprocess.run([sys.executable, __file__], env=env, timeout=600).returncode


def main():
    # A hung run's stacks: kill -USR1 the trainer.
    faulthandler.register(signal.SIGUSR1)
    torch.set_num_threads(1)
    out = os.environ["ELASTIC_OUT"]
    steps = int(os.environ["ELASTIC_STEPS"])
    kill_node, kill_step = os.environ.get("ELASTIC_KILL", ":-1").split(":")
    freeze_node, freeze_step, freeze_seconds = os.environ.get("ELASTIC_FREEZE", ":-1:0").split(":")
    wait_size, wait_step = (int(v) for v in os.environ.get("ELASTIC_WAIT", "0:-1").split(":"))
    socket = os.environ["BATON_AGENT_SOCKET"]
    node = node_of(socket)
    first_life = not os.path.exists(os.path.join(out, "killed"))

    bt.init()
    with open(os.path.join(out, "pid.%d" % os.getpid()), "w") as f:
        f.write(node)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, OUTPUTS, bias=False), torch.nn.Tanh()).double()
    torch.manual_seed(1 + bt.rank())  # different on every rank: sync must fix it
    with torch.no_grad():
        model[0].weight.normal_()
    optimizer = bt.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
        named_parameters=model.named_parameters(),
    )
    state = elastic.State(model=model, optimizer=optimizer, step=0)
    resume = os.environ.get("ELASTIC_RESUME")
    if resume:
        saved = torch.load(resume)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        state.step = saved["step"]
    sizes = []

    def record_sync():
        sizes.append(bt.size())
        if bt.rank() == 0 and not resume:
            torch.save(
                {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": state.step,
                 "size": bt.size()},
                os.path.join(out, "sync.%d.pt" % len(sizes)),
            )

    state.register_reset_callbacks([record_sync])

    @elastic.run
    def train(state):
        if not sizes:
            record_sync()
        while state.step < steps:
            if state.step == wait_step and bt.size() < wait_size:
                deadline = time.monotonic() + WAIT_FOR
                while time.monotonic() < deadline:
                    state.check_reform()
                    time.sleep(0.05)
                raise RuntimeError("no node joined within %.0f s" % WAIT_FOR)
            x, y = batch(state.step, bt.rank(), bt.size())
            time.sleep(STEP_SECONDS)
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            state.step += 1
            if first_life and node == kill_node and state.step == int(kill_step):
                open(os.path.join(out, "killed"), "w").close()
                if os.environ.get("ELASTIC_KILL_AGENT", "1") == "1":
                    os.kill(agent_pid(socket), signal.SIGKILL)
                os.kill(os.getpid(), signal.SIGKILL)
            frozen = os.path.join(out, "frozen")
            if node == freeze_node and state.step == int(freeze_step) and not os.path.exists(frozen):
                open(frozen, "w").close()
                what = os.environ.get("ELASTIC_FREEZE_WHAT", "node")
                freeze([coordinator_pid()] if what == "coordinator" else [agent_pid(socket), os.getpid()],
                       freeze_seconds)
            if state.step % COMMIT_EVERY == 0:
                state.commit()

    train(state)
    torch.save(
        {"model": model.state_dict(), "sizes": sizes, "rank": bt.rank(), "node": node},
        os.path.join(out, "final.%s.%d.pt" % ("resumed" if resume else "elastic", bt.rank())),
    )
    bt.shutdown()
    return 0


if __name__ == "__main__":
    wrapped = os.environ.get("ELASTIC_WRAP") == node_of(os.environ["BATON_AGENT_SOCKET"])
    sys.exit(wrapper() if wrapped else main())
