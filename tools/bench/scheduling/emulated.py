"""An emulated GPU for the scheduling benchmark (issue 37): a real model's
parameters and gradients, with each layer's compute modelled by sleeping.

    model, _ = layer_models.build("resnet50")
    profile = layer_models.load_profile("profiles/resnet50.flops.json", model)
    stream = emulated.emulate(model, profile, dilation=100)
    optimizer = emulated.EmulatedSGD(model.parameters(), profile, stream, dilation=100)

After emulate(), model(x) runs the profile's layers in their forward order,
each layer through its own module's __call__ (so forward pre-hooks, such as
ScheduledOptimizer's gates, wait for the layer's parameters as they do in
real training) and one autograd Function, whose forward sleeps for the
layer's forward time and whose backward sleeps for its backward time and
then returns the gradients of the layer's parameters. The parameters are
the Function's inputs, so autograd accumulates the gradients into .grad
through each parameter's AccumulateGrad node and runs its hooks (DDP's
reducer, DistributedOptimizer's and ScheduledOptimizer's push-pulls) the
moment the layer's backward ends, in reverse layer order, exactly as in real
training. The model's own forward code (residual additions, attention
internals) does not run, and the activations passed between layers are
tiny stand-ins: nothing is computed, and the process uses almost no CPU.

Gradients are real tensors of the parameters' shapes, generated once and
reused: dense normal values (standard deviation 0.01) for every parameter,
except an embedding's, which is non-zero only in the rows the layer reads:
the batch's token ids ("input" in the profile, computed per distinct batch
and kept) or the profile's fixed rows (position embeddings).

Times are the profile's times x `dilation` (k): with the link rate divided
by k as well, the run emulates the profile's accelerator on a k times faster
network, slowly enough that the CPU of the communication is not what sets
the pace. Layers run on one EmulatedStream per model, as kernels on one GPU
stream: a layer starts when the one before it has finished and the host
has asked for it (EmulatedStream says where the emulator's own CPU time is
kept out of the modelled time). Layers without parameters (ReLU, pooling,
dropout) add their time to the layer with parameters before them (or, at
the start, after them); the order in which gradients appear does not
change.
"""

import threading
import time

import torch

import layer_models

GRADIENT_STD = 0.01
_TOKEN_CACHE = 8  # distinct token batches whose embedding gradients are kept


class EmulatedStream:
    """The emulated accelerator's one execution queue: each run_*(seconds)
    queues that much work and sleeps until it is done. Thread-safe: the
    training thread's layers and an optimizer's updates on another thread
    (ScheduledOptimizer) take turns, as kernels on one GPU.

    Work starts when the work before it has ended and the host has asked
    for it: at max(end of queue, now). Three exceptions keep the emulator's
    own CPU time out of the modelled time. A forward layer asked for less
    than HOST_SLACK_S after the queue ran dry starts at the end of the queue
    (Python's time per layer and the sleep's overshoot, a fraction of a
    millisecond each, would otherwise add up over hundreds of layers);
    later than that, the host was held up (a forward pre-hook waiting for an
    update) and it starts now. The host's time in EmulatedSGD.zero_grad()
    (a memset kernel on a GPU; hundreds of MiB written here) is reported
    with host_work() and taken off the host's lateness at the next layer.
    Between two layers of one backward pass the host runs only what a GPU
    runs as asynchronous kernels (accumulating the gradient into .grad, the
    hooks' copies into communication buffers), so that time overlaps the
    next layer's instead of adding to it. An update always starts now or
    later: it follows a wait for a push-pull."""

    HOST_SLACK_S = 0.002

    def __init__(self):
        self._lock = threading.Lock()
        # Guarded by _lock: time.monotonic() when the queued work ends,
        # whether a backward pass is running (since its first layer), and
        # the seconds of work queued so far.
        self._done_at = 0.0
        self._in_backward = False
        self._host_work = 0.0
        self.busy_s = 0.0

    def host_work(self, seconds):
        """The host spent `seconds` on what a GPU would run asynchronously."""
        with self._lock:
            self._host_work += seconds

    def run_forward(self, seconds):
        self._run(seconds, "forward")

    def run_backward(self, seconds):
        self._run(seconds, "backward")

    def run_update(self, seconds):
        self._run(seconds, "update")

    def _run(self, seconds, kind):
        with self._lock:
            now = time.monotonic()
            if kind == "update":
                start = max(self._done_at, now)
            elif kind == "backward" and self._in_backward:
                start = self._done_at
            elif now - self._done_at < self.HOST_SLACK_S + self._host_work:
                start = self._done_at
            else:
                start = now - self._host_work
            self._done_at = start + seconds
            # What is left of the host's asynchronous work is at most how
            # far the queue is behind the host.
            self._host_work = 0.0 if kind == "update" else min(self._host_work, max(0.0, now - self._done_at))
            if kind != "update":
                self._in_backward = kind == "backward"
            self.busy_s += seconds
            end = self._done_at
        while True:  # sleep() may return early on a signal
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(left)


