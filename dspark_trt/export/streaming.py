"""Export without holding the weights: trace on placeholders, then stream the initializers from the checkpoint.

The placeholders and the checkpoint reads are ``dspark_trt/streaming.py`` (the loader makes placeholders too);
this module resolves the exported graphs' initializers to them and writes them.

The exported graphs depend on the weights' shapes and dtypes, never on their values, except where the export
*computes* from them (the candidate union's table; constant folding of small tensors). So a large checkpoint
tensor is stood in for, while tracing, by a **placeholder**: a CPU tensor of the right shape and dtype backed by
an anonymous read-only mapping (zero pages: no resident memory, whatever its size). ``torch.onnx.export`` and
its optimizer then run unchanged and produce the very same graph; the optimizer's constant folder touches a
large tensor only to fold a ``Transpose`` (its "always fold" op), which numpy does as a *view* of the
placeholder's memory. After the export every initializer is resolved by address:

* it lies in a placeholder's mapping → a ``StreamedTensor``: checkpoint file + tensor name + the view
  (offset, shape, strides) + the export dtype; written by ``ir.save`` chunk by chunk, read with plain file
  reads (no mapping of the checkpoint), converted to the export dtype on the way;
* anything else is a real tensor the export computed (RoPE tables, small folded constants, the union table)
  and is written as it is — unless its ``folded_from`` record names a placeholder, which would mean the
  folder computed values from zero pages: refused (``DSparkTrtError``), never written.

Tensors at or below ``LAZY_NUMEL`` elements (the folder's input limit: norms, biases, small heads) are loaded
for real, so every value-dependent decision of the optimizer sees real values.

    weights = Placeholders()
    drafter = load_drafter(model_dir, dtype="bf16", placeholders=weights)   # a few MB resident
    model = export_draft(drafter, info)                                     # onnx_ir.Model
    stream_initializers(model, weights)                                     # views → StreamedTensor
    ir.save(model, "draft.onnx", external_data="draft.onnx.data")           # one tensor chunk at a time
"""

from __future__ import annotations

import io

import onnx_ir as ir
import torch

from ..errors import DSparkTrtError
from ..streaming import Placeholders, Recipe, _Region, read_tensor

__all__ = ["StreamedTensor", "stream_initializers", "name_placeholders", "CHUNK_BYTES"]

#: bytes converted and written per chunk of a streamed tensor
CHUNK_BYTES = 64 << 20

