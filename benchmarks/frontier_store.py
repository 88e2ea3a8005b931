"""The measuring half of ``benchmarks/frontier.py``: every method's explanations, timings and
metric values kept in a ``heedful bench`` results store as they finish, so that the frontier
resumes where it stopped and its report can be written from whatever the store holds.

Per model, the frontier is three benches on one store (:func:`heedful.evaluate.bench.run_bench`),
one per removal operator of :data:`heedful.evaluate.operators.CROSS_OPERATORS` -- protocol
``default`` with that ``removal``; AOPC and sufficiency under each, and soft comprehensiveness /
sufficiency (which remove no token, so one operator's protocol serves) with the replacement
operator -- F-Fidelity on the model's fine-tuned copy, stored as metrics ``ffid_plus`` /
``ffid_minus`` of the method's run under a measurement hash of the copy's fingerprint, the
protocol, beta, the draws and their seed (:func:`ffidelity_hash`), and the counterfactual tests
of Ye et al. 2021 (:mod:`heedful.inside.counterfactual`: the top word replaced by a corpus word
of its tag (from the sampled-replacement operator's corpus), the top adjective negated, each
against a control edit), stored as metrics ``counterfactual_replace`` / ``counterfactual_negate``
-- 1 confirmed, 0 not, NaN where the sentence allows no such edit -- under a hash of the test's
options, the tagger and the corpus (:func:`measurement_hash`). A row is keyed by the model's
fingerprint, the method with its complete options and version, the protocol (operator) and the
example (:func:`heedful.evaluate.store.run_key`), so nothing stale is reused and a rerun computes
only what is missing; Ctrl-C loses at most the model batch in flight.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import sys
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

import heedful
from heedful.commands.options import key_value
from heedful.errors import HeedfulError
from heedful.evaluate.bench import BenchSpec, Run, make_runs, run_bench, select_inputs, spec_subject
from heedful.evaluate.evaluation import ModelInput
from heedful.evaluate.ffidelity import FFID_BETA, FFID_SEED, f_fidelity
from heedful.evaluate.operators import CROSS_OPERATORS, corpus_texts, replacement_operator
from heedful.evaluate.protocol import Protocol, get_protocol
from heedful.evaluate.store import ResultsStore, Subject
from heedful.fingerprint import model_fingerprint
from heedful.inside.counterfactual import (
    Tagger,
    Word,
    counterfactual_report,
    spacy_tagger,
    tagger_name,
    vocabulary,
)
from heedful.progress import task

PROTOCOL = "default"
SOFT = ("soft_comprehensiveness", "soft_sufficiency")
FFID = ("ffid_plus", "ffid_minus")
COUNTERFACTUAL_EDITS = ("replace", "negate")
COUNTERFACTUAL = tuple(f"counterfactual_{edit}" for edit in COUNTERFACTUAL_EDITS)
COUNTERFACTUAL_OPTIONS = {"k": 1, "seed": 0, "margin": 0.05}
"""The top word, control draws seeded per sentence, and the counterfactual module's margin."""
counterfactual_tagger: Tagger = spacy_tagger
"""Tags the frontier's sentences and the replacement corpus for the counterfactual tests (tests
swap in a dictionary tagger)."""


@dataclass(frozen=True)
class Setting:
    """One bench of the frontier: removal ``operator``, its ``protocol`` and the ``metrics`` it stores."""

    operator: str
    protocol: Protocol
    metrics: tuple[str, ...]


def operator_settings(model: heedful.Model) -> list[Setting]:
    """The benches of ``model``'s frontier, one per cross operator (``mask`` is ``[UNK]`` for a
    tokenizer without a mask token), soft metrics with the replacement operator. The random
    baseline runs with one seed (as every other method: per-sentence values, paired)."""
    replacement = replacement_operator(model.tokenizer)
    found = []
    for op in CROSS_OPERATORS:
        op = replacement if op == "mask" else op
        protocol = get_protocol(PROTOCOL, removal=op, random_seeds=1).resolved(model.adapter.device)
        found.append(Setting(op, protocol, ("aopc", "sufficiency", *(SOFT if op == replacement else ()))))
    return found


def ffidelity_fields(copy: str | None, protocol: Protocol, samples: int) -> dict:
    """The fields F-Fidelity values are measured with: the fine-tuned copy's weights digest
    ``copy``, beta, the draws and their seed, and the curve protocol."""
    return {"f_fidelity": {"model": copy, "beta": FFID_BETA, "samples": samples, "seed": FFID_SEED}, **protocol.key_dict()}


