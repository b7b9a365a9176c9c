"""``dspark::DSparkTopKMarkov``, ``...Union``, ``...Gated`` and ``...RNN`` (all v1) as TensorRT quickly-deployable
plugins (``tensorrt.plugin``), AOT only.

The engine embeds the kernel's PTX (the export's ``plugin/*.ptx``), so it runs in any TensorRT runtime —
trtexec, Triton's ``tensorrt_plan`` backend — with no Python and no plugin library. Thin on purpose: the
shapes, dtypes, type combinations, launch parameters and extra arguments come from pure functions here and
in ``aot.py`` that the CPU tests cover; only the decorated functions touch ``tensorrt``.

    from dspark_trt.plugins.tensorrt_plugin import register_plugin
    register_plugin()            # before parsing an ONNX file with a DSparkTopKMarkov(Union|Gated|RNN) node (aot=1)

``register_plugin`` registers every op (``register_plugins`` returns their ids). The node's attributes: ``k``
(int) and ``logit_scale`` (float), and for the union ``markov_topm`` (int, M). AOT plugins do not serialize
attributes; all are compiled into the PTX as constants, with N and r read from the (static) input shapes.
The union op (``union_kernel.py``): 13 inputs (``contract.UNION_INPUTS``: the 11 of the plain op, then
``union_table`` [V, M] int32 and ``base_logits`` [B, N, V_d] T), 4 outputs (``draft_tokens`` [B, N],
``cand_logits`` [B, N, k + M] fp32, ``confidence`` [B, N], ``union_ids`` [B, N, M] int32), the same launch
(grid B, block warps·32) and int32 extras (rows of W1 and W2).

Which PTX the engine embeds: ``use_export_ptx(kernel, kernel_dir)`` (what ``dspark-export`` and
``dspark build-engine`` do) makes the AOT hook hand TensorRT the export's own ``plugin/*.ptx`` — the files the
export built, assembled with ptxas and checksummed — after checking its ISA against this host's driver
(``aot.select_export_kernel``). ``kernel`` is one kernel description (``aot.write_ptx_artifacts``) or a list
of them, one per op (``description["op"]``); a node whose op has no description is refused. Without it (a network built by hand, the tests) the hook compiles the
kernel here, once per spec (``aot.cached_walk_kernel``), with the ISA capped by the driver too. Either way
the PTX arch follows ``aot.plugin_arch``: sm_80 for hardware-compatible engines, else the building GPU's.
``embedded_kernels()`` lists what went into the engines built in this process (for the manifest).

The gated and RNN heads' ops (``head_kernels.py``): ``dspark::DSparkTopKMarkovGated`` v1 (13 inputs,
``contract.GATED_INPUTS``: the plain 11, ``gate_hidden`` [B, N, r] fp32, ``gate_w`` [r, r] W) and
``dspark::DSparkTopKMarkovRNN`` v1 (14, ``RNN_INPUTS``: ``joint_hidden`` [B, N, 3r] fp32, ``joint_w`` [3r, 2r] W,
``rnn_state0`` [B, r] fp32), the plain op's attributes, outputs, launch and int32 extras. Their AOT hook also
checks the head inputs' static dims against N and the rank (``check_head_shapes``): a mismatch is a stale export.

TensorRT < 10.9 has no AOT plugins (``KernelLaunchParams``): ``register_plugin`` refuses it in one line
before registering anything.
"""

# no `from __future__ import annotations`: tensorrt.plugin inspects the annotations as classes
import functools
import itertools

from ..errors import DSparkTrtError
from .aot import DEFAULT_PTX_ISA, EXTRA_ARGS, WalkKernelSpec
from .contract import (GATED_PLUGIN_ID, HEAD_OPS, INPUTS, OP_NAME, OUTPUTS, PLUGIN_ID, RNN_PLUGIN_ID, UNION_INPUTS,
                       UNION_OP_NAME, UNION_OUTPUTS, UNION_PLUGIN_ID)

__all__ = ["TRT_TYPE_NAMES", "DTYPE_COMBINATIONS", "MIN_TENSORRT", "autotune_type_strings", "output_layout",
           "union_output_layout", "output_shapes", "register_plugin", "register_plugins", "register_union_plugin",
           "build_arch", "check_tensorrt_version", "use_export_ptx", "embedded_kernels", "union_kernel_spec",
           "node_kernel_spec", "register_head_plugins", "head_input_dims", "check_head_shapes"]

