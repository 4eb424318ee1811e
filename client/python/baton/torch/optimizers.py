"""DistributedOptimizer (Horovod style) and ScheduledOptimizer (ByteScheduler
style: per-parameter updates overlapping the next forward pass).

Parameters without a gradient. At every step both average the gradient of
every parameter of the optimizer that has requires_grad=True at that step,
on every rank: one whose gradient backward did not produce on this rank (an
unused branch, a parameter switched on since the last step) goes with its
.grad as it is, or zeros where it has none, as in Horovod. So every rank
starts the same push-pulls whichever parameters got gradients, and applies
the same average (a parameter no rank computed a gradient for is averaged
to zeros and stepped with them). A parameter with requires_grad=False is
not communicated: DistributedOptimizer leaves its .grad to the wrapped
optimizer as plain PyTorch does (None: skipped); ScheduledOptimizer does
not update it. requires_grad must be the same on every rank, and change
only between step() and the next forward pass; a parameter created with
requires_grad=False joins at the first step() where it has it.
"""

import contextlib
import queue
import threading
import warnings

import torch

from baton.torch import _core as _bt
from baton.torch import compression as _compression


def _gradient_hook_node(p):
    """The AccumulateGrad node of leaf `p`: its hooks run after the gradient
    was accumulated into p.grad (torch 1.13 has no post-accumulate hook)."""
    return p.expand_as(p).grad_fn.next_functions[0][0]


