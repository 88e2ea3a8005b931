"""ROAR -- RemOve And Retrain (Hooker et al. 2019, "A Benchmark for Interpretability Methods in
Deep Neural Networks", NeurIPS, §3) -- and its companion KAR (Keep And Retrain): how much a
classifier trained *without* the tokens a method ranks highest loses in accuracy.

A removal curve measures a method on inputs its model never saw (sentences with ``[MASK]`` in
them), so part of the drop it reads is the shift in distribution, not the information the tokens
carried. ROAR retrains instead. For each method and fraction ``k``:

1. every train and test example is explained by the method (on the model being explained, for
   its predicted class by default, as the curves explain it; stored, :mod:`heedful.evaluate.bench`);
2. of each example's ``n`` content tokens (special tokens never count, are never removed) the top
   ``round(k n)`` by score are replaced by the operator -- ``[MASK]`` by default, or any of
   :mod:`heedful.evaluate.operators` (``unk``, ``pad``, ``delete``, in-distribution ``sample``)
   -- in the train and the test examples alike (ties: the earlier token first; ``round`` halves
   to even, so 10 % of 5 tokens is 0 and 50 % of 5 is 2);
3. a fresh model from the initialisation the explained model was trained from is trained on the
   degraded train examples (their gold labels) by the code that trained the explained model --
   a :class:`Retrainer`; the zoo's: :func:`heedful.zoo.retraining.retrainer`;
4. its accuracy on the degraded test examples is measured, with the 95 % percentile bootstrap
   interval over test examples (:mod:`heedful.evaluate.intervals`).

The random baseline (method ``random``, always run) is the reference at every ``k``: a method
ranks better than random when the retrained model's accuracy falls *further* -- the paired
difference ``method - random`` over the same test examples below zero with its interval. KAR
(``modes=("kar",)``) keeps only the top ``round(k n)`` and replaces the rest: better than random
when the accuracy is *higher*. ``reference=True`` adds the model retrained on the unmodified
examples (``k = 0``), once per seed.

Caveat (Rong et al. 2022, "A Consistent and Efficient Evaluation Strategy for Attribution
Methods", §3): which positions were replaced depends on the class, so a retrained model may read
the class from the pattern of ``[MASK]`` tokens itself; an accuracy that stays high at large
``k`` can be that leak rather than a poor ranking. The random baseline cannot leak this way.

Everything is kept in a :class:`~heedful.evaluate.store.ResultsStore` as it is computed, so a
stopped run (Ctrl-C: :class:`~heedful.errors.Interrupted`) keeps what it finished and a rerun
computes only what is missing:

* explanations, as ``heedful bench`` stores them (:func:`~heedful.evaluate.store.run_key`: the
  model's fingerprint, the method with its complete options and version, the dataset's
  fingerprint, the split, label and ``max_length``), one transaction per model batch;
* each retrain's outcome, in one transaction: metric ``<mode>_correct`` (1 / 0 per test example,
  with the predicted class) and ``<mode>_training`` (one row, :data:`TRAINING_ROW`, whose value
  is the training's wall seconds and whose extra is its summary), under the test split's run key
  of the method and a hash of everything else that decides it (:func:`retrain_hash`): ``k``, the
  seed, the mode, the degradation protocol, the train run's key and example ids, and the
  retrainer's name and settings (stored in the ``protocols`` table under the name ``roar``).

Cost: one retrain per (mode, method, ``k``, seed), plus explaining the train subsample and the
test split once per method. minilm-sentiment's retrain (:func:`heedful.zoo.retraining.retrainer`)
trains two epochs over the train subsample -- ``RoarResult.train_seconds`` says what it took.
"""

from __future__ import annotations

import hashlib
import math
import numbers
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from heedful.engine.options import canonical_json
from heedful.engine.perturb import never_empty, removal_id, remove_tokens
from heedful.errors import HeedfulError, InputError, Interrupted
from heedful.evaluate import bench
from heedful.evaluate import perturbation as pert
from heedful.evaluate.evaluation import ModelInput
from heedful.evaluate.intervals import bootstrap_mean, bootstrap_paired_difference
from heedful.evaluate.protocol import Protocol
from heedful.evaluate.store import ResultsStore, RunKey
from heedful.explanation import Explanation
from heedful.model import Model
from heedful.render.progress import progress_bar

