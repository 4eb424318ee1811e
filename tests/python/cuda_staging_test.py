"""baton.torch's CUDA path on a machine without a GPU: the few torch.cuda
calls (baton/torch/_cuda.py) and the extension's session are replaced by
fakes, and CPU tensors stand in for CUDA ones. The tests check what is
declared and enqueued, and the order of the copies, the ready event and the
completion. Runs as a plain script (tests/python/CMakeLists.txt)."""

import ctypes
import sys
import unittest

import torch

import baton.torch as bt
from baton import _baton
from baton.torch import _cuda

MEMORY_HANDLE_PREFIX = b"mem"
EVENT_HANDLE_PREFIX = b"evt"
BUS_ID = "0000:3b:00.0"


def ipc_handle(prefix, number):
    return (prefix + b"%d" % number).ljust(_cuda.IPC_HANDLE_BYTES, b"\0")



def _bits(tensor):
    """`tensor`'s bytes, for comparisons that must not treat NaN specially."""
    return tensor.detach().contiguous().flatten().view(torch.uint8)

class FakeEvent:
    def __init__(self, staging):
        self.staging = staging
        self.recorded = None  # staging's bytes when last recorded
        self.stream = None
        self.fresh = False  # recorded since the last enqueue


class FakeCuda:
    """Stands in for baton.torch._cuda. A tensor is "CUDA" when it carries the
    attribute fake_cuda, or always with everything=True (gradients made by
    autograd carry no attributes)."""

    def __init__(self, log, everything=False):
        self.log = log
        self.everything = everything
        self.stream = "stream0"  # the current stream
        self.memory = {}  # memory handle -> staging tensor
        self.events = {}  # event handle -> FakeEvent
        self._last_staging = None

    def install(self, test):
        for name in (
            "is_cuda",
            "allocate_staging",
            "share_memory",
            "create_event",
            "pci_bus_id",
            "current_stream",
            "record_event",
            "wait_stream",
        ):
            original = getattr(_cuda, name)
            setattr(_cuda, name, getattr(self, name))
            test.addCleanup(setattr, _cuda, name, original)

    def is_cuda(self, tensor):
        return self.everything or getattr(tensor, "fake_cuda", False)

    def allocate_staging(self, tensor):
        self.log.append(("allocate", tuple(tensor.shape)))
        return torch.empty(tuple(tensor.shape), dtype=tensor.dtype)

    def share_memory(self, staging):
        memory = ipc_handle(MEMORY_HANDLE_PREFIX, len(self.memory))
        self.memory[memory] = staging
        self._last_staging = staging
        return memory, 0

    def create_event(self, device):
        # _DeviceSlot shares the memory, then creates its event.
        event = FakeEvent(self._last_staging)
        event_handle = ipc_handle(EVENT_HANDLE_PREFIX, len(self.events))
        self.events[event_handle] = event
        return event, event_handle

    def pci_bus_id(self, device):
        return BUS_ID

    def current_stream(self, device):
        return self.stream

    def record_event(self, event, stream):
        event.recorded = event.staging.clone()
        event.stream = stream
        event.fresh = True
        self.log.append(("record", stream))

    def wait_stream(self, stream, other):
        self.log.append(("wait", stream, other))


class FakeOperation:
    def __init__(self, name, staging, kind, average=False, root_rank=0):
        self.name = name
        self.staging = staging
        self.kind = kind
        self.average = average
        self.root_rank = root_rank


