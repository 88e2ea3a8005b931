"""Shared-prefix generation attribution for the gradient methods: one forward pass per
generated sequence (for integrated gradients, per interpolation point), and per step a backward
from that pass's graph.

Step ``t`` of a prompt of ``P`` tokens explains ``y_t`` from the head at position ``P + t - 1``.
A causal model's state at that position does not depend on later tokens, so the forward pass
over the whole sequence (prompt and every generated token) computes, at position ``P + t - 1``,
exactly the output of the step's own prefix -- and the gradient of the step's score with
respect to the word embeddings ``e`` ``[S, E]`` is the step row's own gradient on its first
``P + t`` positions and 0 beyond them (causal attention gives later positions no path to the
score). So all ``T`` steps share one forward over ``P + T`` positions instead of ``T`` forwards
over ``P + t`` positions each (:func:`heedful.generation.prepare_steps`' step rows), and each
step takes one backward over the kept graph (``retain_graph``).

Integrated gradients moves every token before a step along its path (each token between its
baseline embedding ``e'_j`` and ``e_j``); the point ``e'_j + a (e_j - e'_j)`` of a token does
not depend on the step, so one forward per sequence and interpolation point serves every step.
SmoothGrad (:data:`NOISED`) draws each position's noise from the tokens up to it
(:func:`heedful.engine.prefix_noise.prefix_normal`), so a step's noised prefix is the noised
sequence's, up to the noise scale -- which a step shares with its neighbours until a generated
token widens the range of the prefix's embedding values; per sample, one noised pass per run of
steps of one scale serves them (:func:`_noised`).

A step's backward needs only its prefix. Each row's score goes through the head once, and the
steps' backward passes start from the head's input (:attr:`~heedful.adapters.Forward.head_input`)
with those gradients, not from ``n x B x T`` rows of the head's ``C`` outputs. A decoder's pass
runs in position segments, each continuing the keys and values before it as leaves of its own
graph, and one reverse sweep over the segments back-propagates every step through its own
prefix only, each segment's graph once (:meth:`SharedSteps._swept`); encoder–decoders and models
whose own head runs take one backward per step through the whole pass (:meth:`SharedSteps._whole`).

AttnLRP (:data:`RELEVANCE_SHARED`) runs the pass under its rules and each step's backward carries
the rules' modified gradient. Every rule is a function of its own operation's inputs and outputs,
and those are the same at a step's positions in the whole pass as in the step's own, so the
shared pass gives each step its own relevance (Achtibat et al. 2024, Eq. 7, 9, 13) -- in
segments too: the rules' modified backward of a segment, fed the modified gradients its later
segments sent to its keys and values, composes into the whole pass's.

Prompts run in groups of similar length, as many per pass as keeping the pass's graph allows
under the adapter's ``max_memory`` (:func:`heedful.engine.memory.fit`); a sequence whose graph does
not fit at all, and a forward at a lowered precision, take the per-step path.
``precision="bf16"`` (:func:`generation_precision`) runs the shared passes, forward and backward,
on the model's bfloat16 copy; the fused attention kernel alone runs in float32 on a CPU, where
bfloat16's backward is several times slower (:mod:`heedful.adapters.kernel`).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from dataclasses import replace
from typing import Any, NamedTuple

import torch

from heedful.adapters import Forward, ModelAdapter, PrefixStates
from heedful.attribution.gradient import (
    aggregate_embedding,
    baseline_of,
    path_points,
    prefix_scale,
    smoothgrad_aggregate,
    tunnel,
)
from heedful.engine.batch import Batch
from heedful.engine.chunks import length_chunks
from heedful.engine.memory import FORWARD, Need, estimate, fit, rows_within
from heedful.engine.precision import active_precision, check_precision, resolve_precision, widened
from heedful.engine.prefix_noise import prefix_normal
from heedful.engine.problem import Problem
from heedful.engine.runner import keeps_graph
from heedful.engine.targets import ResolvedTarget, resolve_target
from heedful.errors import InputError
from heedful.generation import Generation, shared_reference, step_request, step_rows
from heedful.lrp.propagate import Prepared, explained_score, lrp_forward
from heedful.lrp.rules import rule_set
from heedful.lrp.session import LRPSession
from heedful.progress import task
from heedful.registry import MethodInfo, find

SHARED = ("saliency", "grad_x_input", "integrated_gradients")
"""The gradient methods with a shared-prefix path (and a bfloat16 one)."""

RELEVANCE_SHARED = ("attnlrp",)
"""The relevance methods with a shared-prefix path: one forward per sequence under the rule set
and per step a backward of its modified gradient (float32 only)."""

NOISED = ("smoothgrad",)
"""The noise tunnels with a shared-prefix path: per sample one noised forward per run of steps
with one noise scale (:func:`_noised`; float32 only), around any method of :data:`SHARED`."""

CANCELLING = ("integrated_gradients",)
"""Methods whose scores are sums that cancel, so that bfloat16 gradients move them far more
than rounding: on ``smollm2-135m`` (``benchmarks/results/generation.md``, 16 prompts x 20
tokens, on a processor with AVX-512 BF16) integrated gradients through bfloat16 passes differed
from float32 by 1.7e+03 where the largest float32 score is 722 -- more than twice it (130 % and,
on one prompt, 59 % in earlier runs) -- saliency and gradient x input by 3.1 % and 3.9 %."""


class CancellationWarning(UserWarning):
    """A lower precision asked of a method whose sums cancel (:data:`CANCELLING`)."""

Groups = list[tuple[torch.Tensor, int]]

SEGMENT = 8
"""Positions per segment of :meth:`SharedSteps._swept`."""


class _Segment(NamedTuple):
    """One segment of :meth:`SharedSteps._swept`'s forward, kept for its reverse sweep."""

    start: int
    stop: int
    inside: torch.Tensor  # [k] the rows anchored in the segment
    positions: torch.Tensor  # [K] its anchor positions
    seeds: torch.Tensor  # [B, K, D] the anchors' score gradients at the head's input
    read: torch.Tensor  # [B, K, D] the head's input
    outputs: tuple[torch.Tensor, ...]  # the segment's own keys, then values, of every layer
    leaf: torch.Tensor  # [B, stop - start, E] its input embeddings
    past: PrefixStates | None  # the earlier positions' keys and values, leaves of its graph