def _named_optimizer_params(optimizer, named_parameters):
    """[(name, param)] for every parameter of `optimizer`, in group order."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if named_parameters is None:
        return [("param.%d" % i, p) for i, p in enumerate(params)]
    named = list(named_parameters)
    if any(not isinstance(item, tuple) or len(item) != 2 for item in named):
        raise ValueError(
            "named_parameters must be (name, parameter) pairs, such as "
            "model.named_parameters()"
        )
    names = [name for name, _ in named]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError("named_parameters has duplicate names: %s" % ", ".join(duplicates))
    name_of = {id(p): name for name, p in named}
    unnamed = [i for i, p in enumerate(params) if id(p) not in name_of]
    if unnamed:
        raise ValueError(
            "named_parameters does not name every parameter of the optimizer "
            "(parameters %s of its param groups are missing); pass "
            "model.named_parameters() of the model the optimizer trains" % unnamed
        )
    return [(name_of[id(p)], p) for p in params]


def _accumulate_in_shared_memory(named_params):
    """Makes each host parameter's .grad a tensor in its push-pull's shared
    input region (holding the gradient it had, or zeros): autograd then
    accumulates there in place (zero_grad() zeroes in place too), and the
    in-place push-pull copies nothing in. With zero_grad(set_to_none=True)
    the next backward allocates a new .grad, which is copied in as before.
    Only for DistributedOptimizer, whose push-pulls all complete in step():
    like Horovod's in-place allreduce, p.grad must not be changed between
    backward() and step(). Returns {param: (input view, result view)}."""
    shared = {}
    for name, p in named_params:
        views = _bt._shared_views(name, p)
        if views is None:
            continue
        with torch.no_grad():
            if p.grad is not None:
                views[0].copy_(p.grad)
            else:
                views[0].zero_()
        p.grad = views[0]
        shared[p] = views
    return shared


class _DistributedOptimizer(torch.optim.Optimizer):
    # Set by a ScheduledOptimizer that wraps this one (BytePS's CrossBarrier
    # form): it push-pulls the gradients itself, so the hooks stand down.
    _scheduled = False

    def __init__(self, params, named_parameters, compression, backward_passes_per_step, state):
        super(self.__class__, self).__init__(params)
        self.state = state
        if backward_passes_per_step < 1:
            raise ValueError(
                "backward_passes_per_step must be at least 1, not %r" % (backward_passes_per_step,)
            )
        self.backward_passes_per_step = backward_passes_per_step
        _compression.check(compression)
        self._compression = compression
        named = _named_optimizer_params(self, named_parameters)
        self._names = {p: "Gradient." + name for name, p in named}
        self._handles = {}
        self._synchronized = False
        # False inside skip_synchronize(): step() leaves the gradients as
        # synchronize() averaged them.
        self._should_synchronize = True
        self._warned_resync = False
        self._delay = {p: backward_passes_per_step for _, p in named}
        # Parameter -> its AccumulateGrad node, which holds the hook; kept so
        # the node (and the hook) outlives requires_grad switched off and on.
        self._grad_accs = {}
        trained = [(self._names[p], p) for _, p in named if p.requires_grad]
        # First declared = most urgent: the parameters' order is the forward
        # pass's order for models built the usual way.
        _accumulate_in_shared_memory(_compression.declare_many(compression, trained))
        for _, p in trained:
            self._hook(p)

    def _hook(self, p):
        node = _gradient_hook_node(p)
        node.register_hook(self._make_hook(p))
        self._grad_accs[p] = node

    def _make_hook(self, p):
        def hook(*_):
            if self._scheduled:
                return
            if p in self._handles and self._delay[p] <= 0:
                raise AssertionError(
                    "parameter %s got more than backward_passes_per_step=%d "
                    "gradients before step(); raise backward_passes_per_step "
                    "to accumulate gradients locally" % (self._names[p], self.backward_passes_per_step)
                )
            self._delay[p] -= 1
            if self._delay[p] == 0:
                self._start(p)

        return hook

    def _start(self, p):
        self._handles[p] = _bt.push_pull_async_inplace(
            p.grad, average=True, name=self._names[p], compression=self._compression
        )

    def synchronize(self):
        """Waits until the gradient of every parameter that requires grad is
        averaged across ranks, in place in p.grad. Those whose hooks did not
        fire are push-pulled here: with zeros where this rank has no .grad
        (an unused branch), so every rank starts the same operations and
        ends with the same p.grad. A parameter switched on since it was
        created gets its hook here, from the next step on."""
        if self._scheduled:
            raise ValueError(
                "this DistributedOptimizer is driven by a ScheduledOptimizer, which "
                "averages the gradients itself: call the ScheduledOptimizer's step()"
            )
        for group in self.param_groups:
            for p in group["params"]:
                if p.requires_grad and p not in self._handles:
                    if p not in self._grad_accs:
                        named = [(self._names[p], p)]
                        _accumulate_in_shared_memory(_compression.declare_many(self._compression, named))
                        self._hook(p)
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
                    self._start(p)
        handles, self._handles = self._handles, {}
        try:
            for handle in handles.values():
                _bt.synchronize(handle)
        finally:
            for p in self._delay:
                self._delay[p] = self.backward_passes_per_step
        self._synchronized = True

    def step(self, closure=None):
        """Averages the gradients (unless synchronize() already did, e.g.
        for gradient clipping) and runs the optimizer."""
        if self._should_synchronize and self._synchronized and not self._warned_resync:
            # Horovod averages again here (and warns); baton does not, but
            # says so, for scripts that run on both.
            self._warned_resync = True
            warnings.warn(
                "optimizer.step() called after optimizer.synchronize() without the "
                "optimizer.skip_synchronize() context: baton uses the gradients "
                "synchronize() averaged (Horovod would average them again); write "
                "`with optimizer.skip_synchronize(): optimizer.step()`"
            )
        if not self._synchronized:
            if not self._should_synchronize:
                raise ValueError(
                    "optimizer.step() inside optimizer.skip_synchronize() without "
                    "optimizer.synchronize() first: the gradients are not averaged"
                )
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Horovod's: step() inside it runs the optimizer on the gradients a
        synchronize() before it averaged (clip them in between)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def _reset(self):
        """After a re-form (baton.torch.elastic, which has waited for every
        push-pull in flight): the interrupted step's push-pulls are
        forgotten, and the next backward pass starts a step afresh."""
        self._handles = {}
        self._synchronized = False
        for p in self._delay:
            self._delay[p] = self.backward_passes_per_step

    def zero_grad(self, set_to_none=False):
        if self._handles:
            raise AssertionError(
                "optimizer.zero_grad() was called after loss.backward() but "
                "before optimizer.step() or optimizer.synchronize(): the "
                "gradients in flight would be lost"
            )
        return super(self.__class__, self).zero_grad(set_to_none)


def DistributedOptimizer(optimizer, named_parameters=None, compression=None, backward_passes_per_step=1):
    """Wraps a torch.optim optimizer so that step() uses gradients averaged
    across every rank.

    Each gradient is push-pulled (as tensor "Gradient.<name>") as soon as
    backward produces it, so communication overlaps the rest of backward;
    step() waits for all of them, then runs the optimizer. The result is an
    instance of the optimizer's own class (LR schedulers and state_dict work
    as usual) sharing its param groups and state. With
    backward_passes_per_step=N, gradients accumulate locally over N backward
    passes before they are averaged. `compression` (Compression.fp16, ...;
    None or Compression.none: none) is what the gradients travel as
    (baton.torch.compression); the arguments are in Horovod's and BytePS's
    order.
    """
    cls = type(
        optimizer.__class__.__name__,
        (optimizer.__class__,),
        dict(_DistributedOptimizer.__dict__),
    )
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step, optimizer.state)


def _distributed_names(optimizer):
    """{param: tensor name} of a DistributedOptimizer that a ScheduledOptimizer
    may wrap; None for a plain optimizer."""
    if getattr(optimizer, "_scheduled", None) is None or not hasattr(optimizer, "_names"):
        return None
    if optimizer._scheduled:
        raise ValueError("this DistributedOptimizer is wrapped by a ScheduledOptimizer already")
    if optimizer.backward_passes_per_step != 1:
        raise ValueError(
            "ScheduledOptimizer cannot wrap a DistributedOptimizer with "
            "backward_passes_per_step=%d: it applies every step's gradients"
            % optimizer.backward_passes_per_step
        )
    if optimizer._handles:
        raise ValueError(
            "the DistributedOptimizer has push-pulls in flight: wrap it in a "
            "ScheduledOptimizer before the first backward pass"
        )
    return optimizer._names


class _ParamStateView:
    """optimizer.state seen through stand-in keys: the per-parameter step
    runs on aliases of the parameters, and their state is the parameters'."""

    def __init__(self, state, params_by_alias):
        # id(alias) -> parameter
        self._state, self._params = state, params_by_alias

    def _key(self, key):
        return self._params.get(id(key), key)

    def __getitem__(self, key):
        return self._state[self._key(key)]

    def __setitem__(self, key, value):
        self._state[self._key(key)] = value

    def __contains__(self, key):
        return self._key(key) in self._state

    def get(self, key, default=None):
        return self._state.get(self._key(key), default)


