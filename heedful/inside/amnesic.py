"""Amnesic probing: remove a property from a layer and see what the model's own task loses.

Iterative nullspace projection (INLP; Ravfogel et al. 2020, *Null It Out*, Algorithm 1):
train a linear classifier ``W`` ``[K, D]`` for the property on the (projected) representations,
add its rows to the removed directions, project every representation onto the nullspace of all
directions removed so far (``P = I - Q Q^T``, ``Q`` an orthonormal basis of the stacked ``W``
rows), and repeat until a fresh classifier is at the majority-class accuracy on held-out items
(or ``iterations`` are done). The defining property, checked by the tests: after projection a
new linear probe does no better than the majority class.

Amnesic probing (Elazar et al. 2021, *Amnesic Probing: Behavioral Explanation with Amnesic
Counterfactuals*): replace the layer's residual stream, at every position, by its projection
``h P`` during the forward pass and report the model's own task before and after --
classification: accuracy against the dataset's labels (or, without labels, agreement with its
own unprojected predictions); causal LM: next-token accuracy on the texts -- beside the same
measurement after removing as many *random* directions (their control: what removing that many
dimensions costs anyway).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch

from heedful.datasets import Dataset
from heedful.errors import InputError, UnsupportedModelError
from heedful.inside.probing import probe_items, quiet_fit, split_examples
from heedful.inside.properties import property_items
from heedful.inside.representations import check_layers
from heedful.progress import task

MAJORITY_MARGIN = 0.01
"""INLP stops once a fresh classifier's held-out accuracy is within this of the majority class."""


def _classifier(seed: int):
    from sklearn.linear_model import LogisticRegression

    return LogisticRegression(max_iter=1000, random_state=seed)


def _fit(X: np.ndarray, y: np.ndarray, seed: int):
    with quiet_fit():
        return _classifier(seed).fit(X, y)


def majority(y: np.ndarray) -> float:
    _, counts = np.unique(y, return_counts=True)
    return float(counts.max() / counts.sum())


def nullspace_projection(directions: np.ndarray, width: int) -> np.ndarray:
    """``I - Q Q^T`` ``[D, D]``: the projection onto the nullspace of ``directions`` ``[r, D]``
    (``Q`` their orthonormal basis; directions within float tolerance of others add nothing)."""
    if directions.size == 0:
        return np.eye(width)
    u, s, vt = np.linalg.svd(directions, full_matrices=False)
    basis = vt[s > s.max() * width * np.finfo(directions.dtype).eps]
    return np.eye(width) - basis.T @ basis


@dataclass
class INLP:
    """The projection ``P`` ``[D, D]`` (apply as ``h @ P``), the number of directions removed
    (``rank``), the classifiers' held-out accuracy at each iteration (the first: before any
    removal) and the majority-class accuracy."""

    projection: np.ndarray
    rank: int
    accuracies: list[float]
    majority: float


def inlp(
    X: np.ndarray, y: np.ndarray, held: np.ndarray, iterations: int = 20, seed: int = 0
) -> INLP:
    """Iterative nullspace projection of ``y``'s linear information out of ``X`` ``[n, D]``;
    classifiers are trained on ``~held`` and scored on ``held`` items (module docstring)."""
    if len(np.unique(y[~held])) < 2:
        raise InputError("the property has one label only in the training items", hint="use more texts")
    width = X.shape[1]
    directions = np.zeros((0, width))
    projection = np.eye(width)
    floor = majority(y[held])
    accuracies = []
    with task("INLP", iterations) as progress:
        for _ in range(iterations):
            Xp = X @ projection
            clf = _fit(Xp[~held], y[~held], seed)
            accuracies.append(float(clf.score(Xp[held], y[held])))
            if accuracies[-1] <= floor + MAJORITY_MARGIN:
                break
            directions = np.vstack([directions, clf.coef_])
            projection = nullspace_projection(directions, width)
            progress.advance()
        else:
            Xp = X @ projection
            accuracies.append(float(_fit(Xp[~held], y[~held], seed).score(Xp[held], y[held])))
    rank = width - int(round(np.trace(projection)))
    return INLP(projection, rank, accuracies, floor)


def random_projection(width: int, rank: int, seed: int) -> np.ndarray:
    """The projection removing ``rank`` random orthonormal directions (Elazar et al.'s control)."""
    return nullspace_projection(np.random.default_rng([seed, 3]).standard_normal((rank, width)), width)


