"""`dspark bench markov` smoke runs at shrunken shapes (timings are reported, never asserted)."""

from __future__ import annotations

import importlib.util
import json
import os
import stat

import pytest

from dspark_trt.cli.main import main

SMALL = ["bench", "markov", "--batch", "1,3", "--topk", "4,16", "--vocab", "4099", "--rank", "8", "--steps", "3",
         "--repeats", "1"]
KEYS = {"device", "batch", "topk", "dense_ms", "topk_ms", "speedup", "floor_ms"}


@pytest.mark.parametrize("clock", ["wall", "cpu"])
def test_json_rows_cover_every_batch_and_topk(capsys, clock):
    assert main([*SMALL, "--json", "--clock", clock]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["batch"], r["topk"]) for r in rows] == [(1, 4), (1, 16), (3, 4), (3, 16)]
    for r in rows:
        assert KEYS <= set(r) and r["device"] == "cpu"
        assert r["dense_ms"] > 0 and r["topk_ms"] > 0 and r["floor_ms"] > 0
        assert r["speedup"] == pytest.approx(r["dense_ms"] / r["topk_ms"], rel=0.01, abs=0.01)
    # the bytes floor grows with k: the gathered W2 rows
    assert rows[1]["floor_ms"] > rows[0]["floor_ms"]


def test_cpu_rows_time_the_native_round_when_numba_is_there(capsys):
    pytest.importorskip("numba")
    assert main([*SMALL, "--json"]) == 0
    for r in json.loads(capsys.readouterr().out):
        assert r["kernel_ms"] > 0 and r["fused_ms"] > 0
        assert r["fused_speedup"] == pytest.approx(r["dense_ms"] / r["fused_ms"], rel=0.01, abs=0.01)
        assert r["fused_vs_pass"] == pytest.approx(r["fused_ms"] / r["pass_ms"], rel=0.01, abs=0.01)


def test_markov_topm_rows_time_the_union_round(capsys):
    assert main([*SMALL, "--markov-topm", "8", "--json"]) == 0
    for r in json.loads(capsys.readouterr().out):
        assert r["markov_topm"] == 8 and r["union_topk_ms"] > 0
        if "fused_ms" in r:  # the CPU kernels are there
            assert r["union_fused_ms"] > 0
            assert r["union_vs_topk"] == pytest.approx(r["union_fused_ms"] / r["union_plain_ms"], rel=0.01, abs=0.01)


def test_table_json_file_and_plot(tmp_path, capsys):
    mask = os.umask(0)
    os.umask(mask)
    out, png = tmp_path / "rows.json", tmp_path / "markov.png"
    assert main([*SMALL, "--json", str(out), "--plot", str(png)]) == 0
    assert "speedup" in capsys.readouterr().out  # the table
    assert len(json.loads(out.read_text())) == 4
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main([*SMALL, "--json", str(out)]) == 1  # nothing the user had is overwritten without --force
    assert "--force" in capsys.readouterr().err
    assert main([*SMALL, "--json", str(out), "--force"]) == 0
    assert stat.S_IMODE(png.stat().st_mode) == 0o666 & ~mask  # the user's umask, not tempfile's 0600


@pytest.mark.parametrize("flag", ["--plot", "--json"])
def test_a_directory_or_a_path_below_a_file_is_a_one_line_error(tmp_path, capsys, flag):
    (tmp_path / "notes.txt").write_text("mine")
    for path, message in [(tmp_path, f"{tmp_path} is a directory; give a file path"),
                          (tmp_path / "notes.txt" / "x.png", f"{tmp_path / 'notes.txt'} is a file, not a directory")]:
        assert main([*SMALL, flag, str(path), "--force"]) == 1
        assert message in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_bad_markov_topm_is_a_one_line_error(capsys):
    assert main([*SMALL, "--markov-topm", "5000"]) == 1
    assert "--markov-topm 5000 must be in [0, --vocab 4099]" in capsys.readouterr().err


