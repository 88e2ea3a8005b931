"""Additive Gaussian noise on the input representation, and the output distortion it causes.

Shared by co-perturbation interest estimation (Guan et al. 2019; the seed paper's Eq. 2-4) and
its word-by-word baseline (the seed paper's Eq. 1). A :class:`NoiseProbe` runs copies ("rows")
of a batch's examples with noise ``eps`` ``[R, N, D]`` added to the input representation ``x``
and returns, per row, the distortion ``||phi(x) - phi(x + eps)||^2`` of the explained output
``phi``:

- ``key = HEAD``: the head's outputs at the example's anchor position (all logits by default;
  or probabilities, log-probabilities, or the explained target scalar);
- ``key = k`` (1..L): every real token's hidden state at layer ``k`` (the paper's Section 5.3,
  ``phi_k``).

``x`` is the embedding module's output -- the input of the first transformer block, i.e.
``hidden_states[0]``, with position/type embeddings and normalisation included, as in Guan et
al. -- or the raw word embeddings (``space="word_embeddings"``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import torch

from heedful.adapters import Forward, ModelAdapter, Site
from heedful.engine.batch import Batch
from heedful.engine.problem import Problem
from heedful.engine.targets import ResolvedTarget
from heedful.errors import InputError

HEAD = -1
"""Layer key meaning "the head's output at the anchor position"."""

Space = Literal["embedding_output", "word_embeddings"]
PhiOutput = Literal["logits", "probs", "log_probs", "target"]
ScaleBasis = Literal["input", "word_embeddings"]
SPACES: tuple[str, ...] = Space.__args__
OUTPUTS: tuple[str, ...] = PhiOutput.__args__
SCALE_BASES: tuple[str, ...] = ScaleBasis.__args__
SCALE_FACTOR = 3.0
"""Default noise ceiling in units of the std of the noised representation (ours; see
:func:`noise_scale`)."""
GUAN_SCALE_FACTOR = 10.0
"""Guan et al. 2019's ceiling in units of the word-embedding matrix's std
(``10 * Std[word_embedding_weight]``, 0.5 for BERT-base)."""


def noise_scale(
    adapter: ModelAdapter,
    probe: NoiseProbe,
    example: torch.Tensor,
    factor: float | None = None,
    basis: str = "input",
    scale: float | None = None,
) -> torch.Tensor:
    """Largest per-element noise std allowed for each row of ``example`` ``[R]`` -> ``[R]``.

    ``scale`` given: that value. ``basis="word_embeddings"``: ``factor x std(word-embedding
    matrix)`` (Guan et al.'s rule; ``factor`` default 10). ``basis="input"`` (default, ours):
    ``factor x std`` of the noised representation of the example itself (default factor 3).
    Why ours: Guan et al.'s rule ties the noise to the *word* embeddings, but the noise lands on
    the embedding module's output, whose scale differs by family -- layer-normalised for BERT-like
    encoders (8x the word-embedding std for MiniLM, where 10x the word-embedding std is 1.2x the
    representation's std and leaves the head's output almost untouched: relative distortion 0.001),
    unnormalised for decoders (1x for Llama-style models, where the same rule would be 10x the
    representation's std and destroy any output). A multiple of the representation's own std
    means the same thing for every family.
    """
    if scale is not None:
        return torch.full((example.shape[0],), float(scale))
    check_choice("scale_basis", basis, SCALE_BASES)
    if basis == "word_embeddings":
        std = adapter.word_embeddings.weight.detach().float().std()
        return torch.full((example.shape[0],), float((factor or GUAN_SCALE_FACTOR) * std), device=std.device)
    return (factor or SCALE_FACTOR) * probe.input_std[example]


def resolve_layer(adapter: ModelAdapter, layer: int | None) -> int:
    """A user's ``layer`` (``None`` = head; 1..L, or negative from the end) -> a layer key."""
    if layer is None:
        return HEAD
    n = adapter.num_layers
    k = int(layer) + n + 1 if int(layer) < 0 else int(layer)
    if not 1 <= k <= n:
        raise InputError(
            f"layer {layer} is out of range for a {n}-layer model",
            hint=f"use 1..{n} (or -1 for the last layer); leave it unset for the head's output",
        )
    return k


def check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise InputError(f"unknown {name} {value!r}", hint=f"use one of {', '.join(allowed)}")


@contextmanager
def _noise_on_first_block(adapter: ModelAdapter, noise: torch.Tensor) -> Iterator[None]:
    """Adds ``noise`` ``[R, W, D]`` to the residual stream entering the first block
    (= ``hidden_states[0]``, the first block's input), through the adapter's interception (a
    model without block roles needs only its blocks)."""
    with adapter.intercept() as hooks:
        hooks.at(Site(adapter.blocks[0], "input"), lambda _, hidden: hidden + noise.to(hidden.dtype))
        yield


@dataclass
class NoiseProbe:
    """Runs noised copies of ``batch`` and measures the distortion of ``phi`` per copy.

    ``reference[key]``: ``phi(x)`` of every example (``[B, C]`` for the head, ``[B, N, D]`` for a
    layer); ``energy[key]`` ``[B]``: mean of ``phi(x)^2`` over the same elements (Guan et al.'s
    ``regularization=None`` normaliser); ``dim``: width ``D`` of the noised representation;
    ``input_std`` ``[B]``: std of each example's noised representation over its real tokens;
    ``inputs_embeds`` ``[B, N, E]``: word embeddings every pass starts from instead of the
    batch's ids (``None``: the ids'), e.g. with chosen tokens down-weighted
    (:func:`heedful.interest.downweight`).
    """

    adapter: ModelAdapter
    batch: Batch
    target: ResolvedTarget
    space: str
    output: str
    keys: tuple[int, ...]
    reference: dict[int, torch.Tensor]
    energy: dict[int, torch.Tensor]
    dim: int
    word_embeds: torch.Tensor | None
    input_std: torch.Tensor
    inputs_embeds: torch.Tensor | None = None

    @classmethod
    def build(
        cls, problem: Problem, keys: tuple[int, ...], space: str = "embedding_output", output: str = "logits"
    ) -> NoiseProbe:
        """The probe of a problem: the problem's reference pass (with hidden states; from its
        ``inputs_embeds`` when it has them) is the clean pass every distortion is measured from."""
        check_choice("space", space, SPACES)
        check_choice("output", output, OUTPUTS)
        adapter, batch, target = problem.adapter, problem.batch, problem.target
        inputs_embeds = problem.inputs_embeds
        if inputs_embeds is not None:
            inputs_embeds = inputs_embeds.detach()
        fwd = problem.reference_with(hidden_states=True)
        mask = batch.attention_mask.bool()
        probe = cls(
            adapter, batch, target, space, output, tuple(sorted(set(keys))), {}, {}, 0, None, torch.zeros(0, device=adapter.device),
            inputs_embeds,
        )
        for key in probe.keys:
            if key == HEAD:
                phi = probe.head_phi(fwd, target)
                probe.reference[key] = phi
                probe.energy[key] = phi.pow(2).mean(dim=1)
            else:
                h = fwd.hidden_states[key]
                probe.reference[key] = h
                probe.energy[key] = _masked_mean_sq(h, mask)
        if space == "word_embeddings":
            probe.word_embeds = adapter.embed(batch.input_ids).detach() if inputs_embeds is None else inputs_embeds
            x = probe.word_embeds
        else:
            x = fwd.hidden_states[0]
        probe.dim = x.shape[-1]
        probe.input_std = _masked_std(x.float(), mask)
        return probe

    def head_phi(self, fwd: Forward, target: ResolvedTarget) -> torch.Tensor:
        """``phi`` at the head ``[R, C]`` (``[R, 1]`` for the target scalar)."""
        logits = fwd.logits.float()
        if self.output == "target":
            return target.score(logits)[:, None]
        if self.output == "logits" or target.task == "regression":
            return logits
        if self.output == "probs":
            return torch.softmax(logits, dim=-1)
        return torch.log_softmax(logits, dim=-1)

    def run(self, example: torch.Tensor, noise: torch.Tensor, hidden: bool) -> Forward:
        """Forward rows ``example`` ``[R]`` with ``noise`` ``[R, W, D]`` added to ``x``; the rows
        are cut to the first ``W`` positions (``W`` >= the rows' lengths; right padding)."""
        batch, width = self.batch, noise.shape[1]
        anchor = self.target.read_at[example]
        mask = batch.attention_mask[example, :width]
        types = None if batch.token_type_ids is None else batch.token_type_ids[example, :width]
        if self.space == "word_embeddings":
            embeds = self.word_embeds[example, :width] + noise
            return self.adapter.forward(
                batch, anchor, inputs_embeds=embeds, attention_mask=mask, token_type_ids=types,
                hidden_states=hidden,
            )
        start = (
            {"input_ids": batch.input_ids[example, :width]}
            if self.inputs_embeds is None
            else {"inputs_embeds": self.inputs_embeds[example, :width]}
        )
        with _noise_on_first_block(self.adapter, noise):
            return self.adapter.forward(
                batch, anchor, **start, attention_mask=mask, token_type_ids=types, hidden_states=hidden
            )

    def distortion(
        self, example: torch.Tensor, key: torch.Tensor, noise: torch.Tensor, normalise: bool = True
    ) -> torch.Tensor:
        """Distortion per row ``[R]`` for rows of examples ``example`` ``[R]`` probed at layer
        keys ``key`` ``[R]`` under ``noise`` ``[R, W, D]`` (differentiable in ``noise``; ``W`` may
        be cut below the batch width, down to the rows' longest length).

        ``normalise=True``: mean squared change over the probed elements divided by the mean
        squared reference value (Guan et al. 2019, ``regularization=None``), so that the scale
        of ``phi`` does not matter. ``False``: the paper's raw ``||phi(x) - phi(x~)||^2``.
        """
        keys_here = sorted(set(key.tolist()))
        fwd = self.run(example, noise, hidden=any(k != HEAD for k in keys_here))
        out = torch.zeros(example.shape[0], dtype=torch.float32, device=fwd.logits.device)
        width = noise.shape[1]
        for k in keys_here:  # at most L + 1 distinct keys
            rows = (key == k).nonzero().flatten()
            ex = example[rows]
            diff, valid = self._change(fwd, rows, ex, k, width)
            value = diff.pow(2).sum(dim=1)
            if normalise:
                value = value / valid.sum(dim=1).clamp_min(1) / self.energy[k][ex].clamp_min(1e-12)
            out = out.index_put((rows,), value)
        return out

    def change(self, example: torch.Tensor, key: int, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``phi(x + noise) - phi(x)`` of rows ``example`` ``[R]`` all probed at layer key ``key``,
        flattened over the probed elements -> ``[R, M]`` (differentiable in ``noise``
        ``[R, W, D]``), and which of the ``M`` elements are real ``[R, M]`` (a layer's padded
        positions are not; they are 0 in the change). ``M``: the head's outputs, or ``W x D_k``."""
        fwd = self.run(example, noise, hidden=key != HEAD)
        return self._change(fwd, torch.arange(example.shape[0]), example, key, noise.shape[1])

    def _change(
        self, fwd: Forward, rows: torch.Tensor, ex: torch.Tensor, key: int, width: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if key == HEAD:
            phi = self.head_phi(_select_rows(fwd, rows), self.target.select(ex))
            diff = phi - self.reference[key][ex]
            return diff, torch.ones_like(diff, dtype=torch.bool)
        h = fwd.hidden_states[key][rows].float()
        m = self.batch.attention_mask.bool()[ex, :width, None].expand(h.shape)
        diff = (h - self.reference[key][ex, :width].float()) * m
        return diff.flatten(1), m.flatten(1)

    def elements(self, example: torch.Tensor, key: int) -> torch.Tensor:
        """Number of probed elements ``M`` of each row of ``example`` ``[R]`` at ``key`` -> ``[R]``
        (the head's outputs; a layer's real positions x its width)."""
        ref = self.reference[key]
        if key == HEAD:
            return torch.full((example.shape[0],), ref.shape[1])
        return self.batch.lengths[example] * ref.shape[-1]


def _select_rows(fwd: Forward, rows: torch.Tensor) -> Forward:
    return Forward(logits=fwd.logits[rows])


def _masked_std(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Std of ``x`` ``[B, N, D]`` over real positions and features, per example ``[B]``."""
    m = mask[..., None].to(x.dtype)
    count = (m.sum(dim=(1, 2)) * x.shape[-1]).clamp_min(1)
    mean = (x * m).sum(dim=(1, 2)) / count
    return (((x - mean[:, None, None]).pow(2) * m).sum(dim=(1, 2)) / count).sqrt()


def _masked_mean_sq(h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``h^2`` over real positions and features, per example ``[B]``."""
    m = mask[..., None].to(h.dtype)
    return (h.float().pow(2) * m).sum(dim=(1, 2)) / (m.sum(dim=(1, 2)) * h.shape[-1]).clamp_min(1)

