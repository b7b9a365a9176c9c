"""A real tritonserver (127.0.0.1, free ports) serving generated repositories for two exports.

One server per module: model ``dspark`` = the embedded pair's export (byte tokenizer: text in, text out),
model ``tiny`` = the random tiny pair's export (top-k 16, token ids only), written with ``copy`` (the repository
holds the export; its source is deleted and the model directory moved before the server starts). The server runs PyTriton's
bundled tritonserver from the managed server venv (built once, cached under ``$DSPARK_TRT_CACHE``; a few
minutes the first time). Every answer is compared with in-process ``SpeculativeDecoder.generate`` of the
same request alone (same export, onnxruntime, one thread on both sides).
"""

from __future__ import annotations

import random
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from tests.helpers import sigint_as_in_a_terminal
from dspark_trt.serving.client import (Answer, ServerError, grpc_generate, http_generate, http_generate_stream,
                                       request_inputs)

pytestmark = [pytest.mark.tritonserver, pytest.mark.onnx, pytest.mark.slow, pytest.mark.xdist_group("tritonserver")]

TEXTS = ["Speculative decoding", "A small drafter", "The target model checks", "tokens", "x",
         "Speculative decoding lets a small drafter guess several tokens ahead while", "the"]


@pytest.fixture(scope="module")
def embedded_export(tmp_path_factory):
    from types import SimpleNamespace

    from dspark_trt.testing.embedded import embedded_pair
    from tests.conftest import export_once

    drafter, target = embedded_pair()
    return export_once(tmp_path_factory, "export-embedded-fp32", SimpleNamespace(drafter=drafter, target=target),
                       dtype="fp32")


@pytest.fixture(scope="module")
def decoders(embedded_export, qwen3_topk_export):
    """In-process decoders for the two exports, as the server builds them."""
    from dspark_trt.runtime import SpeculativeDecoder

    return {name: SpeculativeDecoder.from_export(path, backend="onnxruntime", device="cpu", threads=1)
            for name, path in (("dspark", embedded_export), ("tiny", qwen3_topk_export))}


@pytest.fixture(scope="module")
def server(tmp_path_factory, embedded_export, qwen3_topk_export):
    from dspark_trt.serving.repository import write_model_repository
    from dspark_trt.serving.server import TritonServer

    root = tmp_path_factory.mktemp("triton")
    repo = write_model_repository(root / "repo", export_dir=embedded_export, threads=1)
    src = shutil.copytree(qwen3_topk_export, root / "tiny-export")
    other = write_model_repository(root / "other", export_dir=src, threads=1, model_name="tiny", copy=True)
    shutil.rmtree(src)  # model "tiny" serves its own copy (--copy) ...
    shutil.move(str(other / "tiny"), str(repo / "tiny"))  # ... from where it was moved to
    log = root / "tritonserver.log"
    srv = TritonServer(repo, log_file=log)
    start = time.perf_counter()
    srv.start(timeout=900)
    srv.startup_seconds = time.perf_counter() - start
    srv.log_path = log
    yield srv
    code = srv.stop()
    assert code == 0, f"tritonserver exit code {code}; see {log}"


def alone(decoders, model, prompt, max_tokens, temperature=0.0, seed=0):
    out = decoders[model].generate([prompt] if not isinstance(prompt, str) else prompt, max_tokens,
                                   temperature=temperature, seed=seed)
    return out.tokens[0], (out.texts[0] if out.texts else None)


def test_both_repositories_load_and_are_ready(server):
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(server.endpoints.http)
    assert client.is_server_ready()
    for model in ("dspark", "tiny"):
        assert client.is_model_ready(model)
        config = client.get_model_config(model)
        assert config["model_transaction_policy"]["decoupled"] is True
        assert config["instance_group"][0]["kind"] == "KIND_CPU"
    print(f"tritonserver ready in {server.startup_seconds:.1f} s")


