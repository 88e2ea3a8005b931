"""``heedful bench``: methods x examples x metrics, stored per example, resumable.

:func:`run_bench` explains every selected example with every method (the random baseline once
per seed), measures the raw perturbation curves the metrics need, derives the metrics, and
stores all of it in a :class:`~heedful.evaluate.store.ResultsStore` as it goes. A run that is
killed and started again finds what is stored and computes only the rest; asking for another
metric later reuses the stored explanations (and the stored curves when the metric reads the
same ones). Cost per method -- seconds and forward / backward passes per example from each
:class:`~heedful.Explanation`'s ``cost``, and peak resident memory while the method ran -- is
stored with the results. Stored results are keyed by :func:`heedful.evaluate.store.run_key`
(complete options, method version, model and dataset fingerprints), so a changed default, a new
method version, other weights or edited data are computed afresh, and ``BenchResult.notes`` says
why. :mod:`heedful.evaluate.report` turns the stored results into tables and plots.

The work is planned as tasks -- a run on a chunk of examples (:func:`plan_bench`) -- computed by
an engine: the :class:`LocalEngine` (this process, the default), which stores every step of a
task (a model batch explained or evaluated, :func:`heedful.evaluate.tasks.compute_steps`) in its
own transaction, or :class:`heedful.evaluate.ray_engine.RayEngine` (Ray worker actors; the driver
alone writes, a task per transaction). Both compute the same batches the same way, so their
stores are equal. Ctrl-C stops a bench with what it stored kept (:class:`~heedful.errors.Interrupted`
says how much). Several benches may write one store at once: the local engine claims a task
before computing it and takes tasks no live process claims first, and every write keeps rows
another writer stored (:mod:`heedful.evaluate.store`).
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from heedful.engine.workload import NOTHING, Work, check
from heedful.errors import HeedfulError, InputError, Interrupted, did_you_mean
from heedful.evaluate.context import SharedAblations
from heedful.evaluate.evaluation import (
    ModelInput,
    check_metric,
    concat_per_example,
    model_inputs,
    sources_for,
)
from heedful.evaluate.intervals import percentile_interval
from heedful.evaluate.metrics import (
    METRICS,
    PerExample,
    Summary,
    aggregate,
    metric_names,
)
from heedful.evaluate.protocol import Protocol, get_protocol
from heedful.evaluate.store import ResultsStore, RunKey, Subject, run_key, subject
from heedful.evaluate.tasks import Part, PartResult, Settings, compute_steps, write_part
from heedful.model import Model


@dataclass
class BenchSpec:
    """What to run. ``model``: a loaded :class:`heedful.Model` (:func:`heedful.load`);
    ``dataset``: a name of :func:`heedful.datasets.load` or a file path; ``n``: first ``n``
    examples the protocol keeps; ``seed``: seed of stochastic methods (the random baseline runs
    with seeds ``seed .. seed + protocol.random_seeds - 1``); ``method_options``: per-method
    options (``{"integrated_gradients": {"n_steps": 20}}``); ``model_label``: how the model is
    named in the store and the report (default: its folder path or the name it was loaded by);
    ``chunk``: examples per task, the unit an engine computes and the store commits (default four
    model batches)."""

    model: Model
    dataset: str
    methods: Sequence[str]
    metrics: Sequence[str]
    protocol: Protocol
    out: Path
    split: str = "test"
    n: int | None = None
    seed: int = 0
    batch_size: int = 16
    method_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    dataset_options: dict[str, Any] = field(default_factory=dict)
    model_label: str | None = None
    lm_word: str = "target"
    chunk: int | None = None


@dataclass
class Run:
    """One method run: ``group`` is the method as reported (seeds of the random baseline form
    one group), ``key`` its identity in the store."""

    method: str
    group: str
    options: dict[str, Any]
    key: RunKey
    seed: int | None = None


@dataclass
class GroupResult:
    """A method's results: metric -> summary (for the random baseline: mean over seeds, ``std``
    over seeds), per-ratio curves and their std over seeds, and the cost per example."""

    method: str
    summaries: dict[str, Summary]
    curve_std: dict[str, np.ndarray]
    seeds: int
    cost: dict[str, float]


@dataclass
class BenchResult:
    """What :func:`run_bench` did and found. ``notes``: what the store held that this run could
    not use, and why (``integrated_gradients: 200 explanations recomputed (default n_steps 50 ->
    40)``). ``ids``: the examples' ids in the order of the store's per-example values (what a
    paired comparison of two methods reads back)."""

    spec: BenchSpec
    model_name: str
    task: str
    n_examples: int
    skipped: dict[str, int]
    runs: list[Run]
    groups: dict[str, GroupResult]
    x: np.ndarray
    computed: dict[str, int]
    store_path: Path
    evidence_source: str | None
    notes: list[str] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    engine: EngineReport | None = None
    ids: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------- helpers
def check_options(methods: Sequence[str], method_options: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``method_options`` checked against the run's ``methods`` before any work and keyed by the
    methods' registered names: options for a method the run does not have, and options a method
    does not take or values it does not accept, are each a one-line :class:`InputError`."""
    from heedful.attribution import get_method

    infos = {info.name: info for info in (get_method(name) for name in methods)}
    found: dict[str, dict[str, Any]] = {}
    for owner, options in method_options.items():
        name = owner.replace("-", "_").lower()
        if name not in infos:
            raise InputError(
                f"options are given for {owner!r}, which is not a method of this run",
                hint=did_you_mean(name, infos, "method", listing=f"this run's methods: {', '.join(infos)} (an option is METHOD.key=value)"),
            )
        found[name] = dict(options)
    for name, info in infos.items():
        info.bind(found.get(name, {}))
    return found


