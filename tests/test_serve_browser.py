"""`heedful serve`'s page in a real browser: headless Chromium (Debian's chromium and
chromium-driver, through Selenium) against the real server (uvicorn on a free loopback port)
serving a tiny seeded BERT (nothing downloaded).

The page is driven as a person would: type a sentence, tick two methods, click Explain. What it
shows must be what the API answers for the same request -- the heatmap's tokens and scores, each
method's AOPC -- and its heatmaps must be the library's own HTML, the HTML a notebook shows for the
same explanations (one renderer). A screenshot is saved under the test's temporary folder."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
MODEL = "tiny-bert"
LM = "tiny-gpt2"
TEXT = "the plot is predictable yet the actors are wonderful"
METHODS = ("grad_x_input", "leave_one_out")
WAIT_S = 30.0
"""Every wait in this file is bounded: a broken page or server fails the test within this."""

pytestmark = pytest.mark.skipif(
    not (CHROMIUM.exists() and CHROMEDRIVER.exists()),
    reason="no headless Chromium: install Debian's chromium and chromium-driver (.ci/run does)",
)

SECONDS = re.compile(r"\d+\.\d{3} s\b")


def _timeless(html: str) -> str:
    """Renderer HTML without the wall-clock seconds its headers print (two runs of the same
    explanation differ only there)."""
    return SECONDS.sub("# s", html)


def _free_port() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


@contextlib.contextmanager
def serving(app) -> Iterator[str]:
    """The base URL of uvicorn serving ``app`` on a free loopback port in a background thread;
    stopped (bounded) on exit."""
    uvicorn = pytest.importorskip("uvicorn")
    sock = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + WAIT_S
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    host, port = sock.getsockname()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(WAIT_S)
        sock.close()


@pytest.fixture(scope="module")
def served(tiny):
    """``(base URL, model)``: uvicorn serving ``create_app`` with the tiny BERT preloaded, in a
    background thread; stopped (bounded) after the module."""
    pytest.importorskip("uvicorn")
    pytest.importorskip("fastapi")
    from heedful.serve import ServeSettings, create_app

    model = tiny("bert")
    app = create_app(ServeSettings(models=[MODEL, LM]), preloaded={MODEL: model, LM: tiny("gpt2", "causal_lm")})
    with serving(app) as base:
        yield base, model


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """Headless Chromium through chromedriver (page loads and scripts bounded)."""
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-extensions",
        "--no-first-run",
        "--window-size=1440,1500",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(WAIT_S)
    driver.set_script_timeout(WAIT_S)
    yield driver
    driver.quit()


def _api_explain(base: str) -> dict:
    import httpx

    body = {"model": MODEL, "text": TEXT, "methods": list(METHODS), "options": {}, "target": None, "curve": True}
    response = httpx.post(f"{base}/api/explain", json=body, timeout=WAIT_S)
    assert response.status_code == 200, response.text
    return response.json()


def _fragments(api: dict) -> str:
    """Every method's token-heatmap fragment in order, as the API answers them (per method when it
    gives them, else its ``html``, which is those fragments joined)."""
    if all("html" in m for m in api["methods"]):
        return "".join(m["html"] for m in api["methods"])
    return api["html"]


def _wait(driver, condition, what: str):
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, WAIT_S, poll_frequency=0.1).until(condition)
    except TimeoutException:
        error = driver.execute_script("var e = document.getElementById('error'); return e && !e.hidden ? e.textContent : '';")
        pytest.fail(f"the page did not show {what} within {WAIT_S:.0f} s{'; it says: ' + error if error else ''}")


def _tick_only(driver, names) -> None:
    """Tick exactly the methods ``names`` (the page ticks a default one by itself)."""
    from selenium.webdriver.common.by import By

    for box in driver.find_elements(By.CSS_SELECTOR, "#methods .method-row input[type=checkbox]"):
        if box.is_selected() != (box.get_attribute("value") in names):
            driver.execute_script("arguments[0].scrollIntoView({block: 'center'}); arguments[0].click();", box)


def _shown_tokens(driver, method: str) -> list[tuple[str, float]]:
    """``(token, score)`` of every scored piece of ``method``'s token heatmap: the raw token from
    the renderer's ``data-token``, the score from its tooltip ``title="reads as: +score"``."""
    pieces = driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0])).map(function (s) { return [s.dataset.token, s.title]; });",
        f'#heatmaps .heatmap[data-method="{method}"] .hm-tokens .hf-tok',
    )
    return [(token, float(title.rsplit(": ", 1)[1])) for token, title in pieces]