def ffidelity_hash(finetuned: heedful.Model, protocol: Protocol, samples: int) -> tuple[str, dict]:
    """The measurement hash F-Fidelity values are stored under and its fields
    (:func:`ffidelity_fields` of the copy's fingerprint)."""
    fields = ffidelity_fields(model_fingerprint(finetuned).digest, protocol, samples)
    return measurement_hash(fields), fields


@dataclass(frozen=True)
class FFidelityRead:
    """The F-Fidelity values a frontier reads: those stored under measurement ``hash``, measured
    on the copy whose weights digest is ``copy`` (``local``: this machine's built copy), ``rows``
    FFid+ values of the model's runs stored under it, ``here`` under this machine's copy."""

    hash: str
    copy: str
    local: bool
    rows: int
    here: int


def ffidelity_copies(store: Path, model: heedful.Model, protocol: Protocol, samples: int, local: tuple[str, dict] | None) -> list[FFidelityRead]:
    """Every copy whose F-Fidelity values of ``model``'s runs the frontier could read: this
    machine's (``local``: its hash and fields, ``None`` when not built) and each copy ``store``
    holds values of under the same beta, draws, seed and curve protocol, with how many FFid+
    values each has."""
    expected = measurement_hash(_without_copy(ffidelity_fields(None, protocol, samples)))
    digest = model_fingerprint(model).digest
    with ResultsStore(store) as results:
        found = {h: f for h, f in results.protocols("f-fidelity").items() if measurement_hash(_without_copy(f)) == expected}
        if local is not None:
            found[local[0]] = local[1]
        counts = {h: results.metric_total(FFID[0], h, digest) for h in found}
    here = None if local is None else local[0]
    return [FFidelityRead(h, f["f_fidelity"]["model"], h == here, counts[h], counts.get(here, 0)) for h, f in found.items()]


def ffidelity_read(copies: list[FFidelityRead]) -> FFidelityRead | None:
    """Which copy's F-Fidelity values a frontier reads: of ``copies`` (:func:`ffidelity_copies`),
    the one with the most FFid+ values -- this machine's on a tie. A copy is trained on each
    machine, and training on another processor sums in another order and lands on other
    weights, so a store moved to such a machine keeps reading the values it was measured with
    (each row is compared on one copy) until ``--measure-stored`` has measured as many on the
    new one. ``None``: no copy built and none stored."""
    return max(copies, key=lambda c: (c.rows, c.local, c.hash)) if copies else None


def _without_copy(fields: dict) -> dict:
    """F-Fidelity ``fields`` without the copy's digest (compared by :func:`measurement_hash`: stored
    fields come back from JSON with lists where the protocol has tuples)."""
    return {**fields, "f_fidelity": {k: v for k, v in fields["f_fidelity"].items() if k != "model"}}


@dataclass(frozen=True)
class CounterfactualSetting:
    """The frontier's counterfactual tests: the sentences' ``tagged`` words, the ``pool`` of
    replacement words by tag, and the hash (with its ``fields``) their values are stored under."""

    tagged: list[list[Word]]
    pool: dict[str, list[str]]
    hash: str
    fields: dict


def counterfactual_setting(texts: list[str]) -> CounterfactualSetting:
    """Tag ``texts`` and the corpus of the sampled-replacement operator
    (:func:`heedful.evaluate.operators.corpus_texts`: movie train snippets), whose words the
    replacements are drawn from, with :data:`counterfactual_tagger`; key the tests by their
    options, the tagger and that corpus."""
    corpus = corpus_texts()
    fields = {"counterfactual": {**COUNTERFACTUAL_OPTIONS, "edits": list(COUNTERFACTUAL_EDITS), "tagger": tagger_name(counterfactual_tagger),
                                 "corpus": hashlib.sha1("\n".join(corpus).encode()).hexdigest()[:16]}}
    return CounterfactualSetting(counterfactual_tagger(texts), vocabulary(counterfactual_tagger(corpus)), measurement_hash(fields), fields)


def labels(text: str) -> list[str]:
    """``"lime,solvability_beam[objective=both,beam=8]"`` -> its rows (commas inside brackets
    separate a row's options)."""
    return [m.strip() for m in re.findall(r"[^,\[]+(?:\[[^\]]*\]?)?", text) if m.strip()]


