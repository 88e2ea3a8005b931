"""``heedful serve``'s JSON API with FastAPI's test client on tiny seeded models: every route,
its numbers against direct library calls and a plain-loop deletion curve, every bad input
(the CLI's one-line messages as ``{"error", "hint"}``), the queue (429), the timeout (504),
server-sent progress, the results-store browser and the ``heedful serve`` command."""

from __future__ import annotations

import contextlib
import csv
import importlib.util
import json
import math
import socket
import sys
import threading
import time

import numpy as np
import pytest
import torch
from conftest import run_cli, saved_tiny

pytest.importorskip("fastapi", reason="heedful serve needs the serve extra: pip install -e '.[serve]'")
from fastapi.testclient import TestClient  # noqa: E402

import heedful  # noqa: E402
from heedful import zoo  # noqa: E402
from heedful.registry import unregister  # noqa: E402
from heedful.serve import ServeSettings, create_app  # noqa: E402
from heedful.serve.app import STATIC  # noqa: E402

TEXT = "a charming and often affecting journey"
CLASSIFIER, LM = "tiny-bert", "tiny-gpt2"


@pytest.fixture(scope="module")
def models(tiny):
    return {CLASSIFIER: tiny("bert", "classification"), LM: tiny("gpt2", "causal_lm")}


@contextlib.contextmanager
def serving(models, **limits):
    """A test client of a server offering the tiny models (the classifier by default)."""
    settings = ServeSettings(models=[CLASSIFIER, LM], **limits)
    with TestClient(create_app(settings, preloaded=models), base_url="http://127.0.0.1") as client:
        yield client


@pytest.fixture(scope="module")
def client(models):
    with serving(models) as found:
        yield found


def explain(client, **body):
    return client.post("/api/explain", json={"text": TEXT, **body})


# ---------------------------------------------------------------------------- oracles
PROTOCOL_RATIOS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


@torch.no_grad()
def plain_deletion(model, text: str, scores: list[float], target: int) -> tuple[list[float], float, float]:
    """The default protocol (NormXLogit's: [CLS] never removed, fractions of all tokens rounded
    down, removed tokens replaced by [MASK], the target's probability watched, AOPC and
    sufficiency averaged over the fractions 0.1 ... 0.9) in a plain loop over the fractions:
    the deletion curve, comprehensiveness and sufficiency of one explanation."""
    tok = model.tokenizer
    ids = torch.tensor(tok(text)["input_ids"])
    n = len(ids)
    rankable = list(range(1, n))  # every position after the leading [CLS]
    order = sorted(rankable, key=lambda i: (-scores[i], i))

    def prob(x: torch.Tensor) -> float:
        logits = model.hf_model(input_ids=x[None], attention_mask=torch.ones(1, n, dtype=torch.long)).logits[0]
        return float(torch.softmax(logits.double(), dim=-1)[target])

    p0 = prob(ids)
    curve, comp, suff = [], [], []
    for r in PROTOCOL_RATIOS:
        top = order[: min(math.floor(n * r), len(rankable))]
        removed, kept = ids.clone(), ids.clone()
        removed[top] = tok.mask_token_id
        kept[[i for i in rankable if i not in top]] = tok.mask_token_id
        curve.append(prob(removed))
        if 0.1 - 1e-9 <= r <= 0.9 + 1e-9:
            comp.append(p0 - curve[-1])
            suff.append(p0 - prob(kept))
    return curve, float(np.mean(comp)), float(np.mean(suff))


