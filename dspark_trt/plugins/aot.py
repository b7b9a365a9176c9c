"""Ahead-of-time PTX for the fused top-k Markov walk: what a TensorRT engine embeds, built on a CPU machine.

``triton.compile(ASTSource(kernel, signature, constexprs), target=GPUTarget("cuda", arch, 32))`` needs no
GPU. The PTX is what TensorRT's quickly-deployable AOT plugin stores in the engine; the driver JIT-compiles
it at load time, so its ISA version must be one the deployment driver accepts (CUDA 12.4 drivers (550) →
ISA ≤ 8.4, 12.8 (570) → 8.7, 13.0 (580) → 9.0). Triton's default ISA follows its bundled ptxas (ISA 9.4 for
sm_90 with Triton 3.9), so we cap it with the ``ptx_version`` compile option (``ptx_isa``) at the lowest ISA
the kernel needs, ``DEFAULT_PTX_ISA`` = 8.0: sm_90a exists from ISA 8.0 on (``min_ptx_isa``; LLVM refuses a
lower one), and this kernel uses nothing newer — so every CUDA 12.x and 13.x driver JIT-compiles it. We fall
back to Triton's default when its ptxas is older than the cap. ``validate_ptx`` assembles the result with
another ptxas — CUDA 13.0's next to ``nvcc`` here — which is what a CUDA 13.0 driver does.

Everything the export manifest and the TensorRT plugin need is a pure function of ``WalkKernelSpec`` and
two numbers of the compiled kernel (``num_warps``, ``shared``): kernel name, signature, int32 extra
arguments, launch parameters. ``write_ptx_artifacts`` writes the PTX files and returns a JSON-able dict.

The ISA rules (caps, driver versions, the arch's minimum) are ``ptx_isa.py``'s. The ISA is the lowest of three
caps (``choose_ptx_isa``): the one asked for (``--ptx-isa``), what Triton's ptxas emits, and — on a host with a
GPU driver — what that driver JIT-compiles (``ptx_launch.driver_ptx_isa_cap``); the chosen ISA is recorded with
each kernel, with its caps and the oldest CUDA driver that JIT-compiles it (``min_driver_cuda``). A cap below what the arch needs (a CUDA 11 driver for
sm_90a) is a one-line refusal, never a compile. The PTX targets ``sm_80``
(plain: any Ampere-or-newer driver JITs it) or ``sm_90a`` (Hopper's arch-specific features: it loads **only**
on compute capability 9.0 exactly — ``ptx_runs_on``), so a hardware-compatible (``ampere_plus``) engine
must embed the sm_80 file (``plugin_arch``). The kernel's static shared memory must stay ≤ 48 KiB
(``MAX_STATIC_SHARED_MEM``): the AOT launch passes ``shared_mem`` but cannot raise a kernel's opt-in limit.

Calling convention (TensorRT AOT): ``(11 input pointers, 2 int32 extras, 3 output pointers)``, grid
``(B, 1, 1)``, block ``(num_warps · 32, 1, 1)``. Triton ≥ 3.3 appends scratch pointer parameters
(``global_scratch``, and ``profile_scratch`` from 3.5) that are not part of that convention. NVIDIA's QDP
sample pinned Triton 3.2 (no scratch parameters) until TensorRT 10.14 and pins Triton 3.5 since 10.16, so
its own PTX now declares two parameters TensorRT's launch never fills; it works because its kernels never
read them. We do not rely on what TensorRT happens to put in those slots: this kernel never reads them
either (both scratch sizes are 0, checked at build time), so ``strip_unused_trailing_params`` removes them
from the PTX entry — after checking that the body never names them — and the PTX declares exactly the
documented parameters, for every TensorRT and Triton version (``stripped_params`` records how many went;
``trailing_params``, what a launcher must still pass as null, is then 0). The CUDA toolkit's ptxas
assembles the stripped PTX (``--validate``).

The candidate union's kernel (``union_kernel.py``, op ``DSparkTopKMarkovUnion``) builds the same way from a
spec with ``markov_topm`` M > 0: calling convention ``(13 input pointers, 2 int32 extras, 4 output
pointers)``, the same grid and block, its own kernel name, file names with ``m{M}`` and its own description
file (``description_file(M)``).

Run as ``python -m dspark_trt.plugins.aot --out DIR [--n 7 --k 512 --rank 256 --markov-topm M ...]``: prints
the dict and writes it to ``DIR/dspark_topk_markov_walk.json`` (``..._union.json`` with ``--markov-topm``;
what ``gpu_check --ptx-dir DIR`` reads).

The gated and RNN heads' kernels (``head_kernels.py``, ops ``DSparkTopKMarkovGated`` / ``DSparkTopKMarkovRNN``)
build the same way from a spec with ``markov_head_type`` ``gated`` | ``rnn`` (``--markov-head-type``): calling
convention ``(13 | 14 input pointers, 2 int32 extras, 3 output pointers)``, the same grid and block, their own
kernel names (so their own file names) and description files (``dspark_topk_markov_walk_gated.json``, ``..._rnn``).
It refuses to run under ``TRITON_INTERPRET=1``: the interpreter replaces the kernel that would be compiled.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import DSparkTrtError
from .contract import (HEAD_OPS, INPUTS, OP_NAME, OUTPUTS, PLUGIN_ID, PLUGIN_NAMESPACE, PLUGIN_VERSION, UNION_INPUTS,
                       UNION_OP_NAME, UNION_OUTPUTS, UNION_PLUGIN_ID)
from .ptx_isa import check_isa_for_arch, choose_ptx_isa, isa_number, min_driver_cuda, min_ptx_isa

__all__ = [
    "DTYPE_NAMES",
    "DEFAULT_ARCHS",
    "DEFAULT_PTX_ISA",
    "DESCRIPTION_FILE",
    "UNION_DESCRIPTION_FILE",
    "description_file",
    "EXTRA_ARGS",
    "WalkKernelSpec",
    "CompiledWalkKernel",
    "kernel_signature",
    "kernel_constexprs",
    "launch_params",
    "extra_arg_values",
    "compile_walk_kernel",
    "ptx_isa_version",
    "ptx_param_count",
    "strip_unused_trailing_params",
    "validate_ptx",
    "find_ptxas",
    "write_ptx_artifacts",
    "MAX_STATIC_SHARED_MEM",
    "plugin_arch",
    "ptx_runs_on",
    "cached_walk_kernel",
    "select_export_kernel",
]

#: contract dtype name → Triton pointer element type
DTYPE_NAMES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
#: fixed contract dtypes → Triton element type
_FIXED = {"int32": "i32", "float32": "fp32"}
DEFAULT_ARCHS = (80, 90)
DEFAULT_PTX_ISA = 80  # ISA 8.0: the lowest sm_90a accepts and all this kernel needs (CUDA >= 12.0 drivers JIT it)
MAX_STATIC_SHARED_MEM = 48 * 1024  # bytes a launch may use without cudaFuncAttributeMaxDynamicSharedMemorySize
DESCRIPTION_FILE = "dspark_topk_markov_walk.json"  # what the CLI writes beside the .ptx files
UNION_DESCRIPTION_FILE = "dspark_topk_markov_walk_union.json"  # the same for the union kernel (--markov-topm M)


def description_file(markov_topm: int = 0, markov_head_type: str = "vanilla") -> str:
    """The JSON description's file name: one per op, so every kernel's PTX can share a directory."""
    if markov_head_type != "vanilla":
        return f"dspark_topk_markov_walk_{markov_head_type}.json"
    return UNION_DESCRIPTION_FILE if markov_topm else DESCRIPTION_FILE

#: the int32 extra arguments, in order: (kernel argument, input whose shape gives the value, dimension)
EXTRA_ARGS = (("vocab", "markov_w1", 0), ("draft_vocab", "markov_w2", 0))


@dataclass(frozen=True)
class WalkKernelSpec:
    """One compiled variant: every constexpr plus the dtypes and the target."""

    num_draft_tokens: int  # N
    topk: int  # k
    rank: int  # r
    logit_scale: float
    logits_dtype: str = "bfloat16"  # contract "T": float32 | float16 | bfloat16
    weights_dtype: str = "bfloat16"  # contract "W"
    arch: int = 90  # compute capability, e.g. 80, 90
    ptx_isa: int | None = DEFAULT_PTX_ISA  # cap on the PTX ISA (80 = 8.0); None = Triton's default
    markov_topm: int = 0  # M: 0 = the DSparkTopKMarkov kernel, > 0 = the DSparkTopKMarkovUnion kernel
    markov_head_type: str = "vanilla"  # gated | rnn: the DSparkTopKMarkovGated / DSparkTopKMarkovRNN kernel

    def __post_init__(self):
        from .kernel import MAX_RANK, MAX_TOPK
        from .union_kernel import MAX_TOPM

        if self.markov_head_type not in HEAD_OPS:
            raise DSparkTrtError(f"markov_head_type {self.markov_head_type!r} is not one of {', '.join(HEAD_OPS)}")
        if self.head and self.markov_topm:
            raise DSparkTrtError(f"the candidate union (markov_topm {self.markov_topm}) is defined for the vanilla "
                                 f"Markov head only, not {self.markov_head_type}")

        if not 0 <= self.markov_topm <= MAX_TOPM:
            raise DSparkTrtError(f"markov_topm {self.markov_topm} is outside [0, {MAX_TOPM}] (0 = no candidate union)")

        for what, dt in (("logits_dtype", self.logits_dtype), ("weights_dtype", self.weights_dtype)):
            if dt not in DTYPE_NAMES:
                raise DSparkTrtError(f"{what} {dt!r} is not one of {', '.join(DTYPE_NAMES)}")
        if not 1 <= self.topk <= MAX_TOPK:
            raise DSparkTrtError(f"top-k {self.topk} is outside [1, {MAX_TOPK}] (TensorRT's TopK limit)")
        if not 1 <= self.rank <= MAX_RANK:
            raise DSparkTrtError(f"Markov rank {self.rank} is outside [1, {MAX_RANK}]")
        if self.num_draft_tokens < 1:
            raise DSparkTrtError(f"num_draft_tokens {self.num_draft_tokens} must be >= 1")
        if self.arch < 80:
            raise DSparkTrtError(f"compute capability {self.arch} is below 80; the kernel targets sm_80 and newer")

    @property
    def sm(self) -> str:
        return f"sm_{self.arch}{'a' if self.arch >= 90 else ''}"  # Triton's naming: sm_90a

    @property
    def union(self) -> bool:
        return self.markov_topm > 0

    @property
    def head(self) -> bool:
        """A gated or RNN head's kernel (``head_kernels.py``)."""
        return self.markov_head_type != "vanilla"

    @property
    def inputs(self) -> tuple:
        """The op's input contract (``contract.INPUTS``, ``UNION_INPUTS``, ``GATED_INPUTS`` or ``RNN_INPUTS``)."""
        return UNION_INPUTS if self.union else HEAD_OPS[self.markov_head_type][1]

    @property
    def op_name(self) -> str:
        return UNION_OP_NAME if self.union else HEAD_OPS[self.markov_head_type][0]

    @property
    def plugin_id(self) -> str:
        return UNION_PLUGIN_ID if self.union else PLUGIN_ID if not self.head else f"{PLUGIN_NAMESPACE}::{self.op_name}"

    @property
    def file_name(self) -> str:
        t, w = DTYPE_NAMES[self.logits_dtype], DTYPE_NAMES[self.weights_dtype]
        m = f"m{self.markov_topm}" if self.union else ""
        return f"{kernel_name(self)}.{self.sm}.{t}-{w}.n{self.num_draft_tokens}k{self.topk}{m}r{self.rank}.ptx"


