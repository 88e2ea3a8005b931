"""The one batched runner: many perturbed, interpolated or noised copies of each example, run
through the model in chunks of similar length under a token and a memory budget, results
scattered back.

A method describes its copies as :class:`Copies` -- which example each row stands for, and
either its perturbed ids (leave-one-out, LIME, KernelSHAP, RISE, TDD, the faithfulness curves)
or a builder of its input embeddings (integrated gradients' path points, SmoothGrad's noised
copies) -- and a :class:`Runner` does the rest: :meth:`Runner.chunks` cuts the rows into chunks
of similar length (:func:`~heedful.engine.chunks.length_chunks`: least padding plus a per-chunk
overhead, each chunk cut to its longest row, holding at most ``budget`` token positions and at
most the rows whose estimated peak memory fits the adapter's ``max_memory``,
:mod:`heedful.engine.memory`), :meth:`Runner.map` runs them forward and scatters per-row values back,
:meth:`Runner.gradients` runs them forward and backward and sums the input gradients per
example. Where not even one row fits, a backward runs with per-block gradient checkpointing and
a decoder's forward in position chunks with its key/value cache (chunked prefill); where that
does not fit either, an :class:`~heedful.errors.InputError` comes from the planning, before
any pass. Right padding never changes a real position's output, so chunking changes the cost
of a method, not its result (beyond float rounding). Passes are counted by the adapter
(``adapter.counter``) and chunks here (:attr:`Runner.passes`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import torch

from heedful.adapters import Forward, ModelAdapter
from heedful.engine.batch import Batch
from heedful.engine.chunks import CHUNK_OVERHEAD, TOKEN_BUDGET, length_chunks
from heedful.engine.memory import FORWARD, Fit, Need, estimate, fit, near_budget, together
from heedful.engine.perturb import Perturbed
from heedful.engine.precision import widened
from heedful.engine.targets import ResolvedTarget
from heedful.progress import task

__all__ = ["CHUNK_OVERHEAD", "TOKEN_BUDGET", "Chunk", "Copies", "Runner", "keeps_graph", "length_chunks"]

EmbedBuilder = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]
"""``embeds(rows, example, width) -> [r, width, E]``: input embeddings of copies ``rows`` (of
examples ``example``), cut to ``width`` positions."""


@dataclass
class Copies:
    """``R`` rows, row ``r`` a copy of example ``example[r]`` of a batch.

    Perturbed ids: ``input_ids`` / ``attention_mask`` (/ ``token_type_ids``) ``[R, N']``, right
    padded (their own width). Edited embeddings: ``embeds`` builds the rows' input embeddings per
    chunk (:data:`EmbedBuilder`); the rows keep their example's mask and token types. ``anchor``
    ``[R]``: where each row's head output is read (default: its example's anchor).
    """

    example: torch.Tensor
    input_ids: torch.Tensor | None = None
    attention_mask: torch.Tensor | None = None
    token_type_ids: torch.Tensor | None = None
    anchor: torch.Tensor | None = None
    embeds: EmbedBuilder | None = None

    @classmethod
    def of(cls, perturbed: Perturbed, example: torch.Tensor) -> Copies:
        """Copies from perturbed ids (:func:`heedful.engine.perturb.remove_tokens`)."""
        return cls(example, perturbed.input_ids, perturbed.attention_mask, perturbed.token_type_ids, perturbed.anchor)

    def __len__(self) -> int:
        return self.example.shape[0]

    def lengths(self, batch: Batch) -> torch.Tensor:
        """Real length of every row ``[R]``."""
        if self.attention_mask is not None:
            return self.attention_mask.sum(dim=1)
        return batch.lengths[self.example]


@dataclass
class Chunk:
    """Rows ``rows`` (indices into the copies) of examples ``example``, cut to ``width``
    positions; ``target``: the rows' target with each row's anchor; ``need``: how its pass
    runs within the memory budget (gradient checkpointing, chunked prefill; see
    :func:`heedful.engine.memory.fit`); ``release``: its pass is near the budget and gives the heap's
    free pages back after each block (:func:`heedful.engine.memory.near_budget`)."""

    rows: torch.Tensor
    example: torch.Tensor
    width: int
    target: ResolvedTarget
    inputs: dict
    need: Need = FORWARD
    release: bool = False


def anchors_of(target: ResolvedTarget) -> int:
    """Positions per row where the head is read: ``K`` for a span target, else 1."""
    read = target.read_at
    return int(read.shape[1]) if read.dim() == 2 else 1


def keeps_graph(adapter: ModelAdapter, lengths: torch.Tensor, anchors: int = 1) -> bool | None:
    """Whether one pass over rows of real lengths ``lengths`` ``[R]`` that keeps its autograd
    graph for one later backward (a gradient method's reference pass: its length chunks'
    graphs all alive at once) stays under the adapter's ``max_memory`` -- the sum of its
    chunks' estimates (:func:`heedful.engine.memory.together`): ``None`` when it does not, else
    whether it is near the budget (its passes should give the heap's free pages back after
    each block, :func:`heedful.engine.memory.near_budget`)."""
    parts = [(len(rows), width) for rows, width in length_chunks(lengths)]
    needed = together(adapter.shape, parts, Need(grad="saved", anchors=anchors))
    if needed > adapter.max_memory:
        return None
    return near_budget(needed, adapter.max_memory)


class Runner:
    """Runs :class:`Copies` of the examples of ``batch`` (explaining ``target``) through
    ``adapter``'s model in chunks (see the module docstring).

    ``budget``: token positions per chunk; ``rows``: a fixed number of rows per chunk instead
    (a method's ``internal_batch_size``); ``overhead``: what one more chunk costs, in cells;
    ``max_memory``: bytes one pass may use (default and upper bound: the adapter's
    ``max_memory``). A chunk holds the fewest rows of these bounds.
    """

    def __init__(
        self,
        adapter: ModelAdapter,
        batch: Batch,
        target: ResolvedTarget,
        *,
        budget: int = TOKEN_BUDGET,
        rows: int | None = None,
        overhead: int = CHUNK_OVERHEAD,
        max_memory: int | None = None,
    ) -> None:
        self.adapter = adapter
        self.batch = batch
        self.target = target
        self.budget = budget
        self.rows = rows
        self.overhead = overhead
        self.max_memory = adapter.max_memory if max_memory is None else min(max_memory, adapter.max_memory)
        self.passes = 0

    def fit(self, width: int, need: Need = FORWARD, **options) -> Fit:
        """How passes over rows of ``width`` positions that keep ``need`` fit the runner's
        memory budget (:func:`heedful.engine.memory.fit`; ``options``: ``checkpoint``, ``prefill``,
        ``group``)."""
        return fit(self.adapter.shape, width, self.max_memory, need, **options)

    @classmethod
    def for_problem(cls, problem, **options) -> Runner:
        """A runner over a :class:`~heedful.Problem`'s batch and target."""
        return cls(problem.adapter, problem.batch, problem.target, **options)

    # ------------------------------------------------------------------ the loop
    def plan(
        self,
        lengths: torch.Tensor,
        row_cells: int = 1,
        budget: int | None = None,
        need: Need = FORWARD,
        *,
        bounded: bool = False,
        mask: torch.Tensor | None = None,
    ) -> list[tuple[torch.Tensor, int]]:
        """Chunks of rows of ``lengths`` ``[R]``: ``(rows, width)`` pairs (:func:`length_chunks`)
        under ``budget`` token positions (default the runner's) and with no more rows than
        passes keeping ``need`` fit the memory budget (:meth:`need_of`), each row standing for
        ``row_cells`` sequences. ``bounded``: the passes run through :meth:`forward`, which
        checkpoints a backward or prefills a decoder's forward in position chunks where one row
        does not fit (see :meth:`chunks`); otherwise a row that does not fit is an
        :class:`InputError` here, before any pass. ``mask`` ``[R, N']``: the rows' attention
        masks when they are not the batch's."""
        rows = max(1, self.rows // row_cells) if self.rows else None
        shape = self.adapter.shape
        need = self.need_of(need, lengths, mask)

        def max_rows(width: int) -> int:
            found = fit(shape, width, self.max_memory, need, checkpoint=bounded, prefill=bounded, group=row_cells)
            return found.rows // row_cells

        return length_chunks(
            lengths, rows, row_cells=row_cells, budget=budget or self.budget, overhead=self.overhead, max_rows=max_rows
        )

    @staticmethod
    def need_of(need: Need, lengths: torch.Tensor, mask: torch.Tensor | None = None) -> Need:
        """``need`` for rows of real lengths ``lengths`` ``[R]`` (attention masks ``mask``
        ``[R, N']`` when not the batch's, which are right-padded): rows all of one length, with
        no hole in their masks, are never padded in a chunk cut to its longest row."""
        if not need.padded or lengths.numel() == 0 or bool(lengths.min() != lengths.max()):
            return need
        if mask is not None and mask.shape[1] > 1 and bool((mask.int().diff(dim=1) > 0).any()):
            return need  # a removed position in the middle: masked, whatever the lengths
        return replace(need, padded=False)

    def chunks(self, copies: Copies, need: Need | None = None) -> Iterator[Chunk]:
        """The chunks of ``copies``, each with the keyword arguments of its forward pass
        (``inputs_embeds`` left to the caller when the copies build embeddings) and how its
        pass runs within the memory budget (``need``: what it keeps, default a forward without
        gradient). All chunks are planned -- and a pass that cannot fit refused -- before the
        first is yielded."""
        batch = self.batch
        lengths = copies.lengths(batch)
        need = self.need_of(need or Need(anchors=anchors_of(self.target)), lengths, copies.attention_mask)
        planned = self.plan(lengths, need=need, bounded=True, mask=copies.attention_mask)
        fits: dict[int, Fit] = {}
        shape = self.adapter.shape
        # a sign of life per chunk where there are several (an ablation chunk, a group of steps)
        with task(f"passes over {len(copies)} copies", total=len(copies), shown=len(planned) > 1) as done:
            for rows, width in planned:
                if width not in fits:
                    fits[width] = self.fit(width, need)
                release = need.grad != "none" and near_budget(estimate(shape, len(rows), width, fits[width].need), self.max_memory)
                example = copies.example[rows]
                target = self.target.select(example)
                if copies.anchor is not None:
                    target = target.with_anchor(copies.anchor[rows])
                if copies.input_ids is not None:
                    types = copies.token_type_ids
                    inputs = {
                        "input_ids": copies.input_ids[rows, :width],
                        "attention_mask": copies.attention_mask[rows, :width],
                        "token_type_ids": None if types is None else types[rows, :width],
                    }
                else:
                    inputs = batch.cut(example, width)
                    if copies.embeds is not None:
                        del inputs["input_ids"]
                self.passes += 1
                yield Chunk(rows, example, width, target, inputs, fits[width].need, release)
                done.advance(len(rows))

    def forward(self, chunk: Chunk, **kwargs) -> Forward:
        """The chunk's forward pass (``kwargs``: ``inputs_embeds``, ``hidden_states``, ...), with
        gradient checkpointing or chunked prefill where its plan says so."""
        need = chunk.need
        return self.adapter.forward(
            self.batch,
            chunk.target.read_at,
            **chunk.inputs,
            checkpoint=need.grad == "checkpoint",
            release=chunk.release,
            prefill=need.queries,
            **kwargs,
        )

    # ------------------------------------------------------------------ what runs
    @torch.no_grad()
    def map(
        self, copies: Copies, read: Callable[[Chunk, Forward], torch.Tensor | tuple[torch.Tensor, ...]]
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """``read(chunk, forward)`` for every chunk, its per-row values ``[r, ...]`` (or a tuple
        of them) scattered into ``[R, ...]`` in the copies' order."""
        found: tuple[torch.Tensor, ...] | None = None
        single = True
        for chunk in self.chunks(copies):
            embeds = None if copies.embeds is None else copies.embeds(chunk.rows, chunk.example, chunk.width)
            value = read(chunk, self.forward(chunk, inputs_embeds=embeds))
            single = not isinstance(value, tuple)
            values = (value,) if single else value
            if found is None:
                found = tuple(v.new_zeros((len(copies), *v.shape[1:])) for v in values)
            for out, v in zip(found, values, strict=True):
                out[chunk.rows] = v.to(out.dtype)
        if found is None:
            return torch.zeros(0)
        return found[0] if single else found

    def scores(self, copies: Copies, output: str = "logit") -> torch.Tensor:
        """The explained scalar of every copy ``[R]``: the target's ``output`` (logit or
        probability, see :meth:`~heedful.engine.targets.ResolvedTarget.output`)."""
        return self.map(copies, lambda chunk, fwd: chunk.target.output(fwd.logits, output))

    def gradients(self, copies: Copies, weights: torch.Tensor | None = None, examples: int | None = None) -> torch.Tensor:
        """``sum_r weights[r] * d score_r / d e_r`` per example ``[B, N, E]``: the gradient of
        each copy's explained logit with respect to its input embeddings (built by
        ``copies.embeds``), weighted and summed over the copies of each example (one forward and
        one backward per chunk; rows too long to keep every block's activations run with
        per-block gradient checkpointing). ``examples``: ``B`` when the copies do not cover every
        example of the batch."""
        bsz = examples if examples is not None else len(self.batch)
        total: torch.Tensor | None = None
        for chunk in self.chunks(copies, Need(grad="saved", anchors=anchors_of(self.target))):
            points = copies.embeds(chunk.rows, chunk.example, chunk.width).detach().requires_grad_(True)
            with torch.enable_grad():
                fwd = self.forward(chunk, inputs_embeds=points)
                grads = self.adapter.grad(chunk.target.score(fwd.logits), points)
            grads = widened(grads)  # a half-precision model's gradients summed in float32
            if weights is not None:
                grads = grads * weights[chunk.rows, None, None].to(grads)
            if total is None:
                total = grads.new_zeros(bsz, self.batch.seq_len, grads.shape[-1])
            total[:, : chunk.width].index_add_(0, chunk.example, grads)
        return total if total is not None else torch.zeros(bsz, self.batch.seq_len, 0)
