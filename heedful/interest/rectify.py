"""Rectifying misclassifications by suppressing the tokens that hold a model's interest.

The seed paper's first application (Section 5.4.1, Table 1 / Table 3, Figure 8): for every
example of a split that the classifier gets wrong, take an attribution toward the model's own
(wrong) prediction, erase the top-``r`` fraction of the example's tokens by that attribution
(the model's removal token: ``[MASK]`` for encoders, deletion for causal LMs), classify again,
and count how many errors the erasure fixes.

Two numbers per method and ratio:

* the gain on the error set: the share of the errors whose new prediction is the gold label;
* the gain on the whole split: accuracy after minus accuracy before, where *only the error
  examples are modified* (as in the paper); correct examples keep their prediction. This is an
  upper bound on what the erasure would do in use, where nobody knows which examples are wrong:
  the same erasure applied to a correctly classified example can break it, and that cost is not
  counted here.

Any registered attribution method works (``methods``), so the co-perturbation interest can be
compared with other attributions -- and with the ``random`` baseline, which says how many errors
erasing that many arbitrary tokens fixes. Explanations are computed with
:meth:`heedful.Model.explain` a batch of error examples at a time, and can be kept in (and
reused from) a :class:`~heedful.evaluate.store.ResultsStore`, keyed by :func:`heedful.evaluate.
store.run_key` as :func:`heedful.evaluate.bench.run_bench` keys them, so a benchmark run and a
rectification run share their work.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from heedful.engine.batch import Batch
from heedful.engine.runner import Copies, Runner
from heedful.errors import HeedfulError, InputError
from heedful.explanation import Explanation
from heedful.interest.suppress import suppress
from heedful.model import Model
from heedful.progress import task

SWEEP_RATIOS = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5)
"""Erasure ratios of a sweep (the paper's Figure 8 runs up to about half the tokens)."""
DEFAULT_RATIO = 0.2
"""Single-ratio default: where the paper's Figure 8 peaks for GPT-2 124M."""

@dataclass
class MethodGain:
    """One method's rectification at each ratio.

    ``predictions`` ``[E, R]``: class predicted for each error example after erasing the top
    ``ratios[r]`` of its tokens; ``fixed`` ``[R]``: errors whose new prediction is the gold label;
    ``changed`` ``[R]``: errors whose prediction changed at all; ``erased`` ``[R]``: mean tokens
    erased per example; ``seconds``: explanation time per error example (measured by
    :meth:`heedful.Model.explain`; 0 where every explanation came from the store);
    ``from_store``: explanations reused from the store.
    """

    method: str
    options: dict[str, Any]
    predictions: np.ndarray
    fixed: np.ndarray
    changed: np.ndarray
    erased: np.ndarray
    seconds: float
    from_store: int = 0


@dataclass
class Rectification:
    """What :func:`rectify` found. ``n_total`` examples were classified, ``correct`` of them
    correctly; ``error_ids`` / ``gold`` / ``predicted`` describe the ``n_errors`` others. Gains
    are derived (see :meth:`error_gain`, :meth:`accuracy_after`). ``notes``: what the results
    store held that could not be used, and why."""

    model: str
    dataset: str
    split: str
    ratios: list[float]
    n_total: int
    correct: int
    error_ids: list[str]
    gold: np.ndarray
    predicted: np.ndarray
    methods: dict[str, MethodGain] = field(default_factory=dict)
    removal: str = "auto"
    max_length: int | None = None
    skipped: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def n_errors(self) -> int:
        return len(self.error_ids)

    @property
    def accuracy_before(self) -> float:
        return self.correct / self.n_total if self.n_total else float("nan")

    def error_gain(self, method: str) -> np.ndarray:
        """``[R]``: share of the errors fixed at each ratio (the paper's numbers in parentheses)."""
        fixed = self.methods[method].fixed
        return fixed / self.n_errors if self.n_errors else np.full(len(fixed), np.nan)

    def accuracy_after(self, method: str) -> np.ndarray:
        """``[R]``: accuracy on the whole split when only the error examples are modified."""
        return (self.correct + self.methods[method].fixed) / self.n_total

    def whole_gain(self, method: str) -> np.ndarray:
        """``[R]``: accuracy after minus accuracy before (fixed errors / all examples)."""
        return self.methods[method].fixed / self.n_total

    def best(self, method: str) -> int:
        """Index of the ratio that fixes the most errors (the smallest such ratio)."""
        return int(np.argmax(self.methods[method].fixed))


# ----------------------------------------------------------------------------- the pieces
@torch.no_grad()
def classify(model: Model, texts: Sequence[str], pairs: Sequence[str | None] | None = None, *, batch_size: int = 64, max_length: int | None = None) -> np.ndarray:
    """Predicted class of each text ``[T]``, in batches of ``batch_size`` (inputs truncated to
    ``max_length`` tokens, as the explanations are)."""
    found: list[np.ndarray] = []
    with task("classify", total=len(texts), shown=len(texts) > batch_size) as done:
        for start in range(0, len(texts), batch_size):
            part = pairs[start : start + batch_size] if pairs is not None else None
            problem = model.prepare(_encode(model, texts[start : start + batch_size], part, max_length))
            found.append(problem.target.classes[:, 0].numpy())
            done.advance(len(texts[start : start + batch_size]))
    return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)


