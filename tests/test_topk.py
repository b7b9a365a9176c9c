"""The draft top-k's one encoding (``dspark_trt/topk.py``): K or None (dense) inside, "off" written, DEFAULT_TOPK
for "the drafter's own"; every surface reads it through ``parse_topk``."""

from __future__ import annotations

import copy
import json

import pytest

from dspark_trt.errors import DSparkTrtError
from dspark_trt.topk import DEFAULT_TOPK, parse_topk, resolve_topk, topk_text


@pytest.mark.parametrize("value, want", [("off", None), (" OFF ", None), (None, None), (16, 16), (" 4 ", 4)])
def test_every_spelling_reads_as_k_or_none(value, want):
    assert parse_topk(value) == want


@pytest.mark.parametrize("value", [0, "0", "-5", "many", "1.5", "", True])
def test_anything_else_is_one_message(value):
    with pytest.raises(DSparkTrtError, match=r"use an integer K >= 1 \(candidates per draft slot\) or 'off'"):
        parse_topk(value)


def test_zero_is_off_only_where_a_flag_always_took_it_so():
    assert parse_topk(0, zero_is_off=True) is None and parse_topk("0", zero_is_off=True) is None


def test_the_default_is_a_sentinel_never_none():
    assert resolve_topk(DEFAULT_TOPK, 512) == 512 and resolve_topk(None, 512) is None
    assert resolve_topk("off", 512) is None and resolve_topk(8, 512) == 8
    assert copy.deepcopy(DEFAULT_TOPK) is DEFAULT_TOPK and json.dumps(DEFAULT_TOPK) == '"default"'
    assert (topk_text(None), topk_text(16)) == ("off", "16")


def test_served_settings_write_off_and_leave_the_default_out(tmp_path):
    from dspark_trt.serving.settings import ModelSettings

    base = dict(export_dir=str(tmp_path), runtime="onnxruntime")
    assert "topk" not in ModelSettings(**base).to_parameters()
    assert ModelSettings.from_parameters(ModelSettings(**base).to_parameters()).topk is DEFAULT_TOPK
    dense = ModelSettings(**base, topk=None).to_parameters()
    assert dense["topk"] == "off" and ModelSettings.from_parameters(dense).topk is None
    assert ModelSettings.from_parameters({**dense, "topk": "0"}).topk is None  # repositories written before


def test_dspark_serve_passes_the_default_on_and_off_as_dense():
    from dspark_trt.serving.settings import ServeOptions

    assert ServeOptions().writer_options()["topk"] is DEFAULT_TOPK
    assert ServeOptions(topk=None).writer_options()["topk"] is None
    assert ServeOptions(topk=16).writer_options()["topk"] == 16
