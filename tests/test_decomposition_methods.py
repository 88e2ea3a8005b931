"""The decomposition family -- DecompX, ALTI, GlobEnc, ALTI-Logit, Value Zeroing (methods.md
§2.2-2.4) -- against what each decomposes and against plain per-layer loops from the papers'
equations, written here with each family's own Hugging Face modules (hooks, weights by name):

* DecompX: the tokens' scores sum to the model's logit (every class, every tiny family and
  head, every bias rule); layer-wise sums are LogAt's logit lens at the anchor; the scores equal
  the reference's algorithm (vector aggregation, absdot, GELU and tanh zero-origin slopes) on
  BERT;
* ALTI and GlobEnc: each layer's source vectors sum to the sub-layer's own output (hooked on
  the model's modules) in every family; the final scores equal a per-layer loop of the
  papers' equations;
* ALTI-Logit: each layer's updates sum to the logit lens of the attention output; the scores
  equal the reference's algorithm;
* Value Zeroing: equals a loop that zeroes one token's values in one layer at a time (1e-5).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from tiny import DECODERS, ENCODERS, FAMILIES, tiny_hf, tiny_model

import heedful
from heedful.attribution.contributions import layer_vectors, logit_contributions
from heedful.attribution.decomposition import Settings, decompose, recordings
from heedful.errors import InputError, UnsupportedModelError
from heedful.testing import MASKED_TEXTS, tasks_of

TEXTS = ["a charming and often affecting journey", "dull"]
RTOL = 1e-4


@functools.cache
def cached_model(family: str, task: str = "classification", relative: bool = False, double: bool = False) -> heedful.Model:
    """A tiny seeded model of ``family`` whose biases and norm weights are drawn too (the tiny
    models' are 0 and 1: a bias shared wrongly, a norm's weight or bias left out would go
    unnoticed), weights at the conformance models' scale; ``relative``: DeBERTa-v2 with
    relative attention (content-to-position and position-to-content terms, no absolute
    positions); ``double``: in float64 (exactness checks free of float32 rounding)."""
    scale = {"init_std" if family == "opt" else "initializer_range": 0.2}
    if relative:
        scale.update(relative_attention=True, pos_att_type=["p2c", "c2p"], position_buckets=8, max_relative_positions=16, position_biased_input=False)
    hf, tokenizer = tiny_hf(family, task, **scale)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if name.endswith("bias"):
                param.copy_(0.2 * torch.randn(param.shape, generator=gen))
            elif param.dim() == 1 and "norm" in name.lower():
                param.copy_(1 + 0.2 * torch.randn(param.shape, generator=gen))
    if double:
        hf = hf.double()
    return heedful.from_pretrained_objects(hf, tokenizer, name=f"biased-{family}-{task}{'-float64' if double else ''}")


def texts_for(model) -> list[str]:
    if model.task == "masked_lm":
        return [t.format(mask=model.tokenizer.mask_token) for t in MASKED_TEXTS]
    return TEXTS


def hf_logits(model, text: str) -> torch.Tensor:
    """Hugging Face's own logits at the explained position, the text alone."""
    enc = model.tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        logits = model.hf_model(**enc).logits
    if model.task in ("classification", "regression"):
        return logits[0]
    ids = enc["input_ids"][0]
    position = int((ids == model.tokenizer.mask_token_id).nonzero()[0, 0]) if model.task == "masked_lm" else len(ids) - 1
    return logits[0, position]


def relative(found: float, expected: float, scale: float) -> float:
    """``|found - expected|`` relative to the logit, or to 1% of the largest logit ``scale`` when
    the logit is nearer 0 than that (float32 rounding of a pass is ~1e-7 of the largest)."""
    return abs(found - expected) / max(abs(expected), 1e-2 * scale, 1e-6)


# --------------------------------------------------------------------------- DecompX
WORST: dict[str, float] = {}


@pytest.mark.parametrize("family", FAMILIES)
def test_decompx_scores_sum_to_every_logit_of_every_family_and_head(family):
    worst = 0.0
    for task in tasks_of(family):
        model = cached_model(family, task)
        texts = texts_for(model)
        for text in texts:
            logits = hf_logits(model, text)
            scale = float(logits.abs().max())
            columns = range(len(logits)) if task == "classification" else [int(logits.argmax())] if task != "regression" else [0]
            for column in columns:
                target = column if task == "classification" else None
                for rule in ("absdot", "norm", "equal", "abssim"):
                    e = model.explain(text, "decompx", target=target, bias_decomp=rule)
                    assert e.target.indices[0] == column
                    worst = max(worst, relative(float(e.scores.sum()), float(logits[column]), scale))
    WORST[family] = worst
    assert worst <= RTOL, f"{family}: largest relative error {worst:.2e}"


