"""Inference-time intervention (heedful.inside.iti) against a plain computation of Li et al.'s
equations: head outputs read by forward pre-hooks on the ``transformers`` output projections,
text by text; a scikit-learn pipeline per head on the same features and split; the mass-mean and
probe directions and their standard deviations by numpy; and generation under a hook that adds
``alpha * sigma * theta`` to each chosen head's slice before the output projection."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import run_cli, saved_tiny

from heedful.errors import InputError
from heedful.inside.iti import HeadIntervention, iti, top_heads
from heedful.inside.sweep import sentiment_sweep

POSITIVE = [
    "we loved every minute", "a charming and often affecting journey", "an intelligent , funny film", "the actors are wonderful",
    "a delight from start to finish", "moving and beautifully made", "the best film of the year", "funny , warm and clever",
    "a joy to watch", "we watched it twice and loved it",
]
NEGATIVE = [
    "what a waste of a talented cast", "the movie was dull and far too long", "the plot is predictable", "a boring mess",
    "an awful script", "the acting is terrible", "we left after an hour", "tedious and badly made", "a dreadful film",
    "nothing works in this movie",
]
PROMPT = "the movie was"


@pytest.fixture(params=["llama", "gpt2"])
def lm(request, tiny):
    return tiny(request.param, "causal_lm")


def _projections(lm) -> list[torch.nn.Module]:
    """Each block's attention output projection, named as the ``transformers`` modeling files do."""
    if lm.hf_model.config.model_type == "gpt2":
        return [block.attn.c_proj for block in lm.hf_model.transformer.h]
    return [block.self_attn.o_proj for block in lm.hf_model.model.layers]


def _plain_head_outputs(lm, texts) -> np.ndarray:
    """``[T, L, H, d]``: the input of every output projection at each text's last token, one
    text per forward pass."""
    heads = lm.hf_model.config.num_attention_heads
    found = []
    for text in texts:
        seen = {}
        handles = [
            module.register_forward_pre_hook(lambda mod, args, layer=layer, seen=seen: seen.__setitem__(layer, args[0][0, -1].clone()))
            for layer, module in enumerate(_projections(lm))
        ]
        try:
            with torch.no_grad():
                lm.hf_model(input_ids=lm.tokenizer(text, return_tensors="pt")["input_ids"])
        finally:
            for handle in handles:
                handle.remove()
        found.append(torch.stack([seen[layer] for layer in sorted(seen)]).unflatten(-1, (heads, -1)))
    return torch.stack(found).double().numpy()


