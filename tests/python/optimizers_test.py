"""ScheduledOptimizer and DistributedOptimizer against a single-process
reference. Run on every rank of a job by batonrun (see
tests/python/CMakeLists.txt): each rank trains on its own batches, and its
parameters must equal one process training on the union of all ranks'
batches with the same optimizer."""

import sys
import warnings

import torch

import baton.torch as bt
from harness import run_tests

STEPS = 6
BATCH = 8


class Net(torch.nn.Module):
    """Owns a parameter directly and through children, as real models do."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(16))
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh())
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.head(self.body(x) * self.scale)


def make_model():
    torch.manual_seed(7)
    return Net()


def batch(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(BATCH, 8, generator=g)
    y = torch.randn(BATCH, 4, generator=g)
    return x, y


def loss_fn(model, x, y):
    return torch.nn.functional.mse_loss(model(x), y)


def reference(make_optimizer, steps, with_scheduler=False):
    """One process, every rank's batch each step."""
    model = make_model()
    optimizer = make_optimizer(model)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 2, 0.5) if with_scheduler else None
    for step in range(steps):
        xs, ys = zip(*(batch(step, r) for r in range(bt.size())))
        optimizer.zero_grad()
        loss_fn(model, torch.cat(xs), torch.cat(ys)).backward()
        optimizer.step()
        if scheduler:
            scheduler.step()
    return model


def assert_same(model, expected, what):
    for (name, p), q in zip(model.named_parameters(), expected.parameters()):
        diff = (p.detach() - q.detach()).norm() / q.detach().norm()
        assert diff <= 1e-5, "%s: parameter %s differs from the reference by %.3g (relative)" % (
            what,
            name,
            diff,
        )
    # And the job agrees: rank 0's values reach every rank bit for bit.
    for name, p in model.named_parameters():
        mine = p.detach().clone()
        root = p.detach().clone()
        bt.broadcast(root, 0, "Check." + name)
        assert torch.equal(mine, root), "%s: rank %d's %s differs from rank 0's" % (
            what,
            bt.rank(),
            name,
        )


def train_scheduled(make_optimizer, num_steps, steps, with_scheduler=False, use_with=False):
    model = make_model()
    inner = make_optimizer(model)
    scheduler = torch.optim.lr_scheduler.StepLR(inner, 2, 0.5) if with_scheduler else None
    optimizer = bt.ScheduledOptimizer(model, inner, num_steps=num_steps)

    def loop():
        for step in range(steps):
            x, y = batch(step, bt.rank())
            optimizer.zero_grad()
            loss_fn(model, x, y).backward()
            optimizer.step()
            if scheduler:
                scheduler.step()

    if use_with:
        with optimizer:
            loop()
    else:
        loop()
        optimizer.finalize()
    optimizer.close()
    return model


def sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)


def adam(model):
    return torch.optim.Adam(model.parameters(), lr=0.01)


def test_scheduled_sgd_momentum_matches_union_training():
    model = train_scheduled(sgd, STEPS, STEPS, with_scheduler=True)
    assert_same(model, reference(sgd, STEPS, with_scheduler=True), "SGD momentum")


def test_scheduled_adam_matches_union_training():
    model = train_scheduled(adam, STEPS, STEPS)
    assert_same(model, reference(adam, STEPS), "Adam")


def test_num_steps_larger_than_the_real_count_finishes_with_every_update():
    model = train_scheduled(adam, 10 * STEPS, STEPS, use_with=True)
    assert_same(model, reference(adam, STEPS), "num_steps too large")


def test_num_steps_smaller_than_the_real_count_finishes_with_every_update():
    model = train_scheduled(sgd, STEPS // 2, STEPS)
    assert_same(model, reference(sgd, STEPS), "num_steps too small")


def test_scheduled_over_a_distributed_optimizer_is_the_plain_form():
    """BytePS's CrossBarrier form, ScheduledOptimizer(model,
    DistributedOptimizer(opt, named_parameters), num_steps): the gradients
    go once (before, both pushed them and backward raised 'already has an
    operation in flight', then the trainers hung at exit), and the result
    is the plain form's, bit for bit."""
    wrapped = {}

    def distributed_sgd(model):
        wrapped["optimizer"] = bt.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters())
        return wrapped["optimizer"]

    model = train_scheduled(distributed_sgd, STEPS, STEPS, with_scheduler=True)
    plain = train_scheduled(sgd, STEPS, STEPS, with_scheduler=True)
    for (name, p), q in zip(model.named_parameters(), plain.parameters()):
        assert torch.equal(p, q), "%s differs from the plain form's" % name
    try:
        wrapped["optimizer"].synchronize()
    except ValueError as e:
        assert "driven by a ScheduledOptimizer" in str(e), e
    else:
        raise AssertionError("the wrapped DistributedOptimizer synchronized on its own")