@torch.no_grad()
def predict_suppressed(
    model: Model, batch: Batch, scores: torch.Tensor, ratios: Sequence[float], removal: str = "auto"
) -> tuple[np.ndarray, np.ndarray]:
    """Erase the top-``ratio`` tokens of every example of ``batch`` by ``scores`` ``[B, N]`` for
    each of ``ratios`` and classify again: predicted classes ``[B, R]`` and tokens erased
    ``[B, R]``. All ratios' copies run together (chunks of similar length)."""
    adapter = model.adapter
    problem = model.prepare(batch)
    ids, masks, types, anchors, erased = [], [], [], [], []
    for ratio in ratios:
        perturbed, gone = suppress(problem, scores, float(ratio), removal)
        width = batch.seq_len
        pad = width - perturbed.input_ids.shape[1]
        ids.append(torch.nn.functional.pad(perturbed.input_ids, (0, pad), value=adapter.pad_token_id))
        masks.append(torch.nn.functional.pad(perturbed.attention_mask, (0, pad), value=0))
        if perturbed.token_type_ids is not None:
            types.append(torch.nn.functional.pad(perturbed.token_type_ids, (0, pad), value=0))
        anchors.append(perturbed.anchor)
        erased.append(gone.sum(dim=1))
    bsz = len(batch)
    copies = Copies(
        torch.arange(bsz).repeat(len(ratios)),
        torch.cat(ids),
        torch.cat(masks),
        torch.cat(types) if types else None,
        torch.cat(anchors),
    )
    predicted = Runner.for_problem(problem).map(copies, lambda part, fwd: fwd.logits.argmax(dim=-1))
    return predicted.view(len(ratios), bsz).T.numpy(), torch.stack(erased, dim=1).numpy()


def _encode(model: Model, texts, pairs, max_length: int | None) -> Batch:
    with warnings.catch_warnings():  # rectify reports truncation once
        warnings.filterwarnings("ignore", message=".*were truncated")
        return model.adapter.encode(texts, pairs, True, max_length)


def scores_tensor(explanations: Sequence[Explanation], batch: Batch) -> torch.Tensor:
    """Token scores ``[B, N]`` of ``explanations`` laid out like ``batch`` (0 on padding). Each
    explanation must have exactly the batch's tokens for its example -- the tokenizer's own
    (``raw_tokens``, as ``batch.tokens``), not the readable ones a byte-level tokenizer decodes."""
    scores = torch.zeros(len(batch), batch.seq_len, dtype=torch.float64)
    for b, expl in enumerate(explanations):
        n = int(batch.lengths[b])
        if list(expl.raw_tokens) != list(batch.tokens[b]) or expl.scores.ndim != 1:
            raise HeedfulError(
                f"the explanation of example {b} does not match its tokens",
                hint="layer-wise scores cannot rank tokens; or the store holds another tokenisation",
            )
        scores[b, :n] = torch.from_numpy(np.asarray(expl.scores, dtype=np.float64))
    return scores