ROAR_VERSION = 1
"""Enters every retrain's key: bumped when what a retrain computes changes."""
MODES = ("roar", "kar")
"""ROAR removes the top ``k`` of each example's tokens; KAR keeps only them."""
CURVE_MODES = {"roar": "remove", "kar": "keep"}
OPERATORS = ("mask", "unk", "pad", "delete", "sample")
BASELINE = "random"
REFERENCE = "(unmodified)"
"""The method column of the retrain on unmodified examples (``k = 0``)."""
DEFAULT_METHODS = ("random", "saliency", "grad_x_input", "integrated_gradients", "rollout", "leave_one_out")
"""Cheap and informative: the random baseline, three gradient methods (1, 1 and 50 backward
passes), attention rollout (one forward) and leave-one-out (a forward per token)."""
DEFAULT_FRACTIONS = (0.1, 0.3, 0.5, 0.7, 0.9)
TRAIN_EXAMPLES = 2400
"""Train examples drawn (seeded) from the train split (movies: 9,483), as F-Fidelity's fine-tuning."""
TRAINING_ROW = "(training)"
"""The example id of a retrain's training summary row."""

Encoded = dict[str, torch.Tensor]
"""Encoded examples: ``input_ids``, ``attention_mask`` (and ``token_type_ids`` for a model that
takes them), each ``[M, N]``, right-padded."""


@dataclass(frozen=True)
class Retrainer:
    """How to train a fresh copy of the explained model (the same architecture, labels and
    tokenizer) on encoded examples.

    ``name`` says what a fresh model starts from and ``settings`` how it is trained (JSON values;
    both enter the keys of stored retrains); ``max_length``: the tokens training and testing cut
    examples to (the explanations are computed on the same cut). ``fresh(seed)``: an untrained
    model, its seeded part drawn with ``seed``; ``fit(model, inputs, targets, seed, bar)`` trains
    it in place on :data:`Encoded` inputs and class indices ``[M]`` with the seed's data order,
    reporting to the rich display ``bar``, and returns a summary (``seconds``, ``steps``, ...);
    ``predict(model, inputs, bar)``: logits ``[M, C]``. :func:`heedful.zoo.train.encoded_retrainer`
    makes one from a ``fresh`` function and a training configuration."""

    name: str
    settings: Mapping[str, Any]
    max_length: int | None
    fresh: Callable[[int], torch.nn.Module]
    fit: Callable[..., dict]
    predict: Callable[..., np.ndarray]

    def identity(self) -> dict[str, Any]:
        return {"name": self.name, "settings": dict(self.settings), "max_length": self.max_length}


@dataclass(frozen=True)
class Job:
    """One retrain: ``method``'s top ``fraction`` removed (``"roar"``) or kept (``"kar"``), trained
    with ``seed``; the reference is ``(roar, random, 0.0, seed)``."""

    mode: str
    method: str
    fraction: float
    seed: int

    @property
    def reference(self) -> bool:
        return self.fraction == 0.0


@dataclass
class RoarResult:
    """What :func:`roar` found: ``table``, a pandas frame with one row per (mode, method, k, seed)
    -- ``accuracy`` on the degraded test examples with its 95 % bootstrap interval ``low`` /
    ``high``, the paired difference against random at the same mode, ``k`` and seed
    (``vs_random`` with ``vs_random_low`` / ``vs_random_high``; NaN for random itself and the
    reference), the retrain's training wall ``train_seconds``, ``retrain_seconds`` (a fresh model, its
    training and the test pass) and optimiser ``steps``; ``n_train`` /
    ``n_test`` examples; ``retrained``: retrains this call computed (the rest came from the store);
    ``explained``: explanations it computed; ``explain_seconds``: per method, the stored wall
    seconds per explained example; ``correct``: per table row's ``(mode, method, k, seed)``,
    whether the retrained model got each test example right ``[n_test]`` (1.0 / 0.0), for
    paired comparisons between any two methods."""

    table: Any
    n_train: int
    n_test: int
    retrained: int
    explained: int
    explain_seconds: dict[str, float]
    store_path: Path
    correct: dict[tuple[str, str, float, int], np.ndarray] = field(default_factory=dict)

    @property
    def train_seconds(self) -> float:
        """Mean wall seconds of one retrain's training (over the table's rows)."""
        return float(np.nanmean(self.table["train_seconds"])) if len(self.table) else math.nan