class FakeSession:
    """Stands in for _baton.Session and for the agent behind it. Other
    ranks contribute 10 to every element of a push-pull (a sum over two
    ranks); a broadcast root other than this rank sends 7s. The result is
    written into the staging tensor, in place, when the operation is
    synchronized: what the agent does before it reports the completion."""

    def __init__(self, cuda, log, rank=0):
        self.cuda = cuda
        self.log = log
        self._rank = rank
        self.declared = {}  # name -> (spec, cuda buffer or None)
        self.versions = {}  # name -> times it was declared anew
        self.refuse = None  # an exception for the next declare
        self.fail_next = None  # an exception for the next synchronize
        self.shutdown_saw_slots = None

    def rank(self):
        return self._rank

    def size(self):
        return 2

    def declare(self, specs, cuda_buffers=()):
        self.log.append(("declare", list(specs), list(cuda_buffers)))
        if self.refuse is not None:
            error, self.refuse = self.refuse, None
            raise error
        buffer_of = {b[0]: b[1:] for b in cuda_buffers}
        for index, spec in enumerate(specs):
            name = spec[0]
            memory = spec[4] if len(spec) == 5 else _baton.MEMORY_HOST
            entry = ((spec[1], tuple(spec[2]), spec[3], memory), buffer_of.get(index))
            # As the real Session: a name declared differently is declared
            # anew, its next version.
            if self.declared.get(name, entry) != entry:
                self.versions[name] = self.versions.get(name, 0) + 1
            self.declared[name] = entry

    def _enqueue(self, name, spec, memory_handle, offset, event_handle, pci_bus_id):
        location = (memory_handle, offset, event_handle, pci_bus_id)
        known = self.declared.get(name)
        if known is None:
            raise AssertionError("enqueued %r before declaring it" % name)
        if known != (spec, location):
            raise ValueError(
                "tensor %r was declared as %s but is used as %s" % (name, known, (spec, location))
            )
        staging = self.cuda.memory[memory_handle]
        event = self.cuda.events[event_handle]
        if not event.fresh:
            raise AssertionError("%r was enqueued without recording its ready event" % name)
        # Bitwise: a non-root's staging tensor holds whatever memory it got,
        # NaN patterns included, which torch.equal never finds equal.
        if not torch.equal(_bits(event.recorded), _bits(staging)):
            raise AssertionError("%r: the staging tensor changed after its ready event" % name)
        event.fresh = False
        self.log.append(("enqueue", name, staging.clone()))
        return staging

    def push_pull_device_async(
        self, name, dtype, shape, average, memory_handle, offset, event_handle, pci_bus_id="", op=0
    ):
        spec = (dtype, tuple(shape), _baton.PUSH_PULL, _baton.MEMORY_CUDA)
        staging = self._enqueue(name, spec, memory_handle, offset, event_handle, pci_bus_id)
        return FakeOperation(name, staging, "push_pull", average=average)

    def broadcast_device_async(
        self, name, dtype, shape, root_rank, memory_handle, offset, event_handle, pci_bus_id=""
    ):
        spec = (dtype, tuple(shape), _baton.BROADCAST, _baton.MEMORY_CUDA)
        staging = self._enqueue(name, spec, memory_handle, offset, event_handle, pci_bus_id)
        return FakeOperation(name, staging, "broadcast", root_rank=root_rank)

    def push_pull_async(self, name, data, dtype, shape, average, output, op=0):
        self.log.append(("host push_pull", name))
        return FakeOperation(name, None, "host")

    def allgather_async(self, name, data, dtype, shape, output):
        """The descriptor round of an unnamed call: the other rank's
        tensor is described as this one's."""
        self.log.append(("allgather", name))
        size = 8 * shape[0]
        for rank in range(self.size()):
            ctypes.memmove(output + rank * size, data, size)
        return FakeOperation(name, None, "allgather")

    def poll(self, operation):
        return True

    def synchronize(self, operation, timeout):
        if self.fail_next is not None:
            error, self.fail_next = self.fail_next, None
            raise error
        self.log.append(("synchronize", operation.name))
        staging = operation.staging
        if operation.kind == "push_pull":
            with torch.no_grad():
                staging.add_(10)
                if operation.average:
                    staging.div_(2)
        elif operation.kind == "broadcast" and operation.root_rank != self._rank:
            staging.fill_(7)

    def shutdown(self, drain_timeout):
        self.shutdown_saw_slots = len(bt._core._device_slots)
        self.log.append(("shutdown",))


def cuda_tensor(values, dtype=torch.float32):
    tensor = torch.tensor(values, dtype=dtype)
    tensor.fake_cuda = True
    return tensor


def baton_error(code, message, kind=None):
    """What the real binding raises: a refused call's codes are ValueError."""
    error = (kind or bt.BatonError)(message)
    error.code = code
    return error


