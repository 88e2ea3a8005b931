"""The interception layer (heedful.adapters.intercept) on every family: each role is read with
its shape and equals what the transformers modules compute; replacing a role changes the model as
the same change made by hand on the raw modules does; rules attach; and the model is exactly what
it was after the context, also when the block raised."""

from __future__ import annotations

import pytest
import torch
from conftest import cached_model
from tiny import DECODERS, ENCODERS, FAMILIES, tiny_hf, tiny_model

import heedful
from heedful.adapters import ROLES, GenericAdapter, ModelAdapter, adapter_for, register_family
from heedful.adapters import kernel as kernel_module
from heedful.adapters.families import LlamaAdapter
from heedful.adapters.intercept import HEEDFUL_ATTENTION, eager_attention

TEXTS = ["a charming and often affecting journey", "the movie was dull"]
CASES = (
    [(f, "classification") for f in FAMILIES]
    + [(f, "masked_lm") for f in ENCODERS]
    + [(f, "causal_lm") for f in DECODERS]
)
GATED = ("llama", "qwen2", "mistral")


def _texts(adapter: ModelAdapter) -> list[str]:
    if adapter.task != "masked_lm":
        return TEXTS
    mask = adapter.tokenizer.mask_token
    return [f"a charming and often {mask} journey", f"the {mask} was dull"]


def _inputs(adapter: ModelAdapter):
    batch = adapter.encode(_texts(adapter))
    return batch, adapter.anchor_positions(batch)[0]


@torch.no_grad()
def _logits(adapter: ModelAdapter, batch, anchor) -> torch.Tensor:
    return adapter.forward(batch, anchor).logits


def _hooks(model: torch.nn.Module) -> list:
    return [(name, list(m._forward_hooks), list(m._forward_pre_hooks)) for name, m in model.named_modules()]


def _roles_of(adapter: ModelAdapter) -> list[str]:
    roles = _roles_of_blocks(adapter)
    assert ("mlp_gate" in roles) == (adapter.config.model_type in GATED)
    return roles


def _roles_of_blocks(adapter: ModelAdapter) -> list[str]:
    """The roles every block of the model has (read off its roles)."""
    blocks = adapter.roles().blocks
    return [r for r in ROLES if all(block.has(r) for block in blocks)]


def _mlp_width(adapter: ModelAdapter) -> int:
    cfg = adapter.config
    for attr in ("intermediate_size", "hidden_dim", "ffn_dim", "n_inner"):
        if getattr(cfg, attr, None):
            return int(getattr(cfg, attr))
    return 4 * adapter.hidden_size  # GPT-2's default inner width


@pytest.mark.parametrize(("family", "task"), CASES)
def test_every_role_is_read_with_its_shape(family, task):
    adapter = cached_model(family, task).adapter
    batch, anchor = _inputs(adapter)
    cfg = adapter.config
    b, n = batch.input_ids.shape
    d_model, heads = adapter.hidden_size, cfg.num_attention_heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = d_model // heads
    width = _mlp_width(adapter)
    expected = {
        "query": (b, n, heads * head_dim),
        "key": (b, n, kv_heads * head_dim),
        "value": (b, n, kv_heads * head_dim),
        "probs": (b, heads, n, n),
        "context": (b, n, heads * head_dim),
        "mlp_gate": (b, n, width),
        "mlp_up": (b, n, width),
        "mlp_act": (b, n, width),
    }
    with adapter.intercept() as hooks:
        found = {role: hooks.record(role) for role in _roles_of(adapter)}
        per_head = hooks.record("query", per_head=True)
        _logits(adapter, batch, anchor)
    for role, layers in found.items():
        assert sorted(layers) == list(range(adapter.num_layers)), role
        for tensor in layers.values():
            assert tuple(tensor.shape) == expected.get(role, (b, n, d_model)), role
    assert tuple(per_head[0].shape) == (b, n, heads, head_dim)
    torch.testing.assert_close(per_head[0].flatten(-2), found["query"][0], rtol=0, atol=0)