def generation_precision(info: MethodInfo, options: dict[str, Any], device: torch.device | str) -> tuple[dict[str, Any], str]:
    """``options`` without the ``precision`` of a gradient method's generation attribution, and
    that precision resolved (:func:`~heedful.engine.precision.resolve_precision`; ``"auto"``
    stays fp32 -- a gradient through bfloat16 passes moves scores by more than rounding of
    the forward outputs alone); a method with a ``precision`` option of its own keeps it. An
    :class:`InputError` for a lower precision the shared path cannot run: a method without a
    shared path, or int8 (a quantised copy has no backward)."""
    if "precision" not in options or info.takes("precision"):
        return options, "fp32"
    rest = {k: v for k, v in options.items() if k != "precision"}
    asked = check_precision(str(options["precision"]), auto=True)
    if asked not in ("fp32", "auto") and (info.name not in SHARED or asked != "bf16"):
        raise InputError(
            f"generation attribution with {info.name} has no {asked} path",
            hint=f"precision='bf16' serves {', '.join(SHARED)}; drop precision",
        )
    resolved = resolve_precision(asked, device)
    if resolved == "bf16" and info.name in CANCELLING:
        warnings.warn(
            f"{info.name} through bfloat16 passes: its sums over path points and embedding dimensions cancel, and on "
            "smollm2-135m the scores moved by more than twice the largest one (benchmarks/results/generation.md); "
            "drop precision='bf16' for scores to report",
            CancellationWarning,
            stacklevel=3,
        )
    return rest, resolved


