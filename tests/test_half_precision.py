"""A model stored in half precision (``heedful.load(..., dtype=...)``, ``--dtype``): every method
explains it, sums are taken in float32, and the command line and server take the dtype."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import run_cli, saved_tiny

import heedful
from heedful.engine.precision import check_dtype, widened
from heedful.engine.runner import Copies, Runner
from heedful.testing import random_head_mask, tiny_hf

TEXT = "a charming and often affecting journey"
HALF = {"bf16": torch.bfloat16, "fp16": torch.float16}
DIFFERENCE = {"bf16": 0.15, "fp16": 0.03}
"""Largest token-score difference from float32, relative to the largest float32 score: a
score is a sum of products each rounded to the dtype's ``eps`` (bf16 2**-8, fp16 2**-11) times
a few dozen; measured on the tiny Llama up to 0.059 (bf16) and 0.0056 (fp16),
docs/models.md."""


def _pair(dtype: torch.dtype, task: str = "classification") -> tuple[heedful.Model, heedful.Model]:
    full, tokenizer = tiny_hf("llama", task, initializer_range=0.2)
    half, _ = tiny_hf("llama", task, initializer_range=0.2)
    return heedful.from_pretrained_objects(full, tokenizer), heedful.from_pretrained_objects(half.to(dtype), tokenizer)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("method", ["lrp", "chefer", "mask_lrp", "decompx", "attnlrp", "integrated_gradients"])
def test_relevance_and_decomposition_explain_a_half_precision_model(dtype, method):
    full, half = _pair(HALF[dtype])
    options = {"head_mask": random_head_mask(full)} if method == "mask_lrp" else {"n_steps": 8} if method == "integrated_gradients" else {}
    expected = np.asarray(full.explain(TEXT, method, **options).scores)
    found = np.asarray(half.explain(TEXT, method, **options).scores)
    assert np.isfinite(found).all()
    assert np.abs(found - expected).max() <= DIFFERENCE[dtype] * np.abs(expected).max(), (method, found, expected)


def test_gradients_over_copies_are_summed_in_float32():
    _, half = _pair(torch.bfloat16)
    problem = half.prepare(TEXT)
    embeds = problem.word_embeddings().detach()
    copies = Copies(torch.zeros(64, dtype=torch.long), embeds=lambda rows, example, width: embeds[example, :width])
    total = Runner.for_problem(problem).gradients(copies, weights=torch.full((64,), 1 / 64))
    assert total.dtype == torch.float32
    (single,) = torch.autograd.grad(
        problem.target.score(half.adapter.forward(problem.batch, problem.anchor, inputs_embeds=embeds.requires_grad_(True)).logits).sum(),
        embeds,
    )
    torch.testing.assert_close(total, widened(single), rtol=0, atol=1e-6 * float(single.abs().max()) + 1e-30)


def test_dtype_names_and_refusals():
    assert check_dtype("bf16") is torch.bfloat16 and check_dtype(torch.float16) is torch.float16
    with pytest.raises(heedful.InputError, match="dtype 'fp8' is not one of fp32, bf16, fp16"):
        check_dtype("fp8")
    with pytest.raises(heedful.InputError, match="dtype"):
        heedful.load("/nonexistent/folder", dtype="int4")
    from heedful.serve.settings import ServeSettings

    with pytest.raises(heedful.InputError, match="dtype 'fp64'"):
        ServeSettings(dtype="fp64")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return saved_tiny(tmp_path_factory.mktemp("tiny-llama"), "llama", "classification", initializer_range=0.2)


def test_load_and_explain_in_bf16_from_the_command_line(monkeypatch, capsys, model_dir):
    model = heedful.load(model_dir, dtype="bf16")
    assert model.hf_model.dtype == torch.bfloat16
    code, out, _ = run_cli(monkeypatch, capsys, "explain", TEXT, "--model", model_dir, "--dtype", "bf16", "--method", "lrp", "--json")
    assert code == 0
    data = json.loads(out)
    full = heedful.load(model_dir).explain(TEXT, "lrp")
    scale = max(abs(s) for s in full.scores)
    assert max(abs(a - b) for a, b in zip(data["scores"], full.scores, strict=True)) <= DIFFERENCE["bf16"] * scale
    code, _, err = run_cli(monkeypatch, capsys, "explain", TEXT, "--model", model_dir, "--dtype", "fp8")
    assert code == 2 and "dtype 'fp8' is not one of fp32, bf16, fp16" in err