@pytest.mark.parametrize("family", [f for f in FAMILIES if f not in GATED])
def test_a_block_without_a_gated_mlp_has_no_gate(family):
    adapter = cached_model(family).adapter
    with adapter.intercept() as hooks, pytest.raises(heedful.UnsupportedModelError, match="mlp_gate"):
        hooks.record("mlp_gate")


@pytest.mark.parametrize(("family", "task"), CASES)
def test_reading_equals_the_models_own_values(family, task):
    adapter = cached_model(family, task).adapter
    batch, anchor = _inputs(adapter)
    roles = adapter.roles()
    with adapter.intercept() as hooks:
        seen = {role: hooks.record(role) for role in _roles_of(adapter)}
        with torch.no_grad():
            fwd = adapter.forward(batch, anchor, hidden_states=True, attentions=True)
    exact = {"rtol": 0, "atol": 0}
    with torch.no_grad():
        for layer, block in enumerate(roles.blocks):
            get = {role: seen[role][layer] for role in seen}
            torch.testing.assert_close(get["probs"], fwd.attentions[layer], **exact)
            torch.testing.assert_close(get["block_in"], fwd.hidden_states[layer], **exact)
            # the value vectors: the value projection of the (normalised) block input
            normed = block.attn_norm.module(get["block_in"]) if block.pre_ln else get["block_in"]
            torch.testing.assert_close(get["value"], _hand_value(family, adapter.blocks[layer], normed), **exact)
            # the merged heads are the probabilities times the value vectors, head by head
            value = get["value"].unflatten(-1, (block.value.heads, -1)).transpose(1, 2)
            value = value.repeat_interleave(get["probs"].shape[1] // value.shape[1], dim=1)
            context = (get["probs"] @ value).transpose(1, 2).flatten(-2)
            torch.testing.assert_close(get["context"], context, rtol=1e-5, atol=1e-6)
            # the residual stream around the two sub-layers
            if block.pre_ln:
                middle = get["block_in"] + get["attn_out"]
                torch.testing.assert_close(get["attn_norm"], block.attn_norm.module(get["block_in"]), **exact)
                torch.testing.assert_close(get["mlp_norm"], block.mlp_norm.module(middle), **exact)
                torch.testing.assert_close(get["mlp_in"], get["mlp_norm"], **exact)
                torch.testing.assert_close(get["block_out"], middle + get["mlp_out"], rtol=1e-6, atol=1e-6)
            else:
                torch.testing.assert_close(get["attn_norm"], block.attn_norm.module(get["attn_out"] + get["block_in"]), **exact)
                torch.testing.assert_close(get["mlp_in"], get["attn_norm"], **exact)
                torch.testing.assert_close(get["mlp_norm"], block.mlp_norm.module(get["mlp_out"] + get["attn_norm"]), **exact)
                torch.testing.assert_close(get["block_out"], get["mlp_norm"], **exact)
            if layer + 1 < adapter.num_layers:
                torch.testing.assert_close(get["block_out"], fwd.hidden_states[layer + 1], **exact)


def _hand_value(family: str, layer: torch.nn.Module, h: torch.Tensor) -> torch.Tensor:
    """The value projection of each family, named by hand from transformers' modeling files."""
    if family in ("bert", "roberta", "electra"):
        return layer.attention.self.value(h)
    if family == "distilbert":
        return layer.attention.v_lin(h)
    if family == "deberta-v2":
        return layer.attention.self.value_proj(h)
    if family == "gpt2":
        return layer.attn.c_attn(h)[..., 2 * h.shape[-1] :]
    return layer.self_attn.v_proj(h)  # OPT and the Llama family


def _hand_value_module(family: str, layer: torch.nn.Module) -> tuple[torch.nn.Module, int]:
    """The module whose output holds the value vectors, and the column they start at."""
    if family in ("bert", "roberta", "electra"):
        return layer.attention.self.value, 0
    if family == "distilbert":
        return layer.attention.v_lin, 0
    if family == "deberta-v2":
        return layer.attention.self.value_proj, 0
    if family == "gpt2":
        return layer.attn.c_attn, 2 * layer.attn.embed_dim
    return layer.self_attn.v_proj, 0


@pytest.mark.parametrize("family", FAMILIES)
def test_zeroing_a_tokens_value_equals_zeroing_its_value_rows_by_hand(family, monkeypatch):
    adapter = cached_model(family).adapter
    monkeypatch.setattr(adapter, "kernel_attention", False)  # bitwise: the plain pass runs eager too
    batch, anchor = _inputs(adapter)
    token = 2
    keep = torch.ones(batch.input_ids.shape)
    keep[:, token] = 0
    with adapter.intercept() as hooks:
        hooks.replace("value", lambda v: v * keep[..., None].to(v))
        ours = _logits(adapter, batch, anchor)

    def by_hand(module, args, output, start):
        out = output.clone()
        out[:, token, start:] = 0
        return out

    handles = []
    for layer in adapter.blocks:
        module, start = _hand_value_module(family, layer)
        handles.append(module.register_forward_hook(lambda m, a, o, s=start: by_hand(m, a, o, s)))
    try:
        theirs = _logits(adapter, batch, anchor)
    finally:
        for handle in handles:
            handle.remove()
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    assert (ours - _logits(adapter, batch, anchor)).abs().max() > 1e-6


@pytest.mark.parametrize("family", FAMILIES)
def test_replacing_the_context_changes_the_output_and_heads_are_views(family):
    adapter = cached_model(family).adapter
    batch, anchor = _inputs(adapter)
    clean = _logits(adapter, batch, anchor)
    with adapter.intercept() as hooks:
        hooks.replace("context", torch.zeros_like, layers=[0])
        no_context = _logits(adapter, batch, anchor)
    assert (no_context - clean).abs().max() > 1e-4
    # zero probabilities weight the values by nothing: the same as a zero context
    with adapter.intercept() as hooks:
        hooks.replace("probs", torch.zeros_like, layers=[0])
        no_probs = _logits(adapter, batch, anchor)
    torch.testing.assert_close(no_probs, no_context, rtol=0, atol=0)
    # scaling one head of the per-head view is scaling its columns of the merged heads
    head, heads = 1, adapter.config.num_attention_heads

    def scale_head(t):
        return t * torch.tensor([0.5 if h == head else 1.0 for h in range(heads)]).to(t)[:, None]

    def scale_columns(t):
        d = t.shape[-1] // heads
        return torch.cat([t[..., : head * d], t[..., head * d : (head + 1) * d] * 0.5, t[..., (head + 1) * d :]], dim=-1)

    with adapter.intercept() as hooks:
        hooks.replace("context", scale_head, layers=[-1], per_head=True)
        per_head = _logits(adapter, batch, anchor)
    with adapter.intercept() as hooks:
        hooks.replace("context", scale_columns, layers=[-1])
        merged = _logits(adapter, batch, anchor)
    torch.testing.assert_close(per_head, merged, rtol=0, atol=0)
    assert (per_head - clean).abs().max() > 1e-6


@pytest.mark.parametrize("family", FAMILIES)
def test_noise_on_the_residual_stream_at_block_0_is_noise_on_the_embedding_output(family):
    adapter = cached_model(family).adapter
    batch, anchor = _inputs(adapter)
    with torch.no_grad():
        fwd = adapter.forward(batch, anchor, hidden_states=True)
    noise = 0.1 * torch.randn(fwd.hidden_states[0].shape, generator=torch.Generator().manual_seed(0))
    with adapter.intercept() as hooks:
        hooks.replace("block_in", lambda h: h + noise, layers=[0])
        first = hooks.record("block_in", layers=[0])
        noisy = _logits(adapter, batch, anchor)
    torch.testing.assert_close(first[0], fwd.hidden_states[0] + noise, rtol=0, atol=0)
    assert (noisy - fwd.logits).abs().max() > 1e-5


class _Double(torch.autograd.Function):
    """Identity forward, twice the gradient backward."""

    @staticmethod
    def forward(ctx, y):
        return y.view_as(y)

    @staticmethod
    def backward(ctx, grad):
        return 2 * grad


@pytest.mark.parametrize("family", FAMILIES)
def test_an_attached_rule_sees_the_modules_input_and_changes_only_the_backward(family):
    adapter = cached_model(family).adapter
    batch, anchor = _inputs(adapter)
    embeds = adapter.embed(batch.input_ids)

    def gradient(attach: bool):
        start = embeds.detach().requires_grad_(True)
        operands = {}

        def keep_operand(x, y):
            operands["x"] = x
            return y

        with adapter.intercept() as hooks, torch.enable_grad():
            context = hooks.record("context", layers=[0])
            if attach:
                hooks.attach("attn_out", keep_operand, layers=[0])
                hooks.attach("block_out", lambda x, y: _Double.apply(y), layers=[-1])
            logits = adapter.forward(batch, anchor, inputs_embeds=start).logits
            (grad,) = torch.autograd.grad(logits[:, 0].sum(), start)
        return logits.detach(), grad, operands.get("x"), context[0]

    logits, grad, _, _ = gradient(False)
    ruled, doubled, operand, context = gradient(True)
    torch.testing.assert_close(ruled, logits, rtol=0, atol=0)
    torch.testing.assert_close(doubled, 2 * grad)
    torch.testing.assert_close(operand, context, rtol=0, atol=0)
    with adapter.intercept() as hooks, pytest.raises(ValueError, match="not a module output"):
        hooks.attach("context", lambda x, y: y)


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "deberta-v2"])
def test_an_attention_rule_replaces_the_attention_computation(family, monkeypatch):
    adapter = cached_model(family).adapter
    monkeypatch.setattr(adapter, "kernel_attention", False)  # bitwise: the plain pass runs eager too
    batch, anchor = _inputs(adapter)
    clean = _logits(adapter, batch, anchor)
    layers = []

    def rule(call):
        layers.append(call.layer)
        return eager_attention(call)

    with adapter.intercept() as hooks:
        hooks.attend(rule)
        same = _logits(adapter, batch, anchor)
    torch.testing.assert_close(same, clean, rtol=0, atol=0)
    assert layers == list(range(adapter.num_layers))
    with adapter.intercept() as hooks:
        hooks.attend(lambda call: eager_attention(call, lambda p: torch.full_like(p, 1.0 / p.shape[-1])), layers=[0])
        uniform = _logits(adapter, batch, anchor)
    assert (uniform - clean).abs().max() > 1e-5


