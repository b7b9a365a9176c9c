"""A process's memory: its peak resident size, and a Linux memory cgroup that holds a child process to a limit.

``peak_rss_bytes`` is ``ru_maxrss``: anonymous memory *and* the file pages a process has mapped and touched (a
memory-mapped ``.onnx.data`` counts once read). Those file pages are clean, so the kernel can drop them under
pressure; a peak RSS therefore overstates what a step needs. ``MemoryCgroup`` measures what it needs the way a
host of that size would: the child runs in a memory cgroup whose limit is the host's memory, and the kernel
charges it anonymous memory and page cache together, reclaims the cache at the limit, and kills the child with
SIGKILL (its out-of-memory killer) only when what cannot be reclaimed does not fit. The kernel charges a cached
file page to the cgroup that first read it, so files an earlier process left in the page cache would not count
against the limit: ``evict_page_cache`` drops them first, and the child reads them in under its own charge (shared
libraries other processes still map stay cached and uncharged).

Both cgroup hierarchies are supported: v2 (``/sys/fs/cgroup``, the memory controller enabled for the children of
this process's cgroup) and v1 (``/sys/fs/cgroup/memory``). The cgroup is made below this process's own, so it
needs write access there (root, or a delegated subtree: ``systemd-run --user --scope -p Delegate=yes …``).
"""

from __future__ import annotations

import os
import resource
import uuid
from pathlib import Path

from .errors import DSparkTrtError

__all__ = ["peak_rss_bytes", "reset_peak_rss", "memory_available", "evict_page_cache", "MemoryCgroup"]

CGROUP_ROOT = Path("/sys/fs/cgroup")