class _Slot:
    """One parameter under a ScheduledOptimizer."""

    __slots__ = ("name", "param", "index", "group", "gate", "output", "node", "handle", "iteration")

    def __init__(self, name, param, index, group):
        self.name = name
        self.param = param
        self.index = index  # the model's parameter order = priority
        self.group = group  # index into the optimizer's param_groups
        self.gate = threading.Event()
        self.gate.set()
        # Set once the parameter first requires grad (ScheduledOptimizer.
        # _activate): where the averaged gradient lands (the push-pull's
        # shared result region for host parameters), and the AccumulateGrad
        # node holding the gradient hook.
        self.output = None
        self.node = None
        self.handle = None  # the push-pull in flight, until applied
        self.iteration = None  # the step() it belongs to


class ScheduledOptimizer:
    """Cross-iteration scheduling: the next forward pass of a layer starts as
    soon as that layer's own parameters are updated.

    Each parameter has a gate. A gradient hook closes it and starts the
    gradient's push-pull ("Gradient.<name>", priority by declaration order:
    the model's parameter order) the moment backward produces it. When the
    push-pull completes (after step() of that iteration was called), the
    background thread updates that one parameter with `optimizer` itself --
    its class's own step(), its param groups' hyperparameters as they were
    when step() was called, its state -- and opens the gate. A forward
    pre-hook on every module that owns parameters waits for the gates of its
    own parameters only.

    step() returns at once, except at step number `num_steps`, which waits
    until every update is applied. finalize() (also called on exit, by
    baton.torch.shutdown(), and when a `with` block ends) drains everything
    regardless, so a wrong num_steps never hangs and never loses an update.

    p.grad keeps this rank's local gradient; the averaged gradient goes
    straight into the update. Create LR schedulers on `optimizer`.

    `compression` (baton.torch.compression) is what the gradients travel
    as; a wrapped DistributedOptimizer's compression applies when it is
    not given.

    A parameter that requires grad but got no gradient from backward (an
    unused branch) is push-pulled at step(), with zeros where it has no
    .grad, so every rank applies the same update (see the module's doc).
    """

    def __init__(self, model, optimizer, num_steps=10**6, compression=None):
        if not isinstance(model, torch.nn.Module):
            raise ValueError("model must be a torch.nn.Module, not %s" % type(model).__name__)
        # BytePS's form (its CrossBarrier wraps a DistributedOptimizer): the
        # gradients go once, through this class's per-parameter push-pulls
        # under the DistributedOptimizer's names and with its compression,
        # and updates run its wrapped optimizer's own step().
        distributed = _distributed_names(optimizer)
        _compression.check(compression)
        if distributed is not None:
            wrapped = optimizer._compression
            if compression is not None and wrapped is not None and compression is not wrapped:
                raise ValueError(
                    "ScheduledOptimizer(compression=%r) wraps a DistributedOptimizer "
                    "with compression=%r: give it to one of them" % (compression, wrapped)
                )
            compression = wrapped if compression is None else compression
        self._step_class = type(optimizer).__mro__[1] if distributed is not None else type(optimizer)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ValueError(
                "optimizer must be a torch.optim.Optimizer, not %s" % type(optimizer).__name__
            )
        if isinstance(optimizer, torch.optim.LBFGS):
            raise ValueError("ScheduledOptimizer cannot run LBFGS: it needs a closure per step")
        if not isinstance(num_steps, int) or num_steps < 1:
            raise ValueError("num_steps must be a positive int, not %r" % (num_steps,))
        self.optimizer = optimizer
        self.model = model
        self.num_steps = num_steps
        self._compression = compression

        group_of = {}
        for g, group in enumerate(optimizer.param_groups):
            for p in group["params"]:
                group_of[p] = g
        in_model = {p for p in model.parameters()}
        stray = [i for i, p in enumerate(group_of) if p not in in_model]
        if stray:
            raise ValueError(
                "the optimizer holds parameters that are not the model's "
                "(positions %s in its param groups): ScheduledOptimizer updates "
                "a parameter before the forward pass of the module that owns it" % stray
            )
        # Every parameter of the optimizer, frozen ones too: one may be
        # switched on later.
        self._slots = {}
        for name, p in model.named_parameters():
            if p in group_of:
                gradient = (distributed or {}).get(p, "Gradient." + name)
                self._slots[p] = _Slot(gradient, p, len(self._slots), group_of[p])
        if distributed is not None:
            optimizer._scheduled = True
            # Its .grad tensors are its push-pulls' shared inputs; here the
            # next zero_grad() runs while they are in flight: private again.
            for p in group_of:
                if p.grad is not None:
                    p.grad = p.grad.detach().clone()
        trained = [s for s in self._slots.values() if s.param.requires_grad]
        _compression.declare_many(compression, [(s.name, s.param) for s in trained])
        self._cv = threading.Condition()
        self._iteration = 0  # step() calls so far
        self._unreleased = []  # slots pushed in the current iteration
        self._submitted = 0  # batches handed to the applier
        self._finished = 0  # batches it finished
        self._error = None
        self._error_delivered = False  # raised to the caller once already
        self._queue = queue.Queue()
        self._hooks = []
        for module in model.modules():
            read = list(module._parameters.values())
            if isinstance(module, torch.nn.MultiheadAttention) and module.out_proj is not None:
                # Its forward reads out_proj's parameters without calling
                # out_proj, whose own gate therefore never runs.
                read += list(module.out_proj._parameters.values())
            own = [self._slots[p] for p in read if p in self._slots]
            if own:
                self._hooks.append(module.register_forward_pre_hook(self._make_gate_hook(own)))
        for slot in trained:
            self._activate(slot)
        self._thread = threading.Thread(
            target=self._apply_loop, name="baton-scheduled-optimizer", daemon=True
        )
        self._thread.start()
        _bt._drainers.add(self)

    def _activate(self, slot):
        """Readies a parameter that requires grad (declared already): its
        output and its gradient hook. The results land in the push-pulls'
        shared result regions, where the update reads them: nothing is
        copied out. p.grad stays the user's (copied in when its push-pull
        starts), because the next iteration's zero_grad() -- the model's
        too -- runs while the push-pulls are still in flight. A compressed
        gradient is decompressed into an ordinary tensor instead."""
        views = None
        if not _compression.compresses(self._compression, slot.name, slot.param):
            views = _bt._shared_views(slot.name, slot.param)
        if views is not None:
            slot.output = views[1]
        else:
            slot.output = torch.empty_like(slot.param, memory_format=torch.contiguous_format)
        slot.node = _gradient_hook_node(slot.param)
        slot.node.register_hook(self._make_gradient_hook(slot))

    # --- hooks (training thread) ---

    def _make_gate_hook(self, slots):
        def gate_hook(module, inputs):
            for slot in slots:
                self._wait_applied(slot)
            self._raise_if_failed()

        gate_hook.slots = slots  # what it waits for (the tests read it)
        return gate_hook

    def _make_gradient_hook(self, slot):
        def gradient_hook(*_):
            self._raise_if_failed()
            if slot.handle is not None and slot.iteration == self._iteration:
                raise RuntimeError(
                    "ScheduledOptimizer: parameter %s got a second gradient "
                    "before step(); call step() after every backward pass "
                    "(to accumulate gradients over several passes use "
                    "DistributedOptimizer(backward_passes_per_step=N))" % slot.name[len("Gradient."):]
                )
            self._start(slot, slot.param.grad)

        return gradient_hook

    def _start(self, slot, gradient):
        """Starts `slot`'s push-pull of `gradient` for the current iteration,
        once its previous update is applied."""
        if slot.handle is not None:
            self._wait_applied(slot)
        handle = _bt._push_pull_async_to(gradient, slot.output, slot.name, self._compression)
        slot.gate.clear()
        slot.iteration = self._iteration
        slot.handle = handle
        with self._cv:
            self._unreleased.append(slot)

    def _start_missing(self):
        """Push-pulls, in priority order, every parameter that requires grad
        but whose hook did not fire this iteration (an unused branch, or
        requires_grad switched on since the last step): its .grad, or zeros
        where it has none. Every rank then starts the same push-pulls and
        applies the same averages."""
        for slot in self._slots.values():
            if not slot.param.requires_grad or slot.iteration == self._iteration:
                continue
            if slot.node is None:
                _compression.declare_many(self._compression, [(slot.name, slot.param)])
                self._activate(slot)
            grad = slot.param.grad
            self._start(slot, grad if grad is not None else torch.zeros_like(slot.param))

    def _wait_applied(self, slot):
        """Waits for `slot`'s update when its step() was called already; an
        update not yet due (no step() since its backward) leaves the
        parameter as it is, as in plain PyTorch."""
        if slot.gate.is_set() or slot.iteration == self._iteration:
            return
        while not slot.gate.wait(0.5):
            if not self._thread.is_alive():
                raise _bt.BatonError(
                    "ScheduledOptimizer's update thread stopped; "
                    "parameter %s will not be updated" % slot.name
                )
        self._raise_if_failed()

    def _raise_if_failed(self):
        if self._error is not None:
            self._error_delivered = True
            raise self._error

    # --- the optimizer API ---

    def step(self, closure=None):
        """Ends the iteration: its updates are applied in the background as
        their push-pulls complete (at step `num_steps`, waits for them)."""
        if closure is not None:
            raise ValueError("ScheduledOptimizer.step() takes no closure")
        self._raise_if_failed()
        self._start_missing()
        # The hyperparameters of this iteration, before an LR scheduler
        # changes them for the next one.
        snapshot = [
            {k: v for k, v in group.items() if k != "params"}
            for group in self.optimizer.param_groups
        ]
        with self._cv:
            batch, self._unreleased = self._unreleased, []
            self._iteration += 1
            self._submitted += 1
        self._queue.put((batch, snapshot))
        if hasattr(self.optimizer, "_step_count"):
            # What the optimizer's own step() would count for LR schedulers.
            self.optimizer._step_count += 1
        if self._iteration == self.num_steps:
            self.finalize()

    def zero_grad(self, set_to_none=False):
        """The wrapped optimizer's zero_grad (safe at any time: push-pulls
        copy p.grad when they start, and updates never read it)."""
        return self.optimizer.zero_grad(set_to_none)

    def finalize(self):
        """Waits until every update of every step() so far is applied. A
        backward pass with no step() after it has its push-pulls finished and
        its gradients left unapplied, as plain PyTorch would."""
        with self._cv:
            stray, self._unreleased = self._unreleased, []
            if stray:
                self._submitted += 1
        if stray:
            self._queue.put((stray, None))
        with self._cv:
            while self._finished < self._submitted:
                if not self._thread.is_alive():
                    raise _bt.BatonError("ScheduledOptimizer's update thread stopped")
                self._cv.wait(0.5)
        self._raise_if_failed()

    def _reset(self):
        """After a re-form (baton.torch.elastic): waits for the push-pulls in
        flight (they fail at once; none is applied after a failure), then
        forgets the failure, so that the next iteration starts afresh on the
        parameters as baton.torch.elastic restored them."""
        try:
            self.finalize()
        except Exception:  # noqa: B902 - the failure that caused the re-form
            pass
        self._error = None
        self._error_delivered = False
        for slot in self._slots.values():
            slot.handle = None
            slot.iteration = None
            slot.gate.set()

    def close(self):
        """finalize(), then stop the update thread and remove the hooks. An
        error already raised by step(), a forward pass or finalize() is not
        raised again."""
        interrupted = False
        try:
            self.finalize()
        except KeyboardInterrupt:
            interrupted = True
            raise
        except BaseException:  # noqa: B902 - raised unless delivered before
            if not self._error_delivered or self._error is None:
                raise
        finally:
            self._queue.put(None)
            if not interrupted:
                # After Ctrl-C it may wait for a push-pull that never ends
                # (a daemon thread: shutdown abandons the push-pull).
                self._thread.join()
            for hook in self._hooks:
                hook.remove()
            self._hooks = []
            for slot in self._slots.values():
                _bt._release_shared(slot.name, slot.param)
                slot.node = None
            _bt._drainers.discard(self)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.finalize()
        else:
            try:
                self.finalize()
            except BaseException:  # noqa: B902 - the original error wins
                pass
        return False

    def __getattr__(self, name):
        # param_groups, state, state_dict(), add_param_group(), ...
        if name == "optimizer":
            raise AttributeError(name)
        return getattr(self.optimizer, name)

    # --- the update thread ---

    def _apply_loop(self):
        while True:
            item = self._queue.get()
            if item is None:
                return
            batch, snapshot = item
            # Priority order: what the next forward pass needs first. The
            # push-pulls that follow the one waited for and have completed
            # too are applied with it, in one call of the optimizer's step()
            # per param group: a Python optimizer's cost per call is paid
            # per run of completed updates, not per parameter.
            pending = sorted(batch, key=lambda s: s.index)
            while pending:
                run = 1
                while run < len(pending) and _bt.poll(pending[run].handle):
                    run += 1
                ready, pending = pending[:run], pending[run:]
                applied = []
                for slot in ready:
                    try:
                        _bt.synchronize(slot.handle)
                        applied.append(slot)
                    except BaseException as e:  # noqa: B902 - raised in the trainer
                        if self._error is None:
                            self._error = e
                try:
                    if snapshot is not None and self._error is None:
                        self._apply(applied, snapshot)
                except BaseException as e:  # noqa: B902 - raised in the trainer
                    if self._error is None:
                        self._error = e
                finally:
                    for slot in ready:
                        slot.handle = None
                        slot.gate.set()
            if self._error is not None:
                for slot in self._slots.values():
                    slot.gate.set()
            with self._cv:
                self._finished += 1
                self._cv.notify_all()

    def _apply(self, slots, snapshot):
        """Runs the optimizer's own step() on these parameters only, one call
        per param group, with the group's hyperparameters of `snapshot`."""
        optimizer = self.optimizer
        by_group = {}
        for slot in slots:
            by_group.setdefault(slot.group, []).append(slot)
        for g, group_slots in by_group.items():
            aliases, params = [], {}
            for slot in group_slots:
                alias = slot.param.data  # same storage, its own .grad
                alias.grad = slot.output
                aliases.append(alias)
                params[id(alias)] = slot.param
            group = dict(snapshot[g])
            group["params"] = aliases
            view = object.__new__(self._step_class)
            view.__dict__.update(optimizer.__dict__)
            view.__dict__["param_groups"] = [group]
            view.__dict__["state"] = _ParamStateView(optimizer.state, params)
            self._step_class.step(view)