class CudaTestCase(unittest.TestCase):
    rank = 0
    everything = False

    def setUp(self):
        self.log = []
        self.cuda = FakeCuda(self.log, everything=self.everything)
        self.cuda.install(self)
        self.session = FakeSession(self.cuda, self.log, rank=self.rank)
        bt._core._session = self.session
        self.addCleanup(bt.shutdown)

    def events(self, kind):
        return [entry for entry in self.log if entry[0] == kind]

    def kinds(self):
        return [entry[0] for entry in self.log]


class PushPullTest(CudaTestCase):
    def test_declares_the_staging_buffer_copies_in_records_enqueues_then_copies_back(self):
        tensor = cuda_tensor([1.0, 2.0, 3.0])
        handle = bt.push_pull_async(tensor, average=False, name="g")

        (_, specs, buffers), = self.events("declare")
        self.assertEqual(specs, [("g", _baton.FLOAT32, [3], _baton.PUSH_PULL, _baton.MEMORY_CUDA)])
        memory, event = ipc_handle(MEMORY_HANDLE_PREFIX, 0), ipc_handle(EVENT_HANDLE_PREFIX, 0)
        self.assertEqual(buffers, [(0, memory, 0, event, BUS_ID)])
        self.assertEqual(self.kinds(), ["allocate", "declare", "record", "enqueue"])
        # The staging tensor held the input when the event was recorded (the
        # fake session checks it is unchanged at the enqueue).
        self.assertTrue(torch.equal(self.events("enqueue")[0][2], torch.tensor([1.0, 2.0, 3.0])))
        # Out of place: the result is a new tensor; the input stays as it was.
        result = bt.synchronize(handle)
        self.assertIsNot(result, tensor)
        self.assertTrue(torch.equal(result, torch.tensor([11.0, 12.0, 13.0])))
        self.assertTrue(torch.equal(tensor, torch.tensor([1.0, 2.0, 3.0])))
        self.assertNotEqual(result.data_ptr(), bt._core._device_slots["g"].staging.data_ptr())

        # The next step, in place, reuses the staging tensor and the
        # declaration.
        tensor.copy_(torch.tensor([4.0, 5.0, 6.0]))
        handle = bt.push_pull_async_inplace(tensor, average=True, name="g")
        # Until synchronized, the caller's tensor keeps its input.
        self.assertTrue(torch.equal(tensor, torch.tensor([4.0, 5.0, 6.0])))
        self.assertIs(bt.synchronize(handle), tensor)
        self.assertEqual(self.kinds()[4:], ["synchronize", "record", "enqueue", "synchronize"])
        self.assertTrue(torch.equal(tensor, torch.tensor([7.0, 7.5, 8.0])))
        self.assertEqual(len(bt._core._device_slots), 1)
        self.assertEqual(len(self.events("allocate")), 1)

    def test_push_pull_returns_a_new_tensor_and_push_pull_inplace_the_input(self):
        tensor = cuda_tensor([1.0, 2.0])
        result = bt.push_pull(tensor, average=False, name="g")
        self.assertIsNot(result, tensor)
        self.assertTrue(torch.equal(result, torch.tensor([11.0, 12.0])))
        self.assertTrue(torch.equal(tensor, torch.tensor([1.0, 2.0])))
        self.assertIs(bt.push_pull_inplace(tensor, average=False, name="g"), tensor)
        self.assertTrue(torch.equal(tensor, torch.tensor([11.0, 12.0])))
        # The first result is the caller's: the second operation left it alone.
        self.assertTrue(torch.equal(result, torch.tensor([11.0, 12.0])))
        unnamed = cuda_tensor([3.0])
        self.assertTrue(torch.equal(bt.push_pull(unnamed, average=False), torch.tensor([13.0])))
        self.assertTrue(torch.equal(unnamed, torch.tensor([3.0])))
        self.assertIs(bt.push_pull_inplace(unnamed, average=False), unnamed)
        self.assertTrue(torch.equal(unnamed, torch.tensor([13.0])))

    def test_non_contiguous_tensors_get_their_result_in_place(self):
        base = torch.arange(12, dtype=torch.float64).reshape(3, 4)
        tensor = base.t()
        tensor.fake_cuda = True
        self.assertFalse(tensor.is_contiguous())
        expected = tensor + 10
        bt.push_pull_inplace(tensor, average=False, name="t")
        self.assertTrue(torch.equal(tensor, expected))
        self.assertTrue(torch.equal(base, expected.t()))
        (_, specs, _), = self.events("declare")
        self.assertEqual(specs[0][2], [4, 3])

    def test_non_contiguous_tensors_out_of_place_get_a_dense_result(self):
        base = torch.arange(12, dtype=torch.float64).reshape(3, 4)
        tensor = base.t()
        tensor.fake_cuda = True
        result = bt.push_pull(tensor, average=False, name="t")
        self.assertTrue(result.is_contiguous())
        self.assertTrue(torch.equal(result, tensor + 10))
        self.assertTrue(torch.equal(base, torch.arange(12, dtype=torch.float64).reshape(3, 4)))

    def test_a_second_operation_in_flight_is_refused_and_leaves_the_staging_tensor_alone(self):
        first = cuda_tensor([1.0, 2.0])
        handle = bt.push_pull_async_inplace(first, name="g")
        with self.assertRaises(ValueError) as raised:
            bt.push_pull_async(cuda_tensor([5.0, 5.0]), name="g")
        self.assertEqual(raised.exception.code, "FAILED_PRECONDITION")
        self.assertIn('"g" already has an operation in flight', str(raised.exception))
        self.assertTrue(torch.equal(bt._core._device_slots["g"].staging, torch.tensor([1.0, 2.0])))
        self.assertEqual(len(self.events("enqueue")), 1)
        bt.synchronize(handle)
        self.assertTrue(torch.equal(first, torch.tensor([5.5, 6.0])))

    def test_a_failed_operation_frees_the_name_and_a_timeout_does_not(self):
        tensor = cuda_tensor([1.0])
        handle = bt.push_pull_async_inplace(tensor, average=False, name="g")
        self.session.fail_next = TimeoutError("tensor g did not complete")
        with self.assertRaises(TimeoutError):
            bt.synchronize(handle, timeout=0.1)
        with self.assertRaises(ValueError):
            bt.push_pull_async(tensor, name="g")
        self.session.fail_next = baton_error("ABORTED", "node n2 was lost")
        with self.assertRaises(bt.BatonError) as raised:
            bt.synchronize(handle)
        self.assertEqual(raised.exception.code, "ABORTED")
        # A failed operation wrote nothing into the caller's tensor.
        self.assertTrue(torch.equal(tensor, torch.tensor([1.0])))
        bt.push_pull_inplace(tensor, average=False, name="g")
        self.assertTrue(torch.equal(tensor, torch.tensor([11.0])))

    def test_a_refused_declaration_keeps_no_staging_tensor(self):
        self.session.refuse = baton_error(
            "FAILED_PRECONDITION", "the agent has no GPU transport: it cannot take CUDA tensors", ValueError
        )
        tensor = cuda_tensor([1.0, 2.0])
        with self.assertRaises(ValueError) as raised:
            bt.push_pull_async(tensor, name="g")
        self.assertEqual(raised.exception.code, "FAILED_PRECONDITION")
        self.assertEqual(bt._core._device_slots, {})
        self.assertEqual(self.events("enqueue"), [])
        self.assertEqual(bt._core._unnamed_busy, {})
        # Accepted later: declared with a fresh staging tensor.
        bt.push_pull_inplace(tensor, average=False, name="g")
        self.assertEqual(len(self.events("allocate")), 2)
        self.assertTrue(torch.equal(tensor, torch.tensor([11.0, 12.0])))

    def test_another_shape_declares_the_name_anew_with_its_own_staging_tensor(self):
        bt.push_pull(cuda_tensor([1.0, 2.0, 3.0]), average=False, name="g")
        first = bt._core._device_slots["g"]
        tensor = cuda_tensor([1.0, 2.0, 3.0, 4.0])
        bt.push_pull_inplace(tensor, average=False, name="g")
        self.assertTrue(torch.equal(tensor, torch.tensor([11.0, 12.0, 13.0, 14.0])))
        self.assertEqual(self.session.versions, {"g": 1})
        self.assertIsNot(bt._core._device_slots["g"], first)
        self.assertEqual(bt._core._device_slots["g"].shape, (4,))
        # The agent holds the old staging tensor open until shutdown.
        self.assertEqual(bt._core._retired_slots, [first])
        self.assertEqual(len(self.events("allocate")), 2)

    def test_another_shape_while_in_flight_is_refused_before_anything_is_written(self):
        handle = bt.push_pull_async(cuda_tensor([1.0, 2.0, 3.0]), average=False, name="g")
        slot = bt._core._device_slots["g"]
        staging = slot.staging.clone()
        with self.assertRaises(ValueError) as raised:
            bt.push_pull_async(cuda_tensor([9.0, 9.0, 9.0, 9.0]), name="g")
        self.assertEqual(raised.exception.code, "FAILED_PRECONDITION")
        self.assertIn('tensor "g" already has an operation in flight', str(raised.exception))
        self.assertIs(bt._core._device_slots["g"], slot)
        self.assertTrue(torch.equal(slot.staging, staging))
        self.assertEqual(len(self.events("allocate")), 1)
        self.assertEqual(len(self.events("enqueue")), 1)
        self.assertTrue(torch.equal(bt.synchronize(handle), torch.tensor([11.0, 12.0, 13.0])))

    def test_another_device_declares_the_name_anew(self):
        bt.declare("g", cuda_tensor([1.0]))
        first = bt._core._device_slots["g"]
        first.device = torch.device("meta")
        tensor = cuda_tensor([1.0])
        bt.push_pull_inplace(tensor, average=False, name="g")
        self.assertTrue(torch.equal(tensor, torch.tensor([11.0])))
        self.assertEqual(self.session.versions, {"g": 1})
        self.assertEqual(bt._core._retired_slots, [first])

    def test_output_for_optimizers_leaves_the_gradient_alone(self):
        gradient = cuda_tensor([2.0, 4.0])
        output = torch.empty(2)
        handle = bt._core._push_pull_async_to(gradient, output, "Gradient.w")
        self.assertIs(bt.synchronize(handle), output)
        self.assertTrue(torch.equal(output, torch.tensor([6.0, 7.0])))
        self.assertTrue(torch.equal(gradient, torch.tensor([2.0, 4.0])))

    def test_unnamed_push_pulls_in_flight_together_get_a_slot_each(self):
        host = torch.tensor([1.0, 2.0])
        device = cuda_tensor([1.0, 2.0])
        first = bt.push_pull_async(device)
        second = bt.push_pull_async(cuda_tensor([3.0, 4.0]))
        bt.push_pull(host)
        bt.synchronize(first)
        bt.synchronize(second)
        names = [entry[1][0][0] for entry in self.events("declare")]
        self.assertEqual(names, ["PushPull.noname.cuda.float32.2.0", "PushPull.noname.cuda.float32.2.1"])
        self.assertEqual(self.events("host push_pull"), [("host push_pull", "PushPull.noname.float32.2.2")])
        # Each first gathered the ranks' descriptors under its slot.
        self.assertEqual(
            [name for _, name in self.events("allgather")],
            ["baton.PushPull.noname.0", "baton.PushPull.noname.1", "baton.PushPull.noname.2"],
        )
        self.assertEqual(bt._core._unnamed_busy, {("PushPull",): set()})

    def test_streams_a_copy_on_another_stream_waits_for_the_last_one(self):
        tensor = cuda_tensor([1.0])
        bt.push_pull(tensor, name="g")
        self.assertEqual(self.events("wait"), [])
        self.cuda.stream = "stream1"
        handle = bt.push_pull_async(tensor, name="g")
        self.assertEqual(self.log[-3:-1], [("wait", "stream1", "stream0"), ("record", "stream1")])
        self.cuda.stream = "stream2"
        bt.synchronize(handle)  # copied out on stream2
        self.cuda.stream = "stream1"
        bt.push_pull(tensor, name="g")
        self.assertEqual(self.events("wait")[-1], ("wait", "stream1", "stream2"))