def test_64_concurrent_requests_match_generate_alone(server, decoders):
    rng = random.Random(0)
    V = decoders["tiny"].target.vocab_size
    requests = []  # (protocol, model, prompt, max_tokens, temperature, seed)
    for i in range(64):
        temperature, seed = (0.0, 0) if i % 2 == 0 else (1.0, 1000 + i)
        max_tokens = rng.randint(4, 24)
        if i % 4 in (0, 1):  # HTTP generate, text in
            requests.append(("http", "dspark", rng.choice(TEXTS), max_tokens, temperature, seed))
        else:  # gRPC stream, token ids in, mixed lengths, both models
            model = "dspark" if i % 8 < 4 else "tiny"
            ids = [rng.randrange(32, 127) if model == "dspark" else rng.randrange(V) for _ in range(rng.randint(1, 30))]
            requests.append(("grpc", model, ids, max_tokens, temperature, seed))
    expected = [alone(decoders, m, p, n, t, s)[0] for _, m, p, n, t, s in requests]

    answers: list[Answer | None] = [None] * len(requests)
    grpc_idx = {m: [i for i, r in enumerate(requests) if r[0] == "grpc" and r[1] == m] for m in ("dspark", "tiny")}
    http_idx = [i for i, r in enumerate(requests) if r[0] == "http"]

    def run_grpc(model):
        batch = [request_inputs(requests[i][2], requests[i][3], temperature=requests[i][4], seed=requests[i][5])
                 for i in grpc_idx[model]]
        for i, a in zip(grpc_idx[model], grpc_generate(server.endpoints.grpc, model, batch)):
            answers[i] = a

    def run_http(i):
        _, model, prompt, n, t, s = requests[i]
        answers[i] = http_generate(server.endpoints.http, model, {"text_input": prompt, "max_tokens": n,
                                                                   "temperature": t, "seed": s})

    with ThreadPoolExecutor(max_workers=len(http_idx) + 2) as pool:
        futures = [pool.submit(run_grpc, m) for m in grpc_idx] + [pool.submit(run_http, i) for i in http_idx]
        for f in futures:
            f.result(timeout=600)
    for i, (req, exp, ans) in enumerate(zip(requests, expected, answers)):
        assert isinstance(ans, Answer), f"request {i}: {ans}"
        assert ans.ids == exp, f"request {i} {req[:2]}"
        assert ans.finish_reason in ("length", "stop") and len(exp) <= req[3]
    text_answers = [answers[i] for i in http_idx]
    assert all(a.text == decoders["dspark"].tokenizer.decode(a.ids) for a in text_answers)
    assert max(a.batch_size for a in answers) > 1  # in-flight batching happened
    assert any(a.accepted for a in answers) and all(a.drafted >= a.accepted for a in answers)


def test_streaming_arrives_in_order_and_concatenates_to_the_answer(server, decoders):
    prompt = "Speculative decoding lets"
    ids, text = alone(decoders, "dspark", prompt, 40, 1.0, 7)
    full = http_generate(server.endpoints.http, "dspark", {"text_input": prompt, "max_tokens": 40,
                                                           "temperature": 1.0, "seed": 7})
    assert full.ids == ids and full.text == text and len(full.chunks) == 1
    sse = http_generate_stream(server.endpoints.http, "dspark", {"text_input": prompt, "max_tokens": 40,
                                                                 "temperature": 1.0, "seed": 7, "stream": True})
    assert len(sse.chunks) > 2 and sse.ids == ids and sse.text == text
    (grpc,) = grpc_generate(server.endpoints.grpc, "dspark", [request_inputs(prompt, 40, temperature=1.0, seed=7,
                                                                             stream=True)])
    assert len(grpc.chunks) > 2 and grpc.ids == ids and grpc.text == text
    assert grpc.finish_reason == sse.finish_reason == full.finish_reason
    # in order: every chunk is the next slice of the answer (accepted tokens of one round, at most N + 1)
    N = decoders["dspark"].config.num_draft_tokens
    assert all(0 < len(c) <= N + 1 for c in grpc.chunks[:-1])


BAD_HTTP = [
    ({"max_tokens": 4}, "exactly one of"),  # missing input
    ({"text_input": "abc", "max_tokens": 0}, "max_tokens must be between 1 and"),
    ({"text_input": "abc", "max_tokens": 2**31}, "context of .* tokens minus the prompt, got -2147483648"),
    ({"text_input": "abc", "max_tokens": 4, "temperature": -1.0}, "temperature"),
    ({"input_ids": [1, 2560], "max_tokens": 4}, "outside the vocabulary"),
    ({"text_input": "abc"}, "max_tokens"),
    ({"text_input": "a" * 1_000_000, "max_tokens": 4}, "bytes"),
]


