"""Every family heedful maps passes heedful.testing.check_family on its tiny model; tiny random
models of every family, wrapped as a user wraps them, are explained by a method of each kind
(each call runs or refuses in one line); a fused projection gives the scores of the same model
with split projections; the family table is guarded."""

from __future__ import annotations

import pytest
import torch
import transformers as tf

import heedful
from heedful.adapters import FAMILIES, register_family
from heedful.adapters.families import LlamaAdapter
from heedful.family_checks import ROLE_METHODS
from heedful.testing import (
    ALL_FAMILIES,
    TINY_FAMILIES,
    fast_options,
    parametrize_with_families,
    tiny_hf,
)


@parametrize_with_families()
def test_family(family_check):
    family_check()


def test_every_family_heedful_maps_has_a_tiny_model():
    assert set(FAMILIES) - {"xlm-roberta", "camembert"} == set(TINY_FAMILIES)


KINDS = ("saliency", "leave_one_out", "raw_attention", "chefer", "attnlrp", "decompx")
"""A gradient, a perturbation, an attention, two relevance and a decomposition method."""


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_wrapped_tiny_models_are_explained_or_refused_in_one_line(family):
    hf_model, tokenizer = tiny_hf(family, "classification", **{TINY_FAMILIES[family].init: 0.2})
    model = heedful.from_pretrained_objects(hf_model, tokenizer)
    ran = []
    for method in KINDS:
        try:
            e = model.explain("a charming and often affecting journey", method)
        except heedful.UnsupportedModelError as exc:
            assert "\n" not in exc.args[0] and exc.hint, f"{method}: {exc}"
            continue
        assert e.scores.shape == (len(e.tokens),) and torch.isfinite(torch.as_tensor(e.scores)).all(), method
        ran.append(method)
    assert {"saliency", "leave_one_out", "raw_attention"} <= set(ran)


def test_at_least_twelve_families_run_a_relevance_and_a_decomposition_method():
    mapped = [f for f in ALL_FAMILIES if "chefer" in heedful.adapters.FAMILIES[f].relevance_rules]
    assert len(ALL_FAMILIES) >= 12 and len(mapped) >= 12, mapped


# --------------------------------------------------------------------------- split weights
def _split_llama(phi3: torch.nn.Module) -> torch.nn.Module:
    """A Llama with Phi-3's weights, its fused ``qkv_proj`` and ``gate_up_proj`` cut into
    ``q/k/v_proj`` and ``gate/up_proj`` (the same function, computed with split projections)."""
    cfg = phi3.config
    llama_cfg = tf.LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads, max_position_embeddings=cfg.max_position_embeddings,
        rms_norm_eps=cfg.rms_norm_eps, rope_parameters=dict(cfg.rope_parameters), hidden_act=cfg.hidden_act,
        pad_token_id=cfg.pad_token_id, num_labels=cfg.num_labels, id2label=cfg.id2label, label2id=cfg.label2id,
        tie_word_embeddings=False,
    )
    llama = type(phi3).__name__.replace("Phi3", "Llama")
    split = getattr(tf, llama)._from_config(llama_cfg, attn_implementation="eager").eval()
    q = cfg.num_attention_heads * (cfg.hidden_size // cfg.num_attention_heads)
    kv = cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads)
    state = {}
    for name, value in phi3.state_dict().items():
        if name.endswith("qkv_proj.weight"):
            stem = name[: -len("qkv_proj.weight")]
            state[stem + "q_proj.weight"], state[stem + "k_proj.weight"], state[stem + "v_proj.weight"] = value.split([q, kv, kv])
        elif name.endswith("gate_up_proj.weight"):
            stem = name[: -len("gate_up_proj.weight")]
            state[stem + "gate_proj.weight"], state[stem + "up_proj.weight"] = value.chunk(2)
        else:
            state[name] = value
    missing, unexpected = split.load_state_dict(state, strict=False)
    assert not unexpected and all("rotary" in m for m in missing), (missing, unexpected)
    return split