# ---------------------------------------------------------------------------- degrading
def _segments(adapter, batch) -> torch.Tensor | None:
    return batch.token_type_ids if adapter.uses_token_types and batch.token_type_ids is not None else None


def _removed_rows(prepared: pert.Prepared, remove: torch.Tensor, types: torch.Tensor | None) -> Encoded:
    """Every example of ``prepared`` with its ``remove`` ``[B, N]`` positions removed by the
    protocol's operator: replaced in place, or deleted with the rest closed up."""
    batch, adapter = prepared.batch, prepared.adapter
    every = torch.arange(len(prepared))
    ids = pert.replaced_ids(prepared, every, remove, prepared.protocol.removal)
    if ids is not None:
        found = {"input_ids": ids, "attention_mask": batch.attention_mask}
        if types is not None:
            found["token_type_ids"] = types
        return found
    out = never_empty(adapter, remove_tokens(
        batch.input_ids, batch.attention_mask, remove, prepared.target.anchor, prepared.target.anchor_kind, None, adapter.pad_token_id, types
    ))
    found = {"input_ids": out.input_ids, "attention_mask": out.attention_mask}
    if out.token_type_ids is not None:
        found["token_type_ids"] = out.token_type_ids
    return found


def _stacked(parts: Sequence[Encoded], pad_id: int) -> Encoded:
    """``parts`` one under the other, each right-padded to the widest (ids with ``pad_id``)."""
    width = max(int(p["input_ids"].shape[1]) for p in parts)

    def padded(tensor: torch.Tensor, value: int) -> torch.Tensor:
        return torch.nn.functional.pad(tensor, (0, width - tensor.shape[1]), value=value)

    return {name: torch.cat([padded(p[name], pad_id if name == "input_ids" else 0) for p in parts]) for name in parts[0]}


@torch.no_grad()
def degraded_inputs(
    adapter, explanations: Sequence[Explanation], protocol: Protocol, modes: Sequence[str] = ("roar",), batch_size: int = 64
) -> dict[str, dict[float, Encoded]]:
    """mode -> fraction -> the explained examples encoded with their top ``fraction`` removed
    (``"roar"``) or all but it removed (``"kar"``) by ``protocol.removal``: rows in the order of
    ``explanations``. Each example's tokens are ranked by its explanation's scores among the
    positions ``protocol`` ranks (:func:`heedful.evaluate.perturbation.rankable_positions`), and
    ``protocol.ratios`` are the fractions, counted and rounded as the protocol says (ROAR's:
    :func:`roar_protocol`) -- the rankings and counts of the removal curves."""
    parts: dict[tuple[str, float], list[Encoded]] = {(mode, k): [] for mode in modes for k in protocol.ratios}
    for start in range(0, len(explanations), batch_size):
        prepared = pert.prepare(adapter, explanations[start : start + batch_size], protocol)
        _, sizes, _ = pert.rationale_sizes(prepared)  # [B, R] tokens in each rationale
        types = _segments(adapter, prepared.batch)
        for mode in modes:
            removed = pert.removal_masks(prepared, sizes, CURVE_MODES[mode])  # [B, R, N]
            for r, k in enumerate(protocol.ratios):
                parts[(mode, k)].append(_removed_rows(prepared, removed[:, r], types))
    return {mode: {k: _stacked(parts[(mode, k)], adapter.pad_token_id) for k in protocol.ratios} for mode in modes}


def roar_protocol(operator: str, fractions: Sequence[float], label: str, max_length: int | None) -> Protocol:
    """How ROAR ranks and removes: content tokens only (special tokens never ranked nor removed),
    ``round(k n)`` of the ``n`` content tokens, the operator's replacement, the ``label`` class
    explained, examples cut to ``max_length`` tokens."""
    return Protocol(
        name="roar", removal=operator, specials="exclude", count_base="rankable", schedule="fraction",
        ratios=tuple(sorted(fractions)), rounding="round", label=label, max_length=max_length, random_seeds=1,
        citation="Hooker et al. 2019, A Benchmark for Interpretability Methods in Deep Neural Networks, §3 (ROAR, KAR)",
    )


