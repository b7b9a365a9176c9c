"""RequestScheduler: requests joining and leaving a running batch get exactly the tokens they get alone."""

from __future__ import annotations

import threading

import pytest
import torch

from tests.runtime.runtime_helpers import random_prompts
from dspark_trt.errors import DSparkTrtError
from dspark_trt.runtime import RequestScheduler, SpeculativeDecoder
from dspark_trt.runtime.drafters.torch import TorchDrafterBackend


def prompts_for(dec, n, seed, **kw):
    return random_prompts(n, dec.target.vocab_size, seed=seed, avoid=(dec.config.mask_token_id,), **kw)


def alone(dec, prompt, max_new, temperature=0.0, seed=0, eos=None, draft=True):
    return dec.generate([prompt], max_new, temperature=temperature, seed=seed, eos_token_id=eos, draft=draft).tokens[0]


class Recorder:
    """on_update callback: every delivery, in order, per request."""

    def __init__(self):
        self.calls: dict[int, list[tuple[list[int], bool]]] = {}

    def __call__(self, handle, tokens, finished):
        self.calls.setdefault(handle.id, []).append((list(tokens), finished))

    def streamed(self, handle) -> list[int]:
        return [t for chunk, _ in self.calls[handle.id] for t in chunk]


@pytest.mark.parametrize("draft", [True, False], ids=["speculative", "target-only"])
def test_requests_joining_mid_way_get_their_tokens_alone(distilled_decoder, draft):
    dec = distilled_decoder
    prompts = prompts_for(dec, 6, seed=3, min_len=1, max_len=14)
    settings = [(0.0, 0), (1.0, 11), (0.0, 0), (1.0, 5), (0.7, 2), (1.0, 11)]
    budgets = [18, 9, 14, 20, 5, 12]
    rec = Recorder()
    sched = RequestScheduler(dec, draft=draft)
    handles = [sched.submit(prompts[i], budgets[i], temperature=settings[i][0], seed=settings[i][1], on_update=rec)
               for i in range(2)]
    for _ in range(2):
        assert sched.step()
    handles += [sched.submit(prompts[i], budgets[i], temperature=settings[i][0], seed=settings[i][1], on_update=rec)
                for i in range(2, 5)]
    assert sched.step()
    handles.append(sched.submit(prompts[5], budgets[5], temperature=settings[5][0], seed=settings[5][1],
                                on_update=rec))
    sched.run_until_idle()
    assert not sched.busy and sched.stats.finished == 6 and sched.stats.max_batch >= 4
    for i, h in enumerate(handles):
        expected = alone(dec, prompts[i], budgets[i], *settings[i], draft=draft)
        assert h.done and h.tokens == expected, f"request {i}"
        assert rec.streamed(h) == expected  # the streamed chunks concatenate to the result
        assert [f for _, f in rec.calls[h.id]] == [False] * (len(rec.calls[h.id]) - 1) + [True]
        assert h.finish_reason == "length" and h.rounds >= 1 and h.max_batch >= 2
    if draft:
        assert sum(h.accepted for h in handles) > 0
        assert all(h.drafted >= h.accepted for h in handles)


def test_verify_drafts_reaches_the_scheduler_rounds(distilled_decoder):
    dec = distilled_decoder
    prompts = prompts_for(dec, 3, seed=4, min_len=2, max_len=9)
    sched = RequestScheduler(dec, verify_drafts=1)
    handles = [sched.submit(p, 12) for p in prompts]
    sched.run_until_idle()
    for p, h in zip(prompts, handles):
        assert h.tokens == alone(dec, p, 12, 0.0, 0, draft=False)  # greedy: the target's own tokens
        assert h.drafted == h.rounds  # one draft verified per round
    with pytest.raises(DSparkTrtError, match="verify_drafts must be an integer"):
        RequestScheduler(dec, verify_drafts=0)