def test_results_and_gradients_live_in_shared_memory():
    """ScheduledOptimizer's averaged gradients land in the push-pulls' shared
    result regions (nothing copied out) while p.grad stays the user's: the
    model's own zero_grad(), called while push-pulls are still in flight,
    changes nothing. DistributedOptimizer keeps p.grad in the shared input
    region (nothing copied in)."""
    model = make_model()
    optimizer = bt.ScheduledOptimizer(model, sgd(model), num_steps=STEPS)
    for name, p in model.named_parameters():
        _, result = bt._core._require().host_regions("Gradient." + name)
        slot = optimizer._slots[p]
        assert slot.output.data_ptr() == torch.frombuffer(result, dtype=torch.uint8).data_ptr(), name
    for step in range(STEPS):
        x, y = batch(step, bt.rank())
        model.zero_grad()  # the previous step's push-pulls may be in flight
        loss_fn(model, x, y).backward()
        optimizer.step()
    optimizer.close()
    assert_same(model, reference(sgd, STEPS), "results in shared memory")

    # Closed: its names' shared memory is free for the next model.
    model = make_model()
    distributed = bt.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters())
    for name, p in model.named_parameters():
        shared, _ = bt._core._require().host_regions("Gradient." + name)
        assert p.grad.data_ptr() == torch.frombuffer(shared, dtype=torch.uint8).data_ptr(), name
    for step in range(STEPS):
        x, y = batch(step, bt.rank())
        distributed.zero_grad()
        loss_fn(model, x, y).backward()
        distributed.step()
    assert_same(model, reference(sgd, STEPS), "gradients in shared memory")

    # A second model with the same parameter names while the first lives:
    # its gradients must not alias the first one's, so they stay its own
    # (copied in and out as before), and it still trains right.
    second = make_model()
    distributed = bt.DistributedOptimizer(sgd(second), named_parameters=second.named_parameters())
    assert all(p.grad is None for p in second.parameters())
    for step in range(STEPS):
        x, y = batch(step, bt.rank())
        distributed.zero_grad()
        loss_fn(second, x, y).backward()
        distributed.step()
    assert_same(second, reference(sgd, STEPS), "second model, same names")
    assert_same(model, reference(sgd, STEPS), "the first model untouched by the second")


def test_every_module_owning_parameters_is_gated():
    model = make_model()
    optimizer = bt.ScheduledOptimizer(model, sgd(model))
    gated = {name for name, m in model.named_modules() if m._forward_pre_hooks}
    optimizer.close()
    assert gated == {"", "body.0", "head"}, "gated modules: %s" % sorted(gated)


def test_attention_waits_for_the_out_projection_it_reads():
    """nn.MultiheadAttention reads out_proj's weight and bias without calling
    out_proj: its own gate covers them, so its forward never reads an
    out_proj being updated."""
    torch.manual_seed(5)
    model = torch.nn.TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=16)
    optimizer = bt.ScheduledOptimizer(model, sgd(model))
    try:
        (hook,) = model.self_attn._forward_pre_hooks.values()
        waited = {slot.name for slot in hook.slots}
    finally:
        optimizer.close()
    for name in ("self_attn.in_proj_weight", "self_attn.out_proj.weight", "self_attn.out_proj.bias"):
        assert any(w.endswith(name) for w in waited), "%s not gated: %s" % (name, sorted(waited))


def test_second_backward_before_step_is_refused():
    model = make_model()
    optimizer = bt.ScheduledOptimizer(model, sgd(model))
    x, y = batch(0, bt.rank())
    loss_fn(model, x, y).backward()
    try:
        loss_fn(model, x, y).backward()
    except RuntimeError as e:
        assert "second gradient before step()" in str(e), str(e)
    else:
        raise AssertionError("a second backward before step() was accepted")
    # Nothing was applied; finalize drains the first backward's push-pulls.
    optimizer.finalize()
    optimizer.close()
    assert_same(model, make_model(), "no step")


def test_distributed_optimizer_matches_union_training():
    model = make_model()
    optimizer = bt.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters())
    assert isinstance(optimizer, torch.optim.SGD)
    for step in range(STEPS):
        x, y = batch(step, bt.rank())
        optimizer.zero_grad()
        loss_fn(model, x, y).backward()
        optimizer.step()
    assert_same(model, reference(sgd, STEPS), "DistributedOptimizer")


