"""Recent decoder and encoder families: where each role lives in their ``transformers`` modules.

Each class names only its family's modules (as :mod:`heedful.adapters.families` does); what
their blocks add to a plain block -- query / key norms, sandwich norms, fused projections,
parallel attention and MLP, soft-capped logits, a mixture of experts -- is said in the roles
(:class:`~heedful.adapters.roles.BlockRoles`), and the methods follow the roles.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from heedful.adapters.families import (
    ALL_RULES,
    CLASSIFIER_TASKS,
    LlamaAdapter,
    ModelAdapter,
    _block,
    _DecoderAdapter,
    _layer_norm,
    _lm_steps,
    _sites,
)
from heedful.adapters.family_hooks import LMHeadParts
from heedful.adapters.roles import (
    BlockRoles,
    ExpertsSite,
    HeadRoles,
    LinearSite,
    NormSite,
    Site,
    linear_sites,
)
from heedful.errors import UnsupportedModelError


def _rms(module: nn.Module, offset: float = 0.0) -> NormSite:
    """An RMSNorm, whichever name its stabiliser has (``variance_epsilon`` or ``eps``)."""
    eps = getattr(module, "variance_epsilon", None)
    return NormSite(module, "rmsnorm", float(module.eps if eps is None else eps), offset=offset)


def _kv_heads(config) -> int:
    return getattr(config, "num_key_value_heads", None) or config.num_attention_heads


def _head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


class Qwen3Adapter(LlamaAdapter):
    """Qwen3: Llama's block with an RMSNorm on each query and key head before the rotation
    (``modeling_qwen3.Qwen3Attention``: ``q_norm(q_proj(x).view(..., H, d))``)."""

    family = "qwen3"
    relevance_rules = ALL_RULES

    def block_roles(self, layer: nn.Module) -> BlockRoles:
        att = layer.self_attn
        return replace(super().block_roles(layer), query_norm=self.norm_site(att.q_norm), key_norm=self.norm_site(att.k_norm))


class MixtralAdapter(LlamaAdapter):
    """Mixtral: Mistral's attention, a sparse mixture of experts in every block
    (``modeling_mixtral.MixtralSparseMoeBlock``: a router ``gate`` choosing the top-k experts of
    each token and their weights, ``experts`` computing ``sum_k w_k E_k(x)`` with gated MLPs
    calling ``experts.act_fn``). AttnLRP follows the experts the router chose (its rules on
    ``w_k * E_k`` and inside each expert, as lxt maps Qwen3-MoE); the relevance-form rule sets
    (Chefer, LRP) and the decomposition methods refuse the experts."""

    family = "mixtral"
    relevance_rules = frozenset({"attnlrp"})

    def block_roles(self, layer: nn.Module) -> BlockRoles:
        if hasattr(layer.mlp, "experts"):  # LlamaAdapter reads gate/up/down projections the experts fuse
            return self._routed(layer)
        return super().block_roles(layer)

    def _routed(self, layer: nn.Module) -> BlockRoles:
        heads, att, mlp = self.config.num_attention_heads, layer.self_attn, layer.mlp
        return _block(
            layer,
            attention=att,
            qkv=(Site(att.q_proj, heads=heads), *_sites(_kv_heads(self.config), att.k_proj, att.v_proj)),
            out=att.o_proj,
            mlp=(mlp, None, None, mlp),
            norms=(self.norm_site(layer.input_layernorm), self.norm_site(layer.post_attention_layernorm)),
            heads=heads,
            pre_ln=True,
            rotary=True,
            experts=ExpertsSite(mlp.experts, mlp.experts.act_fn),
            query_norm=self.norm_site(att.q_norm) if hasattr(att, "q_norm") else None,
            key_norm=self.norm_site(att.k_norm) if hasattr(att, "k_norm") else None,
        )


class Qwen3MoeAdapter(MixtralAdapter):
    """Qwen3-MoE: Qwen3's attention (query / key norms), a mixture of experts in the sparse
    layers and Qwen3's dense MLP in ``mlp_only_layers``."""

    family = "qwen3_moe"

    def block_roles(self, layer: nn.Module) -> BlockRoles:
        if hasattr(layer.mlp, "experts"):
            return self._routed(layer)
        att = layer.self_attn
        return replace(LlamaAdapter.block_roles(self, layer), query_norm=self.norm_site(att.q_norm), key_norm=self.norm_site(att.k_norm))


