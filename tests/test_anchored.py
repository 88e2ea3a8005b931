"""The last block at the anchor only (heedful.adapters.anchored): a forward-only classifier pass
gives the full model's logits (transformers' own forward is the oracle), and every pass that
could see the difference runs the full block."""

from __future__ import annotations

import pytest
import torch
from conftest import cached_model
from tiny import ENCODERS

import heedful.adapters.anchored as anchored
from heedful.engine.precision import forward_precision

TEXTS = ["a charming and often affecting journey", "the movie was dull", "bad"]


@pytest.fixture
def calls(monkeypatch):
    """How many passes computed the last block at the anchor only."""
    found = []
    real = anchored.anchored_block_output

    def spy(*args, **kwargs):
        found.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(anchored, "anchored_block_output", spy)
    return found


def _padded(model):
    batch = model.adapter.encode(TEXTS)
    assert batch.attention_mask.sum(dim=1).unique().numel() == len(TEXTS), "the batch must be padded"
    anchor, _ = model.adapter.anchor_positions(batch)
    return batch, anchor


@pytest.mark.parametrize("task", ["classification", "regression"])
@pytest.mark.parametrize("family", ENCODERS)
def test_anchored_pass_equals_the_full_model(family, task, calls):
    model = cached_model(family, task)
    batch, anchor = _padded(model)
    enc = model.tokenizer(TEXTS, padding=True, return_tensors="pt", padding_side="right")
    with torch.no_grad():
        ours = model.adapter.forward(batch, anchor).logits
        theirs = model.hf_model(**enc).logits
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
    assert (ours[0] - ours[1]).abs().max() > 1e-3, "different texts must give different outputs"
    assert len(calls) == (1 if model.adapter.anchored_blocks else 0)


def test_anchored_pass_runs_on_the_lower_precision_copy(calls):
    model = cached_model("bert", "classification")
    batch, anchor = _padded(model)
    with torch.no_grad(), forward_precision("bf16"):
        low = model.adapter.forward(batch, anchor).logits
    assert len(calls) == 1
    model.adapter.at_precision("bf16").anchored_blocks = False  # the full block on the same copy
    try:
        with torch.no_grad(), forward_precision("bf16"):
            full = model.adapter.forward(batch, anchor).logits
    finally:
        del model.adapter.at_precision("bf16").anchored_blocks
    torch.testing.assert_close(low, full, atol=2e-2, rtol=0)


def test_passes_that_could_tell_run_the_full_block(calls):
    model = cached_model("bert", "classification")
    adapter = model.adapter
    batch, anchor = _padded(model)
    full_width = batch.input_ids.shape[1]
    with torch.enable_grad():
        adapter.forward(batch, anchor)
    with torch.no_grad():
        hidden = adapter.forward(batch, anchor, hidden_states=True).hidden_states
        with adapter.intercept() as hooks:
            recorded = hooks.record("mlp_out", layers=[adapter.num_layers - 1])
            adapter.forward(batch, anchor)
    assert calls == []
    assert hidden[-1].shape[1] == full_width
    assert recorded[adapter.num_layers - 1].shape[1] == full_width  # every position's MLP ran
    seen = []
    handle = adapter.blocks[-1].register_forward_hook(lambda module, args, out: seen.append(out.shape))
    try:
        with torch.no_grad():
            adapter.forward(batch, anchor)
    finally:
        handle.remove()
    assert calls == [] and seen == [torch.Size([len(TEXTS), full_width, adapter.hidden_size])]
    # the block is itself again afterwards
    assert "forward" not in vars(adapter.blocks[-1])
