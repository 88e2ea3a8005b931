"""Load test of ``heedful serve``: the real uvicorn server on 127.0.0.1 (a free port), the zoo's
default model, a fixed number of ``POST /api/explain`` requests from concurrent clients.

Every client sends its share of the requests one after another (a client that is refused with
429 waits the ``Retry-After`` seconds before its next request; the refused request is not sent
again). Checked: no 5xx answer, every 429 is the clean ``{"error", "hint"}`` busy message, every
200 has a score per token and an AOPC. Reported: the answers by status, the median and p95
latency, throughput, and the server's resident memory (after loading, peak, at the end).

Bounded: ``--requests`` requests at most, and no request starts after ``--time-limit`` seconds;
the server is stopped at the end whatever happened. Writes ``benchmarks/results/serve_load.md``.

    python benchmarks/serve_load.py                      # 200 requests, 20 clients, the default model
    python benchmarks/serve_load.py --tiny --requests 40 # a quick check of the script (tiny model)
"""

from __future__ import annotations

import argparse
import itertools
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from _shared import ROOT, command_line, cpu_name, fmt_s, library_versions, write_results

from heedful import zoo

BUSY = "the server is busy"


@dataclass
class Answer:
    """One request's outcome: HTTP status (0: no answer), seconds, and whether its body was the
    expected one for that status."""

    status: int
    seconds: float
    clean: bool
    note: str = ""


@dataclass
class Memory:
    """The server's resident set (MB): sampled every 50 ms; ``peak`` is the kernel's high-water mark."""

    pid: int
    samples: list[float] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def _field(self, name: str) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(name + ":"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def now(self) -> float:
        return self._field("VmRSS")

    def peak(self) -> float:
        return self._field("VmHWM")

    def watch(self) -> None:
        while not self.stop.wait(0.05):
            try:
                self.samples.append(self.now())
            except OSError:
                return


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def texts(n: int, tiny: bool) -> list[str]:
    """The request texts: movies test sentences, or the tests' corpus with ``--tiny``."""
    if tiny:
        sys.path.insert(0, str(ROOT / "tests"))
        from tiny import CORPUS  # type: ignore[import-not-found]

        return list(dict.fromkeys(CORPUS))
    from heedful import datasets

    return [example.text for example in datasets.load("movies", "test", n=n)]


def start_server(model: str, port: int, args: argparse.Namespace, log: Path) -> subprocess.Popen:
    command = [
        sys.executable, "-m", "heedful.cli", "serve", "--model", model, "--host", "127.0.0.1", "--port", str(port),
        "--queue-size", str(args.queue_size), "--timeout", str(args.timeout),
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    with open(log, "w") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)


def wait_ready(base: str, server: subprocess.Popen, limit: float) -> float:
    """Seconds until the server answers ``GET /api/models`` (its models are loaded first)."""
    began = time.perf_counter()
    while time.perf_counter() - began < limit:
        if server.poll() is not None:
            raise SystemExit(f"the server exited with {server.returncode} before it was ready")
        try:
            if httpx.get(f"{base}/api/models", timeout=2).status_code == 200:
                return time.perf_counter() - began
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"the server was not ready after {limit:.0f} s")


def check(response: httpx.Response) -> tuple[bool, str]:
    """Whether the answer is what its status promises."""
    try:
        body = response.json()
    except ValueError:
        return False, "not JSON"
    if response.status_code == 200:
        ok = all(len(m["scores"]) == len(body["tokens"]) and m["aopc"] is not None for m in body["methods"])
        return ok, "" if ok else "scores or AOPC missing"
    if response.status_code == 429:
        ok = set(body) == {"error", "hint"} and body["error"].startswith(BUSY) and response.headers.get("retry-after") == "1"
        return ok, "" if ok else f"unclean 429: {body}"
    return False, str(body)[:200]


