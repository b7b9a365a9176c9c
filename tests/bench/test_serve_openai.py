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
    requests at each level, two rounds in alternating order, over kept connections, and the secured one is HTTPS
    and refuses requests without its key (checked by the run itself, against its own deployment). Structure and
    accounting only: no timing is asserted."""
    import json
    import os
    import subprocess
    import sys

    from dspark_trt.serving.server import PACKAGE_ROOT

    proc = subprocess.run([sys.executable, "-m", "dspark_trt.cli.main", "bench", "serve", str(embedded_export),
                           "--openai", "--secure", "--requests", "3", "--concurrency", "1", "2", "--max-tokens", "6", "--rounds", "2",
                           "--threads", "1", "--json"], capture_output=True, text=True, timeout=900, cwd=tmp_path,
                          env=dict(os.environ, PYTHONPATH=str(PACKAGE_ROOT)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout[proc.stdout.index("{"):])
    A, B = "openai", "openai_secure"
    # ABBA: the path that goes first alternates round by round
    assert [(r["clients"], r["round"], r["path"]) for r in report["rows"]] == [
        (1, 0, A), (1, 0, B), (1, 1, B), (1, 1, A), (2, 0, B), (2, 0, A), (2, 1, A), (2, 1, B)]
    rows = report["rows"]
    assert all(r["requests"] == 3 and r["tokens"] > 0 for r in rows)
    by = {(r["clients"], r["round"], r["path"]): r for r in rows}
    for c in ("1", "2"):  # the ratio: the median (of two: their mean) of the rounds' ratios
        rounds = [by[(int(c), k, B)]["tokens_per_second"] / by[(int(c), k, A)]["tokens_per_second"] for k in (0, 1)]
        assert report["secure_over_plain_rounds"][c] == pytest.approx(rounds)
        assert report["secure_over_plain"][c] == pytest.approx(sum(rounds) / 2)
    assert "openai_over_grpc" not in report
    # the warm-up opened each path's connections; the measured rounds reuse them (each response read to its end)
    assert sum(r["connections_opened"] for r in rows) <= 2 and all(r["connections_opened"] <= 1 for r in rows)
    for r in rows:  # every request cost CPU in the clients, the front end and the model; one client: batches of 1
        assert set(r["cpu_ms_per_request"]) == {"clients", "front_end", "model"}
        assert all(v >= 0 for v in r["cpu_ms_per_request"].values())
        assert r["batch_mean"] == 1.0 if r["clients"] == 1 else 1.0 <= r["batch_mean"] <= 2.0
    assert sum(r["cpu_ms_per_request"]["model"] for r in rows) > 0  # /proc counts in clock ticks (10 ms)
    assert set(report["cpu_ms_per_request"]["2"]) == {A, B}
    # one client at a time: every request is a batch of one on both deployments, so the answers must be equal
    assert report["secure_equal_to_plain"]["1"] == [6, 6]
    refusals = report["secure_refusals"]
    assert refusals["url"].startswith("https://127.0.0.1:")
    assert refusals["without_key"] == 401 and refusals["wrong_key"] == 401
    assert str(refusals["plain_http"]).startswith("refused")
    for name in ("openai", "openai_secure"):
        memory = report["peak_memory"][name]
        assert memory["processes"] >= 3 and memory["tree_sum_mib"] > memory["child_mib"] > 0  # + tritonserver, stub