@pytest.mark.parametrize("task", ["classification", "causal_lm"])
def test_fused_projections_give_the_scores_of_split_projections(task):
    phi3, tokenizer = tiny_hf("phi3", task, initializer_range=0.2)
    fused = heedful.from_pretrained_objects(phi3, tokenizer)
    split = heedful.from_pretrained_objects(_split_llama(phi3), tokenizer)
    assert fused.adapter.family == "phi3" and split.adapter.family == "llama"
    texts = ["a charming and often affecting journey", "the movie was dull"]
    compared = []
    for method in ROLE_METHODS:
        info = heedful.attribution.get_method(method)
        if not info.supports(task):
            continue
        options = fast_options(info, fused)
        for a, b in zip(fused.explain(texts, method, **options), split.explain(texts, method, **options), strict=True):
            scale = max(float(abs(b.scores).max()), 1e-6)
            torch.testing.assert_close(torch.as_tensor(a.scores) / scale, torch.as_tensor(b.scores) / scale, rtol=0, atol=1e-4, msg=method)
        compared.append(method)
    assert {"chefer", "lrp", "attnlrp", "decompx", "value_zeroing", "gae"} <= set(compared)


# --------------------------------------------------------------------------- the family table
def test_register_family_refuses_to_overwrite_unless_told():
    class Custom(LlamaAdapter):
        family = "custom-llama"

    with pytest.raises(heedful.InputError, match="registered already"):
        register_family("llama", Custom)
    assert FAMILIES["llama"] is LlamaAdapter
    register_family("custom-llama", Custom)
    try:
        with pytest.raises(heedful.InputError, match="overwrite=True"):
            register_family("custom-llama", LlamaAdapter)
        register_family("custom-llama", LlamaAdapter, overwrite=True)
        assert FAMILIES["custom-llama"] is LlamaAdapter
    finally:
        FAMILIES.pop("custom-llama")


def test_a_rule_set_a_family_does_not_map_is_refused_in_one_line():
    model = heedful.testing.tiny_model("qwen3")

    class Partial(type(model.adapter)):
        relevance_rules = frozenset({"chefer"})

    adapter = Partial(hf_model=model.hf_model, tokenizer=model.tokenizer, task=model.task)
    with pytest.raises(heedful.UnsupportedModelError, match="the attnlrp rules are not mapped for the qwen3 family"):
        adapter.lrp_roles("attnlrp")
    assert adapter.lrp_roles("chefer").num_layers == 2


def test_docs_models_md_is_what_heedful_models_families_markdown_writes():
    from pathlib import Path

    from heedful.commands.families import families_markdown

    written = (Path(__file__).resolve().parents[1] / "docs" / "models.md").read_text()
    assert written == families_markdown(), "docs/models.md drifted: heedful models --families --markdown > docs/models.md"


def test_replacing_gpt_neox_values_writes_every_heads_value_columns():
    # GPT-NeoX lays out query, key and value per head ([..., H, 3 * d]): the value role is a strided column range
    model = heedful.testing.tiny_model("gpt_neox", initializer_range=0.2)
    adapter = model.adapter
    adapter.kernel_attention = False
    batch = adapter.encode(["a charming and often affecting journey", "the movie was dull"])
    anchor = adapter.anchor_positions(batch)[0]
    keep = torch.ones(batch.input_ids.shape)
    keep[:, 2] = 0
    with adapter.intercept() as hooks, torch.no_grad():
        hooks.replace("value", lambda v: v * keep[..., None])
        ours = adapter.forward(batch, anchor).logits
    heads = adapter.config.num_attention_heads
    d = adapter.hidden_size // heads

    def by_hand(module, args, output):
        out = output.unflatten(-1, (heads, 3 * d)).clone()
        out[:, 2, :, 2 * d :] = 0
        return out.flatten(-2)

    handles = [layer.attention.query_key_value.register_forward_hook(by_hand) for layer in adapter.blocks]
    try:
        with torch.no_grad():
            theirs = adapter.forward(batch, anchor).logits
    finally:
        for handle in handles:
            handle.remove()
    with torch.no_grad():
        clean = adapter.forward(batch, anchor).logits
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    assert (ours - clean).abs().max() > 1e-5


