"""batonrun's elastic jobs (--min-nodes, --restarts), end to end: runs the
real batonrun with an embedded cluster and elastic_launch_trainer.py as the
trainers, and checks its exit code and what it says. One scenario per run
(the argument), so that ctest runs them as separate tests
(tests/python/CMakeLists.txt):

  restart      3 x 2, --min-nodes 2 --restarts 1: n2 dies once, is
               restarted and rejoins; exit 0
  lost         3 x 1, --min-nodes 2: n3 dies, the others finish; exit 0
               and the node named as lost and not replaced
  below_min    3 x 1, --min-nodes 2: n2 and n3 die; exit 1
  exhausted    2 x 1, --restarts 1 (min nodes = nodes): n2 dies twice, the
               second time with no restart left; exit 1
  interrupted  2 x 1, --restarts 1: SIGTERM to batonrun once it restarts
               n2; exit 128 + SIGTERM, every trainer gone
  early        2 x 1, --min-nodes 1 --restarts 1: n2 ends before the job
               formed, which fails it (the coordinator forms a job with all
               its nodes); exit 1
  usage        flags batonrun refuses; exit 2

No assertion is on time; every wait is bounded (by far) so that a broken
build fails instead of hanging."""

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

BATONRUN = os.environ["BATONRUN"]
TRAINER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "elastic_launch_trainer.py")
RUN_TIMEOUT = 240