def test_bad_requests_get_errors_and_the_next_request_is_served(server, decoders):
    for payload, message in BAD_HTTP:
        with pytest.raises(ServerError, match=message) as e:
            http_generate(server.endpoints.http, "dspark", payload)
        assert e.value.status == 400, payload.keys()
    wrong_dtype = request_inputs([1, 2, 3], 4)
    wrong_dtype["max_tokens"] = np.array([4.0], dtype=np.float32)
    (err,) = grpc_generate(server.endpoints.grpc, "dspark", [wrong_dtype])
    assert isinstance(err, ServerError) and "datatype" in err.message.lower().replace("data-type", "datatype")
    (err,) = grpc_generate(server.endpoints.grpc, "tiny", [request_inputs([5, decoders["tiny"].target.vocab_size], 4)])
    assert isinstance(err, ServerError) and "outside the vocabulary" in err.message
    (err,) = grpc_generate(server.endpoints.grpc, "tiny", [request_inputs("text", 4)])
    assert isinstance(err, ServerError) and "tokenizer" in err.message
    # a client that hangs up mid-stream: the request is cancelled, the instance lives on
    part = http_generate_stream(server.endpoints.http, "dspark", {"text_input": "Speculative", "max_tokens": 2000,
                                                                  "stream": True}, stop_after=2)
    assert len(part.chunks) == 2 and part.finish_reason is None
    _wait_for_log(server, "1 cancelled")
    ids, text = alone(decoders, "dspark", "A small drafter", 16, 1.0, 3)
    after = http_generate(server.endpoints.http, "dspark", {"text_input": "A small drafter", "max_tokens": 16,
                                                            "temperature": 1.0, "seed": 3})
    assert after.ids == ids and after.text == text
    (tiny,) = grpc_generate(server.endpoints.grpc, "tiny", [request_inputs([7, 8, 9], 12)])
    assert tiny.ids == alone(decoders, "tiny", [7, 8, 9], 12)[0]


def _wait_for_log(server, needle: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if needle in server.log_path.read_text(errors="replace"):
            return
        time.sleep(0.2)
    raise AssertionError(f"{needle!r} never appeared in {server.log_path}")


def test_the_log_shows_batched_rounds(server):
    summaries = [line for line in server.log_path.read_text(errors="replace").splitlines() if "dspark:" in line
                 and "batch mean" in line]
    assert summaries
    assert max(int(line.rsplit("max ", 1)[1].split()[0].strip('"')) for line in summaries) > 1


def test_dspark_serve_prints_the_endpoints_and_stops_on_ctrl_c(tmp_path, qwen3_topk_export, decoders):
    import json
    import os
    import re
    import signal
    import subprocess
    import sys
    import urllib.request

    from dspark_trt.serving.repository import write_model_repository
    from dspark_trt.serving.server import PACKAGE_ROOT

    repo = write_model_repository(tmp_path / "repo", export_dir=qwen3_topk_export, threads=1)
    env = dict(os.environ, PYTHONPATH=str(PACKAGE_ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "dspark_trt.cli.main", "serve", str(repo), "--http-port", "0",
                             "--grpc-port", "0", "--metrics-port", "0", "--openai-port", "0"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            preexec_fn=sigint_as_in_a_terminal)
    try:
        lines = []
        deadline = time.monotonic() + 600
        while not (lines and lines[-1].startswith("serving;")) and time.monotonic() < deadline and proc.poll() is None:
            lines.append(proc.stdout.readline())
        text = "".join(lines)
        grpc = re.search(r"gRPC (\S+?),", text)
        assert grpc, f"no endpoints line: {text!r}"
        (answer,) = grpc_generate(grpc.group(1), "dspark", [request_inputs([3, 1, 4], 6)])
        assert answer.ids == alone(decoders, "tiny", [3, 1, 4], 6)[0]
        # the OpenAI front end serves this tokenizer-less model with token-id prompts
        openai_url = re.search(r"OpenAI API ready: (\S+)", text).group(1)
        request = urllib.request.Request(f"{openai_url}/completions", headers={"Content-Type": "application/json"},
                                         data=json.dumps({"model": "dspark", "prompt": [3, 1, 4], "max_tokens": 6,
                                                          "temperature": 0}).encode())
        with urllib.request.urlopen(request, timeout=120) as r:
            usage = json.loads(r.read())["usage"]
        assert usage["completion_tokens"] == len(answer.ids) and usage["prompt_tokens"] == 3
        proc.send_signal(signal.SIGINT)  # Ctrl-C: exit 130
        rest = proc.communicate(timeout=120)[0]
        assert proc.returncode == 130 and "stopped (exit code 0)" in rest, rest
    finally:
        if proc.poll() is None:
            proc.kill()