def run_load(base: str, sentences: list[str], args: argparse.Namespace) -> tuple[list[Answer], float]:
    """``args.requests`` requests from ``args.clients`` clients; returns the answers and the wall time."""
    counter, lock = itertools.count(), threading.Lock()
    answers: list[Answer] = []
    deadline = time.monotonic() + args.time_limit

    def client() -> None:
        with httpx.Client(base_url=base, timeout=args.timeout + 30) as http:
            while time.monotonic() < deadline:
                with lock:
                    i = next(counter)
                if i >= args.requests:
                    return
                body = {"text": sentences[i % len(sentences)], "methods": args.methods.split(","), "curve": True}
                began = time.perf_counter()
                try:
                    response = http.post("/api/explain", json=body)
                except httpx.HTTPError as exc:
                    answers.append(Answer(0, time.perf_counter() - began, False, type(exc).__name__))
                    continue
                seconds = time.perf_counter() - began
                ok, note = check(response)
                with lock:
                    answers.append(Answer(response.status_code, seconds, ok, note))
                if response.status_code == 429:
                    time.sleep(float(response.headers.get("retry-after", "1")))

    began = time.perf_counter()
    with ThreadPoolExecutor(args.clients) as pool:
        for future in [pool.submit(client) for _ in range(args.clients)]:
            future.result()
    return answers, time.perf_counter() - began


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (linear interpolation between order statistics)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    at = (len(ordered) - 1) * q
    low = int(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def report(args, model: str, answers: list[Answer], wall: float, memory: dict[str, float], ready: float, loads: tuple[float, float]) -> tuple[str, bool]:
    by_status: dict[int, list[Answer]] = {}
    for answer in answers:
        by_status.setdefault(answer.status, []).append(answer)
    served = [a.seconds for a in by_status.get(200, [])]
    refused = by_status.get(429, [])
    server_errors = sum(len(v) for k, v in by_status.items() if k >= 500)
    failures = [a for a in answers if not a.clean]
    passed = server_errors == 0 and not failures and len(answers) == args.requests
    lines = [
        "# `heedful serve` under load",
        "",
        f"`{model}` on the real uvicorn server at 127.0.0.1 (one worker thread, queue of {args.queue_size}, timeout "
        f"{args.timeout:g} s), {args.requests} `POST /api/explain` requests ({args.methods}, with the per-example deletion "
        f"curve, AOPC and sufficiency) from {args.clients} concurrent clients; a client refused with 429 waits the "
        "`Retry-After` second before its next request (the refused one is not sent again). One warm-up request came first.",
        "",
        "| measure | value |",
        "|---|---:|",
        f"| requests answered | {len(answers)} of {args.requests} |",
        f"| 200 OK | {len(served)} |",
        f"| 429 busy (all clean `{{error, hint}}` + `Retry-After`) | {len(refused)} ({'yes' if all(a.clean for a in refused) else 'NO'}) |",
        f"| 5xx | {server_errors} |",
        f"| other answers / transport errors | {len(answers) - len(served) - len(refused) - server_errors} |",
        f"| latency of 200s: median | {fmt_s(statistics.median(served)) if served else '--'} |",
        f"| latency of 200s: p95 | {fmt_s(percentile(served, 0.95)) if served else '--'} |",
        f"| latency of 200s: max | {fmt_s(max(served)) if served else '--'} |",
        f"| latency of 429s: median | {fmt_s(statistics.median([a.seconds for a in refused])) if refused else '--'} |",
        f"| wall time; answered requests per second | {wall:.1f} s; {len(served) / wall:.2f} |",
        f"| server RSS after loading the model | {memory['ready']:.0f} MB |",
        f"| server RSS peak (VmHWM) | {memory['peak']:.0f} MB |",
        f"| server RSS at the end | {memory['end']:.0f} MB |",
        "",
        f"Checks: zero 5xx -- {'yes' if server_errors == 0 else 'NO'}; every 429 clean -- "
        f"{'yes' if all(a.clean for a in refused) else 'NO'}; every 200 has a score per token and an AOPC -- "
        f"{'yes' if all(a.clean for a in by_status.get(200, [])) else 'NO'}.",
    ]
    if failures:
        lines += ["", "Unexpected answers:", *[f"- {a.status}: {a.note}" for a in failures[:10]]]
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    lines += [
        "",
        "## Set-up",
        "",
        command_line(),
        f"- date: {time.strftime('%Y-%m-%dT%H:%M:%S%z')}; server ready {ready:.1f} s after start (model loaded)",
        f"- machine: {cpu_name()}, {os.cpu_count()} logical cores; niceness {nice} (server and clients); "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}; load average {loads[0]:.2f} before, {loads[1]:.2f} after",
        f"- python {sys.version.split()[0]}, {library_versions('torch', 'transformers', 'fastapi', 'uvicorn', 'httpx')}",
        "- latency: from sending a request to reading its whole answer, queue wait included",
        f"- result: {'PASS' if passed else 'FAIL'}",
        "",
    ]
    return "\n".join(lines), passed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=zoo.DEFAULT_MODEL, help="Zoo model to serve (default: the zoo's default).")
    parser.add_argument("--tiny", action="store_true", help="Serve the tests' tiny BERT instead (checks the script quickly).")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--methods", default="normxlogit", help="Comma-separated methods of every request.")
    parser.add_argument("--queue-size", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=120.0, help="The server's request timeout.")
    parser.add_argument("--time-limit", type=float, default=600.0, help="No request starts after this many seconds.")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "serve_load.md")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="heedful-serve-load-"))
    model = args.model
    if args.tiny:
        sys.path.insert(0, str(ROOT / "tests"))
        from tiny import tiny_hf  # type: ignore[import-not-found]

        hf_model, tokenizer = tiny_hf("bert", "classification")
        model = str(work / "tiny-bert")
        hf_model.save_pretrained(model)
        tokenizer.save_pretrained(model)
    sentences = texts(50, args.tiny)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    loads = [os.getloadavg()[0], float("nan")]
    server = start_server(model, port, args, work / "server.log")
    memory = Memory(server.pid)
    try:
        ready = wait_ready(base, server, 900)
        found = {"ready": memory.now()}
        warm = httpx.post(f"{base}/api/explain", json={"text": sentences[0], "methods": args.methods.split(",")}, timeout=args.timeout + 30)
        if warm.status_code != 200:
            raise SystemExit(f"the warm-up request failed: {warm.status_code} {warm.text[:300]}")
        watcher = threading.Thread(target=memory.watch, daemon=True)
        watcher.start()
        answers, wall = run_load(base, sentences, args)
        memory.stop.set()
        found.update(peak=memory.peak(), end=memory.now())
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    loads[1] = os.getloadavg()[0]
    text, passed = report(args, "tiny BERT (tests)" if args.tiny else model, answers, wall, found, ready, tuple(loads))
    write_results(args.out, text)
    print(args.out.read_text(encoding="utf-8"))
    print(f"written to {args.out}")
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
