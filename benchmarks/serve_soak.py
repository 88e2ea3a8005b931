"""Soak test of ``heedful serve``: the real server (uvicorn on 127.0.0.1, a free port, the zoo's
``minilm-sentiment`` and ``smollm2-135m`` loaded at start) under minutes of mixed traffic from
concurrent clients, then a SIGTERM in the middle of that traffic.

Every client picks its next request from a fixed, seeded mix: explanations by every method
family (both models, with and without the deletion curve), comparisons, curves, generations,
server-sent progress streams read to the end or abandoned after the first progress event,
requests whose client disconnects before the answer (and mid-upload), malformed JSON, oversized
texts (one character over ``--max-chars`` and a megabyte), unknown models and methods, texts
carrying markup, and the page's cheap GETs. Each kind of request has the statuses it may
answer (429 busy is fine for every computing route: the client then waits ``Retry-After``); any
other answer is counted as unexpected. Reported: answers by status, the 5xx count (target 0),
latency percentiles per route, the server's resident memory at start, after one minute and at
the end (growth after warm-up: the lowest of the last minute's half-second readings over the
lowest of the first minute's -- the server between jobs --, target <= 10 %), tracebacks in
the server's log, and what a SIGTERM during load does (the running job, open requests, exit
code, time to exit).

Bounded: ``--minutes`` of traffic, at most ``--max-requests`` requests, a 60 s limit on the
SIGTERM (then the server is killed and the run fails); loopback only. Writes
``benchmarks/results/serve_soak.md``.

    python benchmarks/serve_soak.py                 # 10 minutes, 16 clients
    python benchmarks/serve_soak.py --minutes 2     # a shorter soak
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from _shared import ROOT, command_line, cpu_name, library_versions
from serve_load import Memory, free_port, percentile, wait_ready

CLASSIFIER = "minilm-sentiment"
LANGUAGE_MODEL = "smollm2-135m"
CHEAP = {"n_steps": 8, "max_steps": 8, "n_samples": 32, "n_masks": 32, "n_ablations": 16, "samples": 4}
"""Step and sample options every soak request sets (a soak is about the server, not the methods'
cost; each explanation still runs the method end to end)."""
HOSTILE = ('"><img src=x onerror=alert(1)>', "</script><script>window.__pwned=1</script>")
TEXTS = [
    "a charming and often affecting journey",
    "the plot is predictable yet the actors are wonderful",
    "unflinchingly bleak and desperate",
    "it is a film that will have people walking out halfway through",
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "the movie was dull, the jokes fell flat and the ending dragged on for far too long",
    "a gorgeous, witty, seductive movie",
    f"the critic wrote {HOSTILE[0]} and then {HOSTILE[1]} twice",
]
BUSY = 429
COMPUTING = {200, BUSY}
EXPLAINING = COMPUTING | {422}
"""What an explanation of a method ``GET /api/methods`` lists as supported may answer: a 422
when the method refuses this model's architecture (the list checks the task only); each such
refusal is named in the report."""


@dataclass
class Outcome:
    """One request: its route, the status answered (0: no answer, see ``note``), seconds from
    sending it to reading the whole answer, and whether that answer was one its kind allows."""

    kind: str
    route: str
    status: int
    seconds: float
    expected: bool
    note: str = ""


@dataclass
class Plan:
    """The methods each model offers, by family (from ``GET /api/methods``)."""

    families: dict[str, dict[str, list[dict]]] = field(default_factory=dict)

    def methods(self, model: str) -> list[dict]:
        return [m for rows in self.families[model].values() for m in rows]

    def pick(self, model: str, rng: random.Random, counter: int) -> dict:
        """The next method of ``model``: families in turn, a random method of the family."""
        families = sorted(self.families[model])
        return rng.choice(self.families[model][families[counter % len(families)]])


def cheap_options(method: dict) -> dict:
    """The method's step and sample options set to the soak's small values (within range)."""
    chosen = {}
    for option in method["options"]:
        if option["name"] in CHEAP:
            value = CHEAP[option["name"]]
            if option.get("min") is not None:
                value = max(value, option["min"])
            if option.get("max") is not None:
                value = min(value, option["max"])
            chosen[option["name"]] = value
    return chosen


def read_plan(base: str) -> Plan:
    plan = Plan()
    for model in (CLASSIFIER, LANGUAGE_MODEL):
        rows = httpx.get(f"{base}/api/methods", params={"model": model}, timeout=30).json()
        by_family: dict[str, list[dict]] = {}
        for row in rows:
            if row["supported"] and row["family"] != "context":  # context methods need sources, which the API does not take
                by_family.setdefault(row["family"], []).append(row)
        plan.families[model] = by_family
    return plan


# ---------------------------------------------------------------------------- requests
class Client:
    """One simulated user: an HTTP client (a connection pool of its own) and a seeded mix."""

    def __init__(self, base: str, plan: Plan, seed: int, settings: argparse.Namespace) -> None:
        self.base, self.plan, self.settings = base, plan, settings
        self.rng = random.Random(seed)
        self.counter = seed
        self.last: httpx.Response | None = None
        self.http = httpx.Client(base_url=base, timeout=httpx.Timeout(settings.timeout + 30, connect=10))

    def close(self) -> None:
        self.http.close()

    # ------------------------------------------------------------------ one request
    def send(self, kind: str, route: str, call: Callable[[], httpx.Response], allowed: set[int], check=None) -> Outcome:
        began = time.perf_counter()
        self.last = None
        try:
            response = self.last = call()
        except httpx.HTTPError as exc:
            return Outcome(kind, route, 0, time.perf_counter() - began, False, f"{type(exc).__name__}: {exc}"[:200])
        seconds = time.perf_counter() - began
        ok, note = response.status_code in allowed, ""
        if not ok:
            note = response.text[:200]
        elif response.status_code >= 400:
            body = response.json()
            ok = set(body) == {"error", "hint"} and bool(body["error"])
            note = body["error"] if ok else f"unclean error body: {response.text[:200]}"
        elif check is not None:
            ok, note = check(response.json())
        return Outcome(kind, route, response.status_code, seconds, ok, note)

    def post(self, kind: str, route: str, body: dict, allowed: set[int] = COMPUTING, check=None) -> Outcome:
        return self.send(kind, route, lambda: self.http.post(route, json=body), allowed, check)

    def text(self) -> str:
        return self.rng.choice(TEXTS)

    # ------------------------------------------------------------------ the mix
    def explain(self, model: str) -> Outcome:
        self.counter += 1
        method = self.plan.pick(model, self.rng, self.counter)
        body = {"model": model, "text": self.text(), "methods": [method["name"]], "options": {method["name"]: cheap_options(method)},
                "curve": self.rng.random() < 0.5}
        return self.post(f"explain {method['family']}", "/api/explain", body, EXPLAINING, check=escaped)

    def explain_classifier(self) -> Outcome:
        return self.explain(CLASSIFIER)

    def explain_language_model(self) -> Outcome:
        return self.explain(LANGUAGE_MODEL)

    def compare(self) -> Outcome:
        self.counter += 1
        first = self.plan.pick(CLASSIFIER, self.rng, self.counter)
        second = self.plan.pick(CLASSIFIER, self.rng, self.counter + 1)
        names = list(dict.fromkeys([first["name"], second["name"]]))
        options = {m["name"]: cheap_options(m) for m in (first, second)}
        body = {"model": CLASSIFIER, "text": self.text(), "methods": names, "options": options, "curve": True}
        return self.post("compare", "/api/compare", body, EXPLAINING, check=escaped)

    def curve(self) -> Outcome:
        self.counter += 1
        model = self.rng.choice([CLASSIFIER, LANGUAGE_MODEL])
        method = self.plan.pick(model, self.rng, self.counter)
        body = {"model": model, "text": self.text(), "method": method["name"], "options": cheap_options(method)}
        return self.post("curve", "/api/curve", body, EXPLAINING)

    def generate(self) -> Outcome:
        method = self.rng.choice(["saliency", "grad_x_input", "normxlogit", "raw_attention"])
        prompt = self.rng.choice([TEXTS[4], TEXTS[5], f"Repeat after me: {HOSTILE[1]}"])
        body = {"model": LANGUAGE_MODEL, "prompt": prompt, "max_new_tokens": self.rng.randint(2, 6), "method": method}
        return self.post("generate", "/api/generate", body, check=escaped)

    def malformed(self) -> Outcome:
        raw = self.rng.choice(['{"text": "a charming journey",', "not json at all", '{"text": ', "[1, 2"])
        return self.send(
            "malformed JSON", "/api/explain",
            lambda: self.http.post("/api/explain", content=raw, headers={"content-type": "application/json"}), {422},
        )

    def oversized(self) -> Outcome:
        length = self.settings.max_chars + 1 if self.rng.random() < 0.7 else 1_000_000
        return self.post("oversized text", "/api/explain", {"model": CLASSIFIER, "text": "a" * length}, {413})

    def unknown_model(self) -> Outcome:
        return self.post("unknown model", "/api/explain", {"model": "no-such-model", "text": self.text()}, {404})

    def unknown_method(self) -> Outcome:
        return self.post("unknown method", "/api/explain", {"model": CLASSIFIER, "text": self.text(), "methods": ["no_such_method"]}, {404})

    def read_only(self) -> Outcome:
        route = self.rng.choice(["/", "/api/models", f"/api/methods?model={LANGUAGE_MODEL}", "/static/app.js"])
        return self.send("page and lists", route.split("?")[0], lambda: self.http.get(route), {200})

    def disconnect(self) -> Outcome:
        """Send an explanation and leave (close the connection) before it is answered."""
        body = {"model": LANGUAGE_MODEL, "text": TEXTS[5], "methods": ["integrated_gradients"], "options": {"integrated_gradients": {"n_steps": 16}}}
        began = time.perf_counter()
        with httpx.Client(base_url=self.base, timeout=httpx.Timeout(self.rng.uniform(0.05, 0.5), connect=10)) as http:
            try:
                response = http.post("/api/explain", json=body)
            except httpx.TimeoutException:
                return Outcome("disconnect mid-request", "/api/explain", 0, time.perf_counter() - began, True, "left")
            except httpx.HTTPError as exc:
                return Outcome("disconnect mid-request", "/api/explain", 0, time.perf_counter() - began, False, repr(exc)[:200])
        # answered before the client left (a 429, say)
        return Outcome("disconnect mid-request", "/api/explain", response.status_code, time.perf_counter() - began, response.status_code in COMPUTING)

    def disconnect_upload(self) -> Outcome:
        """Announce a body, send half of it, and close the connection."""
        host, port = self.base.removeprefix("http://").split(":")
        body = json.dumps({"model": CLASSIFIER, "text": TEXTS[1]}).encode()
        began = time.perf_counter()
        head = f"POST /api/explain HTTP/1.1\r\nHost: {host}:{port}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
        try:
            with socket.create_connection((host, int(port)), timeout=10) as sock:
                sock.sendall(head.encode() + body[: len(body) // 2])
                time.sleep(0.05)
        except OSError as exc:  # the server has stopped listening (after the SIGTERM)
            return Outcome("disconnect mid-upload", "/api/explain", 0, time.perf_counter() - began, False, f"{type(exc).__name__}: {exc}")
        return Outcome("disconnect mid-upload", "/api/explain", 0, time.perf_counter() - began, True, "left")

    def stream(self, abandon: bool) -> Outcome:
        """Queue a job and read its server-sent events: to the result, or only to the first
        progress event (then close the stream)."""
        kind = "progress stream abandoned" if abandon else "progress stream"
        self.counter += 1
        method = self.plan.pick(CLASSIFIER, self.rng, self.counter)
        request = {"model": CLASSIFIER, "text": self.text(), "methods": [method["name"]], "options": {method["name"]: cheap_options(method)}}
        began = time.perf_counter()
        queued = self.post(kind, "/api/jobs", {"kind": "explain", "request": request}, {202, BUSY})
        if queued.status != 202:
            return queued
        ident = self.last.json()["id"]
        events, failed = Counter(), ""
        try:
            with self.http.stream("GET", f"/api/jobs/{ident}/events") as response:
                if response.status_code != 200:
                    return Outcome(kind, "/api/jobs/{id}/events", response.status_code, time.perf_counter() - began, False, "no stream")
                for line in response.iter_lines():
                    if line.startswith("event: "):
                        events[line[7:]] += 1
                        if (abandon and line == "event: progress") or line == "event: result":
                            break
                    elif line.startswith("data: ") and events["error"]:
                        failed = json.loads(line[6:])["error"]  # the method refused this model (as a 422 would say)
                        break
        except httpx.HTTPError as exc:
            return Outcome(kind, "/api/jobs/{id}/events", 0, time.perf_counter() - began, False, repr(exc)[:200])
        seconds = time.perf_counter() - began
        if abandon:
            return Outcome(kind, "/api/jobs/{id}/events", 200, seconds, events["progress"] + events["result"] + events["error"] >= 1)
        return Outcome(kind, "/api/jobs/{id}/events", 200, seconds, events["result"] + events["error"] == 1, failed or ("" if events["result"] else f"events {dict(events)}"))


def escaped(answer: dict) -> tuple[bool, str]:
    """A 200 whose rendered HTML carries no markup from the text (the hostile texts' tags are
    escaped) -- and, for explanations, a score per token in every method."""
    page = answer.get("html", "")
    if "<img" in page or "window.__pwned" in page.replace("window.__pwned=1", "") or "<script>window" in page:
        return False, "markup from the text in the answer's html"
    for method in answer.get("methods", []):
        if len(method["scores"]) != len(answer["tokens"]):
            return False, f"{method['name']}: {len(method['scores'])} scores for {len(answer['tokens'])} tokens"
    return True, ""


MIX: list[tuple[str, float]] = [
    ("explain_classifier", 6), ("explain_language_model", 3), ("compare", 1.5), ("curve", 1.5), ("generate", 2),
    ("stream", 1.5), ("stream_abandoned", 1.5), ("disconnect", 1.5), ("disconnect_upload", 1),
    ("malformed", 2), ("oversized", 1.5), ("unknown_model", 1), ("unknown_method", 1), ("read_only", 3),
]
"""The traffic mix: request kinds and their weights."""


def one(client: Client, name: str) -> Outcome:
    if name == "stream":
        return client.stream(abandon=False)
    if name == "stream_abandoned":
        return client.stream(abandon=True)
    return getattr(client, name)()


# ---------------------------------------------------------------------------- the run
@dataclass
class Soak:
    outcomes: list[Outcome] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)
    sent: int = 0

    def add(self, outcome: Outcome) -> None:
        with self.lock:
            self.outcomes.append(outcome)

    def claim(self, limit: int) -> bool:
        with self.lock:
            if self.sent >= limit:
                return False
            self.sent += 1
            return True


def client_loop(soak: Soak, base: str, plan: Plan, seed: int, args: argparse.Namespace, deadline: float) -> None:
    client = Client(base, plan, seed, args)
    names, weights = zip(*MIX, strict=True)
    try:
        while not soak.stop.is_set() and time.monotonic() < deadline and soak.claim(args.max_requests):
            outcome = one(client, client.rng.choices(names, weights)[0])
            soak.add(outcome)
            if outcome.status == BUSY:
                time.sleep(1.0)  # Retry-After
            elif outcome.status == 0 and not outcome.expected:
                time.sleep(0.2)  # no connection (the server stopping): no busy loop
    finally:
        client.close()


def start_server(port: int, args: argparse.Namespace, log: Path) -> subprocess.Popen:
    command = [
        sys.executable, "-m", "heedful", "serve", "--model", CLASSIFIER, "--model", LANGUAGE_MODEL,
        "--host", "127.0.0.1", "--port", str(port), "--queue-size", str(args.queue_size),
        "--timeout", str(args.timeout), "--max-chars", str(args.max_chars),
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env.setdefault("OMP_NUM_THREADS", "1")
    with open(log, "w") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)


def sigterm_under_load(base: str, server: subprocess.Popen, args: argparse.Namespace, soak: Soak) -> dict:
    """With the clients still sending, queue a long job, wait until the worker runs it, SIGTERM
    the server one second into it; report what that job answered, the exit code and the time
    to exit. (A job that cannot be queued or started within two minutes: the signal goes
    anyway, and the report says so.)"""
    http = httpx.Client(base_url=base, timeout=httpx.Timeout(args.timeout + 30, connect=10))
    request = {"model": LANGUAGE_MODEL, "text": TEXTS[5], "methods": ["integrated_gradients"],
               "options": {"integrated_gradients": {"n_steps": 64}}, "curve": True}
    found: dict = {"job": "never queued within 2 minutes (the queue stayed full)", "events": {}}
    ident, give_up = None, time.monotonic() + 120
    while ident is None and time.monotonic() < give_up:  # the queue is mostly full: keep asking
        response = http.post("/api/jobs", json={"kind": "explain", "request": request})
        if response.status_code == 202:
            ident = response.json()["id"]
        else:
            time.sleep(0.05)
    events: Counter = Counter()
    last: dict = {}
    running = threading.Event()

    def listen() -> None:
        name = ""
        try:
            with http.stream("GET", f"/api/jobs/{ident}/events") as response:
                for line in response.iter_lines():
                    if line.startswith("event: "):
                        name = line[7:]
                        events[name] += 1
                    elif line.startswith("data: "):
                        last.update(json.loads(line[6:]))
                        if name == "progress":
                            running.set()
                        if name in ("result", "error"):
                            return
        except httpx.HTTPError as exc:
            found["stream_error"] = type(exc).__name__
        finally:
            running.set()

    listener = None
    if ident is not None:
        listener = threading.Thread(target=listen, daemon=True)
        listener.start()
        running.wait(max(1.0, give_up - time.monotonic()))
        time.sleep(1.0)  # into its computation
        found["job"] = "queued, but not running within 2 minutes" if not events["progress"] else None
    with soak.lock:
        found["outcomes_before"] = len(soak.outcomes)
    server.send_signal(signal.SIGTERM)
    sent_at = time.perf_counter()
    try:
        code = server.wait(60)
        found["exit_seconds"] = time.perf_counter() - sent_at
    except subprocess.TimeoutExpired:
        server.kill()
        code = server.wait()
        found["exit_seconds"] = None
    found["exit_code"] = code
    if listener is not None:
        listener.join(10)
        found["events"] = dict(events)
        if found["job"] is None:
            found["job"] = "finished (its result)" if events["result"] else f"answered {last.get('error')!r}" if events["error"] else "no result or error event"
    http.close()
    return found


def warm_up(base: str, plan: Plan, args: argparse.Namespace) -> list[tuple[str, str, int, float]]:
    """One request, before the traffic, for each method that prepares something once per model
    (Mask-LRP's head statistics): ``(model, method, status, seconds)``."""
    found = []
    with httpx.Client(base_url=base, timeout=httpx.Timeout(args.timeout + 30, connect=10)) as http:
        for model in (CLASSIFIER, LANGUAGE_MODEL):
            for method in plan.methods(model):
                if "once per model" in method["cost"]:
                    began = time.perf_counter()
                    body = {"model": model, "text": TEXTS[0], "methods": [method["name"]], "curve": False}
                    response = http.post("/api/explain", json=body)
                    found.append((model, method["name"], response.status_code, time.perf_counter() - began))
    return found


def grouped(outcomes: list[Outcome], key: Callable[[Outcome], str]) -> dict[str, list[Outcome]]:
    found: dict[str, list[Outcome]] = {}
    for outcome in outcomes:
        found.setdefault(key(outcome), []).append(outcome)
    return found


def tally(counts: Counter, none: str) -> str:
    """``status: count`` pairs in order (status 0 named ``none``)."""
    return ", ".join(f"{status or none}: {n}" for status, n in sorted(counts.items()))


def report(
    args, outcomes: list[Outcome], after: list[Outcome], memory: dict, term: dict, loads: tuple, ready: float, wall: float, log_text: str, warmed: list
) -> tuple[str, bool]:
    statuses = Counter(o.status for o in outcomes)
    server_errors = sum(n for s, n in statuses.items() if s >= 500)
    unexpected = [o for o in outcomes if not o.expected]
    tracebacks = log_text.count("Traceback")
    growth = memory["baseline_last"] / memory["baseline_first"] - 1
    clean_exit = term.get("exit_code") == 0 and term.get("exit_seconds") is not None
    exited = "not within 60 s (killed)" if term.get("exit_seconds") is None else f"{term['exit_seconds']:.2f} s"
    passed = server_errors == 0 and not unexpected and tracebacks == 0 and growth <= 0.10 and clean_exit
    lines = [
        "# `heedful serve` soak",
        "",
        f"`{CLASSIFIER}` and `{LANGUAGE_MODEL}` on the real uvicorn server at 127.0.0.1 (one worker thread, queue of "
        f"{args.queue_size}, timeout {args.timeout:g} s, --max-chars {args.max_chars}), {args.minutes:g} minutes of mixed traffic from "
        f"{args.clients} concurrent clients ({len(outcomes)} requests), then a SIGTERM while the clients kept sending. "
        "A client refused with 429 waits the `Retry-After` second. Requests set small step and sample options "
        f"({', '.join(f'{k}={v}' for k, v in CHEAP.items())}).",
        "",
        "Warm-up, before the traffic (one request for each method that prepares something once per model; one that "
        "does not answer 200 within the server's timeout is left out of the traffic): "
        + ("; ".join(f"`{m}` on `{model}` {status} in {sec:.1f} s" for model, m, status, sec in warmed) or "none")
        + ".",
        "",
        "## Answers by status",
        "",
        "| status | requests |",
        "|---|---:|",
        *[f"| {'no answer (client left)' if s == 0 else s} | {n} |" for s, n in sorted(statuses.items())],
        f"| **5xx** | **{server_errors}** |",
        f"| unexpected (not a status the request's kind allows) | {len(unexpected)} |",
        "",
        "## By kind of request",
        "",
        "| kind | requests | statuses |",
        "|---|---:|---|",
    ]
    kinds = grouped(outcomes, lambda o: o.kind)
    for kind in sorted(kinds):
        counts = Counter(o.status for o in kinds[kind])
        lines.append(f"| {kind} | {len(kinds[kind])} | {tally(counts, 'left')} |")
    lines += [
        "",
        "## Latency per route (seconds, from sending to reading the whole answer, queue wait included)",
        "",
        "| route | answers | p50 | p90 | p99 | 200s | p50 (200) | p90 (200) | p99 (200) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    routes = grouped([o for o in outcomes if o.status], lambda o: o.route)
    for route in sorted(routes):
        every = [o.seconds for o in routes[route]]
        good = [o.seconds for o in routes[route] if o.status in (200, 202)]
        cells = [f"{percentile(every, q):.3f}" for q in (0.5, 0.9, 0.99)]
        good_cells = [f"{percentile(good, q):.3f}" if good else "--" for q in (0.5, 0.9, 0.99)]
        lines.append(f"| `{route}` | {len(every)} | {' | '.join(cells)} | {len(good)} | {' | '.join(good_cells)} |")
    lines += [
        "",
        "## Server memory (resident set)",
        "",
        "| when | RSS |",
        "|---|---:|",
        f"| start (models loaded, before traffic) | {memory['start']:.0f} MB |",
        f"| after the warm-up requests | {memory['warm']:.0f} MB |",
        f"| after 1 minute of traffic | {memory['minute']:.0f} MB (lowest within the minute: {memory['baseline_first']:.0f} MB) |",
        *[f"| after {m} minutes | {v:.0f} MB (lowest within the minute: {low:.0f} MB) |" for m, v, low in memory["minutes"][1:]],
        f"| end of traffic | {memory['end']:.0f} MB (lowest within the last minute: {memory['baseline_last']:.0f} MB) |",
        f"| peak (VmHWM) | {memory['peak']:.0f} MB |",
        f"| growth after warm-up (lowest of the last minute / lowest of the first; a reading between jobs, "
        f"where an instant one counts the running job's working memory) | {growth:+.1%} |",
        "",
        "## SIGTERM during load",
        "",
        f"- the running job (`integrated_gradients`, n_steps 64, on `{LANGUAGE_MODEL}`, sent SIGTERM once it reported progress): "
        f"{term['job']}; its events: {term['events']}",
        f"- exit code {term.get('exit_code')}, {exited} after the signal",
        f"- requests answered after the signal: {tally(Counter(o.status for o in after), 'no answer') or 'none'}",
        f"- tracebacks in the server's log: {tracebacks}",
        "",
        f"Checks: zero 5xx during the soak -- {'yes' if server_errors == 0 else 'NO'}; every answer one its request allows -- "
        f"{'yes' if not unexpected else 'NO'}; memory growth after warm-up <= 10 % -- {'yes' if growth <= 0.10 else 'NO'}; "
        f"clean exit on SIGTERM -- {'yes' if clean_exit else 'NO'}; no traceback in the log -- {'yes' if tracebacks == 0 else 'NO'}.",
    ]
    refusals = Counter(
        o.note for o in outcomes
        if o.expected and o.note and ((o.status == 422 and o.kind != "malformed JSON") or (o.status == 200 and o.kind.startswith("progress")))
    )
    if refusals:
        lines += [
            "",
            "Explanations refused by their method for this model, although `GET /api/methods` lists the method as supported "
            "(it checks the task, not the architecture):",
            *[f"- {n} x {note}" for note, n in refusals.most_common()],
        ]
    if unexpected:
        lines += ["", "Unexpected answers (first 15):", *[f"- {o.kind} `{o.route}` {o.status}: {o.note}" for o in unexpected[:15]]]
    lines += [
        "",
        "## Set-up",
        "",
        command_line(),
        f"- date: {time.strftime('%Y-%m-%dT%H:%M:%S%z')}; server ready {ready:.1f} s after start (both models loaded); traffic {wall:.0f} s",
        f"- machine: {cpu_name()}, {os.cpu_count()} logical cores, shared with other work; load average (1 min) {loads[0]:.2f} before, "
        f"{loads[1]:.2f} after; OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '1 (set for the server)')}",
        f"- python {sys.version.split()[0]}, {library_versions('torch', 'transformers', 'fastapi', 'uvicorn', 'httpx')}",
        f"- result: {'PASS' if passed else 'FAIL'}",
        "",
    ]
    return "\n".join(lines), passed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="Minutes of traffic (default 10).")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--max-requests", type=int, default=50_000, help="No more requests than this, whatever the time.")
    parser.add_argument("--queue-size", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=120.0, help="The server's request timeout.")
    parser.add_argument("--max-chars", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "serve_soak.md")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="heedful-serve-soak-"))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    loads = [os.getloadavg()[0], float("nan")]
    log = work / "server.log"
    server = start_server(port, args, log)
    memory = Memory(server.pid)
    soak = Soak()
    found: dict = {}
    try:
        ready = wait_ready(base, server, 900)
        found["start"] = memory.now()
        plan = read_plan(base)
        warmed = warm_up(base, plan, args)
        for model, method, status, _ in warmed:  # one not ready within the timeout stays out of the traffic
            if status != 200:
                for rows in plan.families[model].values():
                    rows[:] = [row for row in rows if row["name"] != method]
                plan.families[model] = {family: rows for family, rows in plan.families[model].items() if rows}
        found["warm"] = memory.now()
        began = time.monotonic()
        deadline = began + args.minutes * 60
        print(f"soaking {base} for {args.minutes:g} min with {args.clients} clients (server log: {log})", file=sys.stderr)
        clients = [
            threading.Thread(target=client_loop, args=(soak, base, plan, args.seed * 1000 + i, args, float("inf")), daemon=True)
            for i in range(args.clients)
        ]
        for thread in clients:
            thread.start()
        samples: list[tuple[int, float, float]] = []  # (minute, RSS at its end, lowest RSS within it)
        minute, window = 1, []
        while time.monotonic() < deadline and len(soak.outcomes) < args.max_requests and server.poll() is None:
            time.sleep(0.5)
            window.append(memory.now())
            if time.monotonic() - began >= 60 * minute:
                samples.append((minute, window[-1], min(window)))
                print(f"  {minute} min: {len(soak.outcomes)} requests, RSS {window[-1]:.0f} MB (lowest {min(window):.0f})", file=sys.stderr)
                minute, window = minute + 1, []
        wall = time.monotonic() - began
        found["minutes"] = samples
        found["minute"] = samples[0][1] if samples else float("nan")
        found["end"] = memory.now()
        # the resident set between jobs: the lowest of a minute's half-second readings (an
        # instant reading counts the running job's working memory, up to a few hundred MB)
        found["baseline_first"] = samples[0][2] if samples else float("nan")
        found["baseline_last"] = min(window) if len(window) >= 60 else (samples[-1][2] if samples else float("nan"))
        found["peak"] = memory.peak()
        with soak.lock:
            during = list(soak.outcomes)
        term = sigterm_under_load(base, server, args, soak)
        soak.stop.set()
        for thread in clients:
            thread.join(args.timeout + 60)
    finally:
        soak.stop.set()
        if server.poll() is None:
            server.kill()
            server.wait()
    loads[1] = os.getloadavg()[0]
    cut = term.get("outcomes_before", len(during))
    after = soak.outcomes[cut:]
    text, passed = report(args, soak.outcomes[:cut], after, found, term, tuple(loads), ready, wall, log.read_text(errors="replace"), warmed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(text)
    print(f"written to {args.out}; server log {log}")
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
