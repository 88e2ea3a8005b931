"""AT2: context attribution from attention weights, one learned weight per attention head.

Each source ``s`` of the text gets, for every head ``(l, h)`` of the model, the feature

    a_{l,h}(s) = mean_{t in T} sum_{j in s} A_l[h, t, j]                       [B, S, L*H]

-- the attention from the positions ``T`` whose outputs are the target (the anchor; the K
positions that predict a span's tokens) to the source's tokens, averaged over ``T`` and summed
over the source -- and its score is the learned weighted sum ``score(s) = sum_f theta_f a_f(s)``
(Cohen-Wang et al. 2025). The weights ``theta`` ``[L*H]`` are learned once per model on
a training set of generated documents so that the scores predict what removing sources does: for
random keep-masks ``m`` (each source kept with probability 1/2) the prediction
``sum_s (2 m_s - 1) score(s)`` should correlate with the target's output with the masked sources
deleted; the objective is the mean over documents of that Pearson correlation across masks
(:func:`objective`), maximised by Adam (:func:`fit_heads`). Attribution then costs one forward
pass: the reference pass every method has, which records the target rows' attention
(:func:`at2_reference`).

Learned weights are JSON files (:class:`HeadWeights`): those of the zoo's decoders ship in
``heedful/attribution/at2_heads/`` pinned by sha256 (:data:`SHIPPED`); ``heedful at2 train``
writes any model's into the cache, where :func:`at2` finds them by the model's fingerprint.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from heedful.adapters import Forward, ModelAdapter
from heedful.adapters.intercept import AttentionCall, kernel_attention, row_probabilities
from heedful.adapters.passes import right_padded
from heedful.attribution.context import (
    ContextOutput,
    SourceRemoval,
    _ablation_masks,
    ablation_outputs,
)
from heedful.engine.batch import Batch
from heedful.engine.problem import Problem, ReferencePass
from heedful.engine.seeding import example_generators
from heedful.errors import HeedfulError, InputError, UnsupportedModelError
from heedful.files.cache import heedful_home
from heedful.registry import register

FORMAT = "heedful-at2-heads/1"
HEADS_DIR = Path(__file__).parent / "at2_heads"
TRAIN_COMMAND = "heedful at2 train --model NAME"
"""The command that learns a model's head weights (:mod:`heedful.commands.at2`)."""


@dataclass(frozen=True)
class ShippedHeads:
    """Head weights shipped with heedful for the model whose weights fingerprint is
    ``fingerprint`` (:func:`heedful.fingerprint.weights_fingerprint`), pinned by sha256."""

    model: str
    fingerprint: str
    file: str
    sha256: str

    @property
    def path(self) -> Path:
        return HEADS_DIR / self.file


SHIPPED: tuple[ShippedHeads, ...] = (
    # heedful at2 train --model smollm2-135m --docs 16 --ship: objective 0.944 on 12 documents,
    # 0.624 on 4 held out (uniform heads: 0.271 and 0.129); 1,770 s on a loaded 2-core machine
    ShippedHeads(
        model="smollm2-135m",
        fingerprint="3081e3e0aca018ad",
        file="smollm2-135m.json",
        sha256="f90111e042e2673125c24aa6a0d23916bcca239a13b923e4842ef32c8b508577",
    ),
    # heedful at2 train --model gemma3-270m --docs 64 --ship: objective 0.596 on 48 documents,
    # 0.502 on 16 held out (uniform heads: 0.244 and 0.247); 363 s on an idle 2-core machine
    # (with 16 documents: 0.877 on 12, 0.259 on 4 held out -- too few to generalise)
    ShippedHeads(
        model="gemma3-270m",
        fingerprint="a0f9146ebf6a159d",
        file="gemma3-270m.json",
        sha256="e6f67c464e2370a37ccf2c2a94798679e6235595fe14912717edfc02c9a675b9",
    ),
)
"""The shipped head weights (written by ``heedful at2 train --model NAME --ship``). New weights
for a model change what ``at2`` computes by default: bump its ``version`` with them (stored
results of the old weights are then never reused)."""


