"""``dspark_trt.process_memory``: the peak resident size and a memory cgroup that holds a child to a limit (real
cgroups where this host lets the test make one; the refusals on a fake cgroup file system)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dspark_trt.errors import DSparkTrtError
from dspark_trt.process_memory import (MemoryCgroup, _own_cgroup, evict_page_cache, memory_available, peak_rss_bytes,
                                       reset_peak_rss)

V1 = "12:pids:/a\n4:memory:/process_api/abc\n1:name=systemd:/\n0::/\n"
V2 = "0::/user.slice/session-3.scope\n"


def _cgroup(limit: int) -> MemoryCgroup:
    try:
        return MemoryCgroup(limit)
    except DSparkTrtError as e:
        pytest.skip(f"no writable memory cgroup here: {e}")


def _allocate(mb: int) -> list[str]:
    """A child that touches ``mb`` MiB of anonymous memory, page by page, then prints "done"."""
    return [sys.executable, "-c", f"a = bytearray({mb} << 20)\nfor i in range(0, len(a), 4096): a[i] = 1\n"
                                  "print('done')"]


def test_peak_rss_grows_with_touched_memory_and_starts_over_on_reset():
    before = peak_rss_bytes()
    block = bytearray(64 << 20)
    for i in range(0, len(block), 4096):
        block[i] = 1
    assert peak_rss_bytes() >= before and peak_rss_bytes() >= 64 << 20
    del block
    reset_peak_rss()
    after = peak_rss_bytes()
    assert after > 0
    with open("/proc/self/status") as f:  # Linux: the reset peak is the current size again
        rss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    assert after < rss + (32 << 20)


def test_own_cgroup_is_read_from_each_hierarchy():
    assert _own_cgroup(1, V1) == "/process_api/abc"
    assert _own_cgroup(2, V1) == "/"
    assert _own_cgroup(2, V2) == "/user.slice/session-3.scope"
    assert _own_cgroup(1, V2) == ""


def test_no_usable_memory_cgroup_is_one_line_naming_the_fix(tmp_path):
    """v2 without the memory controller for this cgroup's children, and v1 without the memory hierarchy, are
    refused in one line that says what to do; nothing is left behind."""
    (tmp_path / "cgroup.controllers").write_text("cpu io memory\n")
    (tmp_path / "user.slice").mkdir()
    (tmp_path / "user.slice" / "cgroup.subtree_control").write_text("cpu\n")
    with pytest.raises(DSparkTrtError) as e:
        MemoryCgroup(1 << 30, root=tmp_path, proc_cgroup="0::/user.slice\n")
    assert "cgroup v2" in str(e.value) and "Delegate=yes" in str(e.value) and "\n" not in str(e.value)
    v1 = tmp_path / "v1"
    v1.mkdir()
    with pytest.raises(DSparkTrtError, match="cgroup v1"):
        MemoryCgroup(1 << 30, root=v1, proc_cgroup=V1)
    assert sorted(p.name for p in (tmp_path / "user.slice").iterdir()) == ["cgroup.subtree_control"]


def test_a_child_over_the_limit_is_killed_and_one_under_it_runs():
    """The kernel holds the child to the limit: 256 MiB touched under 96 MiB is killed (SIGKILL, one OOM kill
    counted); 32 MiB under the same limit runs, and the cgroup's peak lies between what it touched and the limit."""
    limit = 96 << 20
    with _cgroup(limit) as cg:
        over = subprocess.run(_allocate(256), capture_output=True, text=True, preexec_fn=cg.join)
        assert over.returncode == -9 and "done" not in over.stdout
        assert cg.oom_kills() >= 1
        assert cg.path.exists()
    assert not cg.path.exists()  # removed on exit
    with _cgroup(limit) as cg:
        under = subprocess.run(_allocate(32), capture_output=True, text=True, preexec_fn=cg.join)
        assert under.returncode == 0 and under.stdout.strip() == "done", under.stderr
        assert cg.oom_kills() == 0
        peak = cg.peak_bytes()
        assert peak is not None and 32 << 20 <= peak <= limit


