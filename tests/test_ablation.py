"""The ablation core (heedful.engine.ablation): Captum's occlusion windows over the removable tokens,
removal drops run batched (an empty set costs no pass), each token's mean over its sets."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import cached_model

import heedful
from heedful.engine.ablation import removal_drops, sliding_windows, token_means
from heedful.engine.perturb import removable_positions


def test_windows_slide_over_the_removable_tokens_only():
    model = cached_model("bert", "masked_lm")
    mask = model.tokenizer.mask_token
    problem = model.prepare([f"a charming {mask} often affecting journey", f"{mask} dull"])
    allowed = removable_positions(problem.batch, problem.target)
    counts = allowed.sum(dim=1).tolist()
    windows = sliding_windows(problem, 3, 2)
    for b, m in enumerate(counts):
        held = windows[b][windows[b].any(dim=1)]
        assert len(held) == math.ceil(max(m - 3, 0) / 2) + 1  # Captum's shift count; the rest empty
        assert not (held & ~allowed[b]).any(), "a window holds a special token or the [MASK] anchor"
        positions = [row.nonzero()[:, 0].tolist() for row in held]
        order = allowed[b].nonzero()[:, 0].tolist()  # the removable tokens in reading order
        assert positions == [order[k * 2 : k * 2 + 3] for k in range(len(held))]  # the last cut at the end
    assert sliding_windows(problem, 50, 50)[1].sum() == counts[1]  # one window covers a short text whole


def test_a_stride_past_the_window_is_refused():
    problem = cached_model("bert").prepare("a charming journey")
    with pytest.raises(heedful.InputError, match="stride=2 is larger than window=1"):
        sliding_windows(problem, 1, 2)


def test_removal_drops_runs_only_the_sets_that_remove_something():
    model = cached_model("llama")
    problem = model.prepare(["a charming and often affecting journey", "dull"])
    remove = torch.zeros(2, 3, problem.batch.seq_len, dtype=torch.bool)
    remove[0, 0, 1] = remove[0, 2, 2:4] = True  # example 1's sets, and example 0's middle one, are empty
    before = model.adapter.counter.forward
    drops = removal_drops(problem, remove)
    assert model.adapter.counter.forward - before == 2
    assert drops.shape == (2, 3) and drops[0, 1] == 0 and (drops[1] == 0).all() and drops[0, 0] != 0
    one = removal_drops(problem, remove[:, :1])  # the same set alone: the same drop
    torch.testing.assert_close(one[0, 0], drops[0, 0])
    with pytest.raises(heedful.InputError, match="one \\[K, N\\] set of positions per example"):
        removal_drops(problem, remove[:1])


def test_token_means_average_the_sets_holding_each_token():
    remove = torch.tensor([[[1, 1, 0, 0], [0, 1, 1, 0]]], dtype=torch.bool)
    assert token_means(remove, torch.tensor([[2.0, 4.0]])).tolist() == [[2.0, 3.0, 4.0, 0.0]]
