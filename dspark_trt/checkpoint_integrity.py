"""Pre-flight checks of a checkpoint's safetensors files, before an export reads a single weight.

A multi-GB download that stopped early, or a sharded checkpoint with a shard missing, would otherwise fail
minutes into an export (or crash it: a memory-mapped read past the end of a truncated file is a SIGBUS, not
an exception). ``check_checkpoint_files(model_dir)`` reads only the headers (8 bytes of length + the JSON
header of each file) and compares:

* the index (``model.safetensors.index.json``): every shard it names exists, and holds the tensors the index
  says it holds;
* every file's size with what its header describes (8 + header length + the end of the last tensor's data):
  a shorter file is truncated.

Each problem is one ``DSparkTrtError`` naming the file and the fix (re-download). The result also counts the
tensors' elements per dtype, which the export's free-disk estimate uses (``export/disk.py``).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path

from .errors import DSparkTrtError

__all__ = ["SafetensorsHeader", "CheckpointFiles", "read_safetensors_header", "check_checkpoint_files"]

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
MAX_HEADER_BYTES = 100 << 20  # safetensors' own limit on the JSON header

#: safetensors dtype → bytes per element
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8, "I32": 4, "I16": 2,
               "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1}
FLOAT_DTYPES = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"}


@dataclass(frozen=True)
class SafetensorsHeader:
    path: Path
    tensors: dict[str, tuple[str, tuple[int, ...]]]  # name → (dtype, shape)
    expected_bytes: int  # 8 + header + data, what a complete file holds
    actual_bytes: int


@dataclass
class CheckpointFiles:
    """What a checkpoint directory's safetensors files hold, from their headers."""

    model_dir: Path
    files: list[SafetensorsHeader] = field(default_factory=list)

    @property
    def bytes(self) -> int:
        return sum(f.actual_bytes for f in self.files)

    def numel(self, floating: bool | None = None) -> int:
        """Elements of every tensor (``floating``: only floating-point ones, or only the others)."""
        total = 0
        for f in self.files:
            for dtype, shape in f.tensors.values():
                if floating is None or (dtype in FLOAT_DTYPES) == floating:
                    n = 1
                    for d in shape:
                        n *= d
                    total += n
        return total

    def tensors(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        return {name: spec for f in self.files for name, spec in f.tensors.items()}


def read_safetensors_header(path: str | Path) -> SafetensorsHeader:
    """The header of one safetensors file (no tensor data read); one-line errors for an unreadable one."""
    path = Path(path)
    fix = "re-download it"
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise DSparkTrtError(f"{path} is truncated ({size} bytes, not even a safetensors header); {fix}")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER_BYTES:
            raise DSparkTrtError(f"{path} is not a safetensors file (header length {n}); {fix}")
        raw = f.read(n)
    if len(raw) < n:
        raise DSparkTrtError(f"{path} is truncated: {size} bytes, its header alone needs {8 + n}; {fix}")
    try:
        header = json.loads(raw)
        tensors, end = {}, 0
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            begin, stop = (int(x) for x in entry["data_offsets"])
            tensors[name] = (str(entry["dtype"]), tuple(int(d) for d in entry["shape"]))
            end = max(end, stop)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise DSparkTrtError(f"{path} has an unreadable safetensors header ({type(e).__name__}: {e}); {fix}") from None
    expected = 8 + n + end
    if size < expected:
        raise DSparkTrtError(f"{path} is truncated: {size} bytes, its header describes {expected} "
                             f"({(expected - size) / 1e6:.1f} MB missing); {fix}")
    return SafetensorsHeader(path, tensors, expected, size)


def check_checkpoint_files(model_dir: str | Path) -> CheckpointFiles:
    """Check a checkpoint directory's index and safetensors files (see the module docstring). A directory with
    no safetensors files at all is left to the loader (which names what it found instead)."""
    model_dir = Path(model_dir)
    result = CheckpointFiles(model_dir)
    if not model_dir.is_dir():
        return result
    index = model_dir / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            by_file: dict[str, list[str]] = {}
            for name, file in weight_map.items():
                by_file.setdefault(str(file), []).append(str(name))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise DSparkTrtError(f"{index} has no readable weight_map ({e}); re-download the checkpoint") from None
        missing = sorted(f for f in by_file if not (model_dir / f).is_file())
        if missing:
            raise DSparkTrtError(f"{model_dir}: {len(missing)} shard{'s' * (len(missing) != 1)} named in {INDEX_FILE} "
                                 f"{'are' if len(missing) != 1 else 'is'} missing ({', '.join(missing[:3])}"
                                 f"{', ...' if len(missing) > 3 else ''}); download every file the index names")
        for file in sorted(by_file):
            header = read_safetensors_header(model_dir / file)
            absent = sorted(set(by_file[file]) - set(header.tensors))
            if absent:
                raise DSparkTrtError(f"{model_dir}: {INDEX_FILE} places {absent[0]}"
                                     f"{f' (and {len(absent) - 1} more)' if len(absent) > 1 else ''} in {file}, which "
                                     f"does not hold it; the index and the shards come from different downloads: "
                                     f"re-download the checkpoint")
            result.files.append(header)
        return result
    files = [model_dir / SINGLE_FILE] if (model_dir / SINGLE_FILE).is_file() else \
        sorted(model_dir.glob("*.safetensors"))
    for file in files:
        result.files.append(read_safetensors_header(file))
    return result