def test_deberta_computes_attention_inline_so_only_its_probabilities_can_be_hooked():
    adapter = cached_model("deberta-v2").adapter
    with adapter.intercept() as hooks, pytest.raises(heedful.UnsupportedModelError, match="inline"):
        hooks.attend(eager_attention)


def test_deberta_query_and_key_are_the_tokens_not_the_relative_positions():
    # DeBERTa-v3's set-up: relative attention whose position embeddings go through the same
    # query / key projections (share_att_key)
    model = tiny_model("deberta-v2", relative_attention=True, share_att_key=True, pos_att_type=["p2c", "c2p"], position_buckets=8, initializer_range=0.2)
    adapter = model.adapter
    batch, anchor = _inputs(adapter)
    with adapter.intercept() as hooks:
        seen = {role: hooks.record(role) for role in ("block_in", "query", "key", "probs")}
        with torch.no_grad():
            fwd = adapter.forward(batch, anchor, attentions=True)
    with torch.no_grad():
        for layer, block in enumerate(adapter.blocks):
            sa = block.attention.self
            torch.testing.assert_close(seen["query"][layer], sa.query_proj(seen["block_in"][layer]), rtol=0, atol=0)
            torch.testing.assert_close(seen["key"][layer], sa.key_proj(seen["block_in"][layer]), rtol=0, atol=0)
            torch.testing.assert_close(seen["probs"][layer], fwd.attentions[layer], rtol=0, atol=0)