class MixedDeclarationTest(CudaTestCase):
    def test_host_and_cuda_tensors_in_one_declaration(self):
        bt.declare_many(
            [
                ("a", torch.zeros(2)),
                ("b", cuda_tensor([1, 2, 3], torch.int64)),
                ("c", torch.zeros(1, dtype=torch.int8)),
            ]
        )
        (_, specs, buffers), = self.events("declare")
        self.assertEqual(
            specs,
            [
                ("a", _baton.FLOAT32, [2], _baton.PUSH_PULL),
                ("b", _baton.INT64, [3], _baton.PUSH_PULL, _baton.MEMORY_CUDA),
                ("c", _baton.INT8, [1], _baton.PUSH_PULL),
            ],
        )
        self.assertEqual([b[0] for b in buffers], [1])
        self.assertEqual(sorted(bt._core._device_slots), ["b"])
        self.assertTrue(bt._core._device_slots["b"].declared)
        # A use after the declaration costs no second round trip.
        bt.push_pull(cuda_tensor([1, 2, 3], torch.int64), average=False, name="b")
        self.assertEqual(len(self.events("declare")), 1)

    def test_staging_tensors_live_until_the_session_detached(self):
        bt.declare("b", cuda_tensor([1.0]))
        bt.shutdown()
        self.assertEqual(self.session.shutdown_saw_slots, 1)
        self.assertEqual(bt._core._device_slots, {})