def test_a_file_evicted_from_the_page_cache_is_charged_to_the_child_that_reads_it(tmp_path):
    """A file this process just wrote sits in the page cache, charged here: a child that maps and reads it (64 MiB,
    no copy) is not charged for it. Evicted, the next child is: its cgroup's peak holds the file."""
    data = tmp_path / "weights.bin"
    data.write_bytes(bytes(range(256)) * (1 << 18))  # 64 MiB
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "small.bin").write_bytes(b"x" * 4096)
    read = [sys.executable, "-c", f"import mmap\nf = open({str(data)!r}, 'rb')\n"
                                  "m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)\n"
                                  "print(sum(m[i] for i in range(0, len(m), 4096)), len(m))"]  # touches every page
    expected = f"0 {64 << 20}"  # every 4096th byte of the pattern is 0
    with _cgroup(1 << 30) as cached:
        out = subprocess.run(read, capture_output=True, text=True, preexec_fn=cached.join)
        assert out.stdout.strip() == expected, out.stderr
        assert cached.peak_bytes() < 48 << 20
    assert evict_page_cache(tmp_path) == (64 << 20) + 4096
    with _cgroup(1 << 30) as evicted:
        out = subprocess.run(read, capture_output=True, text=True, preexec_fn=evicted.join)
        assert out.stdout.strip() == expected, out.stderr
        assert evicted.peak_bytes() >= 64 << 20


GB = 10**9
MEMINFO = "MemTotal: 24000000 kB\nMemAvailable: 20000000 kB\n"  # 20.48 GB


def _v2(tmp, path: str, limit: str, current: int, inactive: int) -> None:
    d = tmp / path.lstrip("/")
    d.mkdir(parents=True, exist_ok=True)
    (d / "memory.max").write_text(limit + "\n")
    (d / "memory.current").write_text(f"{current}\n")
    (d / "memory.stat").write_text(f"anon {current - inactive}\ninactive_file {inactive}\nactive_file 0\n")


def test_memory_available_is_the_tightest_of_the_kernel_and_each_cgroup_up_the_tree(tmp_path):
    """A pod's limit (an ancestor) below the kernel's MemAvailable wins, counted as limit − (usage − inactive page
    cache); no limit anywhere: the kernel's figure; v1 writes "no limit" as 2^63 rounded to a page."""
    (tmp_path / "cgroup.controllers").write_text("memory\n")
    _v2(tmp_path, "/kubepods/pod1", str(8 * GB), 5 * GB, 2 * GB)  # 8 − (5 − 2) = 5 GB left
    _v2(tmp_path, "/kubepods/pod1/ctr", "max", 5 * GB, 2 * GB)
    assert memory_available(root=tmp_path, proc_cgroup="0::/kubepods/pod1/ctr\n", meminfo=MEMINFO) == 5 * GB
    _v2(tmp_path, "/kubepods/pod1/ctr", str(4 * GB), 3 * GB, 0)  # 1 GB left: tighter than the pod's
    assert memory_available(root=tmp_path, proc_cgroup="0::/kubepods/pod1/ctr\n", meminfo=MEMINFO) == 1 * GB
    _v2(tmp_path, "/kubepods/pod1", "max", 5 * GB, 2 * GB)
    _v2(tmp_path, "/kubepods/pod1/ctr", "max", 5 * GB, 2 * GB)
    assert memory_available(root=tmp_path, proc_cgroup="0::/kubepods/pod1/ctr\n", meminfo=MEMINFO) == 20_480_000_000
    v1 = tmp_path / "v1" / "memory" / "job"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (v1 / "memory.usage_in_bytes").write_text(f"{GB}\n")
    (v1 / "memory.stat").write_text("total_inactive_file 0\n")
    assert memory_available(root=tmp_path / "v1", proc_cgroup="4:memory:/job\n", meminfo=MEMINFO) == 20_480_000_000
    (v1 / "memory.limit_in_bytes").write_text(f"{3 * GB}\n")
    assert memory_available(root=tmp_path / "v1", proc_cgroup="4:memory:/job\n", meminfo=MEMINFO) == 2 * GB


def test_a_child_in_a_memory_cgroup_sees_its_limit_as_available():
    """The sizing every validation uses (``memory_available``) sees the cgroup's limit, not the host's memory."""
    probe = [sys.executable, "-c", "from dspark_trt.process_memory import memory_available; print(memory_available())"]
    with _cgroup(512 << 20) as cg:
        out = subprocess.run(probe, capture_output=True, text=True, preexec_fn=cg.join)
        assert out.returncode == 0, out.stderr
        assert 0 < int(out.stdout) < 512 << 20
