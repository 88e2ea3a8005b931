"""The job queue: one worker thread computes every request, in order of arrival.

A request becomes a :class:`Job` in a bounded queue (full: HTTP 429). The worker takes one job
at a time, so each model is in memory once and no two requests compete for it. A job reports
progress events (``progress``, then ``result`` or ``error``) that ``GET /api/jobs/{id}/events``
streams; a job past its deadline stops at its next progress report or at the next module
forward pass of its model, and answers 504 (loading a model does not count: the clock starts
again once the model is in memory).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import functools
import logging
import queue
import statistics
import sys
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

from heedful.errors import HeedfulError
from heedful.model import Model
from heedful.serve.errors import ApiError, as_api_error, busy, shutting_down, timed_out

log = logging.getLogger("heedful.serve")

TYPICAL_OF = 16
"""Jobs whose compute times make the typical job's (their mean), for refusing requests that
would wait past their deadline."""
KEPT_JOBS = 256
"""Finished jobs remembered for ``GET /api/jobs/{id}/events`` (the oldest are forgotten)."""


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` (``None`` elsewhere: other allocators, other systems)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def release_memory() -> None:
    """Hand the memory a finished job freed back to the system. glibc keeps freed heap pages
    (a job's many temporary tensors leave its arenas fragmented), so without this the server's
    resident memory climbs towards the sum of the largest requests it has seen (measured by
    ``benchmarks/serve_soak.py``); ``malloc_trim(0)`` returns every free page (milliseconds)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


class Cancelled(Exception):
    """Raised inside a job that has passed its deadline or whose client went away."""


class Job:
    """One request: its ``kind``, the ``work(job)`` that computes its answer, a deadline, the
    events it has reported and a future holding the answer (or an :class:`ApiError`)."""

    def __init__(self, kind: str, work: Callable[[Job], Any], timeout_s: float) -> None:
        self.id = uuid.uuid4().hex[:16]
        self.kind = kind
        self.work = work
        self.timeout_s = timeout_s
        self.created = time.monotonic()
        self.deadline = self.created + timeout_s
        self.started = self.created  # when its clock started (again, once its model was loaded)
        self.future: concurrent.futures.Future = concurrent.futures.Future()
        self.events: list[tuple[str, dict[str, Any]]] = []
        self._cancelled = threading.Event()
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ state
    @property
    def finished(self) -> bool:
        return self.future.done() or any(name in ("result", "error") for name, _ in self.events_from(0))

    def cancel(self) -> None:
        """Stop the job at its next check (it then answers 504)."""
        self._cancelled.set()

    def restart_clock(self) -> None:
        """Give the job its whole timeout again from now (once its model is loaded: loading,
        and building a zoo model on first use, do not count against a request's time)."""
        self.started = time.monotonic()
        self.deadline = self.started + self.timeout_s

    def should_stop(self) -> bool:
        return self._cancelled.is_set() or self.future.cancelled() or time.monotonic() > self.deadline

    def check(self) -> None:
        """Raise :class:`Cancelled` when the job should stop."""
        if self.should_stop():
            raise Cancelled

    # ------------------------------------------------------------------ events
    def _event(self, name: str, data: dict[str, Any]) -> None:
        with self._lock:
            self.events.append((name, data))

    def progress(self, done: int, total: int, stage: str) -> None:
        """Report ``done`` of ``total`` steps (now at ``stage``); stops a job past its deadline."""
        self.check()
        self._event("progress", {"done": done, "total": total, "stage": stage})

    def _end(self, name: str, data: dict[str, Any]) -> bool:
        """Record the job's one outcome event; ``False`` when it already has one (the first
        outcome stands: a job answered 503 while stopping is not answered again later)."""
        with self._lock:
            if any(event in ("result", "error") for event, _ in self.events):
                return False
            self.events.append((name, data))
            return True

    def succeed(self, result: Any) -> None:
        if self._end("result", result):
            with contextlib.suppress(concurrent.futures.InvalidStateError):  # its waiter gave up
                self.future.set_result(result)

    def fail(self, error: ApiError) -> None:
        if self._end("error", error.payload()):
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                self.future.set_exception(error)

    def events_from(self, start: int) -> list[tuple[str, dict[str, Any]]]:
        with self._lock:
            return self.events[start:]


class Worker:
    """The one thread that runs jobs, with the bounded queue in front of it."""

    def __init__(self, queue_size: int) -> None:
        self.queue: queue.Queue[Job] = queue.Queue(maxsize=queue_size)
        self.jobs: OrderedDict[str, Job] = OrderedDict()
        self.current: Job | None = None
        self._jobs_lock = threading.Lock()
        self._stop = threading.Event()
        self._watched: set[int] = set()
        self._seconds: deque[float] = deque(maxlen=TYPICAL_OF)
        self._thread = threading.Thread(target=self._loop, name="heedful-serve-worker", daemon=True)
        self._started = False

    # ------------------------------------------------------------------ life
    def start(self) -> None:
        if not self._started:
            self._started = True
            self._thread.start()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def stop(self, wait: float = 5.0) -> None:
        """Stop taking jobs (a submit now answers 503): queued jobs and the running one answer 503
        at once (the running computation stops at its next check: a model pass or a progress
        report); waits up to ``wait`` s for the thread, once (a second stop only drains)."""
        first = not self._stop.is_set()
        self._stop.set()
        self._drain()
        current = self.current
        if current is not None:
            current.cancel()
            current.fail(shutting_down())
        if self._started and first:
            self._thread.join(wait)
        self._drain()  # a job queued while the thread was finishing

    def _drain(self) -> None:
        while True:
            try:
                job = self.queue.get_nowait()
            except queue.Empty:
                return
            job.fail(shutting_down())

    # ------------------------------------------------------------------ jobs
    @property
    def typical_seconds(self) -> float | None:
        """The mean time the last jobs took to compute (``None`` before the first): the mean, not
        the median, as the wait behind ``k`` jobs is their sum, long ones included."""
        seconds = list(self._seconds)  # one atomic copy: the worker appends meanwhile
        return statistics.fmean(seconds) if seconds else None

    def submit(self, kind: str, work: Callable[[Job], Any], timeout_s: float) -> Job:
        """Queue a job; an :class:`ApiError` 429 when the queue is full, or when the jobs ahead
        of it would, at the typical job's time, leave it no time before its deadline (refused
        now rather than answered 504 after waiting for nothing); 503 once stopping."""
        if self.stopping:
            raise shutting_down()
        typical, waiting = self.typical_seconds, self.waiting
        if typical is not None and waiting > 0:
            ahead = waiting + (self.current is not None)
            if (ahead + 1) * typical > timeout_s:
                raise busy(waiting, ahead * typical, timeout_s)
        job = Job(kind, work, timeout_s)
        try:
            self.queue.put_nowait(job)
        except queue.Full:
            raise busy(self.queue.qsize()) from None
        with self._jobs_lock:
            self.jobs[job.id] = job
            while len(self.jobs) > KEPT_JOBS:
                oldest = next(iter(self.jobs))
                if not self.jobs[oldest].finished:
                    break
                self.jobs.pop(oldest)
        return job

    def job(self, ident: str) -> Job | None:
        with self._jobs_lock:
            return self.jobs.get(ident)

    @property
    def waiting(self) -> int:
        return self.queue.qsize()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                job = self.queue.get(timeout=0.2)
            except queue.Empty:
                continue
            self.current = job
            try:
                self._run(job)
            finally:
                self.current = None
                release_memory()

    def _run(self, job: Job) -> None:
        if self.stopping:  # taken from the queue as the server began to stop
            job.fail(shutting_down())
            return
        try:
            job.check()  # waited past its deadline (or its client left) in the queue
            began = time.monotonic()
            try:
                result = job.work(job)
            finally:  # the compute time, without loading the model
                self._seconds.append(time.monotonic() - max(began, job.started))
        except Cancelled:
            job.fail(shutting_down() if self.stopping else timed_out(job.timeout_s))
        except HeedfulError as exc:
            job.fail(as_api_error(exc))
        except Exception as exc:  # a bug, not bad input: the server keeps serving
            log.exception("job %s (%s) failed", job.id, job.kind)
            job.fail(ApiError(500, f"internal error: {type(exc).__name__}: {exc}", "please report this with the request that caused it"))
        else:
            job.succeed(result)

    # ------------------------------------------------------------------ stopping inside a pass
    def watch(self, model: Model) -> Model:
        """Let a job past its deadline stop at the next module forward of ``model`` (hooks that
        only read the current job's state; installed once per model)."""
        if id(model) in self._watched:
            return model
        self._watched.add(id(model))

        def check(module, args) -> None:
            job = self.current
            if job is not None and threading.current_thread() is self._thread and job.should_stop():
                raise Cancelled

        for module in model.hf_model.modules():
            module.register_forward_pre_hook(check)
        return model
