"""A real tritonserver (127.0.0.1, free ports) serving generated repositories for two exports.

One server per module: model ``dspark`` = the embedded pair's export (byte tokenizer: text in, text out),
model ``tiny`` = the random tiny pair's export (top-k 16, token ids only), two instances, written with ``copy``
(the repository holds the export; its source is deleted and the model directory moved before the server
starts), model ``busy`` = the same export with one batch row and ``max_queue`` 1, model ``rnn`` = an RNN-Markov-head
export (bonus-anchor, reduced draft vocabulary), model ``gemma4`` = a Gemma-4 target export (sliding layers holding
a ring, a Qwen3-layer stand-in drafter). The server runs with the
testing fault ``DSPARK_TRT_FAULT_POSITION=FAULT_AT`` (rounds of a request at that position or beyond raise;
every other test stays far below it). The server runs PyTriton's
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

FAULT_AT = 300  # DSPARK_TRT_FAULT_POSITION of the module's server
TEXTS = ["Speculative decoding", "A small drafter", "The target model checks", "tokens", "x",
         "Speculative decoding lets a small drafter guess several tokens ahead while", "the"]


@pytest.fixture(scope="module")
def decoders(embedded_export, qwen3_topk_export, rnn_topk_export, gemma4_export):
    """In-process decoders for the exports, as the server builds them."""
    from dspark_trt.runtime import SpeculativeDecoder

    return {name: SpeculativeDecoder.from_export(path, backend="onnxruntime", device="cpu", threads=1)
            for name, path in (("dspark", embedded_export), ("tiny", qwen3_topk_export), ("rnn", rnn_topk_export),
                               ("gemma4", gemma4_export))}


@pytest.fixture(scope="module")
def server(tmp_path_factory, embedded_export, qwen3_topk_export, rnn_topk_export, gemma4_export):
    import os

    from dspark_trt.serving.repository import write_model_repository
    from dspark_trt.serving.server import TritonServer
    from dspark_trt.serving.faults import FAULT_POSITION_ENV

    root = tmp_path_factory.mktemp("triton")
    repo = write_model_repository(root / "repo", export_dir=embedded_export, threads=1)
    src = shutil.copytree(qwen3_topk_export, root / "tiny-export")
    other = write_model_repository(root / "other", export_dir=src, threads=1, model_name="tiny", copy=True,
                                   instances=2)
    shutil.rmtree(src)  # model "tiny" serves its own copy (--copy) ...
    shutil.move(str(other / "tiny"), str(repo / "tiny"))  # ... from where it was moved to
    busy = write_model_repository(root / "busy", export_dir=qwen3_topk_export, threads=1, model_name="busy",
                                  max_batch_size=1, max_queue=1)
    shutil.move(str(busy / "busy"), str(repo / "busy"))
    rnn = write_model_repository(root / "rnn", export_dir=rnn_topk_export, threads=1, model_name="rnn")
    shutil.move(str(rnn / "rnn"), str(repo / "rnn"))  # an RNN Markov head (issue 42): DSparkTopKMarkovRNN
    gemma4 = write_model_repository(root / "gemma4", export_dir=gemma4_export, threads=1, model_name="gemma4")
    shutil.move(str(gemma4 / "gemma4"), str(repo / "gemma4"))  # a Gemma-4 target (issue 46): windowed ring caches
    log = root / "tritonserver.log"
    srv = TritonServer(repo, log_file=log)
    start = time.perf_counter()
    os.environ[FAULT_POSITION_ENV] = str(FAULT_AT)  # read by the server process it starts
    try:
        srv.start(timeout=900)
    finally:
        del os.environ[FAULT_POSITION_ENV]
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
    for model, instances in (("dspark", 1), ("tiny", 2), ("busy", 1), ("rnn", 1), ("gemma4", 1)):
        assert client.is_model_ready(model)
        config = client.get_model_config(model)
        assert config["model_transaction_policy"]["decoupled"] is True
        assert config["instance_group"][0]["kind"] == "KIND_CPU"
        assert config["instance_group"][0]["count"] == instances
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


def test_an_rnn_head_model_serves_concurrent_requests_as_generate_alone(server, decoders):
    """A drafter with an RNN Markov head (its DSparkTopKMarkovRNN node through the local function) in a real
    Triton model: concurrent greedy and sampled requests, batched by the scheduler, each as generate alone."""
    rng = random.Random(7)
    cases = [([rng.randrange(1, 256) for _ in range(rng.randrange(2, 9))], rng.choice([0.0, 1.0]), i)
             for i in range(6)]

    answers = grpc_generate(server.endpoints.grpc, "rnn", [request_inputs(ids, 12, temperature=t, seed=seed)
                                                           for ids, t, seed in cases])  # one stream, all at once
    for (ids, temperature, seed), answer in zip(cases, answers):
        assert isinstance(answer, Answer), answer
        assert answer.ids == alone(decoders, "rnn", ids, 12, temperature, seed)[0]


def test_a_gemma4_model_serves_concurrent_greedy_requests_as_generate_alone(server, decoders):
    """A Gemma-4 target export (5 sliding layers of window 8, each request's ring 71 tokens, 1 global layer) in a
    real Triton model: two waves of greedy requests on two gRPC streams, the second sent while the first decodes
    (so its requests join the running batch between rounds: joined rings and global slots, finished rows
    dropped), prompts shorter and longer than the window and the ring; each answer == generate alone."""
    rng = random.Random(11)
    V = decoders["gemma4"].target.vocab_size
    waves = [[(90, 48), (5, 60), (17, 40)], [(1, 16), (40, 12), (9, 18)]]
    cases = [[([rng.randrange(V) for _ in range(n)], m) for n, m in wave] for wave in waves]

    def send(w):
        time.sleep(0.2 * w)
        return grpc_generate(server.endpoints.grpc, "gemma4", [request_inputs(ids, m) for ids, m in cases[w]])

    with ThreadPoolExecutor(max_workers=2) as pool:
        answers = [a for wave in pool.map(send, range(2)) for a in wave]
    for (ids, max_tokens), answer in zip([c for wave in cases for c in wave], answers):
        assert isinstance(answer, Answer), answer
        assert answer.ids == alone(decoders, "gemma4", ids, max_tokens)[0]
        assert answer.finish_reason in ("length", "stop")
    assert max(a.batch_size for a in answers) > 1  # in-flight batching happened
    print(f"gemma4 batch sizes seen: {[a.batch_size for a in answers]}")


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
    """The model logs its scheduler's cumulative summary at most every 5 s while busy (and when idle): after
    concurrent requests, a summary shows rounds of more than one request. A summary is only written when a request
    finishes, per model instance, so every 6 s (up to a minute) a burst of 8 concurrent requests — not relying on
    another test's, which an instance may have served without logging since — gets batched rounds logged."""
    def burst():
        with ThreadPoolExecutor(max_workers=8) as pool:
            texts = [TEXTS[i % len(TEXTS)] for i in range(8)]
            for f in [pool.submit(http_generate, server.endpoints.http, "dspark", {"text_input": t, "max_tokens": 8})
                      for t in texts]:
                f.result(timeout=300)

    deadline = time.monotonic() + 60
    while True:
        summaries = [line for line in server.log_path.read_text(errors="replace").splitlines() if "dspark:" in line
                     and "batch mean" in line]
        largest = max((int(line.rsplit("max ", 1)[1].split()[0].strip('"')) for line in summaries), default=0)
        if largest > 1 or time.monotonic() > deadline:
            break
        time.sleep(6)
        burst()
    assert summaries and largest > 1, summaries[-3:]


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
                            stdout=subprocess.PIPE, stderr=open(tmp_path / "stderr.txt", "wb"), text=True,
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
        log = (tmp_path / "stderr.txt").read_text(errors="replace")  # tritonserver's output, filtered
        assert "Started GRPCInferenceService" in log and "CudaDriverHelper has not been initialized" not in log
        assert log.count("harmless on a host without a GPU") <= 1
    finally:
        if proc.poll() is None:
            proc.kill()


def _metric(samples, name, model, **labels) -> float:
    """Sum of ``name`` over the model's instances (and the given labels)."""
    return sum(v for (n, ls), v in samples.items() if n == name and dict(ls).get("model") == model
               and all(dict(ls).get(k) == w for k, w in labels.items()))


def _scrape(server):
    from dspark_trt.serving.client import scrape_metrics

    return scrape_metrics(server.endpoints.metrics, "dspark_")


def test_stop_strings_and_truncated_sampling_equal_generate(server, decoders):
    dec, prompt = decoders["dspark"], "Speculative decoding lets"
    free = dec.generate(prompt, 48).texts[0]
    stop = [free[14:17], "never in this text"]
    expected = dec.generate(prompt, 48, stop=stop)
    ids, text = expected.tokens[0], expected.texts[0]
    assert text == free[: free.find(stop[0])] and len(ids) < 48
    full = http_generate(server.endpoints.http, "dspark", {"text_input": prompt, "max_tokens": 48, "stop": stop})
    assert (full.ids, full.text, full.finish_reason) == (ids, text, "stop")
    assert full.prompt_tokens == len(dec.tokenizer.encode(prompt)) and full.rounds >= 1  # text: the new text only
    sse = http_generate_stream(server.endpoints.http, "dspark", {"text_input": prompt, "max_tokens": 48,
                                                                 "stop": stop, "stream": True})
    assert (sse.ids, sse.text, sse.finish_reason) == (ids, text, "stop") and len(sse.chunks) > 2
    assert all(stop[0] not in "".join(sse.texts[: i + 1]) for i in range(len(sse.texts)))
    (grpc,) = grpc_generate(server.endpoints.grpc, "dspark", [request_inputs(prompt, 48, stop=stop, stream=True)])
    assert (grpc.ids, grpc.text, grpc.finish_reason) == (ids, text, "stop")
    # top-p / top-k: the same tokens as in-process generate with the same seed
    options = dict(temperature=1.0, seed=4, top_p=0.7, top_k=20)
    truncated = dec.generate(prompt, 32, **options)
    answer = http_generate(server.endpoints.http, "dspark", {"text_input": prompt, "max_tokens": 32, **options})
    assert answer.ids == truncated.tokens[0] and answer.text == truncated.texts[0]
    assert answer.ids != dec.generate(prompt, 32, temperature=1.0, seed=4).tokens[0]
    (tiny,) = grpc_generate(server.endpoints.grpc, "tiny", [request_inputs([5, 6, 7], 16, temperature=1.0, seed=2,
                                                                           top_p=0.5, top_k=7)])
    assert tiny.ids == decoders["tiny"].generate([[5, 6, 7]], 16, temperature=1.0, seed=2, top_p=0.5,
                                                 top_k=7).tokens[0]
    with pytest.raises(ServerError, match="top_p must be in") as e:
        http_generate(server.endpoints.http, "dspark", {"text_input": prompt, "max_tokens": 4, "top_p": 1.5})
    assert e.value.status == 400
    (err,) = grpc_generate(server.endpoints.grpc, "tiny", [request_inputs([5, 6], 4, stop=["x"])])
    assert isinstance(err, ServerError) and "cannot match stop strings" in err.message


def test_metrics_count_one_request_exactly(server, decoders):
    """Alone on the model: the metrics' deltas are the request's own figures (acceptance from the counters)."""
    before = _scrape(server)
    answer = http_generate(server.endpoints.http, "dspark", {"text_input": "A small drafter", "max_tokens": 40,
                                                             "temperature": 1.0, "seed": 6})
    time.sleep(0.5)  # the final response can arrive before the last metric update is applied
    after = _scrape(server)
    delta = lambda name, **labels: _metric(after, name, "dspark", **labels) - _metric(before, name, "dspark",  # noqa
                                                                                     **labels)
    assert delta("dspark_drafted_tokens_total") == answer.drafted > 0
    assert delta("dspark_accepted_tokens_total") == answer.accepted
    assert delta("dspark_request_rounds_total") == answer.rounds == delta("dspark_acceptance_length_count")
    assert delta("dspark_generated_tokens_total") == len(answer.ids) == 40
    assert delta("dspark_requests_finished_total", finish_reason="length") == 1
    assert 1 + answer.accepted / answer.rounds == pytest.approx(answer.mean_acceptance_length, rel=1e-6)
    assert delta("dspark_acceptance_length_sum") == pytest.approx(answer.rounds + answer.accepted)  # batch of 1
    assert delta("dspark_batch_size_count") == answer.rounds and delta("dspark_batch_size_sum") == answer.rounds
    assert _metric(after, "dspark_requests_in_flight", "dspark") == 0
    assert _metric(after, "dspark_requests_queued", "dspark") == 0
    labels = {k for (n, ls) in after for k, _ in ls if n == "dspark_drafted_tokens_total"}
    assert labels == {"model", "version", "instance"}
    instances = {dict(ls)["instance"] for (n, ls) in after if n == "dspark_drafted_tokens_total"
                 and dict(ls)["model"] == "tiny"}
    assert len(instances) == 2  # one series per instance


def test_rejected_requests_are_counted_by_reason(server):
    before = _scrape(server)
    for payload, _ in BAD_HTTP[:3]:
        with pytest.raises(ServerError):
            http_generate(server.endpoints.http, "dspark", payload)
    time.sleep(0.2)
    after = _scrape(server)
    reason = dict(reason="invalid_argument")
    assert _metric(after, "dspark_requests_rejected_total", "dspark", **reason) - \
        _metric(before, "dspark_requests_rejected_total", "dspark", **reason) == 3


def test_a_request_whose_rounds_raise_fails_alone_on_the_server(server, decoders):
    dec = decoders["dspark"]
    rng = random.Random(5)
    short = [(rng.choice(TEXTS), 40, float(i % 2), i) for i in range(5)]
    poisoned = [rng.randrange(32, 127) for _ in range(FAULT_AT - 6)]  # reaches the fault after a few rounds
    results: dict[int, Answer | ServerError] = {}
    before = _scrape(server)

    def send(i):
        if i == len(short):
            time.sleep(0.3)  # join the running batch
            (results[i],) = grpc_generate(server.endpoints.grpc, "dspark", [request_inputs(poisoned, 30)])
        else:
            text, n, t, s = short[i]
            (results[i],) = grpc_generate(server.endpoints.grpc, "dspark", [request_inputs(text, n, temperature=t,
                                                                                           seed=s, stream=True)])

    with ThreadPoolExecutor(max_workers=len(short) + 1) as pool:
        list(pool.map(send, range(len(short) + 1)))
    bad = results[len(short)]
    assert isinstance(bad, ServerError) and "decoding failed: injected fault" in bad.message
    for i, (text, n, t, s) in enumerate(short):
        assert isinstance(results[i], Answer), results[i]
        assert results[i].ids == alone(decoders, "dspark", text, n, t, s)[0], i
    time.sleep(0.3)
    after = _scrape(server)
    for name, labels in (("dspark_requests_failed_total", {"reason": "decoding_error"}),
                         ("dspark_requests_finished_total", {"finish_reason": "error"})):
        assert _metric(after, name, "dspark", **labels) - _metric(before, name, "dspark", **labels) == 1
    again = http_generate(server.endpoints.http, "dspark", {"text_input": "tokens", "max_tokens": 8})
    assert again.ids == alone(decoders, "dspark", "tokens", 8)[0]
    assert dec.tokenizer is not None


def test_a_full_queue_answers_server_busy_and_recovers(server, decoders):
    """Model ``busy``: one batch row and max_queue 1; six requests at once: two are taken, the rest refused."""
    prompts = [[11 + i, 12, 13] for i in range(6)]
    before = _scrape(server)
    results = _at_once(lambda i: http_generate(server.endpoints.http, "busy", {"input_ids": prompts[i],
                                                                               "max_tokens": 120}), len(prompts))
    busy = [r for r in results if isinstance(r, ServerError)]
    served = {i: r for i, r in enumerate(results) if isinstance(r, Answer)}
    assert busy and len(served) >= 2, results
    # the model answers UNAVAILABLE; Triton's HTTP generate endpoint turns every model error into 400, so
    # clients (the OpenAI front end: 503) go by the message
    assert all(e.message.startswith("server busy: ") for e in busy), [e.message for e in busy]
    grpc = _at_once(lambda i: grpc_generate(server.endpoints.grpc, "busy", [request_inputs(prompts[i], 120)])[0], 4)
    refused = [r for r in grpc if isinstance(r, ServerError)]
    assert refused and all("server busy: " in r.message for r in refused), grpc
    print("gRPC stream error while busy:", refused[0].message)
    served.update({10 + i: r for i, r in enumerate(grpc) if isinstance(r, Answer)})
    for i, answer in served.items():
        assert answer.ids == alone(decoders, "tiny", prompts[i % 10], 120)[0]
    time.sleep(0.2)
    after = _scrape(server)
    reason = dict(reason="server_busy")
    assert _metric(after, "dspark_requests_rejected_total", "busy", **reason) - \
        _metric(before, "dspark_requests_rejected_total", "busy", **reason) == len(busy) + len(refused)
    again = http_generate(server.endpoints.http, "busy", {"input_ids": [1, 2, 3], "max_tokens": 8})
    assert again.ids == alone(decoders, "tiny", [1, 2, 3], 8)[0]


def _at_once(send, n: int) -> list:
    """``send(i)`` for i < n from n threads released together; each result or its ServerError."""
    start = threading.Barrier(n)

    def one(i):
        start.wait()
        try:
            return send(i)
        except ServerError as e:
            return e

    with ThreadPoolExecutor(max_workers=n) as pool:
        return list(pool.map(one, range(n)))
