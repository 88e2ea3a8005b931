"""What is being explained: a target resolved per example to one scalar output of the model.

A :class:`Target` is what the user asks for (predicted class, a label, the regression value, a
token at the ``[MASK]`` position or as the next token, or a contrast A minus B). Resolved against
a model and a batch it becomes a :class:`ResolvedTarget`: for every example the *anchor* position
whose head output is explained, the output columns, and their weights. The explained scalar is
``sum_k weights[k] * logits[b, classes[b, k]]`` -- a logit (never a probability), as the
gradient and relevance methods' papers back-propagate.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from heedful.errors import InputError

if TYPE_CHECKING:
    from heedful.adapters.base import ModelAdapter

TASKS = ("classification", "regression", "masked_lm", "causal_lm", "seq2seq_lm")
GENERATIVE = ("causal_lm", "seq2seq_lm")
"""The tasks whose output is a sequence of tokens, each predicted at the position before it (a
causal language model; an encoder–decoder's target side, :mod:`heedful.adapters.seq2seq`)."""

QUANTITIES = ("logit", "log_prob")
"""What a target's score is: the output column's logit, or its log-probability (the
log-softmax over all outputs; a span's is the sum over its tokens)."""


OUTPUTS = ("logit", "probability", "log_prob", "logit_prob")
"""What a perturbation method watches of its target (:meth:`ResolvedTarget.output`)."""


@dataclass(frozen=True)
class Target:
    """A request for what to explain.

    Examples
    --------
    >>> Target.parse(None)                 # the predicted class / next token
    Target(kind='predicted', value=None, foil=None)
    >>> Target.parse("POSITIVE").kind      # a label name (or, for language models, a token)
    'given'
    >>> Target.parse("POSITIVE vs NEGATIVE").kind
    'contrast'
    >>> Target.parse(" Paris vs London").foil    # a leading space on the first part goes to both
    ' London'
    """

    kind: str  # "predicted" | "given" | "contrast"
    value: int | str | None = None
    foil: int | str | None = None

    @classmethod
    def parse(cls, spec: Target | int | str | tuple | None) -> Target:
        """Build a target from ``None``, a class index, a label or token string, ``"A vs B"``, or ``(A, B)``."""
        if isinstance(spec, Target):
            return spec
        if spec is None:
            return cls("predicted")
        if isinstance(spec, tuple | list):
            if len(spec) != 2:
                raise InputError(
                    f"a contrastive target needs exactly two parts, got {len(spec)}",
                    hint="pass (target, foil), e.g. ('POSITIVE', 'NEGATIVE')",
                )
            return cls("contrast", _as_index_or_text(spec[0]), _as_index_or_text(spec[1]))
        if isinstance(spec, str) and " vs " in spec:
            a, b = spec.split(" vs ", 1)
            if a.startswith(" ") and not b.startswith(" "):  # " Paris vs London": both continue a text
                b = " " + b
            return cls("contrast", _as_index_or_text(a), _as_index_or_text(b))
        if isinstance(spec, bool):
            raise InputError(f"target {spec!r} is not a class, label or token")
        return cls("given", _as_index_or_text(spec))


@dataclass(frozen=True)
class Columns:
    """Explicit output columns for every example, resolved without looking at the model's
    prediction: ``indices[b]`` the columns of example ``b`` (one, or target and foil), combined
    with ``weights`` (``(1.0,)`` or ``(1.0, -1.0)``); ``labels[b]`` their names. How a stored
    explanation's target is explained again (e.g. by the faithfulness metrics)."""

    indices: tuple[tuple[int, ...], ...]
    weights: tuple[float, ...]
    labels: tuple[str, ...]
    kind: str = "given"


def _as_index_or_text(value: int | str) -> int | str:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise InputError(
            f"target {value!r} is not a class index, label or token",
            hint="give a class index (int), a label or token (str), or 'A vs B'",
        )
    return value


@dataclass
class ResolvedTarget:
    """Per-example target. ``anchor`` ``[B]``: position whose head output is explained;
    ``classes`` ``[B, K]``: output columns; ``weights`` ``[K]``: +1 (and -1 for a contrast foil).
    ``anchor_kind`` says how the anchor moves when tokens are deleted: ``"first"`` (stays 0),
    ``"last"`` (last real token) or ``"fixed"`` (shifts with deletions before it)."""

    anchor: torch.Tensor
    anchor_kind: str
    classes: torch.Tensor
    weights: torch.Tensor
    labels: list[str]
    task: str
    quantity: str = "logit"
    positions: torch.Tensor | None = None

    @property
    def read_at(self) -> torch.Tensor:
        """Where the head is read: ``[B]`` (the anchors) or, for a span, ``[B, K]`` (position
        ``k`` predicts column ``k``)."""
        return self.anchor if self.positions is None else self.positions

    @property
    def is_span(self) -> bool:
        return self.positions is not None

    def score(self, logits: torch.Tensor) -> torch.Tensor:
        """Explained scalar per example ``[B]`` from the head's logits at :attr:`read_at`:
        ``[B, C]`` at the anchors (``sum_k w_k q(logits)[classes_k]``) or ``[B, K, C]`` for a span
        (``sum_k w_k q(logits_k)[classes_k]``), where ``q`` is the identity (``quantity``
        ``"logit"``) or ``log_softmax`` (``"log_prob"``: a span's score is the log-probability of
        the whole span, ``sum_k log p(y_k | y_<k)``)."""
        values = torch.log_softmax(logits.float(), dim=-1) if self.quantity == "log_prob" else logits
        classes = self.classes.to(values.device)
        if values.dim() == 3:
            picked = values.gather(2, classes[..., None]).squeeze(2)
        else:
            picked = values.gather(1, classes)
        return (picked * self.weights.to(picked)).sum(dim=1)

    def output(self, logits: torch.Tensor, kind: str = "logit") -> torch.Tensor:
        """The explained scalar per row ``[R]`` as ``kind``: the target's own quantity
        (``"logit"``, :meth:`score`), a probability (``"probability"``: the softmax
        probability of the column(s), the joint probability of a span, the value for
        regression), the log-probability (``"log_prob"``: ``log p(A)``, or ``log p(A) - log p(B)``
        for a contrast) or ContextCite's logit-probability (``"logit_prob"``:
        ``log P - log(1 - P)`` of the joint probability ``P`` of the target's columns, each part
        of a contrast on its own)."""
        if kind == "logit" or self.task == "regression":
            return self.score(logits)
        if kind == "probability":
            if self.is_span:
                return torch.exp(replace(self, quantity="log_prob").score(logits))
            return replace(self, quantity="logit").score(torch.softmax(logits.float(), dim=-1))
        if kind == "log_prob":
            return replace(self, quantity="log_prob").score(logits)
        if kind == "logit_prob":
            weights = self.weights.to(logits.device)
            target = replace(self, weights=(weights > 0).to(weights), quantity="log_prob").score(logits)
            value = target - torch.log(-torch.expm1(target.clamp(max=-1e-7)))
            if (weights < 0).any():
                foil = replace(self, weights=(weights < 0).to(weights), quantity="log_prob").score(logits)
                value = value - (foil - torch.log(-torch.expm1(foil.clamp(max=-1e-7))))
            return value
        raise InputError(
            f"output must be one of {', '.join(OUTPUTS)}, got {kind!r}", hint="use output='logit' or 'probability'"
        )

    def repeat(self, times: int) -> ResolvedTarget:
        """Each example repeated ``times`` times in a row (``[B] -> [B * times]``)."""
        return self.select(torch.arange(len(self.labels), device=self.anchor.device).repeat_interleave(times))

    def select(self, indices: list[int] | torch.Tensor) -> ResolvedTarget:
        idx = torch.as_tensor(indices, dtype=torch.long, device=self.anchor.device)
        return replace(
            self,
            anchor=self.anchor[idx],
            classes=self.classes[idx],
            labels=[self.labels[i] for i in idx.tolist()],
            positions=None if self.positions is None else self.positions[idx],
        )

    def with_anchor(self, anchor: torch.Tensor) -> ResolvedTarget:
        """The target read at new anchors ``[B]`` (tokens were deleted before them); a span's
        positions move with its anchor."""
        positions = self.positions
        if positions is not None:
            positions = positions + (anchor - self.anchor).to(positions)[:, None]
        return replace(self, anchor=anchor, positions=positions)

    @property
    def class_indices(self) -> list[list[int]]:
        return self.classes.tolist()


def resolve_target(
    target: Target | Columns,
    adapter: ModelAdapter,
    anchor: torch.Tensor,
    anchor_kind: str,
    anchor_logits: torch.Tensor | None,
) -> ResolvedTarget:
    """Resolve ``target`` for every example given the anchor positions ``[B]`` (and how they move
    under deletion, see :meth:`~heedful.adapters.ModelAdapter.anchor_positions`) and the
    unperturbed anchor logits ``[B, C]`` (not read for :class:`Columns` or a regression model:
    ``None`` may stand for them there)."""
    bsz = anchor.shape[0]
    task = adapter.task
    if isinstance(target, Columns):
        if len(target.indices) != bsz or {len(i) for i in target.indices} != {len(target.weights)}:
            raise InputError(f"{len(target.indices)} column sets for {bsz} examples, each of {len(target.weights)} columns")
        classes = torch.tensor([list(i) for i in target.indices], dtype=torch.long)
        return ResolvedTarget(anchor, anchor_kind, classes, torch.tensor(target.weights), list(target.labels), task)
    if task == "regression":
        if target.kind == "contrast" or (
            target.kind != "predicted" and target.value not in (0, "regression", "value")
        ):
            shown = f"{target.value!r} vs {target.foil!r}" if target.kind == "contrast" else repr(target.value)
            raise InputError(
                f"target {shown} does not apply to a regression model",
                hint="a regression model has one output; leave the target unset",
            )
        classes = torch.zeros(bsz, 1, dtype=torch.long)
        return ResolvedTarget(anchor, anchor_kind, classes, torch.ones(1), ["value"] * bsz, task)

    if anchor_logits is None:
        raise TypeError("resolve_target needs the anchor logits for a target other than columns")
    predicted = anchor_logits.argmax(dim=-1).cpu()
    if target.kind == "predicted":
        classes = predicted[:, None]
        weights = torch.ones(1, device=predicted.device)
    elif target.kind == "given":
        idx = adapter.output_index(target.value)
        classes = torch.full((bsz, 1), idx, dtype=torch.long)
        weights = torch.ones(1)
    elif target.kind == "contrast":
        a = adapter.output_index(target.value)
        b = adapter.output_index(target.foil)
        classes = torch.tensor([[a, b]] * bsz, dtype=torch.long)
        weights = torch.tensor([1.0, -1.0])
    else:  # pragma: no cover - Target.parse never builds another kind
        raise InputError(f"unknown target kind {target.kind!r}")
    labels = [" vs ".join(adapter.output_name(c) for c in row) for row in classes.tolist()]
    return ResolvedTarget(anchor, anchor_kind, classes, weights, labels, task)
