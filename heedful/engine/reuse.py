"""Removal scores with key/value prefix reuse: copies of a decoder's inputs with some tokens
removed agree with their example on every position before the first removed token, so their
passes start from the example's key/value cache there and compute only the rest.

This is AttriBoT's exact cache reuse (Liu et al. 2024, "AttriBoT: A Bag of Tricks for
Efficiently Approximating Leave-One-Out Context Attribution", Sec. 3.1): removing a late source
costs only the tokens after it. The example's cache is the reference pass's where a method
kept it (:attr:`~heedful.adapters.Forward.cache`), else it comes from one pass
(:meth:`~heedful.adapters.ModelAdapter.prefix_states`) over the positions up to the latest
copy's start; rows are sorted by where they start
differing and cut into chunks that share the shortest prefix of their rows (each row recomputes
its own few extra positions after it), under the runner's token budget and the memory budget
left beside the examples' cache (a copy whose continuing pass would not fit it even alone runs
as a full pass, which keeps no cache). A causal model's
states before position ``p`` do not depend on later tokens and right padding changes no real
position, so the scores equal those of full passes (:meth:`heedful.engine.runner.Runner.scores`)
beyond float rounding. Encoders, which have no cache, and ``reuse=False`` take the full
passes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from heedful.adapters import ModelAdapter
from heedful.engine.chunks import TOKEN_BUDGET
from heedful.engine.memory import Need, estimate
from heedful.engine.perturb import Perturbed, remove_from_examples
from heedful.engine.problem import Problem
from heedful.engine.runner import Copies, Runner
from heedful.progress import task

PASS_POSITIONS = 32
"""A pass's fixed cost -- reading every weight once -- in positions computed: on a CPU, a
one-token pass of smollm2-135m against a 700-token cache takes as long as about 30 more
positions. A chunk of ``k`` rows saves ``k - 1`` passes, so it may recompute up to
``PASS_POSITIONS * (k - 1)`` positions beyond its rows' own."""


REUSE_SHARE = 1 / 16
"""Least share of its positions a copy must share with its example to continue the example's
key/value cache. A continuing copy holds the cache of its whole width and shares a pass only
with copies that start near it, so one that saves little (ContextCite's random ablations drop
an early source in almost every copy) runs as a full pass instead, batched with the others
under the token budget: its memory then stays what a full pass over the budget's positions
takes at any length, for a few positions more computed."""


def prefix_chunks(
    start: torch.Tensor, lengths: torch.Tensor, budget: int, fits: Callable[[int, int, int], bool] | None = None
) -> list[torch.Tensor]:
    """Rows ``[R]`` grouped into chunks that share a prefix: each chunk's rows (indices) sorted
    from the latest ``start`` down; a chunk computes ``rows x (longest - shortest start)``
    positions, at most ``budget`` (one row always fits), at most :data:`PASS_POSITIONS` per pass
    it saves beyond its rows' own ``lengths - start``, and -- with ``fits(rows, width,
    computed)``, whether a pass of ``rows`` rows of ``width`` positions of which the last
    ``computed`` run fits the memory budget -- only what fits."""
    order = torch.argsort(start, descending=True, stable=True).tolist()
    begin, end = start.tolist(), lengths.tolist()
    chunks: list[list[int]] = []
    current: list[int] = []
    useful = longest = 0
    for row in order:
        grown_longest = max(longest, end[row])
        grown_useful = useful + end[row] - begin[row]
        rows = len(current) + 1
        cells = rows * (grown_longest - begin[row])
        heavy = fits is not None and not fits(rows, grown_longest, grown_longest - begin[row])
        if current and (cells > budget or cells - grown_useful > PASS_POSITIONS * (rows - 1) or heavy):
            chunks.append(current)
            current, useful, grown_longest, grown_useful = [], 0, end[row], end[row] - begin[row]
        current.append(row)
        useful, longest = grown_useful, grown_longest
    if current:
        chunks.append(current)
    return [torch.tensor(c, dtype=torch.long, device=start.device) for c in chunks]


@torch.no_grad()
def removal_scores(
    problem: Problem,
    example: torch.Tensor,
    remove: torch.Tensor,
    output: str,
    *,
    removal: str = "delete",
    reuse: bool = True,
    rows: int | None = None,
) -> torch.Tensor:
    """The target's ``output`` (:meth:`~heedful.engine.targets.ResolvedTarget.output`) for copies of
    examples ``example`` ``[R]`` with the positions ``remove`` ``[R, N]`` removed by
    ``removal`` -> ``[R]``. ``reuse``: start decoder copies from their example's key/value
    cache at their first removed position; ``rows``: a fixed number of rows per chunk."""
    perturbed = remove_from_examples(problem.adapter, problem.batch, problem.target, example, remove, removal)
    full = Runner.for_problem(problem, rows=rows)
    if not (reuse and problem.adapter.is_decoder and problem.inputs_embeds is None):
        return full.scores(Copies.of(perturbed, example), output)
    start = _unchanged_prefix(problem, example, remove, perturbed)
    lengths = perturbed.attention_mask.sum(dim=1)
    fits = _fits(problem.adapter, _held(problem))
    # a copy whose continuing pass would not fit the budget even alone runs as a full pass,
    # which the runner bounds (the full pass keeps no cache)
    alone = torch.tensor([fits(1, int(n), int(n - p)) for n, p in zip(lengths.tolist(), start.tolist(), strict=True)], dtype=torch.bool, device=start.device)
    worth = (start >= REUSE_SHARE * lengths) & alone
    values = torch.zeros(len(example), device="cpu")  # collected on the CPU (each chunk's .cpu())
    if bool((~worth).any()):
        plain = ~worth
        values[plain] = full.scores(Copies.of(_rows(perturbed, plain), example[plain]), output)
    if bool(worth.any()):
        values[worth] = _reused(problem, example[worth], start[worth], _rows(perturbed, worth), output, rows, fits)
    return values