def retrain_hash(job: Job, protocol: Protocol, train_key: RunKey, train_ids: Sequence[str], retrainer: Retrainer) -> str:
    """The store's key of one retrain besides the test run it is stored under (module docstring):
    16 hex digits of everything that decides the retrained model."""
    identity = {
        "roar": ROAR_VERSION,
        "mode": job.mode,
        "fraction": job.fraction,
        "seed": job.seed,
        "degradation": None if job.reference else replace(protocol, ratios=(job.fraction,)).key_dict(),
        "train_run": None if job.reference else train_key.digest,
        "train_data": train_key.dataset_fingerprint,
        "train_ids": hashlib.sha256("\n".join(train_ids).encode()).hexdigest(),
        "retrainer": retrainer.identity(),
    }
    return hashlib.sha256(canonical_json(identity).encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------- checks
def _check(model, retrainer, methods, fractions, operator, seeds, modes, train_n, test_n, label, batch_size) -> tuple[list[str], list[float]]:
    """The methods (registered names, the random baseline first) and sorted fractions, after
    checking every argument: a one-line :class:`InputError` before any work."""
    if not isinstance(model, Model):
        raise InputError(f"ROAR needs a loaded model, got {type(model).__name__}", hint="pass heedful.load(name)")
    if model.task != "classification":
        raise InputError(f"ROAR retrains a classifier; this model's task is {model.task}", hint="use a sequence classifier")
    if not isinstance(retrainer, Retrainer):
        raise InputError(f"retrainer must be a Retrainer, got {type(retrainer).__name__}", hint="e.g. heedful.zoo.retraining.retrainer('minilm-sentiment')")
    if isinstance(methods, str) or not methods:
        raise InputError("ROAR needs a list of methods", hint=f"e.g. methods={list(DEFAULT_METHODS[:3])}")
    names = [model.method(m).name for m in methods]
    names = list(dict.fromkeys([BASELINE, *names]))
    if isinstance(fractions, str) or not fractions:
        raise InputError("ROAR needs fractions of tokens to remove", hint="e.g. fractions=(0.1, 0.5, 0.9)")
    for k in fractions:
        if isinstance(k, bool) or not isinstance(k, numbers.Real) or not 0.0 < float(k) < 1.0:
            raise InputError(
                f"ROAR fractions must lie strictly between 0 and 1, got {k!r}",
                hint="e.g. fractions=(0.1, 0.5, 0.9); k = 0 is the reference (reference=True)",
            )
    if len(set(map(float, fractions))) != len(fractions):
        raise InputError(f"ROAR fractions repeat: {list(fractions)}", hint="give each fraction once")
    if operator not in OPERATORS:
        raise InputError(f"unknown ROAR operator {operator!r}", hint=f"use one of {', '.join(OPERATORS)}")
    if operator in ("mask", "unk", "pad"):
        removal_id(model.adapter, operator)  # a tokenizer without that token: refused now
    if isinstance(modes, str) or not modes or any(m not in MODES for m in modes):
        raise InputError(f"ROAR modes must be among {', '.join(MODES)}, got {modes!r}", hint="e.g. modes=('roar', 'kar')")
    if isinstance(seeds, int) or not seeds or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in seeds):
        raise InputError(f"seeds must be a list of whole numbers >= 0, got {seeds!r}", hint="e.g. seeds=(0, 1, 2)")
    for name, n in (("train_n", train_n), ("test_n", test_n)):
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise InputError(f"{name} must be a positive number of examples or None (all), got {n!r}")
    if label not in ("predicted", "gold"):
        raise InputError(f"label must be 'predicted' or 'gold', got {label!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(f"batch size must be a positive integer, got {batch_size!r}", hint="e.g. batch_size=16")
    return names, sorted(float(k) for k in fractions)


def _labelled(inputs: list[ModelInput], split: str, dataset: str) -> list[ModelInput]:
    """The inputs with a gold class (retraining and accuracy need one)."""
    found = [i for i in inputs if i.gold_class >= 0]
    if not found:
        raise HeedfulError(f"no example of {dataset} ({split}) has a gold label this model knows", hint="ROAR trains on gold labels")
    return found


def _subsample(inputs: list[ModelInput], n: int | None, seed: int) -> list[ModelInput]:
    """``n`` inputs drawn without replacement by a generator seeded with ``seed``, in split order."""
    if n is None or n >= len(inputs):
        return inputs
    chosen = np.sort(np.random.default_rng(seed).choice(len(inputs), size=n, replace=False))
    return [inputs[int(i)] for i in chosen]


# ---------------------------------------------------------------------------- the run
@dataclass
class _Split:
    """One split of the run: its spec, inputs and a run per method."""

    spec: bench.BenchSpec
    inputs: list[ModelInput]
    runs: dict[str, bench.Run]

    @property
    def ids(self) -> list[str]:
        return [i.id for i in self.inputs]

    @property
    def targets(self) -> np.ndarray:
        return np.array([i.gold_class for i in self.inputs], dtype=np.int64)


def _split(model: Model, dataset: str, split: str, names: list[str], protocol: Protocol, store: Path, options, batch_size: int,
           n: int | None, sample_seed: int | None) -> _Split:
    spec = bench.BenchSpec(model, dataset, names, [], protocol, store, split=split, n=None if sample_seed is not None else n,
                           batch_size=batch_size, method_options=dict(options or {}))
    inputs, data = bench.select_inputs(model, spec, {})
    inputs = _labelled(inputs, split, dataset)
    if sample_seed is not None:
        inputs = _subsample(inputs, n, sample_seed)
    runs = {run.method: run for run in bench.make_runs(spec, bench.spec_subject(spec, data))}
    return _Split(spec, inputs, runs)


def _done(store: ResultsStore, key: RunKey, job: Job, phash: str, ids: Sequence[str]) -> bool:
    return (
        TRAINING_ROW in store.metric_ids(key, f"{job.mode}_training", phash, [TRAINING_ROW])
        and len(store.metric_ids(key, f"{job.mode}_correct", phash, ids)) == len(ids)
    )


def _encoded(model: Model, inputs: Sequence[ModelInput], max_length: int | None) -> Encoded:
    """The unmodified examples, encoded as the explanations encode them."""
    pairs = [i.text_pair for i in inputs]
    batch = model.encode([i.text for i in inputs], text_pair=pairs if any(p is not None for p in pairs) else None, max_length=max_length)
    found = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask}
    types = _segments(model.adapter, batch)
    if types is not None:
        found["token_type_ids"] = types
    return found