def explain_shared(
    adapter: ModelAdapter,
    generation: Generation,
    info: MethodInfo,
    bound: dict[str, Any],
    quantity: str,
    precision: str = "fp32",
) -> tuple[Problem, torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """Every step of ``generation`` explained by ``info`` (with options ``bound``) through
    shared forward passes: ``(problem, example, step, scores)`` -- the step rows' problem (as
    :func:`~heedful.generation.prepare_steps` builds it), the rows' example and step ``[R]``,
    and the scores ``[R, W]`` -- equal to the per-step path's to float rounding; ``None``
    where the method has no shared path or it cannot run (see the module docstring).

    ``precision="bf16"``: the passes -- forward and backward -- run on the model's bfloat16 copy
    (:meth:`~heedful.adapters.ModelAdapter.at_precision`), from the float32 inputs (and path
    points) rounded to bfloat16; scores are read in float32 from its logits and the gradients
    summed in float32."""
    if info.name not in SHARED + RELEVANCE_SHARED + NOISED or active_precision() != adapter.precision:
        return None
    rules = info.name if info.name in RELEVANCE_SHARED else None
    full = generation.batch
    longest = max(generation.steps)
    groups = _groups(adapter, full.lengths, longest, bound.get("internal_batch_size"), relevance=rules is not None)
    if groups is None:
        if precision != "fp32":
            raise InputError(
                f"the {precision} passes of generation attribution keep one sequence's graph, which does not fit max_memory",
                hint="raise max_memory, shorten the generation, or drop precision",
            )
        return None
    batch, example, step = step_rows(generation)
    request = step_request(adapter, generation, example, step)
    target = resolve_target(request, adapter, batch.lengths - 1, "last", torch.empty(0))
    target.quantity = quantity
    prompt = torch.tensor(generation.prompt_lengths)
    # where each sequence's step t is read: P_b + t - 1 (steps past a short continuation re-read its last)
    anchors = (prompt[:, None] - 1 + torch.arange(longest)[None, :]).clamp(max=full.lengths[:, None] - 1)
    embeds = adapter.embed(full.input_ids.to(adapter.device)).detach()

    def rows_problem(reference: Forward) -> Problem:
        return Problem(adapter, batch, target, reference, request)

    if info.name in NOISED:
        return _noised(adapter, generation, bound, rows_problem, example, step, anchors, embeds, batch.lengths)
    shared = SharedSteps(adapter.at_precision(precision), full, groups, anchors, example, step, target, batch.seq_len)
    shared.rules = rules
    if rules is not None:  # AttnLRP: e * g with g its modified gradient (Achtibat et al. 2024)
        grads, logits = shared.gradients(embeds)
        return rows_problem(Forward(logits=logits)), example, step, (grads * shared.rows_of(embeds)).sum(dim=-1)
    values, logits = _per_dimension(adapter, shared, info.name, bound, embeds, logits=generation.log_probs is None)
    # integrated gradients: the rows' reference logits at the input itself, which no point of the path is
    # (for the steps' probabilities: none needed when the generation kept them, nor read by the passes)
    reference = Forward(logits=logits) if logits is not None else shared_reference(adapter, generation, example, step, head=generation.log_probs is None)
    return rows_problem(reference), example, step, aggregate_embedding(values, bound["aggregate"])


def _per_dimension(
    adapter: ModelAdapter, shared: SharedSteps, name: str, options: dict[str, Any], points: torch.Tensor, logits: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The per-dimension map ``[R, W, E]`` of gradient method ``name`` (one of :data:`SHARED`,
    with ``options``) of every step row at the sequences' input embeddings ``points``
    ``[B, S, E]``, and the rows' logits ``[R, C]`` at ``points`` (``None`` for integrated
    gradients, whose passes are at the path's points, and without ``logits``): the gradient
    (saliency), times the input (gradient x input), or the path's weighted gradients times
    ``points - baseline`` (integrated gradients, Sundararajan et al. 2017, Eq. 3, one shared
    forward per point)."""
    if name == "integrated_gradients":
        alphas, weights = path_points(int(options["n_steps"]), options["rule"])
        base = baseline_of(adapter, shared.full, options["baseline"]).detach()
        delta = points - base
        total = None
        for alpha, weight in zip(alphas.tolist(), weights.tolist(), strict=True):
            grads, _ = shared.gradients(base + alpha * delta, logits=False)
            total = weight * grads if total is None else total.add_(grads, alpha=weight)
        return total * shared.rows_of(delta), None
    grads, found = shared.gradients(points, logits=logits)
    return (grads * shared.rows_of(points) if name == "grad_x_input" else grads), found if logits else None


def _noised(
    adapter: ModelAdapter,
    generation: Generation,
    bound: dict[str, Any],
    rows_problem: Callable[[Forward], Problem],
    example: torch.Tensor,
    step: torch.Tensor,
    anchors: torch.Tensor,
    embeds: torch.Tensor,
    lengths: torch.Tensor,
) -> tuple[Problem, torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """SmoothGrad of every step row from shared noised passes (see :func:`explain_shared`).

    Row ``(b, t)`` noises its ``P_b + t`` positions with ``sigma_r z_k`` (:func:`~heedful.attribution.gradient._noise`):
    ``z_k`` at a position depends only on the tokens up to it, so it is the sequence's own draw
    there, and ``sigma_r`` (:func:`~heedful.attribution.gradient.prefix_scale` at the row's last
    position) changes only where a generated token widens the prefix's range of embedding values.
    The rows of a sequence with one ``sigma`` form a *run* (consecutive steps: the range only
    widens); each run is one noised sequence, cut after its last row's positions, and every
    sample takes one shared pass per run through the wrapped method (:func:`_per_dimension`),
    the copies of as many samples at once as their gradients fit in a quarter of ``max_memory``;
    the samples' maps are combined as the method combines them (:func:`~heedful.attribution.gradient.tunnel`).
    ``lengths`` ``[R]``: the rows' lengths ``P_b + t``; ``rows_problem``: the rows' problem from a
    reference pass; ``embeds`` ``[B, S, E]``: the sequences' input embeddings."""
    full = generation.batch
    nt_type, samples, multiply = bound["nt_type"], int(bound["n_samples"]), bool(bound["multiply_by_inputs"])
    aggregate = smoothgrad_aggregate(bound["inner"], nt_type, multiply, bound["aggregate"])
    sigma = prefix_scale(embeds, full.attention_mask.to(embeds.device), float(bound["noise_level"]))
    sigma = sigma[example.to(embeds.device), (lengths - 1).to(embeds.device)]  # [R]
    lengths = lengths.to(example.device)
    starts = torch.ones(len(example), dtype=torch.bool)
    starts[1:] = (example[1:] != example[:-1]) | (sigma[1:] != sigma[:-1]).cpu()
    run = starts.cumsum(0) - 1  # [R] each row's run
    first = starts.nonzero().squeeze(1)  # [V] each run's first row
    sequence = example[first]  # [V]
    cut = torch.zeros(len(first), dtype=torch.long).scatter_reduce(0, run, lengths, "amax")  # [V] positions each run needs
    runs = full.select(sequence.tolist())
    mask = runs.attention_mask * (torch.arange(runs.seq_len)[None, :] < cut[:, None]).to(runs.attention_mask.dtype)
    runs = replace(runs, attention_mask=mask).select(list(range(len(first))))  # trimmed to the longest run
    most = int(torch.bincount(run).max())  # rows of the largest run: the slots of a pass's backward
    rows, width, dim = len(example), int(lengths.max()), embeds.shape[-1]
    # samples a round: their gradients [rows x samples, width, E] within a quarter of the budget
    per_round = max(1, min(samples, adapter.max_memory // (4 * rows * width * dim * embeds.element_size())))
    if _groups(adapter, runs.lengths, most, bound.get("internal_batch_size")) is None:
        return None
    inner = find(bound["inner"])
    inner_options = inner.bind()
    problem = rows_problem(shared_reference(adapter, generation, example, step, head=generation.log_probs is None))
    clean = embeds[sequence.to(embeds.device), : runs.seq_len]  # [V, S, E]
    scale = sigma[first.to(sigma.device)][:, None, None, None]  # [V, 1, 1, 1]
    ids = runs.input_ids.to(embeds.device)
    run_anchors = anchors[sequence].clamp(max=cut[:, None] - 1)

    def maps():
        for low in range(0, samples, per_round):
            drawn = range(low, min(samples, low + per_round))
            k = len(drawn)
            z = prefix_normal(ids, runs.attention_mask, bound["seed"], drawn, dim)  # [V, k, S, E]
            points = (clean[:, None] + z.to(clean.dtype) * scale).transpose(0, 1).flatten(0, 1)  # [k V, S, E], sample-major
            copies = runs.select(list(range(len(first))) * k)
            copy = (run[None, :] + len(first) * torch.arange(k)[:, None]).flatten()  # [k R] each row copy's noised run
            shared = SharedSteps(
                adapter, copies, _groups(adapter, copies.lengths, most, bound.get("internal_batch_size")), run_anchors.repeat(k, 1),
                copy, step.repeat(k),
                problem.target.select(torch.arange(rows).repeat(k)), width,
            )
            values = _per_dimension(adapter, shared, inner.name, inner_options, points, logits=False)[0]
            yield from values.view(k, rows, *values.shape[1:])

    combined = tunnel(maps(), nt_type)
    if multiply:
        combined = combined * clean[run.to(clean.device), :width]
    return problem, example, step, aggregate_embedding(combined, aggregate)


def _groups(
    adapter: ModelAdapter, lengths: torch.Tensor, steps: int, rows: int | None, relevance: bool = False
) -> Groups | None:
    """Groups of sequences of real lengths ``lengths`` ``[B]`` run in one pass each, keeping
    its graph with ``steps`` anchors per sequence: ``(rows, width)`` pairs of similar length
    under the memory budget (at most ``rows`` sequences a pass when given); ``None`` when one
    sequence alone does not fit. ``relevance``: the pass runs under a rule set (eager
    attention, the hidden states kept for the language-model head's projection)."""
    need = Need(grad="saved", anchors=steps, eager=relevance, hidden_states=relevance)
    try:
        fit(adapter.shape, int(lengths.max()), adapter.max_memory, need, checkpoint=False, prefill=False)
    except InputError:
        return None

    def max_rows(width: int) -> int:
        return fit(adapter.shape, width, adapter.max_memory, need, checkpoint=False, prefill=False).rows

    return length_chunks(lengths, rows, max_rows=max_rows)


class SharedSteps:
    """The step rows of a generation's sequences ``full`` ``[B, S]`` computed from shared
    passes: row ``r`` is step ``step[r]`` of sequence ``example[r]``, read at
    ``anchors[b, t]`` (``[B, T]``), explaining ``target`` (of the ``R`` rows); ``width``: the
    step rows' width ``W``.

    The steps' backward passes run vmapped over their cotangents (``is_grads_batched``): the
    arithmetic of one backward per step, in larger matrix products (1.4x faster than one
    backward per step on smollm2-135m, ``benchmarks/generation_paths.py``). The whole pass
    (:meth:`_whole`) takes as many steps a call as their transient gradients fit beside the
    kept graph; :attr:`steps_per_backward` fixes that number (1: a plain backward per step)."""

    steps_per_backward: int | None = None
    rules: str | None = None
    """A rule set (``"attnlrp"``): the pass runs under it (:class:`~heedful.lrp.session.LRPSession`)
    and its gradients are the rules' modified ones, each row's score its target logit through the
    rule set's head projection (:func:`~heedful.lrp.propagate.explained_score`)."""
    segment: int | None = SEGMENT
    """Positions per segment of the swept pass of a decoder (:meth:`_swept`); ``None``: one
    pass over the whole sequences and a backward through all of it per step (:meth:`_whole`,
    which encoder–decoders and models whose own head runs always take)."""

    def __init__(
        self,
        adapter: ModelAdapter,
        full: Batch,
        groups: Groups,
        anchors: torch.Tensor,
        example: torch.Tensor,
        step: torch.Tensor,
        target: ResolvedTarget,
        width: int,
    ) -> None:
        self.adapter, self.full, self.groups, self.anchors = adapter, full, groups, anchors
        self.example, self.step, self.target, self.width = example, step, target, width
        lowest = torch.full((len(full),), int(step.max()) + 1, dtype=step.dtype).scatter_reduce(0, example, step, "amin")
        self.rank = step - lowest[example]
        """``[R]`` each row's rank among its sequence's rows (their steps are consecutive): its
        cotangent slot in the backward passes vmapped over a group's rows."""

    def rows_of(self, values: torch.Tensor) -> torch.Tensor:
        """Per-sequence values ``[B, S, E]`` as the step rows' ``[R, W, E]``, 0 past each row's
        own ``P_b + t`` positions (where its gradient is 0)."""
        return values[self.example.to(values.device), : self.width]

    def _steps_per_backward(self, rows: int, width: int) -> int:
        """Steps whose cotangents one backward carries over a group of ``rows`` sequences of
        ``width`` positions: a backward's transient values for ``n`` cotangents are taken as a
        forward's over ``n x rows`` sequences, within the budget the kept graph leaves."""
        shape, budget = self.adapter.shape, self.adapter.max_memory
        spare = budget - estimate(shape, rows, width, Need(grad="saved", anchors=self.anchors.shape[1]))
        return max(1, rows_within(shape, width, spare, FORWARD) // rows) if spare > 0 else 1

    def gradients(self, points: torch.Tensor, logits: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """``d score_r / d x`` ``[R, W, E]`` of every step row at input embeddings ``points``
        ``[B, S, E]`` of the sequences (one forward per group of sequences, keeping its graph,
        and backward passes from it), with the rows' logits ``[R, C]`` (without ``logits``:
        ``[R, 0]``). Without ``logits``, where a row's score reads only a few columns (a logit,
        not a log-probability) the swept pass (:meth:`_swept`) reads those alone at the head's
        input, not the ``R x D x C`` head -- on a large vocabulary the largest matrix product
        of the pass and of its backward."""
        grads = points.new_zeros(len(self.example), self.width, points.shape[-1])
        points = points.to(self.adapter.word_embeddings.weight.dtype)  # the inputs of a lowered copy rounded to it
        found: torch.Tensor | None = None
        with task(f"shared passes over {len(self.full)} sequences", total=len(self.example), shown=len(self.groups) > 1 or len(self.example) > 64) as done:
            for rows, width in self.groups:
                position = torch.full((len(self.full),), -1, dtype=torch.long)
                position[rows] = torch.arange(len(rows))
                mine = (position[self.example] >= 0).nonzero().squeeze(1)  # the group's step rows
                local = position[self.example[mine]]
                steps = self.step[mine]
                picked = None
                if self.segment is not None and self.adapter.is_decoder and self.adapter.unwindowed(width):
                    picked = self._swept(points, rows, width, mine, local, steps, grads, done, logits)
                if picked is None:
                    picked = self._whole(points, rows, width, mine, local, steps, grads, done)
                if found is None:
                    found = picked.new_zeros(len(self.example), picked.shape[-1] if logits else 0)
                if logits:
                    found[mine.to(found.device)] = picked
        assert found is not None
        return grads, found

    def _swept(self, points, rows, width, mine, local, steps, grads, done, logits: bool = True) -> torch.Tensor | None:
        """The group's rows ``mine`` (sequence ``local``, step ``steps``, ``[r]`` each) from one
        forward in position segments and one reverse sweep over them (decoders whose head's
        input the pass gives): each step's backward through its own prefix only, every
        segment's graph traversed once. Gradients are written into ``grads``; returns the
        rows' logits ``[r, C]``, or ``None`` where the pass gives no head input.

        Segment ``k`` (positions ``b_k .. b_{k+1} - 1``, :func:`segment_bounds`) continues the
        keys and values of the positions before it, passed in as leaves ``K_{<k}`` of its own
        graph. A row's cotangent slot is its rank among its sequence's rows (:attr:`rank`): slot
        ``s`` carries the gradient of each sequence's ``s``-th row's score, read at that row's
        anchor. Going back from the last segment, segment ``k`` takes, for the slots of rows
        anchored at ``a >= b_k``, their anchors' score gradients
        at the head's input and the gradients its later segments sent to its own keys and
        values (``dK_k``); one backward vmapped over those slots gives the rows' gradients on
        its embeddings and ``dK_{<k}``, which it adds to the earlier segments' -- the chain
        rule of ``K_{<k}`` feeding every later segment, summed before each segment's own
        backward. Multiply-adds: ``sum_t (P + t)`` positions of backward per sequence, against
        ``T (P + T)`` for :meth:`_whole`."""
        adapter = self.adapter
        at = self.anchors[rows][local, steps]  # [r] absolute anchor positions
        if int(torch.unique(local * (int(at.max()) + 1) + at).numel()) != len(at):
            return None  # two rows of a sequence read one position: their seeds would mix
        bounds = segment_bounds(at, self.segment or SEGMENT)
        slot = self.rank[mine]
        slots = int(slot.max()) + 1
        shape = adapter.shape
        kept = estimate(shape, len(rows), width, Need(grad="saved", anchors=self.anchors.shape[1]))
        spare = adapter.max_memory - kept - slots * len(rows) * shape.cache_bytes(bounds[-2])
        if spare <= 0:
            return None  # the gradients sent back to the keys and values do not fit beside the graph
        counted = adapter.counter.forward  # the segments make one pass per sequence
        swept = self._sweep_forward(points, rows, mine, local, at, bounds, logits)
        if swept is None:  # the model's own head ran: the whole pass instead
            adapter.counter.forward = counted
            return None
        picked, segments = swept
        adapter.counter.forward = counted + len(rows)
        self._sweep_back(segments, bounds, mine, local, at, spare, len(rows), grads, done)
        return picked

    def _sweep_forward(
        self, points: torch.Tensor, rows: torch.Tensor, mine: torch.Tensor, local: torch.Tensor, at: torch.Tensor, bounds: list[int],
        logits: bool = True,
    ) -> tuple[torch.Tensor, list[_Segment]] | None:
        """The forward half of :meth:`_swept`: segment after segment, each continuing the
        previous one's keys and values as fresh leaves; returns the rows' logits ``[r, C]`` and
        every segment's graph with its anchors' score gradients at the head's input, or
        ``None`` where the pass gives no head input. Without ``logits``, for a score of logits
        (``quantity="logit"``, no rule set) the head is read at the target's columns alone
        (:meth:`~heedful.adapters.ModelAdapter.head_logits`) and the logits come back ``[r, 0]``."""
        adapter, device = self.adapter, points.device
        columns = not logits and self.rules is None and self.target.quantity == "logit" and not self.target.is_span
        group = torch.arange(len(rows))
        mask = self.full.attention_mask[rows, : bounds[-1]]
        release = bool(keeps_graph(adapter, self.full.lengths[rows], self.anchors.shape[1]))
        picked: torch.Tensor | None = None
        segments: list[_Segment] = []
        states = None
        session = LRPSession(adapter, rule_set(self.rules)) if self.rules is not None else contextlib.nullcontext()
        with session, torch.enable_grad():
            for start, stop in zip(bounds[:-1], bounds[1:], strict=True):
                inside = ((at >= start) & (at < stop)).nonzero().squeeze(1)  # the rows anchored here
                positions = torch.unique(at[inside])  # [K] the segment's anchor positions
                leaf = points[rows.to(device), start:stop].detach().requires_grad_(True)
                past = None
                if states is not None:
                    past = PrefixStates(
                        tuple(t.detach().requires_grad_(True) for t in states.keys),
                        tuple(t.detach().requires_grad_(True) for t in states.values),
                    )
                anchor = (positions - start)[None].expand(len(rows), -1)
                fwd = adapter.forward(
                    self.full, anchor, inputs_embeds=leaf, attention_mask=mask[:, :stop],
                    prefix=None if past is None else (past, group, start), keep_cache=True, release=release, head=not columns,
                )
                if fwd.head_input is None or fwd.cache is None:
                    return None
                column = torch.searchsorted(positions, at[inside])  # each row's anchor among the segment's
                where = (local[inside].to(fwd.logits.device), column.to(fwd.logits.device))
                row_logits = widened(fwd.logits[where])
                if columns:  # each row's target columns alone: sum_k w_k logit_k (ResolvedTarget.score)
                    target = self.target.select(mine[inside])
                    read = widened(adapter.head_logits(fwd.head_input[where], target.classes.to(device)))
                    scores = (read * target.weights.to(read)).sum(dim=1)
                elif self.rules is None:
                    scores = self.target.select(mine[inside]).score(row_logits)
                else:  # each row's target logit through the rule set's head projection
                    feats = adapter.lm_head_parts().transform(fwd.head_input[where])
                    scores = explained_score(Prepared(session, rows, stop, leaf, row_logits, feats), adapter, self.target.select(mine[inside]))
                (seeds,) = torch.autograd.grad(scores.sum(), fwd.head_input, retain_graph=True)
                if picked is None:
                    picked = row_logits.new_zeros(len(mine), row_logits.shape[-1])
                picked[inside.to(picked.device)] = row_logits.detach()
                states = fwd.cache
                outputs = (*(k[:, :, start:] for k in fwd.cache.keys), *(v[:, :, start:] for v in fwd.cache.values))
                segments.append(_Segment(start, stop, inside, positions, seeds, fwd.head_input, outputs, leaf, past))
                del fwd, row_logits, scores
        assert picked is not None
        return picked, segments

    def _sweep_back(
        self,
        segments: list[_Segment],
        bounds: list[int],
        mine: torch.Tensor,
        local: torch.Tensor,
        at: torch.Tensor,
        spare: int,
        sequences: int,
        grads: torch.Tensor,
        done: Any,
    ) -> None:
        """The reverse half of :meth:`_swept`: from the last segment to the first, one backward
        vmapped over the slots anchored at or after each (chunked to fit ``spare`` bytes),
        seeded with its anchors' score gradients and the ``dK``, ``dV`` its later segments sent;
        writes the rows' gradients on each segment's embeddings into ``grads``. Consumes
        ``segments``."""
        adapter, device = self.adapter, grads.device
        slot = self.rank[mine]  # every row's slot
        slots = int(slot.max()) + 1
        sent: list[torch.Tensor] | None = None  # dK, dV of every layer: [slots, B, H, positions, d]
        while segments:
            start, stop, inside, positions, seeds, read, outputs, leaf, past = segments.pop()
            sources = [leaf, *(() if past is None else (*past.keys, *past.values))]
            covered = (at >= start).nonzero().squeeze(1)  # the rows whose prefix reaches this segment
            per_call = max(1, rows_within(adapter.shape, stop - start, spare, FORWARD) // sequences)
            first = int(slot[covered].min()) if covered.numel() else slots  # the first slot anchored at or after this segment
            while first < slots:
                last = min(slots, first + per_call)
                n = last - first
                cotangent = seeds.new_zeros(n, *read.shape)
                here = inside[(slot[inside] >= first) & (slot[inside] < last)]
                seq, column = local[here].to(read.device), torch.searchsorted(positions, at[here]).to(read.device)
                cotangent[(slot[here] - first).to(read.device), seq, column] = seeds[seq, column]
                wanted, given = [read], [cotangent]
                if sent is not None and stop < bounds[-1]:  # the last segment's keys and values feed nothing
                    wanted.extend(outputs)
                    given.extend(d[first:last, :, :, start:stop] for d in sent)
                adapter.counter.backward += here.numel()
                found = _vjp(wanted, sources, given, n, retain=last < slots)
                mine_now = covered[(slot[covered] >= first) & (slot[covered] < last)]
                g = found[0][(slot[mine_now] - first).to(device), local[mine_now].to(device)]
                grads[mine[mine_now].to(device), start:stop] = g.to(grads.dtype)
                if past is not None:
                    if sent is None:  # reached first from the last segment, whose past is every earlier position
                        sent = [d.new_zeros(slots, *d.shape[1:]) for d in found[1:]]
                    for total, d in zip(sent, found[1:], strict=True):
                        total[first:last, :, :, : d.shape[3]] += d
                done.advance(here.numel())
                del found, g
                first = last
            del outputs, read, leaf, past, sources

    def _under_rules(self, points, rows, width, mine, local, steps) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The group's forward under :attr:`rules`: its embeddings leaf ``[b, width, E]``, the
        rows' logits ``[r, C]`` and their explained scores ``[r]`` (each step's target logit
        through the rule set's head projection, :func:`~heedful.lrp.propagate.explained_score`)."""
        prepared = lrp_forward(self.adapter, self.full, self.anchors, rule_set(self.rules), rows, width, points)
        at = (local.to(prepared.logits.device), steps.to(prepared.logits.device))
        rows_only = replace(prepared, feats=None if prepared.feats is None else prepared.feats[at], logits=prepared.logits[at])
        scores = explained_score(rows_only, self.adapter, self.target.select(mine))
        return prepared.embeds, widened(rows_only.logits), scores

    def _whole(self, points, rows, width, mine, local, steps, grads, done) -> torch.Tensor:
        """As :meth:`_swept`, from one pass over the whole sequences: every step's backward runs
        through all ``width`` positions, vmapped over the steps (encoder–decoders, which have no
        cache to cut the pass at, and models whose own head runs)."""
        adapter, full, device = self.adapter, self.full, points.device
        if self.rules is not None:
            leaf, picked, scores = self._under_rules(points, rows, width, mine, local, steps)
            read = None  # the rules' head projection runs per row: the steps start from the scores
        else:
            inputs = full.cut(rows, width)
            del inputs["input_ids"]
            leaf = points[rows.to(device), :width].detach().requires_grad_(True)
            release = keeps_graph(adapter, full.lengths[rows], self.anchors.shape[1])
            with torch.enable_grad():
                fwd = adapter.forward(full, self.anchors[rows], inputs_embeds=leaf, release=bool(release), **inputs)
                picked = widened(fwd.logits[local.to(fwd.logits.device), steps.to(fwd.logits.device)])  # [r, C]
                scores = self.target.select(mine).score(picked)
            read = fwd.head_input
        rank = self.rank[mine]
        last = int(rank.max())
        cut = min(width, self.width)
        per_call = self.steps_per_backward or self._steps_per_backward(len(rows), width)
        seeds = None
        if read is not None:
            # each row's score through the head once, [r] rows: the steps' backward passes then
            # start from the head's input, not from n x B x T rows of the head's C outputs
            (seeds,) = torch.autograd.grad(scores.sum(), read, retain_graph=True)
            where = (local.to(read.device), steps.to(read.device))
        for first in range(0, last + 1, per_call):
            # each sequence's rows of ranks first .. first + n - 1 in one backward vmapped over their cotangents
            n = min(per_call, last + 1 - first)
            at = ((rank >= first) & (rank < first + n)).nonzero().squeeze(1)
            if at.numel() == 0:
                continue
            adapter.counter.backward += at.numel()
            retain = first + n <= last
            slot = rank[at] - first
            if seeds is None:
                g = _backward(scores[at.to(scores.device)], leaf, slot, n, retain)
            else:
                g = _seeded_backward(read, seeds, tuple(w[at.to(read.device)] for w in where), slot, n, leaf, retain)
            grads[mine[at].to(device), :cut] = g[slot.to(device), local[at].to(device), :cut].to(grads.dtype)
            done.advance(at.numel())
            del g
        return picked.detach()


def segment_bounds(anchors: torch.Tensor, size: int) -> list[int]:
    """Position segments for anchors ``[r]``: ``[0, a_min + 1, a_min + 1 + size, ...]`` up to
    past the last anchor -- the first segment ends at the earliest anchor (the prompt, which
    every step reads), each later one holds ``size`` positions."""
    first, last = int(anchors.min()) + 1, int(anchors.max()) + 1
    return [0, *range(first, last, size), last]


def _vjp(
    outputs: list[torch.Tensor], inputs: list[torch.Tensor], cotangents: list[torch.Tensor], n: int, retain: bool
) -> tuple[torch.Tensor, ...]:
    """The vector–Jacobian products of ``outputs`` for ``n`` cotangents each (``[n, *shape]``),
    with respect to ``inputs``: ``[n, *input.shape]`` each (zeros where an input is not
    reached), in one backward vmapped over the ``n``."""
    common = {"allow_unused": True, "materialize_grads": True, "retain_graph": retain}
    if n == 1:
        found = torch.autograd.grad(outputs, inputs, grad_outputs=[c[0] for c in cotangents], **common)
        return tuple(f[None] for f in found)
    return torch.autograd.grad(outputs, inputs, grad_outputs=cotangents, is_grads_batched=True, **common)


def _seeded_backward(
    read: torch.Tensor,
    seeds: torch.Tensor,
    where: tuple[torch.Tensor, torch.Tensor],
    slot: torch.Tensor,
    n: int,
    leaf: torch.Tensor,
    retain: bool,
) -> torch.Tensor:
    """``d score / d leaf`` as ``[n, B, N, E]`` from the head's input ``read`` ``[B, T, D]``:
    the rows at ``where = (sequence, step)`` (``[m]`` each) carry their scores' gradients
    ``seeds`` there, row ``i`` in cotangent slot ``slot[i]`` -- the chain rule through the head
    taken once per row instead of once per slot."""
    cotangents = seeds.new_zeros(n, *read.shape)
    rows, steps = where
    cotangents[slot.to(read.device), rows, steps] = seeds[rows, steps]
    return _vjp([read], [leaf], [cotangents], n, retain)[0]


def _backward(scores: torch.Tensor, leaf: torch.Tensor, slot: torch.Tensor, n: int, retain: bool) -> torch.Tensor:
    """``d scores / d leaf`` as ``[n, B, N, E]``: score ``i`` in cotangent slot ``slot[i]``
    (``[m]``), the ``n`` cotangents in one backward vmapped over them (``is_grads_batched``)
    -- the arithmetic of ``n`` backward passes in larger matrix products."""
    onehot = torch.nn.functional.one_hot(slot.to(scores.device), n).T.to(scores)  # [n, m]
    return _vjp([scores], [leaf], [onehot], n, retain)[0]
