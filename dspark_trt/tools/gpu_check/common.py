"""What every gpu-check step shares: the Qwen3-8B shapes, timing, output buffers, and the capture assertion."""

from __future__ import annotations

import statistics
import time

import torch

__all__ = ["QWEN3_8B", "GRAPH_BUCKETS", "UNION_M", "qwen3_8b_drafter_config", "median_ms", "sync", "walk_outputs",
           "union_outputs", "torch_dtype", "assert_graphs_captured"]

QWEN3_8B = dict(vocab=151936, rank=256, steps=7)
GRAPH_BUCKETS = (1, 4, 8)
UNION_M = 32  # the union width the GPU check builds and times (k = 512)


def qwen3_8b_drafter_config(num_layers: int = 5, topk: int = 512):
    """The DSpark drafter of Qwen3-8B (``dspark_qwen3_8b_block7``'s shapes, docs/dspark.md §2)."""
    from ...config import DSparkConfig

    return DSparkConfig(vocab_size=151936, draft_vocab_size=151936, hidden_size=4096, intermediate_size=12288,
                        num_hidden_layers=num_layers, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                        rms_norm_eps=1e-6, rope_theta=1e6, block_size=7, mask_token_id=151669,
                        target_layer_ids=(1, 9, 17, 25, 33), num_target_layers=36, markov_rank=256,
                        draft_topk=topk)


def sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def median_ms(fn, repeats: int = 20, warmup: int = 3, device: str = "cuda") -> float:
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def walk_outputs(B: int, N: int, k: int, device: str = "cuda"):
    return (torch.full((B, N), -1, dtype=torch.int32, device=device),
            torch.full((B, N, k), float("nan"), device=device), torch.full((B, N), float("nan"), device=device))


def union_outputs(B: int, N: int, k: int, M: int, device: str = "cuda"):
    return (*walk_outputs(B, N, k + M, device), torch.full((B, N, M), -1, dtype=torch.int32, device=device))


def torch_dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[name]


def assert_graphs_captured(what: str, runners, need=None) -> str:
    """A graph mode claimed is a graph mode proven. ``runners``: {name: GraphRunner}. Fails (AssertionError: a
    FAIL row) when a runner is not in graph mode, when any capture fell back to eager (``GraphRunner.fallbacks``:
    elsewhere a warning), or when a group of ``need`` (tuples of names; default: each runner alone) captured no
    graph at all. Returns the captures per runner."""
    for name, runner in runners.items():
        why = runner.why_not_captured()
        if runner.mode != "graph" or runner.fallbacks:
            raise AssertionError(f"{what}: {name}: {why}")
    for group in need if need is not None else [(name,) for name in runners]:
        assert sum(runners[name].captures for name in group), (
            f"{what}: {' / '.join(group)}: no graph captured (no round ran through the graph runner)")
    return ", ".join(f"{name} {runner.captures} captured" for name, runner in runners.items())
