"""The Ray engine of ``heedful bench`` (``--engine ray``): the plan's tasks on Ray worker actors.

Each worker actor loads the model once (``loader``, e.g. ``functools.partial(heedful.load,
"minilm-sentiment")``, called in the worker) and computes tasks with
:func:`heedful.evaluate.tasks.compute_part` -- the local engine's code, so results are the same.
The driver keeps every worker busy with up to ``depth`` tasks, takes results as they finish
(``ray.wait``) and alone writes the results store, one transaction per task
(:func:`~heedful.evaluate.tasks.write_part`). A worker that dies is restarted by Ray and the
driver sends its unfinished tasks again (``retries`` in the report); a driver that dies loses only
tasks not yet written, and the same command run again computes only those
(:func:`heedful.evaluate.bench.plan_bench`).

Ray is optional (``pip install 'heedful[ray]'``) and imported here only, when the engine runs.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heedful.errors import HeedfulError, install_hint

if TYPE_CHECKING:
    from heedful.evaluate.bench import EngineReport, Plan
    from heedful.evaluate.store import ResultsStore
    from heedful.evaluate.tasks import Part, PartResult, Settings
    from heedful.model import Model

INSTALL_HINT = install_hint("ray")
RESTART_WAIT = 600.0
"""Seconds a task waits for its dead worker to be restarted before the run stops."""


def import_ray():
    """The ``ray`` module, or a one-line :class:`HeedfulError` naming the extra to install."""
    try:
        import ray
    except ImportError as exc:
        raise HeedfulError("--engine ray needs Ray, which is not installed", hint=INSTALL_HINT) from exc
    return ray


class BenchWorker:
    """One worker process: the model, loaded once, and the random source ablations its tasks
    share (:class:`~heedful.evaluate.context.SharedAblations`). ``threads``: torch threads."""

    def __init__(self, loader: Callable[[], Model], threads: int) -> None:
        import torch

        from heedful.evaluate.context import SharedAblations

        torch.set_num_threads(threads)
        self.model = loader()
        self.shared = SharedAblations()

    def pid(self) -> int:
        return os.getpid()

    def compute(self, part: Part, settings: Settings) -> PartResult:
        from heedful.evaluate.tasks import compute_part

        return compute_part(self.model, part, settings, self.shared)


def _worker_path() -> str:
    """PYTHONPATH for workers of a local cluster: the folder this heedful is imported from
    first, so workers run the driver's heedful (a source checkout as much as an install)."""
    here = str(Path(__file__).resolve().parents[2])
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != here]
    return os.pathsep.join([here, *rest])