def test_page_shows_the_apis_heatmaps_and_aopc(served, browser, tmp_path):
    from selenium.webdriver.common.by import By

    base, _ = served
    browser.get(f"{base}/")
    _wait(browser, lambda d: d.execute_script("return document.body.dataset.ready === 'true'"), "its form")
    assert browser.title == "heedful"
    assert browser.find_element(By.ID, "model").get_attribute("value") == MODEL

    box = browser.find_element(By.ID, "text")
    box.clear()
    box.send_keys(TEXT)
    _tick_only(browser, METHODS)
    browser.find_element(By.ID, "explain").click()
    _wait(
        browser,
        lambda d: len(d.find_elements(By.CSS_SELECTOR, "#heatmaps .heatmap[data-method]")) == len(METHODS)
        and d.find_element(By.ID, "results").is_displayed(),
        "the results",
    )

    api = _api_explain(base)
    by_name = {m["name"]: m for m in api["methods"]}
    assert [m["name"] for m in api["methods"]] == list(METHODS)
    cards = [c.get_attribute("data-method") for c in browser.find_elements(By.CSS_SELECTOR, "#heatmaps .heatmap")]
    assert cards == list(METHODS)
    shown_html = []
    for method in METHODS:
        shown = _shown_tokens(browser, method)
        assert [token for token, _ in shown] == api["tokens"]
        assert [score for _, score in shown] == pytest.approx(by_name[method]["scores"], rel=1e-3, abs=1e-6)
        aopc = browser.find_element(By.CSS_SELECTOR, f'#metrics tr[data-method="{method}"] td.aopc').text
        assert by_name[method]["aopc"] is not None
        assert aopc == f"{by_name[method]['aopc']:.4f}"
        # the page inserts the renderer's fragments as they are (the browser re-serialises them identically)
        inner = browser.execute_script(
            "return document.querySelector(arguments[0]).innerHTML;", f'#heatmaps .heatmap[data-method="{method}"] .hm-tokens'
        )
        shown_html.append(inner)
    assert _timeless("".join(shown_html)) == _timeless(_fragments(api))
    curves = browser.find_elements(By.CSS_SELECTOR, "#curve-plot svg polyline.series")
    assert len(curves) == len(METHODS)
    # the curve's end point (everything deleted) is drawn apart and explained under the plot
    assert all(m["curve"]["fraction"][-1] == 1.0 for m in api["methods"])
    ends = browser.find_elements(By.CSS_SELECTOR, "#curve-plot svg circle.end")
    assert len(ends) == len(METHODS) and all("no evidence" in e.find_element(By.TAG_NAME, "title").get_attribute("textContent") for e in ends)
    note = browser.find_element(By.ID, "curve-end")
    assert note.is_displayed() and "100 %" in note.text and "above the original" in note.text

    shot = tmp_path / "heedful-serve.png"
    browser.execute_script("window.scrollTo(0, 0);")
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
    print(f"screenshot: {shot}")

    # the form lives in the URL: the same address restores it in a fresh load
    fragment = urlsplit(browser.current_url).fragment
    state = parse_qs(fragment)
    assert state["text"] == [TEXT] and state["methods"] == [",".join(METHODS)] and state["model"] == [MODEL]
    browser.get("about:blank")
    browser.get(f"{base}/#{fragment}")
    _wait(browser, lambda d: d.execute_script("return document.body.dataset.ready === 'true'"), "its restored form")
    assert browser.find_element(By.ID, "text").get_attribute("value") == TEXT
    for method in METHODS:
        assert browser.find_element(By.ID, f"method-{method}").is_selected()


