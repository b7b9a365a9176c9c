"""Stop strings: the text is cut before the earliest stop string, the tokens end with the one completing it,
streamed text never shows any of it — in generate, in the scheduler (other requests unchanged) and as pieces."""

from __future__ import annotations

import random

import pytest

from dspark_trt.errors import DSparkTrtError
from dspark_trt.runtime import RequestScheduler
from dspark_trt.runtime.stop import StopStrings, StopText

PROMPTS = ["Speculative decoding", "A small drafter", "The target model checks"]


def first_stop_tokens(tok, ids, stops):
    """Reference: the fewest leading tokens whose text contains a stop string (None: never), by brute force."""
    for n in range(1, len(ids) + 1):
        if any(s in tok.decode(ids[:n]) for s in stops):
            return n
    return None


@pytest.fixture(scope="module")
def free(embedded_decoder):
    """Each prompt's continuation without stop strings (greedy and sampled)."""
    import torch

    dec = embedded_decoder
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # module scope: before the autouse one-thread fixture
    try:
        return {(p, t): dec.generate([p], 60, temperature=t, seed=5).tokens[0] for p in PROMPTS for t in (0.0, 1.0)}
    finally:
        torch.set_num_threads(before)


def stops_inside(tok, ids, rng, n=2):
    """Stop strings cut from the middle of a continuation's text (2–4 characters: they span tokens)."""
    text = tok.decode(ids)
    out = []
    for _ in range(n):
        at = rng.randrange(8, len(text) - 6)
        out.append(text[at: at + rng.randint(2, 4)])
    return out


def test_find_cut_and_held_tail():
    s = StopStrings(["###", "ab", "ab"])
    assert s.strings == ("###", "ab")
    assert s.find("xx#ab###") == 3 and s.cut("xx#ab###") == "xx#" and s.find("a#b") is None
    assert s.held_tail("xyz##") == 2 and s.held_tail("xa") == 1 and s.held_tail("x#a") == 1
    assert s.held_tail("") == 0 and StopStrings(["aab"]).held_tail("aaa") == 2
    for bad, message in ((["a", ""], "non-empty"), ([], "at least one"), (list("abcde"), "at most 4"), ([3], "text")):
        with pytest.raises(DSparkTrtError, match=message):
            StopStrings(bad)


def test_streamed_pieces_never_show_a_stop_string_and_join_to_the_cut_text(embedded_decoder, free):
    tok = embedded_decoder.tokenizer
    rng = random.Random(0)
    for (prompt, _), ids in free.items():
        text = tok.decode(ids)
        for stops in (stops_inside(tok, ids, rng), ["\u00e9t\u00e9 jamais"], [text[-3:]]):
            n = first_stop_tokens(tok, ids, stops)
            kept = ids if n is None else ids[:n]  # what the scheduler hands over
            st = StopText(tok, stops)
            pieces, i = [], 0
            while i < len(kept):  # rounds of 1 … 5 tokens
                step = rng.randint(1, 5)
                pieces.append(st.push(kept[i: i + step]))
                i += step
            pieces.append(st.finish())
            cut = StopStrings(stops).cut(tok.decode(kept))
            assert "".join(pieces) == cut and st.stopped == (n is not None), (prompt, stops)
            assert n is None or cut == text[: min(text.find(s) for s in stops if s in text)]
            seen = ""
            for piece in pieces:  # at no time does the handed-out text contain a stop string
                seen += piece
                assert StopStrings(stops).find(seen) is None


def test_tokens_through_is_the_fewest_tokens(embedded_decoder, free):
    tok = embedded_decoder.tokenizer
    rng = random.Random(1)
    for ids in free.values():
        stops = stops_inside(tok, ids, rng, n=3)
        assert StopStrings(stops).tokens_through(tok, ids) == first_stop_tokens(tok, ids, stops)
        assert StopStrings(["never-in-this-text"]).tokens_through(tok, ids) is None


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_generate_and_scheduler_stop_exactly_and_alone(embedded_decoder, free, temperature):
    dec, tok = embedded_decoder, embedded_decoder.tokenizer
    rng = random.Random(2)
    stops = {p: stops_inside(tok, free[(p, temperature)], rng) for p in PROMPTS[:2]}
    sched = RequestScheduler(dec)
    handles = [sched.submit(p, 60, temperature=temperature, seed=5, stop=stops.get(p)) for p in PROMPTS]
    sched.run_until_idle()
    for p, h in zip(PROMPTS, handles):
        ids = free[(p, temperature)]
        if p not in stops:  # no stop strings: unchanged by its neighbours' stops
            assert h.tokens == ids and h.finish_reason == "length"
            continue
        n = first_stop_tokens(tok, ids, stops[p])
        assert n is not None and h.tokens == ids[:n] and h.finish_reason == "stop", p
        alone = dec.generate([p], 60, temperature=temperature, seed=5, stop=stops[p])
        assert alone.tokens[0] == ids[:n]
        assert alone.texts[0] == StopStrings(stops[p]).cut(tok.decode(ids[:n]))
        assert not any(s in alone.texts[0] for s in stops[p])


def test_stop_strings_need_a_tokenizer(distilled_decoder):
    with pytest.raises(DSparkTrtError, match="need the target's tokenizer"):
        distilled_decoder.generate([[1, 2, 3]], 4, stop=["x"])
    with pytest.raises(DSparkTrtError, match="need the target's tokenizer"):
        RequestScheduler(distilled_decoder).submit([1, 2, 3], 4, stop=["x"])
