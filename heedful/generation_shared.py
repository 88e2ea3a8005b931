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
SmoothGrad has no shared path: its noise is drawn per step row, seeded by the row's own prefix
text (:func:`heedful.engine.seeding.example_generators`), so two steps never see the same noised
prefix.

Each step's backward spans the whole pass; :attr:`SharedSteps.segment` runs the pass instead in
position segments with the key/value cache kept in the graph, so that a step's backward spans
only the segments up to its own (its prefix): fewer multiply-adds, but slower where reading
the weights dominates a small product (measured, see there), so it is not the default.

Prompts run in groups of similar length, as many per pass as keeping the pass's graph allows
under the adapter's ``max_memory`` (:func:`heedful.engine.memory.fit`); a sequence whose graph does
not fit at all, and a forward at a lowered precision, take the per-step path.
``precision="bf16"`` (:func:`generation_precision`) runs the shared passes, forward and backward,
on the model's bfloat16 copy.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from heedful.adapters import Forward, ModelAdapter
from heedful.attribution.gradient import aggregate_embedding, baseline_of, path_points
from heedful.engine.batch import Batch
from heedful.engine.chunks import length_chunks
from heedful.engine.memory import FORWARD, Need, estimate, fit, rows_within
from heedful.engine.precision import active_precision, check_precision, resolve_precision, widened
from heedful.engine.problem import Problem
from heedful.engine.runner import keeps_graph
from heedful.engine.targets import ResolvedTarget, resolve_target
from heedful.errors import InputError
from heedful.generation import Generation, shared_reference, step_request, step_rows
from heedful.progress import task
from heedful.registry import MethodInfo

SHARED = ("saliency", "grad_x_input", "integrated_gradients")
"""The methods with a shared-prefix path."""

CANCELLING = ("integrated_gradients",)
"""Methods whose scores are sums that cancel, so that bfloat16 gradients move them far more
than rounding: on ``smollm2-135m`` (``benchmarks/results/generation.md``) integrated
gradients through bfloat16 passes differed from float32 by up to 84 % of the largest score,
saliency and gradient x input by 2.5 % and 7 %."""


class CancellationWarning(UserWarning):
    """A lower precision asked of a method whose sums cancel (:data:`CANCELLING`)."""

Groups = list[tuple[torch.Tensor, int]]


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
            "smollm2-135m the scores moved by up to 84 % of the largest one (benchmarks/results/generation.md); "
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
    if info.name not in SHARED or active_precision() != adapter.precision:
        return None
    full = generation.batch
    longest = max(generation.steps)
    groups = _groups(adapter, full.lengths, longest, bound.get("internal_batch_size"))
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
    shared = SharedSteps(adapter.at_precision(precision), full, groups, anchors, example, step, target, batch.seq_len)
    if info.name == "integrated_gradients":
        alphas, weights = path_points(int(bound["n_steps"]), bound["rule"])
        base = baseline_of(adapter, full, bound["baseline"]).detach()
        delta = embeds - base
        total = None
        for alpha, weight in zip(alphas.tolist(), weights.tolist(), strict=True):
            grads, _ = shared.gradients(base + alpha * delta)
            total = weight * grads if total is None else total.add_(grads, alpha=weight)
        # the rows' reference logits at the input itself, which no point of the path is
        reference = shared_reference(adapter, generation, example, step)
        values = total * shared.rows_of(delta)
    else:
        grads, logits = shared.gradients(embeds)
        reference = Forward(logits=logits)
        values = grads * shared.rows_of(embeds) if info.name == "grad_x_input" else grads
    problem = Problem(adapter, batch, target, reference, request)
    return problem, example, step, aggregate_embedding(values, bound["aggregate"])