# --------------------------------------------------------------------------- mixtures of experts
@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
def test_attnlrp_through_the_chosen_experts_conserves_relevance(family):
    """AttnLRP through a mixture of experts ``out = sum_k w_k E_k(x)`` (gated-MLP experts, no
    biases): the relevance reaching the tokens through the experts the router chose plus the
    relevance of the routing weights is the relevance of the block's output, to float32
    rounding -- half to each operand of ``w_k * E_k`` (uniform rule), and each expert's gated
    product, halved again, passes its half on whole (identity rule on the activation)."""
    from heedful.lrp.propagate import explained_score, lrp_forward
    from heedful.lrp.rules import rule_set

    model = heedful.testing.tiny_model(family, "causal_lm", initializer_range=0.2)
    experts = next(m for m in model.hf_model.modules() if type(m).__name__.endswith("Experts"))
    seen: list[tuple[torch.Tensor, ...]] = []
    # registered before the rules' hooks: sees the experts' output before the rules' output hook,
    # and the inputs after their input hook (x' = x with its gradient halved)
    handle = experts.register_forward_hook(lambda module, args, out: seen.append((args[0], args[2], out)))
    try:
        problem = model.prepare(["a charming and often affecting journey"])
        prepared = lrp_forward(model.adapter, problem.batch, problem.anchor, rule_set("attnlrp"))
    finally:
        handle.remove()
    x, w, out = seen[-1]  # the relevance forward's (prepare's reference pass ran them first)
    with torch.enable_grad():
        score = explained_score(prepared, model.adapter, problem.target).sum()
        gx, gw, gout = torch.autograd.grad(score, [x, w, out], retain_graph=True)
    received = 2 * float((out * gout).sum().detach())  # the rules halve the output's gradient: R_out = out . 2 g
    to_tokens = float((x * gx).sum().detach()) / 2  # and the input's: R_x = x . g_x' / 2
    to_router = float((w * gw).sum().detach())
    assert abs(received) > 1e-6
    assert abs(to_tokens + to_router - received) <= 1e-4 * abs(received), (to_tokens, to_router, received)
    assert abs(to_router - received / 2) <= 1e-4 * abs(received)
    e = model.explain("a charming and often affecting journey", "attnlrp")
    assert torch.isfinite(torch.as_tensor(e.scores)).all()
    with pytest.raises(heedful.UnsupportedModelError, match="rules.chefer|chefer relevance rules"):
        model.explain("a charming and often affecting journey", "chefer")


# --------------------------------------------------------------------------- StableLM's variants
def test_stablelm_with_parallel_attention_and_mlp_passes_check_family():
    from heedful.testing import check_family, tiny_model

    def parallel(task):
        return tiny_model("stablelm", task, initializer_range=0.2, use_parallel_residual=True)

    model = parallel("classification")
    assert all(block.parallel for block in model.adapter.roles().blocks)
    assert len(check_family(parallel)) == 12  # classification and causal LM x 6 checks


def test_stablelm_with_per_head_query_key_norms_is_refused_in_one_line():
    hf_model, tokenizer = tiny_hf("stablelm", "classification", qk_layernorm=True)
    with pytest.raises(heedful.UnsupportedModelError, match="qk_layernorm") as refused:
        heedful.from_pretrained_objects(hf_model, tokenizer)
    assert "\n" not in refused.value.args[0] and "generic=True" in refused.value.hint
    generic = heedful.from_pretrained_objects(hf_model, tokenizer, generic=True)
    assert generic.explain("a charming and often affecting journey", "saliency").scores.shape[0] > 2
