"""The PTX ISA rules of the AOT walk kernel: which ISA a CUDA driver JIT-compiles, which an arch needs, which to emit.

Pure functions of version numbers (ISA ×10 as an int: 8.0 → 80), no GPU, Triton or driver needed: ``aot``
chooses and checks the ISA it compiles with, ``ptx_launch`` turns the installed driver's CUDA version into its
cap, ``gpu_check`` and the export manifest report the oldest driver that runs a kernel.
"""

from __future__ import annotations

from ..errors import DSparkTrtError

__all__ = ["isa_number", "driver_max_ptx_isa", "min_driver_cuda", "min_ptx_isa", "check_isa_for_arch", "choose_ptx_isa"]


def isa_number(isa: str) -> int:
    """``"8.7"`` → 87."""
    major, minor = isa.split(".")
    return int(major) * 10 + int(minor)


def driver_max_ptx_isa(cuda_version: str) -> int:
    """The highest PTX ISA (×10) a driver of this CUDA version JIT-compiles: 12.0–12.5 → 8.0–8.5, 12.6 → 8.5,
    12.8 → 8.7, 12.9 → 8.8, 13.x → 9.x (the CUDA release notes' table, as Triton encodes it)."""
    try:
        major, minor = (int(x) for x in cuda_version.split(".")[:2])
    except ValueError:
        raise DSparkTrtError(f"CUDA version {cuda_version!r} is not MAJOR.MINOR") from None
    if major >= 13:
        return 90 + (major - 13) * 10 + minor
    if major == 12:
        return 80 + minor if minor < 6 else 80 + minor - 1
    if major == 11:
        return 70 + minor
    raise DSparkTrtError(f"CUDA {cuda_version} drivers are too old for the walk kernel (sm_80 needs CUDA >= 11)")


#: CUDA versions whose drivers exist, oldest first (``min_driver_cuda`` picks the first whose driver JITs an ISA)
_CUDA_RELEASES = tuple(f"11.{m}" for m in range(9)) + tuple(f"12.{m}" for m in (0, 1, 2, 3, 4, 5, 6, 8, 9)) + \
    tuple(f"13.{m}" for m in range(10))


def min_driver_cuda(isa: str | int) -> str:
    """The oldest CUDA version whose driver JIT-compiles PTX ISA ``isa`` ("8.0" or 80): 8.0 → 12.0, 8.4 → 12.4,
    8.7 → 12.8, 9.0 → 13.0 (the inverse of ``driver_max_ptx_isa`` over released versions)."""
    number = isa if isinstance(isa, int) else isa_number(isa)
    for cuda in _CUDA_RELEASES:
        if driver_max_ptx_isa(cuda) >= number:
            return cuda
    raise DSparkTrtError(f"no released CUDA driver JIT-compiles PTX ISA {number // 10}.{number % 10}")


def min_ptx_isa(arch: int) -> int:
    """The lowest PTX ISA (×10) that can target ``arch``'s PTX: sm_80 from ISA 7.0, sm_90a from 8.0 (the PTX ISA
    release notes; LLVM refuses lower: "PTX version 7.8 does not support target 'sm_90a'")."""
    return 80 if arch >= 90 else 70


def check_isa_for_arch(isa: int | None, arch: int, driver_cap: int | None = None) -> None:
    """Refuse (one line) an ISA below what ``arch`` needs: the cap came from ``--ptx-isa`` or from this host's
    driver (then the fix is a newer driver, or building the PTX on another host)."""
    need = min_ptx_isa(arch)
    if isa is None or isa >= need:
        return
    sm = f"sm_{arch}{'a' if arch >= 90 else ''}"
    if driver_cap is not None and isa == driver_cap:
        raise DSparkTrtError(f"{sm} PTX needs ISA >= {need // 10}.{need % 10}, but this host's driver JIT-compiles at "
                             f"most {isa // 10}.{isa % 10}; update the driver to CUDA >= {min_driver_cuda(need)}")
    raise DSparkTrtError(f"--ptx-isa {isa // 10}.{isa % 10} is below the {need // 10}.{need % 10} that {sm} PTX needs; "
                         f"use --ptx-isa {need // 10}.{need % 10} or higher")


def choose_ptx_isa(requested: int | None, triton_default: int | None, driver_cap: int | None = None) -> int | None:
    """The ISA to emit: the lowest of the requested cap, Triton's ptxas default and the driver's cap (None
    entries are unknown and ignored; None when all are unknown = Triton's default)."""
    caps = [c for c in (requested, triton_default, driver_cap) if c is not None]
    return min(caps) if caps else None