def _groups(adapter: ModelAdapter, lengths: torch.Tensor, steps: int, rows: int | None) -> Groups | None:
    """Groups of sequences of real lengths ``lengths`` ``[B]`` run in one pass each, keeping
    its graph with ``steps`` anchors per sequence: ``(rows, width)`` pairs of similar length
    under the memory budget (at most ``rows`` sequences a pass when given); ``None`` when one
    sequence alone does not fit."""
    need = Need(grad="saved", anchors=steps)
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

    The steps' backward passes run vmapped over their cotangents (``is_grads_batched``), as
    many steps a call as their transient gradients fit beside the kept graph: the arithmetic
    of one backward per step, in larger matrix products (1.4x faster than one backward per step
    on smollm2-135m, ``benchmarks/generation_paths.py``). :attr:`steps_per_backward` fixes that
    number (1: a plain backward per step)."""

    steps_per_backward: int | None = None
    segment: int | None = None
    """Positions per segment of a segmented pass (:meth:`_segmented`); ``None``: one pass over
    the whole sequences (:meth:`_whole`), the default because it measured faster: 47 s against
    264 s (segments of 4) for 2 prompts x 8 steps on smollm2-135m, 2 threads, on a loaded
    2-core machine (``benchmarks/generation_paths.py --segment``). Segments cut the backward's
    arithmetic to each step's prefix (about 1.5x fewer multiply-adds at 16 x 20), but a
    segment's backward re-runs every earlier segment's small matrix products, and on a CPU a
    product of this size costs the read of its weights more than its rows (8x the ``mm``
    calls at the same time each)."""

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

    def gradients(self, points: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``d score_r / d x`` ``[R, W, E]`` of every step row at input embeddings ``points``
        ``[B, S, E]`` of the sequences (one forward per group of sequences, keeping its graph,
        and backward passes from it), with the rows' logits ``[R, C]``."""
        grads = points.new_zeros(len(self.example), self.width, points.shape[-1])
        points = points.to(self.adapter.word_embeddings.weight.dtype)  # the inputs of a lowered copy rounded to it
        logits = torch.empty(0)
        with task(f"shared passes over {len(self.full)} sequences", total=len(self.example), shown=len(self.groups) > 1 or len(self.example) > 64) as done:
            for rows, width in self.groups:
                position = torch.full((len(self.full),), -1, dtype=torch.long)
                position[rows] = torch.arange(len(rows))
                mine = (position[self.example] >= 0).nonzero().squeeze(1)  # the group's step rows
                local = position[self.example[mine]]
                steps = self.step[mine]
                run = self._segmented if self.adapter.is_decoder and self.segment is not None else self._whole
                picked = run(points, rows, width, mine, local, steps, grads, done)
                if logits.numel() == 0:
                    logits = picked.new_zeros(len(self.example), picked.shape[-1])
                logits[mine.to(logits.device)] = picked
        return grads, logits

    def _segmented(self, points, rows, width, mine, local, steps, grads, done) -> torch.Tensor:
        """The group's rows ``mine`` (sequence ``local``, step ``steps``, ``[r]`` each) through one
        forward in position segments (:meth:`~heedful.adapters.ModelAdapter.forward_segments`)
        and per segment the backward of its anchors' scores, through that segment and those
        before it only -- each step's backward restricted to its prefix, up to the segment's
        end: its gradients written into ``grads``; returns the rows' logits ``[r, C]``."""
        assert self.segment is not None
        adapter, device = self.adapter, points.device
        at = self.anchors[rows][local, steps]  # [r] absolute anchor positions
        bounds = segment_bounds(at, self.segment)
        end = bounds[-1]
        leaf = points[rows.to(device), :end].detach().requires_grad_(True)
        which = torch.bucketize(at, torch.tensor(bounds[1:]), right=True)  # each row's segment
        members = [(which == k).nonzero().squeeze(1) for k in range(len(bounds) - 1)]
        with torch.enable_grad():
            found = adapter.forward_segments(
                leaf, self.full.attention_mask[rows, :end], bounds, [(local[m], at[m]) for m in members]
            )
            found = [widened(f) for f in found]
            scores = [self.target.select(mine[m]).score(f) for m, f in zip(members, found, strict=True)]
        picked = torch.cat([f.detach() for f in found])
        order = torch.cat(members)
        per_call = self.steps_per_backward or self._steps_per_backward(len(rows), end)
        calls = []  # (segment, the segment's rows in this call, their cotangent slots, slots)
        for k, m in enumerate(members):
            # cotangent i: the rows anchored at the i-th position of the call (one per sequence)
            offset = at[m] - bounds[k]
            size = bounds[k + 1] - bounds[k]
            for first in range(0, size, per_call):
                n = min(per_call, size - first)
                sel = ((offset >= first) & (offset < first + n)).nonzero().squeeze(1)
                if sel.numel():
                    calls.append((k, m[sel], offset[sel] - first, n))
        for i, (k, m, slot, n) in enumerate(calls):
            adapter.counter.backward += m.numel()
            part = torch.searchsorted(members[k], m)  # the rows' places in the segment's scores
            g = _backward(scores[k][part.to(scores[k].device)], leaf, slot, n, i < len(calls) - 1)
            grads[mine[m].to(device), :end] = g[slot.to(device), local[m].to(device)].to(grads.dtype)
            done.advance(m.numel())
            del g
        result = picked.new_empty(picked.shape)
        result[order.to(picked.device)] = picked
        return result

    def _whole(self, points, rows, width, mine, local, steps, grads, done) -> torch.Tensor:
        """As :meth:`_segmented`, from one pass over the whole sequences: every step's backward
        runs through all ``width`` positions (encoder–decoders, which have no cache to cut the
        pass at)."""
        adapter, full, device = self.adapter, self.full, points.device
        inputs = full.cut(rows, width)
        del inputs["input_ids"]
        leaf = points[rows.to(device), :width].detach().requires_grad_(True)
        release = keeps_graph(adapter, full.lengths[rows], self.anchors.shape[1])
        with torch.enable_grad():
            fwd = adapter.forward(full, self.anchors[rows], inputs_embeds=leaf, release=bool(release), **inputs)
            picked = widened(fwd.logits[local.to(fwd.logits.device), steps.to(fwd.logits.device)])  # [r, C]
            scores = self.target.select(mine).score(picked)
        last = int(steps.max())
        cut = min(width, self.width)
        per_call = self.steps_per_backward or self._steps_per_backward(len(rows), width)
        for first in range(0, last + 1, per_call):
            # steps first .. first + n - 1 in one backward vmapped over their cotangents
            n = min(per_call, last + 1 - first)
            at = ((steps >= first) & (steps < first + n)).nonzero().squeeze(1)
            if at.numel() == 0:
                continue
            adapter.counter.backward += at.numel()
            g = _backward(scores[at.to(scores.device)], leaf, steps[at] - first, n, first + n <= last)
            grads[mine[at].to(device), :cut] = g[(steps[at] - first).to(device), local[at].to(device), :cut].to(grads.dtype)
            done.advance(at.numel())
            del g
        return picked.detach()