def split_label(label: str) -> tuple[str, dict[str, Any]]:
    """A frontier row's label -> the method and the options it runs with: ``"lime"`` -> ``("lime",
    {})``, ``"solvability_beam[objective=both,beam=8]"`` -> ``("solvability_beam", {"objective":
    "both", "beam": 8})`` (values read as JSON where they parse, else text; a bad item is a
    one-line :class:`~heedful.errors.HeedfulError`)."""
    method, bracket, rest = label.partition("[")
    if not bracket:
        return label, {}
    if not rest.endswith("]"):
        raise HeedfulError(f"method {label!r} lacks its closing ']'", hint="e.g. solvability_beam[objective=both]")
    items = [item for item in rest[:-1].split(",") if item.strip()]
    return method, dict(key_value(item, "solvability_beam[objective=both]") for item in items)


def measurement_hash(fields: dict) -> str:
    """The hash values measured with ``fields`` are stored under (F-Fidelity's, the
    counterfactual tests')."""
    return hashlib.sha1(json.dumps(fields, sort_keys=True, default=list).encode()).hexdigest()[:16]


@dataclass
class Frontier:
    """One model's frontier on the store at ``store``: the first ``n`` sentences (``inputs``,
    ids in order), the bench ``spec`` every method is run with (``settings`` swapped in),
    F-Fidelity's fine-tuned copy with its protocol and hash (``None`` when not built; what is
    measured), the counterfactual tests' setting (``None`` for a model that is not a classifier),
    the F-Fidelity values the report reads (:func:`ffidelity_read`) and F-Fidelity's curve
    protocol and draws."""

    name: str
    model: heedful.Model
    n: int
    store: Path
    spec: BenchSpec
    settings: list[Setting]
    inputs: list[ModelInput]
    about: Subject
    ffid: tuple[heedful.Model, Protocol, str, dict] | None = None
    counterfactual: CounterfactualSetting | None = None
    ffid_read: FFidelityRead | None = None
    ffid_setting: tuple[Protocol, int] | None = None

    @property
    def ids(self) -> list[str]:
        return [i.id for i in self.inputs]

    def columns(self) -> dict[str, tuple[str, str]]:
        """Column (``aopc_mask``, ``soft_comprehensiveness``, ``ffid_plus`` ...) -> (stored
        metric, protocol or measurement hash)."""
        found = {}
        for setting in self.settings:
            for metric in setting.metrics:
                found[metric if metric in SOFT else f"{metric}_{setting.operator}"] = (metric, setting.protocol.hash())
        if self.ffid_read is not None:
            found.update({metric: (metric, self.ffid_read.hash) for metric in FFID})
        if self.counterfactual is not None:
            found.update({metric: (metric, self.counterfactual.hash) for metric in COUNTERFACTUAL})
        return found

    def spec_of(self, label: str, setting: Setting) -> BenchSpec:
        """The bench of the row ``label`` (a method, or a method with options: :func:`split_label`)
        under ``setting``."""
        method, options = split_label(label)
        return replace(self.spec, methods=[method], method_options={method: options} if options else {},
                       metrics=list(setting.metrics), protocol=setting.protocol)

    def run(self, label: str) -> Run:
        """The run of the row ``label`` (its key in the store), as the benches make it."""
        return make_runs(self.spec_of(label, self.settings[0]), self.about)[0]

    def complete(self, store: ResultsStore, run: Run, *, ffidelity: bool = True) -> set[str]:
        """The ids whose explanation and every column's value ``store`` holds for ``run``
        (without ``ffidelity``, or when the F-Fidelity read is not this machine's copy's, which
        cannot be measured here: every column but F-Fidelity's)."""
        ids = self.ids
        done = store.explanation_ids(run.key, ids)
        ffidelity = ffidelity and self.ffid_read is not None and self.ffid_read.local
        for column, (metric, phash) in self.columns().items():
            if ffidelity or column not in FFID:
                done &= store.metric_ids(run.key, metric, phash, ids)
        return done


def model_frontier(
    name: str, model: heedful.Model, n: int, store: Path, dataset: str, split: str, batch_size: int,
    finetuned: heedful.Model | None = None, samples: int = 4,
) -> Frontier:
    """The frontier of ``model`` (stored as ``name``) on the first ``n`` examples of ``dataset``'s
    ``split``; ``finetuned``: F-Fidelity's fine-tuned copy, measured with ``samples`` draws."""
    settings = operator_settings(model)
    spec = BenchSpec(model=model, dataset=dataset, methods=[], metrics=list(settings[0].metrics), protocol=settings[0].protocol,
                     out=store, split=split, n=n, batch_size=batch_size, model_label=name)
    inputs, data = select_inputs(model, spec, {})
    ffid, setting = None, None
    if finetuned is not None or model.task == "classification":
        # the operator the copy was fine-tuned with: [MASK], or [UNK] where the tokenizer (the model's own) has no mask token
        copy = finetuned or model
        protocol = get_protocol(PROTOCOL, removal=replacement_operator(copy.tokenizer)).resolved(copy.adapter.device)
        ffid = None if finetuned is None else (finetuned, protocol, *ffidelity_hash(finetuned, protocol, samples))
        setting = (protocol, samples)
    counterfactual = counterfactual_setting([i.text for i in inputs]) if model.task == "classification" else None
    front = Frontier(name, model, n, store, spec, settings, inputs, spec_subject(spec, data), ffid, counterfactual, ffid_setting=setting)
    return with_ffidelity_read(front)


