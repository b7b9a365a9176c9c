"""Disk: the free-space estimate checked before an export, a disk that fills up (or a file-size limit) mid-export
as one line with nothing half-written, and ``--force`` keeping the earlier export when the new one fails."""

from __future__ import annotations

import errno
import json
import resource
import shutil
import signal
import subprocess
import sys

import pytest

from dspark_trt.errors import DSparkTrtError

pytestmark = [pytest.mark.onnx]

FAST = ["--topk", "off", "--dtype", "fp32", "--engine", "none", "--no-validate", "--skip-target"]


def dspark_export(*args, preexec_fn=None):
    return subprocess.run([sys.executable, "-m", "dspark_trt.cli.main", "export", *map(str, args)],
                          capture_output=True, text=True, timeout=900, preexec_fn=preexec_fn)


def one_error_line(proc) -> str:
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 1 and len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return errors[0]


def test_the_estimate_counts_dtype_target_and_engines(tiny_pair):
    from dspark_trt.checkpoint_integrity import check_checkpoint_files
    from dspark_trt.config import DSparkConfig
    from dspark_trt.export.disk import estimate_export_bytes

    c = DSparkConfig.from_pretrained(tiny_pair.drafter)
    target = check_checkpoint_files(tiny_pair.target)
    fp32, bf16 = estimate_export_bytes(c, "fp32"), estimate_export_bytes(c, "bf16")
    assert fp32.drafter_onnx == 2 * bf16.drafter_onnx and fp32.target_onnx == fp32.engines == 0
    with_target = estimate_export_bytes(c, "bf16", target_files=target, engines=True)
    assert with_target.target_onnx >= target.numel(floating=True) * 2
    assert with_target.engines == with_target.drafter_onnx + with_target.target_onnx
    assert estimate_export_bytes(c, "bf16", markov_topm=32).drafter_onnx == bf16.drafter_onnx + c.vocab_size * 32 * 4


def test_a_full_disk_inside_the_atomic_output_is_one_line_and_leaves_nothing(tmp_path):
    """The error the writer raises (here injected at the write: ENOSPC) becomes one line with the sizes; the
    temporary directory is gone."""
    from dspark_trt.atomic import atomic_output_dir
    from dspark_trt.export.disk import DiskEstimate, disk_full_errors

    out = tmp_path / "out"
    with pytest.raises(DSparkTrtError) as e:
        with disk_full_errors(out, DiskEstimate(3 << 30, 0, 3 << 30)):
            with atomic_output_dir(out) as tmp:
                (tmp / "draft.onnx.data").write_bytes(b"x" * 1000)
                raise OSError(errno.ENOSPC, "No space left on device", str(tmp / "draft.onnx.data"))
    message = str(e.value)
    assert message.startswith("the disk filled up writing ") and "draft.onnx.data" in message
    assert "it needs about 6.58 GB (drafter ONNX 3.22 GB, engines 3.22 GB)" in message and " are free " in message
    assert "\n" not in message and list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError):  # anything else passes through unchanged
        with disk_full_errors(out):
            raise ValueError("not a disk problem")


def _tmpfs_available() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "-r", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt && true"],
                           capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not _tmpfs_available(), reason="cannot mount a tmpfs in a user+mount namespace here")