MIN_TENSORRT = (10, 9)  # tensorrt.plugin.aot_impl / KernelLaunchParams
#: (kernel description, its directory, hardware compatibility) set by use_export_ptx
_EXPORT_PTX: dict = {}
_EMBEDDED: list[dict] = []

#: contract dtype name → TensorRT AutoTuneCombination type name
TRT_TYPE_NAMES = {"float32": "FP32", "float16": "FP16", "bfloat16": "BF16", "int32": "INT32"}
#: (logits "T", weights "W") pairs the kernel is built for: every float combination
DTYPE_COMBINATIONS = tuple(itertools.product(("float32", "float16", "bfloat16"), repeat=2))


def autotune_type_strings(union: bool = False, markov_head_type: str = "vanilla") -> list[str]:
    """One ``AutoTuneCombination`` type string per (T, W): the inputs then the outputs, in contract order (11 + 3;
    the union op's 13 + 4; the gated op's 13 + 3, the RNN op's 14 + 3)."""
    def name(dtype: str, t: str, w: str) -> str:
        return TRT_TYPE_NAMES[{"T": t, "W": w}.get(dtype, dtype)]

    io = (*UNION_INPUTS, *UNION_OUTPUTS) if union else (*HEAD_OPS[markov_head_type][1], *OUTPUTS)
    return [", ".join(name(c.dtype, t, w) for c in io) for t, w in DTYPE_COMBINATIONS]


def output_layout() -> list[tuple[tuple[tuple[int, int], ...], str]]:
    """For each output: its dims as (input index, dim index) pairs, and its fixed dtype name."""
    dims = {"[B, N]": ((0, 0), (0, 1)), "[B, N, k]": ((0, 0), (0, 1), (0, 2))}
    return [(dims[c.shape], c.dtype) for c in OUTPUTS]


#: where the union op's symbolic dims come from: B, N, k from cand_values (input 0), M from union_table (11)
_UNION_DIMS = {"B": (0, 0), "N": (0, 1), "k": (0, 2), "M": (11, 1)}


def union_output_layout() -> list[tuple[tuple[tuple[tuple[int, int], ...], ...], str]]:
    """For each union output: its dims, each a sum of (input index, dim index) terms (``k + M`` has two), and
    its fixed dtype name — parsed from ``contract.UNION_OUTPUTS``' shapes."""
    def dim(text: str) -> tuple[tuple[int, int], ...]:
        return tuple(_UNION_DIMS[term.strip()] for term in text.split("+"))

    return [(tuple(dim(d) for d in c.shape.strip("[]").split(",")), c.dtype) for c in UNION_OUTPUTS]


def output_shapes(layout, input_shapes) -> list[tuple]:
    """The outputs' shapes from the inputs' (``input_shapes[i][d]``: ints, or TensorRT shape expressions, which
    add): what the describe function returns, evaluated by the same code on either."""
    out = []
    for dims, _ in layout:
        shape = []
        for terms in dims:
            if isinstance(terms[0], int):  # output_layout(): one (input, dim) pair per dim
                terms = (terms,)
            expr = input_shapes[terms[0][0]][terms[0][1]]
            for i, d in terms[1:]:
                expr = expr + input_shapes[i][d]
            shape.append(expr)
        out.append(tuple(shape))
    return out


def head_input_dims(markov_head_type: str) -> dict[str, tuple[tuple[int, str], ...]]:
    """The head inputs' static dims a node must have, per input: (dim index, ``"N"`` | ``"r"`` | ``"2r"`` |
    ``"3r"``), from ``contract.GATED_INPUTS`` / ``RNN_INPUTS``' shapes (B, the batch, is dynamic: not listed)."""
    extra = HEAD_OPS[markov_head_type][1][len(INPUTS):]
    return {c.name: tuple((i, d.strip()) for i, d in enumerate(c.shape.strip("[]").split(",")) if d.strip() != "B")
            for c in extra}


def check_head_shapes(markov_head_type: str, shapes: dict, *, n: int, rank: int) -> None:
    """One-line refusal of a gated / RNN node whose head inputs' static dims (``shapes[name][dim]``, ints) do
    not fit N and the rank of its other inputs (a stale or hand-edited export)."""
    op = HEAD_OPS[markov_head_type][0]
    size = {"N": n, "r": rank, "2r": 2 * rank, "3r": 3 * rank}
    for name, dims in head_input_dims(markov_head_type).items():
        for dim, sym in dims:
            if int(shapes[name][dim]) != size[sym]:
                raise DSparkTrtError(f"{op} input {name} has {int(shapes[name][dim])} at dim {dim}, the contract "
                                     f"needs {sym} = {size[sym]} (N = {n}, r = {rank} from cand_values and "
                                     "markov_w1); re-export")


