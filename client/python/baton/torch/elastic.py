"""Elastic training: a lost node costs a re-form, not the job.

In the style of Horovod elastic::

    import baton.torch as bt
    import baton.torch.elastic as elastic

    bt.init()
    model = ...
    optimizer = bt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                        named_parameters=model.named_parameters())
    state = elastic.State(model=model, optimizer=optimizer, epoch=0, batch=0)

    @elastic.run
    def train(state):
        while state.epoch < epochs:
            while state.batch < batches:
                ...  # forward, backward, optimizer.step()
                state.batch += 1
                if state.batch % 10 == 0:
                    state.commit()
            state.epoch, state.batch = state.epoch + 1, 0
            state.commit()

    train(state)
    bt.shutdown()

When a node is lost (or one joins), the coordinator re-forms the job into a
new generation with new ranks and a new size. The operations in flight then
fail with BatonError (code ABORTED) at once; `run` catches it, waits for the
new generation, rolls every survivor back to its last commit(), brings every
rank (a node that joined included) to the state of the rank with the newest
commit by broadcast, calls the reset callbacks and runs the function again.
The process stays up, and so do its CUDA context and data loaders.

What happens to the operations in flight at the failure: each fails (none
runs in the next generation: the session is fenced to the generation it
synchronized in), `run` waits for all of them, the optimizers forget the
interrupted step, and the parameters are restored from the commit, so
nothing of a half-finished step stays applied.
"""

import copy
import functools
import os
import time

import torch

from baton.torch import _core as _bt

__all__ = ["State", "run"]

# BatonError.code of an operation that failed because the job re-formed:
# the generation was aborted (ABORTED), or the data plane failed before the
# coordinator named the lost node (UNAVAILABLE, DEADLINE_EXCEEDED).
_REFORM_CODES = ("ABORTED", "UNAVAILABLE", "DEADLINE_EXCEEDED")

# How long run() waits for the next generation after a failure; the
# coordinator fails the job sooner (--reform_timeout_ms) when too few nodes
# are left.
_DEFAULT_TIMEOUT_S = 600.0
# How long the operations of an interrupted step may take to fail.
_DRAIN_TIMEOUT_S = 60.0

_RESERVED = frozenset(
    (
        "model",
        "optimizer",
        "commit",
        "restore",
        "sync",
        "check_reform",
        "register_reset_callbacks",
        "commits",
        "reforms",
    )
)


class _Reformed(Exception):
    """Raised by State.commit() when the job re-formed since the last sync:
    the training function stops there, and run() takes it up again in the
    new generation from the commit just made."""


def _timeout():
    value = os.environ.get("BATON_ELASTIC_TIMEOUT", "")
    if not value:
        return _DEFAULT_TIMEOUT_S
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ValueError(
            "BATON_ELASTIC_TIMEOUT=%r: give the seconds run() waits for the job "
            "to re-form, a positive number" % value
        )
    return seconds


