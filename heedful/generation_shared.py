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

Prompts run in groups of similar length, as many per pass as keeping the pass's graph allows
under the adapter's ``max_memory`` (:func:`heedful.engine.memory.fit`); a sequence whose graph does
not fit at all, and a forward at a lowered precision, take the per-step path.
"""

from __future__ import annotations

from typing import Any

import torch

from heedful.adapters import Forward, ModelAdapter
from heedful.attribution.gradient import aggregate_embedding, baseline_of, path_points
from heedful.engine.batch import Batch
from heedful.engine.chunks import length_chunks
from heedful.engine.memory import FORWARD, Need, estimate, fit, rows_within
from heedful.engine.precision import active_precision
from heedful.engine.problem import Problem
from heedful.engine.runner import keeps_graph
from heedful.engine.targets import ResolvedTarget, resolve_target
from heedful.errors import InputError
from heedful.generation import Generation, shared_reference, step_request, step_rows
from heedful.progress import task
from heedful.registry import MethodInfo

SHARED = ("saliency", "grad_x_input", "integrated_gradients")
"""The methods with a shared-prefix path."""

Groups = list[tuple[torch.Tensor, int]]


def explain_shared(
    adapter: ModelAdapter, generation: Generation, info: MethodInfo, bound: dict[str, Any], quantity: str
) -> tuple[Problem, torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """Every step of ``generation`` explained by ``info`` (with options ``bound``) through
    shared forward passes: ``(problem, example, step, scores)`` -- the step rows' problem (as
    :func:`~heedful.generation.prepare_steps` builds it), the rows' example and step ``[R]``,
    and the scores ``[R, W]`` -- equal to the per-step path's to float rounding; ``None``
    where the method has no shared path or it cannot run (see the module docstring)."""
    if info.name not in SHARED or active_precision() != adapter.precision:
        return None
    full = generation.batch
    longest = max(generation.steps)
    groups = _groups(adapter, full.lengths, longest, bound.get("internal_batch_size"))
    if groups is None:
        return None
    batch, example, step = step_rows(generation)
    request = step_request(adapter, generation, example, step)
    target = resolve_target(request, adapter, batch.lengths - 1, "last", torch.empty(0))
    target.quantity = quantity
    prompt = torch.tensor(generation.prompt_lengths)
    # where each sequence's step t is read: P_b + t - 1 (steps past a short continuation re-read its last)
    anchors = (prompt[:, None] - 1 + torch.arange(longest)[None, :]).clamp(max=full.lengths[:, None] - 1)
    embeds = adapter.embed(full.input_ids.to(adapter.device)).detach()
    shared = SharedSteps(adapter, full, groups, anchors, example, step, target, batch.seq_len)
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
        and one backward per step of the group), with the rows' logits ``[R, C]``."""
        adapter, full = self.adapter, self.full
        device = points.device
        grads = points.new_zeros(len(self.example), self.width, points.shape[-1])
        logits: torch.Tensor | None = None
        with task(f"shared passes over {len(full)} sequences", total=len(self.example), shown=len(self.groups) > 1 or len(self.example) > 64) as done:
            for rows, width in self.groups:
                inputs = full.cut(rows, width)
                del inputs["input_ids"]
                leaf = points[rows.to(device), :width].detach().requires_grad_(True)
                position = torch.full((len(full),), -1, dtype=torch.long)
                position[rows] = torch.arange(len(rows))
                mine = (position[self.example] >= 0).nonzero().squeeze(1)  # the group's step rows
                local = position[self.example[mine]]
                release = keeps_graph(adapter, full.lengths[rows], self.anchors.shape[1])
                with torch.enable_grad():
                    fwd = adapter.forward(full, self.anchors[rows], inputs_embeds=leaf, release=bool(release), **inputs)
                    picked = fwd.logits[local.to(fwd.logits.device), self.step[mine].to(fwd.logits.device)]  # [r, C]
                    scores = self.target.select(mine).score(picked)
                if logits is None:
                    logits = picked.new_zeros(len(self.example), picked.shape[-1])
                logits[mine.to(device)] = picked.detach()
                steps = self.step[mine]
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
                    more = first + n <= last
                    if n == 1:
                        (g,) = torch.autograd.grad(scores[at.to(scores.device)].sum(), leaf, retain_graph=more)
                        found = g[local[at].to(device)]
                    else:
                        onehot = torch.nn.functional.one_hot(steps[at] - first, n).T.to(scores)  # [n, r_at]
                        (g,) = torch.autograd.grad(scores[at.to(scores.device)], leaf, grad_outputs=onehot, is_grads_batched=True, retain_graph=more)
                        found = g[(steps[at] - first).to(device), local[at].to(device)]
                    grads[mine[at].to(device), :cut] = found[:, :cut]
                    done.advance(at.numel())
                    del g, found
                del fwd, picked, scores, leaf
        assert logits is not None
        return grads, logits
