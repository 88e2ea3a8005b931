"""``heedful serve`` asks before long work: a request estimated above
:data:`heedful.engine.workload.LONG_SECONDS` is answered 409 with the estimate unless it says
``confirm``; generation beyond the model's positions is refused with the library's message."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi", reason="heedful serve needs the serve extra: pip install -e '.[serve]'")
from fastapi.testclient import TestClient  # noqa: E402

from heedful.engine import workload  # noqa: E402
from heedful.serve import ServeSettings, create_app  # noqa: E402

TEXT = "a charming and often affecting journey"


@pytest.fixture(scope="module")
def client(tiny):
    models = {"tiny-bert": tiny("bert", "classification"), "tiny-gpt2": tiny("gpt2", "causal_lm")}
    settings = ServeSettings(models=list(models), max_chars=4000)
    with TestClient(create_app(settings, preloaded=models), base_url="http://127.0.0.1") as found:
        yield found


@pytest.fixture
def everything_is_long(monkeypatch):
    monkeypatch.setattr(workload, "LONG_SECONDS", 0.0)


def test_short_work_runs_without_asking(client):
    assert client.post("/api/explain", json={"text": TEXT, "methods": ["saliency"], "curve": False}).status_code == 200


@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("/api/explain", {"text": TEXT, "methods": ["integrated_gradients"], "options": {"integrated_gradients": {"n_steps": 8}}, "curve": False}),
        ("/api/curve", {"text": TEXT, "method": "lime", "options": {"n_samples": 20}}),
        ("/api/generate", {"model": "tiny-gpt2", "prompt": "the cat sat", "max_new_tokens": 3}),
    ],
)
def test_long_work_is_answered_with_its_estimate_until_confirmed(client, everything_is_long, route, body):
    asked = client.post(route, json=body)
    assert asked.status_code == 409
    data = asked.json()
    assert data["error"].startswith("this request will take about ") and "confirm: true" in data["hint"]
    estimate = data["estimate"]
    assert estimate["seconds"] > 0 and estimate["forward"] >= 1 and estimate["text"] in data["error"]
    assert client.post(route, json={**body, "confirm": True}).status_code == 200


def test_a_queued_job_reports_the_estimate_in_its_error_event(client, everything_is_long):
    job = client.post("/api/jobs", json={"kind": "explain", "request": {"text": TEXT, "methods": ["saliency"], "curve": False}})
    assert job.status_code == 202
    with client.stream("GET", f"/api/jobs/{job.json()['id']}/events") as events:
        text = "".join(events.iter_text())
    assert "event: error" in text and '"estimate"' in text and "confirm: true" in text


def test_generation_beyond_the_models_positions_is_the_librarys_refusal(client):
    prompt = " ".join(["the cat sat on the mat"] * 12)  # 64 positions filled
    found = client.post("/api/generate", json={"model": "tiny-gpt2", "prompt": prompt, "max_new_tokens": 8})
    assert found.status_code == 422
    assert "at most 64" in found.json()["error"] and found.json()["hint"]
