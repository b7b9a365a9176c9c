"""The onnxruntime drafter backend over a candidate-union export (``--markov-topm M``): decoding through the
DSparkTopKMarkovUnion graph is lossless and hands the verifier the torch backend's q; other M values are refused
naming ``dspark-export --markov-topm``; exports made before the union (no op-contract keys) still load."""

from __future__ import annotations

import functools
import json
import shutil

import pytest
import torch

from dspark_trt.errors import DSparkTrtError

pytestmark = pytest.mark.onnx

M, K = 5, 16


@functools.cache
def reference(pair):
    from dspark_trt import load_drafter

    return load_drafter(pair.drafter, dtype="fp32", target_dir=pair.target)


@pytest.fixture(scope="module")
def union_dir(tiny_pair, onnx_export):
    return onnx_export(tiny_pair, "fp32", K, markov_topm=M)


@pytest.fixture(scope="module")
def union_decoder(tiny_pair, union_dir):
    from dspark_trt.runtime import HFTarget, SpeculativeDecoder
    from dspark_trt.runtime.drafters.onnxruntime import OnnxRuntimeDrafterBackend

    target = HFTarget.from_pretrained(tiny_pair.target, dtype="fp32", device="cpu")
    return SpeculativeDecoder(target, OnnxRuntimeDrafterBackend(union_dir))


def dense_q(result, temperature, vocab: int) -> torch.Tensor:
    """The verifier's q [B, N, V] (by target id; a masked duplicate adds 0) from a draft round."""
    from dspark_trt.reference.verify import draft_probs

    q = draft_probs(result.cand_logits, result.cand_ids, result.tokens, temperature)  # V_d = V here
    return torch.zeros(*q.shape[:2], vocab).scatter_add(-1, result.cand_ids, q)


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "T1-seeded"])
def test_union_export_decodes_with_the_torch_backends_q(union_decoder, tiny_pair, temperature, monkeypatch):
    """Every round: the graph's drafts and q equal the torch backend's union round on the same inputs; greedy
    output is the target's own greedy output."""
    from dspark_trt.runtime.drafters.torch import TorchDrafterBackend

    dec = union_decoder
    backend = dec.backend
    assert backend.supports_markov_topm and backend.fixed_markov_topm == M and backend.markov_topm == M
    torch_backend = TorchDrafterBackend(reference(tiny_pair), graphs="off")
    rounds = []
    original = backend.draft

    def recording_draft(anchor, ctx_k, ctx_v, ctx_len, **kw):
        result = original(anchor, ctx_k, ctx_v, ctx_len, **kw)
        rounds.append(((anchor, ctx_k, ctx_v, ctx_len), kw, result))
        return result

    monkeypatch.setattr(backend, "draft", recording_draft)
    prompts = [[1, 2, 3, 4], [5, 6], [7, 8, 9]]
    out = dec.generate(prompts, max_new_tokens=12, temperature=temperature, seed=[3, 4, 5], eos_token_id=[],
                       topk=K)
    assert rounds and all(kw["markov_topm"] == M and kw["topk"] == K for _, kw, _ in rounds)  # the export's M
    V = reference(tiny_pair).config.vocab_size
    masked = 0
    for args, kw, got in rounds:
        ref = torch_backend.draft(*args, **kw)
        assert got.union_width == ref.union_width == M
        assert torch.equal(got.tokens, ref.tokens)
        assert torch.equal(got.cand_ids[..., K:], ref.cand_ids[..., K:])  # the table's ids, in order
        torch.testing.assert_close(dense_q(got, kw["temperature"], V), dense_q(ref, kw["temperature"], V),
                                   atol=1e-5, rtol=1e-5)
        masked += int((got.cand_logits[..., K:] == float("-inf")).sum())
    if temperature == 0.0:
        alone = dec.generate(prompts, max_new_tokens=12, eos_token_id=[], draft=False)
        assert out.tokens == alone.tokens and out.stats.drafted > 0
    assert out.stats.drafted > 0


def test_other_markov_topm_is_refused_naming_dspark_export(union_decoder, tiny_pair, onnx_export):
    from dspark_trt.runtime.drafters.onnxruntime import OnnxRuntimeDrafterBackend

    dec = union_decoder
    for other in (3, 0):
        with pytest.raises(DSparkTrtError, match=f"union with M={M} but --markov-topm {other} was requested; run with "
                                                 f"--markov-topm {M}, or export again with dspark-export "
                                                 f"--markov-topm {other}"):
            dec.generate([[1, 2]], max_new_tokens=2, topk=K, markov_topm=other)
    c = reference(tiny_pair).config
    kv = torch.zeros(c.num_hidden_layers, 1, 4, c.num_key_value_heads, c.head_dim)
    with pytest.raises(DSparkTrtError, match="dspark-export --markov-topm 0"):  # the backend itself refuses too
        dec.backend.draft(torch.tensor([1]), kv, kv, torch.tensor([4]), topk=K, temperature=None, seed=None)
    plain = OnnxRuntimeDrafterBackend(onnx_export(tiny_pair, "fp32", K))
    assert (plain.markov_topm, plain.fixed_markov_topm, plain.supports_markov_topm) == (0, 0, False)
    from dspark_trt.runtime import SpeculativeDecoder

    plain_dec = SpeculativeDecoder(dec.target, plain)
    with pytest.raises(DSparkTrtError, match="has no candidate union but --markov-topm 4 .*dspark-export --markov-topm 4"):
        plain_dec.generate([[1, 2]], max_new_tokens=2, topk=K, markov_topm=4)
    from dspark_trt.runtime.draft_options import resolve_markov_topm

    assert resolve_markov_topm(plain_dec.config, plain, None, K) == 0
    assert resolve_markov_topm(dec.config, dec.backend, None, K) == M