class _Layer:
    """One emulated layer: its module, its times and its parameters."""

    def __init__(self, name, module, forward_s, backward_s):
        self.name = name
        self.module = module
        self.forward_s = forward_s
        self.backward_s = backward_s
        self.params = []  # torch.nn.Parameter, in the profile's order
        self.gradients = []  # one per parameter: a tensor, or _EmbeddingGradients (rows per batch)
        self.extra_modules = []  # modules that own some of params but are never called


class _LayerFunction(torch.autograd.Function):
    """forward(layer, stream, gradients, shape, x, *params): sleeps the
    layer's forward time and returns zeros of `shape` (the stand-in
    activation); backward sleeps its backward time, then returns
    `gradients` for params."""

    @staticmethod
    def forward(ctx, layer, stream, gradients, shape, x, *params):
        ctx.layer, ctx.stream, ctx.gradients, ctx.x_shape = layer, stream, gradients, x.shape
        stream.run_forward(layer.forward_s)
        return x.new_zeros(shape)

    @staticmethod
    def backward(ctx, grad_output):
        ctx.stream.run_backward(ctx.layer.backward_s)
        return (None, None, None, None, grad_output.new_zeros(ctx.x_shape)) + tuple(ctx.gradients)


class _EmbeddingGradients:
    """Dense gradients of an embedding weight, non-zero only in the rows of
    the batch's token ids; one per distinct batch, kept (a few) for reuse."""

    def __init__(self, weight, pool):
        self._weight, self._pool = weight, pool
        self._kept = []  # [(tokens, gradient)], newest last

    def for_tokens(self, tokens):
        for kept, gradient in self._kept:
            if kept.shape == tokens.shape and torch.equal(kept, tokens):
                return gradient
        rows = torch.unique(tokens)
        if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= self._weight.shape[0]):
            raise ValueError("token ids outside the embedding's %d rows" % self._weight.shape[0])
        gradient = _rows_gradient(self._weight, rows, self._pool)
        self._kept.append((tokens.clone(), gradient))
        del self._kept[:-_TOKEN_CACHE]
        return gradient


def _rows_gradient(weight, rows, pool):
    """Zeros of weight's shape with random values (from `pool`) in `rows`
    (distinct row numbers, a list or a tensor)."""
    rows = torch.as_tensor(rows, dtype=torch.long)
    gradient = torch.zeros_like(weight)
    gradient[rows] = pool[: rows.numel() * weight[0].numel()].view(rows.numel(), *weight.shape[1:])
    return gradient