def node_kernel_spec(cand_values_shape, union_table_shape=None, *, k: int, markov_topm: int = 0, rank: int,
                     logit_scale: float, logits_dtype: str, weights_dtype: str, arch: int,
                     markov_head_type: str = "vanilla") -> WalkKernelSpec:
    """The kernel spec of a node, any op (M = ``markov_topm``, 0 = no table; ``markov_head_type`` gated | rnn for
    the head ops): static N and k from ``cand_values``' shape and M from ``union_table``'s (ints), checked
    against the attributes — a mismatch means a stale export."""
    op = UNION_OP_NAME if markov_topm else HEAD_OPS[markov_head_type][0]
    n, k_shape = int(cand_values_shape[1]), int(cand_values_shape[2])
    if k_shape != k:
        raise DSparkTrtError(f"{op} attribute k={k} but cand_values has k={k_shape}; re-export")
    if markov_topm and int(union_table_shape[1]) != markov_topm:
        raise DSparkTrtError(f"{op} attribute markov_topm={markov_topm} but union_table has M="
                             f"{int(union_table_shape[1])}; re-export")
    return WalkKernelSpec(n, k, rank, float(logit_scale), logits_dtype, weights_dtype, arch, DEFAULT_PTX_ISA,
                          markov_topm, markov_head_type)


def union_kernel_spec(cand_values_shape, union_table_shape, *, markov_topm: int, **kwargs) -> WalkKernelSpec:
    """``node_kernel_spec`` of a union node (M = ``markov_topm`` >= 1)."""
    return node_kernel_spec(cand_values_shape, union_table_shape, markov_topm=markov_topm, **kwargs)


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


def use_export_ptx(kernel: dict | list[dict] | None, kernel_dir=None, *, hardware_compatibility: str = "none") -> None:
    """Embed the export's own PTX (manifest ``kernel`` section: one description or a list, one per op; files
    under ``kernel_dir``) in engines built from now on in this process; ``None`` goes back to compiling here."""
    _EXPORT_PTX.clear()
    if kernel is not None:
        from .contract import OP_NAME

        kernels = [kernel] if isinstance(kernel, dict) else list(kernel)
        _EXPORT_PTX.update(kernels={k.get("op", OP_NAME): k for k in kernels}, dir=kernel_dir,
                           hardware_compatibility=hardware_compatibility)
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
    if "kernels" in _EXPORT_PTX:
        if spec.op_name not in _EXPORT_PTX["kernels"]:
            raise DSparkTrtError(f"the export has no PTX for {spec.op_name} (it has "
                                 f"{', '.join(_EXPORT_PTX['kernels']) or 'none'}); re-run dspark-export")
        k = select_export_kernel(_EXPORT_PTX["kernels"][spec.op_name], _EXPORT_PTX["dir"], spec,
                                 hardware_compatibility=_EXPORT_PTX["hardware_compatibility"], driver_cap=driver_cap)
        e = k["entry"]
        record = {"source": "export", "op": spec.op_name, "file": e["file"], "sha256": e["sha256"], "arch": e["arch"],
                  "ptx_isa": e["ptx_isa"], "driver_isa_cap": driver_cap}
        return k["name"], k["ptx"], k["launch"], record
    compiled = cached_walk_kernel(spec)
    record = {"source": "compiled", "op": spec.op_name, "file": spec.file_name, "sha256": hashlib.sha256(compiled.ptx.encode()).hexdigest(),
              "arch": spec.sm, "ptx_isa": compiled.ptx_isa, "driver_isa_cap": compiled.driver_isa_cap}
    return compiled.name, compiled.ptx, compiled.launch, record


def _constant(expr, what: str, op: str = "DSparkTopKMarkov") -> int:
    if expr.is_fake or not expr.is_constant:
        raise DSparkTrtError(f"{op} needs a static {what} (one engine profile per batch bucket keeps "
                             "N, k and r fixed); export with static shapes for that dimension")
    return int(expr.constant_value())


def _tensorrt_plugin_api():
    """(tensorrt, tensorrt.plugin) after the version check; one-line errors without full TensorRT >= 10.9."""
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
    return trt, trtp


