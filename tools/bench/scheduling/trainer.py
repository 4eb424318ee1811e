#!/usr/bin/python3
"""One trainer of the scheduling benchmark (tools/bench/scheduling/run).

Trains a VGG-like network (convolutions: most of the compute, few
parameters; fully connected layers at the end: most of the parameters, little
compute, as in VGG) on deterministic synthetic data for --steps steps and
writes each step's wall time to --result as JSON. Modes:

  --mode ddp       torch.distributed DistributedDataParallel over gloo; rank
                   and world size from RANK / WORLD_SIZE, rendezvous at
                   --init (tcp://HOST:PORT)
  --mode fifo      baton DistributedOptimizer (Horovod style); run with
                   BATON_SCHEDULING=fifo under batonrun
  --mode priority  baton ScheduledOptimizer (cross-iteration overlap); run
                   with BATON_SCHEDULING=priority under batonrun
  --compute-only   one process, no communication: the forward + backward +
                   SGD update time of the same model and batch
  --describe       prints the model's parameter count and gradient bytes

A step's time is the wall time from the end of one optimizer.step() to the
end of the next, so with ScheduledOptimizer (whose step() returns at once) it
is the steady-state time per iteration.
"""

import argparse
import ctypes
import json
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# name: (width, hidden, batch, convs per block). "vgg" is the benchmark's
# model; "tiny" only checks the harness (QUICK=1). Keep batches of 16 or more:
# below that torch runs the 1x1 convolutions (fc7, fc8) without oneDNN.
MODELS = {
    "vgg": (64, 512, 128, 2),
    "tiny": (4, 64, 2, 1),
}
CLASSES = 10
IMAGE = 32  # 3 x 32 x 32 inputs, as CIFAR
BATCHES = 4  # distinct synthetic batches, cycled


def make_model(width, hidden, convs_per_block=2):
    """VGG-like: three conv blocks (32x32 -> 16x16 -> 8x8 -> 4x4: most of the
    compute, few parameters), then fc6/fc7/fc8 written as convolutions, as in
    the fully convolutional VGG (most of the parameters, little compute).
    Convolutions run on oneDNN; Debian's torch runs nn.Linear on a slow
    reference BLAS, which would make the classifier compute-bound too."""
    layers, channels = [], 3
    for block in range(3):
        for _ in range(convs_per_block):
            layers += [nn.Conv2d(channels, width << block, 3, padding=1), nn.ReLU()]
            channels = width << block
        layers.append(nn.MaxPool2d(2))
    layers += [
        nn.Conv2d(channels, hidden, IMAGE // 8),  # fc6: the whole 4x4 map
        nn.ReLU(),
        nn.Conv2d(hidden, hidden, 1),  # fc7
        nn.ReLU(),
        nn.Conv2d(hidden, CLASSES, 1),  # fc8
        nn.Flatten(),
    ]
    return nn.Sequential(*layers)


def describe(model):
    params = sum(p.numel() for p in model.parameters())
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return params, grad_bytes


def make_batches(rank, batch):
    g = torch.Generator().manual_seed(1000 + rank)
    return [
        (
            torch.randn(batch, 3, IMAGE, IMAGE, generator=g),
            torch.randint(0, CLASSES, (batch,), generator=g),
        )
        for _ in range(BATCHES)
    ]


def cpu_seconds():
    """This process's CPU time, every thread."""
    t = os.times()
    return t.user + t.system


def train(model, optimizer, batches, steps):
    """Trains `steps` steps; returns each step's wall time and (forward,
    backward, optimizer.step()) split, the process's CPU seconds (every
    thread) at the end of each step, and the first and last loss."""
    times, phases, cpu, losses = [], [], [], []
    last = time.perf_counter()
    for step in range(steps):
        x, y = batches[step % len(batches)]
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        forward_done = time.perf_counter()
        loss.backward()
        backward_done = time.perf_counter()
        optimizer.step()
        now = time.perf_counter()
        phases.append((forward_done - last, backward_done - forward_done, now - backward_done))
        times.append(now - last)
        last = now
        cpu.append(sum(os.times()[:2]))
        losses.append(loss.item())
    return {"step_s": times, "phases_s": phases, "cpu_s": cpu, "loss_first": losses[0], "loss_last": losses[-1]}


def run_ddp(args, model, optimizer):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method=args.init, rank=rank, world_size=size)
    ddp = DistributedDataParallel(model)
    result = train(ddp, optimizer, make_batches(rank, args.batch), args.steps)
    # Debian's torch 1.13 + gloo: free the DDP object and pass a barrier
    # before destroy_process_group(), or some exits hang.
    del ddp
    dist.barrier()
    dist.destroy_process_group()
    return rank, size, result