def make_runs(spec: BenchSpec, about: Subject) -> list[Run]:
    """Runs of the spec's methods on ``about`` (the random baseline once per seed), keyed by
    :func:`~heedful.evaluate.store.run_key`."""
    from heedful.attribution import get_method

    method_options = check_options(spec.methods, spec.method_options)
    runs = []
    for name in spec.methods:
        info = get_method(name, None)
        base = info.resolve(method_options.get(info.name, {}), spec.model.adapter.device)  # keyed at the precision used
        seeds: list[int | None] = [None]
        if info.stochastic:
            count = spec.protocol.random_seeds if info.family == "baseline" else 1
            seeds = [spec.seed + i for i in range(count)]
        for seed in seeds:
            options = dict(base)
            if seed is not None:
                options["seed"] = seed
            key = run_key(
                about, info.name, options, label=spec.protocol.label, max_length=spec.protocol.max_length, lm_word=spec.lm_word
            )
            runs.append(Run(info.name, info.name, options, key, seed))
    return runs


def spec_subject(spec: BenchSpec, data) -> Subject:
    """The spec's model on the whole split ``data`` of its dataset (labels and fingerprints;
    the dataset's label shows the options it was made with, ``planted[length=512]``)."""
    shown = {k: v for k, v in sorted(spec.dataset_options.items()) if isinstance(v, str | int | float | bool)}
    dataset = spec.dataset + ("[" + ",".join(f"{k}={v}" for k, v in shown.items()) + "]" if shown else "")
    return subject(spec.model, dataset, spec.split, data, label=spec.model_label)


def dataset_options(spec: BenchSpec) -> dict[str, Any]:
    """The options the spec's dataset is loaded with: the spec's, and the model's tokenizer for
    a dataset built with one (:func:`heedful.datasets.loading.takes_tokenizer`: the planted set
    counts its length in the model's tokens)."""
    from heedful.datasets.loading import takes_tokenizer

    options = dict(spec.dataset_options)
    if "tokenizer" not in options and takes_tokenizer(spec.dataset):
        options["tokenizer"] = spec.model.adapter.tokenizer
    return options


def select_inputs(model, spec: BenchSpec, skipped: dict[str, int]) -> tuple[list[ModelInput], Any]:
    """The examples of the run: those the model can take and the protocol keeps, first ``n``."""
    from heedful import datasets

    data = datasets.load(spec.dataset, spec.split, None, **dataset_options(spec))
    inputs = model_inputs(data, model.adapter, spec.protocol.label, skipped, spec.lm_word)
    if spec.protocol.min_length > 0 and inputs:
        tok = model.adapter.tokenizer
        limit = min(spec.protocol.max_length or model.adapter.max_length, model.adapter.max_length)
        texts = [i.text for i in inputs]
        pairs = [i.text_pair for i in inputs]
        args = (texts, pairs) if any(p is not None for p in pairs) else (texts,)
        lengths = [len(ids) for ids in tok(*args, truncation=True, max_length=limit)["input_ids"]]
        short = sum(1 for n in lengths if n < spec.protocol.min_length)
        if short:
            skipped[f"shorter than {spec.protocol.min_length} tokens"] = short
        inputs = [i for i, n in zip(inputs, lengths, strict=True) if n >= spec.protocol.min_length]
    if spec.n is not None:
        inputs = inputs[: spec.n]
    if not inputs:
        raise HeedfulError(
            f"no example of {spec.dataset} ({spec.split}) is usable with this model and protocol",
            hint="skipped: " + (", ".join(f"{k}: {v}" for k, v in skipped.items()) or "none"),
        )
    return inputs, data


