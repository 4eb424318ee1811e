#!/usr/bin/python3
"""One trainer of the elastic benchmarks (tools/bench/elastic/run and
tools/bench/elastic/stress), one per node under `batonrun --min-nodes
--restarts`.

A small MLP on deterministic synthetic data, trained with
baton.torch.elastic and DistributedOptimizer, committing after every step.
It writes what happens to it, with time.time() stamps, to
BENCH_DIR/events.<node>.<pid>.jsonl (one JSON object a line, written as it
happens), so the driver sees the job's progress while it runs and times
every phase of a re-form afterwards:

  start      the process started (before torch is imported)
  init       bt.init() returned: rank, size, generation, the agent's pid
  broadcast  state.sync() (the root's state broadcast) ran from t0 to t
  sync       the training function (re)starts: the rank is synchronized
             in generation `gen` (after the first sync or a re-form)
  commit     state.commit() returned after step `step` in generation `gen`
  fail       the training function stopped with an error (a re-form)
  kill       this trainer kills (or stops) its agent and itself now
  done       trained to the end: rank, size, and state.reforms (each
             re-form this rank went through, with failed_at and synced_at)

The driver steers the trainers through two files, each replaced whole
(written aside and renamed), which every trainer reads when they change:

  BENCH_DIR/plan.json  {"id": N, "kills": [KILL, ...]}: a trainer whose pid
                       is a KILL's "pid" carries it out once; KILL is
                       {"pid", "signal": "KILL"|"STOP", "moment", ...}, where
                       "moment" aims the kill (see Killer below)
  BENCH_DIR/stop.json  {"step": S}: every rank trains until step S and ends

so every rank stops at the same step. At the end each rank saves its
parameters to BENCH_DIR/final.<rank>.pt, and rank 0 saves the coordinator's
status of the job (`batonctl --json status JOB`, with its re-form records)
to BENCH_DIR/status.json before leaving the job.

Environment (set by the driver; batonrun sets BATON_*):
  BENCH_DIR       the directory above
  BENCH_STEP_MS   simulated compute per step, a sleep (default 20): without
                  it 16 trainers and 16 agents on 2 cores do nothing but
                  communicate, and the CPU is the bottleneck of everything
  BENCH_BATONCTL  batonctl, for rank 0's status at the end
  BENCH_MAX_STEPS steps at most, if no stop.json comes (default 100000)
"""

import time

STARTED = time.time()  # before the imports: a restarted trainer's start

import faulthandler  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import traceback  # noqa: E402

import torch  # noqa: E402

import baton.torch as bt  # noqa: E402
import baton.torch.elastic as elastic  # noqa: E402

FEATURES, HIDDEN, OUTPUTS, BATCH = 32, 64, 8, 16


def node_of(socket):
    """3 for batonrun's .../agent3.sock."""
    return int(os.path.basename(socket).replace("agent", "").replace(".sock", ""))


def agent_pid(socket):
    """The baton-agent serving `socket` (its command line names it)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % entry, "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv[0].endswith(b"baton-agent") and ("--socket=" + socket).encode() in argv:
            return int(entry)
    raise RuntimeError("no baton-agent serves %s" % socket)


def batch(step, rank, size):
    g = torch.Generator().manual_seed(1000003 * step + 7919 * rank + size)
    return torch.randn(BATCH, FEATURES, generator=g), torch.randn(BATCH, OUTPUTS, generator=g)


class Events:
    """This life's events file, one JSON object a line, flushed at once."""

    def __init__(self, directory, node):
        self._file = open(os.path.join(directory, "events.%d.%d.jsonl" % (node, os.getpid())), "w", buffering=1)
        self._lock = threading.Lock()

    def write(self, event, t=None, **fields):
        fields = dict(ev=event, t=time.time() if t is None else t, **fields)
        with self._lock:
            self._file.write(json.dumps(fields) + "\n")


class Steering:
    """plan.json and stop.json, read again when they change."""

    def __init__(self, directory, max_steps):
        self._plan_path = os.path.join(directory, "plan.json")
        self._stop_path = os.path.join(directory, "stop.json")
        self._seen = {}
        self.plan_id = 0
        self.kills = []  # this pid's kills of the current plan
        self.stop_step = max_steps

    def _changed(self, path):
        try:
            stamp = os.stat(path).st_mtime_ns
        except FileNotFoundError:
            return None
        if self._seen.get(path) == stamp:
            return None
        self._seen[path] = stamp
        with open(path) as f:
            return json.load(f)

    def poll(self):
        """True when this pid got a new plan."""
        stop = self._changed(self._stop_path)
        if stop is not None:
            self.stop_step = min(self.stop_step, int(stop["step"]))
        plan = self._changed(self._plan_path)
        if plan is None or plan["id"] == self.plan_id:
            return False
        self.plan_id = plan["id"]
        self.kills = [k for k in plan["kills"] if k["pid"] == os.getpid()]
        return bool(self.kills)