def test_post_ln_opt_is_read_as_post_ln():
    model = tiny_model("opt", do_layer_norm_before=False, init_std=0.2)
    adapter = model.adapter
    batch, anchor = _inputs(adapter)
    assert not any(block.pre_ln for block in adapter.roles().blocks)
    with adapter.intercept() as hooks:
        seen = {role: hooks.record(role) for role in ("attn_out", "block_in", "attn_norm", "mlp_in", "mlp_out", "mlp_norm", "block_out")}
        _logits(adapter, batch, anchor)
    with torch.no_grad():
        for layer, block in enumerate(adapter.roles().blocks):
            get = {role: seen[role][layer] for role in seen}
            torch.testing.assert_close(get["attn_norm"], block.attn_norm.module(get["block_in"] + get["attn_out"]), rtol=0, atol=0)
            torch.testing.assert_close(get["mlp_in"], get["attn_norm"], rtol=0, atol=0)
            torch.testing.assert_close(get["block_out"], block.mlp_norm.module(get["attn_norm"] + get["mlp_out"]), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_model_is_unchanged_after_the_context_even_after_an_error(family):
    model = cached_model(family)
    adapter = model.adapter
    batch, anchor = _inputs(adapter)
    with torch.no_grad():  # transformers installs its output-capturing hooks on first use
        adapter.forward(batch, anchor, hidden_states=True, attentions=True)
    before = (_hooks(model.hf_model), model.hf_model.config._attn_implementation, _logits(adapter, batch, anchor))
    assert before[1] == "eager"  # as the tiny models are loaded

    def after():
        return (_hooks(model.hf_model), model.hf_model.config._attn_implementation, _logits(adapter, batch, anchor))

    with adapter.intercept() as hooks:
        for role in _roles_of(adapter):
            hooks.record(role)
        hooks.replace("probs", lambda p: p * 0.5)
        hooks.replace("mlp_out", torch.zeros_like)
        changed = _logits(adapter, batch, anchor)
        switched = family != "deberta-v2"  # DeBERTa-v2's probabilities pass a module: no switch needed
        assert (model.hf_model.config._attn_implementation == HEEDFUL_ATTENTION) == switched
    assert (changed - before[2]).abs().max() > 1e-5
    for check, (old, new) in zip(("hooks", "attention implementation", "logits"), zip(before, after(), strict=True), strict=True):
        assert torch.equal(old, new) if check == "logits" else old == new, check
    with pytest.raises(KeyError, match="inside"), adapter.intercept() as hooks:
        hooks.replace("value", torch.zeros_like)
        hooks.replace("probs", torch.zeros_like)
        raise KeyError("inside")
    for check, (old, new) in zip(("hooks", "attention implementation", "logits"), zip(before, after(), strict=True), strict=True):
        assert torch.equal(old, new) if check == "logits" else old == new, check


def test_one_interception_per_model_and_hooks_only_inside_the_block():
    adapter = cached_model("bert").adapter
    hooks = adapter.intercept()
    with pytest.raises(RuntimeError, match="inside the `with` block"):
        hooks.record("probs")
    with hooks, pytest.raises(RuntimeError, match="already open"), adapter.intercept():
        pass
    with adapter.intercept() as hooks:
        with pytest.raises(IndexError, match="layer 5"):
            hooks.record("value", layers=[5])
        with pytest.raises(ValueError, match="unknown role"):
            hooks.record("values")
        with pytest.raises(ValueError, match="not split into heads"):
            hooks.record("probs", per_head=True)
        hooks.replace("value", lambda v: v[..., :3])
        with pytest.raises(ValueError, match="shape"):
            _logits(adapter, *_inputs(adapter))


def test_register_family_adds_an_adapter():
    class Custom(LlamaAdapter):
        family = "custom-llama"

    hf, tok = tiny_hf("llama")
    hf.config.model_type = "custom-llama"
    assert isinstance(adapter_for(hf, tok), GenericAdapter)  # an unmapped family: the generic adapter
    register_family("custom-llama", Custom)
    try:
        adapter = adapter_for(hf, tok)
        assert isinstance(adapter, Custom) and adapter.task == "classification"
        with adapter.intercept() as hooks:
            probs = hooks.record("probs")
            _logits(adapter, *_inputs(adapter))
        assert len(probs) == adapter.num_layers
    finally:
        heedful.adapters.FAMILIES.pop("custom-llama")
    with pytest.raises(TypeError, match="ModelAdapter"):
        register_family("custom-llama", object)


@pytest.mark.parametrize("family", FAMILIES)
def test_passes_without_probabilities_run_fused_attention_with_the_same_outputs(family, monkeypatch):
    adapter = cached_model(family).adapter
    batch, anchor = _inputs(adapter)
    seen = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def counted(*args, **kwargs):
        seen.append(kwargs.get("attn_mask", args[3] if len(args) > 3 else None) is None)
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counted)  # transformers' "sdpa"
    monkeypatch.setattr(kernel_module, "_fused", counted)  # heedful's own calls (heedful.adapters.kernel)
    fused = _logits(adapter, batch, anchor)
    fused_calls = len(seen)
    with_probs = adapter.forward(batch, anchor, attentions=True)
    assert len(seen) == fused_calls, "a pass returning attention probabilities must run eager attention"
    monkeypatch.setattr(adapter, "kernel_attention", False)
    eager = _logits(adapter, batch, anchor)
    torch.testing.assert_close(fused, eager, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(with_probs.logits, eager, rtol=1e-5, atol=1e-5)
    if family != "deberta-v2":  # computes attention inline
        assert fused_calls >= adapter.num_layers
    assert not batch.attention_mask.bool().all(), "the texts must give a padded batch"
    # a decoder's right padding is never attended by a real position: its fused pass runs causal,
    # without the padding mask (and gives the same logits, above)
    assert not fused_calls or all(seen[:fused_calls]) == adapter.is_decoder
    assert adapter.config._attn_implementation == "eager"


@pytest.mark.parametrize("kv_heads", [4, 2])
@pytest.mark.parametrize("cached", [0, 3])
def test_kernel_attention_and_row_probabilities_equal_eager_attention(kv_heads, cached):
    """The fused context equals eager attention's (causal pattern or the given additive mask,
    queries after a cache of ``cached`` positions, grouped key/value heads), and the rows'
    probabilities are eager attention's rows of those query positions, soft-capped too."""
    from heedful.adapters.intercept import AttentionCall, kernel_attention, row_probabilities

    gen = torch.Generator().manual_seed(0)
    batch, heads, queries, dim = 2, 4, 5, 8
    keys = queries + cached
    q = torch.randn(batch, heads, queries, dim, generator=gen)
    k, v = (torch.randn(batch, kv_heads, keys, dim, generator=gen) for _ in range(2))
    allowed = torch.ones(queries, keys, dtype=torch.bool).tril(cached)  # query i sits at position cached + i
    causal_mask = torch.zeros(queries, keys).masked_fill(~allowed, torch.finfo(torch.float32).min)[None, None]
    padded = causal_mask.repeat(batch, 1, 1, 1)
    padded[1, :, :, keys - 1] = torch.finfo(torch.float32).min  # the second row's last key is padding
    module = torch.nn.Linear(1, 1).eval()
    rows = torch.tensor([[cached + 4, cached + 1], [cached + 3, cached + 3]])  # positions of the whole sequence
    for mask, causal in ((causal_mask, True), (padded, False)):
        for softcap in (None, 2.0):
            call = AttentionCall(module, 0, q, k, v, mask, dim**-0.5, softcap=softcap)
            context, probs = eager_attention(call)
            torch.testing.assert_close(kernel_attention(call, causal=causal), context, atol=1e-6, rtol=1e-5)
            expected = torch.stack([probs[b, :, rows[b] - cached] for b in range(batch)])  # [B, H, K, M]
            torch.testing.assert_close(row_probabilities(call, rows), expected, atol=1e-7, rtol=1e-6)