@dataclass
class HeadWeights:
    """Learned AT2 weights: ``weights`` ``[layers, heads]`` for the model with weights fingerprint
    ``fingerprint``; ``record``: how they were learned (data, settings, the objective reached)."""

    weights: np.ndarray
    fingerprint: str
    record: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "fingerprint": self.fingerprint, "weights": np.asarray(self.weights, dtype=np.float64).tolist(), "record": self.record}

    def save(self, path: Path) -> None:
        from heedful.files.atomic import atomic_file

        with atomic_file(path) as part:
            part.write_text(json.dumps(self.to_dict(), indent=1, sort_keys=True) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> HeadWeights:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise InputError(f"cannot read AT2 head weights from {path} ({exc})", hint=f"write them with {TRAIN_COMMAND} --out FILE") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise InputError(f"{path} is not an AT2 head-weights file ({FORMAT})", hint=f"write one with {TRAIN_COMMAND} --out FILE")
        return cls(np.asarray(data["weights"], dtype=np.float64), data["fingerprint"], data.get("record", {}))


def cache_path(fingerprint: str) -> Path:
    """Where ``heedful at2 train`` keeps a model's head weights by default."""
    return heedful_home() / "at2" / f"{fingerprint}.json"


def file_sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def _default_heads(adapter: ModelAdapter) -> HeadWeights | None:
    """The model's own head weights: the shipped ones (sha256-checked) or those learned into the
    cache for its weights fingerprint; ``None`` when it has neither."""
    from heedful.fingerprint import model_fingerprint

    fingerprint = model_fingerprint(adapter).weights
    shipped = next((s for s in SHIPPED if s.fingerprint == fingerprint), None)
    if shipped is not None:
        digest = file_sha256(shipped.path) if shipped.path.is_file() else "missing"
        if digest != shipped.sha256:
            raise HeedfulError(f"the shipped AT2 head weights {shipped.path} have sha256 {digest}, not the pinned {shipped.sha256}", hint="reinstall heedful")
        return HeadWeights.load(shipped.path)
    if cache_path(fingerprint).is_file():
        return HeadWeights.load(cache_path(fingerprint))
    return None


def has_heads(adapter: ModelAdapter, heads: str | None = None) -> bool:
    """Whether :func:`at2` can run on ``adapter``'s model with ``heads`` (a file or
    ``"uniform"``: always; ``None``: when the model has shipped or learned weights)."""
    return heads is not None or _default_heads(adapter) is not None


def find_heads(problem: Problem, heads: str | None) -> HeadWeights:
    """The head weights ``at2`` uses: from the file ``heads``, uniform ``1 / (L H)`` for
    ``"uniform"`` (attention averaged over every head and layer, the paper's untrained
    baseline), else the shipped ones (sha256-checked) or the cached ones of the model's
    fingerprint; an :class:`UnsupportedModelError` naming the training command if none."""
    from heedful.fingerprint import model_fingerprint

    layers, per_layer = len(problem.adapter.roles().blocks), _heads_per_layer(problem)
    if heads == "uniform":
        return HeadWeights(np.full((layers, per_layer), 1.0 / (layers * per_layer)), "uniform")
    fingerprint = model_fingerprint(problem.adapter).weights
    found = HeadWeights.load(Path(heads)) if heads is not None else _default_heads(problem.adapter)
    if found is None:
        raise UnsupportedModelError(
            f"at2 has no learned head weights for {problem.adapter.name} (weights fingerprint {fingerprint})",
            hint=f"learn them first: {TRAIN_COMMAND} (or pass heads=FILE)",
        )
    if found.weights.shape != (layers, per_layer):
        raise InputError(
            f"the AT2 head weights are {found.weights.shape[0]} x {found.weights.shape[1]}, the model has {layers} layers x {per_layer} heads",
            hint=f"learn weights for this model: {TRAIN_COMMAND}",
        )
    if heads is not None and found.fingerprint != fingerprint:
        raise InputError(
            f"the AT2 head weights {heads} were learned on another model (weights fingerprint {found.fingerprint}, this one {fingerprint})",
            hint=f"learn weights for this model: {TRAIN_COMMAND}",
        )
    return found


def _heads_per_layer(problem: Problem) -> int:
    config = problem.adapter.config
    return int(getattr(config, "num_attention_heads", None) or getattr(config, "n_head", None) or config.n_heads)


@torch.no_grad()
def anchor_attention(
    adapter: ModelAdapter, mask: torch.Tensor, rows: torch.Tensor, run: Callable[[], Forward]
) -> tuple[Forward, torch.Tensor]:
    """Run ``run()`` -- a pass of ``adapter``'s model over rows with attention mask ``mask``
    ``[B, N]`` -- keeping every head's attention from the query positions ``rows`` (``[B]`` or
    ``[B, K]``), averaged over them: the pass and ``[B, L, H, N]``. Every layer computes the
    probabilities of those rows alone (:func:`~heedful.adapters.intercept.row_probabilities`)
    and its output by the fused kernel (:func:`~heedful.adapters.intercept.kernel_attention`):
    no ``[B, H, N, N]`` matrix, so a 4,096-token text costs what a plain pass costs. Families
    that compute attention inline keep eager attention and take its rows."""
    rows = (rows[:, None] if rows.dim() == 1 else rows).to(adapter.device)  # [B, K]
    found: dict[int, torch.Tensor] = {}
    causal = adapter.is_decoder and right_padded(mask) and adapter.unwindowed(mask.shape[1])

    def attend(call: AttentionCall) -> tuple[torch.Tensor, torch.Tensor]:
        picked = row_probabilities(call, rows)  # [B, H, K, M]
        found[call.layer] = picked.float().mean(dim=2)  # [B, H, M]
        return kernel_attention(call, causal=causal), picked

    def keep_rows(layer: int, x, probs: torch.Tensor) -> None:
        picked = probs[torch.arange(probs.shape[0], device=probs.device)[:, None], :, rows]  # [B, K, H, M]
        found[layer] = picked.float().mean(dim=1)  # [B, H, M]

    with adapter.intercept() as hooks:
        if all(site.side == "attention" for _, site in hooks.sites("probs")):
            hooks.attend(attend)
        else:
            for layer, site in hooks.sites("probs"):
                hooks.at(site, lambda x, probs, layer=layer: keep_rows(layer, x, probs))
        forward = run()
    return forward, torch.stack([found[layer] for layer in sorted(found)], dim=1)  # [B, L, H, N]


def at2_reference(keep_cache: bool = False) -> ReferencePass:
    """AT2's reference pass: the unperturbed pass over the whole batch with every head's
    attention from the anchors' rows kept in :attr:`~heedful.adapters.Forward.anchor_attention`
    (:func:`anchor_attention`), so that AT2 costs this one pass; ``keep_cache``: with the
    decoder's key/value cache (:attr:`~heedful.adapters.Forward.cache`) for methods that then
    remove sources (``hierarchical``)."""

    def reference(adapter: ModelAdapter, batch: Batch, anchor: torch.Tensor, inputs_embeds: torch.Tensor | None = None) -> Forward:
        inputs = {"inputs_embeds": inputs_embeds} if inputs_embeds is not None else {}
        forward, attention = anchor_attention(
            adapter, batch.attention_mask, anchor, lambda: adapter.forward(batch, anchor, keep_cache=keep_cache, **inputs)
        )
        return replace(forward, anchor_attention=attention)

    return reference


@torch.no_grad()
def head_features(problem: Problem) -> torch.Tensor:
    """AT2's features ``[B, S, L*H]`` (layer-major): per source and head, the attention from the
    target's positions (:attr:`~heedful.engine.targets.ResolvedTarget.read_at`, ``[B]`` or
    ``[B, K]``), averaged over them, summed over the source's tokens (module docstring). Read
    from the reference pass when it kept them (:func:`at2_reference`), else one pass of
    :func:`anchor_attention`."""
    per_token = problem.reference.anchor_attention  # [B, L, H, N]
    if per_token is None:
        _, per_token = anchor_attention(problem.adapter, problem.batch.attention_mask, problem.target.read_at, problem.forward)
    per_token = per_token.flatten(1, 2)  # [B, L*H, N]
    members = problem.source_map().members().to(per_token)  # [B, S, N]
    return torch.einsum("bsn,bfn->bsf", members, per_token[..., : members.shape[2]])


@register(
    "at2",
    family="context",
    cost="1 forward: the reference pass, recording the attention of the target's rows",
    spans=True,
    needs_sources=True,
    needs=("roles",),
    reference=at2_reference(),
)
@torch.no_grad()
def at2(problem: Problem, *, heads: str | None = None) -> torch.Tensor:
    """AT2: each source's score is a learned weighted sum of every head's attention to it.

    ``score(s) = sum_{l,h} theta_{l,h} a_{l,h}(s)`` with ``a_{l,h}(s)`` the attention of head
    ``h`` of layer ``l`` from the target's positions (averaged over them) summed over the tokens
    of source ``s`` (:func:`head_features`), ``theta`` learned per model to predict the effect of
    removing random sets of sources (:func:`fit_heads`); each token gets its source's score over
    the source's tokens ``[B, N]``. ``heads``: a weights file written by ``heedful at2 train
    --out FILE``, or ``"uniform"`` (attention averaged over all heads: the untrained baseline);
    by default the weights shipped for the model (the zoo's ``smollm2-135m``) or learned into
    the cache by ``heedful at2 train``. A model with neither is refused, naming the command.

    What it approximates: removal effects such as exact leave-one-source-out, at the cost of one
    forward pass -- the reference pass every method runs, which keeps the attention of the
    target's rows (:func:`at2_reference`); how closely, per length, is in
    ``benchmarks/results/context.md``. That pass computes each layer's output by the fused
    attention kernel and the probabilities of the target's rows alone, so no ``[B, H, N, N]``
    matrix exists and a 4,096-token text costs a plain pass.

    Source: Cohen-Wang et al. 2025, Learning to Attribute with Attention (AT2: the attention weights of every head as features of a linear surrogate learned from source ablations with a correlation objective)
    """
    weights = find_heads(problem, heads)
    features = head_features(problem)  # [B, S, F]
    theta = torch.as_tensor(weights.weights, dtype=features.dtype, device=features.device).flatten()
    return problem.source_map().spread(features @ theta)


# ---------------------------------------------------------------------- learning the weights


@dataclass
class Ablations:
    """One document's training data: ``features`` ``[S, F]`` (:func:`head_features`), keep-masks
    ``masks`` ``[n, S]`` and the target's ``outputs`` ``[n]`` with the dropped sources deleted."""

    features: np.ndarray
    masks: np.ndarray
    outputs: np.ndarray


def ablations(
    problem: Problem,
    *,
    n_ablations: int = 32,
    keep_probability: float = 0.5,
    output: ContextOutput = "logit_prob",
    removal: SourceRemoval = "delete",
    seed: int = 0,
) -> list[Ablations]:
    """The training data of every example of ``problem``: its head features and ``n_ablations``
    random source ablations (each source kept with ``keep_probability``, seeded per example
    as ContextCite's) with the target's ``output`` -- the logit-probability by default, as the
    paper's."""
    counts = problem.source_map().counts.tolist()
    masks = _ablation_masks(counts, n_ablations, keep_probability, "random", example_generators(problem.batch, seed))
    outputs = ablation_outputs(problem, masks, output, removal=removal).double().numpy()
    features = head_features(problem).double().cpu().numpy()
    found, offset = [], 0
    for b, m in enumerate(masks):
        found.append(Ablations(features[b, : m.shape[1]], m.numpy(), outputs[offset : offset + len(m)]))
        offset += len(m)
    return found


def _signed_features(data: Sequence[Ablations]) -> torch.Tensor:
    """``[D, n, F]``: per document and mask, ``sum_s (2 m_s - 1) a(s)`` (kept sources count +1,
    dropped -1), whose product with ``theta`` is the surrogate's prediction."""
    return torch.stack([torch.from_numpy((2.0 * d.masks - 1.0) @ d.features) for d in data])


def _pearson(predicted: torch.Tensor, outputs: torch.Tensor) -> torch.Tensor:
    """Pearson correlation along the last axis ``[D, n] -> [D]`` (0 where either is constant)."""
    p = predicted - predicted.mean(dim=-1, keepdim=True)
    o = outputs - outputs.mean(dim=-1, keepdim=True)
    scale = (p.square().sum(-1) * o.square().sum(-1)).sqrt()
    return torch.where(scale > 0, (p * o).sum(-1) / scale.clamp(min=torch.finfo(scale.dtype).tiny), torch.zeros_like(scale))


def objective(weights: np.ndarray, data: Sequence[Ablations]) -> float:
    """AT2's training objective at ``weights`` ``[F]`` (any shape with F entries): the mean over
    documents of the Pearson correlation, across the document's masks, between the surrogate's
    predictions and the target's outputs."""
    theta = torch.as_tensor(np.asarray(weights, dtype=np.float64).reshape(-1))
    outputs = torch.stack([torch.from_numpy(d.outputs) for d in data])
    return float(_pearson(_signed_features(data) @ theta, outputs).mean())


def fit_heads(
    data: Sequence[Ablations],
    *,
    steps: int = 1000,
    learning_rate: float = 1e-3,
    non_negative: bool = False,
    seed: int = 0,
) -> np.ndarray:
    """Weights ``[F]`` maximising :func:`objective` on ``data``: from uniform ``1/F``, ``steps``
    full-batch Adam steps of ``learning_rate`` (cosine-annealed, gradients clipped to norm 1) on
    the negative mean correlation, each step clamped at 0 when ``non_negative``; scaled to unit
    L1 norm at the end (the correlation does not depend on the scale). As the paper's trainer."""
    if not data:
        raise InputError("no documents to learn AT2's head weights from", hint="pass at least one document with two or more sources")
    torch.manual_seed(seed)
    signed = _signed_features(data)
    outputs = torch.stack([torch.from_numpy(d.outputs) for d in data])
    theta = torch.full((signed.shape[-1],), 1.0 / signed.shape[-1], dtype=torch.float64, requires_grad=True)
    optimiser = torch.optim.Adam([theta], lr=learning_rate)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimiser, T_max=steps)
    with torch.enable_grad():
        for _ in range(steps):
            optimiser.zero_grad()
            loss = -_pearson(signed @ theta, outputs).mean()
            loss.backward()
            torch.nn.utils.clip_grad_norm_([theta], max_norm=1.0)
            optimiser.step()
            schedule.step()
            if non_negative:
                with torch.no_grad():
                    theta.clamp_(min=0)
    found = theta.detach().numpy().copy()
    total = np.abs(found).sum()
    return found / total if total > 0 else found