# ---------------------------------------------------------------------------- the plan
@dataclass
class Task:
    """Task ``index``: run ``runs[run]`` on the chunk ``ids``; ``explain`` / ``evaluate``: the
    chunk's ids lacking an explanation / some metric value in the store; ``have``: metric -> the
    chunk's ids whose value is stored; ``measured``: whether raw curves of some are stored."""

    index: int
    run: int
    ids: list[str]
    explain: list[str]
    evaluate: list[str]
    have: dict[str, set[str]] = field(default_factory=dict)
    measured: bool = False


@dataclass
class Plan:
    """What a bench has to do, as read from the store by :func:`plan_bench`: the selected
    ``inputs``, the ``runs``, and the ``tasks`` -- (run, chunk of examples) pairs with something
    missing; ``stored``: tasks of the bench the store already holds whole. Every engine computes
    the same tasks with :func:`heedful.evaluate.tasks.compute_part`, so results do not depend on
    the engine."""

    spec: BenchSpec
    settings: Settings
    inputs: list[ModelInput]
    data: Any
    about: Subject
    skipped: dict[str, int]
    runs: list[Run]
    tasks: list[Task]
    stored: int
    notes: list[str]
    work: Work = NOTHING
    """The estimated cost of the explanations still to compute (:mod:`heedful.engine.workload`; the
    metrics' passes not counted)."""

    @property
    def total(self) -> int:
        """Tasks of the whole bench, stored ones included."""
        return len(self.tasks) + self.stored

    @cached_property
    def by_id(self) -> dict[str, ModelInput]:
        return {i.id: i for i in self.inputs}

    def refresh(self, task: Task, store: ResultsStore) -> Task | None:
        """``task`` as the store holds it now (another writer may have stored some of it since the
        plan was made); ``None`` when nothing of it is missing."""
        run, names, phash = self.runs[task.run], self.settings.metrics, self.settings.protocol_hash
        explained = store.explanation_ids(run.key, task.ids)
        have = {name: store.metric_ids(run.key, name, phash, task.ids) for name in names}
        explain = [i for i in task.ids if i not in explained]
        evaluate = [i for i in task.ids if any(i not in have[name] for name in names)]
        if not explain and not evaluate:
            return None
        measured = any(store.measurement_ids(run.key, s, phash, evaluate) for s in sources_for(names)) if evaluate else False
        return Task(task.index, task.run, task.ids, explain, evaluate, have, measured)

    def part(self, task: Task, store: ResultsStore) -> Part:
        """``task`` with what the store holds for it (read just before it is computed)."""
        run = self.runs[task.run]
        by_id = self.by_id
        explained = set(task.explain)
        old = [i for i in task.evaluate if i not in explained]
        phash = self.settings.protocol_hash
        texts = {}
        if old:
            texts = store.explanation_texts(run.key, old)
            missing = [i for i in old if i not in texts]
            if missing:
                raise HeedfulError(f"explanations of {missing[:3]} are missing from {store.path}", hint="run again")
        measurements = {}
        if task.measured and task.evaluate:
            measurements = {s: store.get_measurements(run.key, s, phash, task.evaluate) for s in sources_for(self.settings.metrics)}
        return Part(
            task.index, run.key, run.method, run.options, [by_id[i] for i in task.ids], list(task.explain),
            list(task.evaluate), texts, measurements, task.have,
        )


