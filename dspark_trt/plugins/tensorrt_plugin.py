"""``dspark::DSparkTopKMarkov`` v1 as a TensorRT quickly-deployable plugin (``tensorrt.plugin``), AOT only.

The engine embeds the kernel's PTX (the export's ``plugin/*.ptx``), so it runs in any TensorRT runtime —
trtexec, Triton's ``tensorrt_plan`` backend — with no Python and no plugin library. Thin on purpose: the
shapes, dtypes, type combinations, launch parameters and extra arguments come from pure functions here and
in ``aot.py`` that the CPU tests cover; only the decorated functions touch ``tensorrt``.

    from dspark_trt.plugins.tensorrt_plugin import register_plugin
    register_plugin()            # before parsing an ONNX file with the DSparkTopKMarkov node (aot=1)

The node's attributes: ``k`` (int) and ``logit_scale`` (float). AOT plugins do not serialize attributes;
both are compiled into the PTX as constants, with N and r read from the (static) input shapes.

Which PTX the engine embeds: ``use_export_ptx(kernel, kernel_dir)`` (what ``dspark-export`` and
``dspark build-engine`` do) makes the AOT hook hand TensorRT the export's own ``plugin/*.ptx`` — the files the
export built, assembled with ptxas and checksummed — after checking its ISA against this host's driver
(``aot.select_export_kernel``). Without it (a network built by hand, the tests) the hook compiles the
kernel here, once per spec (``aot.cached_walk_kernel``), with the ISA capped by the driver too. Either way
the PTX arch follows ``aot.plugin_arch``: sm_80 for hardware-compatible engines, else the building GPU's.
``embedded_kernels()`` lists what went into the engines built in this process (for the manifest).

TensorRT < 10.9 has no AOT plugins (``KernelLaunchParams``): ``register_plugin`` refuses it in one line
before registering anything.
"""

# no `from __future__ import annotations`: tensorrt.plugin inspects the annotations as classes
import functools
import itertools

from ..errors import DSparkTrtError
from .aot import DEFAULT_PTX_ISA, EXTRA_ARGS, WalkKernelSpec
from .contract import INPUTS, OUTPUTS, PLUGIN_ID

__all__ = ["TRT_TYPE_NAMES", "DTYPE_COMBINATIONS", "MIN_TENSORRT", "autotune_type_strings", "output_layout",
           "register_plugin", "build_arch", "check_tensorrt_version", "use_export_ptx", "embedded_kernels"]

MIN_TENSORRT = (10, 9)  # tensorrt.plugin.aot_impl / KernelLaunchParams
#: (kernel description, its directory, hardware compatibility) set by use_export_ptx
_EXPORT_PTX: dict = {}
_EMBEDDED: list[dict] = []

#: contract dtype name → TensorRT AutoTuneCombination type name
TRT_TYPE_NAMES = {"float32": "FP32", "float16": "FP16", "bfloat16": "BF16", "int32": "INT32"}
#: (logits "T", weights "W") pairs the kernel is built for: every float combination
DTYPE_COMBINATIONS = tuple(itertools.product(("float32", "float16", "bfloat16"), repeat=2))


def autotune_type_strings() -> list[str]:
    """One ``AutoTuneCombination`` type string per (T, W): the 11 inputs then the 3 outputs, in contract order."""
    def name(dtype: str, t: str, w: str) -> str:
        return TRT_TYPE_NAMES[{"T": t, "W": w}.get(dtype, dtype)]

    return [", ".join(name(c.dtype, t, w) for c in (*INPUTS, *OUTPUTS)) for t, w in DTYPE_COMBINATIONS]


def output_layout() -> list[tuple[tuple[tuple[int, int], ...], str]]:
    """For each output: its dims as (input index, dim index) pairs, and its fixed dtype name."""
    dims = {"[B, N]": ((0, 0), (0, 1)), "[B, N, k]": ((0, 0), (0, 1), (0, 2))}
    return [(dims[c.shape], c.dtype) for c in OUTPUTS]