def peak_rss_bytes() -> int:
    """This process's peak resident memory, anonymous and file-backed: since it started, or since
    ``reset_peak_rss()`` (Linux's ``VmHWM``; elsewhere ``ru_maxrss``, which no reset moves)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB (macOS: bytes, not supported)


def reset_peak_rss() -> None:
    """Start ``peak_rss_bytes`` over from the current resident size (Linux: ``5`` into ``/proc/self/clear_refs``);
    elsewhere the peak stays the process's."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def memory_available(*, root: Path = CGROUP_ROOT, proc_cgroup: str | None = None,
                     meminfo: str | None = None) -> int:
    """Bytes this process can still use: what the kernel reports available (``MemAvailable``), or less where a
    memory cgroup it runs in (a container's, a Kubernetes pod's, a ``MemoryCgroup``) leaves less — its limit minus
    its working set (usage less inactive page cache, as the kubelet counts it), the tightest of it and its
    ancestors; a large number where neither says."""
    try:
        text = meminfo if meminfo is not None else Path("/proc/meminfo").read_text()
        kernel = next(int(line.split()[1]) * 1024 for line in text.splitlines() if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        kernel = 1 << 62
    try:
        cgroup = _cgroup_headroom(root, proc_cgroup if proc_cgroup is not None else Path("/proc/self/cgroup").read_text())
    except OSError:
        cgroup = None
    return kernel if cgroup is None else max(0, min(kernel, cgroup))


def _stat(path: Path) -> dict[str, int]:
    return {k: int(v) for k, v in (line.split() for line in path.read_text().splitlines() if len(line.split()) == 2)}


def _cgroup_headroom(root: Path, proc_cgroup: str) -> int | None:
    """The least (limit − working set) over this process's memory cgroup and its ancestors; None: no limit."""
    version, top, own = _memory_hierarchy(root, proc_cgroup)
    v2 = version == 2
    best = None
    for path in [own, *own.parents]:
        if not path.is_relative_to(top):
            break
        limit_file = path / ("memory.max" if v2 else "memory.limit_in_bytes")
        if not limit_file.exists():
            continue
        raw = limit_file.read_text().strip()
        if raw == "max" or int(raw) >= 1 << 60:  # v1 writes "no limit" as a page-rounded 2^63 - 1
            continue
        usage = int((path / ("memory.current" if v2 else "memory.usage_in_bytes")).read_text())
        stat = _stat(path / "memory.stat")
        working = usage - stat.get("inactive_file" if v2 else "total_inactive_file", 0)
        best = int(raw) - working if best is None else min(best, int(raw) - working)
    return best


def evict_page_cache(*paths: str | os.PathLike) -> int:
    """Drop the page cache of every regular file under ``paths`` (written back first), so the next process to read
    them is charged for them → bytes advised. Pages a running process maps stay (Linux ``POSIX_FADV_DONTNEED``;
    elsewhere nothing happens)."""
    if not hasattr(os, "posix_fadvise"):
        return 0
    files = []
    for path in map(Path, paths):
        files += [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file() and not p.is_symlink()]
    advised = 0
    for file in files:
        try:
            fd = os.open(file, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.fdatasync(fd)  # dirty pages cannot be dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            advised += os.fstat(fd).st_size
        except OSError:
            pass
        finally:
            os.close(fd)
    return advised


def _memory_hierarchy(root: Path, proc_cgroup: str) -> tuple[int, Path, Path]:
    """(cgroup version, the memory hierarchy's root directory, this process's memory cgroup directory): v2 where
    the unified hierarchy is mounted at ``root``, else v1's memory hierarchy below it."""
    if (root / "cgroup.controllers").exists():
        return 2, root, root / _own_cgroup(2, proc_cgroup).lstrip("/")
    return 1, root / "memory", root / "memory" / _own_cgroup(1, proc_cgroup).lstrip("/")


def _own_cgroup(version: int, proc_cgroup: str) -> str:
    """This process's cgroup path in hierarchy ``version`` from the text of ``/proc/self/cgroup``."""
    for line in proc_cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        if version == 2 and controllers == "" and line.startswith("0::"):
            return path
        if version == 1 and "memory" in controllers.split(","):
            return path
    return ""


class MemoryCgroup:
    """A memory cgroup of ``limit_bytes`` for child processes (``with MemoryCgroup(16e9) as cg: Popen(…,
    preexec_fn=cg.join)``), removed on exit. ``peak_bytes()``: the most it held (anonymous + page cache);
    ``oom_kills()``: how many processes its limit killed. No writable memory cgroup here: one line saying so."""

    def __init__(self, limit_bytes: int, *, root: Path = CGROUP_ROOT, proc_cgroup: str | None = None):
        self.limit_bytes = int(limit_bytes)
        text = proc_cgroup if proc_cgroup is not None else Path("/proc/self/cgroup").read_text()
        name = f"dspark-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.version, _, parent = _memory_hierarchy(root, text)
        if self.version == 2:  # the memory controller must be enabled for this cgroup's children
            enabled = (parent / "cgroup.subtree_control").read_text().split() if parent.exists() else []
            usable = "memory" in enabled
        else:
            usable = parent.is_dir()
        self.path = parent / name
        fix = ("run as root, or where this process's cgroup is delegated to you (systemd-run --user --scope -p "
               "Delegate=yes …), or leave the memory limit out")
        if not usable:
            raise DSparkTrtError(f"a memory limit needs a memory cgroup below {parent} (cgroup v{self.version}"
                                 f"{', memory controller enabled in cgroup.subtree_control' if self.version == 2 else ''}"
                                 f"), which this host does not offer; {fix}")
        try:
            self.path.mkdir()
            self._write("memory.max" if self.version == 2 else "memory.limit_in_bytes", str(self.limit_bytes))
            if self.version == 2 and (self.path / "memory.swap.max").exists():
                self._write("memory.swap.max", "0")  # the limit is memory, not memory plus swap
        except OSError as e:
            self.remove()
            raise DSparkTrtError(f"cannot make a memory cgroup in {parent}: {e.strerror}; {fix}") from None

    def _write(self, name: str, value: str) -> None:
        (self.path / name).write_text(value)

    def join(self) -> None:
        """Move the calling process into the cgroup (a ``preexec_fn``: the child joins before it execs)."""
        self._write("cgroup.procs", str(os.getpid()))

    def peak_bytes(self) -> int | None:
        """The most the cgroup held: ``memory.peak`` (v2, Linux ≥ 5.19) or ``memory.max_usage_in_bytes`` (v1)."""
        try:
            return int((self.path / ("memory.peak" if self.version == 2 else "memory.max_usage_in_bytes")).read_text())
        except (OSError, ValueError):
            return None

    def oom_kills(self) -> int:
        """Processes its limit's out-of-memory killer ended (``oom_kill`` in memory.events / memory.oom_control)."""
        try:
            return _stat(self.path / ("memory.events" if self.version == 2 else "memory.oom_control")).get("oom_kill", 0)
        except (OSError, ValueError):
            return 0

    def remove(self) -> None:
        """Remove the cgroup (its processes have exited); a cgroup still in use is left to the system."""
        try:
            self.path.rmdir()
        except OSError:
            pass

    def __enter__(self) -> "MemoryCgroup":
        return self

    def __exit__(self, *exc) -> None:
        self.remove()
