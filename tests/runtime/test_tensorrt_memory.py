"""The counting GPU allocator TensorRT's runtime allocates through (``runtime/tensorrt_memory.py``), driven the way
the binding drives it (TensorRT 10.7–11.1 ``PyGpuAsyncAllocator``): ``allocate_async(size, alignment, stream,
flags)`` with the stream before the flags, the result cast to an address (anything but an int is nullptr),
``deallocate_async(memory, stream)`` → bool."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dspark_trt.runtime.tensorrt_engine import engine_memory_report
from dspark_trt.runtime.tensorrt_memory import AllocationLedger, counting_allocator


class _IGpuAsyncAllocator:
    """The binding's base class: a subclass must call its ``__init__``."""

    def __init__(self):
        self.initialised = True


FAKE_TRT = SimpleNamespace(IGpuAsyncAllocator=_IGpuAsyncAllocator)


def _trampoline_allocate(allocator, size, alignment=256, stream=0x7F00, flags=0):
    """``PyGpuAllocatorHelper::allocHelper``: call the override, cast to size_t; an exception or a non-int → 0."""
    try:
        result = allocator.allocate_async(size, alignment, stream, flags)
    except Exception:
        return 0
    return result if isinstance(result, int) else 0


def _trampoline_deallocate(allocator, memory, stream=0x7F00):
    status = allocator.deallocate_async(memory, stream)
    assert isinstance(status, bool)  # status.cast<bool>()
    return status


class _Heap:
    """A backing store handing out addresses with a given misalignment, recording frees and streams."""

    def __init__(self, offset=0, fail_at=None):
        self.next, self.offset, self.fail_at = 1 << 20, offset, fail_at
        self.freed, self.streams = [], []

    def alloc(self, size, stream):
        if self.fail_at is not None and size >= self.fail_at:
            raise RuntimeError("CUDA out of memory. Tried to allocate 16.00 GiB")
        self.streams.append(stream)
        address = self.next + self.offset
        self.next += (size + 4095) // 4096 * 4096 + 4096
        return address

    def free(self, address):
        self.freed.append(address)


def test_weights_allocated_through_it_are_counted_live_and_at_peak():
    heap, ledger = _Heap(), AllocationLedger()
    allocator = counting_allocator(FAKE_TRT, ledger, heap.alloc, heap.free)
    assert allocator.initialised  # the base __init__ ran (pybind11 needs it)
    a = _trampoline_allocate(allocator, 3 << 20)
    b = _trampoline_allocate(allocator, 1 << 20)
    assert a and b and ledger.live == 4 << 20 and heap.streams == [0x7F00, 0x7F00]
    assert _trampoline_deallocate(allocator, a) is True and heap.freed == [a]
    assert ledger.report() == {"live": 1 << 20, "peak": 4 << 20, "allocations": 2, "frees": 1, "failure": None}


def test_zero_sizes_unknown_addresses_and_reallocation():
    heap, ledger = _Heap(), AllocationLedger()
    allocator = counting_allocator(FAKE_TRT, ledger, heap.alloc, heap.free)
    assert _trampoline_allocate(allocator, 0) == 0 and ledger.allocations == 0  # size 0: nullptr, as documented
    assert _trampoline_deallocate(allocator, 0) is True  # the nullptr of a zero-size allocation handed back
    assert _trampoline_deallocate(allocator, 0xDEAD00) is False and heap.freed == []
    assert allocator.reallocate(0x1000, 256, 1 << 20) == 0  # not supported: TensorRT allocates anew


def test_a_failing_backing_store_is_nullptr_and_remembered():
    heap, ledger = _Heap(fail_at=1 << 30), AllocationLedger()
    allocator = counting_allocator(FAKE_TRT, ledger, heap.alloc, heap.free)
    assert _trampoline_allocate(allocator, 16 << 30) == 0
    assert ledger.failure.startswith("allocating 17179869184 bytes: RuntimeError: CUDA out of memory")
    assert ledger.live == 0
    assert _trampoline_allocate(allocator, 1 << 20) and ledger.failure.startswith("allocating")  # the first kept


def test_a_misaligned_address_is_handed_back_and_refused():
    heap, ledger = _Heap(offset=128), AllocationLedger()
    allocator = counting_allocator(FAKE_TRT, ledger, heap.alloc, heap.free)
    assert _trampoline_allocate(allocator, 4096, alignment=256) == 0
    assert len(heap.freed) == 1 and ledger.live == 0 and "not 256-byte aligned" in ledger.failure
    assert _trampoline_allocate(allocator, 4096, alignment=0) != 0  # 0: any alignment


def test_the_engine_report_names_the_scratch_and_tensorrts_share():
    assert engine_memory_report("target", 12 << 20, 16 << 30) == {"target engine scratch": 12 << 20,
                                                                  "target engine (TensorRT allocator)": 16 << 30}
    assert engine_memory_report("draft", 5, None) == {"draft engine scratch": 5}  # the allocator off


@pytest.mark.gpu
def test_torch_backing_is_inside_the_caching_allocators_reservation():
    import torch

    from dspark_trt.runtime.tensorrt_memory import torch_backing

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    alloc, free = torch_backing(torch.device("cuda"))
    before = torch.cuda.memory_allocated()
    address = alloc(64 << 20, 0)
    assert address % 256 == 0 and torch.cuda.memory_allocated() >= before + (64 << 20)
    free(address)
    assert torch.cuda.memory_allocated() == before