def _check_spec(spec: BenchSpec) -> list[str]:
    """The spec's metric names, after checking everything that needs no data (before any work)."""
    if not isinstance(spec.model, Model):
        raise InputError(f"the bench needs a loaded model, got {type(spec.model).__name__}", hint="pass heedful.load(name)")
    spec.protocol = get_protocol(spec.protocol).resolved(spec.model.adapter.device)
    names = metric_names(spec.metrics)
    if isinstance(spec.batch_size, bool) or not isinstance(spec.batch_size, int) or spec.batch_size < 1:
        raise InputError(f"batch size must be a positive integer, got {spec.batch_size!r}", hint="e.g. batch_size=16")
    if spec.n is not None and (isinstance(spec.n, bool) or not isinstance(spec.n, int) or spec.n < 1):
        raise InputError(f"n (the number of examples) must be a positive integer, got {spec.n!r}", hint="e.g. n=50, or None for the whole split")
    if spec.chunk is not None and (isinstance(spec.chunk, bool) or not isinstance(spec.chunk, int) or spec.chunk < 1):
        raise InputError(f"examples per task must be a positive integer, got {spec.chunk!r}", hint="e.g. chunk=64, or None for four model batches")
    for name in names:
        check_metric(METRICS[name], spec.model.task)
    for method in spec.methods:
        spec.model.method(method)  # unknown methods, or ones the model's task or structure does not allow, fail before any work
    check_options(spec.methods, spec.method_options)
    return names


def plan_bench(spec: BenchSpec, open_store: Callable[[], ResultsStore]) -> tuple[Plan, ResultsStore]:
    """Check ``spec``, select its examples and list its tasks: every run (method; the random
    baseline once per seed) on every chunk of ``spec.chunk`` examples (default four model
    batches), skipping chunks whose explanations and metric values ``store`` holds. Chunks are cut
    from the selected examples in order, so every engine and every resumed run batches an
    example with the same neighbours. The store is opened (``open_store``) only once every check
    that needs no store has passed, so a refused bench leaves no store behind."""
    names = _check_spec(spec)
    skipped: dict[str, int] = {}
    inputs, data = select_inputs(spec.model, spec, skipped)
    if any(METRICS[n].family == "plausibility" for n in names) and not any(i.evidence_spans for i in inputs):
        if isinstance(spec.dataset, str) and Path(spec.dataset).expanduser().is_file():
            from heedful.datasets.user import evidence_hint

            raise HeedfulError(
                f"{spec.dataset} has no evidence (no 'evidence' column, or an empty one), so plausibility metrics are undefined",
                hint=evidence_hint(spec.dataset) + ", or drop the plausibility metrics",
            )
        raise HeedfulError(
            f"{spec.dataset} has no evidence, so plausibility metrics are undefined",
            hint="drop the plausibility metrics or use data with evidence",
        )
    _check_spans(spec.model, spec.methods, inputs)
    if any(METRICS[n].family == "context" for n in names) and not any(i.sources for i in inputs):
        raise HeedfulError(
            f"{spec.dataset} has no sources, so context metrics are undefined",
            hint="use context data (--dataset planted, or JSON lines with 'context' and 'query')",
        )
    about = spec_subject(spec, data)
    runs = make_runs(spec, about)
    lengths = token_lengths(spec.model, inputs, spec.protocol.max_length)
    every = [i.id for i in inputs]
    explaining_work(spec.model, runs, [(r, every) for r in range(len(runs))], lengths, spec.batch_size)  # counts: before any work
    settings = Settings(spec.protocol, tuple(names), spec.batch_size)
    phash = settings.protocol_hash
    store = open_store()
    store.put_protocol(phash, spec.protocol.name, spec.protocol.key_dict())
    notes = [note for note in [store.legacy_note()] if note]
    tasks, stored = list_tasks(store, runs, [i.id for i in inputs], settings, spec.chunk, notes)
    work = explaining_work(spec.model, runs, [(t.run, t.explain) for t in tasks if t.explain], lengths, spec.batch_size)
    return Plan(spec, settings, inputs, data, about, skipped, runs, tasks, stored, notes, work), store


def token_lengths(model: Model, inputs: Sequence[ModelInput], max_length: int | None) -> dict[str, int]:
    """Tokens of every input as the model explains it (truncated to ``max_length``)."""
    if not inputs:
        return {}
    pairs = None if all(i.text_pair is None for i in inputs) else [i.text_pair or "" for i in inputs]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the explanations say what they truncate
        batch = model.encode([i.text for i in inputs], text_pair=pairs, max_length=max_length)
    return dict(zip((i.id for i in inputs), batch.lengths.tolist(), strict=True))


