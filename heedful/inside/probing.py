"""Linear probes on every layer: what a layer encodes, and how much of that is the probe's doing.

:func:`probe` trains, per layer, a linear probe (scikit-learn: standardised features, then
multinomial logistic regression, L2 with ``C``) to predict a property of tokens, spans, edges or
whole inputs (:mod:`heedful.inside.properties`) from the layer's pooled representation
(:mod:`heedful.inside.representations`), on a train split of the *texts* (no text is in both
splits), and reports on the test split:

* **accuracy**, beside the majority-class accuracy;
* **control accuracy and selectivity** (Hewitt & Liang 2019, *Designing and Interpreting Probes
  with Control Tasks*): every word type gets a fixed random label drawn from the property's
  empirical label distribution; the same probe on the same features learns it only by
  memorising types. ``selectivity = accuracy - control accuracy``: high when the layer, not the
  probe, carries the property;
* **MDL online codelength** (Voita & Titov 2020, *Information-Theoretic Probing with Minimum
  Description Length*, Sec. 3.2): the training items, shuffled, cut at the fractions
  0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.25, 12.5, 25, 50, 100 % (their Sec. 3.2); the first block is sent with
  the uniform code (``t_1 log2 K``), each next block with the probe trained on all blocks before
  it: ``codelength = t_1 log2 K - sum_i sum_{n in block i+1} log2 p_i(y_n | x_n)`` bits;
  ``compression = n log2 K / codelength``. A class a block's probe has not seen yet gets
  probability ``1e-6`` (the multinomial probe of the paper has every class from the start);
* **the expected layer** (Tenney et al. 2019, *BERT Rediscovers the Classical NLP Pipeline*,
  Eq. 4): cumulative probes ``P^(l)`` on a learned scalar mix of layers ``0..l``
  (``gamma * sum_j softmax(s)_j h_j``, Eq. 1, then a linear softmax classifier), their test
  accuracies' differentials ``Delta^(l) = Score(P^(l)) - Score(P^(l-1))`` and
  ``E_Delta[l] = sum_l l Delta^(l) / sum_l Delta^(l)``; plus the full mix's centre of gravity
  ``sum_l l softmax(s)_l`` (Eq. 2).

Amnesic probing is :func:`heedful.inside.amnesic.amnesic`.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from heedful.datasets import Dataset
from heedful.errors import InputError
from heedful.inside.properties import property_items
from heedful.inside.representations import Item, check_layers, span_features
from heedful.progress import task

MDL_FRACTIONS = (0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.0625, 0.125, 0.25, 0.5, 1.0)
"""Voita & Titov (2020)'s block boundaries, as fractions of the training items."""

UNSEEN_PROBABILITY = 1e-6