class BroadcastRootTest(CudaTestCase):
    rank = 0

    def test_the_root_sends_its_tensor_and_keeps_it(self):
        tensor = cuda_tensor([1.0, 2.0])
        self.assertIs(bt.broadcast(tensor, root_rank=0, name="p"), tensor)
        self.assertTrue(torch.equal(self.events("enqueue")[0][2], torch.tensor([1.0, 2.0])))
        self.assertTrue(torch.equal(tensor, torch.tensor([1.0, 2.0])))
        (_, specs, _), = self.events("declare")
        self.assertEqual(specs[0][3], _baton.BROADCAST)


class BroadcastOtherRankTest(CudaTestCase):
    rank = 1

    def test_the_other_ranks_record_without_copying_and_receive(self):
        tensor = cuda_tensor([1.0, 2.0])
        bt.declare("p", tensor, op="broadcast")
        staging = bt._core._device_slots["p"].staging
        staging.fill_(-1)
        handle = bt.broadcast_async(tensor, root_rank=0, name="p")
        # Nothing was copied in, but the event was recorded before the enqueue.
        self.assertEqual(self.kinds()[-2:], ["record", "enqueue"])
        self.assertTrue(torch.equal(staging, torch.tensor([-1.0, -1.0])))
        self.assertIs(bt.synchronize(handle), tensor)
        self.assertTrue(torch.equal(tensor, torch.tensor([7.0, 7.0])))

    def test_broadcast_parameters_of_a_cuda_model(self):
        self.cuda.everything = True
        model = torch.nn.Linear(3, 2)
        bt.broadcast_parameters(model.state_dict(), root_rank=0)
        (_, specs, buffers), = self.events("declare")
        self.assertEqual([s[0] for s in specs], ["Parameter.bias", "Parameter.weight"])
        self.assertEqual([s[3:] for s in specs], [(_baton.BROADCAST, _baton.MEMORY_CUDA)] * 2)
        self.assertEqual([b[0] for b in buffers], [0, 1])
        for tensor in model.state_dict().values():
            self.assertTrue(torch.equal(tensor, torch.full_like(tensor, 7.0)))