def test_the_page_shows_what_a_notebook_shows(served):
    """One renderer: the fragments the page lays side by side are the notebook's ``_repr_html_``
    of the same explanations, one by one and as a list."""
    import heedful

    base, model = served
    api = _api_explain(base)
    mine = heedful.Explanations(model.explain(TEXT, method) for method in METHODS)
    assert _timeless(_fragments(api)) == _timeless("".join(e._repr_html_() for e in mine))
    assert _timeless(f'<div class="hf-many">{_fragments(api)}</div>') == _timeless(mine._repr_html_())
    for expl, shown in zip(mine, api["methods"], strict=True):
        if "html_words" in shown:
            assert _timeless(shown["html_words"]) == _timeless(heedful.render.html.explanation_fragment(expl, words=True))


def test_the_page_asks_before_long_work(served, browser, monkeypatch):
    """A request the server estimates to take long comes back 409 with its estimate: the page
    asks (window.confirm) and, confirmed, sends it again with confirm; declined, it says why."""
    from selenium.webdriver.common.by import By

    from heedful.engine import workload

    monkeypatch.setattr(workload, "LONG_SECONDS", 0.0)  # the server runs in this process: everything is long
    base, _ = served
    for answer in (False, True):
        browser.get("about:blank")
        browser.get(f"{base}/")
        _wait(browser, lambda d: d.execute_script("return document.body.dataset.ready === 'true'"), "its form")
        browser.execute_script(
            "var answer = arguments[0]; window.asked = [];"
            "window.confirm = function (message) { window.asked.push(message); return answer; };",
            answer,
        )
        box = browser.find_element(By.ID, "text")
        box.clear()
        box.send_keys(TEXT)
        _tick_only(browser, METHODS[:1])
        browser.find_element(By.ID, "explain").click()
        if answer:
            _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#heatmaps .heatmap[data-method]"), "the results")
        else:
            _wait(browser, lambda d: d.execute_script("var e = document.getElementById('error'); return e && !e.hidden;"), "an error")
            assert "confirm" in browser.find_element(By.ID, "error").text
        asked = browser.execute_script("return window.asked;")
        assert len(asked) == 1 and asked[0].startswith("This will take about ") and "forward" in asked[0]
# ---------------------------------------------------------------------------- hostile text
PWNED = "window.__pwned=1"
IMG = '"><img src=x onerror=alert(1)>'
SCRIPT = f"</script><script>{PWNED}</script>"
REOPEN = "<!--<script>"
"""Markup a text may carry: an attribute break-out with an image whose error handler runs, a
script element closed and reopened, and ``<!--<script>`` (after which ``</script>`` no longer
ends a script element). Each fits the tiny models' 64 positions with room to spare."""


def _no_script_ran(driver, where: str) -> None:
    """No alert is open, ``window.__pwned`` is unset and no ``<img src=x>`` (whose ``onerror``
    would fire) was made."""
    from selenium.common.exceptions import NoAlertPresentException

    try:
        alert = driver.switch_to.alert
    except NoAlertPresentException:
        pass
    else:
        said = alert.text
        alert.dismiss()
        pytest.fail(f"{where}: a script from the text ran (alert {said!r})")
    assert driver.execute_script("return typeof window.__pwned") == "undefined", f"{where}: a script from the text ran"
    assert driver.execute_script("return document.querySelectorAll('img[src=\"x\"]').length") == 0, f"{where}: an <img> from the text"