def linear_probe(C: float = 1.0, seed: int = 0, max_iter: int = 1000):
    """The probe: ``StandardScaler`` then ``LogisticRegression`` (lbfgs, multinomial, L2 with ``C``)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(StandardScaler(), LogisticRegression(C=C, max_iter=max_iter, random_state=seed))


def fit(X: np.ndarray, y: np.ndarray, C: float = 1.0, seed: int = 0):
    """:func:`linear_probe` fitted on ``X`` ``[n, D]``, ``y`` ``[n]`` (convergence warnings muted:
    the test accuracy, not the optimiser's last digits, is what is reported)."""
    with quiet_fit():
        return linear_probe(C, seed).fit(X, y)


@contextlib.contextmanager
def quiet_fit() -> Iterator[None]:
    """scikit-learn fits with convergence warnings muted and BLAS on one thread: a probe's
    matrices are small, and BLAS threads spinning on a shared machine made one fit 30x slower."""
    from sklearn.exceptions import ConvergenceWarning
    from threadpoolctl import threadpool_limits

    with warnings.catch_warnings(), threadpool_limits(limits=1, user_api="blas"):
        warnings.simplefilter("ignore", ConvergenceWarning)
        yield


def split_examples(count: int, test_fraction: float, seed: int) -> np.ndarray:
    """``[count]`` bool, ``True`` for the texts of the test split (a seeded permutation; at
    least one text on each side)."""
    if count < 2:
        raise InputError("probing needs at least 2 texts (a train and a test split)", hint="use more texts")
    test = np.zeros(count, dtype=bool)
    size = min(max(1, round(count * test_fraction)), count - 1)
    test[np.random.default_rng(seed).permutation(count)[:size]] = True
    return test


def control_labels(words: Sequence[str], labels: np.ndarray, seed: int) -> np.ndarray:
    """Hewitt & Liang's control task: each word type's one random label, drawn from the
    empirical distribution of ``labels`` (types in first-seen order, so the draw is seeded)."""
    values, counts = np.unique(labels, return_counts=True)
    types = list(dict.fromkeys(words))
    drawn = np.random.default_rng([seed, 1]).choice(values, size=len(types), p=counts / counts.sum())
    chosen = dict(zip(types, drawn, strict=True))
    return np.asarray([chosen[w] for w in words])


def online_codelength(X: np.ndarray, y: np.ndarray, classes: int, C: float = 1.0, seed: int = 0) -> float:
    """Voita & Titov's online codelength of ``y`` given ``X`` in bits (module docstring)."""
    order = np.random.default_rng([seed, 2]).permutation(len(y))
    X, y = X[order], y[order]
    cuts = sorted({max(1, int(round(f * len(y)))) for f in MDL_FRACTIONS} | {len(y)})
    bits = cuts[0] * math.log2(classes)
    for start, stop in zip(cuts[:-1], cuts[1:], strict=True):
        known = np.unique(y[:start])
        if len(known) < 2:  # one class seen so far: the probe says it with certainty
            prob = np.where(y[start:stop] == known[0], 1.0 - UNSEEN_PROBABILITY, UNSEEN_PROBABILITY)
        else:
            model = fit(X[:start], y[:start], C, seed)
            proba = model.predict_proba(X[start:stop])
            column = {c: i for i, c in enumerate(model.classes_)}
            prob = np.asarray([proba[n, column[v]] if v in column else 0.0 for n, v in enumerate(y[start:stop])])
        bits -= np.log2(np.clip(prob, UNSEEN_PROBABILITY, 1.0)).sum()
    return float(bits)


@dataclass
class LayerScore:
    """One layer's probe: test ``accuracy``, ``control_accuracy`` and ``selectivity``; MDL
    ``codelength`` (bits) and ``compression`` (``None`` when not asked for)."""

    layer: int
    accuracy: float
    control_accuracy: float | None = None
    selectivity: float | None = None
    codelength: float | None = None
    compression: float | None = None


@dataclass
class ProbeResult:
    """Per-layer probe scores of one property; ``test_examples``: the texts of the test split."""

    property: str
    model: str
    pooling: str
    labels: list[str]
    train_items: int
    test_items: int
    majority: float
    scores: list[LayerScore]
    cumulative: list[float] | None = None
    expected_layer: float | None = None
    mix_center: float | None = None
    test_examples: list[int] = field(default_factory=list)
    dropped: int = 0
    per_item: dict[str, list] | None = None
    """With ``probe(..., per_item=True)``: the test items' text index (``text``) and, per layer,
    whether each test item was predicted right by the probe (``hits`` ``[Ls][n]``), the control
    probe (``control_hits``) and the cumulative scalar-mix probe (``cumulative_hits``): what a
    bootstrap over texts resamples."""

    def best(self) -> LayerScore:
        return max(self.scores, key=lambda s: s.accuracy)

    def to_dict(self) -> dict:
        return asdict(self)

    def plot(self, path: str | Path) -> Path:
        """Accuracy, control accuracy and selectivity per layer (and the MDL compression when
        measured, on a second axis), the expected layer marked; written as PNG / SVG / PDF."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        layers = [s.layer for s in self.scores]
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot(layers, [s.accuracy for s in self.scores], "o-", label="accuracy")
        if self.scores[0].control_accuracy is not None:
            ax.plot(layers, [s.control_accuracy for s in self.scores], "s--", label="control accuracy")
            ax.plot(layers, [s.selectivity for s in self.scores], "^-", label="selectivity")
        ax.axhline(self.majority, color="grey", lw=0.8, ls=":", label="majority class")
        if self.expected_layer is not None:
            ax.axvline(self.expected_layer, color="purple", lw=1, label=f"expected layer {self.expected_layer:.2f}")
        ax.set_xlabel("layer (0 = embeddings)")
        ax.set_ylabel("test accuracy")
        ax.set_title(f"{self.property} probes of {self.model}")
        if self.scores[0].compression is not None:
            other = ax.twinx()
            other.plot(layers, [s.compression for s in self.scores], "d:", color="tab:red", label="MDL compression")
            other.set_ylabel("compression (uniform / online bits)")
            other.legend(loc="lower right", fontsize=8)
        ax.legend(loc="best", fontsize=8)
        fig.tight_layout()
        path = Path(path)
        fig.savefig(path)
        plt.close(fig)
        return path


def probe(
    model,
    dataset: Dataset,
    property: str,
    layers: Sequence[int] | str | None = "all",
    *,
    pooling: str = "mean",
    control: bool = True,
    mdl: bool = False,
    expected_layer: bool = True,
    test_fraction: float = 0.2,
    C: float = 1.0,
    seed: int = 0,
    batch_size: int = 16,
    per_item: bool = False,
) -> ProbeResult:
    """Probe ``property`` (``pos``, ``dep``, ``entity``, ``number`` or ``label``) of ``dataset``
    in ``layers`` of ``model`` (``"all"``: 0 = embeddings to L) -- see the module docstring.

    >>> model = heedful.load("minilm-sentiment")                                    # doctest: +SKIP
    >>> result = heedful.probe(model, heedful.datasets.load("movies", n=200), "pos")  # doctest: +SKIP
    >>> result.best().layer, result.expected_layer                                  # doctest: +SKIP
    """
    chosen = check_layers(model, layers)
    if not 0 < test_fraction < 1:
        raise InputError(f"test_fraction must be between 0 and 1, not {test_fraction}", hint="e.g. test_fraction=0.2")
    texts, items = property_items(dataset, property)
    feats, kept = span_features(model, texts, items, chosen, pooling=pooling, batch_size=batch_size)
    items = [item for item, k in zip(items, kept, strict=True) if k]
    feats = feats[:, kept]
    test_text = split_examples(len(texts), test_fraction, seed)
    test = np.asarray([test_text[item.example] for item in items])
    y = np.asarray([item.label for item in items])
    if len(np.unique(y[~test])) < 2:
        raise InputError(f"the training items have one {property} label only", hint="use more texts")
    controls = control_labels([item.word for item in items], y, seed) if control else None
    labels, counts = np.unique(y[test], return_counts=True)
    scores, hits, control_hits = [], [], []
    with task(f"probing {property}", len(chosen)) as progress:
        for i, layer in enumerate(chosen):
            X = feats[i]
            hits.append(fit(X[~test], y[~test], C, seed).predict(X[test]) == y[test])
            acc = float(hits[-1].mean())
            score = LayerScore(layer, acc)
            if controls is not None:
                control_hits.append(fit(X[~test], controls[~test], C, seed).predict(X[test]) == controls[test])
                score.control_accuracy = float(control_hits[-1].mean())
                score.selectivity = acc - score.control_accuracy
            if mdl:
                classes = len(np.unique(y))
                score.codelength = online_codelength(X[~test], y[~test], classes, C, seed)
                score.compression = int((~test).sum()) * math.log2(classes) / score.codelength
            scores.append(score)
            progress.advance()
    result = ProbeResult(
        property=property,
        model=getattr(model, "name", type(model).__name__),
        pooling=pooling,
        labels=sorted(np.unique(y).tolist()),
        train_items=int((~test).sum()),
        test_items=int(test.sum()),
        majority=float(counts.max() / counts.sum()),
        scores=scores,
        test_examples=np.flatnonzero(test_text).tolist(),
        dropped=int((~kept).sum()),
    )
    cumulative: np.ndarray | None = None
    if expected_layer and len(chosen) > 1:
        cumulative, result.mix_center = cumulative_hits(feats, y, test, C, seed)
        result.cumulative = cumulative.mean(axis=1).tolist()
        result.expected_layer = expected_from(chosen, result.cumulative)
    if per_item:
        result.per_item = {
            "text": [item.example for item, t in zip(items, test, strict=True) if t],
            "hits": np.asarray(hits).tolist(),
            "control_hits": np.asarray(control_hits).tolist() if control_hits else None,
            "cumulative_hits": None if cumulative is None else cumulative.tolist(),
        }
    return result


def expected_from(layers: Sequence[int], cumulative: Sequence[float]) -> float | None:
    """Tenney et al.'s Eq. 4: ``sum_l l Delta^(l) / sum_l Delta^(l)`` over ``l >= 1`` (``None``
    when the differentials sum to zero)."""
    deltas = np.diff(np.asarray(cumulative, dtype=float))
    total = deltas.sum()
    if abs(total) < 1e-12:
        return None
    return float((np.asarray(layers[1:], dtype=float) * deltas).sum() / total)


def cumulative_hits(
    feats: np.ndarray, y: np.ndarray, test: np.ndarray, C: float = 1.0, seed: int = 0, steps: int = 100
) -> tuple[np.ndarray, float]:
    """``[Ls, n_test]`` bool: whether the scalar-mix probe on layers ``0..l`` (``feats``
    ``[Ls, n, D]``) predicts each test item right, for every ``l``; and the full mix's centre of
    gravity over the layer indices ``0..Ls-1`` (Tenney et al. 2019, Eqs. 1, 2, 4). Each layer is standardised with its training statistics;
    the mix, its scale and a linear softmax classifier are fitted together by L-BFGS on the mean
    cross-entropy plus ``|W|^2 / (2 C n)`` (scikit-learn's objective divided by ``C n``)."""
    classes, codes = np.unique(y, return_inverse=True)
    X = torch.from_numpy(feats).float()
    mean, std = X[:, ~test].mean(dim=1, keepdim=True), X[:, ~test].std(dim=1, keepdim=True).clamp_min(1e-6)
    X = (X - mean) / std
    target = torch.from_numpy(codes)
    train, held = torch.from_numpy(~test), torch.from_numpy(test)
    scores, center = [], 0.0
    with task("cumulative probes", X.shape[0]) as progress:
        for last in range(X.shape[0]):
            torch.manual_seed(seed)
            weights, logits = _scalar_mix_probe(X[: last + 1], target, train, len(classes), C, steps)
            scores.append((logits[held].argmax(dim=1) == target[held]).numpy())
            center = float((weights * torch.arange(last + 1, dtype=weights.dtype)).sum())
            progress.advance()
    return np.stack(scores), center


def _scalar_mix_probe(
    X: torch.Tensor, target: torch.Tensor, train: torch.Tensor, classes: int, C: float, steps: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fit ``softmax(W (gamma sum_j softmax(s)_j X_j) + b)`` on the ``train`` items of ``X``
    ``[l, n, D]``; -> (mix weights ``[l]``, logits of every item ``[n, K]``)."""
    s = torch.zeros(X.shape[0], requires_grad=True)
    gamma = torch.ones(1, requires_grad=True)
    W = torch.zeros(X.shape[2], classes, requires_grad=True)
    b = torch.zeros(classes, requires_grad=True)
    optimiser = torch.optim.LBFGS([s, gamma, W, b], max_iter=steps, line_search_fn="strong_wolfe")
    n = int(train.sum())

    def logits_of(rows: torch.Tensor | slice) -> torch.Tensor:
        mixed = gamma * torch.einsum("l,lnd->nd", torch.softmax(s, 0), X[:, rows])
        return mixed @ W + b

    def closure():
        optimiser.zero_grad()
        loss = torch.nn.functional.cross_entropy(logits_of(train), target[train]) + (W**2).sum() / (2 * C * n)
        loss.backward()
        return loss

    with torch.enable_grad():
        optimiser.step(closure)
    with torch.no_grad():
        return torch.softmax(s, 0), logits_of(slice(None))


def probe_items(model, texts: Sequence[str], items: Sequence[Item], layer: int, pooling: str = "mean", batch_size: int = 16):
    """``(X [n, D], y [n], kept items)``: one layer's features of ``items`` (for amnesic probing)."""
    feats, kept = span_features(model, texts, items, [layer], pooling=pooling, batch_size=batch_size)
    items = [item for item, k in zip(items, kept, strict=True) if k]
    return feats[0, kept], np.asarray([item.label for item in items]), items