def plain_spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson correlation of the ranks (scores without ties)."""
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


# ---------------------------------------------------------------------------- models, methods
def test_models_lists_the_preloaded_models_and_the_zoo(client, models):
    rows = {row["name"]: row for row in client.get("/api/models").json()}
    bert = rows[CLASSIFIER]
    assert bert == {"name": CLASSIFIER, "task": "classification", "built": True, "loaded": True,
                    "labels": models[CLASSIFIER].labels, "decoder": False, "default": True}
    assert rows[LM]["decoder"] and rows[LM]["labels"] is None and not rows[LM]["default"]
    for name, entry in zoo.ENTRIES.items():
        assert rows[name]["task"] == entry.task and rows[name]["built"] == zoo.is_built(name)
        assert not rows[name]["loaded"]  # nothing is loaded until a request needs it


def test_methods_come_from_the_registry_under_the_server_limits(client):
    rows = {row["name"]: row for row in client.get("/api/methods", params={"model": CLASSIFIER}).json()}
    assert set(rows) == {info.name for info in heedful.methods()}
    ig = {o["name"]: o for o in rows["integrated_gradients"]["options"]}
    assert ig["n_steps"] == {"name": "n_steps", "type": "int", "default": 50, "choices": None, "min": 1, "max": 64, "nullable": False}
    assert ig["baseline"]["choices"] == ["pad", "mask", "unk", "zero"] and ig["baseline"]["type"] == "str"
    assert "internal_batch_size" not in ig  # runtime options are the server's
    assert {o["name"]: o["default"] for o in rows["guan2019"]["options"]}["max_steps"] == 64  # 5000 capped
    assert "layerwise" not in {o["name"] for o in rows["normxlogit"]["options"]}
    assert "head_mask" not in {o["name"] for o in rows["mask_lrp"]["options"]}
    assert all(row["supported"] for row in rows.values())


# ---------------------------------------------------------------------------- explain
def test_explain_matches_the_library_and_a_plain_deletion_loop(client, models):
    model = models[CLASSIFIER]
    got = explain(client, methods=["saliency", "integrated_gradients"], options={"integrated_gradients": {"n_steps": 8}})
    assert got.status_code == 200, got.json()
    data = got.json()
    direct = [model.explain(TEXT, "saliency"), model.explain(TEXT, "integrated_gradients", n_steps=8)]
    predicted = model.predict(TEXT)[0]
    assert data["model"] == CLASSIFIER and data["tokens"] == direct[0].tokens and data["special"] == direct[0].special
    assert data["words"] == direct[0].words().words
    assert data["prediction"]["label"] == predicted["label"]
    assert data["prediction"]["probability"] == pytest.approx(predicted["probability"], abs=1e-6)
    assert data["target"] == {"label": predicted["label"], "index": predicted["index"]}
    keep = ~np.asarray(direct[0].special)
    for row, expl in zip(data["methods"], direct, strict=True):
        assert row["name"] == expl.method
        np.testing.assert_allclose(row["scores"], expl.scores, atol=1e-6)
        np.testing.assert_allclose(row["word_scores"], expl.words("sum").scores, atol=1e-6)
        curve, aopc, sufficiency = plain_deletion(model, TEXT, row["scores"], predicted["index"])
        assert row["curve"]["fraction"] == pytest.approx(list(PROTOCOL_RATIOS))
        np.testing.assert_allclose(row["curve"]["value"], curve, atol=1e-5)
        assert row["aopc"] == pytest.approx(aopc, abs=1e-5) and row["sufficiency"] == pytest.approx(sufficiency, abs=1e-5)
        assert row["cost"]["forward"] >= 1 and row["seconds"] >= 0
    assert data["methods"][1]["cost"]["backward"] >= 8 and data["methods"][1]["options"]["n_steps"] == 8
    rho = plain_spearman(np.asarray(direct[0].scores)[keep], np.asarray(direct[1].scores)[keep])
    assert data["agreement"][0][1] == pytest.approx(rho, abs=1e-9) and data["agreement"][0][0] == pytest.approx(1.0)
    assert data["html"].count('class="hf-expl"') == 2 and "charming" in data["html"]


def test_targets_labels_indices_and_contrasts(client, models):
    model = models[CLASSIFIER]
    for target in ("POSITIVE", 0, "POSITIVE vs NEGATIVE"):
        data = explain(client, methods=["grad_x_input"], target=target, curve=False).json()
        expl = model.explain(TEXT, "grad_x_input", target)
        np.testing.assert_allclose(data["methods"][0]["scores"], expl.scores, atol=1e-6)
        assert data["target"]["label"] == expl.target.label and data["methods"][0]["curve"] is None


def test_compare_answers_as_explain(client):
    body = {"text": TEXT, "methods": ["saliency", "normxlogit"], "curve": False}
    a, b = client.post("/api/explain", json=body).json(), client.post("/api/compare", json=body).json()
    assert [m["scores"] for m in a["methods"]] == [m["scores"] for m in b["methods"]]


def test_curve_route_is_the_plain_deletion_loop(client, models):
    model = models[CLASSIFIER]
    data = client.post("/api/curve", json={"text": TEXT, "method": "saliency", "target": "NEGATIVE"}).json()
    scores = model.explain(TEXT, "saliency", "NEGATIVE").scores
    curve, aopc, sufficiency = plain_deletion(model, TEXT, list(scores), model.labels.index("NEGATIVE"))
    np.testing.assert_allclose(data["value"], curve, atol=1e-5)
    assert data["aopc"] == pytest.approx(aopc, abs=1e-5) and data["sufficiency"] == pytest.approx(sufficiency, abs=1e-5)


def test_generate_matches_explain_generation(client, models):
    data = client.post("/api/generate", json={"model": LM, "prompt": "the capital of france is", "max_new_tokens": 3}).json()
    direct = models[LM].explain_generation("the capital of france is", "saliency", max_new_tokens=3)
    assert data["generated"] == direct.generated_tokens and data["source_tokens"] == direct.tokens
    matrix = np.array([[np.nan if v is None else v for v in row] for row in data["matrix"]])
    np.testing.assert_allclose(matrix, direct.scores, atol=1e-6, equal_nan=True)
    np.testing.assert_allclose(data["probabilities"], direct.probabilities, atol=1e-6)
    assert 'class="hf-gen"' in data["html"]
    from heedful.render.generation import SCRIPT

    assert f"<script>{SCRIPT}</script>" in data["html"]  # the page binds the hover by running it


# ---------------------------------------------------------------------------- bad input
def error_of(response, status: int) -> dict:
    assert response.status_code == status, (response.status_code, response.text)
    body = response.json()
    assert set(body) == {"error", "hint"} and body["error"] and "\n" not in body["error"]
    return body


BAD = [
    ({"text": ""}, 422, "no text given"),
    ({"text": "   "}, 422, "no text given"),
    ({"text": "x" * 2001}, 413, "2001 characters, above this server's limit of 2000"),
    ({"methods": ["nope"]}, 404, "unknown method 'nope'"),
    ({"model": "nope"}, 404, "unknown model 'nope'"),
    ({"model": "/etc"}, 404, "unknown model '/etc'"),
    ({"target": "MAYBE"}, 422, "unknown label 'MAYBE'"),
    ({"methods": ["integrated_gradients"], "options": {"integrated_gradients": {"n_steps": 65}}}, 422, "n_steps=65 is above this server's limit of 64"),
    ({"methods": ["lime"], "options": {"lime": {"n_samples": 10_000}}}, 422, "n_samples=10000 is above this server's limit of 512"),
    ({"methods": ["integrated_gradients"], "options": {"integrated_gradients": {"n_steps": "many"}}}, 422, "n_steps='many' is not int >= 1"),
    ({"methods": ["integrated_gradients"], "options": {"integrated_gradients": {"n_steps": 0}}}, 422, "n_steps=0 is not int >= 1"),
    ({"methods": ["saliency"], "options": {"saliency": {"n_steps": 4}}}, 422, "saliency"),
    ({"methods": ["saliency"], "options": {"lime": {"n_samples": 4}}}, 422, "options are given for 'lime'"),
    ({"methods": ["integrated_gradients"], "options": {"integrated_gradients": {"internal_batch_size": 4}}}, 422, "not offered by this server"),
    ({"methods": ["normxlogit"], "options": {"normxlogit": {"layerwise": True}}}, 422, "not offered by this server"),
    ({"methods": []}, 422, "no method given"),
    ({"methods": ["saliency"] * 2}, 422, "asked for twice"),
    ({"methods": ["saliency", "normxlogit", "logat", "grad_x_input", "random", "rollout", "lrp"]}, 422, "7 methods, above this server's limit of 6"),
    ({"colour": "red"}, 422, "unknown field 'colour'"),
    ({"text": 5}, 422, "text"),
]


@pytest.mark.parametrize("change,status,message", BAD, ids=[m for _, _, m in BAD])
def test_bad_explain_requests(client, change, status, message):
    body = {"text": TEXT, "methods": ["saliency"], **change}
    assert message in error_of(client.post("/api/explain", json=body), status)["error"]


def test_malformed_and_missing_bodies(client):
    assert "not valid JSON" in error_of(client.post("/api/explain", content=b"{text:", headers={"content-type": "application/json"}), 422)["error"]
    assert error_of(client.post("/api/explain", json={"methods": ["saliency"]}), 422)["error"] == "text is missing"
    assert "unknown model" in error_of(client.get("/api/methods", params={"model": "nope"}), 404)["error"]


def test_bad_curve_and_generate_requests(client):
    assert "unknown method" in error_of(client.post("/api/curve", json={"text": TEXT, "method": "nope"}), 404)["error"]
    assert "above this server's limit" in error_of(
        client.post("/api/curve", json={"text": TEXT, "method": "rise", "options": {"n_masks": 513}}), 422)["error"]
    bad = {"model": LM, "prompt": "the capital", "max_new_tokens": 33}
    assert "max_new_tokens=33 is not in [1, 32]" in error_of(client.post("/api/generate", json=bad), 422)["error"]
    assert "no prompt given" in error_of(client.post("/api/generate", json={**bad, "prompt": " ", "max_new_tokens": 2}), 422)["error"]
    assert "generation needs a causal language model" in error_of(
        client.post("/api/generate", json={"model": CLASSIFIER, "prompt": "a film", "max_new_tokens": 2}), 422)["error"]


# ---------------------------------------------------------------------------- jobs and progress
def events(client, ident: str) -> list[tuple[str, dict]]:
    found, name = [], None
    with client.stream("GET", f"/api/jobs/{ident}/events") as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        for line in stream.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                found.append((name, json.loads(line[6:])))
    return found


def test_jobs_stream_progress_then_the_routes_answer(client):
    body = {"text": TEXT, "methods": ["saliency", "grad_x_input"]}
    ident = client.post("/api/jobs", json={"kind": "compare", "request": body})
    assert ident.status_code == 202
    found = events(client, ident.json()["id"])
    progress = [data for name, data in found if name == "progress"]
    assert [p["done"] for p in progress] == [0, 1, 2, 3, 4] and {p["total"] for p in progress} == {4}
    assert progress[0]["stage"] == "explaining with saliency"
    name, result = found[-1]
    assert name == "result"
    direct = client.post("/api/compare", json=body).json()
    assert [m["scores"] for m in result["methods"]] == [m["scores"] for m in direct["methods"]]


def test_job_errors(client):
    bad = client.post("/api/jobs", json={"kind": "explain", "request": {"text": TEXT, "target": "MAYBE"}})
    assert bad.status_code == 202  # the label is checked against the model, in the job
    name, data = events(client, bad.json()["id"])[-1]
    assert name == "error" and data["error"] == "unknown label 'MAYBE'"
    assert "unknown job" in error_of(client.get("/api/jobs/nope/events"), 404)["error"]
    error_of(client.post("/api/jobs", json={"kind": "train", "request": {}}), 422)
    assert error_of(client.post("/api/jobs", json={"kind": "curve", "request": {"method": "saliency"}}), 422)["error"] == "text is missing"
    assert "3000 characters" in error_of(client.post("/api/jobs", json={"kind": "explain", "request": {"text": "y" * 3000}}), 413)["error"]


@pytest.fixture
def waiting():
    """A method that keeps running forward passes until the test releases it."""
    release = threading.Event()

    @heedful.register("serve_test_wait", family="baseline", cost="forward passes until released")
    def serve_test_wait(problem) -> torch.Tensor:
        """Runs the model again and again until released, then scores every token 0 ``[B, N]``.

        Source: tests/test_serve_api.py (keeps the server's worker busy).
        """
        while not release.is_set():
            problem.adapter.hf_model(input_ids=problem.batch.input_ids, attention_mask=problem.batch.attention_mask)
            time.sleep(0.01)
        return torch.zeros(len(problem), problem.batch.seq_len)

    yield release
    release.set()
    unregister("serve_test_wait")


def test_a_full_queue_answers_429(models, waiting):
    body = {"kind": "explain", "request": {"text": TEXT, "methods": ["serve_test_wait"], "curve": False}}
    with serving(models, queue_size=1) as client:
        worker = client.app.state.server.worker
        first = client.post("/api/jobs", json=body).json()["id"]
        deadline = time.monotonic() + 10
        while (worker.current is None or worker.current.id != first) and time.monotonic() < deadline:
            time.sleep(0.01)
        second = client.post("/api/jobs", json=body)
        assert second.status_code == 202  # waits behind the first
        refused = client.post("/api/jobs", json=body)
        busy = error_of(refused, 429)
        assert refused.headers["retry-after"] == "1"
        assert busy["error"] == "the server is busy: 1 request(s) are already waiting"
        error_of(client.post("/api/explain", json=body["request"]), 429)
        waiting.set()
        for ident in (first, second.json()["id"]):
            assert events(client, ident)[-1][0] == "result"


def test_a_request_past_the_timeout_answers_504_and_stops(models, waiting):
    with serving(models, timeout_s=0.5) as client:
        began = time.monotonic()
        late = error_of(explain(client, methods=["serve_test_wait"]), 504)
        assert late["error"] == "the request took longer than this server's limit of 0.5 s"
        assert time.monotonic() - began < 5
        # the worker stopped the job inside its forward passes: the next request is served
        assert explain(client, methods=["saliency"], curve=False).status_code == 200


def _running(worker, ident: str) -> None:
    deadline = time.monotonic() + 10
    while (worker.current is None or worker.current.id != ident) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert worker.current is not None and worker.current.id == ident


SHUTTING_DOWN = "the server is shutting down"


def test_stopping_answers_the_running_and_the_queued_jobs_503_at_once(models, waiting):
    """The worker's stop: the running job stops inside its forward passes and says the server is
    stopping (not that it timed out), the queued one too, and nothing more is queued."""
    body = {"kind": "explain", "request": {"text": TEXT, "methods": ["serve_test_wait"], "curve": False}}
    with serving(models) as client:
        worker = client.app.state.server.worker
        first = client.post("/api/jobs", json=body).json()["id"]
        _running(worker, first)
        second = client.post("/api/jobs", json=body).json()["id"]
        began = time.monotonic()
        worker.stop()
        assert time.monotonic() - began < 5
        for ident in (first, second):
            name, data = events(client, ident)[-1]
            assert name == "error" and data["error"] == SHUTTING_DOWN
        assert error_of(client.post("/api/jobs", json=body), 503)["error"] == SHUTTING_DOWN


def test_stopping_answers_a_job_that_cannot_be_interrupted_at_once():
    """A running job that reaches no check for a long while (no model pass, no progress report)
    is answered 503 as soon as the worker stops, not when its computation ends."""
    from heedful.serve.errors import ApiError
    from heedful.serve.work import Worker

    worker = Worker(queue_size=8)
    worker.start()
    release = threading.Event()
    job = worker.submit("explain", lambda job: release.wait(30), 60.0)
    deadline = time.monotonic() + 10
    while worker.current is not job and time.monotonic() < deadline:
        time.sleep(0.01)
    began = time.monotonic()
    worker.stop(wait=0.5)
    with pytest.raises(ApiError) as stopped:
        job.future.result(2)
    assert stopped.value.status == 503 and time.monotonic() - began < 2.5
    assert [name for name, _ in job.events_from(0)] == ["error"]
    release.set()
    worker._thread.join(5)
    assert [name for name, _ in job.events_from(0)] == ["error"]  # answered once


@contextlib.contextmanager
def live(models, **limits):
    """``(base URL, app, uvicorn server, its thread)``: the real server (as ``heedful serve``
    runs it) on a free loopback port, in a thread; stopped (bounded) at the end."""
    from heedful.serve.running import server

    app = create_app(ServeSettings(models=[CLASSIFIER, LM], **limits), preloaded=models)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    served = server(app, log_level="warning")
    thread = threading.Thread(target=served.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not served.started and time.monotonic() < deadline:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", app, served, thread
    finally:
        served.should_exit = True
        thread.join(10)
        sock.close()


WAIT_BODY = {"text": TEXT, "methods": ["serve_test_wait"], "curve": False}


def test_shutdown_answers_open_requests_instead_of_waiting_for_them(models, waiting):
    """uvicorn's shutdown (what SIGTERM starts) with a job running for good and a request waiting
    behind it: the waiting request answers 503 and the server is gone within seconds, instead of
    uvicorn waiting for every open request before the application may stop its worker."""
    import httpx

    with live(models, timeout_s=60) as (base, app, served, thread):
        first = httpx.post(f"{base}/api/jobs", json={"kind": "explain", "request": WAIT_BODY}).json()["id"]
        _running(app.state.server.worker, first)
        answers = []
        waiter = threading.Thread(target=lambda: answers.append(httpx.post(f"{base}/api/explain", json=WAIT_BODY, timeout=60)))
        waiter.start()
        deadline = time.monotonic() + 10
        while app.state.server.worker.waiting < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        began = time.monotonic()
        served.should_exit = True
        thread.join(10)
        waiter.join(10)
        assert not thread.is_alive(), "the server still waits for its open requests"
        assert time.monotonic() - began < 10
        assert error_of(answers[0], 503)["error"] == SHUTTING_DOWN


def test_a_client_that_leaves_cancels_its_job(models, waiting):
    """A client that disconnects before its answer: its running job stops within a model pass
    or two, and its queued one is never computed -- the worker is free for the next request."""
    import httpx

    with live(models, timeout_s=60) as (base, app, _, _):
        worker = app.state.server.worker
        for _ in range(2):  # the first runs, the second waits behind it; both clients leave
            with contextlib.suppress(httpx.TimeoutException):
                httpx.post(f"{base}/api/explain", json=WAIT_BODY, timeout=0.5)
        deadline = time.monotonic() + 10
        while (worker.current is not None or worker.waiting) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert worker.current is None and worker.waiting == 0, "the worker still computes for clients that left"
        answer = httpx.post(f"{base}/api/explain", json={"text": TEXT, "methods": ["saliency"], "curve": False}, timeout=30)
        assert answer.status_code == 200


def test_sigterm_stops_the_server_with_status_0(tmp_path):
    """``heedful serve`` on SIGTERM with jobs queued: a clean exit, status 0, within seconds
    (uvicorn alone re-raises the signal: the process ended killed by it)."""
    import signal
    import subprocess
    import sys

    import httpx

    folder = saved_tiny(tmp_path / "tiny", "bert", "classification")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    command = [sys.executable, "-m", "heedful", "serve", "--model", folder, "--port", str(port)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline, ready = time.monotonic() + 120, False
        while not ready and time.monotonic() < deadline:
            assert process.poll() is None, process.communicate()
            with contextlib.suppress(httpx.TransportError):
                ready = httpx.get(f"http://127.0.0.1:{port}/api/models", timeout=2).status_code == 200
            time.sleep(0.2)
        assert ready, "heedful serve did not start within 120 s"
        request = {"text": TEXT, "methods": ["integrated_gradients"], "options": {"integrated_gradients": {"n_steps": 64}}}
        for _ in range(4):
            httpx.post(f"http://127.0.0.1:{port}/api/jobs", json={"kind": "explain", "request": request})
        began = time.monotonic()
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, err
    assert time.monotonic() - began < 30
    assert "Traceback" not in err


def test_a_request_that_would_wait_past_the_timeout_is_refused_at_once():
    """Jobs typically take 1 s and the limit is 2.5 s: with one running and one waiting, a third
    would wait about 2 s and need 1 more -- refused with 429 now, not answered 504 later."""
    from heedful.serve.errors import ApiError
    from heedful.serve.work import Worker

    worker = Worker(queue_size=8)
    worker.start()
    release = threading.Event()
    try:
        worker.submit("explain", lambda job: time.sleep(1.0), 2.5).future.result(10)
        assert worker.typical_seconds == pytest.approx(1.0, abs=0.5)
        running = worker.submit("explain", lambda job: release.wait(10), 2.5)
        deadline = time.monotonic() + 10
        while worker.current is not running and time.monotonic() < deadline:
            time.sleep(0.01)
        worker.submit("explain", lambda job: None, 2.5)  # the first to wait: always queued
        with pytest.raises(ApiError) as refused:
            worker.submit("explain", lambda job: None, 2.5)
        assert refused.value.status == 429 and refused.value.message.startswith("the server is busy: 1 request(s) are already waiting")
        assert "limit is 2.5 s" in refused.value.message
        assert worker.submit("explain", lambda job: None, 60.0).kind == "explain"  # a longer limit: room enough
    finally:
        release.set()
        worker.stop()


def _resident_mb() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's heap and /proc: Linux")
def test_a_finished_job_hands_the_memory_it_freed_back(models):
    """A job whose temporaries leave the heap fragmented (256 MB freed under one block still in
    use, as a method's many tensors do): once it is answered, the server's resident memory is
    back near where it was, not 256 MB higher for good."""
    kept = []

    @heedful.register("serve_test_fragment", family="baseline", cost="no pass of its own")
    def serve_test_fragment(problem) -> torch.Tensor:
        """Allocates 256 MB in 64 KB blocks, keeps one block made after them, frees the rest,
        and scores every token 0 ``[B, N]``.

        Source: tests/test_serve_api.py (fragments the worker thread's heap).
        """
        blocks = [bytearray(64 * 1024) for _ in range(4096)]
        kept.append(bytearray(64 * 1024))
        del blocks
        return torch.zeros(len(problem), problem.batch.seq_len)

    try:
        with serving(models) as client:
            assert explain(client, methods=["saliency"], curve=False).status_code == 200
            before = _resident_mb()
            assert explain(client, methods=["serve_test_fragment"], curve=False).status_code == 200
            deadline = time.monotonic() + 5  # the worker releases memory just after answering
            while _resident_mb() - before > 64 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _resident_mb() - before < 64
    finally:
        unregister("serve_test_fragment")


def test_loading_a_model_is_not_counted_against_the_timeout(models, monkeypatch):
    loads = []

    def slow_load(name, **kw):
        loads.append(name)
        time.sleep(1.0)
        return models[CLASSIFIER]

    monkeypatch.setattr(heedful, "load", slow_load)
    settings = ServeSettings(models=["later"], timeout_s=0.8)
    with TestClient(create_app(settings), base_url="http://127.0.0.1") as client:
        assert not {row["name"]: row for row in client.get("/api/models").json()}["later"]["loaded"]
        ident = client.post("/api/jobs", json={"kind": "explain", "request": {"text": TEXT, "methods": ["saliency"], "curve": False}}).json()["id"]
        found = events(client, ident)
        assert found[0] == ("progress", {"done": 0, "total": 2, "stage": "loading later"})
        assert found[-1][0] == "result" and found[-1][1]["model"] == "later"
        assert explain(client, model="later", methods=["saliency"]).status_code == 200 and loads == ["later"]  # one copy


# ---------------------------------------------------------------------------- runs
@pytest.fixture(scope="module")
def store(models, tmp_path_factory):
    from heedful.evaluate import get_protocol
    from heedful.evaluate.bench import BenchSpec, run_bench

    folder = tmp_path_factory.mktemp("serve-store")
    with open(folder / "data.csv", "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["text", "label"])
        writer.writerows([(TEXT, "POSITIVE"), ("the movie was dull and far too long", "NEGATIVE"), ("what a waste of a talented cast", "NEGATIVE")])
    spec = BenchSpec(
        model=models[CLASSIFIER], dataset=str(folder / "data.csv"), methods=["random", "saliency"], metrics=["aopc", "sufficiency"],
        protocol=get_protocol("default", random_seeds=2), out=folder / "out", batch_size=2, model_label=CLASSIFIER,
    )
    return folder / "out", run_bench(spec, progress=False)


def test_runs_browse_a_bench_store(models, store):
    from heedful.evaluate import ResultsStore

    folder, result = store
    with serving(models, store=folder) as client:
        runs = client.get("/api/runs").json()
        assert len(runs) == 1 and runs[0]["model"] == CLASSIFIER and runs[0]["methods"] == ["random", "saliency"] and runs[0]["n"] == 3
        data = client.get(f"/api/runs/{runs[0]['id']}").json()
        error_of(client.get("/api/runs/0123456789ab"), 404)
    table = {(row["method"], row["metric"]): row for row in data["table"]}
    with ResultsStore(folder) as db:  # the saliency means straight from the stored per-example values
        key = next(run.key for run in result.runs if run.method == "saliency")
        phash = result.spec.protocol.hash()
        for metric in ("aopc", "sufficiency"):
            values = [value for value, _, _ in db.get_metrics(key, metric, phash).values()]
            assert table[("saliency", metric)]["mean"] == pytest.approx(float(np.mean(values)), abs=1e-12)
    for group, found in result.groups.items():
        for metric, summary in found.summaries.items():
            row = table[(group, metric)]
            assert (row["low"], row["high"]) == pytest.approx((summary.low, summary.high))
        np.testing.assert_allclose(data["curves"][group]["value"], found.summaries["aopc"].curve)
    assert data["curve_metric"] == "aopc"


def test_no_store_no_runs(client):
    assert client.get("/api/runs").json() == []
    assert "no results store" in error_of(client.get("/api/runs/0123456789ab"), 404)["error"]


# ---------------------------------------------------------------------------- page, docs, hosts
def test_page_docs_and_openapi(client):
    page = client.get("/")
    if (STATIC / "index.html").is_file():
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    else:
        assert "the page is not installed" in error_of(page, 404)["error"]
    paths = client.get("/openapi.json").json()["paths"]
    for path in ("/api/models", "/api/methods", "/api/explain", "/api/compare", "/api/curve", "/api/generate",
                 "/api/runs", "/api/runs/{ident}", "/api/jobs", "/api/jobs/{ident}/events"):
        assert path in paths
    assert client.get("/docs").status_code == 200
    answer = client.get("/api/models")
    assert answer.headers["x-content-type-options"] == "nosniff" and answer.headers["x-frame-options"] == "DENY"


def test_a_loopback_server_answers_only_loopback_host_names(models):
    settings = ServeSettings(models=[CLASSIFIER], allowed_hosts=["127.0.0.1", "localhost"])
    with TestClient(create_app(settings, preloaded=models), base_url="http://127.0.0.1:8765") as client:
        assert client.get("/api/models").status_code == 200
        assert client.get("/api/models", headers={"host": "attacker.example"}).status_code == 400


# ---------------------------------------------------------------------------- the command
def test_serve_command(monkeypatch, capsys, tmp_path):
    from heedful.serve import running

    calls = []
    monkeypatch.setattr(running, "run", lambda app, host, port: calls.append((app, {"host": host, "port": port})))
    folder = saved_tiny(tmp_path / "tiny", "bert", "classification")
    code, out, err = run_cli(monkeypatch, capsys, "serve", "--model", folder, "--port", "9999")
    assert code == 0 and "http://127.0.0.1:9999" in out and "warning" not in err
    app, kw = calls[-1]
    assert kw["host"] == "127.0.0.1" and kw["port"] == 9999
    assert app.state.server.catalog.loaded[folder].task == "classification"  # loaded before serving
    assert app.state.server.settings.allowed_hosts is not None
    code, out, err = run_cli(monkeypatch, capsys, "serve", "--model", folder, "--host", "0.0.0.0")
    assert code == 0 and "warning: serving on 0.0.0.0" in " ".join(err.split())
    assert calls[-1][0].state.server.settings.allowed_hosts is None
    for app, _ in calls:
        app.state.server.worker.stop()


def test_serve_without_fastapi_exits_2_naming_the_extra(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "fastapi" else real(name, *a))
    code, _, err = run_cli(monkeypatch, capsys, "serve")
    lines = err.strip().splitlines()
    assert code == 2 and lines[0] == "error: heedful serve needs fastapi, which is not installed"
    assert lines[1:] == ["hint: pip install 'heedful[serve]'"]


@pytest.mark.slow
def test_the_documented_example_runs():
    """docs/serve.md's Python example, as written, on the zoo's default model."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "serve.md").read_text(encoding="utf-8")
    (block,) = re.findall(r"```python\n(.*?)```", text, re.S)
    done = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "integrated_gradients   AOPC" in done.stdout and "422 {'error': 'no text given'" in done.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--port", "70000"], "error: port 70000 does not exist"),
        (["--port", "-1"], "error: port -1 does not exist"),
        (["--max-chars", "0"], "error: max_chars must be at least 1, got 0"),
    ],
)
def test_bad_serve_options_exit_2_in_one_line(monkeypatch, capsys, args, message):
    code, _, err = run_cli(monkeypatch, capsys, "serve", *args)
    assert code == 2 and err.strip().splitlines()[0] == message


def test_a_store_that_is_a_file_is_refused(monkeypatch, capsys, tmp_path):
    file = tmp_path / "results.sqlite"
    file.write_bytes(b"")
    code, _, err = run_cli(monkeypatch, capsys, "serve", "--store", str(file))
    assert code == 2 and f"error: the results store {file} is a file" in " ".join(err.split())  # the terminal wraps long lines