def test_a_real_small_file_system(tiny_pair, tmp_path):
    """A 1 MiB tmpfs (private mount namespace): dspark-export refuses up front with the sizes; and a write that
    fills it (a real ENOSPC from the kernel) inside the atomic output is one line, the tmpfs left empty."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    fill = ("from pathlib import Path; from dspark_trt.atomic import atomic_output_dir; "
            "from dspark_trt.export.disk import disk_full_errors; from dspark_trt.errors import DSparkTrtError\n"
            "try:\n"
            f"    with disk_full_errors('{mnt}/out', what='a test'):\n"
            f"        with atomic_output_dir('{mnt}/out') as tmp:\n"
            "            (tmp / 'weights.data').write_bytes(bytes(2 << 20))\n"
            "except DSparkTrtError as e:\n"
            "    print('error:', e)\n")
    script = (f"mount -t tmpfs -o size=1m tmpfs {mnt} && "
              f"{sys.executable} -m dspark_trt.cli.main export {tiny_pair.drafter} {' '.join(FAST)} -o {mnt}/out; "
              f"echo rc=$?; {sys.executable} -c \"{fill}\"; echo left=$(ls -A {mnt} | wc -l)")
    proc = subprocess.run(["unshare", "-m", "-r", "sh", "-c", script], capture_output=True, text=True, timeout=300)
    refused = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(refused) == 1 and "rc=1" in proc.stdout and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "not enough free disk for the export" in refused[0] and "1.0 MB are free" in refused[0]
    filled = [line for line in proc.stdout.splitlines() if line.startswith("error:")]
    assert len(filled) == 1 and filled[0].startswith("error: the disk filled up during a test into "), proc.stdout
    assert "1.0 MB are free" in filled[0] and "nothing was written" in filled[0]
    assert "left=0" in proc.stdout  # neither output nor temporary directory remains


@pytest.fixture(scope="module")
def earlier_export(tiny_pair, tmp_path_factory):
    from dspark_trt.export.pipeline import ExportOptions, export_model

    out = tmp_path_factory.mktemp("disk") / "out"
    export_model(tiny_pair.drafter, out, ExportOptions(topk="off", dtype="fp32", engine="none", validate=False,
                                                       export_target=False))
    return out


def test_the_manifest_lists_every_file_with_streamed_digests(earlier_export, tiny_pair):
    from dspark_trt.config import DSparkConfig
    from dspark_trt.export.disk import estimate_export_bytes
    from dspark_trt.artifact.export_dir import check_manifest, read_manifest
    from dspark_trt.cache import file_sha256

    m = read_manifest(earlier_export)
    files = {p.relative_to(earlier_export).as_posix() for p in earlier_export.rglob("*") if p.is_file()}
    assert set(m["files"]) == files - {"manifest.json"} and {"onnx/draft.onnx", "onnx/context.onnx"} <= files
    for rel, record in m["files"].items():
        assert record == {"bytes": (earlier_export / rel).stat().st_size, "sha256": file_sha256(earlier_export / rel)}
    assert check_manifest(earlier_export, digests=True) == []
    written = sum((earlier_export / rel).stat().st_size for rel in files)
    assert estimate_export_bytes(DSparkConfig.from_pretrained(tiny_pair.drafter), "fp32").total >= written


def test_a_failed_force_export_keeps_the_earlier_one(earlier_export, tiny_pair):
    """``--force`` over an earlier export, killed midway by a real write error (``ulimit -f`` 1 MiB: the 1.9 MB
    draft graph cannot be written, EFBIG): one line, exit 1; the earlier export is intact, file by file, the
    user's own file beside it too, and no temporary directory is left."""
    from dspark_trt.artifact.export_dir import check_manifest

    (earlier_export / "notes.txt").write_text("mine")
    before = (earlier_export / "manifest.json").read_bytes()

    def limit_file_size():
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing the process

    proc = dspark_export(tiny_pair.drafter, *FAST, "-o", earlier_export, "--force", preexec_fn=limit_file_size)
    line = one_error_line(proc)
    assert f"a file exceeded the file-size limit (ulimit -f) during the export into {earlier_export}: it needs " \
           f"about " in line and "nothing was written" in line and line.endswith("ulimit -f unlimited)")
    assert (earlier_export / "manifest.json").read_bytes() == before
    assert check_manifest(earlier_export, digests=True) == []
    assert (earlier_export / "notes.txt").read_text() == "mine"
    assert not [p.name for p in earlier_export.iterdir() if p.name.startswith(".")]
    assert json.loads(before)["files"]
