"""``dspark bench deploy``: replicas for real. Three ``dspark serve`` processes on 127.0.0.1 ports behind HAProxy
(Debian's package: active health checks on each replica's /health/ready), driven by the ``openai`` client at 16
concurrent streams through the balancer, through three events:

  rolling   SIGTERM one replica at a time (it drains), start it again, wait until the balancer routes to it again
  kill      SIGKILL one replica under load: only requests in flight on it may fail; it is started again, rejoins,
            and every request sent after it rejoined must succeed
  drain     SIGTERM one replica while 16 streams run: every stream completes; a new request sent to the draining
            replica itself is refused with 503 and Retry-After; the replica exits 0
  throughput  tokens/s of each replica alone (16/3 streams straight to it), then of the three behind the
            balancer (16 streams): the goal is >= 0.9x the sum (on one host the replicas share its cores)

For each event it prints requests sent, completed and failed (with each failure's reason), and a line that
states the goal and whether it was met (exit 1 when one was not). Nothing is mocked: real servers, a real
balancer, the official client with its retries off (each failure is the balancer's or a replica's own answer).
``--requests`` sets the load of the rolling and kill events (the issue's benchmark: >= 200); the CI test runs a
small version (tests/deploy/test_replicas.py).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import DSparkTrtError

__all__ = ["Replica", "Balancer", "Load", "free_port", "haproxy_config", "add_arguments", "run"]

PROMPTS = ["Speculative decoding", "A small drafter", "The verifier accepts", "Triton serves", "Replicas behind"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 2.0) -> tuple[int, dict, dict]:
    """(status, JSON body or {}, headers) of a GET; status 0 when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"{}"), dict(r.headers)
    except urllib.error.HTTPError as e:
        try:
            body = json.loads(e.read() or b"{}")
        except ValueError:
            body = {}
        return e.code, body, dict(e.headers)
    except (OSError, ValueError):
        return 0, {}, {}


class Replica:
    """One ``dspark serve`` subprocess on a fixed OpenAI port (its Triton ports: any free ones)."""

    def __init__(self, name: str, port: int, serve_args: list[str], workdir: Path):
        self.name, self.port, self.serve_args, self.workdir = name, port, serve_args, workdir
        self.proc: subprocess.Popen | None = None
        self.lines: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "Replica":
        from ..serving.server import PACKAGE_ROOT

        env = dict(os.environ, PYTHONPATH=str(PACKAGE_ROOT))
        log = open(self.workdir / f"{self.name}.log", "ab")
        self.lines = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dspark_trt.cli.main", "serve", *self.serve_args, "--openai-port", str(self.port),
             "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0",
             "--log-file", str(self.workdir / f"{self.name}-tritonserver.log")],
            env=env, stdout=subprocess.PIPE, stderr=log, text=True, cwd=self.workdir, start_new_session=True)
        threading.Thread(target=self._read, args=(self.proc,), daemon=True).start()
        return self

    def _read(self, proc) -> None:
        for line in proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise DSparkTrtError(f"replica {self.name} exited ({self.proc.returncode}) while starting: "
                                     f"{' | '.join(self.lines[-3:])}")
            if _get(f"{self.url}/health/ready")[0] == 200:
                return
            time.sleep(0.2)
        raise DSparkTrtError(f"replica {self.name} not ready within {timeout:.0f} s")

    def in_flight(self) -> int | None:
        """Requests in flight on the replica (its /health/live), or None when it does not answer in 5 s (a loaded
        host: no answer is not zero)."""
        status, body, _ = _get(f"{self.url}/health/live", timeout=5.0)
        return int(body.get("in_flight", 0)) if status == 200 else None

    def wait_in_flight(self, at_least: int, timeout: float) -> int:
        """Poll until ``at_least`` requests are in flight on the replica (or ``timeout`` s pass); returns the last
        count it answered (0 if it never answered)."""
        deadline, seen = time.monotonic() + timeout, 0
        while time.monotonic() < deadline:
            n = self.in_flight()
            if n is not None:
                seen = n
                if n >= at_least:
                    break
            time.sleep(0.02)
        return seen

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def kill_all(self) -> None:
        """SIGKILL the replica; what it started (tritonserver, its stubs) dies with its session."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            self.proc.wait()

    def wait_exit(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            if self.wait_exit(20) is None:
                self.kill_all()
        if self.proc is not None:  # its process group: nothing may be left behind
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass


def haproxy_config(port: int, replicas: list[Replica], *, stats_socket: Path) -> str:
    servers = "\n".join(f"    server {r.name} 127.0.0.1:{r.port} check" for r in replicas)
    return f"""global
    maxconn 256
    stats socket {stats_socket} level admin
    log stderr format raw local0 info

