#!/usr/bin/python3
"""Data-parallel training of a small classifier with baton, written the way
BytePS and Horovod users write their scripts. It is also the demo
(tools/demo):

    build/bin/batonrun --nodes 2 --procs-per-node 2 --job demo -- \\
        /usr/bin/python3 docs/examples/pytorch/train_synthetic.py

(with PYTHONPATH=build/python, or the package installed). Every rank trains
on its own shard of a synthetic 4-class problem; gradients are averaged by
baton. With --optimizer scheduled (the default) the ScheduledOptimizer
overlaps each layer's update with the next iteration's forward pass; with
--optimizer distributed it is the classic Horovod-style DistributedOptimizer.
"""

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

import baton
import baton.torch as bt

parser = argparse.ArgumentParser(description="baton PyTorch synthetic-data example")
parser.add_argument("--steps", type=int, default=300, help="training steps")
parser.add_argument("--batch-size", type=int, default=32, help="samples per rank per step")
parser.add_argument("--lr", type=float, default=0.05, help="learning rate (before warm-up)")
parser.add_argument("--optimizer", choices=["scheduled", "distributed"], default="scheduled")
parser.add_argument("--seed", type=int, default=42)
args = parser.parse_args()

FEATURES, CLASSES = 32, 4

# One thread per trainer: the node's cores are shared by its trainers.
torch.set_num_threads(1)
bt.init()
torch.manual_seed(args.seed + bt.rank())  # each rank its own initial weights...


def make_shard(rank, samples):
    """Gaussian clusters around fixed class centres; rank r's own samples."""
    centres = torch.randn(CLASSES, FEATURES, generator=torch.Generator().manual_seed(args.seed))
    g = torch.Generator().manual_seed(args.seed * 1000 + rank)
    labels = torch.randint(0, CLASSES, (samples,), generator=g)
    x = centres[labels] + 1.5 * torch.randn(samples, FEATURES, generator=g)
    return x, labels


model = torch.nn.Sequential(
    torch.nn.Linear(FEATURES, 128),
    torch.nn.ReLU(),
    torch.nn.Linear(128, 128),
    torch.nn.ReLU(),
    torch.nn.Linear(128, CLASSES),
)
# ...until rank 0's reach everyone.
bt.broadcast_parameters(model.state_dict(), root_rank=0)

optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * bt.size(), momentum=0.9)
bt.broadcast_optimizer_state(optimizer, root_rank=0)
if args.optimizer == "scheduled":
    # The LR scheduler drives the optimizer passed in; ScheduledOptimizer
    # applies each step with the hyperparameters of that step.
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)
    optimizer = bt.ScheduledOptimizer(model, optimizer, num_steps=args.steps)
else:
    optimizer = bt.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)

x_train, y_train = make_shard(bt.rank(), 4096)
x_test, y_test = make_shard(10_000 + bt.rank(), 1024)


def progress(step, loss):
    width = 30
    done = width * step // args.steps
    print(
        "[%s%s] step %4d/%d  loss %.4f" % ("#" * done, "." * (width - done), step, args.steps, loss),
        flush=True,
    )


if bt.rank() == 0:
    print(
        "training a %d-class MLP on %d ranks (%d per node), %s optimizer, %d steps"
        % (CLASSES, bt.size(), bt.local_size(), args.optimizer, args.steps),
        flush=True,
    )
start = time.monotonic()
loss_sum = torch.zeros(1)
for step in range(args.steps):
    index = torch.randint(0, x_train.shape[0], (args.batch_size,))
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x_train[index]), y_train[index])
    loss.backward()
    optimizer.step()
    scheduler.step()
    loss_sum += loss.detach()
    if (step + 1) % (args.steps // 10 or 1) == 0 or step + 1 == args.steps:
        # The mean loss over ranks since the last report: a metric, averaged
        # like a gradient.
        mean = bt.push_pull(loss_sum, average=True, name="metric.loss").item()
        if bt.rank() == 0:
            progress(step + 1, mean / (args.steps // 10 or 1))
        loss_sum.zero_()
if isinstance(optimizer, bt.ScheduledOptimizer):
    optimizer.finalize()
elapsed = time.monotonic() - start

with torch.no_grad():
    correct = (model(x_test).argmax(dim=1) == y_test).sum().to(torch.float64)
accuracy = bt.push_pull(correct, average=False, name="metric.correct").item() / (1024 * bt.size())
if bt.rank() == 0:
    print(
        "\n%d steps in %.1f s (%.1f ms/step); test accuracy %.1f%% over all ranks' shards"
        % (args.steps, elapsed, 1000 * elapsed / args.steps, 100 * accuracy),
        flush=True,
    )
    coordinator = os.environ.get("BATON_COORDINATOR")
    if coordinator:
        print()
        print(baton.job_status_text(coordinator, os.environ["BATON_JOB"], args.steps - 1), flush=True)
bt.shutdown()
sys.exit(0 if accuracy > 0.5 else 1)
