"""The torch.cuda calls behind baton's CUDA tensors, and nothing else.

baton.torch hands a CUDA tensor to the agent through a staging tensor of its
own on the same device: allocated once per tensor name, shared with the
agent through CUDA IPC (a memory handle and an interprocess event), and kept
until shutdown. Every call into torch.cuda that this takes is here, so that
tests on machines without a GPU can replace these functions.
"""

import torch

# sizeof(cudaIpcMemHandle_t) and sizeof(cudaIpcEventHandle_t).
IPC_HANDLE_BYTES = 64


def is_cuda(tensor):
    return tensor.is_cuda


def allocate_staging(tensor):
    """A dense tensor of `tensor`'s shape and dtype on its device."""
    return torch.empty(tuple(tensor.shape), dtype=tensor.dtype, device=tensor.device)


def memory_handle(handle):
    """The cudaIpcMemHandle_t in what storage._share_cuda_() returns as the
    handle: the 64 bytes themselves (torch 1.x and early 2.x), or a version
    byte, a type byte and then the handle (later 2.x: type b"c" for memory
    from cudaMalloc; b"e" for an expandable segment, which CUDA IPC handles
    cannot describe)."""
    handle = bytes(handle)
    if len(handle) == IPC_HANDLE_BYTES:
        return handle
    if len(handle) == IPC_HANDLE_BYTES + 2 and handle[1:2] == b"c":
        return handle[2:]
    if len(handle) >= 2 and handle[1:2] == b"e":
        raise ValueError(
            "baton's staging buffer landed in an expandable segment "
            "(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), which CUDA IPC "
            "cannot share with the agent: run without expandable_segments"
        )
    raise ValueError(
        "torch returned a CUDA IPC memory handle of %d bytes in a format baton "
        "does not know (torch %s)" % (len(handle), torch.__version__)
    )


def share_memory(staging):
    """(cudaIpcMemHandle_t of the allocation holding `staging`, offset of
    staging's first byte in that allocation)."""
    if hasattr(staging, "untyped_storage"):
        storage = staging.untyped_storage()
    else:  # torch 1.x
        storage = staging.storage()
    # (device, handle, storage bytes, storage offset in the allocation,
    #  ref counter name, ref counter offset, event handle, event needed):
    # the same in torch 1.13 and 2.x.
    shared = storage._share_cuda_()
    handle, storage_offset = shared[1], shared[3]
    # torch counts the processes that opened the memory through torch's own
    # protocol, and keeps the memory for them after it is freed. The agent is
    # not one of them (baton keeps the staging tensor until shutdown
    # instead): give the count back now, or freeing it at shutdown would
    # leak it and torch would warn at exit.
    release = getattr(torch.UntypedStorage, "_release_ipc_counter_cuda", None)
    if release is not None and shared[4]:
        release(shared[4], shared[5])
    return memory_handle(handle), int(storage_offset) + staging.storage_offset() * staging.element_size()


def create_event(device):
    """An interprocess event on `device` and its cudaIpcEventHandle_t. Timing
    stays off (enable_timing=False), as CUDA requires of interprocess events."""
    with torch.cuda.device(device):
        event = torch.cuda.Event(interprocess=True)
        handle = bytes(event.ipc_handle())
    return event, handle


def pci_bus_id(device):
    """`device` as cudaDeviceGetPCIBusId names it ("0000:3b:00.0"), or "" when
    this torch does not say (the agent then finds the device from the memory)."""
    properties = torch.cuda.get_device_properties(device)
    bus = getattr(properties, "pci_bus_id", None)
    if isinstance(bus, str):
        return bus.strip().lower()
    domain = getattr(properties, "pci_domain_id", None)
    slot = getattr(properties, "pci_device_id", None)
    if isinstance(bus, int) and isinstance(domain, int) and isinstance(slot, int):
        return "%04x:%02x:%02x.0" % (domain, bus, slot)
    return ""


def current_stream(device):
    return torch.cuda.current_stream(device)


def record_event(event, stream):
    event.record(stream)


def wait_stream(stream, other):
    """Work queued on `stream` from now on waits for what `other` has queued."""
    stream.wait_stream(other)