def emulate(model, profile, dilation=1.0, seed=0):
    """Makes `model` (the real model `profile` was made for, checked with
    layer_models.load_profile(path, model)) an emulated one, in place: its
    forward runs the profile's layers (see the module doc) and returns
    zeros of the profile's output shape. Returns the EmulatedStream its
    layers run on. Raises ValueError for a dilation that is not positive."""
    if not dilation > 0:
        raise ValueError("dilation must be positive, not %r" % (dilation,))
    modules = dict(model.named_modules())
    named = dict(model.named_parameters())
    owner_of = {}
    for mname, module in modules.items():
        for pname in module._parameters:
            owner_of.setdefault(mname + "." + pname if mname else pname, module)
    largest = max(p.numel() for p in named.values())
    pool = torch.randn(largest, generator=torch.Generator().manual_seed(seed)) * GRADIENT_STD

    layers, pending_f, pending_b = [], 0.0, 0.0
    for entry in profile["layers"]:
        forward, backward = dilation * entry["forward_s"], dilation * entry["backward_s"]
        if not entry.get("params"):
            if layers:
                layers[-1].forward_s += forward
                layers[-1].backward_s += backward
            else:
                pending_f, pending_b = pending_f + forward, pending_b + backward
            continue
        if entry["name"] not in modules:
            raise ValueError("the model has no module %s (profile layer)" % entry["name"])
        layer = _Layer(entry["name"], modules[entry["name"]], forward + pending_f, backward + pending_b)
        pending_f = pending_b = 0.0
        for pname in entry["params"]:
            p = named[pname]
            layer.params.append(p)
            owner = owner_of[pname]
            if owner is not layer.module and owner not in layer.extra_modules:
                layer.extra_modules.append(owner)
            rows = entry.get("embedding_rows")
            if rows == "input":
                layer.gradients.append(_EmbeddingGradients(p, pool))
            elif rows is not None:
                layer.gradients.append(_rows_gradient(p, rows, pool))
            else:
                layer.gradients.append(pool[: p.numel()].view_as(p))
        layers.append(layer)
    if not layers:
        raise ValueError("the profile has no layer with parameters")

    stream = EmulatedStream()
    batch, output_shape = profile["batch"], tuple(profile["output_shape"])
    state = {"layer": None, "x": None}  # the layer model.forward is running

    def layer_forward(*args, **kwargs):
        # Replaces each layer module's forward: module.__call__ has run its
        # pre-hooks already.
        layer = state["layer"]
        for extra in layer.extra_modules:  # their parameters are read here too
            for hook in list(extra._forward_pre_hooks.values()):
                hook(extra, args)
        gradients = []
        for g in layer.gradients:
            gradients.append(g.for_tokens(state["x"]) if isinstance(g, _EmbeddingGradients) else g)
        shape = output_shape if layer is layers[-1] else (batch, 1)
        return _LayerFunction.apply(layer, stream, gradients, shape, args[0], *layer.params)

    def model_forward(x):
        if x.shape[0] != batch:
            raise ValueError("the emulated model takes batches of %d (the profile's), not %d" % (batch, x.shape[0]))
        state["x"] = x
        activation = torch.zeros(batch, 1)
        for layer in layers:
            state["layer"] = layer
            activation = layer.module(activation)
        state["layer"] = state["x"] = None
        return activation

    def prepare(x):
        # The embedding gradients of batch x, made now rather than in its
        # first backward pass.
        for layer in layers:
            for g in layer.gradients:
                if isinstance(g, _EmbeddingGradients):
                    g.for_tokens(x)

    for layer in layers:
        layer.module.forward = layer_forward
    model.forward = model_forward
    model.emulated_prepare = prepare
    model.emulated_layers = [layer.name for layer in layers]
    return stream


class EmulatedSGD(torch.optim.Optimizer):
    """An optimizer whose step() takes the profile's update time for the
    parameters it is given (update_s x their share of the model's elements x
    dilation) on the stream, and leaves them unchanged: on a GPU the update
    uses no host CPU, and the benchmark needs the time, not the values.
    Works under DDP, DistributedOptimizer and ScheduledOptimizer (which
    steps a few parameters at a time): the time per element and the stream
    travel in the param groups."""

    def __init__(self, params, profile=None, stream=None, dilation=1.0, seconds_per_element=0.0):
        if profile is not None:
            seconds_per_element = dilation * profile["update_s"] / profile["params"]
        super().__init__(params, dict(seconds_per_element=seconds_per_element, stream=stream, lr=0.0))

    def zero_grad(self, set_to_none=False):
        started = time.monotonic()
        super().zero_grad(set_to_none)
        for group in self.param_groups:
            if group["stream"] is not None:
                group["stream"].host_work(time.monotonic() - started)
                break

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise ValueError("EmulatedSGD.step() takes no closure")
        seconds, stream = 0.0, None
        for group in self.param_groups:
            seconds += group["seconds_per_element"] * sum(p.numel() for p in group["params"])
            stream = stream or group["stream"]
        if stream is not None:
            stream.run_update(seconds)
        elif seconds > 0:
            time.sleep(seconds)


def make_batches(profile, rank, count, model=None):
    """`count` batches of (input, labels) for an emulated model: token ids
    for a token model (their rows get the embedding's gradients, made here
    for `model` when given), a one-element-per-sample stand-in for images
    (nothing reads them). count must not exceed the 8 batches whose
    embedding gradients are kept."""
    if count > _TOKEN_CACHE:
        raise ValueError("at most %d distinct batches, not %d" % (_TOKEN_CACHE, count))
    g = torch.Generator().manual_seed(1000 + rank)
    spec, classes = profile["input"], profile["output_shape"][1]
    batch = profile["batch"]
    batches = []
    for _ in range(count):
        if spec["kind"] == "tokens":
            x = torch.randint(0, spec["vocab"], spec["shape"], generator=g)
        else:
            x = torch.zeros(batch, 1)
        if model is not None:
            model.emulated_prepare(x)
        batches.append((x, torch.randint(0, classes, (batch,), generator=g)))
    return batches


def load(name, profile_path, dilation, seed=0):
    """The real model `name`, its checked profile and the emulation:
    (model, description, profile, stream). Raises layer_models.ProfileError
    for a profile that does not fit."""
    model, description = layer_models.build(name)
    profile = layer_models.load_profile(profile_path, model, name)
    stream = emulate(model, profile, dilation, seed)
    return model, description, profile, stream
