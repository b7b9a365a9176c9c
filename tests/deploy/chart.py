"""Render the Helm chart with the real helm binary and validate what it renders (tests/deploy/test_chart.py).

Built-in kinds: ``kubernetes_validate`` (its bundled schemas of Kubernetes ``KUBE_VERSION``, strict: unknown
fields refused). Custom resources: the ``openAPIV3Schema`` of the CRDs in ``crds/`` (SOURCES.md says where
each comes from), made strict the way ``kubectl apply --validate=strict`` treats a structural schema: an object
with ``properties`` takes no others unless it says ``x-kubernetes-preserve-unknown-fields``.
"""

from __future__ import annotations

import functools
import gzip
import os
import re
import shutil
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "dspark-serve"
CRDS = Path(__file__).parent / "crds"
GOLDEN = Path(__file__).parent / "golden"
KUBE_VERSION = "1.33.0"
RELEASE, NAMESPACE = "dspark", "inference"
# the value sets rendered and kept as golden output: None = the chart's defaults
VALUE_SETS = {"defaults": None, "cpu": "examples/cpu.yaml", "gpu": "examples/gpu.yaml",
              "kserve": "examples/kserve.yaml", "ingress": "examples/ingress.yaml"}


def helm_binary() -> str | None:
    return os.environ.get("DSPARK_HELM") or shutil.which("helm")


def helm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([helm_binary(), *args], capture_output=True, text=True, timeout=120)


def render(values_file: str | None, *extra: str) -> subprocess.CompletedProcess:
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION]
    if values_file:
        args += ["-f", str(CHART / values_file)]
    return helm(*args, *extra)


def documents(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d]


class Invalid(Exception):
    """One line: the object and what is wrong with it."""


def _strict(schema):
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if out.pop("nullable", False) and "type" in out:
        out["type"] = [out["type"], "null"]
    if out.pop("x-kubernetes-int-or-string", False) and "anyOf" not in out:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


@functools.cache
def crd_schemas() -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) → strict JSON schema, from every CRD in crds/."""
    out = {}
    for path in sorted(CRDS.glob("*.yaml.gz")):
        crd = yaml.safe_load(gzip.decompress(path.read_bytes()))
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            out[(f"{group}/{version['name']}", kind)] = _strict(version["schema"]["openAPIV3Schema"])
    return out


_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def validate(doc: dict) -> str:
    """Validate one rendered object; returns what validated it; raises ``Invalid``."""
    import jsonschema
    import kubernetes_validate

    what = f"{doc.get('kind')} {doc.get('metadata', {}).get('name')}"
    name = doc.get("metadata", {}).get("name", "")
    if not _DNS1123.match(name) or len(name) > 63:
        raise Invalid(f"{what}: metadata.name is not a DNS-1123 label")
    schema = crd_schemas().get((doc.get("apiVersion"), doc.get("kind")))
    if schema is not None:
        errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(doc), key=lambda e: list(e.path))
        if errors:
            e = errors[0]
            raise Invalid(f"{what}: {'.'.join(map(str, e.path)) or '(top)'}: {e.message}")
        return "crd"
    try:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
    except kubernetes_validate.SchemaNotFoundError:
        raise Invalid(f"{what}: no schema for {doc.get('apiVersion')} {doc.get('kind')} (neither built in nor a "
                      f"CRD in tests/deploy/crds)") from None
    except kubernetes_validate.ValidationError as e:
        raise Invalid(f"{what}: {'.'.join(map(str, e.path)) or '(top)'}: {e.message}") from None
    return "builtin"
