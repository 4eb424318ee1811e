"""The emulated GPU of the scheduling benchmark (tools/bench/scheduling/
emulated.py, issue 37), without baton: gradients reach the AccumulateGrad
hooks (what DDP, DistributedOptimizer and ScheduledOptimizer listen to) in
reverse layer order, no earlier than the modelled time; forward pre-hooks
hold their layer back; the process sleeps rather than computes; an
embedding's gradient is non-zero only in the batch's rows; profiles are
checked. Timing is asserted as lower bounds only (sleeps can overshoot on a
loaded machine, never undershoot). Runs as a plain script
(tests/python/CMakeLists.txt)."""

import json
import os
import sys
import tempfile
import time
import unittest

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "bench", "scheduling"))
import emulated  # noqa: E402
import layer_models  # noqa: E402

PROFILES = os.path.join(os.path.dirname(emulated.__file__), "profiles")
VOCAB, WIDTH, CLASSES, BATCH, SEQ = 64, 32, 4, 4, 6
FORWARD_S, BACKWARD_S, ACT_FORWARD_S, ACT_BACKWARD_S, UPDATE_S = 0.03, 0.06, 0.02, 0.04, 0.05


class Small(nn.Module):
    """embedding -> fc1 -> act -> fc2: one layer of each kind the emulator
    treats apart (embedding rows, dense, no parameters)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, WIDTH)
        self.fc1 = nn.Linear(WIDTH, WIDTH)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(WIDTH, CLASSES)

    def forward(self, tokens):
        return self.fc2(self.act(self.fc1(self.emb(tokens).mean(1))))


def small_profile():
    def layer(name, type_, params, forward=FORWARD_S, backward=BACKWARD_S, **extra):
        return dict(name=name, call=0, type=type_, forward_s=forward, backward_s=backward, params=params, **extra)

    return {
        "format": layer_models.PROFILE_FORMAT,
        "model": "bert_base",  # any known name: the test's model is given directly
        "batch": BATCH,
        "input": {"kind": "tokens", "shape": [BATCH, SEQ], "vocab": VOCAB},
        "output_shape": [BATCH, CLASSES],
        "source": "test",
        "timing": {"method": "given"},
        "update_s": UPDATE_S,
        "params": 0,
        "layers": [
            layer("emb", "Embedding", ["emb.weight"], embedding_rows="input"),
            layer("fc1", "Linear", ["fc1.weight", "fc1.bias"]),
            layer("act", "ReLU", [], ACT_FORWARD_S, ACT_BACKWARD_S),
            layer("fc2", "Linear", ["fc2.weight", "fc2.bias"]),
        ],
    }


def write(profile):
    f = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    json.dump(profile, f)
    f.close()
    return f.name


def accumulate_grad_node(p):
    """The hook point DDP's reducer and baton.torch's optimizers use."""
    return p.expand_as(p).grad_fn.next_functions[0][0]


class EmulatedTestCase(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(0)
        self.model = Small()
        self.path = write(small_profile())
        self.addCleanup(os.unlink, self.path)

    def emulate(self, dilation=1.0):
        profile = layer_models.load_profile(self.path, self.model)
        stream = emulated.emulate(self.model, profile, dilation)
        return profile, stream

    def tokens(self, seed):
        return torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(seed))

    def step(self, tokens):
        labels = torch.zeros(BATCH, dtype=torch.long)
        started = time.monotonic()
        loss = F.cross_entropy(self.model(tokens), labels)
        forward_done = time.monotonic()
        loss.backward()
        return started, forward_done, time.monotonic()

    def test_gradients_reach_the_hooks_in_reverse_layer_order_no_earlier_than_modelled(self):
        for dilation in (1.0, 2.0):
            with self.subTest(dilation=dilation):
                self.model = Small()
                self.emulate(dilation)
                arrivals = []
                nodes = []  # the nodes must live as long as their hooks
                for name, p in self.model.named_parameters():
                    node = accumulate_grad_node(p)
                    node.register_hook(lambda *_, name=name, p=p: arrivals.append(
                        (name.split(".")[0], time.monotonic(), p.grad is not None)))
                    nodes.append(node)
                started, forward_done, backward_done = self.step(self.tokens(1))

                self.assertGreaterEqual(forward_done - started, dilation * (3 * FORWARD_S + ACT_FORWARD_S))
                layers = [name for name, _, _ in arrivals]
                self.assertEqual(sorted(layers), ["emb", "fc1", "fc1", "fc2", "fc2"])
                order = [name for i, name in enumerate(layers) if i == 0 or layers[i - 1] != name]
                self.assertEqual(order, ["fc2", "fc1", "emb"])
                self.assertTrue(all(has_grad for _, _, has_grad in arrivals))
                # fc2, then act's backward (merged into fc1's) and fc1's, then emb;
                # the first may start up to HOST_SLACK_S before the host asks
                # (the emulator's own time between layers is not the GPU's).
                slack = emulated.EmulatedStream.HOST_SLACK_S
                earliest = {"fc2": BACKWARD_S, "fc1": 2 * BACKWARD_S + ACT_BACKWARD_S,
                            "emb": 3 * BACKWARD_S + ACT_BACKWARD_S}
                for name, at, _ in arrivals:
                    self.assertGreaterEqual(at - forward_done, dilation * earliest[name] - slack, name)
                self.assertGreaterEqual(backward_done - forward_done, dilation * earliest["emb"] - slack)

    def test_a_forward_pre_hook_holds_its_layer_back(self):
        self.emulate()
        waited = []

        def gate(module, inputs):  # as ScheduledOptimizer's: wait for the layer's update
            time.sleep(0.1)
            waited.append(time.monotonic())

        self.model.fc2.register_forward_pre_hook(gate)
        started, forward_done, _ = self.step(self.tokens(1))
        self.assertEqual(len(waited), 1)
        self.assertGreaterEqual(forward_done - waited[0], FORWARD_S)
        self.assertGreaterEqual(forward_done - started, 3 * FORWARD_S + ACT_FORWARD_S + 0.1)

    def test_the_process_sleeps_rather_than_computes(self):
        self.emulate(dilation=2.0)
        self.step(self.tokens(1))  # the first step makes the embedding's gradient
        cpu, wall = time.process_time(), time.monotonic()
        for _ in range(3):
            self.step(self.tokens(1))
        cpu, wall = time.process_time() - cpu, time.monotonic() - wall
        # Each step's first layer may start up to HOST_SLACK_S before it is asked for.
        modelled = 2.0 * (3 * (FORWARD_S + BACKWARD_S) + ACT_FORWARD_S + ACT_BACKWARD_S)
        self.assertGreaterEqual(wall, 3 * (modelled - emulated.EmulatedStream.HOST_SLACK_S))
        self.assertLess(cpu, 0.25 * wall, "CPU %.3f s in %.3f s" % (cpu, wall))

    def test_embedding_gradients_are_non_zero_only_in_the_batch_rows(self):
        self.emulate()
        for seed in (1, 2):
            tokens = self.tokens(seed)
            self.model.zero_grad()
            self.step(tokens)
            grad = self.model.emb.weight.grad
            rows = set(grad.abs().sum(1).nonzero().flatten().tolist())
            self.assertEqual(rows, set(tokens.flatten().tolist()))
        self.assertLess(len(rows), VOCAB)

    def test_dense_gradients_are_random_and_the_same_every_step(self):
        self.emulate()
        tokens = self.tokens(1)
        self.step(tokens)
        first = self.model.fc1.weight.grad.clone()
        self.assertEqual(int((first == 0).sum()), 0)
        self.assertAlmostEqual(float(first.std()), emulated.GRADIENT_STD, delta=0.3 * emulated.GRADIENT_STD)
        self.model.zero_grad()  # in place: must not reach the emulator's own gradients
        self.step(tokens)
        self.assertTrue(torch.equal(self.model.fc1.weight.grad, first))
        self.step(tokens)  # accumulates, as autograd does
        self.assertTrue(torch.equal(self.model.fc1.weight.grad, 2 * first))

    def test_the_update_takes_its_modelled_time_and_changes_nothing(self):
        profile, stream = self.emulate(dilation=2.0)
        profile["params"] = sum(p.numel() for p in self.model.parameters())
        optimizer = emulated.EmulatedSGD(self.model.parameters(), profile, stream, dilation=2.0)
        before = [p.detach().clone() for p in self.model.parameters()]
        self.step(self.tokens(1))
        started = time.monotonic()
        optimizer.step()
        self.assertGreaterEqual(time.monotonic() - started, 2.0 * UPDATE_S)
        for b, p in zip(before, self.model.parameters()):
            self.assertTrue(torch.equal(b, p))

    def test_profiles_that_do_not_fit_are_refused_with_the_reason(self):
        cases = [
            (lambda p: p["layers"][3]["params"].remove("fc2.bias"), "no layer produces the gradients of fc2.bias"),
            (lambda p: p["layers"][1].update(forward_s=-1), "layer 1 (fc1): forward_s must be a non-negative"),
            (lambda p: p["layers"][1]["params"].append("fc9.weight"), "names parameter fc9.weight"),
            (lambda p: p["layers"][3]["params"].append("fc1.bias"), "parameter fc1.bias belongs to layers 1 and 3"),
            (lambda p: p.update(format="other"), "not a layer profile"),
            (lambda p: p.update(batch=0), "batch must be a positive integer"),
        ]
        for change, message in cases:
            with self.subTest(message=message):
                profile = small_profile()
                change(profile)
                path = write(profile)
                self.addCleanup(os.unlink, path)
                with self.assertRaises(layer_models.ProfileError) as caught:
                    layer_models.load_profile(path, self.model)
                self.assertIn(message, str(caught.exception))
                self.assertIn(path, str(caught.exception))

    def test_committed_profiles_fit_their_models_and_run(self):
        for name in ("resnet18", "bert_base"):
            with self.subTest(model=name):
                torch.manual_seed(0)
                try:
                    model, _, profile, _ = emulated.load(name, os.path.join(PROFILES, name + ".flops.json"), 1.0)
                except ImportError as e:  # torchvision (tools/dev/install-deps has it)
                    self.skipTest("%s: %s" % (name, e))
                self.assertEqual(profile["source"], "flops")
                fired = {}
                nodes = []
                for pname, p in model.named_parameters():
                    node = accumulate_grad_node(p)
                    node.register_hook(lambda *_, pname=pname: fired.__setitem__(pname, fired.get(pname, 0) + 1))
                    nodes.append(node)
                (x, y), = emulated.make_batches(profile, 0, 1, model)
                started = time.monotonic()
                F.cross_entropy(model(x), y).backward()
                self.assertGreaterEqual(time.monotonic() - started, profile["forward_s"] + profile["backward_s"])
                self.assertEqual(fired, {pname: 1 for pname, _ in model.named_parameters()})
                if name == "bert_base":
                    rows = model.token.weight.grad.abs().sum(1).nonzero().flatten()
                    self.assertEqual(set(rows.tolist()), set(x.flatten().tolist()))
                    positions = model.position.weight.grad.abs().sum(1).nonzero().flatten()
                    self.assertEqual(positions.tolist(), list(range(layer_models.BERT["seq"])))


if __name__ == "__main__":
    torch.set_num_threads(1)
    unittest.main()
