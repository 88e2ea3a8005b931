"""Interest studies (layer map, lambda sweep), their CLI commands and the suppression helpers."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch
from tiny import tiny_hf, tiny_model

import heedful
from heedful import cli
from heedful.interest import downweight, lambda_sweep, layer_map, suppress, top_fraction

TEXT = "a charming and often affecting journey"
FAST = {"max_steps": 6, "samples": 2}


@pytest.fixture(scope="module")
def sharp() -> heedful.Model:
    return tiny_model("bert", initializer_range=0.2)


def test_layer_map_rows_are_layers(sharp):
    result = layer_map(sharp, TEXT, seed=0, **FAST)
    n_layers = sharp.adapter.num_layers
    assert result.layers == list(range(1, n_layers + 1))
    assert result.scores.shape == (n_layers, len(result.tokens))
    content = ~np.array(result.special)
    np.testing.assert_allclose(result.scores[:, content].sum(axis=1), 1.0, atol=1e-5)
    same = sharp.explain(TEXT, method="coperturbation", seed=0, layerwise=True, **FAST)
    np.testing.assert_allclose(result.scores, same.scores, atol=1e-5)
    assert layer_map(sharp, TEXT, layers=[-1], seed=0, **FAST).layers == [n_layers]


def test_lambda_sweep_follows_words_and_measures_distortion(sharp):
    result = lambda_sweep(sharp, TEXT, ["Charming", "journey"], [0.2, 1.0], seed=0, **FAST)
    assert result.interest.shape == (2, 2) and result.distortion.shape == (2,)
    tokens = result.tokens
    head = tokens.index("charming") if "charming" in tokens else next(i for i, t in enumerate(tokens) if t.startswith("charm"))
    np.testing.assert_allclose(result.interest[:, 0], result.scores[:, head])
    assert np.isfinite(result.distortion).all() and (result.distortion >= 0).all()
    with pytest.raises(heedful.InputError):
        lambda_sweep(sharp, TEXT, ["absent"], [0.5], **FAST)
    with pytest.raises(heedful.InputError):
        lambda_sweep(sharp, TEXT, ["journey"], [0.5], nonsense=1)


def test_multi_token_words_take_head_or_tail(sharp):
    from heedful.interest.studies import word_positions

    batch = sharp.adapter.encode([TEXT])
    pieces = [i for i, w in enumerate(batch.word_ids[0]) if w is not None and batch.tokens[0][i].startswith("##")]
    if not pieces:
        pytest.skip("no multi-token word in the tiny vocabulary")
    word_id = batch.word_ids[0][pieces[0]]
    idx = [i for i, w in enumerate(batch.word_ids[0]) if w == word_id]
    start, end = batch.offsets[0][idx[0]][0], batch.offsets[0][idx[-1]][1]
    word = TEXT[start:end]
    assert word_positions(batch, [word], "first") == [idx[0]]
    assert word_positions(batch, [word], "last") == [idx[-1]]


def test_cli_studies_write_figures(monkeypatch, capsys, tmp_path):
    hf_model, tokenizer = tiny_hf("bert", initializer_range=0.2)
    hf_model.save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    runs = [
        ["interest", "layers", TEXT, "--model", str(tmp_path / "m"), "--out", str(tmp_path / "layers.png"), "--max-steps", "4", "--samples", "2"],
        ["interest", "lambda-sweep", TEXT, "--words", "journey", "--lams", "0.3,0.6", "--model", str(tmp_path / "m"), "--out", str(tmp_path / "lam.png"), "--max-steps", "4", "--samples", "2", "-o", "window=2"],
    ]
    for args in runs:
        monkeypatch.setattr(sys, "argv", ["heedful", *args])
        try:
            cli.main()
        except SystemExit as exc:
            assert not exc.code, capsys.readouterr().err
    assert (tmp_path / "layers.png").stat().st_size > 1000 and (tmp_path / "lam.png").stat().st_size > 1000
    monkeypatch.setattr(sys, "argv", ["heedful", "interest", "lambda-sweep", TEXT, "--words", "nowhere", "--model", str(tmp_path / "m"), "--max-steps", "2"])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    assert exc.value.code == 2 and "not in the text" in capsys.readouterr().err


def test_top_fraction_picks_the_highest_allowed_tokens():
    scores = torch.tensor([[9.0, 5.0, 1.0, 7.0, 3.0, 8.0], [0.0, 2.0, 6.0, 4.0, 0.0, 0.0]])
    allowed = torch.tensor([[False, True, True, True, True, False], [False, True, True, True, False, False]])
    picked = top_fraction(scores, allowed, 0.5)
    assert picked.tolist() == [[False, True, False, True, False, False], [False, False, True, True, False, False]]
    assert not top_fraction(scores, allowed, 0.0).any()
    assert (top_fraction(scores, allowed, 1.0) == allowed).all()
    with pytest.raises(heedful.InputError):
        top_fraction(scores, allowed, 1.5)


def test_suppress_erases_by_interest_and_downweight_scales(tiny):
    for family, task in (("bert", "classification"), ("gpt2", "causal_lm")):
        model = tiny(family, task)
        adapter = model.adapter
        problem = model.prepare([TEXT, "the movie was dull"])
        batch = problem.batch
        scores = torch.arange(batch.seq_len, dtype=torch.float32).expand(len(batch), -1)
        perturbed, erased = suppress(problem, scores, 0.4)
        assert (erased.sum(dim=1) == torch.ceil(batch.content_mask.sum(dim=1) * 0.4)).all()
        assert not (erased & batch.special_mask).any()
        if adapter.removal_token_id is None:  # causal LMs: erased tokens are deleted
            assert (perturbed.attention_mask.sum(dim=1) == batch.lengths - erased.sum(dim=1)).all()
        else:
            assert (perturbed.input_ids[erased] == adapter.removal_token_id).all()
        embeds = downweight(adapter, batch, erased, 0.25)
        base = adapter.embed(batch.input_ids)
        torch.testing.assert_close(embeds[erased], base[erased] * 0.25)
        torch.testing.assert_close(embeds[~erased], base[~erased])