def roar(
    model: Model,
    retrainer: Retrainer,
    store: str | Path,
    dataset: str = "movies",
    methods: Sequence[str] = DEFAULT_METHODS,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    *,
    operator: str = "mask",
    seeds: Sequence[int] = (0,),
    modes: Sequence[str] = ("roar",),
    train_n: int | None = TRAIN_EXAMPLES,
    test_n: int | None = None,
    sample_seed: int = 0,
    label: str = "predicted",
    reference: bool = True,
    method_options: dict[str, dict[str, Any]] | None = None,
    batch_size: int = 16,
    progress: bool = True,
) -> RoarResult:
    """ROAR (and KAR) of ``methods`` on ``model`` (module docstring), resumed from ``store`` (a
    folder or ``.sqlite`` file of a :class:`~heedful.evaluate.store.ResultsStore`).

    ``dataset``'s ``"train"`` split gives ``train_n`` examples drawn with ``sample_seed`` (``None``:
    all), its ``"test"`` split ``test_n`` drawn alike (``None``: all; a file's first rows are often of one class,
    as the snippet sets' are); both need gold labels.
    ``fractions``: the ``k`` in (0, 1); ``operator``: what replaces a removed token; ``seeds``: one
    retrain each (the fresh model's seeded part and the data order); ``modes``: ``"roar"`` and / or
    ``"kar"``; ``label``: the class explained (``"predicted"`` or ``"gold"``); ``reference``: also
    retrain on the unmodified examples; ``method_options``: per-method options
    (``{"integrated_gradients": {"n_steps": 20}}``). The random baseline always runs. Bad input
    is a one-line :class:`~heedful.errors.InputError` before any work; Ctrl-C raises
    :class:`~heedful.errors.Interrupted` with what the store kept."""
    names, ks = _check(model, retrainer, methods, fractions, operator, seeds, modes, train_n, test_n, label, batch_size)
    protocol = roar_protocol(operator, ks, label, retrainer.max_length).resolved(model.adapter.device)
    bench.check_options(names, dict(method_options or {}))
    train = _split(model, dataset, "train", names, protocol, Path(store), method_options, batch_size, train_n, sample_seed)
    test = _split(model, dataset, "test", names, protocol, Path(store), method_options, batch_size, test_n, sample_seed)
    jobs = [Job("roar", BASELINE, 0.0, s) for s in seeds] if reference else []
    jobs += [Job(mode, m, k, s) for m in names for mode in modes for k in ks for s in seeds]  # a method's retrains together: its degraded examples are made once
    hashes = {job: retrain_hash(job, protocol, train.runs[job.method].key, train.ids, retrainer) for job in jobs}
    retrained = explained = 0
    with ResultsStore(store) as results, progress_bar(transient=False, remaining=True, info=True, enabled=progress) as bar:
        todo = [job for job in jobs if not _done(results, test.runs[job.method].key, job, hashes[job], test.ids)]
        try:
            explained = _explain(model, results, [train, test], sorted({j.method for j in todo if not j.reference}), bar)
            retrained = _retrain_all(model, retrainer, results, todo, hashes, protocol, train, test, batch_size, bar)
        except KeyboardInterrupt:
            stored = sum(_done(results, test.runs[j.method].key, j, hashes[j], test.ids) for j in jobs)
            raise Interrupted(
                f"interrupted: {stored} of {len(jobs)} retrains stored ({stored - len(jobs) + len(todo)} by this run), and every"
                " explanation computed so far; run the same call to resume"
            ) from None
        table, correct = _table(results, jobs, hashes, test)
        seconds = {m: _explain_seconds(results, [train.runs[m].key, test.runs[m].key]) for m in names}
    return RoarResult(table, len(train.inputs), len(test.inputs), retrained, explained, seconds, results.path, correct)