def _strip_union_keys(record: dict) -> dict:
    record.pop("op_contract_version", None), record.pop("markov_topm", None)
    record.get("spec", {}).pop("markov_topm", None)
    (record.get("drafter") or {}).get("spec", {}).pop("markov_topm", None)
    return record


def test_onnx_export_written_before_the_union_still_loads(tiny_pair, onnx_export, tmp_path):
    """An ONNX export directory without the new keys loads as M = 0 and drafts like the reference; a newer
    contract version is refused in one line."""
    from dspark_trt.runtime.drafters.onnxruntime import OnnxRuntimeDrafterBackend

    old = tmp_path / "old"
    shutil.copytree(onnx_export(tiny_pair, "fp32", K), old)
    record = json.loads((old / "manifest.json").read_text())
    (old / "manifest.json").write_text(json.dumps(_strip_union_keys(record)))
    drafter = reference(tiny_pair)
    c = drafter.config
    taps = torch.randn(2, 6, c.num_taps * c.hidden_size, generator=torch.Generator().manual_seed(1))
    with OnnxRuntimeDrafterBackend(old) as backend:
        assert backend.markov_topm == 0 and backend.fixed_markov_topm == 0
        k, v = backend.context_kv(taps, torch.arange(6).expand(2, 6))
        got = backend.draft(torch.tensor([3, 99]), k, v, torch.tensor([6, 2]), topk=K, temperature=None, seed=None)
    ref_k, ref_v = drafter.context_kv(taps, torch.arange(6).expand(2, 6))
    assert torch.equal(got.tokens, drafter.draft(torch.tensor([3, 99]), ref_k, ref_v, torch.tensor([6, 2]), topk=K).tokens)
    record["op_contract_version"] = 4
    (old / "manifest.json").write_text(json.dumps(record))
    with pytest.raises(DSparkTrtError, match="op contract version 4.*upgrade dspark-trt"):
        OnnxRuntimeDrafterBackend(old)


@pytest.mark.slow  # the shared dspark-export directory with its target graph (built once per run)
def test_dspark_export_written_before_the_union_decodes_through_from_export(qwen3_topk_export, tmp_path):
    from dspark_trt.runtime import SpeculativeDecoder

    old = tmp_path / "old"
    shutil.copytree(qwen3_topk_export, old)
    for file in (old / "manifest.json",):
        file.write_text(json.dumps(_strip_union_keys(json.loads(file.read_text()))))
    dec = SpeculativeDecoder.from_export(old, tokenizer=False)
    assert dec.backend.fixed_markov_topm == 0 and dec.default_topk == 16
    prompts = [[1, 2, 3], [4, 5]]
    spec = dec.generate(prompts, max_new_tokens=8, eos_token_id=[])
    alone = dec.generate(prompts, max_new_tokens=8, eos_token_id=[], draft=False)
    assert spec.tokens == alone.tokens and spec.stats.drafted > 0


def test_export_variant_check_of_both_export_backends():
    """The one refusal both export backends (onnxruntime, TensorRT) run before a round; pure."""
    from dspark_trt.runtime.drafters.base import check_export_variant

    check_export_variant("these engines", have_topk=16, have_markov_topm=5, topk=16, markov_topm=5)
    with pytest.raises(DSparkTrtError, match="these engines draft with top-k 16 but top-k off"):
        check_export_variant("these engines", have_topk=16, have_markov_topm=5, topk=None, markov_topm=0)
    with pytest.raises(DSparkTrtError, match="these engines walk the candidate union with M=5 but --markov-topm 2 "
                                             "was requested; run with --markov-topm 5, or export again with "
                                             "dspark-export --markov-topm 2"):
        check_export_variant("these engines", have_topk=16, have_markov_topm=5, topk=16, markov_topm=2)
    with pytest.raises(DSparkTrtError, match="these engines have no candidate union"):
        check_export_variant("these engines", have_topk=16, have_markov_topm=0, topk=16, markov_topm=2)


@pytest.mark.slow  # a dspark-export directory with the union and the target graph (~60 s, once per run)
def test_dspark_export_with_a_union_decodes_through_from_export(tmp_path_factory, random_pair):
    """``dspark-export --topk 16 --markov-topm 5`` → ``SpeculativeDecoder.from_export``: the export's M is the
    default, greedy output is the target's; M = 0 is refused naming ``dspark-export --markov-topm 0``."""
    from dspark_trt.artifact.export_dir import read_manifest
    from dspark_trt.runtime import SpeculativeDecoder
    from tests.conftest import export_once

    out = export_once(tmp_path_factory, "export-qwen3-topk16-m5-fp32", random_pair, topk=K, markov_topm=M,
                      dtype="fp32")
    assert (read_manifest(out)["markov_topm"], read_manifest(out)["op_contract_version"]) == (M, 2)
    dec = SpeculativeDecoder.from_export(out, tokenizer=False)
    from dspark_trt.runtime.draft_options import resolve_markov_topm

    assert dec.backend.fixed_markov_topm == M and resolve_markov_topm(dec.config, dec.backend, None, K) == M
    prompts = [[1, 2, 3], [4, 5]]
    spec = dec.generate(prompts, max_new_tokens=8, eos_token_id=[])
    alone = dec.generate(prompts, max_new_tokens=8, eos_token_id=[], draft=False)
    assert spec.tokens == alone.tokens and spec.stats.drafted > 0
    with pytest.raises(DSparkTrtError, match="dspark-export --markov-topm 0"):
        dec.generate(prompts, max_new_tokens=2, markov_topm=0)
