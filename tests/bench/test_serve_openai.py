"""dspark bench serve --openai: the acceptance length from two scrapes of the metrics endpoint."""

from __future__ import annotations

import pytest


def test_acceptance_from_two_metric_scrapes():
    from dspark_trt.bench.serve_openai import acceptance_from_metrics

    def scrape(rounds, accepted, other_model=(0, 0)):
        key = lambda name, model, instance: (name, frozenset({"model": model, "instance": instance}.items()))  # noqa
        return {key("dspark_request_rounds_total", "dspark", "dspark_0_0"): rounds[0],
                key("dspark_request_rounds_total", "dspark", "dspark_0_1"): rounds[1],
                key("dspark_accepted_tokens_total", "dspark", "dspark_0_0"): accepted[0],
                key("dspark_accepted_tokens_total", "dspark", "dspark_0_1"): accepted[1],
                key("dspark_request_rounds_total", "tiny", "tiny_0_0"): other_model[0],
                key("dspark_accepted_tokens_total", "tiny", "tiny_0_0"): other_model[1]}

    before = scrape((10, 5), (7, 1))
    after = scrape((30, 25), (27, 21), other_model=(100, 900))  # another model's rounds do not count
    assert acceptance_from_metrics(before, after) == pytest.approx(1 + 40 / 40)
    assert acceptance_from_metrics(before, before) is None
