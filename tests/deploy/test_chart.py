"""The Helm chart (deploy/helm/dspark-serve), rendered by the real helm binary (scripts/install_helm.py; CI
installs it) with its defaults and each example value set: helm lint --strict passes, every object validates
against Kubernetes' schemas or its CRD's (tests/deploy/chart.py), the output equals the golden render, the
`dspark serve` command line of every container parses with the real CLI parser, and bad values are refused by
values.schema.json (or the chart's own check). DSPARK_UPDATE_GOLDEN=1 rewrites the golden files."""

from __future__ import annotations

import copy
import difflib
import inspect
import os
import re

import pytest

from . import chart

pytestmark = pytest.mark.skipif(
    not chart.helm_binary() and not os.environ.get("CI"),
    reason="no helm binary: python scripts/install_helm.py installs the pinned one (CI does)")

SETS = list(chart.VALUE_SETS)


@pytest.fixture(scope="module")
def renders() -> dict[str, str]:
    assert chart.helm_binary(), "no helm binary: .ci/run installs it with scripts/install_helm.py"
    out = {}
    for name, values in chart.VALUE_SETS.items():
        r = chart.render(values)
        assert r.returncode == 0, f"{name}: helm template failed: {r.stderr.strip()}"
        out[name] = r.stdout
    return out


def test_helm_is_the_pinned_release():
    r = chart.helm("version", "--short")
    assert r.returncode == 0 and r.stdout.startswith("v4."), r.stdout + r.stderr


@pytest.mark.parametrize("name", SETS)
def test_lint_strict(name):
    values = chart.VALUE_SETS[name]
    r = chart.helm("lint", "--strict", str(chart.CHART), *(["-f", str(chart.CHART / values)] if values else []))
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("name", SETS)
def test_render_matches_golden(renders, name):
    golden = chart.GOLDEN / f"{name}.yaml"
    if os.environ.get("DSPARK_UPDATE_GOLDEN"):
        golden.write_text(renders[name])
    assert golden.exists(), f"no golden render {golden.name}: DSPARK_UPDATE_GOLDEN=1 writes it"
    diff = list(difflib.unified_diff(golden.read_text().splitlines(), renders[name].splitlines(),
                                     f"golden/{name}.yaml", "helm template", lineterm="", n=1))
    assert not diff, "the render differs from the golden file (DSPARK_UPDATE_GOLDEN=1 after checking):\n" + \
        "\n".join(diff[:60])


@pytest.mark.parametrize("name", SETS)
def test_render_validates(renders, name):
    docs = chart.documents(renders[name])
    kinds = sorted(d["kind"] for d in docs)
    how = {d["kind"]: chart.validate(d) for d in docs}
    if name == "kserve":
        assert {"ServingRuntime", "InferenceService"} <= set(kinds) and "Deployment" not in kinds, kinds
    else:
        assert {"Deployment", "Service"} <= set(kinds), kinds
    assert "crd" in how.values() and "builtin" in how.values() or name == "kserve", how


EXPECTED_KINDS = {
    "defaults": ["Deployment", "HorizontalPodAutoscaler", "PodDisruptionBudget", "PodMonitor", "PrometheusRule",
                 "Service"],
    "cpu": ["Deployment", "PodDisruptionBudget", "PrometheusRule", "Service", "ServiceMonitor"],
    "gpu": ["Deployment", "HTTPRoute", "HorizontalPodAutoscaler", "PodDisruptionBudget", "PodMonitor",
            "PrometheusRule", "Service"],
    "kserve": ["InferenceService", "PodMonitor", "PrometheusRule", "ServingRuntime"],
    "ingress": ["Deployment", "Ingress", "PersistentVolumeClaim", "PodDisruptionBudget", "PodMonitor",
                "PrometheusRule", "Service"],
}


@pytest.mark.parametrize("name", SETS)
def test_kinds(renders, name):
    assert sorted(d["kind"] for d in chart.documents(renders[name])) == EXPECTED_KINDS[name]


def _containers(doc):
    if doc["kind"] == "Deployment":
        return doc["spec"]["template"]["spec"]["containers"]
    if doc["kind"] == "ServingRuntime":
        return doc["spec"]["containers"]
    return []


@pytest.mark.parametrize("name", SETS)
def test_command_line_parses_with_dspark_serve(renders, name):
    from dspark_trt.cli.main import build_command_parser

    parser = build_command_parser("serve", "dspark serve")
    seen = 0
    for doc in chart.documents(renders[name]):
        for c in _containers(doc):
            assert c["command"] == ["dspark"] and c["args"][0] == "serve", c["command"] + c["args"][:1]
            try:
                args = parser.parse_args(c["args"][1:])
            except SystemExit:
                pytest.fail(f"{name}: `dspark {' '.join(c['args'])}` does not parse (stderr above)")
            assert args.host == "0.0.0.0" and args.metrics_host == "0.0.0.0"
            assert args.openai_port == c["ports"][0]["containerPort"]
            seen += 1
    assert seen == 1


