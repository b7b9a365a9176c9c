"""Replicas for real (issue 44): three `dspark serve` replicas of the embedded demo export (--threads 1) on
127.0.0.1 ports behind HAProxy (Debian's package; active health checks on /health/ready), driven by the
`openai` client at 16 concurrent streams: a rolling restart loses no request, a SIGKILLed replica costs at most
the requests in flight on it and none after it rejoined, and a SIGTERM drain completes every stream while the
draining replica refuses new requests with 503 + Retry-After and exits 0. The same code as `dspark bench
deploy` (dspark_trt/bench/deploy.py), at CI's size; the benchmark's figures are in docs/deploy.md."""

from __future__ import annotations

import os
import shutil

import pytest

pytestmark = [pytest.mark.tritonserver, pytest.mark.onnx, pytest.mark.slow, pytest.mark.xdist_group("tritonserver")]

HAPROXY = shutil.which("haproxy") or (os.path.exists("/usr/sbin/haproxy") and "/usr/sbin/haproxy")


@pytest.fixture(scope="module")
def cluster(embedded_export, tmp_path_factory):
    if not HAPROXY:
        if os.environ.get("CI"):
            pytest.fail("no haproxy binary: .ci/run installs Debian's haproxy package")
        pytest.skip("no haproxy binary (apt-get install haproxy; .ci/run installs it)")
    from dspark_trt.bench.deploy import Cluster

    workdir = tmp_path_factory.mktemp("replicas")
    with Cluster([str(embedded_export), "--threads", "1", "--drain-timeout", "30", "--exit-timeout", "3"], 3,
                 workdir) as c:
        yield c
    for r in c.replicas:  # nothing left behind
        assert r.proc.poll() is not None


@pytest.fixture
def load(cluster):
    from dspark_trt.bench.deploy import Load

    return Load(cluster.balancer.url, clients=16, max_tokens=16)


def test_rolling_restart_loses_no_request(cluster, load):
    from dspark_trt.bench.deploy import rolling

    row, met = rolling(cluster, load, 24, drain_timeout=30)
    assert met, row


def test_a_killed_replica_costs_only_its_requests_in_flight(cluster, load):
    from dspark_trt.bench.deploy import kill

    rows, met = kill(cluster, load, 24)
    assert met, rows


def test_sigterm_drains_every_stream_and_refuses_new_requests(cluster, load):
    from dspark_trt.bench.deploy import drain

    row, met = drain(cluster, load, drain_timeout=30)
    assert met, row
    assert any("drained in" in line for line in row["replica_said"]), row["replica_said"]