def explaining_work(
    model: Model, runs: Sequence[Run], todo: Sequence[tuple[int, Sequence[str]]], lengths: dict[str, int], batch_size: int
) -> Work:
    """The estimated cost of explaining, for each ``(run index, ids)`` of ``todo``, those
    examples, batch by batch as :meth:`Model.explain` does -- each batch's counts checked
    against the memory budget (:func:`heedful.engine.workload.check`: an :class:`InputError`)."""
    from heedful.attribution import get_method

    work = NOTHING
    for index, ids in todo:
        info = get_method(runs[index].method, model.task)
        bound = info.bind(runs[index].options)
        for start in range(0, len(ids), batch_size):
            work = work + check(model.adapter, info, bound, [lengths[i] for i in ids[start : start + batch_size]])
    return work


def list_tasks(
    store: ResultsStore, runs: Sequence[Run], ids: Sequence[str], settings: Settings, chunk: int | None, notes: list[str] | None = None,
) -> tuple[list[Task], int]:
    """The tasks of ``runs`` on ``ids`` cut into chunks of ``chunk`` examples (default four model
    batches) that miss an explanation or a metric value in ``store``, and how many chunks the
    store holds whole. ``notes``: gets, per run, why stored explanations of its examples under an
    older key were not used."""
    names, phash = settings.metrics, settings.protocol_hash
    current = {run.key.digest for run in runs}
    size = chunk or settings.batch_size * 4
    chunks = [list(ids[start : start + size]) for start in range(0, len(ids), size)]
    tasks: list[Task] = []
    stored = 0
    for r, run in enumerate(runs):
        explained = store.explanation_ids(run.key)
        have = {name: store.metric_ids(run.key, name, phash) for name in names}
        measured = set().union(*(store.measurement_ids(run.key, s, phash) for s in sources_for(names)))
        todo = [i for i in ids if i not in explained]
        older = store.superseded(run.key, todo, current) if todo and notes is not None else None
        if older is not None:
            notes.append(older.describe(_label(run)))
        for part in chunks:
            explain = [i for i in part if i not in explained]
            evaluate = [i for i in part if any(i not in have[name] for name in names)]
            if explain or evaluate:
                held = {name: have[name].intersection(part) for name in names}
                tasks.append(Task(len(tasks) + stored, r, part, explain, evaluate, held, not measured.isdisjoint(evaluate)))
            else:
                stored += 1
    return tasks, stored


# ---------------------------------------------------------------------------- the runner
@dataclass
class EngineReport:
    """What an engine did: ``tasks`` computed, ``stored`` (found in the store), ``retries`` (tasks
    sent again after their worker died), ``restarts`` (worker processes replaced), ``rows``
    written, wall ``seconds``, ``write_seconds`` the driver spent writing the store, ``others``
    (tasks another process writing the store finished meanwhile), and per worker: tasks,
    explanations, examples evaluated, busy seconds (``workers``: label -> counts)."""

    engine: str
    tasks: int = 0
    stored: int = 0
    others: int = 0
    retries: int = 0
    restarts: int = 0
    rows: int = 0
    seconds: float = 0.0
    write_seconds: float = 0.0
    workers: dict[str, dict[str, float]] = field(default_factory=dict)

    def write(self, store: ResultsStore, part: Part, result: PartResult, settings: Settings) -> None:
        """Store ``result`` (one transaction), timing the write."""
        began = time.perf_counter()
        write_part(store, part, result, settings)
        self.write_seconds += time.perf_counter() - began

    def add(self, worker: str, result: PartResult, finished: bool = True) -> None:
        """Count ``result`` (a task, or a step of one: ``finished`` for a whole task), computed by
        ``worker``."""
        self.rows += result.rows
        counts = self._worker(worker)
        if finished:
            self.finish(worker)
        counts["explanations"] += len(result.explanations)
        counts["evaluated"] += len(result.evaluated)
        counts["seconds"] += result.seconds

    def finish(self, worker: str) -> None:
        """Count a task ``worker`` finished."""
        self.tasks += 1
        self._worker(worker)["tasks"] += 1

    def _worker(self, worker: str) -> dict[str, float]:
        return self.workers.setdefault(worker, {"tasks": 0, "explanations": 0, "evaluated": 0, "seconds": 0.0})

    def lines(self) -> list[str]:
        """The summary: tasks, retries, then throughput per worker."""
        head = (
            f"{self.engine} engine: {self.tasks} tasks computed, {self.stored} already stored, {self.retries} retried"
            f" ({self.restarts} worker restarts), {self.rows} rows written in {self.seconds:.1f} s"
            f" ({self.write_seconds:.2f} s writing the store)"
        )
        out = [head]
        for name, c in self.workers.items():
            rate = c["explanations"] / c["seconds"] if c["seconds"] else 0.0
            out.append(
                f"  {name}: {c['tasks']:.0f} tasks, {c['explanations']:.0f} explanations, {c['evaluated']:.0f} examples evaluated,"
                f" {c['seconds']:.1f} s busy, {rate:.2f} explanations/s"
            )
        return out