def _front_copies(front: Frontier) -> list[FFidelityRead]:
    """:func:`ffidelity_copies` of ``front``'s model, curve protocol, draws and built copy."""
    protocol, samples = front.ffid_setting
    return ffidelity_copies(front.store, front.model, protocol, samples, None if front.ffid is None else front.ffid[2:])


def with_ffidelity_read(front: Frontier) -> Frontier:
    """``front`` reading the F-Fidelity values :func:`ffidelity_read` picks from its store as it
    stands (again after measuring: the pick follows the values stored)."""
    if front.ffid_setting is None:
        return front
    return replace(front, ffid_read=ffidelity_read(_front_copies(front)))


def other_ffidelity(front: Frontier) -> list[FFidelityRead]:
    """The copies besides the one ``front`` reads that its store holds F-Fidelity values of, most
    values first."""
    if front.ffid_setting is None or front.ffid_read is None:
        return []
    return sorted((c for c in _front_copies(front) if c.hash != front.ffid_read.hash and c.rows), key=lambda c: -c.rows)


def measure(front: Frontier, method: str, progress: bool = True, say: Callable[[str], None] | None = None) -> None:
    """Compute and store what ``front`` lacks of the row ``method`` (a label, :func:`split_label`): its explanations and curves under
    each operator (a bench each), then F-Fidelity and the counterfactual tests. Ctrl-C raises
    :class:`~heedful.errors.Interrupted` saying what the store kept."""
    say = say or (lambda text: print(text, file=sys.stderr, flush=True))
    for k, setting in enumerate(front.settings):
        say(f"  {method}: {'explanations and ' if k == 0 else ''}{', '.join(setting.metrics)} under {setting.operator}")
        run_bench(front.spec_of(method, setting), progress=progress)
    if front.ffid is not None:
        say(f"  {method}: F-Fidelity on {front.ffid[0].name}")
        with ResultsStore(front.store) as store:
            store_ffidelity(store, front, front.run(method))
    if front.counterfactual is not None:
        say(f"  {method}: counterfactual tests")
        with ResultsStore(front.store) as store:
            store_counterfactual(store, front, front.run(method))


def measure_stored(front: Frontier, method: str, say: Callable[[str], None] | None = None) -> None:
    """Measure F-Fidelity and the counterfactual tests of the row ``method``'s stored
    explanations where the store lacks them, computing no explanation: what a store moved to a
    machine whose fine-tuned copy was rebuilt with other weights (another processor sums in
    another order) needs before its rows read whole again."""
    say = say or (lambda text: print(text, file=sys.stderr, flush=True))
    with ResultsStore(front.store) as store:
        run = front.run(method)
        if not store.explanation_ids(run.key, front.ids):
            return
        if front.ffid is not None:
            say(f"  {method}: F-Fidelity of {store_ffidelity(store, front, run)} stored explanations on {front.ffid[0].name}")
        if front.counterfactual is not None:
            say(f"  {method}: counterfactual tests of {store_counterfactual(store, front, run)} stored explanations")


def store_ffidelity(store: ResultsStore, front: Frontier, run: Run) -> int:
    """FFid+ / FFid- of ``run``'s stored explanations, measured on the fine-tuned copy a model
    batch at a time -- batches cut from the stored ids in the frontier's order, as the bench
    that stored them cut its batches, so an example is measured with the same neighbours however
    far the frontier has grown -- each stored in one transaction. Returns the examples measured."""
    finetuned, protocol, phash, fields = front.ffid
    store.put_protocol(phash, "f-fidelity", fields)
    size = front.spec.batch_size
    explained = store.explanation_ids(run.key, front.ids)
    ids = [i for i in front.ids if i in explained]
    have = store.metric_ids(run.key, FFID[0], phash, ids) & store.metric_ids(run.key, FFID[1], phash, ids)
    todo = [chunk for chunk in (ids[s : s + size] for s in range(0, len(ids), size)) if not have.issuperset(chunk)]
    samples = fields["f_fidelity"]["samples"]
    measured = 0
    with task(f"F-Fidelity of {run.method}", total=len(todo)) as steps:
        for chunk in todo:
            stored = store.get_explanations(run.key, chunk)
            found = f_fidelity(finetuned, [stored[i] for i in chunk], protocol, samples=samples, batch_size=size)
            with store.transaction():
                for metric, per in zip(FFID, (found.plus, found.minus), strict=True):
                    rows = [(i, float(per.values[b]), per.curves[b].tolist(), None) for b, i in enumerate(chunk) if i not in have]
                    store.put_metrics(run.key, metric, phash, rows)
            measured += len(chunk)
            steps.advance()
    return measured