def test_per_request_eos_and_a_request_finishing_on_its_first_token(distilled_decoder):
    dec = distilled_decoder
    prompts = prompts_for(dec, 3, seed=8)
    ref = [alone(dec, p, 16) for p in prompts]
    eos = [ref[0][4], ref[1][0], None]  # request 1 stops on its very first (prefill) token
    sched = RequestScheduler(dec)
    first = sched.submit(prompts[2], 16)
    sched.step()
    handles = [sched.submit(p, 16, eos_token_id=[] if e is None else [e]) for p, e in zip(prompts[:2], eos)]
    sched.run_until_idle()
    assert first.tokens == ref[2]
    for p, e, h in zip(prompts, eos, handles):
        assert h.tokens == alone(dec, p, 16, eos=[] if e is None else [e])
    assert handles[1].tokens == [ref[1][0]] and handles[1].finish_reason == "stop"
    assert handles[0].finish_reason == "stop" and handles[0].tokens[-1] == eos[0]


def test_cancelled_requests_leave_and_the_others_are_unchanged(distilled_decoder):
    dec = distilled_decoder
    prompts = prompts_for(dec, 4, seed=19)
    rec = Recorder()
    sched = RequestScheduler(dec)
    handles = [sched.submit(p, 24, temperature=1.0, seed=i, on_update=rec) for i, p in enumerate(prompts)]
    sched.step()
    sched.step()
    handles[1].cancel()
    waiting = sched.submit(prompts[0], 24)
    waiting.cancel()  # cancelled before it ever joined
    sched.run_until_idle()
    assert handles[1].finish_reason == "cancelled" and waiting.finish_reason == "cancelled" and not waiting.tokens
    full = alone(dec, prompts[1], 24, 1.0, 1)
    assert 0 < len(handles[1].tokens) < 24 and handles[1].tokens == full[: len(handles[1].tokens)]
    assert rec.streamed(handles[1]) == handles[1].tokens and rec.calls[handles[1].id][-1][1]
    for i in (0, 2, 3):
        assert handles[i].tokens == alone(dec, prompts[i], 24, 1.0, i)
    assert sched.stats.cancelled == 2 and sched.stats.finished == 3


def test_max_batch_size_queues_the_rest(distilled_decoder):
    dec = distilled_decoder
    prompts = prompts_for(dec, 5, seed=23)
    sched = RequestScheduler(dec, max_batch_size=2)
    handles = [sched.submit(p, 8 + i) for i, p in enumerate(prompts)]
    sched.run_until_idle()
    assert sched.stats.max_batch == 2
    assert [h.tokens for h in handles] == [alone(dec, p, 8 + i) for i, p in enumerate(prompts)]


def test_background_thread_serves_concurrent_submitters(distilled_decoder):
    dec = distilled_decoder
    prompts = prompts_for(dec, 8, seed=31, min_len=1, max_len=20)
    sched = RequestScheduler(dec)
    sched.start()
    handles = [None] * len(prompts)

    def client(i):
        handles[i] = sched.submit(prompts[i], 10, temperature=float(i % 2), seed=i)
        handles[i].wait(120)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    sched.stop(timeout=30)
    for i, h in enumerate(handles):
        assert h.done and h.tokens == alone(dec, prompts[i], 10, float(i % 2), i)
    with pytest.raises(DSparkTrtError, match="stopped"):
        sched.submit(prompts[0], 4)


@pytest.mark.parametrize("prompt, kwargs, message", [
    ([1, 2], {"max_new_tokens": 0}, "max_new_tokens"),
    ([1, 2], {"temperature": -1.0}, "temperature"),
    ([1, 2], {"temperature": float("nan")}, "temperature"),
    ([1, 2], {"seed": -3}, "seed"),
    ([1, 257], {}, "outside the target vocabulary"),
    ([], {}, "empty"),
    ([[1, 2], [3]], {}, "one prompt"),
    (list(range(40)), {"max_new_tokens": 30}, "context of 64 tokens"),
])
def test_bad_requests_raise_before_anything_runs(distilled_decoder, prompt, kwargs, message):
    sched = RequestScheduler(distilled_decoder, max_context=64)
    with pytest.raises(DSparkTrtError, match=message):
        sched.submit(prompt, **kwargs)
    assert not sched.busy and sched.stats.requests == 0


class FailingBackend(TorchDrafterBackend):
    """The torch backend, raising in ``draft`` while ``fail`` is set (a broken round)."""

    fail = False

    def draft(self, *args, **kw):
        if self.fail:
            raise RuntimeError("injected failure")
        return super().draft(*args, **kw)


