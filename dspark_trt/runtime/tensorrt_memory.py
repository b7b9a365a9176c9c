"""The device memory TensorRT allocates itself, counted: a ``trt.IGpuAsyncAllocator`` for the runtime.

    ledger = AllocationLedger()
    runtime.gpu_allocator = counting_allocator(trt, ledger, *torch_backing(device))   # before deserializing
    engine = runtime.deserialize_cuda_engine(plan)          # the weights land in the ledger
    ledger.live, ledger.peak                                # bytes TensorRT holds now / at most

A deserialized engine keeps its weights (and small per-context state) in memory TensorRT allocates through the
runtime's GPU allocator, not the CUDA caching allocator torch reports (``device_memory.reserved_device_memory``):
for a bf16 8B target that is ~16 GB nobody counted. Here the runtime's allocator allocates *through* torch's
caching allocator (``torch.cuda.caching_allocator_alloc`` / ``caching_allocator_delete``), so the caching
allocator's reservation includes TensorRT's share, and a ledger counts it apart (live and peak bytes, calls,
the first failure) for the report.

What the binding does (TensorRT 10.7–11.1 ``python/src/infer/pyCore.cpp``, ``PyGpuAsyncAllocator``): it calls
the Python ``allocate_async(size, alignment, stream, flags)`` — stream *before* flags, unlike the C++ order —
and casts the result to an address (0 is nullptr: "could not allocate"; an exception or a non-int is printed
and taken as nullptr); ``deallocate_async(memory, stream)`` must return a bool; ``reallocate(address,
alignment, new_size)`` returning 0 says "not supported". ``Runtime.gpu_allocator`` keeps the allocator alive
as long as the runtime (``keep_alive``); TensorRT requires it to outlive every engine, so
``TensorRTEngine`` holds it too.

Not installed as the contexts' ``temporary_allocator``: TensorRT uses that only inside ``enqueueV3`` for
storage it cannot size ahead and frees it before the call returns, i.e. inside a CUDA-graph capture — a Python
callback there is a risk with nothing to count afterwards. Context activations are the engine's one
``USER_MANAGED`` scratch buffer, a torch tensor (``tensorrt_engine.TensorRTEngine``).

Pure, CPU-tested with a fake base class that behaves like the binding: ``AllocationLedger``,
``counting_allocator`` (alignment refused, zero sizes, a failing backing store recorded, unknown addresses).
"""

from __future__ import annotations

import threading
from typing import Any, Callable

__all__ = ["AllocationLedger", "counting_allocator", "torch_backing"]


class AllocationLedger:
    """Addresses → sizes of what TensorRT holds; live and peak bytes; the first failure (thread-safe: TensorRT
    may allocate from its own threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sizes: dict[int, int] = {}
        self.live = self.peak = self.allocations = self.frees = 0
        self.failure: str | None = None

    def add(self, address: int, size: int) -> None:
        with self._lock:
            self._sizes[address] = size
            self.live += size
            self.peak = max(self.peak, self.live)
            self.allocations += 1

    def remove(self, address: int) -> int | None:
        """The size freed, or None for an address this ledger never handed out."""
        with self._lock:
            size = self._sizes.pop(address, None)
            if size is not None:
                self.live -= size
                self.frees += 1
            return size

    def fail(self, why: str) -> None:
        with self._lock:
            if self.failure is None:
                self.failure = why

    def report(self) -> dict:
        with self._lock:
            return {"live": self.live, "peak": self.peak, "allocations": self.allocations, "frees": self.frees,
                    "failure": self.failure}


def counting_allocator(trt: Any, ledger: AllocationLedger, alloc: Callable[[int, int], int],
                       free: Callable[[int], None]):
    """A ``trt.IGpuAsyncAllocator`` whose every allocation goes through ``alloc(size, stream) -> address`` and
    ``free(address)``, counted in ``ledger``. Never raises into TensorRT: a failure is recorded in the ledger
    and answered with 0 (nullptr), which TensorRT reports as an allocation failure."""
    base = trt.IGpuAsyncAllocator

    class CountingAllocator(base):  # type: ignore[misc, valid-type]
        def __init__(self):
            base.__init__(self)
            self.ledger = ledger
            self._alloc, self._free = alloc, free  # bound here: no module lookups at interpreter exit

        # the binding's order: (size, alignment, stream, flags)
        def allocate_async(self, size, alignment, stream, flags):
            size, alignment = int(size), int(alignment)
            if size == 0:
                return 0
            try:
                address = int(self._alloc(size, int(stream or 0)))
            except Exception as e:  # out of memory, no device: TensorRT sees nullptr, the ledger says why
                ledger.fail(f"allocating {size} bytes: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
                return 0
            if alignment and address % alignment:
                self._free(address)
                ledger.fail(f"address {address:#x} is not {alignment}-byte aligned")
                return 0
            ledger.add(address, size)
            return address

        def deallocate_async(self, memory, stream):
            address = int(memory or 0)
            if not address:
                return True  # TensorRT may hand back the nullptr of a zero-size allocation
            if ledger.remove(address) is None:
                return False
            try:
                self._free(address)
            except Exception as e:
                ledger.fail(f"freeing {address:#x}: {type(e).__name__}: {e}")
                return False
            return True

        def reallocate(self, address, alignment, new_size):
            return 0  # not supported: TensorRT allocates anew

    return CountingAllocator()


def torch_backing(device) -> tuple[Callable[[int, int], int], Callable[[int], None]]:
    """``alloc(size, stream)`` / ``free(address)`` through torch's CUDA caching allocator on ``device`` (its blocks
    are 512-byte aligned, more than cudaMalloc's 256 that TensorRT may ask for)."""
    import torch

    caching_alloc, caching_delete = torch.cuda.caching_allocator_alloc, torch.cuda.caching_allocator_delete

    def alloc(size: int, stream: int) -> int:
        return int(caching_alloc(size, device, stream or None))

    return alloc, caching_delete