def _rows(perturbed: Perturbed, which: torch.Tensor) -> Perturbed:
    """The copies ``which`` (a boolean ``[R]``) of ``perturbed``."""
    types = perturbed.token_type_ids
    return Perturbed(
        perturbed.input_ids[which], perturbed.attention_mask[which], None if types is None else types[which], perturbed.anchor[which]
    )


def _unchanged_prefix(problem: Problem, example: torch.Tensor, remove: torch.Tensor, perturbed: Perturbed) -> torch.Tensor:
    """Positions ``[R]`` each copy shares with its example before it must be recomputed: up to
    its first removed position, and never past the first position the head is read at."""
    batch = problem.batch
    target = problem.target.select(example).with_anchor(perturbed.anchor)
    removed = remove.bool() & batch.attention_mask[example].bool()
    first = torch.where(removed.any(dim=1), removed.int().argmax(dim=1), batch.lengths[example])
    first_read = target.read_at if target.read_at.dim() == 1 else target.read_at[:, 0]
    return torch.minimum(first, first_read).clamp(min=0)


def _held(problem: Problem) -> int:
    """Bytes of the examples' key/value cache (:meth:`~heedful.adapters.ModelAdapter.prefix_states`),
    held beside every continuing pass."""
    batch = problem.batch
    return len(batch) * problem.adapter.shape.cache_bytes(batch.seq_len)


def _fits(adapter: ModelAdapter, held: int) -> Callable[[int, int, int], bool]:
    """Whether ``rows`` rows continuing a cached prefix fit the adapter's memory budget beside
    ``held`` bytes (the examples' cache): the estimator's pass over ``width`` positions whose
    last ``computed`` run against the cache (:class:`heedful.engine.memory.Need` with ``queries``, as a
    prefill chunk: the cache of the whole width held twice while each layer concatenates, and
    the queries' attention)."""
    shape, budget = adapter.shape, adapter.max_memory - held
    return lambda rows, width, computed: estimate(shape, rows, width, Need(queries=computed)) <= budget


def _reused(
    problem: Problem,
    example: torch.Tensor,
    start: torch.Tensor,
    perturbed: Perturbed,
    output: str,
    rows: int | None,
    fits: Callable[[int, int, int], bool],
) -> torch.Tensor:
    """The target's ``output`` for copies ``perturbed`` of examples ``example`` ``[R]``, each
    continuing its example's key/value cache over its first ``start`` ``[R]`` positions, in
    chunks that ``fits`` the memory budget (:func:`_fits`). The cache is the reference pass's
    when it kept one (:attr:`~heedful.adapters.Forward.cache`), else one pass computes it."""
    adapter, batch = problem.adapter, problem.batch
    target = problem.target.select(example).with_anchor(perturbed.anchor)
    lengths = perturbed.attention_mask.sum(dim=1)
    states = problem.reference.cache
    if states is None:
        # no copy continues past the latest start: the cache's pass stops there (hierarchical keeps a
        # few sources, often early ones, and saves much of a full pass)
        needed = max(int(start.max()), 1)
        states = adapter.prefix_states(batch.with_ids(batch.input_ids[:, :needed], batch.attention_mask[:, :needed]))
    values = torch.zeros(len(example), device="cpu")  # collected on the CPU (each chunk's .cpu())
    budget = TOKEN_BUDGET if rows is None else None
    chunks = prefix_chunks(start, lengths, budget or 1 << 62, fits)
    if rows is not None:
        chunks = [part for c in chunks for part in c.split(rows)]
    with task(f"passes over {len(example)} copies (cache reused)", total=len(example), shown=len(chunks) > 1) as done:
        for members in chunks:
            shared = int(start[members].min())
            width = int(lengths[members].max())
            local = target.select(members)
            local = local.with_anchor(local.anchor - shared)
            mask = perturbed.attention_mask[members, :width]
            prefix = {"prefix": (states, example[members], shared)} if shared > 0 else {}
            fwd = adapter.forward(
                batch, local.read_at, input_ids=perturbed.input_ids[members, shared:width], attention_mask=mask, **prefix
            )
            values[members] = local.output(fwd.logits, output).float().cpu()
            done.advance(len(members))
    return values
