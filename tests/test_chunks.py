"""Chunks of rows of similar length (heedful.engine.chunks.length_chunks): every row once, each chunk
padded to its own longest row, and the cut weighing padding as the work costs."""

from __future__ import annotations

import itertools

import torch

from heedful.engine.chunks import length_chunks


def cost(chunks, power: int, overhead: int) -> float:
    return sum(len(rows) * width**power + overhead for rows, width in chunks)


def test_every_row_once_and_each_chunk_padded_to_its_longest_row():
    lengths = torch.tensor([15, 29, 28, 29, 14, 20, 14, 25, 28, 17, 53, 21, 18, 9, 26, 37])
    for power in (1, 2):
        chunks = length_chunks(lengths, power=power, overhead=64)
        rows = torch.cat([r for r, _ in chunks])
        assert sorted(rows.tolist()) == list(range(len(lengths)))
        for r, width in chunks:
            assert width == int(lengths[r].max())


def test_quadratic_rows_cut_at_least_as_well_as_any_split_into_two():
    """With ``power=2`` the chosen cut costs no more than every cut of the sorted rows into one
    or two chunks (a plain enumeration, sharing nothing with the dynamic programme)."""
    lengths = torch.tensor([9, 14, 14, 15, 17, 18, 20, 21, 25, 26, 28, 28, 29, 29, 37, 53])
    overhead = 1024
    chosen = length_chunks(lengths, power=2, overhead=overhead)
    ordered = sorted(range(len(lengths)), key=lambda i: -int(lengths[i]))
    candidates = [[(ordered, int(lengths[ordered[0]]))]]
    for cut in range(1, len(ordered)):
        a, b = ordered[:cut], ordered[cut:]
        candidates.append([(a, int(lengths[a[0]])), (b, int(lengths[b[0]]))])
    best = min(cost(c, 2, overhead) for c in candidates)
    assert cost(chosen, 2, overhead) <= best
    # the 53-token row is not padded together with the short ones: a padded position costs a row
    assert len(chosen) > 1 and any(width == 53 and len(rows) <= 2 for rows, width in chosen)
    linear = length_chunks(lengths, power=1, overhead=overhead)
    assert cost(chosen, 2, overhead) <= cost(linear, 2, overhead)  # optimal among cuts of the sorted rows


def test_row_caps_hold():
    lengths = torch.tensor(list(itertools.chain.from_iterable([[10] * 7, [40] * 5])))
    chunks = length_chunks(lengths, power=2, max_rows=lambda w: 3)
    assert all(len(rows) <= 3 for rows, _ in chunks)