def run_baton(args, model, optimizer):
    import baton.torch as bt

    bt.init()
    bt.broadcast_parameters(model.state_dict(), root_rank=0)
    if args.mode == "fifo":
        optimizer = bt.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    else:
        optimizer = bt.ScheduledOptimizer(model, optimizer, num_steps=args.steps)
    result = train(model, optimizer, make_batches(bt.rank(), args.batch), args.steps)
    if args.mode == "priority":
        optimizer.close()
    if args.hold:
        # The job stays up (its agents keep its timeline) until the runner
        # has read what it wanted.
        open(args.result + ".trained", "w").close()
        deadline = time.monotonic() + args.hold
        while time.monotonic() < deadline and not os.path.exists(args.result + ".release"):
            time.sleep(0.05)
    rank, size = bt.rank(), bt.size()
    bt.shutdown()
    return rank, size, result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=["ddp", "fifo", "priority"])
    parser.add_argument("--compute-only", action="store_true")
    parser.add_argument("--describe", action="store_true")
    parser.add_argument("--model", choices=sorted(MODELS), default="vgg")
    parser.add_argument("--width", type=int, help="first conv block's channels (default: the model's)")
    parser.add_argument("--hidden", type=int, help="fully connected width (default: the model's)")
    parser.add_argument("--convs", type=int, help="convolutions per block (default: the model's)")
    parser.add_argument("--batch", type=int, help="samples per step per trainer (default: the model's)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--init", default="", help="ddp: tcp://HOST:PORT of rank 0")
    parser.add_argument("--result", default="", help="JSON file to write")
    parser.add_argument(
        "--hold", type=float, default=0,
        help="baton modes: after training, create RESULT.trained, then wait up to HOLD s "
        "for RESULT.release before leaving the job",
    )
    args = parser.parse_args()
    if not (args.describe or args.compute_only or args.mode):
        parser.error("give --mode, --compute-only or --describe")

    # glibc returns every freed block above its (dynamic) mmap threshold to
    # the kernel, so each step page-faults tens of MB of fresh activations:
    # on these VMs that made convolutions up to 5x slower. Keep them, as
    # jemalloc or tcmalloc would (the same in every mode).
    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD
    libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    width, hidden, batch, convs = MODELS[args.model]
    width, hidden, convs = args.width or width, args.hidden or hidden, args.convs or convs
    args.batch = args.batch or batch
    torch.manual_seed(42)  # the same initial weights on every rank
    model = make_model(width, hidden, convs)
    params, grad_bytes = describe(model)
    out = {
        "model": "%s(width=%d,hidden=%d,convs=%d)" % (args.model, width, hidden, convs),
        "batch": args.batch,
        "params": params,
        "grad_bytes": grad_bytes,
    }
    if args.describe:
        print(json.dumps(out))
        return
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001, momentum=0.9)
    if args.compute_only:
        rank, size, result = 0, 1, train(model, optimizer, make_batches(0, args.batch), args.steps)
    elif args.mode == "ddp":
        rank, size, result = run_ddp(args, model, optimizer)
    else:
        rank, size, result = run_baton(args, model, optimizer)
    out.update(mode=args.mode or "compute", rank=rank, size=size, **result)
    text = json.dumps(out)
    if args.result:
        with open(args.result, "w") as f:
            f.write(text + "\n")
    print(
        "%s rank %d: %d steps, median %.4f s/step, loss %.3f -> %.3f"
        % (
            out["mode"], rank, args.steps, sorted(out["step_s"])[args.steps // 2],
            out["loss_first"], out["loss_last"],
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