# ----------------------------------------------------------------------------- the runner
def rectify(
    model: Model,
    dataset: str = "movies",
    methods: Sequence[str] = ("coperturbation",),
    ratios: Sequence[float] = (DEFAULT_RATIO,),
    *,
    split: str = "test",
    n: int | None = None,
    seed: int = 0,
    method_options: dict[str, dict[str, Any]] | None = None,
    batch_size: int = 16,
    removal: str = "auto",
    max_length: int | None = None,
    store: Path | str | None = None,
    model_label: str | None = None,
) -> Rectification:
    """Rectify ``model``'s errors on the first ``n`` examples of ``dataset``'s ``split`` by
    erasing the top ``ratios`` of tokens by each of ``methods`` (see the module docstring).

    ``method_options``: per-method options (``{"integrated_gradients": {"n_steps": 20}}``);
    stochastic methods also get ``seed``. ``store``: a results-store folder; explanations are
    read from it and new ones written to it, under the keys :func:`~heedful.evaluate.bench.
    run_bench` uses for the predicted label and ``max_length`` (``model_label``: how the model is
    named there and in the result; default its folder path or the name it was loaded by).
    Progress -- the split classified, each method's error examples explained -- goes to the
    current :mod:`heedful.progress` reporter.
    """
    from heedful import datasets
    from heedful.evaluate.evaluation import model_inputs
    from heedful.evaluate.store import model_label as label_of

    if not isinstance(model, Model):
        raise InputError(f"rectify needs a loaded model, got {type(model).__name__}", hint="pass heedful.load(name)")
    loaded = model
    if loaded.task != "classification":
        raise InputError(
            f"rectification needs a classifier; {loaded.name} is a {loaded.task} model",
            hint="use a sentiment classifier such as minilm-sentiment",
        )
    ratios = [float(r) for r in ratios]
    if not ratios:
        raise InputError("no erasure ratio given")
    if any(not 0.0 < r <= 1.0 for r in ratios):
        raise InputError(f"erasure ratios must lie in (0, 1], got {ratios}")
    if batch_size < 1:
        raise InputError(f"batch size must be positive, got {batch_size}")
    if n is not None and n < 1:
        raise InputError(f"n must be at least 1, got {n}", hint="n=None uses the whole split")
    infos = [loaded.method(name) for name in methods]  # fail before any work
    if not infos:
        raise InputError("no method given")
    options = {}
    for info in infos:
        options[info.name] = dict((method_options or {}).get(info.name, {}))
        if info.stochastic:
            options[info.name].setdefault("seed", seed)
        info.bind(options[info.name])  # bad options fail before any work

    whole = datasets.load(dataset, split)  # the store keys the whole split's content, whatever n
    data = whole.head(n)
    skipped: dict[str, int] = {}
    inputs = [i for i in model_inputs(data, loaded.adapter, "predicted", skipped) if i.gold_class >= 0]
    dropped = len(data) - len(inputs) - sum(skipped.values())
    if dropped:
        skipped["no gold label"] = skipped.get("no gold label", 0) + dropped
    if not inputs:
        raise HeedfulError(f"no example of {dataset} ({split}) has a gold label this model knows")
    texts = [i.text for i in inputs]
    pairs = [i.text_pair for i in inputs] if any(i.text_pair is not None for i in inputs) else None
    predicted = classify(loaded, texts, pairs, max_length=max_length)
    limit = min(max_length or loaded.adapter.max_length, loaded.adapter.max_length)
    tok = loaded.adapter.tokenizer
    lengths = [len(x) for x in tok(*((texts, pairs) if pairs else (texts,)), truncation=False)["input_ids"]]
    long = sum(1 for k in lengths if k > limit)
    if long:
        warnings.warn(f"{long} text(s) longer than {limit} tokens were truncated", stacklevel=2)
    gold = np.array([i.gold_class for i in inputs])
    wrong = np.flatnonzero(predicted != gold)
    errors = [inputs[k] for k in wrong]
    result = Rectification(
        model=model_label or label_of(loaded),
        dataset=dataset,
        split=split,
        ratios=ratios,
        n_total=len(inputs),
        correct=int((predicted == gold).sum()),
        error_ids=[e.id for e in errors],
        gold=gold[wrong],
        predicted=predicted[wrong],
        removal=removal,
        max_length=max_length,
        skipped=skipped,
    )
    results_store, keys = None, {}
    if store is not None:
        results_store, keys = _open_store(store, loaded, result.model, dataset, split, whole, options, max_length)
        result.notes += [note for note in [results_store.legacy_note()] if note]
    try:
        for info in infos:
            result.methods[info.name] = _run_method(
                loaded, info.name, options[info.name], errors, result, batch_size, results_store, keys.get(info.name)
            )
    finally:
        if results_store is not None:
            results_store.close()
    return result


