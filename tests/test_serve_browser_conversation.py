"""`heedful serve`'s page with a conversation, in headless Chromium against the real server
(uvicorn on a free loopback port) serving the planted tiny chat model of
``tests/test_conversation.py``: a JSON conversation pasted in the text box is shown turn by turn
with the shares the API answers, the planted answer's turn the largest; a malformed one is one
line on the page."""

from __future__ import annotations

import json

import pytest
from test_conversation import CONVERSATION, PLANTED, planted  # noqa: F401  (the fixture)
from test_serve_browser import CHROMEDRIVER, CHROMIUM, WAIT_S, _wait, browser, serving  # noqa: F401

CHAT = "tiny-chat"

pytestmark = pytest.mark.skipif(
    not (CHROMIUM.exists() and CHROMEDRIVER.exists()),
    reason="no headless Chromium: install Debian's chromium and chromium-driver (.ci/run does)",
)


@pytest.fixture(scope="module")
def served(planted):  # noqa: F811
    pytest.importorskip("uvicorn")
    pytest.importorskip("fastapi")
    from heedful.serve import ServeSettings, create_app

    with serving(create_app(ServeSettings(models=[CHAT]), preloaded={CHAT: planted})) as base:
        yield base


def _paste(driver, text: str) -> None:
    driver.execute_script(
        "var t = document.getElementById('text'); t.value = arguments[0]; t.dispatchEvent(new Event('input'));", text
    )


def test_the_page_shows_each_turns_share_as_the_api_answers(served, browser):  # noqa: F811
    import httpx
    from selenium.webdriver.common.by import By

    browser.get(served + "/")
    _wait(browser, lambda d: d.execute_script("return !document.getElementById('conversation-box').hidden;"), "the conversation box")
    _paste(browser, json.dumps([*CONVERSATION, {"role": "assistant", "content": PLANTED}]))
    browser.find_element(By.ID, "conversation").click()
    _wait(browser, lambda d: d.execute_script("return !document.getElementById('conversation-result').hidden;"), "the conversation")
    shown = browser.execute_script(
        "return Array.from(document.querySelectorAll('#turns .turn[data-share]')).map(function (r) {"
        " return [r.querySelector('.role').textContent, r.querySelector('.content').textContent, Number(r.dataset.share)]; });"
    )
    api = httpx.post(f"{served}/api/conversation", json={"messages": CONVERSATION, "answer": PLANTED}, timeout=WAIT_S).json()
    assert [(r, c) for r, c, _ in shown] == [(m["role"], m["content"]) for m in CONVERSATION]
    assert [s for _, _, s in shown] == pytest.approx([t["share"] for t in api["turns"]], rel=1e-6, abs=1e-9)
    assert max(range(len(shown)), key=lambda i: shown[i][2]) == 1  # the notes' turn
    answer = browser.find_element(By.CSS_SELECTOR, "#turns .turn.answer .content").text
    assert answer == PLANTED

    _paste(browser, "[{\"role\": \"user\"")  # not JSON: one line, nothing sent
    browser.find_element(By.ID, "conversation").click()
    _wait(browser, lambda d: d.execute_script("return !document.getElementById('error').hidden;"), "the error")
    assert browser.find_element(By.ID, "error").text.splitlines()[0] == "the text is not a JSON conversation"
    _paste(browser, json.dumps([{"role": "user", "content": " "}]))  # the server's one line
    browser.find_element(By.ID, "conversation").click()
    _wait(browser, lambda d: "has no text content" in d.find_element(By.ID, "error").text, "the server's error")