def test_decompx_deberta_relative_attention_adds_up():
    model = cached_model("deberta-v2", "classification", relative=True)
    assert model.hf_model.config.relative_attention and model.hf_model.config.pos_att_type == ["p2c", "c2p"]
    for text in TEXTS:
        logits = hf_logits(model, text)
        for column in range(len(logits)):
            e = model.explain(text, "decompx", target=column)
            assert relative(float(e.scores.sum()), float(logits[column]), float(logits.abs().max())) <= RTOL


def test_decompx_deberta_head_tied_to_the_word_embeddings_adds_up():
    # DeBERTa-v2's non-legacy masked-LM head projects with the word embeddings (no module call)
    model = tiny_model("deberta-v2", "masked_lm", legacy=False, initializer_range=0.2)
    assert getattr(model.hf_model, "lm_predictions", None) is not None
    text = texts_for(model)[0]
    logits = hf_logits(model, text)
    e = model.explain(text, "decompx")
    assert relative(float(e.scores.sum()), float(logits[int(logits.argmax())]), float(logits.abs().max())) <= RTOL


def test_decompx_post_ln_decoder_adds_up_too():
    model = tiny_model("opt", "causal_lm", do_layer_norm_before=False, init_std=0.2)
    assert not model.adapter.roles().blocks[0].pre_ln
    text = TEXTS[0]
    logits = hf_logits(model, text)
    column = int(logits.argmax())
    e = model.explain(text, "decompx")
    assert relative(float(e.scores.sum()), float(logits[column]), float(logits.abs().max())) <= RTOL


@pytest.mark.parametrize(("family", "task"), [("bert", "classification"), ("qwen2", "causal_lm"), ("gpt2", "regression")])
def test_decompx_without_biases_sets_them_aside_and_the_rest_still_adds_up(family, task):
    model = cached_model(family, task)
    problem = model.prepare(TEXTS)
    expected = problem.target.score(problem.reference.logits)
    for rec in recordings(problem, "decompx", 5.0):
        found = decompose(problem, rec, Settings(aside=True))
        tokens, biases = found.target[:, :-1], found.target[:, -1]
        assert torch.allclose(tokens.sum(-1) + biases, expected[rec.rows], rtol=RTOL, atol=1e-5)
        assert biases.abs().max() > 1e-3, "the biases set aside are 0: the test would prove nothing"
    without = model.explain(TEXTS, "decompx", include_biases=False)
    with_biases = model.explain(TEXTS, "decompx")
    assert not np.allclose(without[0].scores, with_biases[0].scores)


@pytest.mark.parametrize(("family", "task"), [("bert", "classification"), ("roberta", "masked_lm"), ("llama", "causal_lm"), ("opt", "classification")])
def test_decompx_layerwise_sums_are_the_logit_lens_at_the_anchor(family, task):
    model = cached_model(family, task)
    texts = texts_for(model)
    layerwise = model.explain(texts, "decompx", layerwise=True)
    logat = model.explain(texts, "logat", layerwise=True)
    for d, lens in zip(layerwise, logat, strict=True):
        assert d.scores.shape == lens.scores.shape
        at_anchor = lens.scores[:, d.target.anchor]
        np.testing.assert_allclose(d.scores.sum(-1), at_anchor, rtol=RTOL, atol=1e-5 * np.abs(at_anchor).max())
    last = model.explain(texts, "decompx")
    for d, e in zip(layerwise, last, strict=True):
        np.testing.assert_allclose(d.scores[-1], e.scores, rtol=1e-5, atol=1e-6)


def test_decompx_options_change_what_is_computed():
    model = cached_model("bert", "classification")
    problem = model.prepare(TEXTS[0])
    base = model.explain(TEXTS[0], "decompx").scores
    no_ffn = model.explain(TEXTS[0], "decompx", include_ffn=False).scores
    norms = model.explain(TEXTS[0], "decompx", include_classifier=False).scores
    assert not np.allclose(base, no_ffn)
    assert (norms >= 0).all() and not np.allclose(norms, np.abs(base))
    assert abs(base.sum() - float(problem.target.score(problem.reference.logits)[0])) < 1e-4