def _explain(model: Model, store: ResultsStore, splits: Sequence[_Split], names: Sequence[str], bar) -> int:
    """Explain and store what ``store`` lacks of ``names`` on every split; the explanations computed."""
    count = 0
    for split in splits:
        for name in names:
            run = split.runs[name]
            missing = len(split.ids) - len(store.explanation_ids(run.key, split.ids))
            if not missing:
                continue
            task = bar.add_task(f"explaining {split.spec.split} with {name}", total=missing, info="")

            def advance(stage: str, n: int, task=task) -> None:
                bar.update(task, advance=n)

            bench._explain_missing(model, store, run, split.inputs, split.spec, on_batch=advance)
            count += missing
    return count


def _explanations(store: ResultsStore, split: _Split, name: str) -> list[Explanation]:
    found = store.get_explanations(split.runs[name].key, split.ids)
    return [found[i] for i in split.ids]


def _retrain_all(model, retrainer: Retrainer, store: ResultsStore, todo: Sequence[Job], hashes: dict[Job, str], protocol: Protocol,
                 train: _Split, test: _Split, batch_size: int, bar) -> int:
    """Every retrain of ``todo``, each stored as it finishes; how many."""
    if not todo:
        return 0
    task = bar.add_task("ROAR retrains", total=len(todo), info="")
    degraded: dict[str, tuple[dict, dict]] = {}
    original: tuple[Encoded, Encoded] | None = None
    for count, job in enumerate(todo):
        bar.update(task, info=f"{job.mode} {REFERENCE if job.reference else job.method} k={job.fraction:g} seed {job.seed}")
        if job.reference:
            if original is None:
                original = (_encoded(model, train.inputs, protocol.max_length), _encoded(model, test.inputs, protocol.max_length))
            train_rows, test_rows = original
        else:
            if job.method not in degraded:  # every mode and fraction of a method at once, from its stored explanations
                modes = sorted({j.mode for j in todo if j.method == job.method and not j.reference})
                degraded = {job.method: tuple(
                    degraded_inputs(model.adapter, _explanations(store, split, job.method), protocol, modes, 4 * batch_size)
                    for split in (train, test)
                )}
            train_rows, test_rows = (d[job.mode][job.fraction] for d in degraded[job.method])
        shown = {t.id for t in bar.tasks}
        began = time.perf_counter()
        fresh = retrainer.fresh(job.seed)
        summary = retrainer.fit(fresh, train_rows, train.targets, job.seed, bar)
        predicted = np.asarray(retrainer.predict(fresh, test_rows, bar)).argmax(axis=-1)
        summary = {**summary, "retrain_seconds": round(time.perf_counter() - began, 1)}  # the fresh model, training and the test pass
        del fresh
        for extra in [t.id for t in bar.tasks if t.id not in shown]:
            bar.remove_task(extra)
        _store_retrain(store, test.runs[job.method].key, job, hashes[job], protocol, retrainer, test, predicted, summary)
        bar.update(task, advance=1)
        if not bar.disable:  # a line per retrain stays on screen (and in a log) above the bars
            print(f"retrained {count + 1}/{len(todo)}: {job.mode} {job.method} k={job.fraction:g} seed {job.seed}: accuracy "
                  f"{float(np.mean(predicted == test.targets)):.3f}, {summary.get('seconds', math.nan):.0f} s", file=sys.stderr, flush=True)
    return len(todo)


