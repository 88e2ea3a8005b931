"""Gradient methods on the word embeddings: saliency, gradient x input, integrated gradients, and
SmoothGrad as a noise tunnel around any of them.

All back-propagate the target logit (:meth:`ResolvedTarget.score`) to the word embeddings
``e`` ``[B, N, E]``, which gives one attribution per token and embedding dimension ``a``
``[B, N, E]`` (the gradient, gradient x input, ...), and reduce it over the embedding dimension
to one score per token with ``aggregate`` (:func:`aggregate_embedding`):

* ``"sum"`` -- ``sum_d a_id``, signed (gradient x input is then the dot product ``g_i . e_i``);
* ``"l1"`` -- ``||a_i||_1 = sum_d |a_id|``, unsigned: the aggregation of the gradient baselines in
  Abbasi et al. 2025, NormXLogit (§4, "Input Attribution Methods": Gradient Norm, Gradient x
  Input and Integrated Gradients all aggregated with the l1 norm);
* ``"l2"`` -- ``||a_i||_2``, unsigned (saliency's norm, Simonyan et al. 2014).

Each method keeps its usual default (saliency and SmoothGrad ``"l2"``; gradient x input,
integrated gradients and SmoothGrad with ``multiply_by_inputs`` ``"sum"``). A bare gradient
(saliency, SmoothGrad of saliency without ``multiply_by_inputs``) takes only the norms: its
signed sum is no token score -- where the embeddings go through a LayerNorm (BERT, RoBERTa,
DeBERTa, ELECTRA) the LayerNorm's Jacobian removes the mean direction and the sum is 0 up to
rounding.

Every gradient method registers its per-dimension attributions (``per_dimension``), so that
SmoothGrad composes with any of them the way Captum's ``NoiseTunnel`` wraps an attribution
method.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any, Literal

import numpy as np
import torch

from heedful.adapters import Forward, ModelAdapter
from heedful.engine.batch import Batch
from heedful.engine.chunks import length_chunks
from heedful.engine.memory import Need, format_bytes
from heedful.engine.options import AT_LEAST_ONE, NON_NEGATIVE, RUNTIME
from heedful.engine.precision import widened
from heedful.engine.prefix_noise import prefix_normal
from heedful.engine.problem import Problem, reference_pass
from heedful.engine.runner import Copies, Runner, keeps_graph
from heedful.errors import Hint, InputError
from heedful.registry import find, register

Aggregate = Literal["sum", "l1", "l2"]
"""How per-dimension attributions ``[B, N, E]`` become token scores ``[B, N]``: signed sum, l1
norm, l2 norm (see the module docstring)."""
GradientAggregate = Literal["l2", "l1"]
"""The reductions of a bare gradient (saliency): norms only."""
AGGREGATES: tuple[str, ...] = Aggregate.__args__
GRADIENT_AGGREGATES: tuple[str, ...] = GradientAggregate.__args__
Baseline = Literal["pad", "mask", "unk", "zero"]
Rule = Literal["gausslegendre", "riemann_trapezoid", "riemann_middle", "riemann_left", "riemann_right"]
NoiseTunnel = Literal["smoothgrad", "smoothgrad_sq", "vargrad"]
Wrapped = Literal["saliency", "grad_x_input", "integrated_gradients"]

_AGGREGATE_NAMES = {"sum": "signed sum", "l1": "l1 norm", "l2": "l2 norm"}


def aggregate_embedding(values: torch.Tensor, aggregate: str) -> torch.Tensor:
    """Per-dimension attributions ``values`` ``[B, N, E]`` -> token scores ``[B, N]``:
    ``"sum"`` ``sum_d v_id`` (signed), ``"l1"`` ``sum_d |v_id|``, ``"l2"`` ``sqrt(sum_d v_id^2)``."""
    values = widened(values)  # a half-precision model's products summed in float32
    if aggregate == "sum":
        return values.sum(dim=-1)
    if aggregate in ("l1", "l2"):
        return values.norm(p=1 if aggregate == "l1" else 2, dim=-1)
    raise InputError(f"unknown aggregate {aggregate!r}", hint="use one of sum, l1, l2")


# ---------------------------------------------------------------------------- gradients
def gradient_reference(
    adapter: ModelAdapter, batch: Batch, anchor: torch.Tensor, inputs_embeds: torch.Tensor | None = None
) -> Forward:
    """Reference pass of the single-pass gradient methods: the forward pass from the word
    embeddings with its autograd graph kept, so that the method needs one backward pass and no
    second forward. Rows run in groups of similar length, each cut to its longest row.

    A batch whose kept activations would pass the adapter's memory budget
    (:func:`~heedful.engine.runner.keeps_graph`) gets the plain reference pass instead; the method
    then runs forward and backward chunk by chunk in bounded memory (with per-block gradient
    checkpointing where one row needs it) -- checked here, so that a backward that cannot fit
    at all is an :class:`InputError` before any work."""
    anchors = int(anchor.shape[1]) if anchor.dim() == 2 else 1
    kept = keeps_graph(adapter, batch.lengths, anchors)
    if kept is None:
        adapter.fit(int(batch.lengths.max()), Need(grad="saved", anchors=anchors))
        return reference_pass(adapter, batch, anchor, inputs_embeds)
    start = adapter.embed(batch.input_ids) if inputs_embeds is None else inputs_embeds
    embeds = start.detach().requires_grad_(True)
    parts, order = [], []
    with torch.enable_grad():
        for rows, width in length_chunks(batch.lengths):
            inputs = batch.cut(rows, width)
            del inputs["input_ids"]
            fwd = adapter.forward(batch, anchor[rows], inputs_embeds=embeds[rows, :width], release=kept, **inputs)
            parts.append(fwd.logits)
            order.append(rows)
        logits = torch.cat(parts)[torch.argsort(torch.cat(order))]
    return Forward(logits=logits, inputs_embeds=embeds)


def input_gradients(problem: Problem, embeds: torch.Tensor, internal_batch_size: int | None = None) -> torch.Tensor:
    """``d score / d e`` at word embeddings ``embeds`` ``[B, N, E]`` of the problem's examples
    (one forward and one backward per chunk of similar length)."""
    copies = Copies(torch.arange(len(problem), device=problem.batch.input_ids.device), embeds=lambda rows, example, width: embeds[example, :width])
    return Runner.for_problem(problem, rows=internal_batch_size).gradients(copies)


def gradient_and_input(problem: Problem) -> tuple[torch.Tensor, torch.Tensor]:
    """``(d score / d e, e)`` for the problem's word embeddings, through its reference pass when
    that kept its graph (:func:`gradient_reference`), otherwise with a pass of its own."""
    reference = problem.reference
    if reference.inputs_embeds is not None:
        embeds = reference.inputs_embeds
        with torch.enable_grad():
            grad = problem.adapter.grad(problem.target.score(reference.logits), embeds)
        return grad, embeds.detach()
    embeds = problem.word_embeddings()
    return input_gradients(problem, embeds), embeds


def _gradient_map(problem: Problem, embeds: torch.Tensor, options: dict[str, Any]) -> torch.Tensor:
    return input_gradients(problem, embeds, options.get("internal_batch_size"))


def _gradient_x_input_map(problem: Problem, embeds: torch.Tensor, options: dict[str, Any]) -> torch.Tensor:
    return input_gradients(problem, embeds, options.get("internal_batch_size")) * embeds


SINGLE_PASS = {"family": "gradient", "cost": "1 forward + 1 backward", "reference": gradient_reference, "spans": True}
"""What the single-pass gradient methods register with: one backward through their reference pass."""


@register("saliency", **SINGLE_PASS, per_dimension=_gradient_map)
def saliency(problem: Problem, *, aggregate: GradientAggregate = "l2") -> torch.Tensor:
    """L2 norm of the gradient of the target logit w.r.t. each word embedding.

    ``||d f / d e_i||_2`` per token ``[B, N]`` (unsigned; Simonyan et al. 2014, Eq. 2, with
    the gradient ``d f / d e_i`` ``[B, N, E]`` reduced over the embedding).

    ``aggregate``: ``"l2"`` (default) or ``"l1"`` (``sum_d |d f / d e_id|``, NormXLogit §4's
    "Gradient Norm"); a signed sum of the gradient is no token score (see the module docstring).

    Source: Simonyan et al. 2014, Deep Inside Convolutional Networks (Eq. 2); L2 norm over the
    embedding (aggregate='l1': NormXLogit §4's Gradient Norm)
    """
    grad, _ = gradient_and_input(problem)
    return aggregate_embedding(grad, aggregate)


@register("grad_x_input", **SINGLE_PASS, per_dimension=_gradient_x_input_map)
def grad_x_input(problem: Problem, *, aggregate: Aggregate = "sum") -> torch.Tensor:
    """Dot product of each word embedding with its gradient (signed).

    ``sum_d e_id * (d f / d e_id)`` per token ``[B, N]``: the per-dimension products
    ``e * d f / d e`` ``[B, N, E]`` summed over the embedding (signed).

    ``aggregate``: ``"sum"`` (default), ``"l1"`` (``sum_d |e_id * d f / d e_id|``, unsigned: the
    aggregation of NormXLogit §4's tables) or ``"l2"``.

    Source: Shrikumar et al. 2016 / Denil et al. 2014: gradient x input, summed over the embedding
    (aggregate='l1': NormXLogit §4)
    """
    grad, embeds = gradient_and_input(problem)
    return aggregate_embedding(grad * embeds, aggregate)


# ---------------------------------------------------------------------------- integrated gradients
GAUSS_LEGENDRE_MAX_STEPS = 1000
"""Most ``n_steps`` of the Gauss-Legendre rule. Its nodes are the eigenvalues of an
``n x n`` matrix (numpy's ``leggauss``, Golub-Welsch): ``8 n^2`` bytes and ``O(n^3)`` time --
about 3 CPU-seconds at 1,000 on a 2-core EPYC, 26 at 4,000, 1.2 TiB at 400,000 (a MemoryError
once the model was loaded, which the memory budget, counting the passes' copies, did not see).
The rule converges long before; the Riemann rules take any number of steps."""


def check_path(n_steps: int, rule: str) -> None:
    """Refuse, before any work, ``n_steps`` the ``rule`` cannot place (at least 1; at most
    :data:`GAUSS_LEGENDRE_MAX_STEPS` for Gauss-Legendre)."""
    if n_steps < 1:
        raise InputError(f"n_steps must be at least 1, got {n_steps}")
    if rule == "gausslegendre" and n_steps > GAUSS_LEGENDRE_MAX_STEPS:
        raise InputError(
            f"n_steps={n_steps:,} with rule=gausslegendre: its nodes are the eigenvalues of a "
            f"{n_steps:,} x {n_steps:,} matrix ({format_bytes(8 * n_steps**2)}, O(n^3) time)",
            hint=Hint(
                f"use n_steps <= {GAUSS_LEGENDRE_MAX_STEPS:,} (Gauss-Legendre converges long before), "
                "or rule='riemann_trapezoid' for more steps",
                f"use --option n_steps={GAUSS_LEGENDRE_MAX_STEPS} or fewer (Gauss-Legendre converges long before), "
                "or --option rule=riemann_trapezoid for more steps",
            ),
        )


def _path_passes(options: dict[str, Any]) -> tuple[int, int]:
    """Integrated gradients' passes per example (the input's forward, a forward and backward
    per step), its path checked first: the estimate runs before any work."""
    check_path(int(options["n_steps"]), options["rule"])
    return 1 + options["n_steps"], options["n_steps"]


def path_points(n_steps: int, rule: str) -> tuple[np.ndarray, np.ndarray]:
    """Interpolation points ``alpha`` in [0, 1] and their quadrature weights (summing to 1)."""
    check_path(n_steps, rule)
    if rule == "gausslegendre":
        x, w = np.polynomial.legendre.leggauss(n_steps)
        return (x + 1) / 2, w / 2
    if rule == "riemann_trapezoid":
        if n_steps < 2:
            raise InputError("the trapezoid rule needs n_steps >= 2")
        alphas = np.linspace(0, 1, n_steps)
        w = np.full(n_steps, 1.0 / (n_steps - 1))
        w[[0, -1]] /= 2
        return alphas, w
    offsets = {"riemann_left": 0.0, "riemann_right": 1.0, "riemann_middle": 0.5}
    if rule not in offsets:
        raise InputError(f"unknown integration rule {rule!r}", hint=f"use one of {', '.join(Rule.__args__)}")
    alphas = (np.arange(n_steps) + offsets[rule]) / n_steps
    return alphas, np.full(n_steps, 1.0 / n_steps)


def baseline_embeddings(problem: Problem, baseline: str) -> torch.Tensor:
    """Reference input ``[B, N, E]``: content tokens replaced by the ``[PAD]`` / ``[MASK]`` /
    unknown-token embedding (special tokens kept, as is usual for text; ``"unk"`` is Inseq's
    default baseline), or all-zero embeddings."""
    if baseline == "zero":
        return torch.zeros_like(problem.word_embeddings())
    return baseline_of(problem.adapter, problem.batch, baseline)


def baseline_of(adapter: ModelAdapter, batch: Batch, baseline: str) -> torch.Tensor:
    """:func:`baseline_embeddings` of ``batch``'s own ids ``[B, N, E]``."""
    if baseline == "zero":
        return torch.zeros_like(adapter.embed(batch.input_ids.to(adapter.device)))
    if baseline == "pad":
        token = adapter.pad_token_id
    elif baseline in ("mask", "unk"):
        token = getattr(adapter.tokenizer, f"{baseline}_token_id", None)
        if token is None:
            raise InputError(f"this tokenizer has no {baseline} token", hint="use baseline='pad' or 'zero'")
    else:
        raise InputError(f"unknown baseline {baseline!r}", hint="use one of pad, mask, unk, zero")
    ids = torch.where(batch.content_mask, torch.full_like(batch.input_ids, int(token)), batch.input_ids)
    return adapter.embed(ids)


def _integrated_map(problem: Problem, embeds: torch.Tensor, options: dict[str, Any]) -> torch.Tensor:
    """``IG_id = (e_id - e'_id) * sum_s w_s dF(e' + a_s (e - e'))/de_id`` ``[B, N, E]`` (Eq. 1)."""
    n_steps = int(options["n_steps"])
    alphas, weights = path_points(n_steps, options["rule"])
    base = baseline_embeddings(problem, options["baseline"]).detach()
    delta = embeds - base
    alpha_t = torch.as_tensor(alphas, dtype=embeds.dtype, device=embeds.device)
    weight_t = torch.as_tensor(weights, dtype=widened(embeds).dtype, device=embeds.device)

    def point(rows: torch.Tensor, example: torch.Tensor, width: int) -> torch.Tensor:
        # row r = example r // n_steps at step r % n_steps
        return base[example, :width] + alpha_t[rows % n_steps, None, None] * delta[example, :width]

    copies = Copies(torch.arange(len(problem), device=problem.batch.input_ids.device).repeat_interleave(n_steps), embeds=point)
    runner = Runner.for_problem(problem, rows=options.get("internal_batch_size"))
    total = runner.gradients(copies, weights=weight_t.repeat(len(problem)))
    return total * delta


@register(
    "integrated_gradients",
    family="gradient",
    cost="n_steps x (1 forward + 1 backward)",
    passes=lambda o, n: _path_passes(o),
    per_dimension=_integrated_map,
    spans=True,
)
def integrated_gradients(
    problem: Problem,
    *,
    n_steps: Annotated[int, AT_LEAST_ONE] = 50,
    baseline: Baseline = "pad",
    rule: Rule = "gausslegendre",
    internal_batch_size: Annotated[int | None, AT_LEAST_ONE, RUNTIME] = None,
    aggregate: Aggregate = "sum",
) -> torch.Tensor:
    """Path integral of gradients from a baseline to the input, times (input - baseline).

    ``IG_i = sum_d (e_id - e'_id) * sum_s w_s dF(e' + a_s (e - e'))/de_id``  ``[B, N]``: the
    per-dimension attributions ``IG_id`` ``[B, N, E]`` of Eq. 1 summed over the embedding.

    ``aggregate``: ``"sum"`` (default; signed, keeps completeness), ``"l1"`` (``sum_d |IG_id|``,
    NormXLogit §4's aggregation) or ``"l2"`` (``||IG_i||_2``); the norms are unsigned and do not
    sum to ``F(e) - F(e')``.

    All ``B x n_steps`` interpolated inputs run through the batched runner
    (:class:`~heedful.engine.runner.Runner`): chunks of rows of similar length, each cut to its longest
    row and holding at most about 16k token positions (or ``internal_batch_size`` rows).
    Completeness: ``sum_i IG_i ~= F(e) - F(e')``.

    Source: Sundararajan et al. 2017, Axiomatic Attribution for Deep Networks (Eq. 1,
    Riemann/Gauss-Legendre approximation)
    """
    options = {"n_steps": n_steps, "baseline": baseline, "rule": rule, "internal_batch_size": internal_batch_size}
    return aggregate_embedding(_integrated_map(problem, problem.word_embeddings(), options), aggregate)


# ---------------------------------------------------------------------------- SmoothGrad
def prefix_scale(embeds: torch.Tensor, attention_mask: torch.Tensor, noise_level: float) -> torch.Tensor:
    """``sigma`` ``[B, N]`` of every prefix: ``noise_level * (max - min)`` of ``embeds``
    ``[B, N, E]`` over the real positions up to each position (Smilkov et al.'s noise level;
    padding must not set it)."""
    real = attention_mask.bool()
    inf = torch.finfo(embeds.dtype).max
    high = embeds.amax(dim=-1).masked_fill(~real, -inf).cummax(dim=1).values
    low = embeds.amin(dim=-1).masked_fill(~real, inf).cummin(dim=1).values
    return noise_level * (high - low)


def noise_scale(embeds: torch.Tensor, attention_mask: torch.Tensor, noise_level: float) -> torch.Tensor:
    """``sigma_b`` ``[B]``: :func:`prefix_scale` of each example's whole text (at the last
    position, which its running extremes reach whatever the padding)."""
    return prefix_scale(embeds, attention_mask, noise_level)[:, -1]


def _noise(problem: Problem, embeds: torch.Tensor, n_samples: int, noise_level: float, seed: int | None) -> torch.Tensor:
    """``z_k sigma_b`` ``[B, n_samples, N, E]``: standard normal draws keyed by each position's
    token prefix (:func:`~heedful.engine.prefix_noise.prefix_normal`: a text draws the same in
    any batch, and a prefix of it the same on its positions -- what lets generation steps share
    a noised pass), drawn in float32 whatever the model's dtype, 0 on padding, times
    :func:`noise_scale`."""
    batch = problem.batch
    mask = batch.attention_mask.to(embeds.device)
    drawn = prefix_normal(batch.input_ids.to(embeds.device), mask, seed, n_samples, embeds.shape[-1])
    return drawn.to(embeds.dtype) * noise_scale(embeds, mask, noise_level)[:, None, None, None]


def smoothgrad_aggregate(inner: str, nt_type: str, multiply_by_inputs: bool, aggregate: str | None) -> str:
    """SmoothGrad's per-token reduction: ``aggregate``, or by default the L2 norm of a bare
    gradient (saliency's mean without ``multiply_by_inputs``) and the signed sum otherwise; an
    :class:`InputError` for options that make no token score."""
    bare = inner == "saliency" and not multiply_by_inputs and nt_type == "smoothgrad"
    if multiply_by_inputs and inner != "saliency":
        raise InputError(
            f"smoothgrad: multiply_by_inputs applies to the bare gradient, and {inner} already multiplies by its input",
            hint="drop multiply_by_inputs, or use inner='saliency'",
        )
    if aggregate is None:
        return "l2" if bare else "sum"
    if bare and aggregate == "sum":
        raise InputError(
            "smoothgrad: aggregate='sum' is not 'l2' | 'l1' for a bare gradient (its signed sum is no token score)",
            hint="use aggregate='l2' or 'l1', or multiply_by_inputs=True",
        )
    return aggregate


def tunnel(maps: Iterable[torch.Tensor], nt_type: str) -> torch.Tensor:
    """The noise tunnel's combination of per-sample maps ``a(e + z_k)`` (each ``[...]``, one
    at a time): their mean (``"smoothgrad"``), mean of squares (``"smoothgrad_sq"``) or variance
    (``"vargrad"``, over the samples, Welford's running update) -- no more than two maps' memory
    whatever the number of samples."""
    mean = spread = None
    for n, x in enumerate(maps, start=1):
        x = x.pow(2) if nt_type == "smoothgrad_sq" else x
        if mean is None:
            mean, spread = x.clone(), torch.zeros_like(x)
            continue
        step = x - mean
        mean.add_(step / n)
        if nt_type == "vargrad":
            spread.add_(step * (x - mean))
    if mean is None:
        raise ValueError("tunnel: no maps")
    return spread / n if nt_type == "vargrad" else mean


def _inner_steps(inner: str) -> int:
    """Passes of the method smoothgrad wraps per noised copy (its defaults: n_steps for IG)."""
    return find(inner).defaults.get("n_steps", 1)


@register(
    "smoothgrad",
    family="gradient",
    cost="n_samples x the wrapped method (saliency: 1 forward + 1 backward)",
    passes=lambda o, n: (1 + o["n_samples"] * _inner_steps(o["inner"]), o["n_samples"] * _inner_steps(o["inner"])),
    spans=True,
    version=2,
)
def smoothgrad(
    problem: Problem,
    *,
    inner: Wrapped = "saliency",
    n_samples: Annotated[int, AT_LEAST_ONE] = 20,
    noise_level: Annotated[float, NON_NEGATIVE] = 0.15,
    nt_type: NoiseTunnel = "smoothgrad",
    multiply_by_inputs: bool = False,
    seed: int | None = 0,
    internal_batch_size: Annotated[int | None, AT_LEAST_ONE, RUNTIME] = None,
    aggregate: Aggregate | None = None,
) -> torch.Tensor:
    """A gradient method (saliency by default) averaged over Gaussian-noised copies of the embeddings.

    A noise tunnel around the gradient method ``method``: its per-dimension attributions
    ``a(e)`` ``[B, N, E]`` at ``n_samples`` noised copies ``e + z_k``, ``z_k ~ N(0, sigma^2)``,
    ``sigma = noise_level * (max(e) - min(e))`` per example (the paper's 10-20 % noise level),
    combined per ``nt_type``: the mean ``M(e) = 1/n sum_k a(e + z_k)`` (``"smoothgrad"``, Eq. 3),
    the mean of squares (``"smoothgrad_sq"``) or the variance (``"vargrad"``). The wrapped method
    runs with its defaults on every noised copy (``integrated_gradients``: its path from the
    baseline to each noised input), all copies through the batched runner.

    ``multiply_by_inputs`` (saliency only): ``M(e) * e``, the clean input. Reduced per token to
    ``[B, N]`` by ``aggregate``: ``None`` (default) is the L2 norm of a bare gradient
    (saliency without ``multiply_by_inputs``) and the signed sum otherwise; a bare gradient takes
    only the norms. The draws at a position depend only on ``seed`` and the tokens up to it
    (:func:`~heedful.engine.prefix_noise.prefix_normal`), so a text's scores do not depend on
    its batch, and a generation's steps share their noised passes.

    Source: Smilkov et al. 2017, SmoothGrad: removing noise by adding noise (Eq. 3); nt_type as
    Captum's NoiseTunnel (smoothgrad_sq, vargrad: Adebayo et al. 2018)
    """
    aggregate = smoothgrad_aggregate(inner, nt_type, multiply_by_inputs, aggregate)
    wrapped = find(inner)
    embeds = problem.word_embeddings()
    bsz, seq, dim = embeds.shape
    noisy = (embeds[:, None] + _noise(problem, embeds, n_samples, noise_level, seed)).flatten(0, 1)
    copies = problem.select(torch.arange(bsz, device=problem.batch.input_ids.device).repeat_interleave(n_samples))
    options = {**wrapped.bind(), "internal_batch_size": internal_batch_size}
    maps = wrapped.per_dimension(copies, noisy, options).view(bsz, n_samples, seq, dim)
    combined = tunnel((maps[:, k] for k in range(n_samples)), nt_type)
    return aggregate_embedding(combined * embeds if multiply_by_inputs else combined, aggregate)
