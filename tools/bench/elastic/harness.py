"""One elastic job under batonrun's embedded cluster, driven from outside:
the shared part of tools/bench/elastic/run and tools/bench/elastic/stress.

ElasticJob starts `batonrun --nodes N --min-nodes M --restarts R` with
trainer.py on every node, stamps each line batonrun prints with the time it
was read, follows the trainers' event files (trainer.py says what they
hold), steers the trainers (plan.json: who dies when; stop.json: the step
every rank ends at) and, at the end, collects what the job left behind. No
wait is unbounded: every wait names what it waited for when it gives up,
and the job is killed (after the trainers were asked for their stacks)
when it does not end in time.
"""

import glob
import json
import os
import re
import shutil
import signal
import subprocess
import threading
import time

PYTHON = "/usr/bin/python3"  # Debian's python3-torch works only there
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
BIN = os.path.join(ROOT, "build", "bin")


class Stuck(Exception):
    """A bounded wait gave up, or the job ended before it should have."""


class Interrupted(Exception):
    """SIGINT or SIGTERM reached the driver: its job is killed, the rest
    skipped."""


def stop_on_signals():
    """SIGINT and SIGTERM raise Interrupted in the driver (batonrun runs in
    a session of its own, so they do not reach it: the driver kills it)."""

    def interrupted(signum, _frame):
        raise Interrupted("received %s" % signal.Signals(signum).name)

    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)


class Life:
    """One trainer process: its node, pid and events so far."""

    def __init__(self, pid, node):
        self.pid = pid
        self.node = node
        self.events = []

    def first(self, event, **match):
        for e in self.events:
            if e["ev"] == event and all(e.get(k) == v for k, v in match.items()):
                return e
        return None

    def last(self, event):
        for e in reversed(self.events):
            if e["ev"] == event:
                return e
        return None

    @property
    def started(self):
        return self.events[0]["t"]

    def alive(self):
        """Not ended, as far as its events say (a killed trainer wrote
        "kill"; one that finished wrote "done")."""
        return not any(e["ev"] in ("kill", "done") for e in self.events)


