"""Placeholders for large checkpoint tensors, and checkpoint tensors read with plain file reads.

A **placeholder** is a CPU tensor of the right shape and dtype backed by an anonymous read-only mapping (zero
pages: no resident memory, whatever its size), with a ``Recipe`` saying where its values come from. The loader
(``loader.py: load_drafter(..., placeholders=)``) builds drafters on them; the export traces them and then
streams the initializers from the checkpoint (``export/streaming.py``). ``read_tensor`` reads one tensor of a
checkpoint directory into owned memory (no mapping of the checkpoint).
"""

from __future__ import annotations

import json
import mmap
import struct
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .errors import DSparkTrtError

__all__ = ["LAZY_NUMEL", "DEDUP_NUMEL", "Recipe", "Placeholders", "read_tensor"]

#: tensors with more elements become placeholders (= onnxscript's constant-folding input limit, 8192)
LAZY_NUMEL = 8192
#: onnx_ir's DeduplicateInitializersPass compares initializers up to this many elements by value
DEDUP_NUMEL = 1024
_ST_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
              "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
              "BOOL": torch.bool}


@dataclass(frozen=True)
class Recipe:
    """Where a placeholder's values come from: checkpoint directory ``source`` (single file or sharded), tensor
    ``key`` there, converted to ``dtype`` (the export's); ``shape`` is the tensor's."""

    source: Path
    key: str
    shape: tuple[int, ...]
    dtype: torch.dtype


@dataclass
class _Region:
    start: int
    end: int
    recipe: Recipe
    buffer: mmap.mmap
    tensor: torch.Tensor
    names: set = field(default_factory=set)  # initializer names the exporter gives it (name_placeholders)


class Placeholders:
    """Placeholder tensors (zero-page mappings) and the recipes behind them, looked up by address."""

    def __init__(self, lazy_numel: int | None = None):
        self.lazy_numel = LAZY_NUMEL if lazy_numel is None else int(lazy_numel)
        if self.lazy_numel < DEDUP_NUMEL:  # the optimizer compares small initializers by value (deduplication)
            raise DSparkTrtError(f"placeholders must be larger than {DEDUP_NUMEL} elements (got {self.lazy_numel})")
        self.regions: list[_Region] = []

    def wants(self, shape) -> bool:
        """Whether a tensor of ``shape`` is stood in for (more than ``lazy_numel`` elements)."""
        n = 1
        for s in shape:
            n *= int(s)
        return n > self.lazy_numel

    def tensor(self, recipe: Recipe) -> torch.Tensor:
        """A CPU tensor of ``recipe``'s shape and dtype whose memory is never materialised (reads give zeros)."""
        n = 1
        for s in recipe.shape:
            n *= int(s)
        itemsize = torch.empty((), dtype=recipe.dtype).element_size()
        nbytes = max(n * itemsize, 1)
        flags = mmap.MAP_PRIVATE | getattr(mmap, "MAP_ANONYMOUS", 0x20) | getattr(mmap, "MAP_NORESERVE", 0x4000)
        buffer = mmap.mmap(-1, nbytes, flags=flags, prot=mmap.PROT_READ)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "non-writable buffer": nothing writes to a placeholder
            flat = torch.frombuffer(buffer, dtype=torch.uint8)
        t = flat[: n * itemsize].view(recipe.dtype).view(recipe.shape)
        start = t.data_ptr()
        self.regions.append(_Region(start, start + nbytes, recipe, buffer, t))
        return t

    def find(self, address: int) -> _Region | None:
        for region in self.regions:
            if region.start <= address < region.end:
                return region
        return None

    @property
    def nbytes(self) -> int:
        return sum(r.end - r.start for r in self.regions)


# -- reading checkpoint tensors with plain file reads (no mapping: resident memory = what we hold) -----------
def _safetensors_entry(file: Path, key: str) -> tuple[torch.dtype, list[int], int, int]:
    with open(file, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
    entry = header.get(key)
    if entry is None:
        raise DSparkTrtError(f"{file} has no tensor {key}; re-download the checkpoint")
    start, end = entry["data_offsets"]
    dtype = _ST_DTYPES.get(entry["dtype"])
    if dtype is None:
        raise DSparkTrtError(f"{file}: tensor {key} has dtype {entry['dtype']}, which dspark-trt does not read")
    return dtype, list(entry["shape"]), 8 + header_len + start, end - start


def read_tensor(source: Path, key: str) -> torch.Tensor:
    """Tensor ``key`` of the checkpoint directory ``source`` (single file or sharded), read into owned memory."""
    from .checkpoint import _weight_map

    file = Path(source) / _weight_map(Path(source))[key]
    dtype, shape, offset, nbytes = _safetensors_entry(file, key)
    data = bytearray(nbytes)
    with open(file, "rb") as f:
        f.seek(offset)
        got = f.readinto(data)
    if got != nbytes:
        raise DSparkTrtError(f"{file} is truncated: tensor {key} needs {nbytes} bytes at offset {offset}, the file "
                             f"holds {got}; re-download the checkpoint")
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(data, dtype=dtype).view(shape)