def test_bad_topk_is_a_one_line_error(capsys):
    assert main(["bench", "markov", "--topk", "5000", "--vocab", "4099", "--repeats", "1"]) == 1
    err = capsys.readouterr().err
    assert "--topk" in err and "Traceback" not in err


@pytest.mark.gpu
@pytest.mark.triton
def test_cuda_rows_time_the_fused_kernel(capsys):
    assert main(["bench", "markov", "--device", "cuda", "--batch", "1,8", "--topk", "16,64", "--vocab", "4099",
                 "--repeats", "2", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert all(r["kernel_ms"] > 0 and r["cublas_dense_ms"] > 0 and r["fused_speedup"] > 0 for r in rows)


@pytest.mark.triton
def test_cuda_columns_in_triton_interpreter():
    """The CUDA rows' code path (torch.topk + the fused kernel, its columns) run on CPU tensors in Triton's
    interpreter, so it is exercised without a GPU; the timings mean nothing here."""
    import torch

    from dspark_trt.bench.markov import MarkovBenchConfig, _native_round, _timer
    from dspark_trt.plugins.kernel import interpreting

    if not interpreting():
        pytest.skip("needs TRITON_INTERPRET=1 (set by tests/conftest.py without CUDA)")
    g = torch.Generator().manual_seed(0)
    V, r, N, B, k = 257, 8, 3, 2, 16
    cfg = MarkovBenchConfig(device="cuda", batches=(B,), topks=(k,), vocab=V, rank=r, steps=N, repeats=1, warmup=0)
    w1, w2 = torch.randn(V, r, generator=g), torch.randn(V, r, generator=g)
    time_round = _native_round(torch.device("cuda"), cfg, torch.float32, w1, w2, _timer(torch.device("cpu")), 10.0)
    row = time_round(torch.randn(B, N, V, generator=g), torch.randint(0, V, (B,), generator=g), k, 2.0, 0.5)
    assert set(row) == {"kernel_ms", "kernel_speedup", "fused_ms", "fused_speedup", "fused_vs_pass",
                        "kernel_floor_ms", "kernel_vs_floor"}
    assert row["kernel_vs_floor"] == pytest.approx(row["kernel_ms"] / row["kernel_floor_ms"], rel=0.01)
    assert row["kernel_ms"] > 0 and row["fused_speedup"] == pytest.approx(2.0 / row["fused_ms"], rel=0.01, abs=0.01)
    assert time_round(torch.randn(B, N, V), torch.zeros(B, dtype=torch.long), 4096, 2.0, 0.5) == {}  # > MAX_TOPK
    # --markov-topm: the union kernel's round, paired with the plain one
    table = torch.randint(0, V, (V, 5), generator=g, dtype=torch.int32)
    time_union = _native_round(torch.device("cuda"), cfg, torch.float32, w1, w2, _timer(torch.device("cpu")), 10.0,
                               table)
    row = time_union(torch.randn(B, N, V, generator=g), torch.randint(0, V, (B,), generator=g), k, 2.0, 0.5)
    assert {"union_fused_ms", "union_plain_ms", "union_vs_topk"} <= set(row)
    assert row["union_vs_topk"] == pytest.approx(row["union_fused_ms"] / row["union_plain_ms"], rel=0.02)


@pytest.mark.parametrize("head", ["gated", "rnn"])
def test_head_rows_time_the_head_and_compare_it_with_vanilla(capsys, head):
    assert main([*SMALL, "--head", head, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["batch"], r["topk"]) for r in rows] == [(1, 4), (1, 16), (3, 4), (3, 16)]
    for r in rows:
        assert r["head"] == head and r["dense_ms"] > 0 and r["topk_ms"] > 0 and r["peak_rss_mb"] > 0
        if "fused_ms" in r:  # the CPU kernels walk gated and rnn heads
            assert r["fused_speedup"] == pytest.approx(r["dense_ms"] / r["fused_ms"], rel=0.01, abs=0.01)
            assert r["vanilla_fused_ms"] > 0 and r["head_vs_vanilla"] > 0
    if importlib.util.find_spec("numba") is not None:
        assert all("head_vs_vanilla" in r for r in rows)


def test_vanilla_rows_name_the_head_and_report_peak_memory(capsys):
    assert main([*SMALL, "--json"]) == 0
    for r in json.loads(capsys.readouterr().out):
        assert r["head"] == "vanilla" and r["peak_rss_mb"] > 0 and "head_vs_vanilla" not in r


def test_bench_head_inputs_walk_like_the_reference():
    """The head inputs the benchmark draws have the walk's shapes, and its rounds equal the reference's."""
    import torch

    from dspark_trt.bench.markov import bench_head
    from dspark_trt.reference.markov import markov_walk

    g = torch.Generator().manual_seed(0)
    B, N, V, r = 2, 3, 257, 8
    base, anchor = torch.randn(B, N, V, generator=g) * 3, torch.randint(0, V, (B,), generator=g)
    w1, w2 = torch.randn(V, r, generator=g) / r**0.5, torch.randn(V, r, generator=g)
    assert bench_head("vanilla", B, N, r, g, torch.device("cpu")) is None
    for kind, width in (("gated", r), ("rnn", 3 * r)):
        head = bench_head(kind, B, N, r, g, torch.device("cpu"))
        assert head.kind == kind and head.hidden_part.shape == (B, N, width) and head.rank == r
        dense = markov_walk(base, anchor, w1, w2, topk=None, head=head)
        full = markov_walk(base, anchor, w1, w2, topk=V, head=head)
        assert torch.equal(dense.tokens, full.tokens)
        assert (dense.cand_logits - markov_walk(base, anchor, w1, w2, topk=None).cand_logits).abs().max() > 0.1


def test_a_union_with_a_gated_or_rnn_head_is_a_one_line_error(capsys):
    assert main([*SMALL, "--head", "rnn", "--markov-topm", "8"]) == 1
    err = capsys.readouterr().err
    assert "--markov-topm 8 with --head rnn: the candidate union is defined for the vanilla Markov head only" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.triton
@pytest.mark.parametrize("kind", ["gated", "rnn"])
def test_cuda_head_rows_time_the_head_kernel_in_triton_interpreter(kind, monkeypatch):
    """The CUDA rows of a gated / RNN head time the head's fused round (the head kernels), paired with the vanilla
    one, run on CPU tensors in Triton's interpreter; a head kernel that is not called fails it."""
    import torch

    from dspark_trt.bench.markov import MarkovBenchConfig, _native_round, _timer, bench_head
    from dspark_trt.plugins import head_kernels
    from dspark_trt.plugins.kernel import interpreting

    if not interpreting():
        pytest.skip("needs TRITON_INTERPRET=1 (set by tests/conftest.py without CUDA)")
    calls = []
    real = head_kernels.head_markov_walk
    monkeypatch.setattr(head_kernels, "head_markov_walk", lambda *a, **k: calls.append(1) or real(*a, **k))
    g = torch.Generator().manual_seed(0)
    V, r, N, B, k = 257, 8, 3, 2, 16
    cfg = MarkovBenchConfig(device="cuda", batches=(B,), topks=(k,), vocab=V, rank=r, steps=N, repeats=1, warmup=0,
                            head=kind)
    w1, w2 = torch.randn(V, r, generator=g), torch.randn(V, r, generator=g)
    time_round = _native_round(torch.device("cuda"), cfg, torch.float32, w1, w2, _timer(torch.device("cpu")), 10.0)
    head = bench_head(kind, B, N, r, g, torch.device("cpu"))
    row = time_round(torch.randn(B, N, V, generator=g), torch.randint(0, V, (B,), generator=g), k, 2.0, 0.5, head)
    assert {"fused_ms", "fused_speedup", "vanilla_fused_ms", "head_vs_vanilla"} <= set(row)
    assert row["head_vs_vanilla"] == pytest.approx(row["fused_ms"] / row["vanilla_fused_ms"], rel=0.02)
    assert calls  # the head's own kernel ran, not the vanilla one under the head's label