def build_arch(hardware_compatibility: str = "none") -> int:
    """Compute capability of the PTX to embed (``aot.plugin_arch``): sm_80 for a hardware-compatible engine or
    an unknown GPU, sm_90(a) on Hopper, sm_80 PTX elsewhere (any newer driver JIT-compiles it)."""
    from .aot import plugin_arch

    capability = None
    try:
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            capability = major * 10 + minor
    except Exception:
        pass
    return plugin_arch(hardware_compatibility, capability)


def check_tensorrt_version(version: str, has_kernel_launch_params: bool = True) -> None:
    """One-line refusal of a TensorRT without AOT plugins (< 10.9, or no ``tensorrt.plugin.KernelLaunchParams``)."""
    try:
        have = tuple(int(x) for x in version.split(".")[:2])
    except ValueError:
        raise DSparkTrtError(f"cannot read the TensorRT version {version!r}") from None
    if have < MIN_TENSORRT or not has_kernel_launch_params:
        raise DSparkTrtError(f"TensorRT {version} has no ahead-of-time plugins (tensorrt.plugin.KernelLaunchParams, "
                             f"TensorRT >= {MIN_TENSORRT[0]}.{MIN_TENSORRT[1]}); upgrade TensorRT on the build host")


def use_export_ptx(kernel: dict | None, kernel_dir=None, *, hardware_compatibility: str = "none") -> None:
    """Embed the export's own PTX (manifest ``kernel`` section, files under ``kernel_dir``) in engines built
    from now on in this process; ``None`` goes back to compiling here."""
    _EXPORT_PTX.clear()
    if kernel is not None:
        _EXPORT_PTX.update(kernel=kernel, dir=kernel_dir, hardware_compatibility=hardware_compatibility)
    else:
        _EXPORT_PTX.update(hardware_compatibility=hardware_compatibility)


def embedded_kernels() -> list[dict]:
    """What the AOT hook handed TensorRT so far in this process: file/sha256/ISA/arch and where it came from."""
    return list(_EMBEDDED)


def _kernel_for(spec: WalkKernelSpec) -> tuple[str, str, dict, dict]:
    """(kernel name, PTX, launch params, record) for ``spec``: the export's PTX when set, else compiled here."""
    import hashlib

    from .aot import cached_walk_kernel, select_export_kernel
    from .ptx_launch import driver_ptx_isa_cap

    driver_cap = driver_ptx_isa_cap()
    if "kernel" in _EXPORT_PTX:
        k = select_export_kernel(_EXPORT_PTX["kernel"], _EXPORT_PTX["dir"], spec,
                                 hardware_compatibility=_EXPORT_PTX["hardware_compatibility"], driver_cap=driver_cap)
        e = k["entry"]
        record = {"source": "export", "file": e["file"], "sha256": e["sha256"], "arch": e["arch"],
                  "ptx_isa": e["ptx_isa"], "driver_isa_cap": driver_cap}
        return k["name"], k["ptx"], k["launch"], record
    compiled = cached_walk_kernel(spec)
    record = {"source": "compiled", "file": spec.file_name, "sha256": hashlib.sha256(compiled.ptx.encode()).hexdigest(),
              "arch": spec.sm, "ptx_isa": compiled.ptx_isa, "driver_isa_cap": compiled.driver_isa_cap}
    return compiled.name, compiled.ptx, compiled.launch, record


def _constant(expr, what: str) -> int:
    if expr.is_fake or not expr.is_constant:
        raise DSparkTrtError(f"DSparkTopKMarkov needs a static {what} (one engine profile per batch bucket keeps "
                             "N, k and r fixed); export with static shapes for that dimension")
    return int(expr.constant_value())


