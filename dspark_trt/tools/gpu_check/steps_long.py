"""gpu-check rows past the short prompts: a prompt over 16 tokens (the target engine's profile 0, prefill in
chunks) and a K/V cache that grows across capacity buckets (the target's graphs captured again once its
buffers moved), both on the fp32 TensorRT export, against transformers and the onnxruntime backend."""

from __future__ import annotations

import torch

from .common import assert_graphs_captured
from .steps_tensorrt import onnxruntime_tokens, reference_target, target_runners

__all__ = ["LONG_PROMPTS", "PREFILL_CHUNK", "GROWTH_PROMPTS", "GROWTH_NEW_TOKENS", "long_prompt_step",
           "kv_growth_step", "capacities_captured"]

#: prompt lengths over 16 (profile 1 holds Q <= 16: these prefill on profile 0), in chunks of 20: 45 = 20 + 20 + 5
LONG_PROMPTS, PREFILL_CHUNK = (45, 23), 20
#: prompts and new tokens that carry the cache across at least one capacity bucket (128, 160, 192, 224, …)
GROWTH_PROMPTS, GROWTH_NEW_TOKENS = (120, 100), 96


def _prompts(lengths, vocab: int, seed: int = 1) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(1, vocab, (n,), generator=gen).tolist() for n in lengths]


def _long_prompt(export: dict) -> tuple[str, dict]:
    from ...export.validate import _close
    from ...export.validate_target import TARGET_TOLERANCES
    from ...runtime import SpeculativeDecoder
    from ...runtime.targets.exported import prefill_chunks
    from ...runtime.targets.tensorrt import TensorRTTarget

    got = TensorRTTarget(export["dir"], graphs="graph")
    got.prefill_chunk = PREFILL_CHUNK
    ref = reference_target(export)
    ref.set_taps(got.layer_ids)
    got.set_taps(got.layer_ids)
    tol = TARGET_TOLERANCES[export["tolerance"]]
    prompts = [torch.tensor(p) for p in _prompts(LONG_PROMPTS, got.vocab_size)]
    r, g = ref.prefill(prompts), got.prefill(prompts)
    checks = [_close("long prefill logits", g.logits.cpu(), r.logits.float(), tol)]
    tokens = torch.randint(0, got.vocab_size, (2, 4), generator=torch.Generator().manual_seed(2))
    r, g = ref.verify(tokens), got.verify(tokens)
    checks += [_close("verify logits after a long prefill", g.logits.cpu(), r.logits.float(), tol)]
    bad = [c for c in checks if not c.ok]
    assert not bad, f"{bad[0].name}: {bad[0].detail}"
    uses = dict(got._engine.profile_uses)
    chunks = len(prefill_chunks(max(LONG_PROMPTS), PREFILL_CHUNK))
    assert uses.get(0), f"no context ran on the target engine's profile 0 (contexts per profile: {uses})"
    if len(got._engine.profiles) > 1:
        assert uses.get(1), f"the verify round did not run on the small-Q profile 1 (contexts per profile: {uses})"
    runners = target_runners(got)
    assert_graphs_captured("long prompt", runners, need=[tuple(runners)])
    got.deactivate()
    # the whole decoder, prefilling in chunks, against onnxruntime's tokens (the same chunks)
    token_prompts = _prompts(LONG_PROMPTS, got.vocab_size)
    want = onnxruntime_tokens(export, token_prompts, 16, prefill_chunk=PREFILL_CHUNK)
    dec = SpeculativeDecoder.from_export(export["dir"], backend="tensorrt", graphs="graph")
    dec.target.prefill_chunk = PREFILL_CHUNK
    tokens_got = dec.generate(token_prompts, max_new_tokens=16, topk=16).tokens
    dec.backend.deactivate()
    dec.target.deactivate()
    assert tokens_got == want, f"long prompts: tokens differ from onnxruntime's: {tokens_got} vs {want}"
    return (f"prompts of {list(LONG_PROMPTS)} tokens in chunks of {PREFILL_CHUNK} ({chunks} chunks), contexts per "
            f"profile {uses}; logits within {export['tolerance']} rules, tokens == onnxruntime's"), \
        {"profile_uses": uses, "chunks": chunks}


def capacities_captured(runners) -> list[int]:
    """The cache capacities (context buckets) the target's graphs were captured at, in order of first capture
    (``GraphRunner.captured_keys``: recaptures included, entries dropped since too)."""
    seen: list[int] = []
    for runner in runners.values():
        for key in runner.captured_keys:
            if key.context not in seen:
                seen.append(key.context)
    return seen


def _kv_growth(export: dict) -> tuple[str, dict]:
    from ...runtime import SpeculativeDecoder

    dec = SpeculativeDecoder.from_export(export["dir"], backend="tensorrt", graphs="graph")
    prompts = _prompts(GROWTH_PROMPTS, dec.target.vocab_size, seed=3)
    want = onnxruntime_tokens(export, prompts, GROWTH_NEW_TOKENS)
    got = dec.generate(prompts, max_new_tokens=GROWTH_NEW_TOKENS, topk=16).tokens
    runners = target_runners(dec.target)
    capacities = capacities_captured(runners)
    lengths = [len(t) for t in got]
    captured = assert_graphs_captured("kv growth", runners, need=[tuple(runners)])
    dec.backend.deactivate()
    dec.target.deactivate()
    assert got == want, f"tokens differ from onnxruntime's after the cache grew: {got} vs {want}"
    assert len(capacities) >= 2, (f"target graphs captured at cache capacity {capacities} only (generated {lengths} "
                                  f"tokens): the cache did not grow across a capacity bucket")
    return (f"prompts {list(GROWTH_PROMPTS)} + {lengths} tokens: target graphs captured at capacities {capacities} "
            f"({captured}); tokens == onnxruntime's"), {"capacities": capacities, "generated": lengths}


def long_prompt_step(run) -> None:
    run.checks.run(f"tensorrt fp32 long prompt (> 16 tokens: profile 0, chunks of {PREFILL_CHUNK})",
                   lambda: _long_prompt(run.exports["fp32"]))


def kv_growth_step(run) -> None:
    run.checks.run("tensorrt fp32 K/V cache growth across capacity buckets (graphs captured again)",
                   lambda: _kv_growth(run.exports["fp32"]))