class LocalEngine:
    """The default engine: the plan's tasks one after another in this process, on ``spec.model``,
    each step stored as it is computed. A task is claimed in the store first; one another live
    process claims is left for later (and found done, or taken over when that process is gone),
    so two benches writing one store share its work."""

    name = "local"

    def run(self, plan: Plan, store: ResultsStore, advance: Callable[[Part, PartResult | None], None]) -> EngineReport:
        """``advance(part, result)`` after each stored step (``None`` for a task another process
        finished)."""
        report = EngineReport(self.name, stored=plan.stored)
        began = time.perf_counter()
        shared = SharedAblations()  # the methods share the random source ablations of an example
        pending, pause = list(plan.tasks), 0.05
        while pending:
            waiting = []
            for task in pending:
                fresh = plan.refresh(task, store)
                if fresh is None:  # another process stored it meanwhile
                    report.others += 1
                    advance(plan.part(Task(task.index, task.run, task.ids, [], []), store), None)
                    continue
                claim = (plan.runs[task.run].key.digest, task.ids[0])
                if not store.claim(*claim):
                    waiting.append(task)
                    continue
                try:
                    self._compute(plan, store, fresh, shared, claim, report, advance)
                finally:
                    store.release(*claim)
                report.seconds = time.perf_counter() - began
            if len(waiting) == len(pending):  # all held by other processes: wait for them
                time.sleep(pause)
                pause = min(2 * pause, 2.0)
            pending = waiting
        report.seconds = time.perf_counter() - began
        return report

    @staticmethod
    def _compute(plan: Plan, store: ResultsStore, task: Task, shared, claim: tuple[str, str], report: EngineReport, advance) -> None:
        """Compute ``task`` and store each step, keeping ``claim`` alive."""
        part = plan.part(task, store)
        worker = f"pid {os.getpid()}"
        for step in compute_steps(plan.spec.model, part, plan.settings, shared, lambda ids: store.explanation_texts(part.key, ids)):
            with store.transaction():
                report.write(store, part, step, plan.settings)
                store.touch(*claim)
            report.add(worker, step, finished=False)
            advance(part, step)
        report.finish(worker)


def progress_share(part: Part, result: PartResult | None) -> float:
    """The share of task ``part`` that ``result`` (a step or the whole task) stored: examples
    explained and evaluated in it over those the task had to; ``None`` (done by another
    process): the whole task."""
    todo = len(part.explain) + len(part.evaluate)
    if result is None or not todo:
        return 1.0
    return (len(result.explanations) + len(result.evaluated)) / todo


def run_bench(
    spec: BenchSpec,
    console=None,
    progress: bool = True,
    on_batch: Callable[[str, int], None] | None = None,
    engine=None,
    on_plan: Callable[[Plan], None] | None = None,
) -> BenchResult:
    """Run (or resume) a benchmark; see the module docstring. ``on_batch(stage, n)`` is called
    after each stored step (the local engine: a model batch) or task (the Ray engine): ``stage``
    is ``"explain"`` or ``"evaluate"``, ``n`` the examples it explained / evaluated. ``engine``:
    :class:`LocalEngine` (default) or a :class:`heedful.evaluate.ray_engine.RayEngine`;
    ``BenchResult.engine`` reports what it did. ``on_plan(plan)``: called once the bench is
    planned, before any work (the command line says how long the explanations will take,
    :attr:`Plan.work`). Ctrl-C (``KeyboardInterrupt``) raises :class:`~heedful.errors.Interrupted`,
    whose message says what the store kept."""
    opened: list[ResultsStore] = []

    def open_store() -> ResultsStore:
        opened.append(ResultsStore(spec.out))
        return opened[0]

    try:
        plan, store = plan_bench(spec, open_store)
        if on_plan is not None:
            on_plan(plan)
        bar = _progress(console) if progress else None
        with bar if bar is not None else nullcontext():
            task_id = bar.add_task("bench tasks (method x chunk)", total=plan.total, completed=plan.stored) if bar else None

            def advance(part: Part, result: PartResult | None) -> None:
                if bar is not None:
                    bar.advance(task_id, progress_share(part, result))
                if on_batch is not None and result is not None:
                    if result.explanations:
                        on_batch("explain", len(result.explanations))
                    if result.evaluated:
                        on_batch("evaluate", len(result.evaluated))

            try:
                report = (engine or LocalEngine()).run(plan, store, advance)
            except KeyboardInterrupt:
                raise Interrupted(kept(store, plan)) from None
        ids = [i.id for i in plan.inputs]
        plan.notes.extend(writer_notes(store, report))
        groups, x = collect(store, plan.runs, ids, list(plan.settings.metrics), spec.protocol)
    finally:
        for each in opened:
            each.close()
    return BenchResult(
        spec=spec,
        model_name=plan.about.model,
        task=spec.model.task,
        n_examples=len(plan.inputs),
        skipped=plan.skipped,
        runs=plan.runs,
        groups=groups,
        x=x,
        computed=dict(store.written),
        store_path=store.path,
        evidence_source=getattr(plan.data, "evidence_source", None),
        notes=plan.notes,
        engine=report,
        ids=ids,
    )