class ElasticJob:
    def __init__(self, out, job, nodes, min_nodes, restarts, step_ms, coordinator_flags=(), agent_flags=()):
        self.out = out
        self.job = job
        self.nodes = nodes
        self.dir = os.path.join(out, job)
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)
        self.argv = [
            os.path.join(BIN, "batonrun"), "--nodes", str(nodes), "--min-nodes", str(min_nodes),
            "--restarts", str(restarts), "--job", job, "--stop_grace_ms=2000",
        ]
        if coordinator_flags:
            self.argv.append("--coordinator_flags=" + " ".join(coordinator_flags))
        if agent_flags:
            self.argv.append("--agent_flags=" + " ".join(agent_flags))
        self.argv += ["--", PYTHON, os.path.join(HERE, "trainer.py")]
        self.env = dict(os.environ)
        self.env.update({
            "PYTHONPATH": os.path.join(ROOT, "build", "python"),
            "BENCH_DIR": self.dir,
            "BENCH_STEP_MS": str(step_ms),
            "BENCH_BATONCTL": os.path.join(BIN, "batonctl"),
        })
        self.lines = []  # (time read, line) of batonrun's output
        self.lives = {}  # pid -> Life
        self._offsets = {}
        self._plan_id = 0
        self._proc = None
        self._reader = None
        self.rc = None

    # --- running -------------------------------------------------------------

    def start(self):
        with open(os.path.join(self.dir, "command"), "w") as f:
            f.write(" ".join(self.argv) + "\n")
        self._log = open(os.path.join(self.dir, "batonrun.log"), "w", buffering=1)
        self._proc = subprocess.Popen(
            self.argv, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for raw in self._proc.stdout:
            t = time.time()
            line = raw.decode(errors="replace").rstrip("\n")
            self.lines.append((t, line))
            self._log.write("%.3f %s\n" % (t, line))

    def running(self):
        return self._proc is not None and self._proc.poll() is None

    def refresh(self):
        """Reads what the trainers wrote since the last call."""
        for path in glob.glob(os.path.join(self.dir, "events.*.jsonl")):
            with open(path) as f:
                f.seek(self._offsets.get(path, 0))
                chunk = f.read()
            complete = chunk[: chunk.rfind("\n") + 1]
            self._offsets[path] = self._offsets.get(path, 0) + len(complete.encode())
            node, pid = (int(v) for v in os.path.basename(path).split(".")[1:3])
            for line in complete.splitlines():
                self.lives.setdefault(pid, Life(pid, node)).events.append(json.loads(line))

    def wait(self, what, timeout, condition):
        """Polls condition() (after refresh()) until it returns something
        true, which it returns; Stuck naming `what` after `timeout` seconds
        or when batonrun ended meanwhile."""
        deadline = time.monotonic() + timeout
        while True:
            self.refresh()
            value = condition()
            if value:
                return value
            if not self.running():
                raise Stuck("batonrun exited (rc %s) while waiting for %s" % (self._proc.poll(), what))
            if time.monotonic() > deadline:
                raise Stuck("no %s within %.0f s" % (what, timeout))
            time.sleep(0.05)

    # --- what the trainers say ------------------------------------------------

    def current(self):
        """node -> the node's newest trainer process."""
        newest = {}
        for life in self.lives.values():
            if life.node not in newest or life.started > newest[life.node].started:
                newest[life.node] = life
        return newest

    def committed(self, lives, size, since, steps=1):
        """Every one of `lives` committed `steps` steps in a job of `size`
        ranks after time `since`."""
        for life in lives:
            n = sum(1 for e in life.events if e["ev"] == "commit" and e["size"] == size and e["t"] > since)
            if n < steps:
                return False
        return True

    def whole(self, since, steps=1):
        """All nodes' newest trainers committed `steps` steps at full size
        since `since`."""
        newest = self.current()
        return len(newest) == self.nodes and self.committed(newest.values(), self.nodes, since, steps)

    def max_step(self):
        return max((e["step"] for life in self.lives.values() for e in life.events if e["ev"] == "commit"), default=0)

    # --- steering ---------------------------------------------------------------

    def _replace(self, name, value):
        path = os.path.join(self.dir, name)
        with open(path + ".tmp", "w") as f:
            json.dump(value, f)
        os.rename(path + ".tmp", path)

    def plan(self, kills):
        """Tells the trainers who dies when (trainer.py's Killer); returns
        the plan's id."""
        self._plan_id += 1
        for kill in kills:
            kill.setdefault("plan", self._plan_id)
        self._replace("plan.json", {"id": self._plan_id, "kills": kills})
        return self._plan_id

    def stop_at(self, margin_steps):
        """Every rank ends at the same step, `margin_steps` after the
        furthest one seen: far enough that no rank is past it when it reads
        stop.json (ranks are at most a step apart)."""
        step = self.max_step() + margin_steps
        self._replace("stop.json", {"step": step})
        return step

    # --- the end ----------------------------------------------------------------

    def finish(self, timeout):
        """Waits for batonrun to exit (its rc in self.rc). After `timeout`
        seconds: asks the trainers for their stacks (SIGUSR1), kills the
        job and raises Stuck."""
        try:
            self.rc = self._proc.wait(timeout=max(timeout, 0.1))
        except subprocess.TimeoutExpired:
            why = "batonrun did not exit within the %.0f s left of the time limit" % timeout
            self.kill(why)
            raise Stuck("%s (the trainers' stacks are in %s)" % (why, os.path.join(self.dir, "batonrun.log")))
        self._reader.join(timeout=5)
        self.refresh()
        return self.rc

    def kill(self, why):
        """Ends everything this job started: the trainers' stacks first
        (faulthandler, SIGUSR1), then SIGKILL to batonrun's process group
        (its coordinator, agents and trainers)."""
        if not self.running():
            return
        self.refresh()
        self._log.write("%.3f bench: %s; asking the trainers for their stacks, then killing the job\n"
                        % (time.time(), why))
        for life in self.lives.values():
            if life.alive():
                try:
                    os.kill(life.pid, signal.SIGUSR1)
                except ProcessLookupError:
                    pass
        time.sleep(2)
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.rc = self._proc.wait(timeout=30)
        self._reader.join(timeout=5)

    def keep_logs(self):
        """Moves batonrun's directory (coordinator.log, agentK.log; kept
        after a restart or loss, or when the job was killed) into the job's
        directory, as batonrun-logs/."""
        found = set()
        for _, line in self.lines:
            found.update(re.findall(r"(/tmp/batonrun\.[A-Za-z0-9]+)", line))
        for life in self.lives.values():
            socket = life.events[0].get("socket", "") if life.events else ""
            if socket.startswith("/tmp/batonrun."):
                found.add(os.path.dirname(socket))
        for k, path in enumerate(sorted(p for p in found if os.path.isdir(p))):
            shutil.move(path, os.path.join(self.dir, "batonrun-logs" + (".%d" % k if k else "")))

    def status(self):
        """The coordinator's status of the job that rank 0 saved at the end
        (None if it did not)."""
        try:
            with open(os.path.join(self.dir, "status.json")) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def finals(self):
        """rank -> the parameters that rank ended with."""
        import torch

        result = {}
        for path in glob.glob(os.path.join(self.dir, "final.*.pt")):
            result[int(path.split(".")[-2])] = torch.load(path)
        return result


def reform_records(status):
    """The coordinator's re-form records (JobStatus.reforms) in a status
    (`batonctl --json status JOB`), wherever the response nests them."""
    if isinstance(status, dict):
        if "reforms" in status and isinstance(status["reforms"], list):
            return status["reforms"]
        for value in status.values():
            found = reform_records(value)
            if found is not None:
                return found
    elif isinstance(status, list):
        for value in status:
            found = reform_records(value)
            if found is not None:
                return found
    return None


def parameters_identical(finals):
    """None when every rank holds the same bits, else what differs."""
    ranks = sorted(finals)
    if not ranks:
        return "no rank saved its parameters"
    first = finals[ranks[0]]
    for rank in ranks[1:]:
        for name, tensor in first.items():
            other = finals[rank].get(name)
            if other is None or other.shape != tensor.shape:
                return "rank %d has no %s shaped as rank %d's" % (rank, name, ranks[0])
            if other.numpy().tobytes() != tensor.numpy().tobytes():
                return "rank %d's %s differs from rank %d's (max abs difference %g)" % (
                    rank, name, ranks[0], (other - tensor).abs().max().item())
    return None