def kernel_name(spec: WalkKernelSpec | None = None) -> str:
    """The kernel's (PTX entry's) name: the union kernel's for a spec with ``markov_topm`` > 0, a head kernel's for
    a gated or RNN spec."""
    if spec is not None and spec.head:
        from .head_kernels import HEAD_KERNEL_NAMES

        return HEAD_KERNEL_NAMES[spec.markov_head_type]
    if spec is not None and spec.union:
        from .union_kernel import UNION_KERNEL_NAME

        return UNION_KERNEL_NAME
    from .kernel import KERNEL_NAME

    return KERNEL_NAME


def kernel_signature(spec: WalkKernelSpec) -> list[tuple[str, str]]:
    """(argument, Triton type) for every runtime argument, in launch order: inputs, int32 extras, outputs."""
    def ty(dtype: str) -> str:
        if dtype == "T":
            return DTYPE_NAMES[spec.logits_dtype]
        if dtype == "W":
            return DTYPE_NAMES[spec.weights_dtype]
        return _FIXED[dtype]

    inputs, outputs = spec.inputs, UNION_OUTPUTS if spec.union else OUTPUTS
    return ([(c.name, "*" + ty(c.dtype)) for c in inputs]
            + [(name, "i32") for name, _, _ in EXTRA_ARGS]
            + [(c.name, "*" + ty(c.dtype)) for c in outputs])