class OptimizerTest(CudaTestCase):
    everything = True

    def make(self):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
        x = torch.randn(4, 3)
        return model, x

    def test_distributed_optimizer_averages_cuda_gradients(self):
        model, x = self.make()
        reference = [p.detach().clone() for p in model.parameters()]
        optimizer = bt.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters()
        )
        optimizer.zero_grad()
        model(x).sum().backward()
        gradients = [p.grad.clone() for p in model.parameters()]
        optimizer.step()
        want = [r - 0.1 * (g + 10) / 2 for r, g in zip(reference, gradients)]
        for p, w in zip(model.parameters(), want):
            self.assertTrue(torch.allclose(p, w), (p, w))
        self.assertEqual(
            sorted(bt._core._device_slots),
            ["Gradient.0.bias", "Gradient.0.weight", "Gradient.1.bias", "Gradient.1.weight"],
        )

    def test_scheduled_optimizer_applies_averaged_cuda_gradients(self):
        model, x = self.make()
        reference = [p.detach().clone() for p in model.parameters()]
        optimizer = bt.ScheduledOptimizer(model, torch.optim.SGD(model.parameters(), lr=0.1), num_steps=1)
        model(x).sum().backward()
        gradients = [p.grad.clone() for p in model.parameters()]
        optimizer.step()  # num_steps: waits for every update
        want = [r - 0.1 * (g + 10) / 2 for r, g in zip(reference, gradients)]
        for p, w in zip(model.parameters(), want):
            self.assertTrue(torch.allclose(p, w), (p, w))
        # The local gradients stay as backward made them.
        for p, g in zip(model.parameters(), gradients):
            self.assertTrue(torch.equal(p.grad, g))
        optimizer.close()

    def test_parameters_without_gradients_are_averaged_with_zeros(self):
        """The second layer is unused on this rank; the fake's other rank
        sends 10s for it, so every rank must apply (0 + 10) / 2."""
        for wrap in ("distributed", "scheduled"):
            model, x = self.make()
            reference = [p.detach().clone() for p in model.parameters()]
            sgd = torch.optim.SGD(model.parameters(), lr=0.1)
            if wrap == "distributed":
                optimizer = bt.DistributedOptimizer(sgd, named_parameters=model.named_parameters())
            else:
                optimizer = bt.ScheduledOptimizer(model, sgd, num_steps=1)
            optimizer.zero_grad(set_to_none=True)
            model[0](x).sum().backward()
            gradients = [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in model.parameters()]
            self.assertTrue(all(p.grad is None for p in model[1].parameters()))
            optimizer.step()
            want = [r - 0.1 * (g + 10) / 2 for r, g in zip(reference, gradients)]
            for p, w in zip(model.parameters(), want):
                self.assertTrue(torch.allclose(p, w), (wrap, p, w))
            if wrap == "scheduled":
                optimizer.close()