@functools.cache
def register_plugin() -> str:
    """Register the plugin with TensorRT in this process (idempotent); returns its id ``dspark::DSparkTopKMarkov``."""
    try:
        import tensorrt as trt
    except Exception as e:  # the PyPI stub fails in many ways
        raise DSparkTrtError(f"the DSparkTopKMarkov TensorRT plugin needs full TensorRT (import tensorrt failed: "
                             f"{e}); build engines on a machine with TensorRT >= 10.9") from None
    try:
        import tensorrt.plugin as trtp
    except Exception:
        trtp = None
    check_tensorrt_version(str(trt.__version__), trtp is not None and hasattr(trtp, "KernelLaunchParams")
                           and hasattr(trtp, "aot_impl"))
    dtypes = {"float32": trt.float32, "float16": trt.float16, "bfloat16": trt.bfloat16, "int32": trt.int32}
    names = {v: k for k, v in dtypes.items()}

    @trtp.register(PLUGIN_ID)
    def _describe(cand_values: trtp.TensorDesc, cand_ids: trtp.TensorDesc, anchor: trtp.TensorDesc,
                  markov_w1: trtp.TensorDesc, markov_w2: trtp.TensorDesc, d2t: trtp.TensorDesc,
                  temperature: trtp.TensorDesc, seed: trtp.TensorDesc, position: trtp.TensorDesc,
                  conf_base: trtp.TensorDesc, conf_w: trtp.TensorDesc, k: int, logit_scale: float
                  ) -> tuple[trtp.TensorDesc, trtp.TensorDesc, trtp.TensorDesc]:
        ins = (cand_values,)
        return tuple(trtp.from_shape_expr(tuple(ins[i].shape_expr[d] for i, d in dims), dtype=dtypes[dt])
                     for dims, dt in output_layout())

    @trtp.autotune(PLUGIN_ID)
    def _autotune(cand_values, cand_ids, anchor, markov_w1, markov_w2, d2t, temperature, seed, position,
                  conf_base, conf_w, outputs) -> list[trtp.AutoTuneCombination]:
        # one combination per (T, W); ids/anchor/d2t/seed/position int32, temperature/confidence fp32
        return [trtp.AutoTuneCombination(s) for s in autotune_type_strings()]

    @trtp.aot_impl(PLUGIN_ID)
    def _aot(cand_values: trtp.TensorDesc, cand_ids: trtp.TensorDesc, anchor: trtp.TensorDesc,
             markov_w1: trtp.TensorDesc, markov_w2: trtp.TensorDesc, d2t: trtp.TensorDesc,
             temperature: trtp.TensorDesc, seed: trtp.TensorDesc, position: trtp.TensorDesc,
             conf_base: trtp.TensorDesc, conf_w: trtp.TensorDesc, k: int, logit_scale: float,
             outputs: tuple[trtp.TensorDesc], tactic: int
             ) -> tuple[bytes, bytes, trtp.KernelLaunchParams, trtp.SymIntExprs]:
        n = _constant(cand_values.shape_expr[1], "num_draft_tokens (cand_values dim 1)")
        k_shape = _constant(cand_values.shape_expr[2], "top-k (cand_values dim 2)")
        if k_shape != k:
            raise DSparkTrtError(f"DSparkTopKMarkov attribute k={k} but cand_values has k={k_shape}; re-export")
        rank = _constant(markov_w1.shape_expr[1], "Markov rank (markov_w1 dim 1)")
        spec = WalkKernelSpec(n, k, rank, float(logit_scale), names[cand_values.dtype], names[markov_w1.dtype],
                              build_arch(_EXPORT_PTX.get("hardware_compatibility", "none")), DEFAULT_PTX_ISA)
        name, ptx, launch, record = _kernel_for(spec)
        _EMBEDDED.append(record)  # called once per tactic/format TensorRT tries
        params = trtp.KernelLaunchParams()
        params.grid_x = cand_values.shape_expr[0]  # one program per request
        params.block_x = launch["block"][0]
        params.shared_mem = launch["shared_mem"]
        descs = dict(zip((c.name for c in INPUTS), (cand_values, cand_ids, anchor, markov_w1, markov_w2, d2t,
                                                    temperature, seed, position, conf_base, conf_w)))
        extra = trtp.SymIntExprs.from_tuple([trtp.SymInt32(descs[src].shape_expr[dim]) for _, src, dim in EXTRA_ARGS])
        return name.encode(), ptx.encode(), params, extra

    return PLUGIN_ID