def test_distributed_optimizer_synchronize_then_clip_then_step():
    model = make_model()
    optimizer = bt.DistributedOptimizer(sgd(model), named_parameters=model.named_parameters())
    expected = make_model()
    ref = sgd(expected)
    for step in range(STEPS):
        x, y = batch(step, bt.rank())
        optimizer.zero_grad()
        loss_fn(model, x, y).backward()
        optimizer.synchronize()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
        if step % 2 == 0:
            # Horovod's spelling...
            with optimizer.skip_synchronize():
                optimizer.step()
        else:
            # ... and without it: the same, with one warning (Horovod would
            # average again).
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                optimizer.step()
            said = [str(w.message) for w in caught]
            assert len(said) == (1 if step == 1 else 0), said
            assert not said or "without the optimizer.skip_synchronize() context" in said[0], said
        xs, ys = zip(*(batch(step, r) for r in range(bt.size())))
        ref.zero_grad()
        loss_fn(expected, torch.cat(xs), torch.cat(ys)).backward()
        torch.nn.utils.clip_grad_norm_(expected.parameters(), 0.05)
        ref.step()
    assert_same(model, expected, "synchronize, clip, step")
    # step() inside skip_synchronize() needs a synchronize() first.
    optimizer.zero_grad()
    try:
        with optimizer.skip_synchronize():
            optimizer.step()
    except ValueError as e:
        assert "without optimizer.synchronize() first" in str(e), e
    else:
        raise AssertionError("step() in skip_synchronize() without synchronize() was accepted")


