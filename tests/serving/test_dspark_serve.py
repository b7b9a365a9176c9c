"""``dspark serve CHECKPOINT`` as a user runs it (a subprocess, real tritonserver, real clients on 127.0.0.1).

Two starts of the embedded demo pair's checkpoint with one export cache: the first exports and is then put
through a full queue (503, then served again), a killed model stub (readiness false, the one-line notice, a
restart, served again; a request in flight at that moment is answered 503 at once), a killed tritonserver (the
same, the server started again and its orphaned stub killed) and SIGTERM (exit 0); the
second reuses the cached export and, with --no-restart, exits 1 when the stub dies; a third, with no SOURCE (the
embedded default, as the README's serve row runs it), answers a chat through the official ``openai`` client and
stops on SIGINT (exit 130). Each start runs in a
process whose parent ignores SIGINT, as a script's background job does. No process may be left behind. The cache
is the run's ``serve_cache_dir`` (tests/conftest.py): the other tritonserver modules serve the export made here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

pytestmark = [pytest.mark.tritonserver, pytest.mark.onnx, pytest.mark.slow, pytest.mark.xdist_group("tritonserver")]

ANSWERS: dict[str, str] = {}  # the first start's greedy answer, compared with the second's


@pytest.fixture(scope="module")
def cache_dir(serve_cache_dir, tmp_path_factory):
    """The run's serve cache, whose export the other tritonserver modules then serve (``embedded_export``); a fresh
    one when an export is in it already (they ran first): the first start must export."""
    if any(serve_cache_dir.glob("exports/*/manifest.json")):
        return tmp_path_factory.mktemp("serve-cache")
    return serve_cache_dir


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class Serve:
    """A running ``dspark serve`` subprocess and what it printed."""

    def __init__(self, args: list[str], log):
        from dspark_trt.serving.server import PACKAGE_ROOT

        env = dict(os.environ, PYTHONPATH=str(PACKAGE_ROOT))
        # started outside the checkout: the model's stub must find dspark_trt without the working directory
        self.proc = subprocess.Popen([sys.executable, "-m", "dspark_trt.cli.main", "serve", *args], env=env,
                                     stdout=subprocess.PIPE, stderr=open(log, "ab"), text=True,
                                     preexec_fn=_ignore_sigint, cwd=Path(log).parent)
        self.lines: queue.Queue = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def wait_for(self, needle: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                continue
            if line is None:
                raise AssertionError(f"dspark serve exited ({self.proc.wait()}) before printing {needle!r}; it "
                                     f"printed {self.seen}")
            self.seen.append(line)
            if needle in line:
                return line
        raise AssertionError(f"no {needle!r} from dspark serve within {timeout:.0f} s; it printed {self.seen}")

    def drain(self) -> None:
        """Move what was printed so far into ``seen`` (for a failure's message)."""
        while True:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                return
            if line is None:
                return
            self.seen.append(line)

    def ready(self, timeout: float = 900) -> None:
        self.wait_for("serving;", timeout)
        text = "\n".join(self.seen)
        self.openai = re.search(r"OpenAI API ready: (\S+)", text).group(1)
        self.base = self.openai.removesuffix("/v1")

    def processes(self) -> list[int]:
        """The tritonserver under this dspark serve and its stubs."""
        server = _children(self.proc.pid)
        return server + [pid for s in server for pid in _children(s)]

    def stub(self) -> int:
        stubs = [p for p in self.processes() if _comm(p).startswith("triton_python") and _running(p)]
        assert len(stubs) == 1, stubs
        return stubs[0]

    def kill(self) -> None:
        """After a failure: everything it started too (a stub orphaned mid-reload never exits by itself)."""
        if self.proc.poll() is None:
            left = self.processes()
            self.proc.kill()
            self.proc.wait()
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
    return out


def _comm(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/comm").read().strip()
    except OSError:
        return ""


def _running(pid: int) -> bool:
    """Alive and not a zombie (a zombie is gone, only not yet reaped)."""
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


def post(serve: Serve, body: dict, timeout: float = 300) -> tuple[int, dict]:
    request = urllib.request.Request(f"{serve.openai}/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def health(serve: Serve) -> int | str:
    """/health's status, or why nothing answered (the front end must keep listening through a restart)."""
    try:
        with urllib.request.urlopen(f"{serve.base}/health", timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except urllib.error.URLError as e:
        return f"no answer ({e.reason})"


def wait_health(serve: Serve, status: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while (answer := health(serve)) != status:
        if time.monotonic() > deadline or isinstance(answer, str):
            serve.drain()
            raise AssertionError(f"/health answered {answer}, not {status}; dspark serve "
                                 f"{'exited ' + str(serve.proc.returncode) if serve.proc.poll() is not None else 'runs'}"
                                 f" and printed {serve.seen}")
        time.sleep(0.05)


def serve_args(cache_dir, tmp_path, *extra) -> list[str]:
    from dspark_trt.demo.pair import embedded_pair

    drafter, target = embedded_pair()
    return [str(drafter), "--target", str(target), "--cache-dir", str(cache_dir), "--openai-port", "0",
            "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0", "--threads", "1", "--exit-timeout", "3",
            "--log-file", str(tmp_path / "tritonserver.log"), *extra]


GOOD = {"model": "dspark", "prompt": "A small drafter", "max_tokens": 12, "temperature": 0}
LONG = {"model": "dspark", "prompt": "Speculative decoding", "max_tokens": 600, "temperature": 0}


def test_first_start_exports_and_survives_a_full_queue_and_a_dead_stub(cache_dir, tmp_path):
    serve = Serve(serve_args(cache_dir, tmp_path, "--max-batch-size", "1", "--max-queue", "1"), tmp_path / "err")
    try:
        serve.ready()
        assert any(line.startswith("exported ") for line in serve.seen), serve.seen
        status, answer = post(serve, GOOD)
        assert status == 200
        ANSWERS["good"] = answer["choices"][0]["text"]

        # queue full: one request decoding, one waiting, the others refused with 503; then served again
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(lambda _: post(serve, LONG), range(4)))
        statuses = [s for s, _ in results]
        assert statuses.count(503) >= 2 and statuses.count(200) >= 1, statuses
        busy = next(a for s, a in results if s == 503)["error"]
        assert "server busy" in busy["message"] and busy["type"] == "server_busy"
        status, answer = post(serve, GOOD)
        assert status == 200 and answer["choices"][0]["text"] == ANSWERS["good"]

        # the stub dies with a request in flight: not ready, that request answered 503, restarted, served again
        stub = serve.stub()
        with ThreadPoolExecutor(1) as pool:
            in_flight = pool.submit(post, serve, LONG, 60)
            time.sleep(0.5)
            os.kill(stub, signal.SIGKILL)
            wait_health(serve, 503, timeout=30)
            status, answer = in_flight.result(timeout=30)
        # Triton's Python backend may abort the whole server when a stub dies holding its shared-memory lock
        # (boost::interprocess::lock_exception): then the server is restarted instead of the model
        message = answer["error"]["message"]
        assert status == 503 and ("died" in message or "unreachable" in message), answer
        line = serve.wait_for("died", 30)
        assert (f"pid {stub}" in line or "tritonserver died" in line) and "restarting it" in line, line
        serve.wait_for("serving again", 300)
        wait_health(serve, 200, timeout=30)
        assert not _running(stub) and serve.stub() != stub
        status, answer = post(serve, GOOD)
        assert status == 200 and answer["choices"][0]["text"] == ANSWERS["good"]

        # tritonserver itself dies: not ready, its orphaned stub killed, started again behind the same front end
        server, stub = _children(serve.proc.pid), serve.stub()
        assert len(server) == 1, server
        os.kill(server[0], signal.SIGKILL)
        wait_health(serve, 503, timeout=30)
        line = serve.wait_for("tritonserver died", 30)
        assert "exit code -9" in line and "restarting it" in line, line
        serve.wait_for("serving again", 300)
        wait_health(serve, 200, timeout=30)
        assert not _running(stub), "the dead server's stub was left running"
        assert _children(serve.proc.pid) != server and serve.stub() != stub
        status, answer = post(serve, GOOD)
        assert status == 200 and answer["choices"][0]["text"] == ANSWERS["good"]

        processes = serve.processes()
        serve.proc.send_signal(signal.SIGTERM)
        assert serve.proc.wait(120) == 0
        assert not [p for p in processes if _running(p)], "processes left behind"
    finally:
        serve.kill()


def test_second_start_reuses_the_cached_export_and_no_restart_exits_1(cache_dir, tmp_path):
    assert "good" in ANSWERS, "run with the previous test (it fills the cache)"
    entries = sorted((cache_dir / "exports").iterdir())
    serve = Serve(serve_args(cache_dir, tmp_path, "--no-restart"), tmp_path / "err")
    try:
        start = time.perf_counter()
        serve.ready()
        seconds = time.perf_counter() - start
        reuse = next(line for line in serve.seen if "export" in line)
        assert reuse.startswith("reusing the cached export"), serve.seen
        assert sorted((cache_dir / "exports").iterdir()) == entries  # nothing new exported
        print(f"second start: ready in {seconds:.1f} s")
        status, answer = post(serve, GOOD)
        assert status == 200 and answer["choices"][0]["text"] == ANSWERS["good"]
        processes = serve.processes()
        os.kill(serve.stub(), signal.SIGKILL)
        line = serve.wait_for("died", 30)
        assert "--no-restart" in line
        assert serve.proc.wait(120) == 1
        assert not [p for p in processes if _running(p)], "processes left behind"
    finally:
        serve.kill()


def test_the_embedded_default_serves_chat_through_the_openai_client(cache_dir, tmp_path):
    """``dspark serve`` with no SOURCE (the demo pair: its byte tokenizer has no chat template) answers
    /v1/chat/completions through the official client, with dspark-trt's plain template; the answer is what
    in-process ``generate`` gives the rendered conversation."""
    openai = pytest.importorskip("openai")
    from dspark_trt.runtime import SpeculativeDecoder
    from dspark_trt.serving.chat_template import plain_chat_template

    serve = Serve(serve_args(cache_dir, tmp_path)[3:], tmp_path / "err")  # the options, no SOURCE and no --target
    try:
        serve.ready()
        ready = next(line for line in serve.seen if line.startswith("OpenAI API ready"))
        assert "chat: yes, dspark-trt's plain User/Assistant template" in ready, serve.seen
        export = next(line for line in serve.seen if "export" in line).split(" ")[-1]
        client = openai.OpenAI(base_url=serve.openai, api_key="unused", max_retries=0, timeout=300)
        messages = [{"role": "user", "content": "What does the verifier do?"}]
        r = client.chat.completions.create(model="dspark", messages=messages, max_tokens=16, temperature=0)
        decoder = SpeculativeDecoder.from_export(export, backend="onnxruntime", device="cpu", threads=1)
        prompt = decoder.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                       chat_template=plain_chat_template())
        assert prompt == "User: What does the verifier do?\nAssistant:"
        assert r.choices[0].message.content == decoder.generate(prompt, 16, temperature=0.0).texts[0]
        assert r.usage.prompt_tokens == len(prompt.encode())  # the byte tokenizer: one token per byte
        processes = serve.processes()
        serve.proc.send_signal(signal.SIGINT)
        assert serve.proc.wait(120) == 130
        assert not [p for p in processes if _running(p)], "processes left behind"
    finally:
        serve.kill()