def register_plugins() -> tuple[str, ...]:
    """Register every plugin (idempotent); returns their ids (``PLUGIN_ID``, ``UNION_PLUGIN_ID``,
    ``GATED_PLUGIN_ID``, ``RNN_PLUGIN_ID``)."""
    return (register_plugin(), register_union_plugin(), *register_head_plugins())


@functools.cache
def register_plugin() -> str:
    """Register every plugin with TensorRT in this process (idempotent; ``register_plugins``); returns the plain
    op's id ``dspark::DSparkTopKMarkov`` (``register_union_plugin`` returns the union's, ``register_head_plugins``
    the gated and RNN ones)."""
    _register_plain_plugin()
    register_union_plugin()
    register_head_plugins()
    return PLUGIN_ID


def _trt_dtypes(trt) -> dict:
    """Contract dtype names → TensorRT data types (the describe functions' output dtypes)."""
    return {"float32": trt.float32, "float16": trt.float16, "bfloat16": trt.bfloat16, "int32": trt.int32}


def _describe_outputs(trtp, trt, layout, shapes) -> tuple:
    """Both ops' describe function: the outputs' ``TensorDesc``s from the inputs' shape expressions."""
    dtypes = _trt_dtypes(trt)
    return tuple(trtp.from_shape_expr(shape, dtype=dtypes[dt]) for shape, (_, dt) in zip(output_shapes(layout, shapes),
                                                                                          layout))


def _aot_kernel(trtp, trt, descs: tuple, *, k: int, logit_scale: float, markov_topm: int = 0,
                markov_head_type: str = "vanilla") -> tuple:
    """Every op's AOT hook, one body (M = ``markov_topm``, 0 = no union; ``markov_head_type`` gated | rnn for the
    head ops): the node's kernel spec from its static shapes and attributes, the PTX (the export's, else compiled
    here), the launch (grid B, block warps·32, the dynamic shared memory it was compiled with) and the int32
    extras as ``SymInt32`` of the inputs' shapes."""
    op, contract = (UNION_OP_NAME, UNION_INPUTS) if markov_topm else HEAD_OPS[markov_head_type]
    named = dict(zip((c.name for c in contract), descs, strict=True))
    cand_values, markov_w1 = named["cand_values"], named["markov_w1"]
    what = {1: "num_draft_tokens (cand_values dim 1)", 2: "top-k (cand_values dim 2)"}
    cv = [None] + [_constant(cand_values.shape_expr[d], what[d], op) for d in (1, 2)]
    table = (None, _constant(named["union_table"].shape_expr[1], "union width (union_table dim 1)", op)) \
        if markov_topm else None
    rank = _constant(markov_w1.shape_expr[1], "Markov rank (markov_w1 dim 1)", op)
    if markov_head_type != "vanilla":
        shapes = {name: {d: _constant(named[name].shape_expr[d], f"{name} dim {d}", op) for d, _ in dims}
                  for name, dims in head_input_dims(markov_head_type).items()}
        check_head_shapes(markov_head_type, shapes, n=cv[1], rank=rank)
    names = {v: name for name, v in _trt_dtypes(trt).items()}
    spec = node_kernel_spec(cv, table, k=k, markov_topm=markov_topm, rank=rank, logit_scale=logit_scale,
                            logits_dtype=names[cand_values.dtype], weights_dtype=names[markov_w1.dtype],
                            arch=build_arch(_EXPORT_PTX.get("hardware_compatibility", "none")),
                            markov_head_type=markov_head_type)
    name, ptx, launch, record = _kernel_for(spec)
    _EMBEDDED.append(record)  # called once per tactic/format TensorRT tries
    params = trtp.KernelLaunchParams()
    params.grid_x = cand_values.shape_expr[0]  # one program per request
    params.block_x = launch["block"][0]
    params.shared_mem = launch["shared_mem"]
    extra = trtp.SymIntExprs.from_tuple([trtp.SymInt32(named[src].shape_expr[dim]) for _, src, dim in EXTRA_ARGS])
    return name.encode(), ptx.encode(), params, extra