class GemmaAdapter(LlamaAdapter):
    """Gemma: Llama's block with RMSNorms that scale by ``1 + w`` and word embeddings scaled by
    ``sqrt(D)`` inside the embedding module (so the embedding output, which the gradient methods
    perturb, is the scaled one)."""

    family = "gemma"
    relevance_rules = ALL_RULES

    def norm_site(self, module: nn.Module) -> NormSite:
        return _rms(module, offset=1.0)


class Gemma2Adapter(GemmaAdapter):
    """Gemma 2 (``modeling_gemma2.Gemma2DecoderLayer``): sandwich norms -- ``x + n2(attn(n1(x)))``,
    then ``h + n4(mlp(n3(h)))`` --, attention scores soft-capped (``tanh(s / 50) * 50``), every
    other layer a sliding window (in the attention mask), and language-model logits soft-capped
    (``tanh(z / 30) * 30``). Fused attention (``sdpa``) cannot soft-cap: passes stay eager when
    the config soft-caps attention."""

    family = "gemma2"

    def __post_init__(self) -> None:
        if getattr(self.hf_model.config, "attn_logit_softcapping", None) is not None:
            self.kernel_attention = False
        super().__post_init__()

    def block_roles(self, layer: nn.Module) -> BlockRoles:
        return replace(
            super().block_roles(layer),
            mlp_norm=self.norm_site(layer.pre_feedforward_layernorm),
            attn_post_norm=self.norm_site(layer.post_attention_layernorm),
            mlp_post_norm=self.norm_site(layer.post_feedforward_layernorm),
        )

    def lm_head_parts(self) -> LMHeadParts | None:
        parts = super().lm_head_parts()
        cap = getattr(self.config, "final_logit_softcapping", None)
        return None if parts is None else replace(parts, softcap=cap)


class Gemma3TextAdapter(Gemma2Adapter):
    """Gemma 3 text (``modeling_gemma3.Gemma3DecoderLayer``): Gemma 2's block with a norm on
    each query and key head before the rotation, local (sliding-window) and global layers with
    their own rotary bases, no soft-capping by default."""

    family = "gemma3_text"

    def block_roles(self, layer: nn.Module) -> BlockRoles:
        att = layer.self_attn
        return replace(super().block_roles(layer), query_norm=self.norm_site(att.q_norm), key_norm=self.norm_site(att.k_norm))


class Phi3Adapter(LlamaAdapter):
    """Phi-3 (``modeling_phi3``): Llama's block with one fused ``qkv_proj`` (query, key and value
    side by side in its output columns) and one fused ``gate_up_proj`` (gate, then up)."""

    family = "phi3"
    relevance_rules = ALL_RULES

    def block_roles(self, layer: nn.Module) -> BlockRoles:
        cfg, att, mlp = self.config, layer.self_attn, layer.mlp
        heads, d = cfg.num_attention_heads, _head_dim(cfg)
        q, kv = heads * d, _kv_heads(cfg) * d
        entry, gate = _fused_gated_mlp(mlp)
        return _block(
            layer,
            attention=att,
            qkv=(
                Site(att.qkv_proj, columns=(0, q), heads=heads),
                Site(att.qkv_proj, columns=(q, q + kv), heads=_kv_heads(cfg)),
                Site(att.qkv_proj, columns=(q + kv, q + 2 * kv), heads=_kv_heads(cfg)),
            ),
            out=att.o_proj,
            mlp=entry,
            norms=(self.norm_site(layer.input_layernorm), self.norm_site(layer.post_attention_layernorm)),
            heads=heads,
            pre_ln=True,
            mlp_gate=gate,
            rotary=True,
        )


def _fused_gated_mlp(mlp: nn.Module) -> tuple[tuple, Site]:
    """The roles of a gated MLP with one fused ``gate_up_proj`` (gate, then up, in its output
    columns), ``activation_fn`` and ``down_proj`` (Phi-3, GLM): ``(entry, up, act, down)`` for
    :func:`_block` and the gate's site."""
    width = mlp.down_proj.in_features
    up = Site(mlp.gate_up_proj, columns=(width, 2 * width))
    return (mlp, up, mlp.activation_fn, mlp.down_proj), Site(mlp.gate_up_proj, columns=(0, width))