def kernel_constexprs(spec: WalkKernelSpec) -> dict[str, int | float]:
    from .kernel import tile_config

    if spec.head:
        from .head_kernels import head_tile_config

        h = head_tile_config(spec.topk, spec.rank)
        return dict(N=spec.num_draft_tokens, K=spec.topk, R=spec.rank, BLOCK_K=h.block_k, BLOCK_R=h.block_r,
                    BLOCK_M=h.block_m, LOGIT_SCALE=float(spec.logit_scale))
    if spec.union:
        from .union_kernel import union_tile_config

        t = union_tile_config(spec.topk, spec.rank, spec.markov_topm)
        return dict(N=spec.num_draft_tokens, K=spec.topk, M=spec.markov_topm, R=spec.rank, BLOCK_K=t.block_k,
                    BLOCK_M=t.block_m, BLOCK_D=t.block_d, BLOCK_R=t.block_r, LOGIT_SCALE=float(spec.logit_scale))
    tiles = tile_config(spec.topk, spec.rank)
    return dict(N=spec.num_draft_tokens, K=spec.topk, R=spec.rank, BLOCK_K=tiles.block_k, BLOCK_R=tiles.block_r,
                LOGIT_SCALE=float(spec.logit_scale))


def num_warps(spec: WalkKernelSpec) -> int:
    from .kernel import tile_config

    if spec.head:
        from .head_kernels import head_tile_config

        return head_tile_config(spec.topk, spec.rank).num_warps

    return tile_config(spec.topk, spec.rank).num_warps