def _generation_view_works(driver, where: str) -> None:
    """Every generation view's data block parsed and its script ran (the step label is set):
    nothing in the data closed or reopened the script element."""
    steps = driver.execute_script(
        "return Array.from(document.querySelectorAll('.hf-gen')).map(function (box) {"
        " JSON.parse(box.querySelector('script[type=\"application/json\"]').textContent);"
        " return box.querySelector('.hf-step').textContent; });"
    )
    assert steps and all(step.startswith("step 0: ") for step in steps), f"{where}: the generation view did not run ({steps})"


def test_hostile_text_runs_no_script_in_the_export_or_the_notebook(browser, tiny, tmp_path):
    """The HTML export of an explanation, of several and of generations whose prompts and
    generated tokens carry markup, and a notebook-like page embedding their ``_repr_html_``:
    the markup is shown as text and nothing in it runs."""
    import heedful

    bert, gpt = tiny("bert"), tiny("gpt2", "causal_lm")
    expl = bert.explain(f"a {IMG} b", "grad_x_input")
    several = heedful.Explanations([expl, bert.explain(f"a {SCRIPT} b", "grad_x_input")])
    generations = [
        gpt.explain_generation(IMG, "saliency", continuation=" " + IMG),
        gpt.explain_generation("say", "saliency", continuation=REOPEN + SCRIPT),
    ]
    assert "<img" in generations[0].continuation and REOPEN in generations[1].continuation  # generated tokens carry markup
    assert not any(e.truncated for e in several)
    pages = {
        "export.html": expl.to_html(),
        "several.html": several.to_html(),
        "generation-0.html": generations[0].to_html(),
        "generation-1.html": generations[1].to_html(),
        "notebook.html": "<!DOCTYPE html><html><head><meta charset='utf-8'></head><body>"
        + "".join(f"<div class='output'>{item._repr_html_()}</div>" for item in (expl, several, *generations))
        + "</body></html>",
    }
    for name, page in pages.items():
        path = tmp_path / name
        path.write_text(page, encoding="utf-8")
        browser.get(path.as_uri())
        _wait(browser, lambda d: d.execute_script("return document.readyState") == "complete", name)
        _no_script_ran(browser, name)
        shown = browser.execute_script("return document.body.textContent")
        assert ("onerror=alert(1)>" in shown) != (name == "generation-1.html"), f"{name}: the text is not shown"
        if name in ("several.html", "generation-1.html", "notebook.html"):
            assert PWNED in shown, f"{name}: the text is not shown"
        if name.startswith("generation") or name == "notebook.html":
            _generation_view_works(browser, name)