def _absdot(parts: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """The reference's bias_decomposer (absdot): ``parts`` ``[..., K, D]`` + shares of ``bias``."""
    weights = (parts * bias).sum(-1).abs()
    weights = weights / (weights.sum(-1, keepdim=True) + 1e-12)
    return parts + weights[..., None] * bias


def _ln_parts(parts: torch.Tensor, pre_ln: torch.Tensor, ln: torch.nn.LayerNorm) -> torch.Tensor:
    """The reference's ln_decomposer: ``parts`` ``[N, K, D]`` of the LayerNorm input ``pre_ln``."""
    var = pre_ln.var(-1, unbiased=False, keepdim=True)[:, None, :]
    normed = (parts - parts.mean(-1, keepdim=True)) / torch.sqrt(var + ln.eps) * ln.weight
    return _absdot(normed, ln.bias)


def decompx_oracle_bert(model, text: str, column: int) -> np.ndarray:
    """DecompX as its reference computes it for BERT (vector aggregation, absdot, GELU and tanh
    zero-origin slopes, pooler and classifier), one layer at a time with BERT's own modules."""
    hf = model.hf_model
    enc = model.tokenizer(text, return_tensors="pt")
    seen: dict[str, torch.Tensor] = {}
    hooks = []
    for i, layer in enumerate(hf.bert.encoder.layer):
        for name, mod, side in (
            ("ln1", layer.attention.output.LayerNorm, "in"),
            ("ln2", layer.output.LayerNorm, "in"),
            ("z", layer.intermediate.dense, "out"),
        ):
            def hook(m, args, out, key=f"{name}{i}", side=side):
                seen[key] = (args[0] if side == "in" else out)[0].detach()

            hooks.append(mod.register_forward_hook(hook))
    with torch.no_grad():
        out = hf(**enc, output_hidden_states=True, output_attentions=True)
    for h in hooks:
        h.remove()
    heads = hf.config.num_attention_heads
    x0 = out.hidden_states[0][0]
    n, dim = x0.shape
    parts = torch.zeros(n, n, dim)
    parts[torch.arange(n), torch.arange(n)] = x0
    with torch.no_grad():
        for i, layer in enumerate(hf.bert.encoder.layer):
            att = layer.attention
            probs = out.attentions[i][0]  # [H, N, N]
            values = (parts @ att.self.value.weight.T).reshape(n, n, heads, -1)  # [j, k, h, e]
            w_o = att.output.dense.weight.reshape(dim, heads, -1)
            mixed = torch.einsum("hij,jkhe,dhe->ikd", probs, values, w_o)
            bias = w_o.reshape(dim, -1) @ att.self.value.bias + att.output.dense.bias
            res = _absdot(mixed + parts, bias)
            res = _ln_parts(res, seen[f"ln1{i}"], att.output.LayerNorm)
            up = _absdot(res @ layer.intermediate.dense.weight.T, layer.intermediate.dense.bias)
            z = seen[f"z{i}"]
            up = up * (torch.nn.functional.gelu(z) / z)[:, None, :]
            ffn = _absdot(up @ layer.output.dense.weight.T, layer.output.dense.bias)
            parts = _ln_parts(res + ffn, seen[f"ln2{i}"], layer.output.LayerNorm)
        pooler, classifier = hf.bert.pooler.dense, hf.classifier
        pooled = _absdot(parts[0] @ pooler.weight.T, pooler.bias)  # [K, D]
        pre = out.hidden_states[-1][0, 0] @ pooler.weight.T + pooler.bias
        pooled = pooled * (torch.tanh(pre) / pre)
        logits = _absdot(pooled @ classifier.weight.T, classifier.bias)  # [K, C]
    return logits[:, column].numpy()


def test_decompx_equals_the_reference_algorithm_on_bert():
    model = cached_model("bert", "classification")
    for text in TEXTS:
        logits = hf_logits(model, text)
        for column in range(len(logits)):
            expected = decompx_oracle_bert(model, text, column)
            ours = model.explain(text, "decompx", target=column).scores
            np.testing.assert_allclose(ours, expected, rtol=1e-4, atol=1e-5 * np.abs(expected).max())
            assert np.abs(expected).max() > 1e-2


def test_decompx_refuses_a_model_whose_blocks_do_not_add_up():
    # DeBERTa-v2 with a convolution after its first block: no role describes it
    model = tiny_model("deberta-v2", "classification", conv_kernel_size=3, initializer_range=0.2)
    with pytest.raises(UnsupportedModelError, match="does not add up at block 0") as info:
        model.explain(TEXTS[0], "decompx")
    assert info.value.hint


def test_examples_are_grouped_under_the_memory_budget():
    model = cached_model("bert", "classification")
    texts = ["a charming and often affecting journey", "dull", "the movie was dull and far too long", "an intelligent film"]
    together = model.explain(texts, "decompx")
    adapter = model.adapter
    before = adapter.max_memory
    problem = model.prepare(texts)
    from heedful.attribution.decomposition import FLOAT_BYTES, TRANSIENT, example_bytes

    one = example_bytes(adapter, int(problem.batch.lengths.max()), 5.0)
    try:
        adapter.max_memory = FLOAT_BYTES * TRANSIENT + one + 1  # room for the longest example alone
        groups = list(recordings(problem, "decompx", 5.0))
        assert len(groups) > 1 and sorted(int(r) for g in groups for r in g.rows) == [0, 1, 2, 3]
        assert all(g.size * example_bytes(adapter, g.width, 5.0) <= one + 1 for g in groups)
        apart = model.explain(texts, "decompx")
        adapter.max_memory = FLOAT_BYTES * TRANSIENT + one // 2
        with pytest.raises(InputError, match=r"decompx needs about .* for an input of \d+ tokens"):
            model.explain(texts, "decompx")
    finally:
        adapter.max_memory = before
    for a, b in zip(together, apart, strict=True):
        np.testing.assert_allclose(a.scores, b.scores, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- ALTI, GlobEnc
def sublayer_output(family: str, layer) -> tuple[torch.nn.Module, str]:
    """Where the attention sub-layer's output passes in one block of ``family``: the first
    norm's output (post-LN) or the second norm's input (pre-LN: the residual after attention)."""
    if family in ("bert", "roberta", "electra", "deberta-v2"):
        return layer.attention.output.LayerNorm, "output"
    if family == "distilbert":
        return layer.sa_layer_norm, "output"
    if family == "gpt2":
        return layer.ln_2, "input"
    if family == "opt":
        return layer.final_layer_norm, "input"
    return layer.post_attention_layernorm, "input"


def hf_blocks(family: str, hf):
    """The blocks of a tiny model of ``family``, by name."""
    base = hf.base_model
    if family == "distilbert":
        return base.transformer.layer
    if family in ENCODERS:
        return base.encoder.layer
    if family == "gpt2":
        return base.h
    if family == "opt":
        return base.decoder.layers
    return base.layers


@pytest.mark.parametrize(("family", "relative"), [(f, False) for f in FAMILIES] + [("deberta-v2", True)])
def test_each_layers_source_vectors_sum_to_the_sublayer_output(family, relative):
    model = cached_model(family, "classification", relative)
    hf = model.hf_model
    text = TEXTS[0]
    seen: dict[int, torch.Tensor] = {}
    hooks = []
    for i, layer in enumerate(hf_blocks(family, hf)):
        module, side = sublayer_output(family, layer)

        def hook(m, args, out, i=i, side=side):
            seen[i] = (args[0] if side == "input" else out).detach()

        hooks.append(module.register_forward_hook(hook))
    with torch.no_grad():
        hf(**model.tokenizer(text, return_tensors="pt"))
    for h in hooks:
        h.remove()
    problem = model.prepare(text)
    roles = model.adapter.roles()
    worst = 0.0
    (rec,) = recordings(problem, "alti", 4.0)
    for i, (block_rec, block) in enumerate(zip(rec.blocks, roles.blocks, strict=True)):
        vectors = layer_vectors(block_rec, block)
        real = seen[i].reshape(vectors.output.shape)
        err = float(((vectors.output - real).norm(dim=-1) / real.norm(dim=-1)).max())
        # the sum of the sources' vectors is the output without its bias terms
        assert vectors.vectors.shape[1:3] == (real.shape[1], real.shape[1])
        worst = max(worst, err)
    assert worst <= RTOL, f"{family}: {worst:.2e}"


def oracle_layers(family: str, model, text: str):
    """Per layer, from the model's own modules: block input ``x`` ``[N, D]``, probabilities
    ``[H, N, N]``, value vectors ``[N, Hkv, d]``, ``W_O`` ``[D, H, d]`` and ``b_O``, whether the
    block is pre-LN, the first norm's input and module (post-LN), the second norm's input and
    module, the final norm's input."""
    hf = model.hf_model
    cfg = hf.config
    heads = cfg.num_attention_heads
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    blocks = hf_blocks(family, hf)
    seen: dict[str, torch.Tensor] = {}
    hooks = []

    def keep(key, side):
        def hook(m, args, out):
            seen[key] = (args[0] if side == "in" else out).detach()

        return hook

    layers = []
    for i, layer in enumerate(blocks):
        if family == "bert":
            value, w_o, ln1, ln2 = layer.attention.self.value, layer.attention.output.dense, layer.attention.output.LayerNorm, layer.output.LayerNorm
            w_out, b_out = w_o.weight, w_o.bias
        elif family == "gpt2":
            value, ln1, ln2 = layer.attn.c_attn, layer.ln_1, layer.ln_2
            w_out, b_out = layer.attn.c_proj.weight.T, layer.attn.c_proj.bias
        else:  # the Llama family
            value, ln1, ln2 = layer.self_attn.v_proj, layer.input_layernorm, layer.post_attention_layernorm
            w_out, b_out = layer.self_attn.o_proj.weight, None
        hooks += [value.register_forward_hook(keep(f"v{i}", "out")), ln1.register_forward_hook(keep(f"ln1{i}", "in")), ln2.register_forward_hook(keep(f"ln2{i}", "in"))]
        layers.append((value, w_out, b_out, ln1, ln2))
    final = {"gpt2": getattr(hf.base_model, "ln_f", None)}.get(family, getattr(hf.base_model, "norm", None))
    if final is not None:
        hooks.append(final.register_forward_hook(keep("final", "in")))
    with torch.no_grad():
        out = hf(**model.tokenizer(text, return_tensors="pt"), output_hidden_states=True, output_attentions=True)
    for h in hooks:
        h.remove()
    found = []
    dim = cfg.hidden_size
    for i, (_value, w_out, b_out, ln1, ln2) in enumerate(layers):
        v = seen[f"v{i}"][0]
        if family == "gpt2":
            v = v[:, 2 * dim : 3 * dim]
        found.append(
            {
                "x": out.hidden_states[i][0],
                "probs": out.attentions[i][0],
                "values": v.reshape(v.shape[0], kv, -1),
                "w_out": w_out.reshape(dim, heads, -1),
                "b_out": b_out,
                "pre_ln": family != "bert",
                "ln1_in": seen[f"ln1{i}"][0],
                "ln1": ln1,
                "ln2_in": seen[f"ln2{i}"][0],
                "ln2": ln2,
            }
        )
    return found, (seen["final"][0] if "final" in seen else None), final, out


def _ln_lin(x: torch.Tensor, real: torch.Tensor, ln) -> torch.Tensor:
    """A norm linearised at ``real``'s statistics (LayerNorm or RMSNorm, by its module)."""
    if isinstance(ln, torch.nn.LayerNorm):
        return (x - x.mean(-1, keepdim=True)) / torch.sqrt(real.var(-1, unbiased=False, keepdim=True) + ln.eps) * ln.weight
    return x / torch.sqrt(real.pow(2).mean(-1, keepdim=True) + ln.variance_epsilon) * ln.weight


def oracle_vectors(layer: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """``T[i, j]`` ``[N, N, D]`` (one loop over sources ``j``) and the output ``y`` ``[N, D]``."""
    x, probs, values, w_out = layer["x"], layer["probs"], layer["values"], layer["w_out"]
    n = x.shape[0]
    heads, kv = probs.shape[0], values.shape[1]
    vectors = torch.zeros(n, n, x.shape[1])
    for j in range(n):
        for h in range(heads):
            f = w_out[:, h] @ values[j, h // (heads // kv)]  # f_h(x_j) [D]
            vectors[:, j] += probs[h, :, j, None] * f
        vectors[j, j] += x[j]
    if layer["pre_ln"]:
        y = vectors.sum(1) + (0 if layer["b_out"] is None else layer["b_out"])
        return vectors, y
    ln1, real = layer["ln1"], layer["ln1_in"]
    lin = _ln_lin(vectors, real[:, None, :], ln1)
    y = lin.sum(1) + _ln_lin(layer["b_out"], real, ln1) + ln1.bias
    return lin, y


def rollout_rows(matrices: list[torch.Tensor], anchor: int) -> np.ndarray:
    joint = matrices[0]
    for m in matrices[1:]:
        joint = m @ joint
    return joint[anchor].numpy()


def alti_oracle(family: str, model, text: str) -> list[torch.Tensor]:
    layers, *_ = oracle_layers(family, model, text)
    found = []
    for layer in layers:
        vectors, y = oracle_vectors(layer)
        n = y.shape[0]
        c = torch.zeros(n, n)
        for i in range(n):
            for j in range(n):
                c[i, j] = max(0.0, float(y[i].abs().sum() - (y[i] - vectors[i, j]).abs().sum()))
        found.append(c / c.sum(-1, keepdim=True))
    return found


def anchor_of(family: str, text: str, model) -> int:
    return len(model.tokenizer(text)["input_ids"]) - 1 if family in DECODERS else 0


@pytest.mark.parametrize(("family", "task"), [("bert", "classification"), ("gpt2", "causal_lm"), ("qwen2", "classification")])
def test_alti_equals_the_papers_equations_layer_by_layer(family, task):
    model = cached_model(family, task)
    explained = model.explain(TEXTS, "alti")
    layerwise = model.explain(TEXTS, "alti", layerwise=True)
    per_layer = model.explain(TEXTS, "alti", layerwise=True, rollout=False)
    for text, e, lw, own in zip(TEXTS, explained, layerwise, per_layer, strict=True):
        matrices = alti_oracle(family, model, text)
        anchor = anchor_of(family, text, model)
        expected = rollout_rows(matrices, anchor)
        np.testing.assert_allclose(e.scores, expected, rtol=1e-4, atol=1e-6)
        for layer in range(len(matrices)):
            np.testing.assert_allclose(lw.scores[layer], rollout_rows(matrices[: layer + 1], anchor), rtol=1e-4, atol=1e-6)
            np.testing.assert_allclose(own.scores[layer], matrices[layer][anchor].numpy(), rtol=1e-4, atol=1e-6)
        assert abs(expected.sum() - 1) < 1e-5  # rows of a product of row-stochastic matrices


@pytest.mark.parametrize(("family", "task"), [("bert", "classification"), ("gpt2", "classification"), ("qwen2", "causal_lm")])
def test_globenc_equals_the_papers_equations_layer_by_layer(family, task):
    model = cached_model(family, task)
    explained = model.explain(TEXTS, "globenc")
    per_layer = model.explain(TEXTS, "globenc", layerwise=True, rollout=False)
    for text, e, own in zip(TEXTS, explained, per_layer, strict=True):
        layers, *_ = oracle_layers(family, model, text)
        matrices = []
        for layer in layers:
            vectors, _ = oracle_vectors(layer)  # post-LN: through the first norm already
            if not layer["pre_ln"]:
                vectors = _ln_lin(vectors, layer["ln2_in"][:, None, :], layer["ln2"])
            matrices.append(vectors.norm(dim=-1))
        anchor = anchor_of(family, text, model)
        expected = rollout_rows(matrices, anchor)
        np.testing.assert_allclose(e.scores, expected, rtol=1e-4, atol=1e-6 * np.abs(expected).max())
        for layer, matrix in enumerate(matrices):  # GlobEnc¬: each layer's own norms
            row = matrix[anchor].numpy()
            np.testing.assert_allclose(own.scores[layer], row, rtol=1e-4, atol=1e-6 * np.abs(row).max())


def test_alti_and_globenc_are_task_independent():
    for method in ("alti", "globenc"):
        a = cached_model("bert", "classification").explain(TEXTS[0], method, target="NEGATIVE").scores
        b = cached_model("bert", "classification").explain(TEXTS[0], method, target="POSITIVE").scores
        np.testing.assert_array_equal(a, b)


# --------------------------------------------------------------------------- ALTI-Logit
@pytest.mark.parametrize(("family", "task"), [("gpt2", "causal_lm"), ("llama", "causal_lm"), ("qwen2", "classification")])
def test_alti_logit_equals_the_reference_algorithm(family, task):
    model = cached_model(family, task)
    hf = model.hf_model
    explained = model.explain(TEXTS, "alti_logit")
    plain = model.explain(TEXTS, "alti_logit", rollout=False)
    for text, e, p in zip(TEXTS, explained, plain, strict=True):
        layers, final_in, final, _ = oracle_layers(family, model, text)
        anchor = anchor_of(family, text, model)
        column = e.target.indices[0]
        unembed = (hf.lm_head if task == "causal_lm" else hf.score).weight[column]
        matrices = alti_oracle(family, model, text)
        total = np.zeros(len(e.scores))
        untracked = np.zeros(len(e.scores))
        for i, layer in enumerate(layers):
            heads, kv = layer["probs"].shape[0], layer["values"].shape[1]
            update = torch.zeros(layer["x"].shape[0])
            for j in range(len(update)):
                vec = sum(layer["probs"][h, anchor, j] * (layer["w_out"][:, h] @ layer["values"][j, h // (heads // kv)]) for h in range(heads))
                update[j] = unembed @ _ln_lin(vec, final_in[anchor], final)
            untracked += update.numpy()
            if i > 0:
                joint = matrices[0]
                for m in matrices[1:i]:
                    joint = m @ joint
                update = update @ joint
            total += update.numpy()
        with torch.no_grad():
            np.testing.assert_allclose(e.scores, total, rtol=1e-4, atol=1e-5 * np.abs(total).max())
            np.testing.assert_allclose(p.scores, untracked, rtol=1e-4, atol=1e-5 * np.abs(untracked).max())
        assert np.abs(total).max() > 1e-3


@pytest.mark.parametrize("family", [f for f in DECODERS])
def test_alti_logit_layer_updates_sum_to_the_logit_lens_of_the_attention_output(family):
    for task in tasks_of(family):
        model = cached_model(family, task)
        problem = model.prepare(TEXTS)
        adapter = model.adapter
        roles = adapter.roles()
        for rec in recordings(problem, "alti_logit", 4.0):  # groups of similar length
            per_layer = logit_contributions(problem, rec, roles, rollout=False)  # [b, L, N]
            rows = torch.arange(rec.size)
            for layer, block in enumerate(roles.blocks):
                attn = rec.blocks[layer].attn_out[rows, rec.anchor]  # [b, D]
                b_out = block.attn_out.module.bias
                if b_out is not None:
                    attn = attn - b_out
                final = roles.final_norm
                real = rec.final_in[rows, rec.anchor]
                normed = _ln_lin(attn, real, final.module)
                head = adapter.roles().head.steps
                lens = normed
                for step in head:
                    weight = step.weight() if hasattr(step, "weight") and callable(step.weight) else step.module.weight
                    lens = lens @ weight.T
                classes = problem.target.classes[rec.rows]
                expected = (lens.gather(1, classes) * problem.target.weights).sum(-1)
                found = per_layer[:, layer].sum(-1)
                torch.testing.assert_close(found, expected, rtol=RTOL, atol=1e-5)


@pytest.mark.parametrize("family", ENCODERS)
def test_alti_logit_refuses_post_ln_models_with_a_hint(family):
    model = cached_model(family, "classification")
    with pytest.raises(UnsupportedModelError, match="post-LN") as info:
        model.explain(TEXTS[0], "alti_logit")
    assert "decompx" in info.value.hint


# --------------------------------------------------------------------------- Value Zeroing
def value_module(family: str, layer) -> tuple[torch.nn.Module, slice]:
    """The value projection of one block and the columns of its output that are the values."""
    if family == "bert":
        return layer.attention.self.value, slice(None)
    if family == "gpt2":
        dim = layer.attn.c_attn.weight.shape[0]
        return layer.attn.c_attn, slice(2 * dim, 3 * dim)
    return layer.self_attn.v_proj, slice(None)


def value_zeroing_oracle(family: str, model, text: str) -> np.ndarray:
    """``S[l, i, j]`` from L x N full passes, each zeroing token j's values in layer l only
    (so layer l's input is the original one) and reading layer l's output."""
    hf = model.hf_model
    enc = model.tokenizer(text, return_tensors="pt")
    n = enc["input_ids"].shape[1]
    blocks = hf_blocks(family, hf)

    def run(layer: int, token: int | None) -> torch.Tensor:
        kept: list[torch.Tensor] = []

        def zero(m, args, out):
            out = out.clone()
            module, columns = value_module(family, blocks[layer])
            out[0, token, columns] = 0
            return out

        def read(m, args, out):
            kept.append((out[0] if isinstance(out, tuple) else out)[0].detach())

        hooks = [blocks[layer].register_forward_hook(read)]
        if token is not None:
            hooks.append(value_module(family, blocks[layer])[0].register_forward_hook(zero))
        with torch.no_grad():
            hf(**enc)
        for h in hooks:
            h.remove()
        return kept[0].double()

    found = np.zeros((len(blocks), n, n))
    for layer in range(len(blocks)):
        original = run(layer, None)
        for token in range(n):
            zeroed = run(layer, token)
            cos = torch.nn.functional.cosine_similarity(zeroed, original, dim=-1)
            found[layer, :, token] = (1 - cos).clamp_min(0).numpy()
    return found / found.sum(-1, keepdims=True)


def _check_value_zeroing(model, family: str, atol: float) -> None:
    texts = texts_for(model)
    explained = model.explain(texts, "value_zeroing")
    single = model.explain(texts, "value_zeroing", rollout=False, layerwise=True)
    for text, e, s in zip(texts, explained, single, strict=True):
        matrices = value_zeroing_oracle(family, model, text)
        anchor = e.target.anchor
        joint = matrices[0]
        for m in matrices[1:]:
            joint = m @ joint
        np.testing.assert_allclose(e.scores, joint[anchor], atol=atol)
        np.testing.assert_allclose(s.scores, matrices[:, anchor], atol=atol)
        assert np.abs(joint[anchor]).max() > 1e-2


VALUE_ZEROING_CASES = [("bert", "classification"), ("bert", "masked_lm"), ("gpt2", "causal_lm"), ("qwen2", "classification")]


@pytest.mark.parametrize(("family", "task"), VALUE_ZEROING_CASES)
def test_value_zeroing_equals_zeroing_one_token_at_a_time(family, task):
    """To 1e-5 in float32 and in float64 (where no float32 rounding can hide a difference)."""
    _check_value_zeroing(cached_model(family, task, double=True), family, 1e-5)
    _check_value_zeroing(cached_model(family, task), family, 1e-5)


@pytest.mark.parametrize(("family", "task"), VALUE_ZEROING_CASES[::2])
def test_value_zeroing_by_copies_equals_the_loop_too(family, task, monkeypatch):
    """The copies (every family; used when the rest of a block is not what the roles describe)."""
    from heedful.attribution import value_zeroing as vz

    def refuse(problem):
        raise heedful.UnsupportedModelError("not described")

    monkeypatch.setattr(vz, "corrected_distances", refuse)
    model = cached_model(family, task)
    _check_value_zeroing(model, family, 1e-5)
    e = model.explain(texts_for(model), "value_zeroing")
    lengths = [len(x.tokens) for x in e]
    # the prediction's pass, the originals' pass and one copy per token, per example on average
    assert e[0].cost.forward_passes == (2 * len(e) + sum(lengths)) / len(e)


def test_value_zeroing_falls_back_to_copies_where_a_block_is_not_what_its_roles_describe():
    """A hook scales one block's MLP output: the rest of the block the roles describe
    no longer reproduces the recorded output, the guard sends Value Zeroing to the copies (which
    run the model as it is), and the scores still equal the loop's."""
    model = cached_model("bert", "classification")
    block = model.adapter.roles().blocks[0]
    hook = block.mlp_out.module.register_forward_hook(lambda m, args, out: out * 1.5)
    try:
        e = model.explain(TEXTS, "value_zeroing", rollout=False, layerwise=True)
        assert e[0].cost.forward_passes > 2  # copies ran
        for text, ex in zip(TEXTS, e, strict=True):
            np.testing.assert_allclose(ex.scores, value_zeroing_oracle("bert", model, text)[:, ex.target.anchor], atol=1e-5)
    finally:
        hook.remove()


def test_value_zeroing_over_the_budget_of_its_states_runs_by_copies():
    from heedful.attribution.decomposition import FLOAT_BYTES, TRANSIENT, example_bytes

    model = cached_model("bert", "classification")
    corrected = model.explain(TEXTS, "value_zeroing")
    adapter = model.adapter
    before = adapter.max_memory
    longest = int(model.prepare(TEXTS).batch.lengths.max())
    try:  # the N x N states of the longest example do not fit; N copies of it do
        adapter.max_memory = FLOAT_BYTES * TRANSIENT + example_bytes(adapter, longest, 5.0) // 2
        copied = model.explain(TEXTS, "value_zeroing")
    finally:
        adapter.max_memory = before
    assert copied[0].cost.forward_passes > 2 and corrected[0].cost.forward_passes == 2
    for a, b in zip(corrected, copied, strict=True):
        np.testing.assert_allclose(a.scores, b.scores, atol=1e-5)


def test_value_zeroing_costs_two_forwards_by_the_attention_correction():
    model = cached_model("llama", "causal_lm")
    e = model.explain(TEXTS, "value_zeroing")
    # the prediction's pass and the recording pass; no copy
    assert e[0].cost.forward_passes == 2.0
