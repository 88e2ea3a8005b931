"""Inference-time intervention (Li et al. 2023, *Inference-Time Intervention: Eliciting Truthful
Answers from a Language Model*): linear probes choose attention heads that separate two labelled
sets of texts, and generation shifts those heads' outputs along the sets' direction.

``x_l^h`` ``[d]`` is head ``h`` of block ``l``'s output at a text's last token: its slice of the
merged heads entering the attention output projection ``Q_l`` (role ``context``, before
``o_proj``; :mod:`heedful.adapters.roles`). With ``y = 1`` for the positive texts, ``0`` for the
negative ones:

1. **Probes** (Sec. 3.1): per head a linear probe ``p(y = 1 | x) = sigmoid(<theta, x>)`` --
   heedful's probe, standardised features then logistic regression
   (:func:`heedful.inside.probing.fit`) -- trained on a seeded train split of the texts; its
   accuracy on the validation split (``validation`` of them, the paper's 4:1) ranks the heads.
2. **Heads**: the ``K`` heads of highest validation accuracy (ties: the lower layer, then the
   lower head, first).
3. **Directions** ``theta_l^h``, unit vectors (Sec. 3.2): ``"mass_mean"`` (the paper's choice,
   its best) ``mean(x | y = 1) - mean(x | y = 0)`` over all texts; ``"probe"`` the probe's
   weight vector in activation space (the logistic coefficients divided by the standardisation's
   scales: the normal of its decision boundary).
4. ``sigma_l^h``: the standard deviation of the activations along the direction,
   ``std_i <theta_l^h, x_l^h(i)>`` over all texts (population standard deviation, as the
   authors' code).
5. **Intervention** (Eq. 2): ``x_{l+1} = x_l + sum_h Q_l^h (Att_l^h(P_l^h x_l) + alpha sigma_l^h
   theta_l^h)`` -- each chosen head's output is shifted by ``alpha * sigma * theta`` before the
   output projection, the other heads untouched, at every position of every forward pass inside
   :meth:`HeadIntervention.applied` (the prompt's and each generated token's, as CAA's vector in
   :mod:`heedful.inside.steering`). ``alpha`` is the steering coefficient; the paper's
   LLaMA-7B setting is ``K = 48`` of 1024 heads, ``alpha = 15``; on smollm2-135m (270 heads)
   toward positive movie snippets, ``K = 16`` and ``alpha`` 5 to 10 steer best (the sweep).

    found = iti(lm, positive_texts, negative_texts, heads=16)
    found.generate(lm, "The movie was", 5.0)        # or the sweep: heedful.inside.sweep
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from heedful.errors import InputError
from heedful.inside.patching import require_roles
from heedful.inside.probing import fit, quiet_fit, split_examples
from heedful.inside.steering import Steerer, _adder, check_layer, states
from heedful.progress import task

DIRECTIONS = ("mass_mean", "probe")
"""How a head's direction is found: the mass-mean shift (the paper's default) or the probe's weights."""


@dataclass
class HeadIntervention(Steerer):
    """Heads chosen by their probes and their shifts (module docstring).

    ``heads``: the ``K`` chosen ``(layer, head)`` pairs, best first; ``directions`` ``[K, d]``
    unit vectors; ``sigmas`` ``[K]``; ``accuracy`` ``[L, H]`` every head's probe's validation
    accuracy; ``validation`` ``[T]`` which texts (positives first, then negatives) were
    held out; ``num_heads`` ``H``."""

    heads: list[tuple[int, int]]
    directions: torch.Tensor
    sigmas: torch.Tensor
    accuracy: torch.Tensor
    validation: np.ndarray
    num_heads: int
    direction: str = "mass_mean"
    kind: str = "iti"
    meta: dict = field(default_factory=dict)

    @property
    def head_dim(self) -> int:
        return self.directions.shape[1]

    @property
    def head_accuracy(self) -> torch.Tensor:
        """``[K]``: the chosen heads' probes' validation accuracies."""
        layers, heads = zip(*self.heads, strict=True)
        return self.accuracy[list(layers), list(heads)]

    @property
    def layer(self) -> None:
        """Several blocks: see :attr:`layers`."""
        return None

    @property
    def layers(self) -> list[int]:
        """The blocks that have a chosen head, in order."""
        return sorted({layer for layer, _ in self.heads})

    @property
    def where(self) -> str:
        return f"{len(self.heads)} heads of blocks {', '.join(map(str, self.layers))}"

    def shifts(self) -> dict[int, torch.Tensor]:
        """Per block with a chosen head, ``sigma * theta`` of its chosen heads at their slices of
        the merged heads, ``[H * d]`` (zero elsewhere)."""
        found: dict[int, torch.Tensor] = {}
        for (layer, head), theta, sigma in zip(self.heads, self.directions, self.sigmas, strict=True):
            shift = found.setdefault(layer, torch.zeros(self.num_heads, self.head_dim))
            shift[head] += sigma * theta
        return {layer: shift.flatten() for layer, shift in found.items()}

    @contextlib.contextmanager
    def applied(self, model, coefficient: float = 1.0) -> Iterator[None]:
        """Inside the block every forward pass of ``model`` adds ``coefficient * sigma * theta``
        to each chosen head's output, at every position, before the output projection."""
        adapter = model.adapter
        dtype = adapter.word_embeddings.weight.dtype
        with adapter.intercept() as hooks:
            for layer, shift in self.shifts().items():
                moved = (coefficient * shift).to(device=adapter.device, dtype=dtype)
                hooks.replace("context", _adder(moved, None), [layer])
            yield