def test_a_failed_round_fails_its_requests_and_the_next_ones_are_served(distilled_decoder):
    dec = distilled_decoder
    backend = FailingBackend(dec.backend.drafter)
    sched = RequestScheduler(SpeculativeDecoder(dec.target, backend))
    prompts = prompts_for(dec, 3, seed=41)
    doomed = [sched.submit(p, 12) for p in prompts[:2]]
    sched.step()
    backend.fail = True
    sched.step()
    backend.fail = False
    assert all(h.done and h.finish_reason == "error" and "injected" in str(h.error) for h in doomed)
    after = sched.submit(prompts[2], 12, temperature=1.0, seed=4)
    sched.run_until_idle()
    assert after.tokens == alone(dec, prompts[2], 12, 1.0, 4)
    assert sched.stats.failed == 2


def test_a_target_without_extend_is_refused(distilled_decoder):
    class NoExtend:
        def __getattr__(self, name):
            if name == "extend":
                raise AttributeError(name)
            return getattr(distilled_decoder.target, name)

    dec = SpeculativeDecoder.__new__(SpeculativeDecoder)
    dec.target, dec.backend, dec.config = NoExtend(), distilled_decoder.backend, distilled_decoder.config
    with pytest.raises(DSparkTrtError, match="extend"):
        RequestScheduler(dec)


def test_hf_target_extend_leaves_the_running_requests_alone(distilled_decoder):
    target = distilled_decoder.target
    target.set_taps(distilled_decoder.config.target_layer_ids)
    a, b = torch.tensor([5, 6, 7, 8, 9]), torch.tensor([3, 4])

    def a_until_next_round(join):
        target.prefill([a])
        target.verify(torch.tensor([[10, 11, 12]]))
        target.commit(torch.tensor([2]))  # one draft rejected: a hole the new request must not see
        pre = target.extend([b]) if join else None
        tokens = torch.tensor([[13, 14], [20, 21]]) if join else torch.tensor([[13, 14]])
        return pre, target.verify(tokens)

    _, solo_a = a_until_next_round(join=False)
    target.commit(torch.tensor([0]))
    pre_b, both = a_until_next_round(join=True)
    assert target.lengths.tolist() == [7, 2]
    target.commit(torch.tensor([0, 0]))
    solo_pre_b = target.prefill([b])
    solo_b = target.verify(torch.tensor([[20, 21]]))
    target.commit(torch.tensor([0]))
    torch.testing.assert_close(pre_b.logits, solo_pre_b.logits)
    torch.testing.assert_close(both.logits[:1], solo_a.logits)
    torch.testing.assert_close(both.logits[1:], solo_b.logits)
    torch.testing.assert_close(both.taps[1:], solo_b.taps)


@pytest.mark.onnx
@pytest.mark.slow
def test_exported_target_joins_requests_mid_way_too(qwen3_topk_export):
    dec = SpeculativeDecoder.from_export(qwen3_topk_export, backend="onnxruntime", device="cpu")
    prompts = random_prompts(4, dec.target.vocab_size, seed=51, min_len=1, max_len=16)
    settings = [(0.0, 0), (1.0, 3), (1.0, 9), (0.0, 0)]
    sched = RequestScheduler(dec)
    handles = [sched.submit(prompts[0], 14, temperature=settings[0][0], seed=settings[0][1])]
    sched.step()
    sched.step()
    handles += [sched.submit(p, 10 + i, temperature=t, seed=s) for i, (p, (t, s)) in enumerate(zip(prompts[1:], settings[1:]))]
    sched.run_until_idle()
    budgets = [14, 10, 11, 12]
    assert sched.stats.max_batch == 4
    for p, (t, s), n, h in zip(prompts, settings, budgets, handles):
        assert h.tokens == alone(dec, p, n, t, s)


