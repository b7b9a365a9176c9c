"""Write safetensors checkpoints tensor by tensor: host memory ≈ one chunk, whatever the checkpoint's size.

``safetensors.torch.save_file`` needs every tensor of a file in memory at once. Its format is simple enough
to stream instead: an 8-byte little-endian header length, a JSON header (dtype, shape, byte offsets), then
the tensors' bytes back to back. The header depends on shapes and dtypes only, so it is written first and
each tensor follows as a sequence of chunks produced on demand (``TensorPlan.chunks``).

    plans = [TensorPlan("w", (4096, 4096), torch.bfloat16, random_chunks(...)), ...]
    write_sharded(out_dir, plans, shard_bytes=2 * 10**9)   # model-0000i-of-0000n.safetensors + the index

Shards follow transformers' ``save_pretrained``: tensors in order, a new shard when the next tensor would
exceed the limit (a tensor larger than the limit gets a shard of its own), ``model.safetensors.index.json``
maps every tensor to its file; one shard is written as ``model.safetensors`` without an index.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import torch

from ..checkpoint import INDEX_FILE, SINGLE_FILE
from ..errors import DSparkTrtError, DSparkTrtInternalError

__all__ = ["TensorPlan", "DTYPES", "parse_size", "format_size", "plan_shards", "write_safetensors", "write_sharded",
           "random_chunks", "constant_chunks", "file_order", "file_bytes", "shard_names", "sharded_bytes"]

#: dspark dtype name → (torch dtype, safetensors dtype string)
DTYPES = {"bf16": (torch.bfloat16, "BF16"), "fp16": (torch.float16, "F16"), "fp32": (torch.float32, "F32")}
_ST_DTYPE = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32", torch.int64: "I64",
             torch.int32: "I32", torch.bool: "BOOL"}
#: safetensors' Dtype enum order: a file lists its tensors by dtype (this order, descending), then by name
_ST_ORDER = {"BOOL": 0, "F16": 7, "BF16": 8, "I32": 9, "F32": 11, "I64": 13}
HEADER_ALIGN = 8  # safetensors pads its JSON header with spaces to a multiple of 8 bytes
CHUNK_ELEMENTS = 1 << 24  # elements per generated chunk (fixed: the random bytes depend on it)
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


@dataclass(frozen=True)
class TensorPlan:
    """One tensor to write: its name, shape, dtype and a producer of its flat chunks (in order, any sizes
    summing to the element count, each a 1-D tensor of ``dtype``)."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    chunks: Callable[[], Iterable[torch.Tensor]]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=self.dtype).element_size()


def parse_size(text: str | int) -> int:
    """``"2GB"`` → 2·10⁹ bytes, ``"500MiB"`` → 500·2²⁰, ``123`` → 123 (transformers' decimal units)."""
    if isinstance(text, int):
        value, unit = text, ""
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B?)\s*", str(text).upper())
        if m is None or m.group(2) not in _UNITS:
            raise DSparkTrtError(f"shard size {text!r} is not a size: use bytes or a number with KB, MB, GB, MiB or GiB "
                                 f"(e.g. 2GB)")
        value, unit = float(m.group(1)), m.group(2)
    size = int(value * _UNITS[unit])
    if size < 1:
        raise DSparkTrtError(f"shard size {text!r} must be at least one byte")
    return size


def format_size(nbytes: int) -> str:
    """Bytes in decimal units, as ``df -H`` and transformers count them: ``4.74 GB``."""
    for unit, scale in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes} B"


def file_order(plans: list[TensorPlan]) -> list[TensorPlan]:
    """The order in which safetensors' ``save_file`` lays tensors out in a file (by dtype, then by name)."""
    for p in plans:
        if p.dtype not in _ST_DTYPE:
            raise DSparkTrtInternalError(f"no safetensors dtype for {p.dtype}")
    return sorted(plans, key=lambda p: (-_ST_ORDER[_ST_DTYPE[p.dtype]], p.name))


def _header(plans: list[TensorPlan], metadata: dict[str, str] | None) -> bytes:
    header: dict[str, object] = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for p in plans:
        header[p.name] = {"dtype": _ST_DTYPE[p.dtype], "shape": list(p.shape), "data_offsets": [offset, offset + p.nbytes]}
        offset += p.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    return blob + b" " * (-len(blob) % HEADER_ALIGN)


def file_bytes(plans: list[TensorPlan], metadata: dict[str, str] | None = None) -> int:
    """The size of the safetensors file ``write_safetensors`` writes for ``plans``."""
    return 8 + len(_header(file_order(plans), metadata)) + sum(p.nbytes for p in plans)