class Run:
    """One batonrun, its stderr read as it comes (for `interrupted`)."""

    def __init__(self, scenario, flags, workdir):
        env = dict(os.environ)
        env["ELASTIC_SCENARIO"] = scenario
        env["ELASTIC_DIR"] = workdir
        # These trainers never commit (they are not baton.torch.elastic's):
        # a restarted node is admitted after the coordinator's join wait.
        self.argv = [BATONRUN] + flags + [
            "--job", "elastic-" + scenario, "--coordinator_flags=--join_wait_ms=300",
            "--", sys.executable, TRAINER,
        ]
        self.process = subprocess.Popen(
            self.argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.out = []
        self.err = []
        self.err_seen = threading.Condition()
        self.readers = [
            threading.Thread(target=self._read, args=(self.process.stdout, self.out, sys.stdout)),
            threading.Thread(target=self._read, args=(self.process.stderr, self.err, sys.stderr)),
        ]
        for reader in self.readers:
            reader.start()

    def _read(self, stream, lines, echo):
        for line in stream:
            echo.write(line)
            echo.flush()
            with self.err_seen:
                lines.append(line)
                self.err_seen.notify_all()

    def await_err(self, text, timeout):
        with self.err_seen:
            return self.err_seen.wait_for(lambda: text in "".join(self.err), timeout)

    def wait(self):
        try:
            rc = self.process.wait(timeout=RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise
        for reader in self.readers:
            reader.join(timeout=60)
        return rc, "".join(self.out), "".join(self.err)


def remove_workdir(workdir):
    """Removes the test's directory and batonrun's, which the trainers named
    there."""
    try:
        with open(os.path.join(workdir, "cluster")) as f:
            cluster = f.read()
        if cluster.startswith("/tmp/batonrun."):
            shutil.rmtree(cluster, ignore_errors=True)
    except FileNotFoundError:
        pass
    shutil.rmtree(workdir, ignore_errors=True)


def run(scenario, flags):
    workdir = tempfile.mkdtemp(prefix="elastic-launch-")
    try:
        return Run(scenario, flags, workdir).wait()
    finally:
        remove_workdir(workdir)


def check(condition, what, err):
    if not condition:
        raise AssertionError("%s\n--- batonrun said:\n%s" % (what, err))


def expect(rc, err, code, lines):
    check(rc == code, "batonrun exited %d, not %d" % (rc, code), err)
    for pattern in lines:
        check(re.search(pattern, err, re.MULTILINE), "no line matching %r" % pattern, err)


PID = r"\(pid \d+\)"
KILLED = r"was killed by signal 9 \(Killed\)"


def test_restart():
    rc, out, err = run("restart", ["--nodes", "3", "--procs-per-node", "2", "--min-nodes", "2", "--restarts", "1"])
    expect(rc, err, 0, [
        r"^batonrun: node n2 died: rank 2 %s %s; restarting it \(restart 1 of 1\)$" % (PID, KILLED),
        r"^batonrun: finished on all 3 nodes; restarted n2 1 time; kept the agents' logs in /tmp/batonrun\.",
    ])
    check(err.count("restarting it") == 1, "more than one restart", err)
    for local in (0, 1):
        check(
            re.search(r"^\[node2\.%d restart 1\] I am back as rank \d of 6$" % local, out, re.MULTILINE),
            "the restarted n2.%d did not say it is back" % local, out,
        )
    for rank in (0, 1, 4, 5):
        check("[%d] done" % rank in out, "rank %d did not finish" % rank, out)


def test_lost():
    rc, out, err = run("lost", ["--nodes", "3", "--procs-per-node", "1", "--min-nodes", "2"])
    expect(rc, err, 0, [
        r"^batonrun: node n3 lost: rank 2 %s %s; going on with 2 of 3 nodes \(--min-nodes=2\)$" % (PID, KILLED),
        r"^batonrun: finished on 2 of 3 nodes; lost and not replaced: n3 after rank 2 %s %s; "
        r"kept the agents' logs in /tmp/batonrun\." % (PID, KILLED),
    ])
    for rank in (0, 1):
        check("[%d] done" % rank in out, "rank %d did not finish" % rank, out)


def test_below_min():
    rc, out, err = run("below_min", ["--nodes", "3", "--procs-per-node", "1", "--min-nodes", "2"])
    # n2 and n3 die in either order: the first is lost, the second ends it.
    expect(rc, err, 1, [
        r"^batonrun: node n[23] lost: rank [12] %s %s; going on with 2 of 3 nodes \(--min-nodes=2\)$" % (PID, KILLED),
        r"^batonrun: node n[23] lost: rank [12] %s %s; 1 of 3 nodes left, fewer than --min-nodes=2 "
        r"\(lost: n2, n3\); the agents' logs are in /tmp/batonrun\.\w+; stopped the others$" % (PID, KILLED),
    ])
    check("[0] done" not in out, "rank 0 finished, but batonrun should have stopped it", out)


def test_exhausted():
    rc, out, err = run("exhausted", ["--nodes", "2", "--procs-per-node", "1", "--restarts", "1"])
    expect(rc, err, 1, [
        r"^batonrun: node n2 died: rank 1 %s %s; restarting it \(restart 1 of 1\)$" % (PID, KILLED),
        r"^batonrun: node n2 lost: local rank 0 \(restart 1\) %s %s; no restarts left \(--restarts=1\); "
        r"1 of 2 nodes left, fewer than --min-nodes=2 \(lost: n2\); the agents' logs are in "
        r"/tmp/batonrun\.\w+; stopped the others$" % (PID, KILLED),
    ])
    check(re.search(r"^\[node2\.0 restart 1\] I am back as rank \d of 2$", out, re.MULTILINE),
          "the restarted n2 did not rejoin the job", out)


def test_early():
    rc, out, err = run("early", ["--nodes", "2", "--procs-per-node", "1", "--min-nodes", "1", "--restarts", "1"])
    expect(rc, err, 1, [
        r"^batonrun: node n2 died before job \"elastic-early\" formed: rank 1 %s exited with code 3; a job "
        r"restarts or loses nodes only once it has formed with all 2 nodes; stopped the others$" % PID,
    ])
    check("restarting it" not in err, "a node was restarted", err)


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_interrupted():
    workdir = tempfile.mkdtemp(prefix="elastic-launch-")
    try:
        batonrun = Run("interrupted", ["--nodes", "2", "--procs-per-node", "1", "--restarts", "1"], workdir)
        seen = batonrun.await_err("restarting it (restart 1 of 1)", RUN_TIMEOUT)
        batonrun.process.send_signal(signal.SIGTERM)
        rc, _, err = batonrun.wait()
        check(seen, "batonrun did not restart n2", err)
        expect(rc, err, 128 + signal.SIGTERM, [r"^batonrun: received Terminated"])
        pids = [int(name.split(".")[1]) for name in os.listdir(workdir) if name.startswith("pid.")]
        check(pids, "no trainer wrote its pid", err)
        # batonrun reaped its children before it exited: none runs now.
        left = [pid for pid in pids if alive(pid)]
        check(not left, "trainers still running after batonrun exited: %s" % left, err)
    finally:
        remove_workdir(workdir)


def test_usage():
    for flags, message in [
        (["--nodes", "3", "--min-nodes", "4"], "batonrun: --min-nodes=4 must be in 1..3 (--nodes)"),
        (["--nodes", "3", "--min-nodes=-1"], "batonrun: --min-nodes=-1 must be in 1..3 (--nodes)"),
        (["--restarts", "101"], "batonrun: --restarts=101 must be in 0..100"),
        (["--restarts", "1", "--coordinator", "127.0.0.1:1"],
         "batonrun: --restarts=1 needs the embedded cluster, but --coordinator=127.0.0.1:1"),
    ]:
        done = subprocess.run([BATONRUN] + flags + ["--", "true"], capture_output=True, text=True, timeout=30)
        check(done.returncode == 2, "%s: exit %d, not 2" % (flags, done.returncode), done.stderr)
        check(message in done.stderr, "%s: no %r" % (flags, message), done.stderr)
        check(done.stderr.count("\n") == 1, "%s: not one line" % flags, done.stderr)


def test_pod():
    """With --coordinator (a Kubernetes pod of an elastic job) a trainer
    that dies fails the launcher, so that the pod is started again and
    rejoins; its trainers get no WORLD_SIZE (the job's size changes)."""
    workdir = tempfile.mkdtemp(prefix="elastic-launch-")
    try:
        flags = ["--coordinator", "127.0.0.1:1", "--socket", os.path.join(workdir, "none.sock"),
                 "--job", "pod", "--nodes", "2", "--procs-per-node", "1", "--min-nodes", "1"]
        script = 'echo "world=${WORLD_SIZE-unset}"; kill -9 $$'
        done = subprocess.run([BATONRUN] + flags + ["--", "sh", "-c", script],
                              capture_output=True, text=True, timeout=60)
        check(done.returncode == 1, "exit %d, not 1" % done.returncode, done.stderr)
        check("world=unset" in done.stdout, "WORLD_SIZE was set: %r" % done.stdout, done.stderr)
    finally:
        remove_workdir(workdir)


if __name__ == "__main__":
    if len(sys.argv) != 2 or "test_" + sys.argv[1] not in globals():
        sys.exit("usage: elastic_launch_test.py restart|lost|below_min|exhausted|interrupted|early|usage|pod")
    start = time.monotonic()
    globals()["test_" + sys.argv[1]]()
    print("ok %s (%.1f s)" % (sys.argv[1], time.monotonic() - start))