def _store_retrain(store: ResultsStore, key: RunKey, job: Job, phash: str, protocol: Protocol, retrainer: Retrainer, test: _Split,
                   predicted: np.ndarray, summary: dict) -> None:
    """One retrain's outcome in one transaction (module docstring)."""
    fields = {"roar": ROAR_VERSION, **asdict(job), "operator": protocol.removal,
              "protocol": protocol.key_dict(), "retrainer": retrainer.identity()}
    correct = predicted == test.targets
    with store.transaction():
        store.put_protocol(phash, "roar", fields)
        store.put_metrics(key, f"{job.mode}_correct", phash,
                          [(i, float(c), None, {"predicted": int(p)}) for i, c, p in zip(test.ids, correct, predicted, strict=True)])
        store.put_metrics(key, f"{job.mode}_training", phash, [(TRAINING_ROW, float(summary.get("seconds", math.nan)), None, summary)])


def _explain_seconds(store: ResultsStore, keys: Sequence[RunKey]) -> float:
    costs = [c for c in (store.cost(k) for k in keys) if c and c["examples"]]
    total = sum(c["examples"] for c in costs)
    return sum(c["seconds"] for c in costs) / total if total else math.nan


def _table(store: ResultsStore, jobs: Sequence[Job], hashes: dict[Job, str], test: _Split):
    """The tidy table of :class:`RoarResult` from the store, and each row's per-example correctness."""
    import pandas as pd

    def correct(job: Job) -> np.ndarray:
        got = store.get_metrics(test.runs[job.method].key, f"{job.mode}_correct", hashes[job], test.ids)
        return np.array([got[i][0] for i in test.ids], dtype=float)

    rows, kept = [], {}
    for job in jobs:
        values = correct(job)
        kept[(job.mode, REFERENCE if job.reference else job.method, job.fraction, job.seed)] = values
        accuracy, low, high = bootstrap_mean(values)
        diff = (math.nan, math.nan, math.nan)
        if job.method != BASELINE and not job.reference:
            diff = bootstrap_paired_difference(values, correct(Job(job.mode, BASELINE, job.fraction, job.seed)))
        training = store.get_metrics(test.runs[job.method].key, f"{job.mode}_training", hashes[job], [TRAINING_ROW])[TRAINING_ROW]
        summary = training[2] or {}
        rows.append({
            "mode": job.mode, "method": REFERENCE if job.reference else job.method, "k": job.fraction, "seed": job.seed,
            "accuracy": accuracy, "low": low, "high": high, "vs_random": diff[0], "vs_random_low": diff[1], "vs_random_high": diff[2],
            "n_test": len(values), "train_seconds": training[0], "retrain_seconds": summary.get("retrain_seconds", math.nan),
            "steps": summary.get("steps", math.nan),
        })
    return pd.DataFrame(rows), kept