@functools.cache
def _register_plain_plugin() -> str:
    trt, trtp = _tensorrt_plugin_api()

    @trtp.register(PLUGIN_ID)
    def _describe(cand_values: trtp.TensorDesc, cand_ids: trtp.TensorDesc, anchor: trtp.TensorDesc,
                  markov_w1: trtp.TensorDesc, markov_w2: trtp.TensorDesc, d2t: trtp.TensorDesc,
                  temperature: trtp.TensorDesc, seed: trtp.TensorDesc, position: trtp.TensorDesc,
                  conf_base: trtp.TensorDesc, conf_w: trtp.TensorDesc, k: int, logit_scale: float
                  ) -> tuple[trtp.TensorDesc, trtp.TensorDesc, trtp.TensorDesc]:
        return _describe_outputs(trtp, trt, output_layout(), {0: cand_values.shape_expr})

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
        return _aot_kernel(trtp, trt, (cand_values, cand_ids, anchor, markov_w1, markov_w2, d2t, temperature, seed,
                                       position, conf_base, conf_w), k=k, logit_scale=logit_scale)

    return PLUGIN_ID


@functools.cache
def register_union_plugin() -> str:
    """Register ``dspark::DSparkTopKMarkovUnion`` with TensorRT in this process (idempotent); returns its id."""
    trt, trtp = _tensorrt_plugin_api()

    @trtp.register(UNION_PLUGIN_ID)
    def _describe(cand_values: trtp.TensorDesc, cand_ids: trtp.TensorDesc, anchor: trtp.TensorDesc,
                  markov_w1: trtp.TensorDesc, markov_w2: trtp.TensorDesc, d2t: trtp.TensorDesc,
                  temperature: trtp.TensorDesc, seed: trtp.TensorDesc, position: trtp.TensorDesc,
                  conf_base: trtp.TensorDesc, conf_w: trtp.TensorDesc, union_table: trtp.TensorDesc,
                  base_logits: trtp.TensorDesc, k: int, logit_scale: float, markov_topm: int
                  ) -> tuple[trtp.TensorDesc, trtp.TensorDesc, trtp.TensorDesc, trtp.TensorDesc]:
        # the only inputs the layout reads: cand_values (B, N, k) and union_table (M)
        return _describe_outputs(trtp, trt, union_output_layout(), {0: cand_values.shape_expr,
                                                                    11: union_table.shape_expr})

    @trtp.autotune(UNION_PLUGIN_ID)
    def _autotune(cand_values, cand_ids, anchor, markov_w1, markov_w2, d2t, temperature, seed, position,
                  conf_base, conf_w, union_table, base_logits, outputs) -> list[trtp.AutoTuneCombination]:
        return [trtp.AutoTuneCombination(s) for s in autotune_type_strings(union=True)]

    @trtp.aot_impl(UNION_PLUGIN_ID)
    def _aot(cand_values: trtp.TensorDesc, cand_ids: trtp.TensorDesc, anchor: trtp.TensorDesc,
             markov_w1: trtp.TensorDesc, markov_w2: trtp.TensorDesc, d2t: trtp.TensorDesc,
             temperature: trtp.TensorDesc, seed: trtp.TensorDesc, position: trtp.TensorDesc,
             conf_base: trtp.TensorDesc, conf_w: trtp.TensorDesc, union_table: trtp.TensorDesc,
             base_logits: trtp.TensorDesc, k: int, logit_scale: float, markov_topm: int,
             outputs: tuple[trtp.TensorDesc], tactic: int
             ) -> tuple[bytes, bytes, trtp.KernelLaunchParams, trtp.SymIntExprs]:
        return _aot_kernel(trtp, trt, (cand_values, cand_ids, anchor, markov_w1, markov_w2, d2t, temperature, seed,
                                       position, conf_base, conf_w, union_table, base_logits), k=k,
                           logit_scale=logit_scale, markov_topm=markov_topm)

    return UNION_PLUGIN_ID


def register_head_plugins() -> tuple[str, str]:
    """Register ``dspark::DSparkTopKMarkovGated`` and ``dspark::DSparkTopKMarkovRNN`` (idempotent); their ids."""
    return _register_gated_plugin(), _register_rnn_plugin()