class State:
    """What a training function needs to go on after the job re-formed.

    State(model=None, optimizer=None, **fields): `model` (a torch.nn.Module:
    its state_dict, parameters and buffers), `optimizer` (its state_dict;
    DistributedOptimizer and ScheduledOptimizer included) and any fields
    given by keyword (epoch, batch, a sampler's position, ...; anything
    torch.save can pickle), read and written as attributes: state.epoch.

    commit() keeps an in-memory snapshot of all of them; restore() goes back
    to it. A commit costs a copy of the model and the optimizer state: make
    one every few batches, not every one.
    """

    def __init__(self, model=None, optimizer=None, **fields):
        if model is not None and not isinstance(model, torch.nn.Module):
            raise ValueError("State: model must be a torch.nn.Module, not %s" % type(model).__name__)
        if optimizer is not None and not hasattr(optimizer, "state_dict"):
            raise ValueError(
                "State: optimizer must be a torch.optim optimizer (or baton's), not %s"
                % type(optimizer).__name__
            )
        clash = sorted(k for k in fields if k in _RESERVED or k.startswith("_"))
        if clash:
            raise ValueError(
                "State: field name(s) %s are taken by State itself; rename them" % ", ".join(clash)
            )
        self.model = model
        self.optimizer = optimizer
        self._fields = list(fields)
        for key, value in fields.items():
            setattr(self, key, value)
        self._callbacks = []
        # Commits so far, the same on every rank after a sync (0: none).
        self.commits = 0
        self._saved = None
        # The generation this state was last synchronized in.
        self._generation = None
        # One dict per re-form this rank went through, for logs and
        # benchmarks: from_generation, generation, size, cause (the error
        # that stopped the function), failed_at and synced_at (time.time()).
        self.reforms = []

    def register_reset_callbacks(self, callbacks):
        """Functions called (without arguments) after every re-form, once
        the state is synchronized: rescale the learning rate to the new
        bt.size(), re-shard the data for the new bt.rank(), ..."""
        for callback in callbacks:
            if not callable(callback):
                raise ValueError("State: reset callback %r is not callable" % (callback,))
            self._callbacks.append(callback)

    def commit(self):
        """Snapshots the state in memory (after ScheduledOptimizer's pending
        updates are applied). If the job re-formed meanwhile, the training
        function stops here and run() resumes it in the new generation."""
        self.commits += 1
        self._save()
        self.check_reform()

    def check_reform(self):
        """Stops the training function (to be resumed by run() in the new
        generation, from the last commit) if the job re-formed since the
        last sync, or if nodes wait to join (then it admits them): for a
        rank that waits without communicating (Horovod's
        check_host_updates). commit() calls it."""
        session = _bt._require()
        if self._generation is None:
            return
        if session.generation() == self._generation and session.join_pending():
            # Nodes wait to join: admit them here, where every rank resumes
            # from this state (a rank that went past it cannot have
            # finished a step without this one, so it rolls back to it).
            session.admit_joins()
            raise _Reformed()
        if session.generation() != self._generation:
            raise _Reformed()

    def restore(self):
        """Goes back to the last commit (the state at the last sync when
        nothing was committed since)."""
        if self._saved is None:
            return
        saved = self._saved
        if self.model is not None:
            self.model.load_state_dict(saved["model"])
        if self.optimizer is not None:
            _inner(self.optimizer).load_state_dict(copy.deepcopy(saved["optimizer"]))
        for key, value in copy.deepcopy(saved["fields"]).items():
            setattr(self, key, value)
        self.commits = saved["commits"]

    def sync(self, root_rank=0):
        """Makes every rank's state root_rank's, exactly (broadcast), and
        commits it."""
        if self.model is not None:
            _bt.broadcast_parameters(self.model.state_dict(), root_rank)
        if self.optimizer is not None:
            _bt.broadcast_optimizer_state(self.optimizer, root_rank)
        fields = {key: getattr(self, key) for key in self._fields}
        fields, commits = _bt.broadcast_object(
            (fields, self.commits) if _bt.rank() == root_rank else None, root_rank, "ElasticState"
        )
        for key, value in fields.items():
            setattr(self, key, value)
        self.commits = commits
        self._save()

    def _save(self):
        _settle(self.optimizer)
        saved = {"fields": copy.deepcopy({key: getattr(self, key) for key in self._fields})}
        if self.model is not None:
            saved["model"] = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        if self.optimizer is not None:
            saved["optimizer"] = copy.deepcopy(_inner(self.optimizer).state_dict())
        saved["commits"] = self.commits
        self._saved = saved


def _inner(optimizer):
    """The torch optimizer holding the state (ScheduledOptimizer wraps one)."""
    return getattr(optimizer, "optimizer", optimizer)


def _settle(optimizer):
    """Waits until ScheduledOptimizer applied every update started."""
    finalize = getattr(optimizer, "finalize", None)
    if finalize is not None:
        finalize()


def _is_reform(error):
    return isinstance(error, _bt.BatonError) and getattr(error, "code", None) in _REFORM_CODES