def segment_bounds(anchors: torch.Tensor, size: int) -> list[int]:
    """Position segments for anchors ``[r]``: ``[0, a_min + 1, a_min + 1 + size, ...]`` up to
    past the last anchor -- the first segment ends at the earliest anchor (the prompt, which
    every step reads), each later one holds ``size`` positions."""
    first, last = int(anchors.min()) + 1, int(anchors.max()) + 1
    return [0, *range(first, last, size), last]


def _backward(scores: torch.Tensor, leaf: torch.Tensor, slot: torch.Tensor, n: int, retain: bool) -> torch.Tensor:
    """``d scores / d leaf`` as ``[n, B, N, E]``: score ``i`` in cotangent slot ``slot[i]``
    (``[m]``), the ``n`` cotangents in one backward vmapped over them (``is_grads_batched``)
    -- the arithmetic of ``n`` backward passes in larger matrix products."""
    if n == 1:
        (g,) = torch.autograd.grad(scores.sum(), leaf, retain_graph=retain)
        return g[None]
    onehot = torch.nn.functional.one_hot(slot.to(scores.device), n).T.to(scores)  # [n, m]
    (g,) = torch.autograd.grad(scores, leaf, grad_outputs=onehot, is_grads_batched=True, retain_graph=retain)
    return g