def _pick_model(driver, name: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    Select(driver.find_element(By.ID, "model")).select_by_value(name)
    script = "return !!document.getElementById('method-saliency') && document.getElementById('generate-box').hidden === arguments[0];"
    _wait(driver, lambda d: d.execute_script(script, name != LM), f"{name}'s methods")


def _type(driver, text: str) -> None:
    from selenium.webdriver.common.by import By

    box = driver.find_element(By.ID, "text")
    box.clear()
    box.send_keys(text)


def test_hostile_text_runs_no_script_on_the_served_page(served, browser):
    """The page after explanations (both models) and a generation of texts carrying markup: the
    markup is shown as text, nothing in it runs, and the tooltips read the decoded tokens (a
    space visible as ␣, no byte-level ``Ġ``) while ``data-token`` keeps the raw one."""
    from selenium.webdriver.common.by import By

    base, _ = served
    browser.get(f"{base}/")
    _wait(browser, lambda d: d.execute_script("return document.body.dataset.ready === 'true'"), "its form")
    for model, text, shown in ((MODEL, f"a {IMG} b", "onerror=alert(1)>"), (LM, f"the movie was {SCRIPT}", PWNED)):
        _pick_model(browser, model)
        _type(browser, text)
        box = browser.find_element(By.ID, "method-saliency")
        if not box.is_selected():
            box.click()
        browser.execute_script("document.getElementById('heatmaps').replaceChildren();")
        browser.find_element(By.ID, "explain").click()
        _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#heatmaps .hf-tok[data-token]"), f"{model}'s heatmap")
        _no_script_ran(browser, f"the page after explaining with {model}")
        assert shown in browser.execute_script("return document.getElementById('heatmaps').textContent")
    pieces = browser.execute_script(
        "return Array.from(document.querySelectorAll('#heatmaps .hf-tok[data-token]')).map(function (s) { return [s.dataset.token, s.title]; });"
    )
    assert any(token.startswith("Ġ") for token, _ in pieces), "the language model's heatmap is not shown"
    assert not any("Ġ" in title for _, title in pieces)
    assert any(title.startswith("␣") for _, title in pieces)

    _type(browser, REOPEN + SCRIPT)
    browser.find_element(By.ID, "max-new-tokens").clear()
    browser.find_element(By.ID, "max-new-tokens").send_keys("3")
    browser.find_element(By.ID, "generate").click()
    _wait(browser, lambda d: d.find_element(By.ID, "generation").is_displayed() and d.find_elements(By.CSS_SELECTOR, "#generation-html .hf-gen"), "the generation")
    _no_script_ran(browser, "the page after a generation")
    assert PWNED in browser.execute_script("return document.getElementById('generation-html').textContent")


# ---------------------------------------------------------------------------- generation view
PROMPT = "the movie was"


def _hover(driver, element) -> None:
    from selenium.webdriver.common.action_chains import ActionChains

    ActionChains(driver).move_to_element(element).perform()


def _source_cells(driver) -> list[tuple[str, bool, str]]:
    """``(computed background, faded, tooltip)`` of every source token of the generation view."""
    return driver.execute_script(
        "return Array.from(document.querySelectorAll('#generation-html .hf-src .hf-tok')).map(function (s) {"
        " return [getComputedStyle(s).backgroundColor, s.classList.contains('hf-future'), s.title]; });"
    )


def _colour_map(row: list, special: list[bool]) -> list[str | None]:
    """The colour every view gives the scores of one step (:class:`heedful.render.colors.Scale`
    over the views' scale positions), as the browser reports a computed colour; ``None`` for a
    token not written yet."""
    import numpy as np

    from heedful.render.colors import Scale, scaled_positions

    values = np.array([np.nan if v is None else v for v in row], dtype=float)
    scale = Scale.fit(values, scaled_positions(special))
    return [None if not np.isfinite(v) else "rgb({}, {}, {})".format(*scale.rgb(v)) for v in values]


def test_the_generation_view_colours_labels_and_hovers(served, browser):
    """Generate and explain on the page: the step label is set, the source tokens are coloured by
    step 0's scores, hovering a generated token recolours them by that step's scores -- every
    cell's colour equal to the scores' colour map (the scores from the API for the same request)
    -- and switching models clears the generation."""
    import httpx
    from selenium.webdriver.common.by import By

    base, _ = served
    browser.get("about:blank")
    browser.get(f"{base}/")
    _wait(browser, lambda d: d.execute_script("return document.body.dataset.ready === 'true'"), "its form")
    _pick_model(browser, LM)
    _type(browser, PROMPT)
    _tick_only(browser, ["saliency"])
    browser.find_element(By.ID, "max-new-tokens").clear()
    browser.find_element(By.ID, "max-new-tokens").send_keys("4")
    browser.find_element(By.ID, "generate").click()
    _wait(browser, lambda d: d.find_element(By.ID, "generation").is_displayed() and d.find_elements(By.CSS_SELECTOR, "#generation-html .hf-gen"), "the generation")

    request = {"model": LM, "prompt": PROMPT, "max_new_tokens": 4, "method": "saliency", "options": {}}
    response = httpx.post(f"{base}/api/generate", json=request, timeout=WAIT_S)
    assert response.status_code == 200, response.text
    api = response.json()
    steps = len(api["generated"])
    assert steps >= 2
    generated = browser.find_elements(By.CSS_SELECTOR, "#generation-html .hf-out .hf-tok")
    assert len(generated) == steps
    for t in [0, steps - 1, 1]:
        if t:
            _hover(browser, generated[t])
        label = browser.find_element(By.CSS_SELECTOR, "#generation-html .hf-step").text
        assert label.startswith(f"step {t}: "), label
        assert generated[t].get_attribute("class").split() == ["hf-tok", "hf-on"]
        expected = _colour_map(api["matrix"][t], api["special"])
        cells = _source_cells(browser)
        assert len(cells) == len(expected) == len(api["source_tokens"])
        assert [None if faded else colour for colour, faded, _ in cells] == expected, f"step {t}"
        assert any(c not in (None, "rgb(255, 255, 255)") for c in expected), "nothing to colour: a useless check"
        shown = [float(title) for _, faded, title in cells if not faded]
        assert shown == pytest.approx([v for v in api["matrix"][t] if v is not None], rel=1e-3, abs=1e-6)

    _pick_model(browser, MODEL)
    assert not browser.find_element(By.ID, "generation").is_displayed()
    assert browser.execute_script("return document.getElementById('generation-html').children.length") == 0


def test_the_method_picker_says_what_each_computes_and_ticks_a_default(served, browser, tmp_path, monkeypatch):
    """Each method's row reads one line on what it computes (its summary), its cost on hover, and
    its measured AOPC (starred on the faithfulness-cost front; cost and interval on hover); a
    fresh page ticks one method (the library's default) so Explain works at once."""
    from selenium.webdriver.common.by import By

    import heedful
    from heedful import frontier

    measured = {"leave_one_out": {"cost": 13.0, "aopc": 0.564, "low": 0.54, "high": 0.59, "front": True}}
    path = tmp_path / "frontier.json"
    task = {"model": "minilm-sentiment", "examples": 12, "data": "movies test sentences", "protocol": "default", "methods": measured}
    path.write_text(json.dumps({"tasks": {"classification": task}}), encoding="utf-8")
    monkeypatch.setattr(frontier, "FRONTIER", path)
    base, _ = served
    browser.get("about:blank")
    browser.get(f"{base}/")
    _wait(browser, lambda d: d.execute_script("return document.body.dataset.ready === 'true'"), "its form")
    ticked = [b.get_attribute("value") for b in browser.find_elements(By.CSS_SELECTOR, "#methods .method-row input:checked")]
    assert ticked == ["normxlogit"]
    for name in ("integrated_gradients", "leave_one_out"):
        row = browser.find_element(By.CSS_SELECTOR, f'#methods .method[data-name="{name}"] .what')
        info = heedful.get_method(name)
        assert row.text == info.summary and "\n" not in row.text
        assert row.get_attribute("title") == f"cost: {info.cost}"
    faith = browser.find_element(By.CSS_SELECTOR, '#methods .method[data-name="leave_one_out"] .faith')
    assert faith.text == "AOPC 0.56 ★"
    assert faith.get_attribute("title").startswith("≈ 13 forward passes per example; AOPC 0.564 [0.540, 0.590] (minilm-sentiment, 12 movies")
    assert not browser.find_elements(By.CSS_SELECTOR, '#methods .method[data-name="integrated_gradients"] .faith')
    browser.find_element(By.ID, "explain").click()
    _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, '#heatmaps .heatmap[data-method="normxlogit"]'), "the default method's heatmap")


