#!/usr/bin/python3
"""One trainer of the scheduling benchmark (tools/bench/scheduling/run).

Trains a model on deterministic synthetic data for --steps steps and writes
each step's wall time to --result as JSON. Models (--model):

  vgg           VGG-like (convolutions: most of the compute, few parameters;
                fully connected layers written as convolutions at the end:
                most of the parameters, little compute), 3x32x32 images
  resnet18      torchvision ResNet-18 (62 parameter tensors), 3x32x32 images
  resnet50      torchvision ResNet-50 (161 parameter tensors)
  mobilenet_v2  torchvision MobileNetV2 (158 small parameter tensors)
  transformer   a torch.nn TransformerEncoder over token sequences (embedding,
                encoder layers, classification head)
  tiny          a small VGG-like model that only checks the harness
  emu-MODEL     MODEL (vgg16, resnet50, resnet18, mobilenet_v2, bert_base;
                layer_models.py) on an emulated GPU (emulated.py): its real
                parameters and gradients, each layer's compute a sleep of the
                time in --profile (default profiles/MODEL.flops.json) x
                --dilation; the batch is the profile's

torchvision (Debian's python3-torchvision) is needed for its models only.
Modes:

  --mode ddp       torch.distributed DistributedDataParallel over gloo; rank
                   and world size from RANK / WORLD_SIZE, rendezvous at
                   --init (tcp://HOST:PORT)
  --mode ddp-baton the same DDP over torch.distributed's "baton" backend
                   (baton's defaults); run under batonrun, which sets the
                   torchrun environment
  --mode fifo      baton DistributedOptimizer (Horovod style); run with
                   BATON_SCHEDULING=fifo under batonrun
  --mode priority  baton ScheduledOptimizer (cross-iteration overlap); run
                   with BATON_SCHEDULING=priority under batonrun
  --compression fp16
                   gradients travel as float16: baton's Compression.fp16
                   (fifo, priority), DDP's fp16_compress_hook (ddp,
                   ddp-baton); default none
  --compression topk
                   baton's Compression.topk(0.01) with error feedback (fifo,
                   priority only)
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

import emulated
import layer_models

# VGG-like models: name -> (width, hidden, batch, convs per block). "tiny"
# only checks the harness (QUICK=1). Keep batches of 16 or more: below that
# torch runs the 1x1 convolutions (fc7, fc8) without oneDNN.
VGG_MODELS = {
    "vgg": (64, 512, 128, 2),
    "tiny": (4, 64, 2, 1),
}
# torchvision models: name -> default batch (3x32x32 images, about 0.15-0.25 s
# of compute per step on one core of these machines).
TORCHVISION_MODELS = {"resnet18": 32, "resnet50": 16, "mobilenet_v2": 32}
# The Transformer encoder: vocabulary, model width, layers, heads, feed-forward
# width, sequence length, batch. Debian's torch runs nn.Linear on a slow
# reference BLAS, so it is small.
TRANSFORMER = dict(vocab=8192, width=256, layers=2, heads=4, ff=1024, seq=32, batch=8)
EMULATED_PREFIX = "emu-"
EMULATED_MODELS = [EMULATED_PREFIX + name for name in layer_models.MODELS]
MODELS = sorted(list(VGG_MODELS) + list(TORCHVISION_MODELS) + ["transformer"]) + EMULATED_MODELS
PROFILES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "profiles")
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


class TransformerClassifier(nn.Module):
    """Token embedding, a torch.nn TransformerEncoder, mean pooling and a
    linear classification head."""

    def __init__(self, vocab, width, layers, heads, ff):
        super().__init__()
        self.embedding = nn.Embedding(vocab, width)
        layer = nn.TransformerEncoderLayer(width, heads, ff, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(width, CLASSES)

    def forward(self, tokens):
        return self.head(self.encoder(self.embedding(tokens)).mean(1))


def build(args):
    """The model of --model and a description of it; sets args.batch (and,
    for an emulated model, args.emulation: (profile, stream, model))."""
    if args.model in EMULATED_MODELS:
        name = args.model[len(EMULATED_PREFIX):]
        path = args.profile or os.path.join(PROFILES, "%s.flops.json" % name)
        try:
            model, description, profile, stream = emulated.load(name, path, args.dilation)
        except layer_models.ProfileError as e:
            raise SystemExit("trainer.py: --profile: %s" % e)
        if args.batch and args.batch != profile["batch"]:
            raise SystemExit("trainer.py: --batch %d: an emulated model runs the batch of its profile (%d)"
                             % (args.batch, profile["batch"]))
        args.batch = profile["batch"]
        args.emulation = (profile, stream, model)
        return model, "%s on an emulated GPU (%s profile, dilation %g)" % (
            description, profile.get("source", "?"), args.dilation)
    if args.model in VGG_MODELS:
        width, hidden, batch, convs = VGG_MODELS[args.model]
        width, hidden, convs = args.width or width, args.hidden or hidden, args.convs or convs
        args.batch = args.batch or batch
        return make_model(width, hidden, convs), "%s(width=%d,hidden=%d,convs=%d)" % (
            args.model, width, hidden, convs)
    if args.model in TORCHVISION_MODELS:
        import torchvision

        args.batch = args.batch or TORCHVISION_MODELS[args.model]
        model = getattr(torchvision.models, args.model)(weights=None, num_classes=CLASSES)
        return model, "torchvision.%s" % args.model
    t = TRANSFORMER
    args.batch = args.batch or t["batch"]
    model = TransformerClassifier(t["vocab"], t["width"], t["layers"], t["heads"], t["ff"])
    return model, "transformer(width=%d,layers=%d,heads=%d,ff=%d,seq=%d)" % (
        t["width"], t["layers"], t["heads"], t["ff"], t["seq"])


def describe(model):
    params = sum(p.numel() for p in model.parameters())
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return params, grad_bytes


def make_batches(model_name, rank, batch, emulation=None):
    if emulation is not None:
        profile, _, model = emulation
        return emulated.make_batches(profile, rank, BATCHES, model)
    g = torch.Generator().manual_seed(1000 + rank)
    if model_name == "transformer":
        t = TRANSFORMER
        inputs = lambda: torch.randint(0, t["vocab"], (batch, t["seq"]), generator=g)  # noqa: E731
    else:
        inputs = lambda: torch.randn(batch, 3, IMAGE, IMAGE, generator=g)  # noqa: E731
    return [(inputs(), torch.randint(0, CLASSES, (batch,), generator=g)) for _ in range(BATCHES)]


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
    if args.mode == "ddp-baton":
        import baton.torch  # noqa: F401 - registers the "baton" backend

        dist.init_process_group("baton")
    else:
        dist.init_process_group("gloo", init_method=args.init, rank=rank, world_size=size)
    ddp = DistributedDataParallel(model)
    if args.compression == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    result = train(ddp, optimizer, make_batches(args.model, rank, args.batch, args.emulation), args.steps)
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
    compression = {"fp16": bt.Compression.fp16, "topk": bt.Compression.topk(0.01)}.get(args.compression)
    if args.mode == "fifo":
        optimizer = bt.DistributedOptimizer(
            optimizer, named_parameters=model.named_parameters(), compression=compression
        )
    else:
        optimizer = bt.ScheduledOptimizer(model, optimizer, num_steps=args.steps, compression=compression)
    result = train(model, optimizer, make_batches(args.model, bt.rank(), args.batch, args.emulation), args.steps)
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
    parser.add_argument("--mode", choices=["ddp", "ddp-baton", "fifo", "priority"])
    parser.add_argument("--compute-only", action="store_true")
    parser.add_argument("--compression", choices=["none", "fp16", "topk"], default="none")
    parser.add_argument("--describe", action="store_true")
    parser.add_argument("--model", choices=MODELS, default="vgg")
    parser.add_argument("--width", type=int, help="first conv block's channels (default: the model's)")
    parser.add_argument("--hidden", type=int, help="fully connected width (default: the model's)")
    parser.add_argument("--convs", type=int, help="convolutions per block (default: the model's)")
    parser.add_argument("--batch", type=int, help="samples per step per trainer (default: the model's)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--profile", help="emu-MODEL: the layer profile (default profiles/MODEL.flops.json)")
    parser.add_argument("--dilation", type=float, default=1.0,
                        help="emu-MODEL: every modelled time x DILATION (default 1)")
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
    if args.steps < 1:
        parser.error("--steps %d: give a positive number" % args.steps)
    if not (0 < args.dilation < float("inf")):
        parser.error("--dilation %r: give a positive number" % args.dilation)
    if args.compression == "topk" and args.mode in ("ddp", "ddp-baton"):
        parser.error("--compression topk is baton's (fifo, priority); DDP has no top-k hook")
    if args.model not in EMULATED_MODELS and (args.profile or args.dilation != 1.0):
        parser.error("--profile and --dilation are for the emulated models (emu-MODEL) only")
    args.emulation = None

    # glibc returns every freed block above its (dynamic) mmap threshold to
    # the kernel, so each step page-faults tens of MB of fresh activations:
    # on these VMs that made convolutions up to 5x slower. Keep them, as
    # jemalloc or tcmalloc would (the same in every mode).
    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD
    libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    torch.manual_seed(42)  # the same initial weights on every rank
    model, description = build(args)
    params, grad_bytes = describe(model)
    out = {
        "model": description,
        "tensors": len(list(model.parameters())),
        "batch": args.batch,
        "params": params,
        "grad_bytes": grad_bytes,
        "compression": args.compression,
    }
    if args.emulation is not None:
        profile, stream, _ = args.emulation
        out.update(
            dilation=args.dilation,
            profile_source=profile.get("source"),
            modelled_compute_s=args.dilation * profile["compute_s"],
            modelled_phases_s=[args.dilation * profile[k] for k in ("forward_s", "backward_s", "update_s")],
        )
    if args.describe:
        print(json.dumps(out))
        return
    if args.emulation is not None:
        optimizer = emulated.EmulatedSGD(model.parameters(), profile, stream, args.dilation)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.001, momentum=0.9)
    if args.compute_only:
        rank, size, result = 0, 1, train(
            model, optimizer, make_batches(args.model, 0, args.batch, args.emulation), args.steps)
    elif args.mode in ("ddp", "ddp-baton"):
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