def store_counterfactual(store: ResultsStore, front: Frontier, run: Run) -> int:
    """The counterfactual tests of ``run``'s stored explanations on the sentences that lack them,
    stored in one transaction: per sentence and edit, 1 when the model bore the hypothesis out,
    0 when not, NaN when the sentence allows no such edit (its ``extra``: the words edited, the
    edited and the control texts, and both drops of p(class)). Returns the sentences tested."""
    setting = front.counterfactual
    store.put_protocol(setting.hash, "counterfactual", setting.fields)
    ids = front.ids
    have = set(ids)
    for metric in COUNTERFACTUAL:
        have &= store.metric_ids(run.key, metric, setting.hash, ids)
    stored = store.get_explanations(run.key, [i for i in ids if i not in have])
    todo = [j for j, i in enumerate(ids) if i in stored]
    if not todo:
        return 0
    report = counterfactual_report(
        front.model, [front.inputs[j].text for j in todo], {run.method: [stored[ids[j]] for j in todo]}, [setting.tagged[j] for j in todo],
        setting.pool, k=COUNTERFACTUAL_OPTIONS["k"], edits=COUNTERFACTUAL_EDITS, seed=COUNTERFACTUAL_OPTIONS["seed"],
        batch_size=front.spec.batch_size, margin=COUNTERFACTUAL_OPTIONS["margin"], numbers=todo,
    )
    found = {(h.edit, h.index): h for h in report.hypotheses}
    with store.transaction():
        for edit, metric in zip(COUNTERFACTUAL_EDITS, COUNTERFACTUAL, strict=True):
            rows = []
            for t, j in enumerate(todo):
                h = found.get((edit, t))
                extra = None if h is None else {"top": h.top, "control": h.control, "texts": list(h.texts), "drop": h.drop,
                                                "control_drop": h.control_drop}
                rows.append((ids[j], math.nan if h is None else float(h.confirmed), None, extra))
            store.put_metrics(run.key, metric, setting.hash, rows)
    return len(todo)


@dataclass
class Reading:
    """What the store holds of a frontier: per column, per method, the values ``[n]`` over the
    frontier's ids (NaN where the method lacks some column of that sentence, so every value of a
    method is read on the same sentences); per method, the sentences it has whole, and its cost
    record (examples, seconds, forward, backward) or ``None``; per method, each sentence's
    forward-pass equivalents ``[n]`` as its stored explanation records them (NaN where the method
    lacks the sentence or the explanation has no cost)."""

    values: dict[str, dict[str, np.ndarray]]
    reached: dict[str, int]
    cost: dict[str, dict[str, float] | None]
    sentence_cost: dict[str, np.ndarray] = field(default_factory=dict)


def read(store: ResultsStore, front: Frontier, methods: list[str], only: Collection[str] | None = None) -> Reading:
    """The values ``store`` holds of ``methods`` on ``front`` (methods with no whole sentence
    are left out), of every column or ``only`` those. F-Fidelity does not count towards whole:
    on a large model it costs minutes per row, so a row it has not reached yet is read with its
    FFid values NaN."""
    ids = front.ids
    columns = {c: v for c, v in front.columns().items() if only is None or c in only}
    values: dict[str, dict[str, np.ndarray]] = {column: {} for column in columns}
    reached, cost, sentence_cost = {}, {}, {}
    for method in methods:
        run = front.run(method)
        done = front.complete(store, run, ffidelity=False)
        if not done:
            continue
        reached[method], cost[method] = len(done), store.cost(run.key)
        passes = store.explanation_costs(run.key, ids)
        sentence_cost[method] = np.array([passes[i][0] + 2 * passes[i][1] if i in done and i in passes else np.nan for i in ids])
        for column, (metric, phash) in columns.items():
            got = store.get_metrics(run.key, metric, phash, ids)
            values[column][method] = np.array([got[i][0] if i in done and i in got else np.nan for i in ids], dtype=float)
    return Reading(values, reached, cost, sentence_cost)