@pytest.mark.parametrize("direction", ["mass_mean", "probe"])
def test_iti_equals_the_papers_equations_computed_plainly(lm, direction):
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    k, alpha = 3, 8.0
    ours = iti(lm, POSITIVE, NEGATIVE, heads=k, direction=direction, seed=0)
    X = _plain_head_outputs(lm, POSITIVE + NEGATIVE)
    y = np.asarray([1] * len(POSITIVE) + [0] * len(NEGATIVE))
    held = ours.validation
    assert held.sum() == 4 and len(set(y[held])) == 2 and len(set(y[~held])) == 2
    _, layers, heads, _ = X.shape
    accuracy = np.zeros((layers, heads))
    pipelines = {}
    for layer in range(layers):
        for head in range(heads):
            pipeline = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000, random_state=0))
            pipelines[layer, head] = pipeline.fit(X[~held, layer, head], y[~held])
            accuracy[layer, head] = pipeline.score(X[held, layer, head], y[held])
    np.testing.assert_array_equal(ours.accuracy.numpy(), accuracy.astype(np.float32))
    ranked = sorted(np.ndindex(layers, heads), key=lambda lh: (-accuracy[lh], lh))[:k]
    assert ours.heads == [(int(a), int(b)) for a, b in ranked]
    for i, (layer, head) in enumerate(ours.heads):
        if direction == "mass_mean":
            theta = X[y == 1, layer, head].mean(0) - X[y == 0, layer, head].mean(0)
        else:
            scaler, probe = pipelines[layer, head]
            theta = probe.coef_[0] / scaler.scale_
        theta /= np.linalg.norm(theta)
        torch.testing.assert_close(ours.directions[i], torch.from_numpy(theta).float(), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(float(ours.sigmas[i]), float(np.std(X[:, layer, head] @ theta)), rtol=1e-4, atol=1e-6)

    width = X.shape[-1]
    projections = _projections(lm)

    def shift(layer):
        def hook(module, args):
            h = args[0].clone()
            for i, (at, head) in enumerate(ours.heads):
                if at == layer:
                    h[..., head * width : (head + 1) * width] += alpha * ours.sigmas[i] * ours.directions[i]
            return (h, *args[1:])

        return hook

    ids = lm.tokenizer(PROMPT, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        plain = lm.hf_model(input_ids=ids).logits
        handles = [projections[layer].register_forward_pre_hook(shift(layer)) for layer in range(layers)]
        try:
            expected = lm.hf_model(input_ids=ids).logits
            their_gen = lm.hf_model.generate(input_ids=ids, max_new_tokens=6, do_sample=False)
        finally:
            for handle in handles:
                handle.remove()
        with ours.applied(lm, alpha):
            found = lm.hf_model(input_ids=ids).logits
        torch.testing.assert_close(lm.hf_model(input_ids=ids).logits, plain)  # hooks gone after the block
    assert not torch.allclose(plain, expected, atol=1e-4)  # the shift does something
    torch.testing.assert_close(found, expected, rtol=1e-4, atol=1e-4)
    assert ours.generate(lm, PROMPT, alpha, 6).continuations[0] == their_gen[0, ids.shape[1] :].tolist()


def test_top_heads_breaks_ties_by_layer_then_head():
    accuracy = np.asarray([[0.5, 1.0, 0.75], [1.0, 0.75, 0.5]])
    assert top_heads(accuracy, 4) == [(0, 1), (1, 0), (0, 2), (1, 1)]


def test_iti_in_the_sweep_zero_is_the_baseline_and_it_steers(tiny):
    lm, judge = tiny("gpt2", "causal_lm"), tiny("bert")
    found = iti(lm, POSITIVE, NEGATIVE, heads=2)
    assert isinstance(found, HeadIntervention) and found.layer is None and found.where.startswith("2 heads of blocks")
    prompts = ["the movie was dull", "what a waste of"]
    result = sentiment_sweep(lm, judge, prompts, found, [0.0, 30.0], max_new_tokens=4, batch_size=2)
    assert result.kind == "iti" and result.layer is None and result.where == found.where
    plain = lm.generate(prompts, 4)
    assert result.rows[0].examples == [lm.tokenizer.decode(c, skip_special_tokens=True) for c in plain.continuations]
    assert result.rows[1].examples != result.rows[0].examples


def test_iti_refuses_bad_input(tiny, lm):
    with pytest.raises(InputError, match="language model"):
        iti(tiny("bert"), POSITIVE, NEGATIVE)
    with pytest.raises(InputError, match="at least 2 texts"):
        iti(lm, POSITIVE[:1], NEGATIVE)
    with pytest.raises(InputError, match="unknown direction"):
        iti(lm, POSITIVE, NEGATIVE, direction="mean")
    with pytest.raises(InputError, match="heads asked"):
        iti(lm, POSITIVE, NEGATIVE, heads=10_000)


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory) -> str:
    return saved_tiny(tmp_path_factory.mktemp("tiny-llama-lm"), "llama", "causal_lm")


def _sets(tmp_path):
    pos, neg = tmp_path / "pos.txt", tmp_path / "neg.txt"
    pos.write_text("\n".join(POSITIVE) + "\n", encoding="utf-8")
    neg.write_text("\n".join(NEGATIVE) + "\n\n", encoding="utf-8")
    return str(pos), str(neg)


def test_cli_steer_iti_from_files_prints_both_generations(monkeypatch, capsys, lm_dir, tmp_path):
    pos, neg = _sets(tmp_path)
    seen = {}
    real = iti

    def spy(model, positive, negative, **options):
        seen["sets"], seen["options"] = (list(positive), list(negative)), options
        return real(model, positive, negative, **options)

    monkeypatch.setattr("heedful.inside.iti.iti", spy)
    code, out, err = run_cli(
        monkeypatch, capsys, "steer", "--model", lm_dir, "--vector", "iti", "--positive-file", pos, "--negative-file", neg,
        "--heads", "3", "--direction", "probe", "--coefficient", "10", "--prompt", PROMPT, "--max-new-tokens", "4",
    )
    assert code == 0, err
    assert seen["sets"] == (POSITIVE, NEGATIVE) and seen["options"]["heads"] == 3 and seen["options"]["direction"] == "probe"
    assert "iti at 3 heads of blocks" in " ".join(out.split()) and "with the vector" in out
    assert "validation accuracy" in " ".join(err.split())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--layer", "1"], "no --layer"),
        (["--direction", "probes"], "did you mean 'probe'"),
        (["--heads", "0"], "--heads must be at least 1"),
    ],
)
def test_cli_steer_iti_bad_input_is_one_line_and_exit_2(monkeypatch, capsys, lm_dir, tmp_path, args, message):
    pos, neg = _sets(tmp_path)
    code, _, err = run_cli(
        monkeypatch, capsys, "steer", "--model", lm_dir, "--vector", "iti", "--positive-file", pos, "--negative-file", neg, "--prompt", PROMPT, *args
    )
    assert code == 2 and message in err and "Traceback" not in err, err


def test_cli_steer_files_need_both_and_a_labelled_vector(monkeypatch, capsys, lm_dir, tmp_path):
    pos, _ = _sets(tmp_path)
    code, _, err = run_cli(monkeypatch, capsys, "steer", "--model", lm_dir, "--vector", "iti", "--positive-file", pos, "--prompt", PROMPT)
    assert code == 2 and "both --positive-file and --negative-file" in err
    code, _, err = run_cli(
        monkeypatch, capsys, "steer", "--model", lm_dir, "--vector", "caa", "--positive-file", pos, "--negative-file", pos, "--prompt", PROMPT
    )
    assert code == 2 and "labelled sets of --vector mean or iti" in err