class GlmAdapter(LlamaAdapter):
    """GLM-4 (``modeling_glm.GlmDecoderLayer``): Llama's attention (biases on the query, key and
    value projections) with rotary positions on part of each head, and Phi-3's MLP with one
    fused ``gate_up_proj``."""

    family = "glm"

    def block_roles(self, layer: nn.Module) -> BlockRoles:
        heads, att = self.config.num_attention_heads, layer.self_attn
        entry, gate = _fused_gated_mlp(layer.mlp)
        return _block(
            layer,
            attention=att,
            qkv=(Site(att.q_proj, heads=heads), *_sites(_kv_heads(self.config), att.k_proj, att.v_proj)),
            out=att.o_proj,
            mlp=entry,
            norms=(self.norm_site(layer.input_layernorm), self.norm_site(layer.post_attention_layernorm)),
            heads=heads,
            pre_ln=True,
            mlp_gate=gate,
            rotary=True,
        )


class Olmo2Adapter(LlamaAdapter):
    """OLMo 2 (``modeling_olmo2.Olmo2DecoderLayer``): no norm before the sub-layers, one after
    each -- ``x + n1(attn(x))``, then ``h + n2(mlp(h))`` -- and RMSNorms over the whole query
    and key projections (all heads at once) before the rotation."""

    family = "olmo2"
    relevance_rules = ALL_RULES

    def block_roles(self, layer: nn.Module) -> BlockRoles:
        heads, att, mlp = self.config.num_attention_heads, layer.self_attn, layer.mlp
        plain = _block(
            layer,
            attention=att,
            qkv=(Site(att.q_proj, heads=heads), *_sites(_kv_heads(self.config), att.k_proj, att.v_proj)),
            out=att.o_proj,
            mlp=(mlp, mlp.up_proj, mlp.act_fn, mlp.down_proj),
            norms=(None, None),
            heads=heads,
            pre_ln=True,
            mlp_gate=Site(mlp.gate_proj),
            rotary=True,
        )
        return replace(
            plain,
            attn_post_norm=self.norm_site(layer.post_attention_layernorm),
            mlp_post_norm=self.norm_site(layer.post_feedforward_layernorm),
            query_norm=self.norm_site(att.q_norm),
            key_norm=self.norm_site(att.k_norm),
        )


class GPTNeoXAdapter(_DecoderAdapter):
    """GPT-NeoX and Pythia (``modeling_gpt_neox.GPTNeoXLayer``): LayerNorm blocks whose
    attention and MLP read the same input when ``use_parallel_residual`` (Pythia's setting):
    ``x + attn(n1(x)) + mlp(n2(x))``; one fused ``query_key_value`` projection laid out per head
    (``[..., H, 3 * d]``: query, key, value of each head side by side); rotary positions on a
    fraction of each head (``partial_rotary_factor``)."""

    family = "gpt_neox"
    blocks_at = "layers"
    final_norm_at = "final_layer_norm"
    relevance_rules = ALL_RULES

    def block_roles(self, layer: nn.Module) -> BlockRoles:
        heads = self.config.num_attention_heads
        d = self.hidden_size // heads
        att, mlp = layer.attention, layer.mlp
        return _block(
            layer,
            attention=att,
            qkv=tuple(Site(att.query_key_value, columns=(i * d, (i + 1) * d), stride=3 * d, heads=heads) for i in range(3)),
            out=att.dense,
            mlp=(mlp, mlp.dense_h_to_4h, mlp.act, mlp.dense_4h_to_h),
            norms=(_layer_norm(layer.input_layernorm), _layer_norm(layer.post_attention_layernorm)),
            heads=heads,
            pre_ln=True,
            rotary=True,
            parallel=bool(self.config.use_parallel_residual),
        )


