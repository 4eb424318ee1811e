#!/usr/bin/python3
"""Elastic data-parallel training with baton: the job keeps training when a
node is lost, and a node that starts again joins it. Horovod elastic users
will recognise the shape:

    build/bin/batonrun --nodes 4 --min-nodes 3 --restarts 2 --job elastic -- \\
        /usr/bin/python3 docs/examples/pytorch/train_elastic.py

(with PYTHONPATH=build/python, or the package installed). Kill a node's
agent and trainer (kill -9) while it runs: the other three go on after a
re-form of about a second, batonrun starts the node again, and it joins
them with their state.

Everything that must survive a re-form is in the elastic.State: the model,
the optimizer and the position in the data (epoch, batch). Each rank reads
shard rank() of size() of every batch, so the data is re-sharded when the
job shrinks or grows; the learning rate follows size() (a reset callback).
"""

import argparse

import torch
import torch.nn.functional as F

import baton.torch as bt
import baton.torch.elastic as elastic

parser = argparse.ArgumentParser(description="baton elastic PyTorch example")
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--batches", type=int, default=50, help="batches per epoch")
parser.add_argument("--batch-size", type=int, default=64, help="global samples per batch")
parser.add_argument("--lr", type=float, default=0.02, help="learning rate per rank")
parser.add_argument("--commit-every", type=int, default=10, help="batches between commits")
parser.add_argument("--seed", type=int, default=42)
args = parser.parse_args()

FEATURES, CLASSES = 32, 4

torch.set_num_threads(1)
bt.init()


def global_batch(epoch, batch):
    """The same global batch on every rank, whatever the world size."""
    g = torch.Generator().manual_seed(args.seed * 100003 + epoch * 1009 + batch)
    centres = torch.randn(CLASSES, FEATURES, generator=torch.Generator().manual_seed(args.seed))
    labels = torch.randint(0, CLASSES, (args.batch_size,), generator=g)
    return centres[labels] + 1.5 * torch.randn(args.batch_size, FEATURES, generator=g), labels


model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 64), torch.nn.ReLU(), torch.nn.Linear(64, CLASSES))
optimizer = bt.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=args.lr * bt.size(), momentum=0.9),
    named_parameters=model.named_parameters(),
)
state = elastic.State(model=model, optimizer=optimizer, epoch=0, batch=0)


def rescale_lr():
    for group in optimizer.param_groups:
        group["lr"] = args.lr * bt.size()


state.register_reset_callbacks([rescale_lr])


@elastic.run
def train(state):
    while state.epoch < args.epochs:
        while state.batch < args.batches:
            x, y = global_batch(state.epoch, state.batch)
            mine = slice(bt.rank(), None, bt.size())  # this rank's shard
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x[mine]), y[mine])
            loss.backward()
            optimizer.step()
            state.batch += 1
            if state.batch % args.commit_every == 0:
                state.commit()
        if bt.rank() == 0:
            print("epoch %d: loss %.4f on %d ranks" % (state.epoch, loss.item(), bt.size()), flush=True)
        state.epoch, state.batch = state.epoch + 1, 0
        state.commit()


train(state)
x, y = global_batch(args.epochs, 0)
accuracy = (model(x).argmax(dim=1) == y).float().mean().item()
if bt.rank() == 0:
    print("done: accuracy %.2f on a fresh batch" % accuracy, flush=True)
bt.shutdown()
