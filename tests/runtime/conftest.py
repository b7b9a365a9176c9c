"""Runtime tests run torch on one thread (tiny models, 2 cores, 2 xdist workers); pairs come from tests/conftest.py."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _runtime_one_thread(one_thread):
    yield


@pytest.fixture(scope="session")
def distilled_decoder(distilled_pair):
    from tests.runtime.runtime_helpers import make_decoder

    return make_decoder(distilled_pair)


@pytest.fixture(scope="session")
def embedded_decoder():
    """The demo pair (byte tokenizer, English-like text) on torch fp32: for tests that need real text."""
    from dspark_trt.runtime import SpeculativeDecoder
    from dspark_trt.demo.pair import embedded_pair

    pair = embedded_pair()
    return SpeculativeDecoder.from_pretrained(pair.drafter, pair.target, dtype="fp32", device="cpu")