class Phases:
    """How long this process's push-pulls (optimizer.step(), which waits
    for them), state broadcasts (state.sync()) and re-forms (failure ->
    synchronized) took lately: a timed kill aims at a fraction of the
    phase's usual length, so that it lands inside it."""

    DEFAULTS = {"push_pull": 0.005, "sync": 0.02, "reform": 0.1}

    def __init__(self):
        self._last = {k: [] for k in self.DEFAULTS}

    def add(self, phase, seconds):
        self._last[phase] = (self._last[phase] + [seconds])[-20:]

    def usual(self, phase):
        last = sorted(self._last[phase])
        return last[len(last) // 2] if last else self.DEFAULTS[phase]


class Killer:
    """Carries out this trainer's kill of the current plan, aimed at a
    moment ("moment" in the plan):

      step       right after the commit of the `after_steps`-th step from
                 now (the benchmark's kill: a clean point between steps)
      commit     at the `after_steps`-th step, right before state.commit()
                 or right after it ("before_commit")
      push_pull  at the `after_steps`-th step, `frac` x the usual
                 optimizer.step() time after backward() returned: the
                 gradients' push-pulls were started during backward and
                 optimizer.step() waits for them
      sync       `frac` x the usual state.sync() time after this rank
                 entered state.sync() for the `nth_sync`-th time from now:
                 during the state broadcast after a re-form
      reform     `frac` x the usual re-form time (failure -> synchronized)
                 after this rank's training function failed: during the
                 re-form

    (The usual times: Phases; before a phase was seen, 5, 20 and 100 ms.)
    Timed kills fire from a thread of their own, started beforehand; the
    kill event then says where the training thread was ("where", in words,
    by LANDMARKS; "stack", its innermost frames), so the driver reports
    where the kill landed, not only where it was aimed. "signal" KILL sends SIGKILL to the agent and then to this
    process; STOP sends SIGSTOP to both (the driver kills them later).
    """

    def __init__(self, events, socket, phases):
        self._events = events
        self._agent = agent_pid(socket)
        self._phases = phases
        self._kill = None
        self._steps_left = 0
        self._syncs_left = 0
        self._main = threading.main_thread().ident
        self._fire_at = None
        self._go = threading.Event()
        threading.Thread(target=self._fire, daemon=True).start()

    @property
    def agent(self):
        return self._agent

    def arm(self, kills):
        self._kill = kills[0]
        self._steps_left = int(self._kill.get("after_steps", 1))
        self._syncs_left = int(self._kill.get("nth_sync", 1))

    def _moment(self, *moments):
        return self._kill is not None and self._kill["moment"] in moments

    def at_backward(self):
        """After backward(): counts the step; a push_pull kill of this step
        is timed from now."""
        if self._moment("push_pull", "commit", "step"):
            self._steps_left -= 1
            if self._steps_left == 0 and self._moment("push_pull"):
                self._timed("push_pull")

    def at_commit(self, before):
        if not self._moment("commit", "step") or self._steps_left > 0:
            return
        if self._moment("step"):
            aimed = not before
        else:
            aimed = before == bool(self._kill.get("before_commit", False))
        if aimed:
            self.die("%s state.commit()" % ("before" if before else "after"))

    def at_sync(self):
        if self._moment("sync"):
            self._syncs_left -= 1
            if self._syncs_left == 0:
                self._timed("sync")

    def at_failure(self):
        if self._moment("reform"):
            self._timed("reform")

    def _timed(self, phase):
        self._delay = float(self._kill.get("frac", 0)) * self._phases.usual(phase)
        self._fire_at = time.monotonic() + self._delay
        self._go.set()

    def _fire(self):
        self._go.wait()
        time.sleep(max(0.0, self._fire_at - time.monotonic()))
        self.die(None)

    # Where the training thread was, by the innermost of these functions
    # on its stack (file, function) -> words.
    LANDMARKS = [
        (("elastic.py", "_quiesce"), "re-form: draining the operations in flight"),
        (("elastic.py", "_wait_for_generation"), "re-form: waiting for the new generation"),
        (("elastic.py", "_agree"), "re-form: agreeing on root and step floor"),
        (("elastic.py", "restore"), "re-form: restoring the commit"),
        (("elastic.py", "sync"), "re-form: state broadcast (state.sync)"),
        (("elastic.py", "_save"), "state snapshot (commit or sync)"),
        (("optimizers.py", "step"), "push_pull: in optimizer.step()"),
        (("optimizer.py", "wrapper"), "push_pull: entering optimizer.step()"),
        (("_tensor.py", "backward"), "backward (push_pulls starting)"),
        (("elastic.py", "commit"), "state.commit()"),
        (("trainer.py", "train"), "training loop (the compute sleep, or between the calls above)"),
    ]

    def _where(self):
        frame = sys._current_frames().get(self._main)
        if frame is None:
            return "?", "?"
        stack = traceback.extract_stack(frame)
        landed = "elsewhere"
        for f in reversed(stack):
            key = (os.path.basename(f.filename), f.name)
            found = [words for mark, words in self.LANDMARKS if mark == key]
            if found:
                landed = found[0]
                break
        return landed, " > ".join("%s:%s" % (os.path.basename(f.filename), f.name) for f in stack[-5:])

    def die(self, where):
        kill, self._kill = self._kill, None
        if kill is None:
            return
        sig = signal.SIGSTOP if kill["signal"] == "STOP" else signal.SIGKILL
        fields = {}
        if where is None:
            fields["delay_ms"] = round(self._delay * 1000.0, 2)
            where, fields["stack"] = self._where()
        self._events.write(
            "kill", plan=kill.get("plan"), moment=kill["moment"], signal=kill["signal"],
            where=where, agent_pid=self._agent, **fields,
        )
        os.kill(self._agent, sig)
        os.kill(os.getpid(), sig)


class BenchState(elastic.State):
    """elastic.State, with a hook where the state broadcast starts, and the
    broadcast's times in the events ("broadcast": from t0 to t)."""

    def __init__(self, on_sync, phases, events, **kwargs):
        super().__init__(**kwargs)
        self._on_sync = on_sync
        self._phases = phases
        self._events = events

    def sync(self, root_rank=0):
        self._on_sync()
        started, t0 = time.monotonic(), time.time()
        super().sync(root_rank)
        self._phases.add("sync", time.monotonic() - started)
        self._events.write("broadcast", t0=t0, root=root_rank)


def status_of_job(batonctl, path):
    """Rank 0, at the end: the coordinator's status of the job (its re-form
    records) while the job still runs."""
    argv = [batonctl, "--coordinator=" + os.environ["BATON_COORDINATOR"], "--json", "status",
            os.environ["BATON_JOB"]]
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        print("trainer: %s did not answer within 20 s" % " ".join(argv), file=sys.stderr)
        return
    if result.returncode != 0:
        print("trainer: %s failed: %s" % (" ".join(argv), result.stderr.strip()), file=sys.stderr)
        return
    with open(path + ".tmp", "w") as f:
        f.write(result.stdout)
    os.rename(path + ".tmp", path)


def main():
    faulthandler.register(signal.SIGUSR1)  # a hung run's stacks: kill -USR1
    torch.set_num_threads(1)
    out = os.environ["BENCH_DIR"]
    step_s = float(os.environ.get("BENCH_STEP_MS", "20")) / 1000.0
    socket = os.environ["BATON_AGENT_SOCKET"]
    node = node_of(socket)
    events = Events(out, node)
    events.write("start", t=STARTED, node=node, pid=os.getpid(), socket=socket)

    bt.init()
    session = bt._require()  # its generation() names the generation in events
    phases = Phases()
    killer = Killer(events, socket, phases)
    events.write("init", rank=bt.rank(), size=bt.size(), gen=session.generation(), agent_pid=killer.agent)
    steering = Steering(out, int(os.environ.get("BENCH_MAX_STEPS", "100000")))

    torch.manual_seed(1 + bt.rank())  # different on every rank: the first sync fixes it
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, OUTPUTS)
    )
    optimizer = bt.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), named_parameters=model.named_parameters()
    )

    def poll():
        if steering.poll():
            killer.arm(steering.kills)

    def on_sync():
        poll()
        killer.at_sync()

    state = BenchState(on_sync, phases, events, model=model, optimizer=optimizer, step=0)

    @elastic.run
    def train(state):
        events.write("sync", gen=state._generation, size=bt.size(), rank=bt.rank(), step=state.step)
        if state.reforms:
            phases.add("reform", state.reforms[-1]["synced_at"] - state.reforms[-1]["failed_at"])
        try:
            while True:
                poll()
                if state.step >= steering.stop_step:
                    return
                time.sleep(step_s)
                x, y = batch(state.step, bt.rank(), bt.size())
                optimizer.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                killer.at_backward()
                started = time.monotonic()
                optimizer.step()
                phases.add("push_pull", time.monotonic() - started)
                state.step += 1
                killer.at_commit(before=True)
                state.commit()
                events.write("commit", step=state.step, gen=state._generation, size=bt.size(), rank=bt.rank())
                killer.at_commit(before=False)
        except BaseException as e:
            events.write("fail", gen=state._generation, error="%s: %s" % (type(e).__name__, e))
            killer.at_failure()
            raise

    train(state)
    rank = bt.rank()
    torch.save({k: v.clone() for k, v in model.state_dict().items()}, os.path.join(out, "final.%d.pt" % rank))
    events.write("done", rank=rank, size=bt.size(), step=state.step, reforms=state.reforms)
    batonctl = os.environ.get("BENCH_BATONCTL")
    if rank == 0 and batonctl:
        status_of_job(batonctl, os.path.join(out, "status.json"))
    bt.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