@functools.cache
def _register_gated_plugin() -> str:
    trt, trtp = _tensorrt_plugin_api()

    @trtp.register(GATED_PLUGIN_ID)
    def _describe(cand_values: trtp.TensorDesc, cand_ids: trtp.TensorDesc, anchor: trtp.TensorDesc,
                  markov_w1: trtp.TensorDesc, markov_w2: trtp.TensorDesc, d2t: trtp.TensorDesc,
                  temperature: trtp.TensorDesc, seed: trtp.TensorDesc, position: trtp.TensorDesc,
                  conf_base: trtp.TensorDesc, conf_w: trtp.TensorDesc, gate_hidden: trtp.TensorDesc,
                  gate_w: trtp.TensorDesc, k: int, logit_scale: float
                  ) -> tuple[trtp.TensorDesc, trtp.TensorDesc, trtp.TensorDesc]:
        return _describe_outputs(trtp, trt, output_layout(), {0: cand_values.shape_expr})

    @trtp.autotune(GATED_PLUGIN_ID)
    def _autotune(cand_values, cand_ids, anchor, markov_w1, markov_w2, d2t, temperature, seed, position,
                  conf_base, conf_w, gate_hidden, gate_w, outputs) -> list[trtp.AutoTuneCombination]:
        return [trtp.AutoTuneCombination(s) for s in autotune_type_strings(markov_head_type="gated")]

    @trtp.aot_impl(GATED_PLUGIN_ID)
    def _aot(cand_values: trtp.TensorDesc, cand_ids: trtp.TensorDesc, anchor: trtp.TensorDesc,
             markov_w1: trtp.TensorDesc, markov_w2: trtp.TensorDesc, d2t: trtp.TensorDesc,
             temperature: trtp.TensorDesc, seed: trtp.TensorDesc, position: trtp.TensorDesc,
             conf_base: trtp.TensorDesc, conf_w: trtp.TensorDesc, gate_hidden: trtp.TensorDesc,
             gate_w: trtp.TensorDesc, k: int, logit_scale: float, outputs: tuple[trtp.TensorDesc], tactic: int
             ) -> tuple[bytes, bytes, trtp.KernelLaunchParams, trtp.SymIntExprs]:
        return _aot_kernel(trtp, trt, (cand_values, cand_ids, anchor, markov_w1, markov_w2, d2t, temperature, seed,
                                       position, conf_base, conf_w, gate_hidden, gate_w), k=k,
                           logit_scale=logit_scale, markov_head_type="gated")

    return GATED_PLUGIN_ID


@functools.cache
def _register_rnn_plugin() -> str:
    trt, trtp = _tensorrt_plugin_api()

    @trtp.register(RNN_PLUGIN_ID)
    def _describe(cand_values: trtp.TensorDesc, cand_ids: trtp.TensorDesc, anchor: trtp.TensorDesc,
                  markov_w1: trtp.TensorDesc, markov_w2: trtp.TensorDesc, d2t: trtp.TensorDesc,
                  temperature: trtp.TensorDesc, seed: trtp.TensorDesc, position: trtp.TensorDesc,
                  conf_base: trtp.TensorDesc, conf_w: trtp.TensorDesc, joint_hidden: trtp.TensorDesc,
                  joint_w: trtp.TensorDesc, rnn_state0: trtp.TensorDesc, k: int, logit_scale: float
                  ) -> tuple[trtp.TensorDesc, trtp.TensorDesc, trtp.TensorDesc]:
        return _describe_outputs(trtp, trt, output_layout(), {0: cand_values.shape_expr})

    @trtp.autotune(RNN_PLUGIN_ID)
    def _autotune(cand_values, cand_ids, anchor, markov_w1, markov_w2, d2t, temperature, seed, position,
                  conf_base, conf_w, joint_hidden, joint_w, rnn_state0, outputs) -> list[trtp.AutoTuneCombination]:
        return [trtp.AutoTuneCombination(s) for s in autotune_type_strings(markov_head_type="rnn")]

    @trtp.aot_impl(RNN_PLUGIN_ID)
    def _aot(cand_values: trtp.TensorDesc, cand_ids: trtp.TensorDesc, anchor: trtp.TensorDesc,
             markov_w1: trtp.TensorDesc, markov_w2: trtp.TensorDesc, d2t: trtp.TensorDesc,
             temperature: trtp.TensorDesc, seed: trtp.TensorDesc, position: trtp.TensorDesc,
             conf_base: trtp.TensorDesc, conf_w: trtp.TensorDesc, joint_hidden: trtp.TensorDesc,
             joint_w: trtp.TensorDesc, rnn_state0: trtp.TensorDesc, k: int, logit_scale: float,
             outputs: tuple[trtp.TensorDesc], tactic: int
             ) -> tuple[bytes, bytes, trtp.KernelLaunchParams, trtp.SymIntExprs]:
        return _aot_kernel(trtp, trt, (cand_values, cand_ids, anchor, markov_w1, markov_w2, d2t, temperature, seed,
                                       position, conf_base, conf_w, joint_hidden, joint_w, rnn_state0), k=k,
                           logit_scale=logit_scale, markov_head_type="rnn")

    return RNN_PLUGIN_ID