def head_states(model, texts: Sequence[str], batch_size: int = 16) -> torch.Tensor:
    """``[T, L, H, d]`` float32: every head's output at each text's last token."""
    heads = require_roles(model.adapter, "head")
    found = states(model, texts, "context", range(model.adapter.num_layers), "last", batch_size, "reading head outputs")
    return found.unflatten(-1, (heads, -1))


def probe_heads(X: np.ndarray, y: np.ndarray, validation: np.ndarray, seed: int = 0) -> tuple[np.ndarray, list]:
    """Every head's probe (:func:`heedful.inside.probing.fit`) on the texts not in
    ``validation``: ``X`` ``[T, L, H, d]``, ``y`` ``[T]`` -> validation accuracies ``[L, H]`` and
    the fitted probes, layer-major."""
    _, layers, heads, _ = X.shape
    train = ~validation
    accuracy, probes = np.zeros((layers, heads)), []
    with task("training head probes", layers * heads) as progress, quiet_fit():
        for layer in range(layers):
            for head in range(heads):
                found = fit(X[train, layer, head], y[train], seed=seed)
                accuracy[layer, head] = found.score(X[validation, layer, head], y[validation])
                probes.append(found)
                progress.advance()
    return accuracy, probes


def top_heads(accuracy: np.ndarray, k: int) -> list[tuple[int, int]]:
    """The ``k`` ``(layer, head)`` pairs of highest accuracy ``[L, H]`` (ties: lower layer, then
    lower head, first)."""
    order = np.argsort(-accuracy, axis=None, kind="stable")[:k]
    return [(int(i) // accuracy.shape[1], int(i) % accuracy.shape[1]) for i in order]


def iti(
    model,
    positive: Sequence[str],
    negative: Sequence[str],
    *,
    heads: int = 16,
    direction: str = "mass_mean",
    validation: float = 0.2,
    seed: int = 0,
    batch_size: int = 16,
) -> HeadIntervention:
    """Inference-time intervention learnt from ``positive`` and ``negative`` texts (module
    docstring): ``heads`` is ``K``; ``direction`` one of :data:`DIRECTIONS`; ``validation`` the
    share of the texts the probes are scored on (a seeded split)."""
    check_layer(model, 0)  # a language model, in one line otherwise
    if direction not in DIRECTIONS:
        raise InputError(f"unknown direction {direction!r}", hint=f"one of {', '.join(DIRECTIONS)}")
    if len(positive) < 2 or len(negative) < 2:
        raise InputError(
            f"inference-time intervention needs at least 2 texts of each set, got {len(positive)} positive and {len(negative)} negative",
            hint="give more labelled texts",
        )
    if not 0 < validation < 1:
        raise InputError(f"validation must be a share between 0 and 1, got {validation}", hint="the paper holds out 0.2")
    texts = [*positive, *negative]
    y = np.asarray([1] * len(positive) + [0] * len(negative))
    X = head_states(model, texts, batch_size)
    layers, count = X.shape[1], X.shape[2]
    if not 1 <= heads <= layers * count:
        raise InputError(f"{heads} heads asked; the model has {layers * count}", hint=f"a number of heads between 1 and {layers * count}")
    held = split_examples(len(texts), validation, seed)
    if len(np.unique(y[~held])) < 2 or len(np.unique(y[held])) < 2:
        raise InputError("the split left one set out of the train or validation texts", hint="give more texts of each set, or another seed")
    Xn = X.numpy().astype(np.float64)
    accuracy, probes = probe_heads(Xn, y, held, seed)
    chosen = top_heads(accuracy, heads)
    thetas = []
    for layer, head in chosen:
        if direction == "mass_mean":
            theta = Xn[y == 1, layer, head].mean(0) - Xn[y == 0, layer, head].mean(0)
        else:
            pipeline = probes[layer * count + head]
            theta = pipeline[-1].coef_[0] / pipeline[0].scale_
        thetas.append(theta / np.linalg.norm(theta))
    directions = np.stack(thetas)
    sigmas = np.asarray([(Xn[:, layer, head] @ theta).std() for (layer, head), theta in zip(chosen, directions, strict=True)])
    return HeadIntervention(
        chosen, torch.from_numpy(directions).float(), torch.from_numpy(sigmas).float(), torch.from_numpy(accuracy).float(),
        held, count, direction, meta={"positive": len(positive), "negative": len(negative), "seed": seed},
    )
