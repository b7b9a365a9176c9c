"""Free disk for an export: the estimate checked before anything is written, and a disk that fills up anyway.

What an export writes (docs/export.md, "Disk"), with b the export dtype's bytes per element (fp32 4, fp16 and
bf16 2) and P the parameters (the drafter's, from its checkpoint contract — shared ``embed_tokens`` /
``lm_head`` included; the target's, from its safetensors headers):

* the ONNX graphs: P_drafter·b (+ the K/V projections again: the context and draft graphs both hold them; fp16
  keeps ``fc`` in fp32; the candidate union's [V, M] int32 table), and with ``--target`` P_target·b (+ V·d
  when its embeddings are tied: the graph holds ``lm_head`` as its own initializer);
* engines, when a flavor builds them: about the same bytes again (an engine embeds its weights);
* nothing else of size: the plugin graph shares ``draft.onnx.data`` (export/plugin_graph.py), the output
  directory is built in a temporary directory *on the same file system* and moved into place by renames.
  With ``--force`` the earlier export stays on disk until the new one is complete, so the new one must fit
  beside it.

``check_free_disk`` refuses, in one line, an export that cannot fit; ``disk_full_errors`` turns a write that
fails anyway (ENOSPC, a quota, a file-size limit) into one line saying how much was needed and what is free —
the temporary directory is already gone by then (``atomic_output_dir``), so nothing half-written remains.
"""

from __future__ import annotations

import errno
import os
import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from ..errors import DSparkTrtError

__all__ = ["DiskEstimate", "estimate_export_bytes", "free_bytes", "check_free_disk", "disk_full_errors",
           "DISK_FULL_ERRNOS"]

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
SLACK = 0.02  # graph protos, PTX, JSON, tokenizer: 2 % of the weights + a few MB
SLACK_BYTES = 4 << 20
DISK_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


@dataclass(frozen=True)
class DiskEstimate:
    drafter_onnx: int
    target_onnx: int
    engines: int

    @property
    def total(self) -> int:
        weights = self.drafter_onnx + self.target_onnx + self.engines
        return int(weights * (1 + SLACK)) + SLACK_BYTES

    def describe(self) -> str:
        parts = [f"drafter ONNX {_gb(self.drafter_onnx)}"] if self.drafter_onnx else []
        if self.target_onnx:
            parts.append(f"target ONNX {_gb(self.target_onnx)}")
        if self.engines:
            parts.append(f"engines {_gb(self.engines)}")
        return f"about {_gb(self.total)} ({', '.join(parts)})"


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def estimate_export_bytes(config, dtype: str, *, target_files=None, target_config: dict | None = None,
                          engines: bool = False, markov_topm: int = 0) -> DiskEstimate:
    """What the export will write (see the module docstring). ``target_files``: the target checkpoint's
    ``checkpoint_integrity.CheckpointFiles`` when the target graph is exported."""
    from ..checkpoint import expected_tensors

    b = DTYPE_BYTES[dtype]
    shapes = {name: spec.shape for name, spec in expected_tensors(config).items()}
    drafter = sum(_numel(s) for s in shapes.values()) * b
    drafter += sum(_numel(s) for n, s in shapes.items() if ".self_attn.k_" in n or ".self_attn.v_" in n) * b
    if dtype == "fp16":
        drafter += _numel(shapes["fc.weight"]) * 2  # fc stays fp32 (reference/precision.py)
    drafter += config.draft_vocab_size * int(markov_topm) * 4
    target = 0
    if target_files is not None:
        target = target_files.numel(floating=True) * b + target_files.numel(floating=False) * 8
        tc = target_config or {}
        if tc.get("tie_word_embeddings"):
            target += int(tc.get("vocab_size", 0)) * int(tc.get("hidden_size", 0)) * b
    return DiskEstimate(drafter, target, drafter + target if engines else 0)


def free_bytes(path: str | Path) -> tuple[int, Path]:
    """Free bytes (for this user) on the file system that will hold ``path`` → (bytes, the existing directory
    measured: ``path`` or its nearest existing parent)."""
    probe = Path(os.path.abspath(path))
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free, probe


def check_free_disk(out_dir: str | Path, estimate: DiskEstimate, *, what: str = "the export") -> None:
    """Refuse, before anything is written, an export that the disk cannot hold (one line, with the sizes)."""
    free, probe = free_bytes(out_dir)
    if free < estimate.total:
        raise DSparkTrtError(f"not enough free disk for {what} in {out_dir}: it writes {estimate.describe()}, "
                             f"{_gb(free)} are free on the file system of {probe}; free some space or choose -o on "
                             f"a larger disk (--engine none skips the engines' share)")


def _errno_of_a_failed_write() -> OSError:
    """The likely cause of a write that failed without an errno: the file-size limit when one is set, else a full
    disk."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    if soft != resource.RLIM_INFINITY:
        return OSError(errno.EFBIG, "File too large")
    return OSError(errno.ENOSPC, "No space left on device")


def _disk_error(exc: BaseException) -> OSError | None:
    """The OSError (ENOSPC, EDQUOT, EFBIG) behind ``exc``, following its cause/context chain."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS:
            return exc
        if "No space left on device" in str(exc):  # a library that re-raised it as its own type
            return OSError(errno.ENOSPC, "No space left on device")
        if isinstance(exc, OSError) and exc.errno is None and "problem writing" in str(exc):
            return _errno_of_a_failed_write()  # numpy's ``tofile`` drops the errno ("problem writing element N")
        exc = exc.__cause__ or exc.__context__
    return None


@contextmanager
def disk_full_errors(out_dir: str | Path, estimate: DiskEstimate | None = None, *,
                     what: str = "the export") -> Iterator[None]:
    """Turn a write that fails for lack of space inside the block into one ``DSparkTrtError`` (exit 1) saying
    what was needed and what is free; the block's own cleanup (the atomic temporary directory) has run by then."""
    try:
        yield
    except DSparkTrtError:
        raise
    except Exception as e:  # noqa: BLE001 - anything whose cause is a full disk; the rest propagates unchanged
        cause = _disk_error(e)
        if cause is None:
            raise
        free, probe = free_bytes(out_dir)
        needed = f"it needs {estimate.describe()}, " if estimate is not None else ""
        reason = {errno.ENOSPC: "the disk filled up", errno.EDQUOT: "the disk quota was reached",
                  errno.EFBIG: "a file exceeded the file-size limit (ulimit -f)"}[cause.errno]
        where = f" writing {Path(cause.filename).name}" if getattr(cause, "filename", None) else ""
        fix = ("raise the limit (ulimit -f unlimited)" if cause.errno == errno.EFBIG else
               "free some space or choose -o on a larger disk")
        raise DSparkTrtError(f"{reason}{where} during {what} into {out_dir}: {needed}{_gb(free)} are free on the file "
                             f"system of {probe}; nothing was written (the partial output was removed): "
                             f"{fix}") from None