def launch_params(num_warps: int, shared_mem: int, batch: int | str = "B") -> dict:
    """Grid (one program per request), block and dynamic shared memory, as TensorRT's KernelLaunchParams."""
    return {"grid": [batch, 1, 1], "block": [num_warps * 32, 1, 1], "shared_mem": int(shared_mem)}


def extra_arg_values(shapes: dict[str, tuple[int, ...]]) -> list[int]:
    """The int32 extra arguments given the inputs' concrete shapes by name (a launcher's view of ``EXTRA_ARGS``)."""
    return [int(shapes[src][dim]) for _, src, dim in EXTRA_ARGS]


_VERSION_RE = re.compile(r"^\s*\.version\s+(\d+)\.(\d+)", re.MULTILINE)
_ENTRY_RE = re.compile(r"\.entry\s+(\w+)\s*\(([^)]*)\)", re.DOTALL)


def ptx_isa_version(ptx: str) -> str:
    """The ``.version`` line of a PTX module, e.g. ``"9.0"``."""
    m = _VERSION_RE.search(ptx)
    if m is None:
        raise DSparkTrtError("PTX has no .version line; is this a PTX file?")
    return f"{m.group(1)}.{m.group(2)}"


def strip_unused_trailing_params(ptx: str, name: str, keep: int) -> tuple[str, int]:
    """``ptx`` with the parameters of ``.entry name`` after the first ``keep`` removed, and how many went.

    Refuses (DSparkTrtError) when the kernel body names one of them: only parameters the code never reads
    can go without changing what it computes."""
    m = next((m for m in _ENTRY_RE.finditer(ptx) if m.group(1) == name), None)
    if m is None:
        raise DSparkTrtError(f"PTX has no .entry {name}")
    params = [p.strip() for p in m.group(2).split(",") if p.strip()]
    if len(params) < keep:
        raise DSparkTrtError(f".entry {name} declares {len(params)} parameters, fewer than the {keep} of the "
                             "calling convention")
    body = ptx[m.end():]
    for param in params[keep:]:
        pname = param.split()[-1]
        if re.search(rf"\b{re.escape(pname)}\b", body):
            raise DSparkTrtError(f"the kernel reads its trailing parameter {pname}; it cannot be dropped from the "
                                 "PTX (this Triton version is not supported by the AOT plugin)")
    if len(params) == keep:
        return ptx, 0
    head = ptx[: m.start(2)]
    new_params = "\n" + ",\n".join(f"\t{p}" for p in params[:keep]) + "\n"
    return head + new_params + ptx[m.end(2):], len(params) - keep


def ptx_param_count(ptx: str, name: str) -> int:
    """How many parameters the ``.entry name`` declares."""
    for entry, params in _ENTRY_RE.findall(ptx):
        if entry == name:
            return params.count(".param")
    raise DSparkTrtError(f"PTX has no .entry {name}")


@dataclass(frozen=True)
class CompiledWalkKernel:
    spec: WalkKernelSpec
    name: str
    ptx: str  # Triton's unused trailing parameters stripped: exactly TensorRT's AOT parameters
    num_warps: int
    shared_mem: int
    ptx_isa: str  # "9.0"
    triton_version: str
    stripped_params: int = 0  # how many unused trailing parameters Triton declared (scratch pointers)
    driver_isa_cap: int | None = None  # the compiling host's driver cap (×10), None without a driver

    @property
    def trailing_params(self) -> int:
        """Parameters after the outputs (Triton's scratch pointers): pass null pointers there."""
        return ptx_param_count(self.ptx, self.name) - len(kernel_signature(self.spec))

    @property
    def launch(self) -> dict:
        return launch_params(self.num_warps, self.shared_mem)