def _open_store(store, model: Model, label: str, dataset: str, split: str, whole, options: dict[str, dict], max_length):
    """The results store and each method's key there: the predicted label explained, inputs cut
    to ``max_length`` -- as :func:`~heedful.evaluate.bench.run_bench` keys them."""
    from heedful.evaluate.store import ResultsStore, run_key, subject

    about = subject(model, dataset, split, whole, label=label)
    keys = {name: run_key(about, name, opts, label="predicted", max_length=max_length) for name, opts in options.items()}
    return ResultsStore(store), keys


def _run_method(model, method, options, errors, result, batch_size, store, key) -> MethodGain:
    with task(f"explain errors  {method}", total=len(errors)) as explained:
        return _explain_errors(model, method, options, errors, result, batch_size, store, key, explained)


def _explain_errors(model, method, options, errors, result, batch_size, store, key, explained) -> MethodGain:
    rows = len(errors)
    predictions = np.zeros((rows, len(result.ratios)), dtype=np.int64)
    erased = np.zeros((rows, len(result.ratios)), dtype=np.int64)
    seconds, reused = 0.0, 0
    if store is not None:
        done = store.explanation_ids(key)
        older = store.superseded(key, [e.id for e in errors if e.id not in done])
        if older is not None:
            result.notes.append(older.describe(method))
    for start in range(0, rows, batch_size):
        part = errors[start : start + batch_size]
        pairs = [e.text_pair for e in part]
        pairs_or_none = pairs if any(p is not None for p in pairs) else None
        batch = _encode(model, [e.text for e in part], pairs_or_none, result.max_length)
        found = store.get_explanations(key, [e.id for e in part]) if store is not None else {}
        found = {i: x for i, x in found.items() if x.target.label == _label(model, result, start, part, i)}
        todo = [k for k, e in enumerate(part) if e.id not in found]
        reused += len(part) - len(todo)
        if todo:
            began = time.perf_counter()
            with warnings.catch_warnings():  # truncation was reported once, by rectify
                warnings.filterwarnings("ignore", message=".*were truncated")
                fresh = model.explain(
                    [part[k].text for k in todo],
                    method,
                    None,
                    text_pair=[pairs[k] for k in todo] if pairs_or_none is not None else None,
                    batch_size=batch_size,
                    max_length=result.max_length,
                    **options,
                )
            wall = time.perf_counter() - began
            seconds += wall
            for k, expl in zip(todo, fresh, strict=True):
                found[part[k].id] = expl
            if store is not None:
                from heedful.engine.memory import peak_rss_mb

                store.record_explained(key, [(part[k].id, found[part[k].id]) for k in todo], wall, peak_rss_mb())
        scores = scores_tensor([found[e.id] for e in part], batch)
        got, gone = predict_suppressed(model, batch, scores, result.ratios, result.removal)
        predictions[start : start + len(part)] = got
        erased[start : start + len(part)] = gone
        explained.advance(len(part))
    gold, before = result.gold[:, None], result.predicted[:, None]
    return MethodGain(
        method=method,
        options=options,
        predictions=predictions,
        fixed=(predictions == gold).sum(axis=0),
        changed=(predictions != before).sum(axis=0),
        erased=erased.mean(axis=0) if rows else np.zeros(len(result.ratios)),
        seconds=seconds / (rows - reused) if rows > reused else _stored_seconds(store, key),
        from_store=reused,
    )