class PhiAdapter(_DecoderAdapter):
    """Phi-1, 1.5 and 2 (``modeling_phi.PhiDecoderLayer``): one LayerNorm feeds attention and
    MLP in parallel, ``x + attn(n(x)) + mlp(n(x))``; rotary positions on part of each head
    (``partial_rotary_factor``); optional LayerNorms on the queries and keys
    (``qk_layernorm``); biases everywhere, the language-model head's included."""

    family = "phi"
    blocks_at = "layers"
    final_norm_at = "final_layernorm"
    relevance_rules = ALL_RULES

    def block_roles(self, layer: nn.Module) -> BlockRoles:
        heads, att, mlp = self.config.num_attention_heads, layer.self_attn, layer.mlp
        norm = _layer_norm(layer.input_layernorm)
        qk = getattr(att, "q_layernorm", None) is not None
        return _block(
            layer,
            attention=att,
            qkv=(Site(att.q_proj, heads=heads), *_sites(_kv_heads(self.config), att.k_proj, att.v_proj)),
            out=att.dense,
            mlp=(mlp, mlp.fc1, mlp.activation_fn, mlp.fc2),
            norms=(norm, norm),
            heads=heads,
            pre_ln=True,
            rotary=True,
            parallel=True,
            query_norm=_layer_norm(att.q_layernorm) if qk else None,
            key_norm=_layer_norm(att.k_layernorm) if qk else None,
        )


class GPTJAdapter(PhiAdapter):
    """GPT-J (``modeling_gptj.GPTJBlock``): Phi's block under other names -- one LayerNorm
    ``ln_1`` feeds attention and MLP in parallel, ``x + out(attn(n(x))) + fc_out(act(fc_in(n(x))))``;
    query, key and value projections without biases; rotary positions on the first
    ``rotary_dim`` dimensions of each head, rotated in interleaved pairs; a final ``ln_f``."""

    family = "gptj"
    blocks_at = "h"
    final_norm_at = "ln_f"

    def block_roles(self, layer: nn.Module) -> BlockRoles:
        heads, att, mlp = self.config.num_attention_heads, layer.attn, layer.mlp
        norm = _layer_norm(layer.ln_1)
        return _block(
            layer,
            attention=att,
            qkv=_sites(heads, att.q_proj, att.k_proj, att.v_proj),
            out=att.out_proj,
            mlp=(mlp, mlp.fc_in, mlp.act, mlp.fc_out),
            norms=(norm, norm),
            heads=heads,
            pre_ln=True,
            rotary=True,
            parallel=True,
        )


class SmolLM3Adapter(LlamaAdapter):
    """SmolLM3 (``modeling_smollm3``): Llama's block, with rotary positions left out of every
    ``no_rope_layer_interval``-th layer (``self_attn.use_rope``)."""

    family = "smollm3"

    def block_roles(self, layer: nn.Module) -> BlockRoles:
        return replace(super().block_roles(layer), rotary=bool(layer.self_attn.use_rope))


class StableLmAdapter(LlamaAdapter):
    """StableLM (``modeling_stablelm.StableLmDecoderLayer``; StableLM-3B-4E1T, StableLM 2):
    Llama's projections and gated MLP with LayerNorms (biases included), rotary positions on
    part of each head (``partial_rotary_factor``), and, with ``use_parallel_residual``,
    attention and MLP reading the same norm's output, ``x + attn(n(x)) + mlp(n(x))``. Per-head
    query / key LayerNorms (``qk_layernorm``) are refused at load."""

    family = "stablelm"

    def norm_site(self, module: nn.Module) -> NormSite:
        return _layer_norm(module)

    def __post_init__(self) -> None:
        if getattr(self.hf_model.config, "qk_layernorm", False):
            raise UnsupportedModelError(
                "this StableLM normalises every query and key head with a LayerNorm of its own (qk_layernorm), which heedful does not map",
                hint="wrap it with heedful.from_pretrained_objects(model, tokenizer, generic=True) for the methods that need no roles",
            )
        super().__post_init__()

    def block_roles(self, layer: nn.Module) -> BlockRoles:
        if not layer.use_parallel_residual:
            return super().block_roles(layer)
        heads, att, mlp = self.config.num_attention_heads, layer.self_attn, layer.mlp
        norm = self.norm_site(layer.input_layernorm)
        return _block(
            layer,
            attention=att,
            qkv=(Site(att.q_proj, heads=heads), *_sites(_kv_heads(self.config), att.k_proj, att.v_proj)),
            out=att.o_proj,
            mlp=(mlp, mlp.up_proj, mlp.act_fn, mlp.down_proj),
            norms=(norm, norm),
            heads=heads,
            pre_ln=True,
            mlp_gate=Site(mlp.gate_proj),
            rotary=True,
            parallel=True,
        )