def test_truncated_sampling_per_request_equals_generate_alone(distilled_decoder):
    dec = distilled_decoder
    prompts = prompts_for(dec, 4, seed=41)
    settings = [dict(top_k=5), dict(top_p=0.5), dict(top_k=20, top_p=0.8), {}]  # mixed in one batch
    sched = RequestScheduler(dec)
    handles = [sched.submit(p, 14, temperature=1.0, seed=i, **o) for i, (p, o) in enumerate(zip(prompts, settings))]
    sched.run_until_idle()
    for i, (p, o, h) in enumerate(zip(prompts, settings, handles)):
        assert h.tokens == dec.generate([p], 14, temperature=1.0, seed=i, **o).tokens[0], i
    assert handles[0].tokens != dec.generate([prompts[0]], 14, temperature=1.0, seed=0).tokens[0]  # it truncated
    with pytest.raises(DSparkTrtError, match="top_p must be in"):
        sched.submit(prompts[0], 4, top_p=0.0)
    with pytest.raises(DSparkTrtError, match="top_k must be >= 0"):
        sched.submit(prompts[0], 4, top_k=-1)


def test_max_queue_refuses_the_request_beyond_it_and_recovers(distilled_decoder):
    from dspark_trt.errors import ServerBusy

    dec = distilled_decoder
    prompts = prompts_for(dec, 6, seed=43)
    sched = RequestScheduler(dec, max_batch_size=2, max_queue=1)
    first = [sched.submit(p, 6) for p in prompts[:3]]  # two take the rows, one waits
    with pytest.raises(ServerBusy, match=r"server busy: 1 request\(s\) already wait for a batch row \(max_queue 1"):
        sched.submit(prompts[3], 6)
    assert sched.stats.rejected == 1
    sched.step()  # two join the batch, the third still waits: still busy
    with pytest.raises(ServerBusy):
        sched.submit(prompts[3], 6)
    while not first[0].done:  # a row frees up: the waiting request takes it, the queue has room again
        sched.step()
    sched.step()
    late = sched.submit(prompts[3], 6)
    sched.run_until_idle()
    assert [h.tokens for h in first + [late]] == [alone(dec, p, 6) for p in prompts[:4]]
    assert sched.stats.rejected == 2
    with pytest.raises(DSparkTrtError, match="max_queue must be >= 0"):
        RequestScheduler(dec, max_queue=-1)


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_a_request_whose_rounds_raise_fails_alone(distilled_pair, temperature):
    """Fault injection in a real decoder: the long request's rounds raise, whoever shares them; it fails alone,
    and every other request (in the failed batches too, mid-way) still gets exactly its generate tokens."""
    from tests.runtime.runtime_helpers import make_decoder
    from dspark_trt.serving.faults import InjectedFault, fail_rounds_at

    dec = make_decoder(distilled_pair)  # its own decoder: the fault stays in this test
    fail_rounds_at(dec, position=60)
    prompts = prompts_for(dec, 5, seed=47, min_len=3, max_len=12)
    poisoned = prompts_for(dec, 1, seed=48, min_len=50, max_len=50)[0]  # reaches position 60 mid-way
    rec = Recorder()
    sched = RequestScheduler(dec)
    handles = [sched.submit(p, 24, temperature=temperature, seed=i, on_update=rec) for i, p in enumerate(prompts[:3])]
    sched.step()
    sched.step()
    bad = sched.submit(poisoned, 30, temperature=temperature, seed=9, on_update=rec)
    handles += [sched.submit(p, 24, temperature=temperature, seed=3 + i, on_update=rec) for i, p in
                enumerate(prompts[3:])]
    sched.run_until_idle()
    assert bad.finish_reason == "error" and isinstance(bad.error, InjectedFault)
    assert 0 < len(bad.tokens) < 30 and rec.calls[bad.id][-1][1]  # it ran, then failed, and was told so
    assert sched.stats.failed == 1 and sched.stats.finished == 5
    fail_rounds_at(dec, position=10**9)  # (the wrapper stays; this bound is never reached)
    for i, (p, h) in enumerate(zip(prompts, handles)):
        expected = dec.generate([p], 24, temperature=temperature, seed=i).tokens[0]
        assert h.finish_reason in ("length", "stop") and h.tokens == expected, i
        assert rec.streamed(h) == expected  # streamed chunks across the recovery: nothing lost or repeated