defaults
    mode http
    log global
    # one line per request: the replica that answered, the status, the termination state, the retries
    log-format "%b/%s %ST %ts %rc"
    timeout connect 2s
    timeout client 300s
    timeout server 300s
    # a refused connection, or a 503 (a draining replica the checks have not caught yet, whose refusal comes
    # before any work), is retried once on another replica; anything after the answer started is not
    retries 2
    option redispatch 1
    retry-on conn-failure empty-response 503
    option http-buffer-request

frontend openai
    bind 127.0.0.1:{port}
    default_backend dspark

backend dspark
    balance leastconn
    option httpchk GET /health/ready
    http-check expect status 200
    # a replica whose check answers 503 (draining) is out at once; one slow to answer on a loaded host is not
    # (without `timeout check`, a check slower than `inter` counts as failed)
    timeout check 2s
    default-server inter 300ms fall 1 rise 2
{servers}
"""


class Balancer:
    """HAProxy (Debian's package) in the foreground, its config in ``workdir``."""

    def __init__(self, replicas: list[Replica], workdir: Path, port: int | None = None):
        self.binary = shutil.which("haproxy") or ("/usr/sbin/haproxy" if os.path.exists("/usr/sbin/haproxy") else None)
        if self.binary is None:
            raise DSparkTrtError("no haproxy binary: apt-get install haproxy (Debian's package)")
        self.port = port or free_port()
        self.replicas, self.workdir = replicas, workdir
        self.stats = workdir / "haproxy.sock"
        self.proc = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "Balancer":
        conf = self.workdir / "haproxy.cfg"
        conf.write_text(haproxy_config(self.port, self.replicas, stats_socket=self.stats))
        check = subprocess.run([self.binary, "-c", "-f", str(conf)], capture_output=True, text=True)
        if check.returncode != 0:
            raise DSparkTrtError(f"haproxy refused its config: {check.stdout.strip()} {check.stderr.strip()}")
        self.proc = subprocess.Popen([self.binary, "-db", "-f", str(conf)], stdout=subprocess.DEVNULL,
                                     stderr=open(self.workdir / "haproxy.log", "ab"))
        return self

    def up(self) -> set[str]:
        """The replicas the balancer routes to now (its health checks' view, from its stats socket)."""
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(str(self.stats))
                s.sendall(b"show stat\n")
                data = b""
                while chunk := s.recv(65536):
                    data += chunk
        except OSError:  # not listening yet
            return set()
        rows = [line.split(",") for line in data.decode().splitlines() if line and not line.startswith("#")]
        return {r[1] for r in rows if r[0] == "dspark" and r[1] not in ("BACKEND", "FRONTEND") and r[17] == "UP"}

    def retried(self) -> int:
        """Requests the balancer sent again to another replica so far (its log's retry counts)."""
        try:
            lines = (self.workdir / "haproxy.log").read_text(errors="replace").splitlines()
        except OSError:
            return 0
        return sum(1 for line in lines if re.search(r" \+?([1-9]\d*)$", line))

    def cut_by(self, name: str) -> int:
        """Requests on replica ``name`` that the server side ended before their answer did (its log's termination
        state starting with ``S``: the connection reset or closed by the replica), so far."""
        try:
            lines = (self.workdir / "haproxy.log").read_text(errors="replace").splitlines()
        except OSError:
            return 0
        return sum(1 for line in lines if re.match(rf"dspark/{re.escape(name)} \S+ S", line))

    def wait_up(self, names: set[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if names <= self.up():
                return
            time.sleep(0.1)
        raise DSparkTrtError(f"the balancer does not route to {sorted(names - self.up())} after {timeout:.0f} s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@dataclass
class Outcome:
    ok: bool
    started: float
    ended: float
    tokens: int = 0
    why: str = ""


@dataclass
class Load:
    """Streamed completions through ``base_url`` with the ``openai`` client (its retries off), ``clients`` at once."""

    base_url: str
    clients: int = 16
    max_tokens: int = 24
    outcomes: list[Outcome] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def one(self, i: int, max_tokens: int | None = None) -> Outcome:
        import openai

        client = openai.OpenAI(base_url=f"{self.base_url}/v1", api_key="none", max_retries=0, timeout=120)
        begin = time.monotonic()
        tokens, finished = 0, False
        try:
            stream = client.completions.create(model="dspark", prompt=PROMPTS[i % len(PROMPTS)], stream=True,
                                               max_tokens=max_tokens or self.max_tokens, temperature=0,
                                               stream_options={"include_usage": True})
            for chunk in stream:
                if chunk.usage is not None:
                    tokens = chunk.usage.completion_tokens
                if chunk.choices and chunk.choices[0].finish_reason:
                    finished = True
            out = Outcome(finished, begin, time.monotonic(), tokens,
                          "" if finished else "the stream ended without a finish_reason")
        except Exception as e:  # every failure, as the client reports it
            msg = getattr(e, "message", None) or str(e)
            status = getattr(e, "status_code", None)
            out = Outcome(False, begin, time.monotonic(), tokens,
                          f"{type(e).__name__}{f' {status}' if status else ''}: {msg}"[:160])
        with self._lock:
            self.outcomes.append(out)
        return out

    def run(self, count: int, *, during=None, max_tokens: int | None = None) -> list[Outcome]:
        """Send ``count`` requests, ``clients`` at a time; ``during()`` runs beside them (an event), then waits."""
        start = len(self.outcomes)
        with ThreadPoolExecutor(self.clients + 1) as pool:
            event = pool.submit(during) if during is not None else None
            list(pool.map(lambda i: self.one(i, max_tokens), range(count)))
            if event is not None:
                event.result()
        return self.outcomes[start:]


def summary(label: str, outcomes: list[Outcome]) -> dict:
    failed = [o for o in outcomes if not o.ok]
    reasons: dict[str, int] = {}
    for o in failed:
        key = re.sub(r"\d+\.\d+ s|chatcmpl-\S+|cmpl-\S+", "…", o.why)
        reasons[key] = reasons.get(key, 0) + 1
    return {"event": label, "sent": len(outcomes), "completed": len(outcomes) - len(failed), "failed": len(failed),
            "why": reasons}


def _print(row: dict, goal: str, met: bool) -> None:
    why = "; ".join(f"{n}× {w}" for w, n in row["why"].items()) or "-"
    retried = f"; the balancer retried {row['retried_by_balancer']} on another replica" \
        if "retried_by_balancer" in row else ""
    print(f"{row['event']:<8} sent {row['sent']:>4}  completed {row['completed']:>4}  failed {row['failed']:>3}  "
          f"({why}{retried})", flush=True)
    print(f"{'':<8} goal: {goal}: {'met' if met else 'NOT MET'}", flush=True)


class Cluster:
    """N replicas and the balancer, started together, always stopped (a context manager)."""

    def __init__(self, serve_args: list[str], replicas: int = 3, workdir: Path | None = None):
        self._tmp = None
        if workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="dspark-deploy-")
            workdir = Path(self._tmp.name)
        self.workdir = workdir
        self.replicas = [Replica(f"r{i}", free_port(), serve_args, workdir) for i in range(replicas)]
        self.balancer = Balancer(self.replicas, workdir)

    def __enter__(self) -> "Cluster":
        try:
            for r in self.replicas:
                r.start()
            for r in self.replicas:
                r.wait_ready(900)
            self.balancer.start()
            self.balancer.wait_up({r.name for r in self.replicas}, 30)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.balancer.stop()
        for r in self.replicas:
            r.stop()
        if self._tmp is not None:
            self._tmp.cleanup()

    def restart(self, r: Replica, timeout: float = 900) -> None:
        r.start().wait_ready(timeout)
        self.balancer.wait_up({r.name}, 30)


def rolling(cluster: Cluster, load: Load, requests: int, drain_timeout: float) -> tuple[dict, bool]:
    codes = []
    retried = cluster.balancer.retried()

    def restart_each():
        time.sleep(1.0)
        for r in cluster.replicas:
            r.signal(signal.SIGTERM)
            codes.append(r.wait_exit(drain_timeout + 30))
            cluster.restart(r)

    row = summary("rolling", load.run(requests, during=restart_each))
    row["exit_codes"] = codes
    row["retried_by_balancer"] = cluster.balancer.retried() - retried
    met = row["failed"] == 0 and codes == [0] * len(cluster.replicas)
    _print(row, f"0 failed of {row['sent']}, each replica drained and exited 0 (exit codes {codes})", met)
    return row, met


def kill(cluster: Cluster, load: Load, requests: int) -> tuple[list[dict], bool]:
    """SIGKILL a replica under load. The goal: every failed request is one the killed replica was serving, counted
    by the balancer (its log's requests on that replica cut by the server side), not only the replica's own
    in-flight figure read just before the kill, which a request arriving in between outruns on a loaded host."""
    victim = cluster.replicas[0]
    seen = {}

    def kill_one():
        seen["in_flight"] = victim.wait_in_flight(3, 60)  # wait until it carries load
        seen["at"] = time.monotonic()
        victim.kill_all()
        cluster.restart(victim)
        seen["rejoined"] = time.monotonic()

    cluster.balancer.wait_up({r.name for r in cluster.replicas}, 30)  # every replica takes its share
    retried, cut = cluster.balancer.retried(), cluster.balancer.cut_by(victim.name)
    outcomes = load.run(requests, during=kill_one, max_tokens=2 * load.max_tokens)
    during = summary("kill", outcomes)
    during["retried_by_balancer"] = cluster.balancer.retried() - retried
    during["cut_on_killed_replica"] = cluster.balancer.cut_by(victim.name) - cut
    # the requests sent after the killed replica rejoined the balancer
    after = load.run(max(requests // 4, 2 * load.clients))
    row_after = summary("after", after)
    during["in_flight_at_kill"] = seen.get("in_flight")
    only_its_own = during["failed"] <= during["cut_on_killed_replica"]
    met = only_its_own and row_after["failed"] == 0
    _print(during, f"failures ({during['failed']}) <= requests the killed replica was serving "
                   f"({during['cut_on_killed_replica']}; {seen.get('in_flight')} in flight just before the kill)",
           only_its_own)
    _print(row_after, "every request after it rejoined succeeds", row_after["failed"] == 0)
    return [during, row_after], met


def drain(cluster: Cluster, load: Load, drain_timeout: float) -> tuple[dict, bool]:
    victim = cluster.replicas[1]
    refused = {}

    def sigterm_mid_streams():
        refused["in_flight"] = victim.wait_in_flight(3, 60)  # the count it answered, not a second probe's
        victim.signal(signal.SIGTERM)
        # until the replica says it drains (on a loaded host it takes the signal late, and a probe that times out
        # is no answer: status 0 goes on polling) or it has exited
        until = time.monotonic() + 20
        while time.monotonic() < until and victim.proc.poll() is None and \
                _get(f"{victim.url}/health/ready", timeout=5.0)[0] != 503:
            time.sleep(0.02)
        status, body, headers = _post(f"{victim.url}/v1/completions",
                                      {"model": "dspark", "prompt": "late", "max_tokens": 4})
        ready = _answered(f"{victim.url}/health/ready", victim)
        retry_after = next((v for k, v in headers.items() if k.lower() == "retry-after"), None)
        refused.update(status=status, retry_after=retry_after, ready=ready)
        refused["exit"] = victim.wait_exit(drain_timeout + 30)

    cluster.balancer.wait_up({r.name for r in cluster.replicas}, 30)  # the victim gets its share of the streams
    retried = cluster.balancer.retried()
    row = summary("drain", load.run(load.clients, during=sigterm_mid_streams, max_tokens=4 * load.max_tokens))
    row["retried_by_balancer"] = cluster.balancer.retried() - retried
    said = [line for line in victim.lines if "drain" in line]
    cluster.restart(victim)
    row.update(refused, replica_said=said)
    met = (row["failed"] == 0 and refused.get("status") == 503 and refused.get("retry_after") is not None
           and refused.get("ready") == 503 and refused.get("exit") == 0 and (refused.get("in_flight") or 0) > 0)
    _print(row, f"all {row['sent']} streams complete ({refused.get('in_flight')} on the draining replica); a new "
                f"request to it: {refused.get('status')} (Retry-After {refused.get('retry_after')}); /health/ready "
                f"{refused.get('ready')}; exit {refused.get('exit')}", met)
    for line in said:
        print(f"{'':<8} {victim.name}: {line}", flush=True)
    return row, met


def throughput(cluster: Cluster, clients: int, requests_per_replica: int, max_tokens: int) -> tuple[dict, bool]:
    """Tokens/s of each replica alone (straight to it, ``clients`` / replicas streams), then of all of them behind
    the balancer at ``clients`` streams: the goal is >= 0.9x the sum of the alone figures."""
    per = max(1, round(clients / len(cluster.replicas)))

    def rate(base_url: str, count: int, streams: int) -> tuple[float, int]:
        load = Load(base_url, clients=streams, max_tokens=max_tokens)
        t0 = time.monotonic()
        out = load.run(count)
        wall = time.monotonic() - t0
        return sum(o.tokens for o in out if o.ok) / wall, sum(not o.ok for o in out)

    alone = [rate(r.url, requests_per_replica, per) for r in cluster.replicas]
    # all of them at once, each straight to its replica (no balancer): what the host allows three replicas
    with ThreadPoolExecutor(len(cluster.replicas)) as pool:
        t0 = time.monotonic()
        straight = list(pool.map(lambda r: Load(r.url, clients=per, max_tokens=max_tokens).run(requests_per_replica),
                                 cluster.replicas))
        direct = sum(o.tokens for out in straight for o in out if o.ok) / (time.monotonic() - t0)
    together, failed = rate(cluster.balancer.url, requests_per_replica * len(cluster.replicas),
                            per * len(cluster.replicas))
    total = sum(a for a, _ in alone)
    ratio = together / total if total else 0.0
    row = {"event": "throughput", "alone_tokens_per_s": [round(a, 1) for a, _ in alone],
           "straight_tokens_per_s": round(direct, 1), "together_tokens_per_s": round(together, 1),
           "ratio": round(ratio, 2), "balancer_ratio": round(together / direct, 2) if direct else 0.0,
           "failed": failed + sum(f for _, f in alone) + sum(not o.ok for out in straight for o in out),
           "cores": os.cpu_count()}
    print(f"throughput alone ({per} streams each): {', '.join(f'{a:.1f}' for a, _ in alone)} tokens/s (sum "
          f"{total:.1f}); all at once, straight to each: {direct:.1f}; all at once behind haproxy "
          f"({per * len(cluster.replicas)} streams): {together:.1f} tokens/s ({row['balancer_ratio']:.2f}x straight)",
          flush=True)
    met = ratio >= 0.9 and row["failed"] == 0
    print(f"{'':<8} goal: together >= 0.9x the sum alone: {ratio:.2f}x on {os.cpu_count()} cores for "
          f"{len(cluster.replicas)} replicas: {'met' if met else 'NOT MET'}", flush=True)
    return row, met


def _answered(url: str, replica, tries: int = 4) -> int:
    """The status of a GET that the replica answers: a probe that times out on a loaded host is asked again (while
    the replica runs), up to ``tries`` times; 0 if it never answers."""
    for _ in range(tries):
        status = _get(url, timeout=5.0)[0]
        if status or replica.proc.poll() is not None:
            return status
    return 0


def _post(url: str, body: dict, timeout: float = 10.0) -> tuple[int, dict, dict]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"{}"), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, {}, dict(e.headers)
    except OSError:
        return 0, {}, {}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", nargs="?", metavar="SOURCE",
                   help="what each replica serves (default: the embedded demo pair, as `dspark serve` with no SOURCE)")
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--clients", type=int, default=16, help="concurrent streams through the balancer (default 16)")
    p.add_argument("--requests", type=int, default=200, help="requests of the rolling and kill events (default 200)")
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--threads", type=int, default=1, help="--threads of each replica (default 1)")
    p.add_argument("--drain-timeout", type=float, default=30.0)
    p.add_argument("--events", default="rolling,kill,drain,throughput",
                   help="which events, in order (default: rolling,kill,drain,throughput)")
    p.add_argument("--workdir", type=Path, help="keep the replicas' and the balancer's logs here")


def run(args: argparse.Namespace) -> int:
    serve_args = ([args.source] if args.source else []) + [
        "--threads", str(args.threads), "--drain-timeout", str(args.drain_timeout), "--exit-timeout", "3"]
    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
    events = [e.strip() for e in args.events.split(",") if e.strip()]
    unknown = set(events) - {"rolling", "kill", "drain", "throughput"}
    if unknown:
        raise DSparkTrtError(f"--events takes rolling, kill, drain and throughput, got {sorted(unknown)}")
    import logging

    for handler in logging.getLogger().handlers:  # not the openai client's (httpx's) line per request
        handler.addFilter(lambda record: not record.name.startswith("httpx"))
    begin = time.monotonic()
    results, ok = [], True
    with Cluster(serve_args, args.replicas, args.workdir) as cluster:
        print(f"{args.replicas} replicas ready behind haproxy {cluster.balancer.url} "
              f"({time.monotonic() - begin:.0f} s); {args.clients} concurrent streams, {args.max_tokens} tokens each",
              flush=True)
        load = Load(cluster.balancer.url, clients=args.clients, max_tokens=args.max_tokens)
        for event in events:
            t0 = time.monotonic()
            if event == "rolling":
                row, met = rolling(cluster, load, args.requests, args.drain_timeout)
            elif event == "kill":
                row, met = kill(cluster, load, args.requests)
            elif event == "throughput":
                row, met = throughput(cluster, args.clients, max(args.requests // 10, 8), args.max_tokens)
            else:
                row, met = drain(cluster, load, args.drain_timeout)
            ok &= met
            results.append(row)
            print(f"{'':<8} ({time.monotonic() - t0:.0f} s)", flush=True)
    print(f"total: {time.monotonic() - begin:.0f} s; {'every goal met' if ok else 'a goal was NOT met'}", flush=True)
    return 0 if ok else 1