def kept(store: ResultsStore, plan: Plan) -> str:
    """What an interrupted bench kept, per run, and how to resume: ``kept 37 of 200 examples of
    integrated_gradients (52 explained); saliency complete; run the same command to resume``
    (an example is kept when its explanation and every metric value are stored)."""
    ids = [i.id for i in plan.inputs]
    names, phash = plan.settings.metrics, plan.settings.protocol_hash
    partial, complete = [], []
    for run in plan.runs:
        explained = store.explanation_ids(run.key, ids)
        done = explained.intersection(*(store.metric_ids(run.key, name, phash, ids) for name in names))
        if len(done) == len(ids):
            complete.append(_label(run))
            continue
        more = f" ({len(explained)} explained)" if len(explained) > len(done) else ""
        partial.append(f"{len(done)} of {len(ids)} examples of {_label(run)}{more}")
    written = store.written
    parts = [
        "interrupted: kept " + ", ".join(partial) if partial else "interrupted: every example is stored",
        *([f"{', '.join(complete)} complete"] if complete and partial else []),
        f"this run stored {written['explanations']} explanations and {written['metrics']} metric values",
        "run the same command to resume",
    ]
    return "; ".join(parts)


def writer_notes(store: ResultsStore, report: EngineReport | None) -> list[str]:
    """Notes on other writers of the store: tasks they finished while this bench ran, and rows
    this bench computed again that differ from the ones they stored (kept as stored)."""
    notes = []
    if report is not None and report.others:
        notes.append(f"{report.others} tasks were stored by another process writing {store.path} while this bench ran")
    differing = {t: n for t, n in store.differing.items() if n}
    if differing:
        rows = ", ".join(f"{n} {t}" for t, n in differing.items())
        notes.append(f"{rows} computed again by this bench differ from the ones another process stored first (kept as stored)")
    return notes


def _check_spans(model: Model, methods: Sequence[str], inputs: Sequence[ModelInput]) -> None:
    """Before any work: an :class:`InputError` when some input's target is a span of several
    tokens (context data with a longer continuation) and a method explains one position only."""
    from heedful.attribution import get_method
    from heedful.engine.problem import span_request

    targets = {repr(i.target): i.target for i in inputs if i.target is not None and model.task == "causal_lm"}
    spans = [t for t in targets.values() if span_request(model.adapter, t) is not None]
    if not spans:
        return
    single = [m for m in methods if not get_method(m, model.task).spans]
    if single:
        count = sum(1 for i in inputs if i.target is not None and repr(i.target) in {repr(t) for t in spans})
        raise InputError(
            f"{count} examples have a target of several tokens ({spans[0].value!r} ...), which {', '.join(single)} cannot explain",
            hint="drop those methods, or give targets of one token",
        )


def _progress(console):
    """The bench's bars: in the display of the running command where there is one (its
    :class:`~heedful.render.progress.Bars`, which also shows the library's own tasks)."""
    from heedful.progress import current
    from heedful.render.progress import Bars, progress_bar

    shared = current()
    return shared if isinstance(shared, Bars) else progress_bar(console, transient=False, remaining=True)


def _label(run: Run) -> str:
    return run.method if run.seed is None or run.group != "random" else f"{run.method} (seed {run.seed})"


