"""DistributedDataParallel under batonrun: the torchrun environment, and
baton's DDP comm hook against DDP's own all-reduce over gloo (run by
batonrun: tests/python/CMakeLists.txt)."""

import datetime
import json
import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import baton
import baton.torch as bt
from harness import run_tests

# Small buckets, so that DDP rebuilds its first iteration's one bucket into
# several after it: baton sees a new layout, declared anew. The first
# bucket's cap is DDP's documented knob for it.
BUCKET_CAP_MB = 0.0008
dist._DEFAULT_FIRST_BUCKET_BYTES = 300


def make_model():
    # Small: torch 1.13's Linear uses a slow reference BLAS here.
    torch.manual_seed(1234)
    return torch.nn.Sequential(
        torch.nn.Linear(8, 16),
        torch.nn.Tanh(),
        torch.nn.Linear(16, 16),
        torch.nn.Tanh(),
        torch.nn.Linear(16, 4),
    )


def batch(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)


def train(model, steps, rank):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        x, y = batch(step, rank)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()


def test_batonrun_sets_the_torchrun_environment_as_baton_sees_it():
    env = os.environ
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        assert env.get(name), "batonrun did not set %s" % name
    assert int(env["RANK"]) == bt.rank(), (env["RANK"], bt.rank())
    assert int(env["WORLD_SIZE"]) == bt.size() == 4, (env["WORLD_SIZE"], bt.size())
    assert int(env["LOCAL_RANK"]) == bt.local_rank(), (env["LOCAL_RANK"], bt.local_rank())
    assert int(env["LOCAL_WORLD_SIZE"]) == bt.local_size() == 2, env["LOCAL_WORLD_SIZE"]
    # Node k's trainers are ranks k*P .. k*P+P-1.
    assert bt.rank() % bt.local_size() == bt.local_rank(), (bt.rank(), bt.local_rank())
    port = int(env["MASTER_PORT"])
    coordinator_port = int(env["BATON_COORDINATOR"].rsplit(":", 1)[1])
    assert 0 < port < 65536 and port != coordinator_port, (port, coordinator_port)
    # The same rendezvous point on every rank.
    mine = torch.tensor([port, sum(env["MASTER_ADDR"].encode())], dtype=torch.int64)
    root = mine.clone()
    bt.broadcast(root, 0, "Test.master")
    assert torch.equal(mine, root), (mine, root)
    # torch's env:// rendezvous works unchanged and agrees with baton.
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    assert (dist.get_rank(), dist.get_world_size()) == (bt.rank(), bt.size())
    ranks = torch.tensor([dist.get_rank()], dtype=torch.int64)
    dist.all_reduce(ranks)
    assert ranks.item() == 0 + 1 + 2 + 3, ranks


def test_ddp_with_the_baton_hook_matches_ddp_over_gloo():
    steps = 20
    reference = DistributedDataParallel(make_model(), bucket_cap_mb=BUCKET_CAP_MB)
    hooked = DistributedDataParallel(make_model(), bucket_cap_mb=BUCKET_CAP_MB)
    state = bt.DDPCommHookState(hooked, name="DDP.test")
    hooked.register_comm_hook(state, bt.ddp_comm_hook)
    initial = [p.detach().clone() for p in hooked.parameters()]
    train(reference, steps, bt.rank())
    train(hooked, steps, bt.rank())
    # The buckets were rebuilt after the first iteration: a second layout,
    # several buckets.
    assert state.bucket_name(2) == "DDP.test.layout1.bucket2", state.bucket_name(2)
    for (name, a), b, start in zip(reference.named_parameters(), hooked.parameters(), initial):
        assert not torch.equal(b, start), "%s did not train" % name
        diff = (a - b).abs().max().item()
        assert diff <= 1e-6, "%s differs from DDP over gloo by %g" % (name, diff)
    if bt.rank() == 0:
        # Priority (0 = most urgent) follows DDP's bucket order reversed, in
        # each layout: the last bucket holds the first layers.
        tensors = json.loads(
            subprocess.run(
                [os.environ["BATONCTL"], "--json", "tensors", os.environ["BATON_JOB"]],
                check=True, capture_output=True, text=True, timeout=60,
            ).stdout
        )["tensors"]
        priority = {t["spec"]["name"]: t.get("priority", 0) for t in tensors}
        order = ["DDP.test.layout0.bucket0"] + ["DDP.test.layout1.bucket%d" % i for i in (2, 1, 0)]
        assert [priority[n] for n in order] == sorted(priority[n] for n in order), priority
        assert "DDP.test.layout1.bucket3" not in priority, priority
    # Every rank holds the same parameters.
    for name, p in hooked.named_parameters():
        root = p.detach().clone()
        bt.broadcast(root, 0, "Test.ddp." + name)
        assert torch.equal(root, p.detach()), name
    del reference, hooked
    dist.barrier()


def test_a_failed_bucket_fails_backward_naming_the_cause():
    """The second node leaves the job before the last step: the first
    node's buckets of that step can never complete, and their futures carry
    baton's error out of backward() instead of hanging DDP."""
    first_node = bt.rank() < bt.local_size()
    model = DistributedDataParallel(make_model(), bucket_cap_mb=BUCKET_CAP_MB)
    model.register_comm_hook(bt.DDPCommHookState(model, name="DDP.fail"), bt.ddp_comm_hook)
    train(model, 2, bt.rank())
    if not first_node:
        bt.shutdown()
    else:
        x, y = batch(2, bt.rank())
        start = time.monotonic()
        try:
            torch.nn.functional.mse_loss(model(x), y).backward()
        except RuntimeError as e:
            message = str(e)
        else:
            raise AssertionError("backward finished though the other node left")
        assert "BatonError: " in message, message
        assert 'tensor "DDP.fail.layout1.bucket' in message and "a node left" in message, message
        assert time.monotonic() - start < 60
    del model
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(run_tests(globals()))
