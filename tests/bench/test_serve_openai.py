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


def test_secure_needs_openai():
    import argparse

    from dspark_trt.bench.serve import add_arguments, run
    from dspark_trt.errors import DSparkTrtError

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(DSparkTrtError, match="--secure goes with --openai"):
        run(parser.parse_args(["REPO", "--secure"]))


@pytest.mark.tritonserver
@pytest.mark.onnx
@pytest.mark.slow
@pytest.mark.xdist_group("tritonserver")
def test_secure_run_compares_plain_and_secured_front_ends(embedded_export, tmp_path):
    """``dspark bench serve EXPORT --openai --secure`` as a user runs it, tiny: both front ends answer the same
    requests at each level in alternating order, and the secured one is HTTPS and refuses requests without its
    key (checked by the run itself, against its own deployment). Structure only: no timing is asserted."""
    import json
    import os
    import subprocess
    import sys

    from dspark_trt.serving.server import PACKAGE_ROOT

    proc = subprocess.run([sys.executable, "-m", "dspark_trt.cli.main", "bench", "serve", str(embedded_export),
                           "--openai", "--secure", "--requests", "3", "--concurrency", "1", "2", "--max-tokens", "6",
                           "--threads", "1", "--json"], capture_output=True, text=True, timeout=900, cwd=tmp_path,
                          env=dict(os.environ, PYTHONPATH=str(PACKAGE_ROOT)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert [(r["clients"], r["path"]) for r in report["rows"]] == [
        (1, "openai"), (1, "openai_secure"), (2, "openai_secure"), (2, "openai")]  # the order alternates
    assert all(r["requests"] == 3 and r["tokens"] > 0 for r in report["rows"])
    assert set(report["secure_over_plain"]) == {"1", "2"} and all(v > 0 for v in report["secure_over_plain"].values())
    assert "openai_over_grpc" not in report
    # one client at a time: every request is a batch of one on both deployments, so the answers must be equal
    assert report["secure_equal_to_plain"]["1"] == [3, 3]
    refusals = report["secure_refusals"]
    assert refusals["url"].startswith("https://127.0.0.1:")
    assert refusals["without_key"] == 401 and refusals["wrong_key"] == 401
    assert str(refusals["plain_http"]).startswith("refused")
    for name in ("openai", "openai_secure"):
        memory = report["peak_memory"][name]
        assert memory["processes"] >= 3 and memory["tree_sum_mib"] > memory["child_mib"] > 0  # + tritonserver, stub