def test_a_lone_failing_request_fails_and_the_scheduler_goes_on(distilled_pair):
    from tests.runtime.runtime_helpers import make_decoder
    from dspark_trt.serving.faults import fail_rounds_at

    dec = make_decoder(distilled_pair)
    fail_rounds_at(dec, position=40)
    sched = RequestScheduler(dec)
    bad = sched.submit(prompts_for(dec, 1, seed=5, min_len=45, max_len=45)[0], 8)
    sched.run_until_idle()
    assert bad.finish_reason == "error" and "injected fault" in str(bad.error) and bad.tokens  # the prefill token
    good = sched.submit([1, 2, 3], 8)
    sched.run_until_idle()
    assert good.tokens == alone(dec, [1, 2, 3], 8)


@pytest.mark.parametrize("head, topk", [("gated", 3), ("rnn", None)], ids=["gated-top3", "rnn-dense"])
def test_gated_and_rnn_drafters_in_a_mixed_batch_give_each_request_its_tokens_alone(request, head, topk):
    """The head's features are per request (its own slots' hidden states; rnn: its own state from its anchor):
    requests with other prompts, lengths and temperatures in the same rounds change nothing."""
    from tests.runtime.runtime_helpers import make_decoder

    dec = make_decoder(request.getfixturevalue(f"small_vocab_{head}_pair"))
    assert dec.config.markov_head_type == head
    prompts = prompts_for(dec, 5, seed=7, min_len=1, max_len=10)
    settings = [(0.0, 0), (1.0, 3), (0.0, 0), (1.0, 8), (0.0, 0)]
    budgets = [14, 9, 12, 16, 7]
    sched = RequestScheduler(dec, topk=topk)
    handles = [sched.submit(prompts[i], budgets[i], temperature=settings[i][0], seed=settings[i][1])
               for i in range(3)]
    assert sched.step()
    handles += [sched.submit(prompts[i], budgets[i], temperature=settings[i][0], seed=settings[i][1])
                for i in range(3, 5)]
    sched.run_until_idle()
    assert sched.stats.max_batch >= 4 and sum(h.accepted for h in handles) > 0
    for i, h in enumerate(handles):
        assert h.tokens == dec.generate([prompts[i]], budgets[i], temperature=settings[i][0], seed=settings[i][1],
                                        topk=topk, eos_token_id=None).tokens[0], f"request {i}"
    for i in (0, 2, 4):  # the greedy ones are the target's own greedy text
        assert handles[i].tokens == alone(dec, prompts[i], budgets[i], draft=False)


@pytest.mark.onnx
@pytest.mark.slow  # the Gemma-4 export (shared with tests/export/test_gemma4_target.py)
def test_a_gemma4_target_serves_requests_joining_and_leaving_as_alone(gemma4_export):
    """In-flight batching over a Gemma-4 export (``Gemma4OnnxRuntimeTarget``: global slots + each request's ring
    of the sliding layers): requests join the running batch after rounds (the rings and global slots of the
    running rows are kept, the new rows' appended) and leave it when done; prompts past the window (8) and the
    ring (71); greedy and sampled, each request's tokens == generate alone."""
    dec = SpeculativeDecoder.from_export(gemma4_export, threads=1)
    gen = torch.Generator().manual_seed(9)
    prompts = [torch.randint(0, 600, (n,), generator=gen).tolist() for n in (80, 3, 12, 30, 1)]
    settings = [(0.0, 0), (1.0, 4), (0.0, 0), (0.0, 0), (1.0, 7)]
    budgets = [12, 5, 16, 9, 14]
    sched = RequestScheduler(dec)
    submit = lambda i: sched.submit(prompts[i], budgets[i], temperature=settings[i][0], seed=settings[i][1],  # noqa
                                    eos_token_id=[])
    handles = [submit(0), submit(1)]
    for _ in range(2):
        assert sched.step()
    handles += [submit(2), submit(3)]
    for _ in range(4):  # request 1 (5 tokens) leaves meanwhile
        sched.step()
    handles.append(submit(4))
    sched.run_until_idle()
    assert sched.stats.finished == 5 and sched.stats.max_batch >= 3
    for i, h in enumerate(handles):
        assert h.tokens == alone(dec, prompts[i], budgets[i], *settings[i], eos=[]), f"request {i}"