class RayEngine:
    """Runs a bench plan on ``workers`` Ray actors (default: one per CPU of the cluster).
    ``address``: ``None`` starts a local cluster of ``workers`` CPUs (stopped at the end); ``"auto"`` or ``"ray://host:10001"`` joins a
    running one (a cluster this process already joined is reused). ``threads``: torch threads
    per worker (one per CPU it reserves). ``depth``: tasks queued per worker, so a worker never
    waits for the driver. ``max_retries``: times one task is sent again after its worker died.
    ``on_start(pids)``: called with the workers' process ids once they have loaded the model."""

    name = "ray"

    def __init__(
        self,
        loader: Callable[[], Model],
        workers: int | None = None,
        address: str | None = None,
        *,
        threads: int = 1,
        depth: int = 2,
        max_retries: int = 3,
        on_start: Callable[[list[int]], None] | None = None,
    ) -> None:
        if workers is not None and workers < 1:
            raise HeedfulError(f"--workers must be at least 1, got {workers}")
        self.loader, self.workers, self.address = loader, workers, address
        self.threads, self.depth, self.max_retries, self.on_start = threads, depth, max_retries, on_start

    def _connect(self, ray) -> bool:
        """Join or start the cluster; True when this call started it (and stops it)."""
        if ray.is_initialized():
            return False
        env = {"OMP_NUM_THREADS": str(self.threads), "MKL_NUM_THREADS": str(self.threads)}
        quiet: dict[str, Any] = {"log_to_driver": False, "logging_level": "ERROR"}
        try:
            if self.address is None:
                env["PYTHONPATH"] = _worker_path()
                cpus = (self.workers or os.cpu_count() or 1) * self.threads
                ray.init(
                    num_cpus=cpus, include_dashboard=False,
                    runtime_env={"env_vars": env}, **quiet,
                )
            else:
                ray.init(address=self.address, runtime_env={"env_vars": env}, **quiet)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            where = self.address or "a local cluster"
            raise HeedfulError(f"cannot start Ray on {where}: {str(exc).splitlines()[0]}", hint="check --address (auto, or ray://host:10001)") from exc
        return True

    def run(self, plan: Plan, store: ResultsStore, advance: Callable[[Part, PartResult], None]) -> EngineReport:
        """Compute ``plan``'s tasks on the workers; write each result as it arrives."""
        from heedful.evaluate.bench import EngineReport

        ray = import_ray()
        report = EngineReport(self.name, stored=plan.stored)
        if not plan.tasks:
            return report
        started = self._connect(ray)
        actors: list[Any] = []
        try:
            began = time.perf_counter()
            remote = ray.remote(num_cpus=self.threads, max_restarts=self.max_retries, max_task_retries=0)(BenchWorker)
            workers = self.workers or max(1, int(ray.available_resources().get("CPU", 1)) // self.threads)
            count = min(workers, len(plan.tasks))
            actors = [remote.remote(self.loader, self.threads) for _ in range(count)]
            try:
                pids = self._get(ray, [a.pid.remote() for a in actors])
            except ray.exceptions.RayError as exc:  # died while loading, or could not be started
                raise HeedfulError(
                    f"the Ray workers could not start and load the model: {_first_line(exc)}",
                    hint="check that the model loads with --engine local, and the workers' Python environment",
                ) from exc
            if self.on_start is not None:
                self.on_start(pids)
            labels = [f"worker {w} (pid {pid})" for w, pid in enumerate(pids)]
            queue = deque(plan.tasks)
            tries = {task.index: 0 for task in plan.tasks}
            pending: dict[Any, tuple[Any, int, Part]] = {}

            def submit(w: int, task) -> None:
                part = plan.part(task, store)
                pending[actors[w].compute.remote(part, plan.settings)] = (task, w, part)

            for _ in range(self.depth):
                for w in range(count):
                    if queue:
                        submit(w, queue.popleft())
            waiting: dict[int, float] = {}  # task -> when it first failed, while its worker restarts
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                task, w, part = pending.pop(done[0])
                try:
                    result = self._get(ray, done[0])
                except ray.exceptions.RayActorError as exc:  # the worker died: Ray restarts it
                    if task.index not in waiting:  # one retry per failure, however long the restart
                        waiting[task.index] = time.monotonic()
                        report.retries += 1
                    restarting = isinstance(exc, ray.exceptions.ActorUnavailableError)
                    if not restarting:
                        tries[task.index] += 1
                    if tries[task.index] > self.max_retries or time.monotonic() - waiting[task.index] > RESTART_WAIT:
                        raise HeedfulError(
                            f"task {task.index} ({part.method}) failed: its worker died ({_first_line(exc)})",
                            hint="run the same command again to resume; check the workers' memory",
                        ) from exc
                    if restarting:
                        time.sleep(0.2)  # the actor is being restarted: send the task again shortly
                    submit(w, task)
                    continue
                waiting.pop(task.index, None)
                report.write(store, part, result, plan.settings)
                if result.pid != pids[w]:
                    report.restarts += 1
                    pids[w] = result.pid
                    labels[w] = f"worker {w} (pid {result.pid})"
                report.add(labels[w], result)
                report.seconds = time.perf_counter() - began
                advance(part, result)
                if queue:
                    submit(w, queue.popleft())
        finally:
            for actor in actors:
                ray.kill(actor, no_restart=True)
            if started:
                ray.shutdown()
        return report

    @staticmethod
    def _get(ray, refs):
        """``ray.get`` re-raising a task's own error (an :class:`HeedfulError` from a method stays
        one; a worker's death stays a ``RayActorError``)."""
        try:
            return ray.get(refs)
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause if isinstance(getattr(exc, "cause", None), BaseException) else None
            if cause is not None and not isinstance(cause, ray.exceptions.RayActorError):
                raise cause from None
            raise


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__

