#!/usr/bin/python3
"""The trainers of launch_test.py: scripts as users write them, started
with torchrun's environment (by batonrun, or by the test as torchrun
would).

  launch_trainer.py plain      DDP over gloo with no baton in it
  launch_trainer.py ddp_first  init_process_group("gloo") first, as every DDP
                               script does, then bt.init() and baton's DDP
                               comm hook; checks the ranks agree, and that
                               DDP with the hook ends with the parameters of
                               DDP over gloo (1e-6) after 20 steps

  launch_trainer.py hook_error  DistributedOptimizer (gradients in baton's
                               shared memory), and a hook on a gradient's
                               AccumulateGrad node (where the optimizers
                               hook) that raises in the third backward
                               pass, uncaught:
                               the process must end (exit code 1)

  launch_trainer.py baton_lost  DDP on the "baton" backend (a 60 s group
                               timeout), one trainer a node; the last rank
                               kills itself (SIGKILL) before its fourth
                               backward pass: every other rank's backward
                               raises, naming the node that left, and
                               prints how long it took

Each prints "<mode> ok rank R of W" at the end (hook_error and the rank
that kills itself never do)."""

import datetime
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

STEPS = 20


def make_model():
    torch.manual_seed(1234)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def train(model, rank):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(STEPS):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x, y = torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()


def plain():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    model = DistributedDataParallel(make_model())
    train(model, rank)
    mine = torch.cat([p.detach().flatten() for p in model.parameters()])
    root = mine.clone()
    dist.broadcast(root, 0)
    assert torch.equal(mine, root), "rank %d ends with other parameters than rank 0" % rank
    del model
    dist.barrier()
    return rank, dist.get_world_size()


def ddp_first():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    import baton.torch as bt

    bt.init()
    env = os.environ
    # What the launcher said is what baton assigned.
    assert (dist.get_rank(), dist.get_world_size()) == (bt.rank(), bt.size()), (
        dist.get_rank(), dist.get_world_size(), bt.rank(), bt.size())
    assert int(env["LOCAL_RANK"]) == bt.local_rank(), (env["LOCAL_RANK"], bt.local_rank())
    assert int(env["GROUP_RANK"]) == bt.rank() // bt.local_size(), (env["GROUP_RANK"], bt.rank())
    assert env["TORCHELASTIC_RUN_ID"], "no TORCHELASTIC_RUN_ID"
    # glibc keeps freed memory (fresh large tensors cost page faults).
    assert env.get("MALLOC_MMAP_THRESHOLD_") and env.get("MALLOC_TRIM_THRESHOLD_"), "no malloc tuning"
    reference = DistributedDataParallel(make_model())
    hooked = DistributedDataParallel(make_model())
    hooked.register_comm_hook(bt.DDPCommHookState(hooked, name="Launch.ddp"), bt.ddp_comm_hook)
    train(reference, bt.rank())
    train(hooked, bt.rank())
    for (name, a), b in zip(reference.named_parameters(), hooked.parameters()):
        diff = (a - b).abs().max().item()
        assert diff <= 1e-6, "%s differs from DDP over gloo by %g" % (name, diff)
    rank, size = bt.rank(), bt.size()
    del reference, hooked
    dist.barrier()
    bt.shutdown()
    return rank, size


def hook_error():
    import baton.torch as bt

    bt.init()
    model = make_model()
    optimizer = bt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                        named_parameters=model.named_parameters())
    steps = [0]

    def hook(*_):
        if steps[0] == 2:
            raise RuntimeError("a user's gradient hook failed")

    # On the gradient's AccumulateGrad node, after the optimizer's own hook
    # (which started the push-pull of the shared-memory .grad).
    bias = model[2].bias
    bias.expand_as(bias).grad_fn.next_functions[0][0].register_hook(hook)
    for step in range(STEPS):
        steps[0] = step
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    return bt.rank(), bt.size()


def baton_lost():
    import signal
    import time

    import baton.torch  # noqa: F401 - registers "baton"

    dist.init_process_group("baton", timeout=datetime.timedelta(seconds=60))
    rank, size = dist.get_rank(), dist.get_world_size()
    model = DistributedDataParallel(make_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        if step == 3 and rank == size - 1:
            os.kill(os.getpid(), signal.SIGKILL)
        g = torch.Generator().manual_seed(1000 * step + rank)
        x, y = torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)
        optimizer.zero_grad()
        start = time.monotonic()
        try:
            torch.nn.functional.mse_loss(model(x), y).backward()
        except RuntimeError as e:
            print("baton_lost rank %d: backward raised after %.2f s: %s" % (rank, time.monotonic() - start, e),
                  flush=True)
            # The group is unusable now; leave without destroying it.
            os._exit(0 if step == 3 else 3)
        optimizer.step()
    raise AssertionError("rank %d trained on after rank %d was killed" % (rank, size - 1))


def main():
    torch.set_num_threads(1)
    mode = sys.argv[1]
    rank, size = {"plain": plain, "ddp_first": ddp_first, "hook_error": hook_error, "baton_lost": baton_lost}[mode]()
    dist.destroy_process_group()
    print("%s ok rank %d of %d" % (mode, rank, size), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