@dataclass
class AmnesicResult:
    """Amnesic probing of ``property`` at ``layer``: the probe's held-out accuracy before and
    after INLP (``majority``: its floor), the ``rank`` removed, and the model's task score
    (``task``: what it measures) unchanged, after INLP and after the random control."""

    property: str
    layer: int
    rank: int
    probe_before: float
    probe_after: float
    majority: float
    task: str
    task_before: float
    task_amnesic: float
    task_random: float

    @property
    def change(self) -> float:
        return self.task_amnesic - self.task_before

    def to_dict(self) -> dict:
        return {**asdict(self), "change": self.change}


def amnesic(
    model,
    dataset: Dataset,
    property: str,
    layer: int,
    *,
    iterations: int = 20,
    pooling: str = "mean",
    test_fraction: float = 0.2,
    seed: int = 0,
    batch_size: int = 16,
) -> AmnesicResult:
    """Remove ``property`` from ``layer`` (0 = embeddings .. L) by INLP and report the change in
    the model's own task on ``dataset``'s texts (module docstring)."""
    (layer,) = check_layers(model, [layer])
    texts, items = property_items(dataset, property)
    X, y, items = probe_items(model, texts, items, layer, pooling, batch_size)
    held = split_examples(len(texts), test_fraction, seed)[[item.example for item in items]]
    found = inlp(X, y, held, iterations, seed)
    name, score = task_score(model, dataset, batch_size)
    before = score(None, layer)
    after = score(found.projection, layer)
    control = score(random_projection(X.shape[1], found.rank, seed), layer)
    return AmnesicResult(
        property, layer, found.rank, found.accuracies[0], found.accuracies[-1], found.majority, name, before, after, control
    )


def projected(hooks, layer: int, projection: torch.Tensor) -> None:
    """Within an open interception: layer ``layer``'s residual stream becomes ``h @ projection``."""
    if layer == 0:
        hooks.replace("block_in", lambda h: h @ projection, [0])
    else:
        hooks.replace("block_out", lambda h: h @ projection, [layer - 1])


def task_score(model, dataset: Dataset, batch_size: int = 16):
    """``(what, score(projection, layer))``: the model's own task on ``dataset``'s texts with
    ``layer``'s stream projected (``None``: untouched)."""
    adapter = model.adapter
    texts = [example.text for example in dataset]
    if adapter.task == "classification":
        gold = _gold(model, dataset)
        plain = None if gold is not None else _predictions(model, texts, None, 0, batch_size)
        what = "label accuracy" if gold is not None else "agreement with the unprojected predictions"

        def score(projection, layer):
            found = _predictions(model, texts, projection, layer, batch_size)
            return float((found == (gold if gold is not None else plain)).mean())

        return what, score
    if adapter.task == "causal_lm":
        return "next-token accuracy", lambda projection, layer: _next_token_accuracy(model, texts, projection, layer, batch_size)
    raise UnsupportedModelError(
        f"amnesic probing measures a classifier's or a causal LM's task, not a {adapter.task} model's",
        hint="probe a classification model or a causal LM",
    )


def _gold(model, dataset: Dataset) -> np.ndarray | None:
    try:
        return np.asarray([model.adapter.output_index(example.label) for example in dataset])
    except (InputError, TypeError, ValueError):
        return None


def _forward(model, texts: Sequence[str], projection: np.ndarray | None, layer: int, anchors, batch_size: int):
    adapter = model.adapter
    matrix = None if projection is None else torch.as_tensor(projection, dtype=adapter.word_embeddings.weight.dtype, device=adapter.device)
    for start in range(0, len(texts), batch_size):
        batch = model.encode(texts[start : start + batch_size])
        with torch.no_grad(), adapter.intercept() as hooks:
            if matrix is not None:
                projected(hooks, layer, matrix)
            yield batch, adapter.forward(batch, anchors(batch)).logits


def _predictions(model, texts, projection, layer, batch_size) -> np.ndarray:
    found = [
        logits.argmax(dim=-1).cpu().numpy()
        for _, logits in _forward(model, texts, projection, layer, lambda b: model.adapter.anchor_positions(b)[0], batch_size)
    ]
    return np.concatenate(found)


def _next_token_accuracy(model, texts, projection, layer, batch_size) -> float:
    hits = total = 0
    for batch, logits in _forward(model, texts, projection, layer, _every_position, batch_size):
        predicted = logits[:, :-1].argmax(dim=-1).cpu()
        real = batch.attention_mask[:, 1:].bool()
        hits += int(((predicted == batch.input_ids[:, 1:]) & real).sum())
        total += int(real.sum())
    return hits / max(total, 1)


def _every_position(batch) -> torch.Tensor:
    return torch.arange(batch.seq_len).expand(len(batch), -1)