# ---------------------------------------------------------------------------- trace and steer views
def _set(driver, ident: str, value: str) -> None:
    from selenium.webdriver.common.by import By

    box = driver.find_element(By.ID, ident)
    box.clear()
    box.send_keys(value)


def test_the_trace_view_hovers_the_apis_grid_and_the_steer_view_shows_two_generations(served, browser, tmp_path):
    """Trace on the page: the grid has the API's layers and decoded tokens, every cell is coloured
    by the renderers' scale, and hovering a cell reads out its layer, token and the API's effect.
    Steer on the page: both generations, as the API answers them."""
    import httpx
    import numpy as np
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    from heedful.render.colors import Scale

    base, _ = served
    browser.get("about:blank")
    browser.get(f"{base}/#view=trace")
    _wait(browser, lambda d: d.execute_script("return document.body.dataset.ready === 'true'"), "its form")
    assert browser.find_element(By.ID, "trace-form").is_displayed()
    Select(browser.find_element(By.ID, "trace-model")).select_by_value(LM)
    _set(browser, "trace-prompt", PROMPT)
    _set(browser, "trace-corrupt", "movie")
    _set(browser, "trace-samples", "2")
    browser.find_element(By.ID, "trace").click()
    _wait(browser, lambda d: d.find_element(By.ID, "trace-result").is_displayed(), "the trace")

    response = httpx.post(f"{base}/api/trace", json={"model": LM, "prompt": PROMPT, "corrupt": "movie", "samples": 2}, timeout=WAIT_S)
    assert response.status_code == 200, response.text
    api = response.json()
    effect = np.array(api["effect"], dtype=float)
    grid = browser.find_element(By.CSS_SELECTOR, '#trace-grids table[data-grid="effect"]')
    heads = browser.execute_script("return Array.from(arguments[0].querySelectorAll('thead th')).map(function (th) { return th.textContent; });", grid)[1:]
    marked = [f"{c}*" if k in api["corrupted"] else c for k, c in enumerate(api["columns"])]
    assert heads == marked
    assert not any("Ġ" in h for h in heads)
    scale = Scale.fit(effect)
    colours = browser.execute_script(
        "return Array.from(arguments[0].querySelectorAll('td')).map(function (c) {"
        " return [Number(c.dataset.layer), Number(c.dataset.column), getComputedStyle(c).backgroundColor]; });", grid)
    assert len(colours) == effect.size
    for layer, column, colour in colours:
        assert colour == "rgb({}, {}, {})".format(*scale.rgb(effect[layer, column]))
    layer, column = np.unravel_index(np.argmax(np.abs(effect)), effect.shape)
    assert effect[layer, column] != 0, "nothing restored: a useless check"
    _hover(browser, grid.find_element(By.CSS_SELECTOR, f'td[data-layer="{layer}"][data-column="{column}"]'))
    shown = browser.find_element(By.ID, "trace-hover").text
    assert shown.startswith(f"layer {layer} · token ") and api["columns"][column].strip() in shown
    value = float(shown.split(" · effect ", 1)[1].split(" ", 1)[0])
    assert value == pytest.approx(effect[layer, column], rel=1e-3)
    browser.save_screenshot(str(tmp_path / "trace.png"))

    browser.find_element(By.ID, "tab-steer").click()
    Select(browser.find_element(By.ID, "steer-model")).select_by_value(LM)
    request = {"model": LM, "prompt": PROMPT, "positive": "i love this", "negative": "i hate this", "layer": 1, "coefficient": 8.0, "max_new_tokens": 4}
    for ident, key in (("steer-prompt", "prompt"), ("steer-positive", "positive"), ("steer-negative", "negative"),
                       ("steer-layer", "layer"), ("steer-coefficient", "coefficient"), ("steer-tokens", "max_new_tokens")):
        _set(browser, ident, str(request[key]))
    browser.find_element(By.ID, "steer").click()
    _wait(browser, lambda d: d.find_element(By.ID, "steer-result").is_displayed(), "the two generations")
    api = httpx.post(f"{base}/api/steer", json=request, timeout=WAIT_S).json()
    script = "return [document.getElementById('steer-without').textContent, document.getElementById('steer-with').textContent];"
    assert browser.execute_script(script) == [PROMPT + api["without"], PROMPT + api["with"]]
    assert api["without"] != api["with"]
