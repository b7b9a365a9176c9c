"""Request tensors → scheduler requests: every input checked, one-line errors; streamed text pieces."""

from __future__ import annotations

import numpy as np
import pytest

from dspark_trt.errors import DSparkTrtError
from dspark_trt.serving.protocol import INPUTS, IncrementalText, parse_request

V = 2560


def req(**tensors):
    base = {"input_ids": np.array([1, 2, 3], dtype=np.int64), "max_tokens": np.array([8], dtype=np.int32)}
    base.update(tensors)
    return {k: v for k, v in base.items() if v is not None}


def test_a_full_request_is_parsed():
    r = parse_request(req(temperature=np.array([0.7], np.float32), seed=np.array([9], np.int64),
                          stream=np.array([True]), end_id=np.array([5, 6], np.int64)), vocab_size=V)
    assert (r.prompt, r.max_tokens, r.seed, r.stream, r.end_id) == ([1, 2, 3], 8, 9, True, [5, 6])
    assert r.temperature == pytest.approx(0.7)
    assert r.submit_kwargs() == dict(max_new_tokens=8, temperature=r.temperature, seed=9, eos_token_id=[5, 6])


def test_defaults_and_text():
    r = parse_request({"text_input": np.array([b"h\xc3\xa9llo"], dtype=object),
                       "max_tokens": np.array([3], np.int32)}, vocab_size=V)
    assert (r.prompt, r.temperature, r.seed, r.stream, r.end_id) == ("héllo", 0.0, 0, False, None)


@pytest.mark.parametrize("tensors, message", [
    (req(input_ids=None), "exactly one of"),
    (req(text_input=np.array([b"x"], dtype=object)), "exactly one of"),
    (req(max_tokens=None), "missing input 'max_tokens'"),
    (req(max_tokens=np.array([0], np.int32)), "max_tokens must be between 1 and 2147483647"),
    (req(max_tokens=np.array([1.5], np.float32)), "must be an integer"),
    (req(max_tokens=np.array([2, 3], np.int32)), "exactly one value"),
    (req(input_ids=np.array([1, V], np.int64)), f"token id {V} outside"),
    (req(input_ids=np.array([-1], np.int64)), "token id -1 outside"),
    (req(input_ids=np.array([], np.int64)), "empty"),
    (req(input_ids=np.array([1.0], np.float32)), "integers"),
    (req(temperature=np.array([-0.5], np.float32)), "temperature"),
    (req(temperature=np.array([np.inf], np.float32)), "temperature"),
    (req(seed=np.array([-1], np.int64)), "seed"),
    (req(stream=np.array([1], np.int32)), "BOOL"),
    (req(end_id=np.array([V], np.int64)), "end_id"),
    (req(bogus=np.array([1])), "unknown input"),
    (req(top_p=np.array([0.0], np.float32)), r"top_p must be in \(0, 1\]"),
    (req(top_p=np.array([1.5], np.float32)), "top_p"),
    (req(top_p=np.array([np.nan], np.float32)), "top_p"),
    (req(top_k=np.array([-1], np.int32)), "top_k must be between 0"),
    (req(top_k=np.array([2.0], np.float32)), "integer"),
    (req(stop=np.array([b"a", b""], dtype=object)), "non-empty"),
    (req(stop=np.array([b"1", b"2", b"3", b"4", b"5"], dtype=object)), "at most 4"),
    (req(stop=np.array([b"\xff"], dtype=object)), "UTF-8"),
    ({"text_input": np.array([b"x" * 300_000], dtype=object), "max_tokens": np.array([1], np.int32)}, "bytes"),
    ({"text_input": np.array([b"\xff\xfe"], dtype=object), "max_tokens": np.array([1], np.int32)}, "UTF-8"),
    ({"text_input": np.array([b""], dtype=object), "max_tokens": np.array([1], np.int32)}, "empty"),
])
def test_bad_requests_name_the_problem(tensors, message):
    with pytest.raises(DSparkTrtError, match=message):
        parse_request(tensors, vocab_size=V)


def test_sampling_truncation_and_stop_strings():
    r = parse_request(req(top_p=np.array([0.9], np.float32), top_k=np.array([40], np.int32),
                          stop=np.array([b"###", "\u00e9\n".encode()], dtype=object)), vocab_size=V)
    assert (r.top_k, r.stop) == (40, ["###", "é\n"]) and r.top_p == pytest.approx(0.9)
    kwargs = r.submit_kwargs()
    assert kwargs["stop"] == ["###", "é\n"] and kwargs["top_k"] == 40 and kwargs["top_p"] == pytest.approx(0.9)
    plain = parse_request(req(stop=np.array([], dtype=object)), vocab_size=V)  # an empty list: no stop strings
    assert (plain.stop, plain.top_p, plain.top_k) == (None, 1.0, 0)
    assert set(plain.submit_kwargs()) == {"max_new_tokens", "temperature", "seed", "eos_token_id"}


def test_max_tokens_wrapped_by_http_names_the_real_limit():
    """Triton's HTTP endpoint wraps a JSON max_tokens of 2^31 into INT32 -2^31: say what the limit is."""
    wrapped = req(max_tokens=np.array([2**31], np.int64).astype(np.int32))
    with pytest.raises(DSparkTrtError, match=r"between 1 and this model's context of 4096 tokens minus the prompt, "
                                             r"got -2147483648 \(a value above 2147483647 wraps around"):
        parse_request(wrapped, vocab_size=V, max_context=4096)
    with pytest.raises(DSparkTrtError, match=r"between 1 and 2147483647 \(INT32\)"):
        parse_request(wrapped, vocab_size=V)


def test_every_declared_input_is_understood():
    full = req(temperature=np.array([1.0], np.float32), seed=np.array([1]), stream=np.array([False]),
               end_id=np.array([1]), stop=np.array([b"x"], dtype=object), top_p=np.array([0.5], np.float32),
               top_k=np.array([3], np.int32))
    assert set(full) == set(INPUTS) - {"text_input"}
    parse_request(full, vocab_size=V)


def test_incremental_text_holds_back_split_characters():
    from dspark_trt.synthetic.byte_tokenizer import write_byte_tokenizer

    import tempfile
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as d:
        write_byte_tokenizer(d)
        tok = AutoTokenizer.from_pretrained(d)
    ids = tok.encode("añb€ c", add_special_tokens=False)  # multi-byte characters span several byte tokens
    assert len(ids) > len("añb€ c")
    text = IncrementalText(tok)
    pieces = [text.push([t]) for t in ids] + [text.finish()]
    assert "".join(pieces) == tok.decode(ids) == "añb€ c"
    assert all("\ufffd" not in p for p in pieces)
    cut = IncrementalText(tok)
    assert cut.push(ids[:2]) == "a" and cut.finish() != ""  # an unfinished character comes out at the end