def _stored_seconds(store, key) -> float:
    """Seconds per explanation recorded in the store for ``key`` (0 when there is no record)."""
    cost = store.cost(key) if store is not None else None
    return cost["seconds"] / cost["examples"] if cost and cost["examples"] else 0.0


def _label(model: Model, result: Rectification, start: int, part, ident: str) -> str:
    """The label an explanation of error ``ident`` must explain: the model's (wrong) prediction."""
    k = start + [e.id for e in part].index(ident)
    return model.adapter.output_name(int(result.predicted[k]))


# ----------------------------------------------------------------------------- output
def rows(result: Rectification) -> list[dict[str, Any]]:
    """One row per method and ratio: fixed errors, shares and accuracies (for CSV / tables)."""
    found = []
    for name, gain in result.methods.items():
        err, acc, whole = result.error_gain(name), result.accuracy_after(name), result.whole_gain(name)
        for r, ratio in enumerate(result.ratios):
            found.append(
                {
                    "method": name,
                    "ratio": ratio,
                    "errors": result.n_errors,
                    "fixed": int(gain.fixed[r]),
                    "changed": int(gain.changed[r]),
                    "error_gain": float(err[r]),
                    "accuracy_before": result.accuracy_before,
                    "accuracy_after": float(acc[r]),
                    "whole_gain": float(whole[r]),
                    "erased_tokens": float(gain.erased[r]),
                    "seconds_per_error": gain.seconds,
                }
            )
    return found


def write_csv(result: Rectification, path: str | Path) -> Path:
    """The :func:`rows` of ``result`` as CSV."""
    import csv

    path = Path(path)
    table = rows(result)
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(table[0]) if table else ["method"])
        writer.writeheader()
        writer.writerows(table)
    return path


def plot_sweep(result: Rectification, path: str | Path, title: str | None = None) -> Path:
    """The paper's Figure 8 for every method: (a) share of the errors fixed and (b) accuracy
    gain on the whole split (only errors modified), against the erasure ratio."""
    from heedful.render.figures import pyplot

    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    x = np.asarray(result.ratios)
    markers = "osD^vP*Xph"
    for k, name in enumerate(result.methods):
        style = {"color": "grey", "linestyle": "--", "marker": "."} if name == "random" else {"marker": markers[k % len(markers)]}
        left.plot(x, 100 * result.error_gain(name), label=name, alpha=0.85, **style)
        right.plot(x, 100 * result.whole_gain(name), label=name, alpha=0.85, **style)
    left.set_ylabel(f"errors fixed (% of {result.n_errors})")
    left.set_title("(a) gain on the error set")
    right.set_ylabel("accuracy gain (points)")
    right.set_title(f"(b) gain on the whole split (n={result.n_total}; only errors modified)", fontsize=9)
    for ax in (left, right):
        ax.set_xlabel("erasure ratio r (share of tokens suppressed)")
        ax.grid(alpha=0.3)
    right.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    from heedful.evaluate.report import short_model

    fig.suptitle(title or f"rectifying {short_model(result.model)}'s errors on {result.dataset} ({result.split})", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return path
