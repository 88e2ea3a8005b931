"""Chunks of rows of similar length: how heedful cuts a padded batch -- or many copies of its
examples -- into forward passes that waste little on padding and stay under a token budget.

Right padding never changes a real position's output, so chunking changes the cost of a pass,
not its result (beyond float rounding). Every pass over many rows plans its chunks here: the
reference pass (:func:`heedful.engine.problem.reference_pass`), the gradient methods' graph-keeping
pass, and the batched runner (:mod:`heedful.engine.runner`) -- each also bounding a chunk's rows by what
the memory budget allows (:mod:`heedful.engine.memory`, through ``max_rows``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

TOKEN_BUDGET = 16384
"""Default number of (sequence x position) cells per forward chunk."""

CHUNK_OVERHEAD = 64
"""What one more forward chunk costs, in cells, when :func:`length_chunks` decides where to cut
(per-pass overhead and the lower efficiency of small matrix products). On MiniLM (one thread,
float32 and bfloat16) one forward of 1 x 25 tokens took as long as 37-49 cells of a saturated
batch, and 4 x 25 tokens as long as 115-125 cells (benchmarks/ferret_aopc.py's positions and
times agree): padding a row to save a pass pays only where it is shorter than that."""


def length_chunks(
    lengths: torch.Tensor,
    chunk_rows: int | None = None,
    *,
    row_cells: int = 1,
    budget: int = TOKEN_BUDGET,
    overhead: int = CHUNK_OVERHEAD,
    max_rows: Callable[[int], int] | None = None,
    power: int = 1,
) -> list[tuple[torch.Tensor, int]]:
    """Chunks of rows of similar length: ``(row indices, width)`` pairs covering every row.

    ``lengths`` ``[R]`` are the rows' real (unpadded) lengths in a right-padded batch. Rows are
    sorted longest first (stable, so rows of equal length keep their order) and the sorted run is
    cut into chunks, each padded only to its own longest row ``width`` and holding at most
    ``budget // (width * row_cells)`` rows (or ``chunk_rows``). Where to cut is chosen to
    minimise the padded cells plus ``overhead`` per chunk (exact, by dynamic programming over the
    distinct lengths): with lengths 8..53 in one batch of 64 sentences, half of the cells of one
    padded batch were padding.

    ``row_cells``: sequences each row stands for (e.g. a problem run as ``samples`` noised
    copies), so that padding is costed -- and the ``budget`` filled -- in the sequences actually
    run.

    ``max_rows(width)``: most rows a chunk of that width may hold besides (a memory bound,
    :mod:`heedful.engine.memory`); a chunk holds the fewer of the two, and at least one row.

    ``power``: a row of width ``w`` costs ``w ** power`` cells (2 for the decompositions, whose
    state holds ``w`` parts of each of ``w`` positions), so padding is weighed as it costs.
    """
    lengths = lengths.reshape(-1).long().clamp(min=1)
    rows = lengths.shape[0]
    if rows == 0:
        return []
    order = torch.sort(lengths, descending=True, stable=True).indices
    values, counts = torch.unique_consecutive(lengths[order], return_counts=True)
    widths = values.tolist()  # distinct lengths, longest first
    ends = np.cumsum(counts.tolist())  # rows up to and including each distinct length
    starts = np.concatenate([[0], ends[:-1]])

    def per_chunk(width: int) -> int:
        cap = chunk_rows or max(1, budget // (width * row_cells))
        return max(1, min(cap, max_rows(width))) if max_rows is not None else cap

    # best[j]: least cost of the first ends[j - 1] rows; a span of distinct lengths i..j-1 is
    # padded to widths[i] and split into as few chunks as the budget allows.
    k = len(widths)
    best = np.zeros(k + 1)
    cut = np.zeros(k + 1, dtype=np.int64)
    caps = np.array([per_chunk(w) for w in widths])
    width_arr = np.array(widths)
    for j in range(1, k + 1):
        span_rows = ends[j - 1] - starts[:j]
        n_chunks = -(-span_rows // caps[:j])
        costs = best[:j] + span_rows * row_cells * width_arr[:j].astype(float) ** power + n_chunks * overhead
        i = int(np.argmin(costs))
        best[j], cut[j] = costs[i], i
    spans = []
    j = k
    while j > 0:
        i = int(cut[j])
        spans.append((i, j))
        j = i
    chunks = []
    for i, j in reversed(spans):
        span = order[int(starts[i]) : int(ends[j - 1])]
        n_chunks = -(-span.shape[0] // int(caps[i]))
        for part in torch.tensor_split(span, n_chunks):
            chunks.append((part, int(lengths[part[0]])))
    return chunks