def _explain_missing(model, store: ResultsStore, run: Run, inputs: list[ModelInput], spec: BenchSpec, on_batch=None) -> None:
    """Explain and store (no evaluation) the ``inputs`` ``run`` has no stored explanation of:
    the bench's own tasks (:func:`list_tasks`, chunks of ``spec.chunk`` examples cut from all of
    ``inputs``, so an example is batched with the same neighbours as in a bench), one
    transaction per model batch."""
    settings = Settings(spec.protocol, (), spec.batch_size)
    by_id = {i.id: i for i in inputs}
    tasks, _ = list_tasks(store, [run], list(by_id), settings, spec.chunk)
    for task in tasks:
        part = Part(task.index, run.key, run.method, run.options, [by_id[i] for i in task.ids], list(task.explain), [])
        for step in compute_steps(model, part, settings):
            write_part(store, part, step, settings)
            if on_batch is not None:
                on_batch("explain", len(step.explanations))


# ---------------------------------------------------------------------------- collecting
def per_example_from_store(store: ResultsStore, key: RunKey, metric: str, phash: str, ids: Sequence[str]) -> PerExample:
    """A metric's stored per-example values of ``ids`` (in that order)."""
    got = store.get_metrics(key, metric, phash, ids)
    rows = [got.get(i, (float("nan"), None, None)) for i in ids]
    values = np.array([r[0] for r in rows], dtype=float)
    curves = None
    lengths = {len(r[1]) for r in rows if r[1] is not None}
    if lengths:
        width = max(lengths)
        curves = np.full((len(rows), width), np.nan)
        for b, r in enumerate(rows):
            if r[1] is not None:
                curves[b, : len(r[1])] = np.asarray(r[1], dtype=float)
    extras = [r[2] or {} for r in rows] if any(r[2] is not None for r in rows) else None
    return concat_per_example([PerExample(values, curves, extras)])


def _seed_interval(metric, per_seed: Sequence[PerExample], protocol: Protocol) -> tuple[float, float]:
    """95 % interval of a stochastic method's mean over seeds: a mean metric's from the per-example
    means over the seeds; a metric with ``resamples`` (Pearson) from the mean over the seeds of its
    value on each bootstrap resample (the resamples line up across seeds)."""
    if metric.resamples is not None:
        boots = [metric.resamples(p, protocol) for p in per_seed]
        if any(b.size == 0 for b in boots):
            return float("nan"), float("nan")
        return percentile_interval(np.mean(boots, axis=0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        means = np.nanmean([p.values for p in per_seed], axis=0)
    pooled = aggregate(metric, PerExample(means), protocol)
    return pooled.low, pooled.high


def collect(store: ResultsStore, runs: Sequence[Run], ids: Sequence[str], names: Sequence[str], protocol: Protocol):
    """Aggregate stored metrics per method group (random seeds -> mean and std over seeds)."""
    phash = protocol.hash()
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.group, []).append(run)
    results: dict[str, GroupResult] = {}
    for group, members in groups.items():
        summaries: dict[str, Summary] = {}
        curve_std: dict[str, np.ndarray] = {}
        for name in names:
            per_seed = [aggregate(METRICS[name], per_example_from_store(store, r.key, name, phash, ids), protocol) for r in members]
            if len(per_seed) == 1:
                summaries[name] = per_seed[0]
                continue
            values = np.array([s.value for s in per_seed])
            curve = None
            if all(s.curve is not None for s in per_seed):
                stack = np.stack([s.curve for s in per_seed])
                curve = np.nanmean(stack, axis=0)
                curve_std[name] = np.nanstd(stack, axis=0, ddof=1)
            low = high = float("nan")
            if per_seed[0].has_interval:
                low, high = _seed_interval(METRICS[name], [per_example_from_store(store, r.key, name, phash, ids) for r in members], protocol)
            summaries[name] = Summary(float(np.nanmean(values)), float(np.nanstd(values, ddof=1)), per_seed[0].n, curve, low, high)
        costs = [store.cost(r.key) for r in members]
        costs = [c for c in costs if c and c["examples"]]
        total = sum(c["examples"] for c in costs)
        cost = {
            "seconds": sum(c["seconds"] for c in costs) / total if total else float("nan"),
            "forward": sum(c["forward"] for c in costs) / total if total else float("nan"),
            "backward": sum(c["backward"] for c in costs) / total if total else float("nan"),
            "peak_mb": max((c["peak_mb"] for c in costs), default=float("nan")),
        }
        results[group] = GroupResult(group, summaries, curve_std, len(members), cost)
    return results, protocol.curve_ratios