@pytest.mark.parametrize("name", ["defaults", "gpu", "kserve"])
def test_termination_grace_covers_the_drain(renders, name):
    """SIGKILL comes terminationGracePeriodSeconds after the preStop hook starts: it must leave the drain its time."""
    for doc in chart.documents(renders[name]):
        spec = doc["spec"]["template"]["spec"] if doc["kind"] == "Deployment" else \
            doc["spec"]["predictor"] if doc["kind"] == "InferenceService" else None
        if spec is None:
            continue
        grace = spec["terminationGracePeriodSeconds"]
        c = (spec.get("containers") or [None])[0]
        args = c["args"] if c else next(_containers(d) for d in chart.documents(renders[name])
                                        if d["kind"] == "ServingRuntime")[0]["args"]
        drain = int(args[args.index("--drain-timeout") + 1])
        assert grace > drain + 5, (grace, drain)


def test_gpu_pods_ask_for_gpus_and_pin_the_engine_cache(renders):
    [dep] = [d for d in chart.documents(renders["gpu"]) if d["kind"] == "Deployment"]
    spec = dep["spec"]["template"]["spec"]
    c = spec["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    product = spec["nodeSelector"]["nvidia.com/gpu.product"]
    assert c["args"][c["args"].index("--cache-dir") + 1] == f"/models/cache/{product}"
    [cpu] = [d for d in chart.documents(renders["cpu"]) if d["kind"] == "Deployment"]
    cc = cpu["spec"]["template"]["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in cc["resources"].get("limits", {})
    assert cc["args"][cc["args"].index("--cache-dir") + 1] == "/models/cache/cpu"


def test_probes_use_liveness_and_readiness_endpoints(renders):
    [dep] = [d for d in chart.documents(renders["defaults"]) if d["kind"] == "Deployment"]
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["livenessProbe"]["httpGet"]["path"] == "/health/live"
    assert c["readinessProbe"]["httpGet"]["path"] == "/health/ready"
    assert c["startupProbe"]["httpGet"]["path"] == "/health/live"
    assert c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] >= 900  # an engine build


def test_hpa_metric_is_the_recorded_rule(renders):
    docs = chart.documents(renders["defaults"])
    [hpa] = [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"]
    [rule] = [d for d in docs if d["kind"] == "PrometheusRule"]
    records = {r["record"]: r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == "dspark_requests_waiting"
    assert "dspark_requests_queued" in records["dspark:requests_waiting:per_pod"]
    from dspark_trt.serving import metrics
    for expr in records.values():  # every series the rules read is one the served model exports
        for series in set(re.findall(r"\b(dspark_[a-z_]+)\{", expr)):
            assert f'"{series}"' in inspect.getsource(metrics), series


# --- the validator and the schema refuse what they should -------------------------------------------------

def test_validator_refuses_unknown_fields(renders):
    docs = chart.documents(renders["gpu"])
    for kind, where in [("Deployment", lambda d: d["spec"]["template"]["spec"]["containers"][0]),
                        ("PodMonitor", lambda d: d["spec"]["podMetricsEndpoints"][0]),
                        ("HTTPRoute", lambda d: d["spec"]["rules"][0])]:
        [doc] = [copy.deepcopy(d) for d in docs if d["kind"] == kind]
        where(doc)["portt"] = 1
        with pytest.raises(chart.Invalid, match="portt"):
            chart.validate(doc)
    [isvc] = [copy.deepcopy(d) for d in chart.documents(renders["kserve"]) if d["kind"] == "InferenceService"]
    isvc["spec"]["predictor"]["autoScaling"]["metrics"][0]["external"]["metric"]["backend"] = "statsd"
    with pytest.raises(chart.Invalid, match="statsd"):
        chart.validate(isvc)
    with pytest.raises(chart.Invalid, match="no schema"):
        chart.validate({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}})


BAD_VALUES = [
    ("batch 0", ["--set-json", "serve.maxBatchSize=0"], "/serve/maxBatchSize"),
    ("negative gpus", ["--set-json", "gpu.count=-1"], "/gpu/count"),
    ("unknown runtime", ["--set", "serve.runtime=torch"], "/serve/runtime"),
    ("relative source", ["--set", "model.source=models/drafter"], "/model/source"),
    ("unknown key", ["--set-json", "replicas=3"], "additional properties 'replicas'"),
    ("misspelt nested key", ["--set-json", "autoscaling.maxReplica=3"], "additional properties 'maxReplica'"),
    ("kserve without a model", ["--set-json", "kserve.enabled=true"], "/kserve/storageUri"),
    ("tensorrt without gpus", ["--set-json", "gpu.count=0", "--set", "serve.runtime=tensorrt"], "/serve/runtime"),
    ("grace shorter than the drain", ["--set-json", "terminationGracePeriodSeconds=20"], "must exceed"),
    ("gpus set in resources", ["--set-json", 'resources.limits={"nvidia.com/gpu":2}'], "/resources/limits"),
    ("route without a gateway", ["--set-json", "httpRoute.enabled=true"], "/httpRoute/parentRefs"),
    ("topk 0", ["--set", "serve.topk=0"], "/serve/topk"),
    ("scrape interval without a unit", ["--set", "monitoring.podMonitor.interval=15"], "/monitoring/podMonitor/interval"),
    ("port out of range", ["--set-json", "ports.openai=70000"], "/ports/openai"),
    ("storage size without a unit", ["--set", "model.volume.size=100"], "/model/volume/size"),
]


@pytest.mark.parametrize("case, args, message", BAD_VALUES, ids=[c[0] for c in BAD_VALUES])
def test_bad_values_are_refused(case, args, message):
    r = chart.render(None, *args)
    assert r.returncode != 0, f"{case}: rendered without complaint"
    assert message in r.stderr, r.stderr