def test_distributed_optimizer_accumulates_backward_passes():
    model = make_model()
    optimizer = bt.DistributedOptimizer(
        adam(model), named_parameters=model.named_parameters(), backward_passes_per_step=2
    )
    for step in range(STEPS // 2):
        optimizer.zero_grad()
        for half in range(2):
            x, y = batch(2 * step + half, bt.rank())
            (loss_fn(model, x, y) / 2).backward()
        optimizer.step()

    # The reference sees both halves of each step at once.
    expected = make_model()
    ref = adam(expected)
    for step in range(STEPS // 2):
        ref.zero_grad()
        for half in range(2):
            xs, ys = zip(*(batch(2 * step + half, r) for r in range(bt.size())))
            (loss_fn(expected, torch.cat(xs), torch.cat(ys)) / 2).backward()
        ref.step()
    assert_same(model, expected, "backward_passes_per_step=2")


def test_distributed_optimizer_refuses_bad_names():
    model = make_model()
    named = list(model.named_parameters())
    for bad, text in [
        (named[:1], "does not name every parameter"),
        ([named[0], ("scale", named[1][1])] + named[2:], "duplicate names"),
    ]:
        try:
            bt.DistributedOptimizer(sgd(model), named_parameters=bad)
        except ValueError as e:
            assert text in str(e), str(e)
        else:
            raise AssertionError("DistributedOptimizer accepted %s" % text)


class Branchy(torch.nn.Module):
    """Parameters that get gradients on some steps only: `extra` is used by
    some ranks on each step (at least one), `unused` by none, `late` is
    created with requires_grad=False and switched on at step LATE, and
    `body` is frozen on steps FROZEN."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(8, 16)
        self.head = torch.nn.Linear(16, 4)
        self.extra = torch.nn.Linear(8, 4)
        self.unused = torch.nn.Linear(8, 4)
        self.late = torch.nn.Parameter(torch.linspace(0.5, 1.5, 4), requires_grad=False)

    def forward(self, x, use_extra):
        out = self.head(torch.tanh(self.body(x))) * self.late
        if use_extra:
            out = out + self.extra(x)
        return out


LATE = 3
FROZEN = (1, 2)


def make_branchy():
    torch.manual_seed(11)
    return Branchy()


def uses_extra(step, rank):
    return (step + rank) % 3 == 0


def set_requires_grad(model, step):
    """Between steps, the same on every rank."""
    model.late.requires_grad_(step >= LATE)
    for p in model.body.parameters():
        p.requires_grad_(step not in FROZEN)


def branchy_sgd(model):
    # No weight decay: a step with a zero gradient and no momentum yet
    # leaves a parameter as it was, as skipping it would.
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def branchy_reference(set_to_none):
    """One process, every rank's batch each step, each through its rank's
    branches."""
    model = make_branchy()
    optimizer = branchy_sgd(model)
    for step in range(STEPS):
        set_requires_grad(model, step)
        optimizer.zero_grad(set_to_none=set_to_none)
        loss = 0
        for r in range(bt.size()):
            x, y = batch(step, r)
            loss = loss + torch.nn.functional.mse_loss(model(x, uses_extra(step, r)), y)
        (loss / bt.size()).backward()
        optimizer.step()
    return model


def train_branchy(optimizer_of, set_to_none):
    model = make_branchy()
    optimizer = optimizer_of(model)
    for step in range(STEPS):
        set_requires_grad(model, step)
        optimizer.zero_grad(set_to_none=set_to_none)
        x, y = batch(step, bt.rank())
        torch.nn.functional.mse_loss(model(x, uses_extra(step, bt.rank())), y).backward()
        optimizer.step()
    return model, optimizer


def test_distributed_optimizer_parameters_without_gradients():
    """Unused on some ranks or all, frozen and unfrozen, created frozen:
    every rank starts the same push-pulls (no hang), and ends with the
    parameters of one process training on the union of the batches."""
    for set_to_none in (False, True):

        def optimizer_of(model):
            return bt.DistributedOptimizer(branchy_sgd(model), named_parameters=model.named_parameters())

        model, optimizer = train_branchy(optimizer_of, set_to_none)
        what = "DistributedOptimizer, zero_grad(set_to_none=%s)" % set_to_none
        assert_same(model, branchy_reference(set_to_none), what)
        assert not torch.equal(model.late.detach(), make_branchy().late), what
        # The parameter switched on after the optimizer was made got its
        # gradient hook: its push-pull starts during backward, overlapping
        # the rest of it, like the others'.
        optimizer.zero_grad()
        x, y = batch(STEPS, bt.rank())
        torch.nn.functional.mse_loss(model(x, False), y).backward()
        assert model.late in optimizer._handles, what
        optimizer.step()


def test_scheduled_optimizer_parameters_without_gradients():
    def optimizer_of(model):
        return bt.ScheduledOptimizer(model, branchy_sgd(model), num_steps=STEPS)

    # A frozen parameter is not updated, as a None gradient is skipped.
    model, optimizer = train_branchy(optimizer_of, True)
    optimizer.close()
    assert_same(model, branchy_reference(True), "ScheduledOptimizer")
    assert not torch.equal(model.late.detach(), make_branchy().late)
    assert torch.equal(model.unused.weight.detach(), make_branchy().unused.weight)


def test_broadcast_optimizer_state_with_parameters_without_gradients_or_state():
    """Each rank's Adam has state for a different set of parameters (extra
    only where it was used; unused and late nowhere); afterwards every rank
    holds the root's, and training on from there agrees."""
    wrappers = {
        0: lambda model, inner: inner,
        1: lambda model, inner: bt.ScheduledOptimizer(model, inner, num_steps=2),
        2: lambda model, inner: bt.DistributedOptimizer(inner, named_parameters=model.named_parameters()),
    }
    for root, wrap in wrappers.items():
        model = make_branchy()
        inner = torch.optim.Adam(model.parameters(), lr=0.01 * (bt.rank() + 1))
        for step in range(bt.rank() + 1):
            x, y = batch(step, bt.rank())
            inner.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(model(x, bt.rank() % 2 == 1), y).backward()
            inner.step()
        bt.broadcast_parameters(model.state_dict(), root_rank=root)
        optimizer = wrap(model, inner)
        bt.broadcast_optimizer_state(optimizer, root_rank=root)
        state = optimizer.state_dict()
        assert state["param_groups"][0]["lr"] == 0.01 * (root + 1), state["param_groups"]
        with_state = sorted(state["state"])
        extra = {id(p) for p in model.extra.parameters()}
        index = {id(p): i for i, p in enumerate(model.parameters())}
        want = sorted(i for p, i in index.items() if p not in extra or root % 2 == 1)
        want = [i for i in want if i not in (index[id(model.late)],)]
        want = [i for i in want if i not in [index[id(p)] for p in model.unused.parameters()]]
        assert with_state == want, (root, with_state, want)
        for i, s in state["state"].items():
            assert int(s["step"]) == root + 1, (root, i, s["step"])
            mine = s["exp_avg"].clone()
            theirs = s["exp_avg"].clone()
            bt.broadcast(theirs, root, "Check.exp_avg.%d" % i)
            assert torch.equal(mine, theirs), (root, i)
        if root == 1:
            optimizer.close()


if __name__ == "__main__":
    sys.exit(run_tests(globals()))