def write_safetensors(path: str | Path, plans: list[TensorPlan], *, metadata: dict[str, str] | None = None,
                      progress: Callable[[int], object] | None = None) -> int:
    """Write ``plans`` to the safetensors file ``path``, one chunk in memory at a time; return its size.

    The file is byte for byte what ``safetensors.torch.save_file`` writes for the same tensors and metadata
    (tensors in ``file_order``).

    ``progress(nbytes)`` is called after every chunk. A full disk raises ``OSError`` (``ENOSPC``); the caller
    owns the (temporary) path and removes it.
    """
    plans = file_order(plans)
    names = [p.name for p in plans]
    if len(set(names)) != len(names):
        raise DSparkTrtInternalError(f"duplicate tensor names in {path}")
    header = _header(plans, metadata)
    with open(path, "wb") as f:
        f.write(len(header).to_bytes(8, "little"))
        f.write(header)
        for p in plans:
            written = 0
            for chunk in p.chunks():
                if chunk.dtype != p.dtype or chunk.dim() != 1:
                    raise DSparkTrtInternalError(f"{p.name}: chunk {chunk.dtype} {list(chunk.shape)}, expected 1-D "
                                                 f"{p.dtype}")
                data = chunk.contiguous().view(torch.uint8).numpy()  # [nbytes] uint8, no copy
                f.write(data)
                written += data.nbytes
                if progress is not None:
                    progress(data.nbytes)
            if written != p.nbytes:
                raise DSparkTrtInternalError(f"{p.name}: wrote {written} bytes, expected {p.nbytes}")
    return 8 + len(header) + sum(p.nbytes for p in plans)


def plan_shards(plans: list[TensorPlan], shard_bytes: int | None) -> list[list[TensorPlan]]:
    """Split ``plans`` in order into shards of at most ``shard_bytes`` tensor bytes (None: one file); a tensor
    larger than the limit gets a shard of its own (as transformers' ``save_pretrained`` shards)."""
    if shard_bytes is None:
        return [list(plans)]
    shards: list[list[TensorPlan]] = [[]]
    size = 0
    for p in plans:
        if shards[-1] and size + p.nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(p)
        size += p.nbytes
    return shards


def shard_names(count: int) -> list[str]:
    """``model.safetensors`` for one shard, else transformers' ``model-0000i-of-0000n.safetensors``."""
    if count == 1:
        return [SINGLE_FILE]
    return [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]


def sharded_bytes(plans: list[TensorPlan], shard_bytes: int | None, *, metadata: dict[str, str] | None = None) -> int:
    """Bytes ``write_sharded`` puts on disk for these plans (files and index)."""
    shards = plan_shards(plans, shard_bytes)
    total = sum(file_bytes(s, metadata) for s in shards)
    if len(shards) > 1:
        total += len(_index(shards).encode())
    return total


def _index(shards: list[list[TensorPlan]]) -> str:
    files = shard_names(len(shards))
    weight_map = {p.name: file for file, shard in zip(files, shards) for p in shard}
    total = sum(p.nbytes for shard in shards for p in shard)
    params = sum(p.numel for shard in shards for p in shard)
    index = {"metadata": {"total_parameters": params, "total_size": total},
             "weight_map": dict(sorted(weight_map.items()))}
    return json.dumps(index, indent=2) + "\n"


def write_sharded(out_dir: str | Path, plans: list[TensorPlan], *, shard_bytes: int | None = None,
                  metadata: dict[str, str] | None = None, progress: Callable[[int], object] | None = None) -> list[str]:
    """Write ``plans`` into ``out_dir`` (an existing, temporary directory) as one ``model.safetensors`` or as
    shards plus ``model.safetensors.index.json``; return the file names written."""
    shards = plan_shards(plans, shard_bytes)
    files = shard_names(len(shards))
    out_dir = Path(out_dir)
    for file, shard in zip(files, shards):
        write_safetensors(out_dir / file, shard, metadata=metadata, progress=progress)
    if len(shards) > 1:
        (out_dir / INDEX_FILE).write_text(_index(shards))
        files.append(INDEX_FILE)
    return files


# -- what the chunks hold ---------------------------------------------------------------------------------
def _chunk_seed(seed: int, key: str, chunk: int) -> int:
    digest = hashlib.sha256(f"{seed}/{key}/{chunk}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def random_chunks(numel: int, dtype: torch.dtype, *, std: float, seed: int, key: str) -> Callable[[], Iterator[torch.Tensor]]:
    """Normal(0, std) values, ``CHUNK_ELEMENTS`` at a time; chunk i is drawn from its own generator seeded by
    (seed, key, i), so the bytes depend on those only (not on sharding, order or what else is written)."""

    def chunks() -> Iterator[torch.Tensor]:
        for i, start in enumerate(range(0, numel, CHUNK_ELEMENTS)):
            n = min(CHUNK_ELEMENTS, numel - start)
            gen = torch.Generator().manual_seed(_chunk_seed(seed, key, i))
            yield torch.empty(n, dtype=dtype).normal_(0.0, std, generator=gen)  # [n]

    return chunks


def constant_chunks(numel: int, dtype: torch.dtype, value: float) -> Callable[[], Iterator[torch.Tensor]]:
    """``value`` everywhere (norm weights 1, biases 0)."""

    def chunks() -> Iterator[torch.Tensor]:
        for start in range(0, numel, CHUNK_ELEMENTS):
            yield torch.full((min(CHUNK_ELEMENTS, numel - start),), value, dtype=dtype)  # [n]

    return chunks


def is_disk_full(error: BaseException) -> bool:
    return isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)