class RealCudaHelpersTest(unittest.TestCase):
    """_cuda's own logic where it needs no device."""

    def test_memory_handle_formats(self):
        raw = bytes(range(64))
        self.assertEqual(_cuda.memory_handle(raw), raw)
        self.assertEqual(_cuda.memory_handle(b"\x02c" + raw), raw)
        self.assertEqual(_cuda.memory_handle(b"\x03c" + raw), raw)
        with self.assertRaises(ValueError) as raised:
            _cuda.memory_handle(b"\x02e" + raw * 2)
        self.assertIn("expandable_segments", str(raised.exception))
        with self.assertRaises(ValueError) as raised:
            _cuda.memory_handle(b"short")
        self.assertIn("5 bytes", str(raised.exception))

    def test_share_memory_offset_and_ref_counter(self):
        released = []

        class Storage:
            def _share_cuda_(self):
                return (0, b"\x02c" + b"h" * 64, 4096, 1536, b"/torch_1_2", 3, b"e" * 64, True)

        class Staging:
            def untyped_storage(self):
                return Storage()

            def storage_offset(self):
                return 5

            def element_size(self):
                return 4

        original = getattr(torch.UntypedStorage, "_release_ipc_counter_cuda", None)
        torch.UntypedStorage._release_ipc_counter_cuda = lambda *args: released.append(args)
        try:
            memory, offset = _cuda.share_memory(Staging())
        finally:
            if original is None:
                del torch.UntypedStorage._release_ipc_counter_cuda
            else:
                torch.UntypedStorage._release_ipc_counter_cuda = original
        self.assertEqual(memory, b"h" * 64)
        self.assertEqual(offset, 1536 + 5 * 4)
        self.assertEqual(released, [(b"/torch_1_2", 3)])

    def test_pci_bus_id_from_either_kind_of_device_properties(self):
        class Ints:
            pci_bus_id = 0x3B
            pci_device_id = 0
            pci_domain_id = 0

        class Text:
            pci_bus_id = "0000:3B:00.0"

        class Neither:
            name = "old torch"

        original = torch.cuda.get_device_properties
        self.addCleanup(setattr, torch.cuda, "get_device_properties", original)
        for properties, want in ((Ints(), "0000:3b:00.0"), (Text(), "0000:3b:00.0"), (Neither(), "")):
            torch.cuda.get_device_properties = lambda device, p=properties: p
            self.assertEqual(_cuda.pci_bus_id(0), want)


if __name__ == "__main__":
    torch.set_num_threads(1)
    sys.exit(0 if unittest.main(exit=False).result.wasSuccessful() else 1)