class ModernBertAdapter(ModelAdapter):
    """ModernBERT (``modeling_modernbert``): a pre-LN encoder with rotary positions, LayerNorms
    (no bias by default), the embedding LayerNorm, a first block without a norm before its
    attention, one fused ``Wqkv`` (query, key, value side by side), a gated MLP fused in ``Wi``
    (``act(first half) * second half``), global attention every ``global_attn_every_n_layers``
    layers and a sliding window in the others (in the attention mask), and a final norm. Its
    classifier reads the first token (``classifier_pooling="cls"``); mean pooling over the
    sequence is refused at load."""

    family = "modernbert"
    blocks_at = "layers"
    final_norm_at = "final_norm"
    token_types = False
    relevance_rules = ALL_RULES

    def embedding_norm_sites(self) -> list[NormSite]:
        return [_layer_norm(self.backbone.embeddings.norm)]

    def final_norm_site(self) -> NormSite | None:
        return _layer_norm(self.final_norm)

    def block_roles(self, layer: nn.Module) -> BlockRoles:
        heads, width = self.config.num_attention_heads, self.hidden_size
        att, mlp = layer.attn, layer.mlp
        inner = mlp.Wo.in_features
        first = isinstance(layer.attn_norm, nn.Identity)
        return _block(
            layer,
            attention=att,
            qkv=tuple(Site(att.Wqkv, columns=(i * width, (i + 1) * width), heads=heads) for i in range(3)),
            out=att.Wo,
            mlp=(mlp, Site(mlp.Wi, columns=(inner, 2 * inner)), mlp.act, mlp.Wo),
            norms=(None if first else _layer_norm(layer.attn_norm), _layer_norm(layer.mlp_norm)),
            heads=heads,
            pre_ln=True,
            mlp_gate=Site(mlp.Wi, columns=(0, inner)),
            rotary=True,
        )

    def classification_head(self, h: torch.Tensor) -> torch.Tensor:
        m = self.hf_model
        if self.config.classifier_pooling != "cls":
            raise UnsupportedModelError(
                f"this ModernBERT classifier pools the sequence by {self.config.classifier_pooling!r}; "
                "heedful explains heads that read one token",
                hint="use a checkpoint with classifier_pooling='cls'",
            )
        return m.classifier(m.drop(m.head(h)))

    def lm_head_parts(self) -> LMHeadParts | None:
        m = self.hf_model
        if getattr(m, "decoder", None) is None:
            return None
        return LMHeadParts(m.head, m.decoder.weight, m.decoder.bias)

    def head_roles(self) -> HeadRoles:
        """The prediction head (dense, activation, LayerNorm) and the classifier or the
        vocabulary projection."""
        m = self.hf_model
        head = m.head
        norm = _layer_norm(head.norm)
        output = m.classifier if self.task in CLASSIFIER_TASKS else m.decoder
        steps = _lm_steps(head.dense, head.act, norm, LinearSite(output))
        linears = linear_sites(head.dense, m.classifier) if self.task in CLASSIFIER_TASKS else linear_sites(head.dense)
        return HeadRoles(linears, [norm], [head.act], steps=steps)


RECENT_FAMILIES: dict[str, type[ModelAdapter]] = {
    "qwen3": Qwen3Adapter,
    "qwen3_moe": Qwen3MoeAdapter,
    "mixtral": MixtralAdapter,
    "gemma": GemmaAdapter,
    "gemma2": Gemma2Adapter,
    "gemma3_text": Gemma3TextAdapter,
    "phi3": Phi3Adapter,
    "olmo2": Olmo2Adapter,
    "gpt_neox": GPTNeoXAdapter,
    "phi": PhiAdapter,
    "gptj": GPTJAdapter,
    "smollm3": SmolLM3Adapter,
    "modernbert": ModernBertAdapter,
    "stablelm": StableLmAdapter,
    "glm": GlmAdapter,
}
"""The families of this module by ``config.model_type``."""
