"""``POST /api/conversation``: a conversation's turns with their shares of the assistant's
answer, equal to ``Model.explain(messages, method, target=answer, sources="messages")``'s source
scores, on the planted tiny chat model of ``tests/test_conversation.py``; and every bad input as
one line (``{"error", "hint"}``, 4xx)."""

from __future__ import annotations

import numpy as np
import pytest
from test_conversation import CONVERSATION, PLANTED, planted  # noqa: F401  (the fixture)

pytest.importorskip("fastapi", reason="heedful serve needs the serve extra: pip install -e '.[serve]'")
from fastapi.testclient import TestClient  # noqa: E402

from heedful.serve import ServeSettings, create_app  # noqa: E402

CHAT, CLASSIFIER = "tiny-chat", "tiny-bert"


@pytest.fixture(scope="module")
def client(planted, tiny):  # noqa: F811
    settings = ServeSettings(models=[CHAT, CLASSIFIER], max_chars=400, max_new_tokens=8)
    with TestClient(create_app(settings, preloaded={CHAT: planted, CLASSIFIER: tiny("bert", "classification")}), base_url="http://127.0.0.1") as found:
        yield found


def _shares(scores: np.ndarray) -> np.ndarray:
    return scores / np.abs(scores).sum()


@pytest.mark.parametrize("method", ["source_loo", "context_cite"])
def test_each_turns_share_is_the_libraries_source_score(client, planted, method):  # noqa: F811
    options = {"n_ablations": 32, "seed": 0} if method == "context_cite" else {}
    done = client.post("/api/conversation", json={"messages": CONVERSATION, "answer": PLANTED, "method": method, "options": options})
    assert done.status_code == 200, done.text
    found = done.json()
    expected = planted.explain(CONVERSATION, method, target=PLANTED, sources="messages", **options).source_scores().scores
    scores = np.array([t["score"] for t in found["turns"]])
    assert [(t["role"], t["content"]) for t in found["turns"]] == [(m["role"], m["content"]) for m in CONVERSATION]
    np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose([t["share"] for t in found["turns"]], _shares(expected), rtol=1e-5, atol=1e-6)
    assert found["answer"] == PLANTED and found["answer_from"] == "given" and found["method"] == method
    assert int(np.argmax(scores)) == 1  # the notes' turn, where the planted answer is written


def test_a_last_assistant_message_is_the_answer(client, planted):  # noqa: F811
    conversation = [*CONVERSATION, {"role": "assistant", "content": PLANTED}]
    found = client.post("/api/conversation", json={"model": CHAT, "messages": conversation}).json()
    assert found["answer"] == PLANTED and found["answer_from"] == "last message"
    assert len(found["turns"]) == len(CONVERSATION)
    expected = planted.explain(CONVERSATION, "source_loo", target=PLANTED, sources="messages").source_scores().scores
    np.testing.assert_allclose([t["score"] for t in found["turns"]], expected, rtol=1e-5, atol=1e-6)


def test_without_an_answer_the_model_writes_it(client, planted):  # noqa: F811
    found = client.post("/api/conversation", json={"messages": CONVERSATION, "max_new_tokens": 3})
    assert found.status_code == 200, found.text
    body = found.json()
    assert body["answer_from"] == "generated" and body["answer"].strip()
    expected = planted.explain(CONVERSATION, "source_loo", target=body["answer"], sources="messages").source_scores().scores
    np.testing.assert_allclose([t["score"] for t in body["turns"]], expected, rtol=1e-5, atol=1e-6)


def test_as_a_job_its_progress_streams(client):
    queued = client.post("/api/jobs", json={"kind": "conversation", "request": {"messages": CONVERSATION, "answer": PLANTED}})
    assert queued.status_code == 202, queued.text
    with client.stream("GET", f"/api/jobs/{queued.json()['id']}/events") as events:
        text = "".join(events.iter_text())
    assert "event: progress" in text and "event: result" in text and "ranking the turns with source_loo" in text


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        ({"messages": []}, 422, "the conversation has no messages"),
        ({"messages": "hello"}, 422, "messages: Input should be a valid list"),
        ({"messages": [{"role": "user"}]}, 422, "messages.0.content is missing"),
        ({"messages": [{"role": "user", "content": 3}]}, 422, "messages.0.content: Input should be a valid string"),
        ({"messages": [{"role": "user", "content": "hi", "name": "x"}]}, 422, "unknown field 'messages.0.name'"),
        ({"messages": [{"role": "user", "content": "  "}]}, 422, "message 0 (user) has no text content"),
        ({"messages": [{"role": "", "content": "hi"}]}, 422, "message 0 has no role"),
        ({"messages": [{"role": "assistant", "content": "Z"}]}, 422, "the conversation is only the assistant's answer"),
        ({"messages": CONVERSATION, "answer": " "}, 422, "the answer is empty"),
        ({"messages": [{"role": "user", "content": "x" * 401}]}, 413, "above this server's limit of 400"),
        ({"messages": CONVERSATION, "max_new_tokens": 9}, 422, "max_new_tokens=9 is not in [1, 8]"),
        ({"messages": CONVERSATION, "method": "no_such_method"}, 404, "unknown method"),
        ({"messages": CONVERSATION, "model": "nope"}, 404, "unknown model 'nope'"),
        ({"messages": CONVERSATION, "model": CLASSIFIER, "answer": "Z"}, 422, "a conversation needs a chat (causal language) model"),
    ],
)
def test_bad_conversations_are_one_line(client, body, status, says):
    done = client.post("/api/conversation", json=body)
    assert done.status_code == status, done.text
    found = done.json()
    assert says in found["error"] and "\n" not in found["error"] and found["hint"], found


def test_long_work_is_asked_about_until_confirmed(client, monkeypatch):
    from heedful.engine import workload

    monkeypatch.setattr(workload, "LONG_SECONDS", 0.0)
    body = {"messages": CONVERSATION, "answer": PLANTED}
    asked = client.post("/api/conversation", json=body)
    assert asked.status_code == 409, asked.text
    assert asked.json()["error"].startswith("this request will take about ") and asked.json()["estimate"]["forward"] >= 1
    assert client.post("/api/conversation", json={**body, "confirm": True}).status_code == 200