@contextlib.contextmanager
def _fresh_triton_cache():
    """A private TRITON_CACHE_DIR for one build: its key ignores the ptxas in use."""
    old = os.environ.get("TRITON_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="dspark-triton-cache-") as d:
        os.environ["TRITON_CACHE_DIR"] = d
        try:
            yield
        finally:
            if old is None:
                os.environ.pop("TRITON_CACHE_DIR", None)
            else:
                os.environ["TRITON_CACHE_DIR"] = old


def compile_walk_kernel(spec: WalkKernelSpec) -> CompiledWalkKernel:
    """``triton.compile`` the kernel for ``spec`` (no GPU needed); checks what the AOT launch relies on."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from .kernel import dspark_topk_markov_walk, interpreting
    from .union_kernel import dspark_topk_markov_walk_union

    if interpreting():
        raise DSparkTrtError("AOT compilation cannot run with TRITON_INTERPRET=1 (the interpreter replaces the "
                             "kernel); run `python -m dspark_trt.plugins.aot` in a process without it")
    fn = dspark_topk_markov_walk_union if spec.union else dspark_topk_markov_walk
    if spec.head:
        from .head_kernels import head_kernel

        fn = head_kernel(spec.markov_head_type)
    signature = dict(kernel_signature(spec))
    constexprs = kernel_constexprs(spec)
    signature.update({name: "constexpr" for name in constexprs})
    options = {"num_warps": num_warps(spec), "enable_fp_fusion": False}
    target = GPUTarget("cuda", spec.arch, 32)
    from .ptx_launch import driver_ptx_isa_cap

    driver_cap = driver_ptx_isa_cap()  # None on a host without a GPU driver
    isa = choose_ptx_isa(spec.ptx_isa, _triton_default_isa(spec.arch), driver_cap)
    check_isa_for_arch(isa, spec.arch, driver_cap)  # before LLVM, which aborts the process on a too-low ISA
    with _fresh_triton_cache():
        try:
            with contextlib.redirect_stdout(sys.stderr):  # Triton prints the failing PTX to stdout
                compiled = triton.compile(ASTSource(fn, signature, constexprs), target=target,
                                          options={**options, "ptx_version": isa})
        except Exception as e:  # an older ptxas than we could tell: use Triton's own (lower) default ISA
            if isa is None or "Unsupported .version" not in str(e):
                raise
            compiled = triton.compile(ASTSource(fn, signature, constexprs), target=target, options=options)
    meta = compiled.metadata
    for scratch in ("global_scratch_size", "profile_scratch_size"):
        if getattr(meta, scratch, 0):
            raise DSparkTrtError(f"the compiled kernel needs {scratch}={getattr(meta, scratch)} bytes, which "
                                 f"TensorRT's AOT launch cannot provide; this Triton version is not supported")
    check_shared_mem(meta.shared)
    ptx = compiled.asm["ptx"]
    if isinstance(ptx, bytes):
        ptx = ptx.decode()
    isa = ptx_isa_version(ptx)
    for cap, what in ((spec.ptx_isa, "the requested cap"), (driver_cap, "this host's driver cap")):
        if cap is not None and isa_number(isa) > cap:
            raise DSparkTrtError(f"PTX ISA {isa} exceeds {what} {cap // 10}.{cap % 10}")
    ptx, stripped = strip_unused_trailing_params(ptx, meta.name, len(kernel_signature(spec)))
    return CompiledWalkKernel(spec=spec, name=meta.name, ptx=ptx, num_warps=meta.num_warps,
                              shared_mem=meta.shared, ptx_isa=isa, triton_version=triton.__version__,
                              stripped_params=stripped, driver_isa_cap=driver_cap)


@functools.lru_cache(maxsize=32)
def cached_walk_kernel(spec: WalkKernelSpec) -> CompiledWalkKernel:
    """``compile_walk_kernel`` once per process and spec (TensorRT calls the AOT hook once per tactic/format)."""
    return compile_walk_kernel(spec)


def check_shared_mem(shared_mem: int) -> None:
    """Refuse a kernel that needs more than 48 KiB of shared memory: TensorRT's AOT launch passes the byte
    count but does not raise the kernel's dynamic shared memory limit (cudaFuncSetAttribute)."""
    if int(shared_mem) > MAX_STATIC_SHARED_MEM:
        raise DSparkTrtError(f"the walk kernel needs {int(shared_mem)} bytes of shared memory, more than the "
                             f"{MAX_STATIC_SHARED_MEM} an AOT plugin launch may use; lower the tile size "
                             f"(kernel.TILE_ELEMENTS) or the top-k")


def plugin_arch(hardware_compatibility: str, device_capability: int | None) -> int:
    """Compute capability of the PTX an engine embeds: a hardware-compatible engine (``ampere_plus``) runs on
    any Ampere-or-newer GPU, so it must embed plain sm_80 PTX (never sm_90a, which loads on 9.0 only); other
    engines embed the building GPU's (TensorRT builds on the target GPU), or sm_80 when it is unknown."""
    if hardware_compatibility == "ampere_plus" or device_capability is None:
        return 80
    if hardware_compatibility not in ("none", "same_compute_capability"):
        raise DSparkTrtError(f"hardware compatibility {hardware_compatibility!r}: use none, ampere_plus or "
                             "same_compute_capability")
    return 90 if device_capability == 90 else 80  # sm_90a for Hopper; sm_80 PTX JITs on everything else


def ptx_runs_on(arch: str, capability: int) -> bool:
    """Whether PTX for ``arch`` ("sm_80", "sm_90a") loads on a GPU of ``capability`` (e.g. 90): arch-specific
    ("a") PTX on that exact capability only, plain PTX on that capability and newer."""
    m = re.fullmatch(r"sm_(\d+)(a?)", arch)
    if m is None:
        raise DSparkTrtError(f"PTX target {arch!r} is not sm_NN or sm_NNa")
    cc = int(m.group(1))
    return capability == cc if m.group(2) else capability >= cc


def select_export_kernel(kernel: dict, kernel_dir: str | Path, spec: WalkKernelSpec, *,
                         hardware_compatibility: str = "none", driver_cap: int | None = None) -> dict:
    """The export's own PTX for ``spec`` (what ``dspark-export`` built and checked under ``plugin/``), as
    ``{"name", "ptx", "launch", "entry"}``; one-line errors when there is none, its checksum differs, a
    hardware-compatible engine would get sm_90a PTX, or the build host's driver cannot JIT its ISA."""
    c = kernel.get("constexprs", {})
    if kernel.get("op", OP_NAME) != spec.op_name:
        raise DSparkTrtError(f"the export's PTX is for {kernel.get('op', OP_NAME)}, the graph's node is {spec.op_name}; "
                             "re-run dspark-export")
    built = (c.get("N"), c.get("K"), c.get("R"), c.get("M", 0))
    same_scale = _f32(float(c.get("LOGIT_SCALE", "nan"))) == _f32(spec.logit_scale)  # the attribute is FLOAT (fp32)
    need = (spec.num_draft_tokens, spec.topk, spec.rank, spec.markov_topm)
    if built != need or not same_scale:
        raise DSparkTrtError(f"the export's PTX was built for N, k, r, M = {built} and logit_scale "
                             f"{c.get('LOGIT_SCALE')}, the graph needs {need} and {spec.logit_scale}; re-run dspark-export")
    matches = [e for e in kernel.get("kernels", []) if e["compute_capability"] == spec.arch
               and e["logits_dtype"] == spec.logits_dtype and e["weights_dtype"] == spec.weights_dtype]
    if not matches:
        have = ", ".join(f"{e['arch']} {e['logits_dtype']}-{e['weights_dtype']}" for e in kernel.get("kernels", []))
        raise DSparkTrtError(f"the export has no PTX for {spec.sm} {spec.logits_dtype}-{spec.weights_dtype} (it has "
                             f"{have or 'none'}); re-run dspark-export with --ptx-archs including {spec.arch}")
    entry = matches[0]
    if hardware_compatibility == "ampere_plus" and entry["arch"] != "sm_80":
        raise DSparkTrtError(f"a hardware-compatible (ampere_plus) engine must embed sm_80 PTX, not {entry['arch']}")
    path = Path(kernel_dir) / entry["file"]
    if not path.is_file():
        raise DSparkTrtError(f"{path} is missing; re-run dspark-export")
    ptx = path.read_text()
    if hashlib.sha256(ptx.encode()).hexdigest() != entry["sha256"]:
        raise DSparkTrtError(f"{path} differs from the PTX the export checked (sha256); re-run dspark-export")
    if driver_cap is not None and isa_number(entry["ptx_isa"]) > driver_cap:
        cap = f"{driver_cap // 10}.{driver_cap % 10}"
        fix = (f"re-export with --ptx-isa {cap} (or update the driver)" if driver_cap >= min_ptx_isa(spec.arch) else
               f"update the driver to CUDA >= {min_driver_cuda(entry['ptx_isa'])}")
        raise DSparkTrtError(f"{entry['file']} is PTX ISA {entry['ptx_isa']} but this host's driver JIT-compiles "
                             f"at most {cap}; {fix}")
    check_shared_mem(entry["launch"]["shared_mem"])
    return {"name": kernel["kernel_name"], "ptx": ptx, "launch": entry["launch"], "entry": entry}


def _f32(x: float) -> float:
    import struct

    return struct.unpack("f", struct.pack("f", x))[0]


def _triton_default_isa(arch: int) -> int | None:
    """The PTX ISA Triton would emit for ``arch`` (from its bundled ptxas), or None if it cannot be told."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas, ptx_get_version

        return int(ptx_get_version(get_ptxas(arch).version))
    except Exception:  # internal API (present in Triton 3.6-3.9); the compile falls back on its own
        return None


def find_ptxas() -> str | None:
    """The CUDA toolkit's ptxas (next to nvcc), or None."""
    nvcc = shutil.which("nvcc")
    candidates = [Path(nvcc).resolve().parent / "ptxas"] if nvcc else []
    candidates += [Path(p) for p in filter(None, [shutil.which("ptxas")])]
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    return None


def ptxas_version(ptxas: str) -> str:
    out = subprocess.run([ptxas, "--version"], capture_output=True, text=True, check=True).stdout
    m = re.search(r"release (\d+\.\d+)", out)
    return m.group(1) if m else out.strip().splitlines()[-1]


def validate_ptx(ptx: str, sm: str, ptxas: str) -> dict:
    """Assemble PTX with ``ptxas`` (as a driver of that CUDA version would JIT it): registers, spills."""
    with tempfile.TemporaryDirectory(prefix="dspark-ptxas-") as d:
        src = Path(d) / "k.ptx"
        src.write_text(ptx)
        proc = subprocess.run([ptxas, f"--gpu-name={sm}", "-v", str(src), "-o", str(Path(d) / "k.cubin")],
                              capture_output=True, text=True)
    if proc.returncode != 0:
        raise DSparkTrtError(f"ptxas {ptxas} rejected the PTX for {sm}: {proc.stderr.strip().splitlines()[-1:]}")
    regs = re.search(r"Used (\d+) registers", proc.stderr)
    spills = re.search(r"(\d+) bytes spill stores", proc.stderr)
    return {"ptxas": ptxas, "ptxas_version": ptxas_version(ptxas), "registers": int(regs.group(1)) if regs else None,
            "spill_store_bytes": int(spills.group(1)) if spills else 0}


def write_ptx_artifacts(
    out_dir: str | Path,
    *,
    num_draft_tokens: int,
    topk: int,
    rank: int,
    logit_scale: float,
    dtypes: tuple[tuple[str, str], ...] = (("bfloat16", "bfloat16"),),
    archs: tuple[int, ...] = DEFAULT_ARCHS,
    ptx_isa: int | None = DEFAULT_PTX_ISA,
    validate_with: str | None = None,
    markov_topm: int = 0,
    markov_head_type: str = "vanilla",
) -> dict:
    """Compile one PTX per (arch, dtype pair) into ``out_dir`` and return their JSON-able description.

    ``markov_head_type`` gated | rnn builds that head's kernel (``DSparkTopKMarkovGated`` / ``RNN``): the
    description then names that op and plugin and carries ``markov_head_type``.

    ``markov_topm`` M > 0 builds the union kernel (``DSparkTopKMarkovUnion``) instead: the description then
    names that op and plugin and carries ``markov_topm`` and the constexpr ``M``.

    ``validate_with``: a ptxas to assemble each file with (``find_ptxas()``: the CUDA toolkit's); the result
    is recorded under ``validated``. Files are written atomically; an existing file of the same name is
    replaced only if its content is identical (the name encodes every input of the build).
    """
    from ..atomic import atomic_write_text

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    kernels = []
    triton_version = None
    for arch in archs:
        for logits_dtype, weights_dtype in dtypes:
            spec = WalkKernelSpec(num_draft_tokens, topk, rank, float(logit_scale), logits_dtype, weights_dtype,
                                  arch, ptx_isa, markov_topm, markov_head_type)
            ck = compile_walk_kernel(spec)
            triton_version = ck.triton_version
            path = out_dir / spec.file_name
            if path.exists() and path.read_text() != ck.ptx:
                raise DSparkTrtError(f"{path} exists with different content; remove it or choose another directory")
            atomic_write_text(path, ck.ptx)
            entry = {
                "file": spec.file_name,
                "arch": spec.sm,
                "compute_capability": arch,
                "ptx_isa": ck.ptx_isa,
                "ptx_isa_caps": {"requested": ptx_isa, "driver": ck.driver_isa_cap, "arch_min": min_ptx_isa(arch)},
                "min_driver_cuda": min_driver_cuda(ck.ptx_isa),
                "logits_dtype": logits_dtype,
                "weights_dtype": weights_dtype,
                "num_warps": ck.num_warps,
                "launch": ck.launch,
                "params": ptx_param_count(ck.ptx, ck.name),
                "trailing_params": ck.trailing_params,
                "stripped_params": ck.stripped_params,
                "sha256": hashlib.sha256(ck.ptx.encode()).hexdigest(),
            }
            if validate_with:
                entry["validated"] = validate_ptx(ck.ptx, spec.sm, validate_with)
            kernels.append(entry)
    first = WalkKernelSpec(num_draft_tokens, topk, rank, float(logit_scale), *dtypes[0], archs[0], ptx_isa,
                           markov_topm, markov_head_type)
    return {
        "op": first.op_name,
        "plugin": first.plugin_id,
        "plugin_version": PLUGIN_VERSION,
        **({"markov_topm": markov_topm} if markov_topm else {}),
        **({"markov_head_type": markov_head_type} if markov_head_type != "vanilla" else {}),
        "kernel_name": kernel_name(first),
        "triton_version": triton_version,
        "calling_convention": "input pointers, int32 extra arguments, output pointers (TensorRT AOT), then a "
                              "null pointer for each trailing parameter",
        "constexprs": kernel_constexprs(first),
        "signature": [{"name": n, "type": t} for n, t in kernel_signature(first)],
        "extra_args": [{"name": n, "dtype": "int32", "input": src, "dim": dim} for n, src, dim in EXTRA_ARGS],
        "kernels": kernels,
    }


# ------------------------------------------------------------------------------------------------ CLI


def _parse_dtypes(text: str) -> tuple[tuple[str, str], ...]:
    aliases = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", **{v: v for v in DTYPE_NAMES}}
    pairs = []
    for item in text.split(","):
        t, _, w = item.strip().partition("-")
        w = w or t
        if t not in aliases or w not in aliases:
            raise DSparkTrtError(f"--dtypes item {item!r} must be LOGITS[-WEIGHTS] from fp32/fp16/bf16, e.g. bf16-bf16")
        pairs.append((aliases[t], aliases[w]))
    return tuple(pairs)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dspark_trt.plugins.aot", description=__doc__.split("\n\n")[0],
                                allow_abbrev=False)
    p.add_argument("--out", required=True, help="directory for the .ptx files")
    p.add_argument("--n", type=int, default=7, help="num_draft_tokens N (default 7)")
    p.add_argument("--k", type=int, default=512, help="top-k candidates per slot (default 512)")
    p.add_argument("--rank", type=int, default=256, help="Markov rank r (default 256)")
    p.add_argument("--markov-topm", type=int, default=0, help="union width M: > 0 builds the DSparkTopKMarkovUnion "
                                                              "kernel (default 0: DSparkTopKMarkov)")
    p.add_argument("--markov-head-type", default="vanilla", choices=tuple(HEAD_OPS),
                   help="gated | rnn builds the DSparkTopKMarkovGated / DSparkTopKMarkovRNN kernel (default vanilla)")
    p.add_argument("--logit-scale", type=float, default=1.0)
    p.add_argument("--dtypes", default="bf16-bf16", help="comma list of LOGITS-WEIGHTS (default bf16-bf16)")
    p.add_argument("--archs", default="80,90", help="compute capabilities (default 80,90)")
    default_isa = f"{DEFAULT_PTX_ISA // 10}.{DEFAULT_PTX_ISA % 10}"
    p.add_argument("--ptx-isa", default=default_isa, help=f"PTX ISA cap (default {default_isa}: the lowest the kernel "
                   "needs, JIT-compiled by CUDA >= 12.0 drivers); 'triton' = Triton's default")
    p.add_argument("--validate", action="store_true", help="assemble each PTX with the CUDA toolkit's ptxas")
    args = p.parse_args(argv)
    try:
        isa = None if args.ptx_isa == "triton" else isa_number(args.ptx_isa)
        ptxas = find_ptxas() if args.validate else None
        if args.validate and ptxas is None:
            raise DSparkTrtError("--validate needs a CUDA toolkit ptxas (nvcc's directory or PATH)")
        info = write_ptx_artifacts(args.out, num_draft_tokens=args.n, topk=args.k, rank=args.rank,
                                   logit_scale=args.logit_scale, dtypes=_parse_dtypes(args.dtypes),
                                   archs=tuple(int(a) for a in args.archs.split(",")), ptx_isa=isa,
                                   validate_with=ptxas, markov_topm=args.markov_topm,
                                   markov_head_type=args.markov_head_type)
        from ..atomic import atomic_write_text

        atomic_write_text(Path(args.out) / description_file(args.markov_topm, args.markov_head_type),
                          json.dumps(info, indent=2) + "\n")
    except DSparkTrtError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(info, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
