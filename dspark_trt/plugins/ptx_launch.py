"""Load the AOT PTX through the CUDA driver API and launch it the way a TensorRT engine does.

TensorRT's quickly-deployable AOT plugin stores (kernel name, PTX, launch parameters, int32 extra arguments)
in the engine and, at enqueue, calls ``cuLaunchKernel`` with the parameters ``(input pointers…, extra ints…,
output pointers…)``. This module does the same with ``ctypes`` and ``libcuda`` only (no cuda-python, nothing
to install), so a GPU host can prove that the artifact the engine embeds computes the op: the driver
JIT-compiles the PTX (rejecting an ISA it does not know) and the outputs can be compared with the oracle.

``aot`` strips the scratch-pointer parameters Triton ≥ 3.3 appends (the kernel never reads them), so
``trailing_params`` is 0 for our PTX; a PTX that still declares some gets null pointers there.
"""

from __future__ import annotations

import ctypes
import functools

from ..errors import DSparkTrtError
from .ptx_isa import driver_max_ptx_isa

__all__ = ["aot_kernel_params", "PtxModule", "libcuda", "driver_version", "driver_ptx_isa_cap"]

_CU_JIT_ERROR_LOG_BUFFER = 5
_CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6


def aot_kernel_params(input_ptrs: list[int], extras: list[int], output_ptrs: list[int],
                      trailing: int) -> list[ctypes.c_uint64 | ctypes.c_int32]:
    """The kernel parameter values in TensorRT's AOT order: u64 pointers, i32 extras, u64 pointers, null u64s."""
    return ([ctypes.c_uint64(p) for p in input_ptrs] + [ctypes.c_int32(v) for v in extras]
            + [ctypes.c_uint64(p) for p in output_ptrs] + [ctypes.c_uint64(0) for _ in range(trailing)])


@functools.cache
def libcuda() -> ctypes.CDLL:
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError:
            continue
    else:
        raise DSparkTrtError("the CUDA driver library (libcuda.so.1) is not loadable; run on a host with a GPU driver")
    lib.cuGetErrorString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    lib.cuModuleLoadDataEx.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p, ctypes.c_uint,
                                       ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_void_p)]
    lib.cuModuleGetFunction.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_char_p]
    lib.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p,
                                                                             ctypes.POINTER(ctypes.c_void_p),
                                                                             ctypes.c_void_p]
    lib.cuModuleUnload.argtypes = [ctypes.c_void_p]
    return lib


def _check(result: int, what: str, log: bytes = b"") -> None:
    if result != 0:
        msg = ctypes.c_char_p()
        libcuda().cuGetErrorString(result, ctypes.byref(msg))
        detail = log.split(b"\0", 1)[0].decode(errors="replace").strip()
        raise DSparkTrtError(f"{what} failed: CUDA error {result} ({(msg.value or b'?').decode()})"
                             + (f": {detail}" if detail else ""))


def driver_version() -> str:
    """The CUDA version of the installed driver, e.g. "13.0" (no context or GPU needed, only libcuda)."""
    v = ctypes.c_int()
    _check(libcuda().cuDriverGetVersion(ctypes.byref(v)), "cuDriverGetVersion")
    return f"{v.value // 1000}.{v.value % 1000 // 10}"


def driver_ptx_isa_cap() -> int | None:
    """The highest PTX ISA (×10) this host's driver JIT-compiles, or None without a loadable driver."""
    try:
        return driver_max_ptx_isa(driver_version())
    except DSparkTrtError:
        return None


class PtxModule:
    """One PTX module JIT-compiled by the driver in the current context (create CUDA tensors first: torch
    makes the device's primary context current)."""

    def __init__(self, ptx: str, kernel_name: str):
        lib = libcuda()
        _check(lib.cuInit(0), "cuInit")
        log = ctypes.create_string_buffer(8192)
        options = (ctypes.c_int * 2)(_CU_JIT_ERROR_LOG_BUFFER, _CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES)
        values = (ctypes.c_void_p * 2)(ctypes.cast(log, ctypes.c_void_p), ctypes.c_void_p(len(log)))
        self._module = ctypes.c_void_p()
        _check(lib.cuModuleLoadDataEx(ctypes.byref(self._module), ptx.encode() + b"\0", 2, options, values),
               "cuModuleLoadDataEx (the driver's PTX JIT)", log.raw)
        self._function = ctypes.c_void_p()
        _check(lib.cuModuleGetFunction(ctypes.byref(self._function), self._module, kernel_name.encode()),
               f"cuModuleGetFunction({kernel_name})")

    def launch(self, grid: tuple[int, int, int], block: tuple[int, int, int], shared_mem: int, stream: int,
               params: list) -> None:
        """``cuLaunchKernel`` with ``params`` (ctypes values, e.g. from ``aot_kernel_params``) on ``stream``."""
        ptrs = (ctypes.c_void_p * len(params))(*(ctypes.cast(ctypes.byref(p), ctypes.c_void_p) for p in params))
        _check(libcuda().cuLaunchKernel(self._function, *grid, *block, shared_mem, ctypes.c_void_p(stream), ptrs,
                                        None), "cuLaunchKernel")

    def close(self) -> None:
        if self._module:
            libcuda().cuModuleUnload(self._module)
            self._module = ctypes.c_void_p()

    def __enter__(self) -> "PtxModule":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
