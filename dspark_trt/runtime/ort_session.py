"""Run an exported graph in onnxruntime with torch tensors in and out.

``OrtGraph(model)`` wraps an ``InferenceSession``: ``run({name: tensor}) -> {name: tensor}``. onnxruntime's
CPU provider has no bf16 arithmetic kernels (``MatMul``/``Mul`` are not implemented for bfloat16), so a graph
with bf16 tensors runs on CPU as its fp32 **bf16-emulation twin** (``export/bf16_emulation.py``: every bf16
result rounded to bf16, the way PyTorch's CPU bf16 ops round). Its bf16 inputs and outputs are fed and
returned as ``torch.bfloat16`` all the same. ``emulate_fp16=True`` does the same for an fp16 graph (onnxruntime's
own fp16 casts most ops to fp32 and drops the roundings between them): to compare it with PyTorch op by op.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from ..errors import DSparkTrtError
from ..artifact.external_data import external_refs, load_graph_only

__all__ = ["OrtGraph", "model_proto"]

log = logging.getLogger("dspark.export")

_ONNX_TO_TORCH = {"tensor(float)": torch.float32, "tensor(float16)": torch.float16, "tensor(bfloat16)": torch.bfloat16,
                  "tensor(int32)": torch.int32, "tensor(int64)": torch.int64, "tensor(bool)": torch.bool}


def model_proto(model):
    """A ``ModelProto`` from an ``onnx_ir.Model``, a ``ModelProto`` or a path (external data loaded)."""
    import onnx

    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (str, Path)):
        return onnx.load(str(model))
    import onnx_ir as ir

    return ir.to_proto(model)


def _has_half(proto, half: str = "bf16") -> bool:
    """Does the graph hold ``half`` ("bf16" | "fp16") tensors (I/O, values or weights)?"""
    import onnx

    kind = onnx.TensorProto.BFLOAT16 if half == "bf16" else onnx.TensorProto.FLOAT16
    values = list(proto.graph.input) + list(proto.graph.output) + list(proto.graph.value_info)
    return (any(v.type.tensor_type.elem_type == kind for v in values)
            or any(t.data_type == kind for t in proto.graph.initializer))


def _has_external(proto) -> bool:
    return bool(external_refs(proto))


def _twin_beside(proto, original: Path) -> str:
    """Write the (weightless) twin next to ``original`` so its external data paths resolve; the session removes
    it once loaded."""
    import os
    import tempfile

    fd, name = tempfile.mkstemp(prefix=".twin-", suffix=".onnx", dir=original.parent)
    with os.fdopen(fd, "wb") as f:
        f.write(proto.SerializeToString())
    return name


class OrtGraph:
    """An onnxruntime session over one exported graph; torch tensors in, torch tensors out (on CPU).

    Args:
        model: ``onnx_ir.Model``, ``onnx.ModelProto`` or path of a ``.onnx`` file.
        providers (*optional*, defaults to CPU): onnxruntime execution providers.
        threads (*optional*): intra-op threads (onnxruntime's default when None).
        low_memory (*optional*): no memory arena, no prepacked weight copies, no constant folding (weights in
            external data stay memory-mapped, a bf16 twin casts them per run): for validating graphs at size.
        emulate_fp16 (*optional*): run an fp16 graph as its fp32 fp16-emulation twin too (every fp16 result
            rounded like PyTorch's CPU fp16 ops; onnxruntime's own fp16 drops roundings): to compare it with an
            fp16 reference op by op.
        rounding (*optional*): False runs a bf16 (fp16) graph as its unrounded twin instead (its ops in fp32, no
            rounding between them; its outputs fp32): to compare the graph's arithmetic with an fp32 reference of
            the same weights.
    """

    def __init__(self, model, *, providers: list[str] | None = None, threads: int | None = None,
                 low_memory: bool = False, emulate_fp16: bool = False, rounding: bool = True):
        import onnxruntime as ort

        self.providers = providers or ["CPUExecutionProvider"]
        options = ort.SessionOptions()
        options.log_severity_level = 3
        if threads:
            options.intra_op_num_threads = threads
        # a decoder runs two sessions (drafter, target) in turn: idle pool threads must not spin on the cores the
        # other session needs next (spinning cost the export path half its speed on 2 cores)
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.inter_op.allow_spinning", "0")
        disabled, twin = [], None
        if low_memory:
            options.enable_cpu_mem_arena = False
            options.add_session_config_entry("session.disable_prepacking", "1")
            disabled = ["ConstantFolding"]
        cpu_only = self.providers == ["CPUExecutionProvider"]
        source, proto = (str(model), None) if isinstance(model, (str, Path)) else (None, model_proto(model))
        self._half_outputs: set[str] = set()  # outputs returned in ``_half_dtype`` (the twin rounded them already)
        self._half_dtype = torch.bfloat16
        self.emulated_bf16 = self.emulated_fp16 = False
        if cpu_only:
            import onnx

            halves = ("bf16", "fp16") if emulate_fp16 else ("bf16",)
            if proto is None:  # types only: the weights stay on disk unless there is bf16 to emulate
                proto = load_graph_only(source)
                try:
                    if not any(_has_half(proto, h) for h in halves):
                        proto = None
                    elif not _has_external(proto):  # small: emulate in memory
                        proto = model_proto(source)
                except Exception as e:  # a file that cannot be read whole
                    first = (str(e).splitlines() or [type(e).__name__])[0]
                    raise DSparkTrtError(f"cannot read {source} ({first or type(e).__name__}); the file is damaged "
                                         f"or incomplete: re-export it") from None
            half = next((h for h in halves if proto is not None and _has_half(proto, h)), None)
            if half is not None:
                from .bf16_emulation import emulate_bf16

                kind = onnx.TensorProto.BFLOAT16 if half == "bf16" else onnx.TensorProto.FLOAT16
                if rounding:  # the twin rounded these outputs already: returned in the half dtype, exactly
                    self._half_outputs = {o.name for o in proto.graph.output if o.type.tensor_type.elem_type == kind}
                self._half_dtype = torch.bfloat16 if half == "bf16" else torch.float16
                proto, self.emulated_bf16 = emulate_bf16(proto, half=half, rounding=rounding), half == "bf16"
                self.emulated_fp16 = half == "fp16"
                log.debug("%s graph on onnxruntime CPU: running its fp32 %s-emulation twin", half, half)
                if source is not None and _has_external(proto):  # weights on disk: the twin beside them
                    if low_memory:  # keep the per-run bf16 → fp32 casts (else folded into an fp32 copy, faster)
                        disabled = ["ConstantFolding"]
                    try:
                        source = twin = _twin_beside(proto, Path(source))
                        proto = None
                    except OSError:  # a read-only export directory: the twin with its weights, in memory
                        proto = emulate_bf16(model_proto(source), half=half, rounding=rounding)
        try:
            self.session = ort.InferenceSession(source if proto is None else proto.SerializeToString(), options,
                                                providers=self.providers, disabled_optimizers=disabled)
        except Exception as e:  # onnxruntime raises its own exception types
            raise DSparkTrtError(f"onnxruntime cannot load the graph ({str(e).splitlines()[0]}); re-export it") from None
        finally:
            if twin is not None:
                Path(twin).unlink(missing_ok=True)
        self.inputs = {i.name: i for i in self.session.get_inputs()}
        self.output_names = [o.name for o in self.session.get_outputs()]

    def input_dtype(self, name: str) -> torch.dtype:
        """The torch dtype the session takes for input ``name`` (fp32 for a bf16 input of the emulation twin):
        feed tensors of this dtype, contiguous, and ``run`` hands their memory to onnxruntime without a copy."""
        return _ONNX_TO_TORCH[self.inputs[name].type]

    def run(self, feeds: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        missing = sorted(set(self.inputs) - set(feeds))
        if missing:
            raise DSparkTrtError(f"missing graph inputs {missing}")
        arrays = {}
        for name, tensor in feeds.items():
            want = _ONNX_TO_TORCH[self.inputs[name].type]
            arrays[name] = tensor.detach().to("cpu", want).contiguous().numpy()
        outputs = self.session.run(self.output_names, arrays)
        result = {}
        for name, array in zip(self.output_names, outputs):
            t = torch.from_numpy(array)
            if name in self._half_outputs:
                t = t.to(self._half_dtype)  # exact: the twin rounded it to bf16 (fp16) already
            result[name] = t
        return result