# -- initializers that stream -------------------------------------------------------------------------------
class StreamedTensor(ir.LazyTensor):
    """An initializer whose bytes are a view of a checkpoint tensor in the export dtype, produced on demand.

    ``offset`` / ``shape`` / ``strides`` (elements) describe the view of the source tensor (a folded transpose,
    or the tensor itself); the conversion to the export dtype is elementwise, so it commutes with the view.
    ``tofile`` (what ``ir.save`` calls) converts and writes ``CHUNK_BYTES`` at a time.
    """

    def __init__(self, recipe: Recipe, offset: int, shape: tuple[int, ...], strides: tuple[int, ...], *,
                 name: str | None = None):
        self.recipe = recipe
        self.view = (int(offset), tuple(int(s) for s in shape), tuple(int(s) for s in strides))
        super().__init__(self._materialise, dtype=_ir_dtype(recipe.dtype), shape=ir.Shape(list(shape)), name=name,
                         cache=False)

    def _source_view(self) -> torch.Tensor:
        src = read_tensor(self.recipe.source, self.recipe.key).reshape(-1)  # checkpoint dtype
        offset, shape, strides = self.view
        return torch.as_strided(src, shape, strides, offset)

    def _materialise(self):
        from torch.onnx._internal.exporter._core import TorchTensor

        return TorchTensor(self._source_view().to(self.recipe.dtype).contiguous())

    def tobytes(self) -> bytes:
        buf = io.BytesIO()
        self.tofile(buf)
        return buf.getvalue()

    def tofile(self, file) -> None:
        view = self._source_view()
        if view.dim() == 0:
            _write(file, view.to(self.recipe.dtype).reshape(1))
            return
        row = max(1, view[0].numel() * torch.empty((), dtype=self.recipe.dtype).element_size())
        step = max(1, CHUNK_BYTES // row)
        for start in range(0, view.shape[0], step):
            _write(file, view[start:start + step].to(self.recipe.dtype).contiguous())


def _write(file, t: torch.Tensor) -> None:
    flat = t.reshape(-1).view(torch.uint8) if t.dtype != torch.bool else t.reshape(-1).to(torch.uint8)
    file.write(memoryview(flat.numpy()))


def _ir_dtype(dtype: torch.dtype):
    return {torch.float32: ir.DataType.FLOAT, torch.float16: ir.DataType.FLOAT16,
            torch.bfloat16: ir.DataType.BFLOAT16, torch.int64: ir.DataType.INT64, torch.int32: ir.DataType.INT32,
            torch.bool: ir.DataType.BOOL, torch.uint8: ir.DataType.UINT8, torch.int8: ir.DataType.INT8,
            torch.float64: ir.DataType.DOUBLE, torch.int16: ir.DataType.INT16}[dtype]


def _address_view(value) -> tuple[int, tuple[int, ...], tuple[int, ...], int] | None:
    """(data address, shape, strides in elements, itemsize) of a tensor the exporter holds, or None."""
    import numpy as np

    raw = getattr(value, "raw", None)
    if isinstance(raw, torch.Tensor):
        if raw.device.type != "cpu" or raw.numel() == 0:
            return None
        return raw.data_ptr(), tuple(raw.shape), tuple(raw.stride()), raw.element_size()
    if isinstance(raw, np.ndarray):
        if raw.size == 0:
            return None
        item = raw.itemsize
        if any(s % item for s in raw.strides):
            return None
        return raw.__array_interface__["data"][0], tuple(raw.shape), tuple(s // item for s in raw.strides), item
    return None


def stream_initializers(model, placeholders: Placeholders, *, what: str = "graph") -> dict:
    """Replace every initializer of ``model`` (an ``onnx_ir.Model``) that views a placeholder by a
    ``StreamedTensor``; refuse one computed from a placeholder's (zero) values. Returns counts and bytes."""
    from onnxscript.optimizer._constant_folding import FOLDED_FROM_KEY

    streamed = computed = 0
    streamed_bytes = 0
    for value in list(model.graph.initializers.values()):
        tensor = value.const_value
        if tensor is None or isinstance(tensor, StreamedTensor):
            continue
        where = _address_view(tensor)
        region = placeholders.find(where[0]) if where else None
        if region is not None:
            address, shape, strides, item = where
            if item != region.tensor.element_size() or (address - region.start) % item:
                raise DSparkTrtError(f"{what}: initializer {value.name} reinterprets the placeholder of "
                                     f"{region.recipe.key} with another element size; report this as a bug")
            offset = (address - region.start) // item
            value.const_value = StreamedTensor(region.recipe, offset, shape, strides, name=value.name)
            streamed += 1
            streamed_bytes += value.const_value.nbytes
            continue
        folded = value.metadata_props.get(FOLDED_FROM_KEY, "")
        touched = [r.recipe.key for r in placeholders.regions if _named_in(r, folded)]
        if touched:
            raise DSparkTrtError(f"{what}: initializer {value.name} was computed at export from {touched[0]}, "
                                 f"which was not loaded (a placeholder); report this as a bug, or export with "
                                 f"more memory through OnnxFromDrafter")
        computed += 1
    return {"streamed": streamed, "streamed_bytes": streamed_bytes, "in_memory": computed}


def _named_in(region: _Region, folded: str) -> bool:
    return any(f"'{n}'" in folded for n in region.names)


def name_placeholders(module: torch.nn.Module, placeholders: Placeholders, prefix: str = "") -> None:
    """Record the parameter/buffer names (as the exporter names initializers) of each placeholder."""
    for name, t in list(module.named_parameters(remove_duplicate=False)) + list(module.named_buffers(remove_duplicate=False)):
        region = placeholders.find(t.data_ptr()) if t.numel() else None
        if region is not None:
            region.names.add(prefix + name)