def _agree(session, state, generation):
    """The first operation of a generation: every rank says the highest
    step its tensors are at and how many commits it has. Returns the rank
    whose state every rank takes (the lowest with the most commits) and the
    step floor (the highest step), or None when the job moved on while this
    rank read its size and rank."""
    size, rank = session.size(), session.rank()
    if session.generation() != generation:
        return None
    session.fence_generation(generation)
    mine = torch.zeros(2 * size, dtype=torch.int64)
    mine[2 * rank] = session.next_step()
    mine[2 * rank + 1] = state.commits
    # A name of its own per generation (and size): it is new on every rank,
    # so its one operation takes step 0 everywhere, a joiner's included.
    everyone = _bt.push_pull(mine, average=False, name="baton.elastic.agree.%d.%d" % (generation, size))
    steps, commits = everyone[0::2], everyone[1::2]
    newest = int(commits.max())
    root = int((commits == newest).nonzero()[0])
    return root, int(steps.max())


def _wait_for_generation(session, after, deadline):
    left = deadline - time.monotonic()
    try:
        if left <= 0:
            raise TimeoutError("no time left")
        session.wait_for_generation(after, left)
    except TimeoutError:
        raise _bt.BatonError(
            "baton.torch.elastic: the job did not re-form after generation %d "
            "within %.0f s (BATON_ELASTIC_TIMEOUT)" % (after, _timeout())
        ) from None


def _synchronize(session, state, after, restore, deadline):
    """Brings this rank into the job's current generation (one newer than
    `after`, if given): rolls back to the last commit (`restore`), agrees on
    the root and the step floor, and takes the root's state. Starts over
    while the job re-forms again meanwhile, until `deadline`."""
    while True:
        if after is not None:
            _wait_for_generation(session, after, deadline)
        if restore:
            state.restore()
        generation = session.generation()
        try:
            agreed = _agree(session, state, generation)
            if agreed is None:
                after = None
                continue
            root, floor = agreed
            session.set_step_floor(floor)
            state.sync(root)
            state._generation = generation
            return
        except Exception as e:  # noqa: B902 - re-raised unless a re-form
            if not _is_reform(e):
                raise
            _quiesce(state)
            after = generation
            # A state half-written by an interrupted broadcast goes back to
            # the commit (a joiner's to what it was given at the start).
            restore = True


def _quiesce(state):
    """After a failure: waits for what is in flight (it fails at once), and
    makes the optimizers forget the interrupted step."""
    optimizer = state.optimizer
    reset = getattr(optimizer, "_reset", None)
    if reset is not None:
        reset()
    _bt._abandon_in_flight(_DRAIN_TIMEOUT_S)
    if state.model is not None:
        with torch.no_grad():
            for p in state.model.parameters():
                if p.grad is not None:
                    p.grad.zero_()


def run(func):
    """Decorates a training function `func(state, *args, **kwargs)` so that
    it survives re-forms of the job (see the module's doc). The first call
    synchronizes every rank to rank 0's state (as Horovod's does); after a
    re-form, to the newest commit. Errors other than a re-form propagate, and
    so does a re-form that does not complete within BATON_ELASTIC_TIMEOUT
    seconds (default 600) or that the coordinator gives up on (fewer than
    min_nodes nodes within its --reform_timeout_ms): BatonError naming why.
    """

    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        if not isinstance(state, State):
            raise ValueError(
                "baton.torch.elastic.run: the first argument must be a "
                "baton.torch.elastic.State, not %s" % type(state).__name__
            )
        session = _bt._require()
        timeout = _timeout()
        after = None
        reform = None
        while True:
            _synchronize(session, state, after, after is not None, time.monotonic() + timeout)
            if reform is not None:
                reform.update(generation=state._generation, size=session.size(), synced_at=time.time())
                state.reforms.append(reform)
                for callback in state._callbacks:
                    callback()
            try:
                result = func(state, *args, **kwargs)
                _settle(state.optimizer)
                return result
            except _Reformed:
                reform = {"cause": "the job re-formed (seen at a commit)"}
            except Exception as e:  # noqa: B902 - re-raised unless a re-form
                if not _is_reform(e):
                    raise
                reform = {"cause": str(e)}
            reform.update(from_generation=state._generation, failed_at=time.time())
            after = state._generation
            _quiesce(state)

    return wrapper
