"""Architecture families: where each role lives inside a ``transformers`` model.

Each class names only the modules of its family; the behaviour is in :class:`ModelAdapter`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from heedful.adapters.base import LMHeadParts, ModelAdapter
from heedful.adapters.lrp_roles import (
    BlockRoles,
    LRPRoles,
    NormSite,
    ProductSite,
    ResidualSite,
    linear_sites,
)


def _identity(h: torch.Tensor) -> torch.Tensor:
    return h


def _layer_norm(module: nn.Module) -> NormSite:
    return NormSite(module, "layernorm", float(module.eps))


def _rms_norm(module: nn.Module) -> NormSite:
    return NormSite(module, "rmsnorm", float(module.variance_epsilon))


class BertAdapter(ModelAdapter):
    """BERT (and MiniLM and other BERT-shaped checkpoints)."""

    family = "bert"

    @property
    def blocks(self) -> Sequence[nn.Module]:
        return self.backbone.encoder.layer

    def classification_head(self, h: torch.Tensor) -> torch.Tensor:
        # pooler (dense + tanh on the token given to it) -> dropout -> classifier (paper Fig. 1b)
        pooled = self.backbone.pooler(h[:, None, :])
        return self.hf_model.classifier(self.hf_model.dropout(pooled))

    def lm_head_parts(self) -> LMHeadParts | None:
        cls = getattr(self.hf_model, "cls", None)
        if cls is None:
            return None
        dec = cls.predictions.decoder
        return LMHeadParts(cls.predictions.transform, dec.weight, dec.bias)

    def lrp_roles(self) -> LRPRoles:
        """Post-LN blocks: ``LN(x + dense(attn(x)))`` then ``LN(h + dense(gelu(dense(h))))``;
        head = pooler (dense + tanh) and classifier, or the masked-LM transform."""
        blocks = []
        for layer in self.blocks:
            att, inter, out = layer.attention, layer.intermediate, layer.output
            blocks.append(
                BlockRoles(
                    attention=att.self,
                    linears=linear_sites(att.self.query, att.self.key, att.self.value, att.output.dense, inter.dense, out.dense),
                    norms=[_layer_norm(att.output.LayerNorm), _layer_norm(out.LayerNorm)],
                    activations=[inter.intermediate_act_fn],
                    residuals=[ResidualSite(att.output.dense, att), ResidualSite(out.dense, inter)],
                )
            )
        m = self.hf_model
        head_linears, head_norms, head_acts = [], [], []
        pooler = getattr(self.backbone, "pooler", None)
        if self.task in ("classification", "regression"):
            head_linears = linear_sites(pooler.dense if pooler is not None else None, m.classifier)
            head_acts = [pooler.activation] if pooler is not None else []
        elif getattr(m, "cls", None) is not None:
            transform = m.cls.predictions.transform
            head_linears = linear_sites(transform.dense)
            head_norms = [_layer_norm(transform.LayerNorm)]
            head_acts = [transform.transform_act_fn]
        return LRPRoles(
            blocks=blocks,
            embedding_norms=[_layer_norm(self.backbone.embeddings.LayerNorm)],
            head_linears=head_linears,
            head_norms=head_norms,
            head_activations=head_acts,
        )


class DistilBertAdapter(ModelAdapter):
    family = "distilbert"

    @property
    def uses_token_types(self) -> bool:
        return False

    @property
    def blocks(self) -> Sequence[nn.Module]:
        return self.backbone.transformer.layer

    def classification_head(self, h: torch.Tensor) -> torch.Tensor:
        m = self.hf_model
        return m.classifier(m.dropout(torch.relu(m.pre_classifier(h))))

    def lm_head_parts(self) -> LMHeadParts | None:
        m = self.hf_model
        if not hasattr(m, "vocab_projector"):
            return None

        def transform(h: torch.Tensor) -> torch.Tensor:
            return m.vocab_layer_norm(m.activation(m.vocab_transform(h)))

        return LMHeadParts(transform, m.vocab_projector.weight, m.vocab_projector.bias)


class RobertaAdapter(ModelAdapter):
    """RoBERTa (and XLM-R, CamemBERT): classification head reads the first token itself."""

    family = "roberta"

    @property
    def uses_token_types(self) -> bool:
        return False

    @property
    def blocks(self) -> Sequence[nn.Module]:
        return self.backbone.encoder.layer

    def classification_head(self, h: torch.Tensor) -> torch.Tensor:
        return self.hf_model.classifier(h[:, None, :])

    def lm_head_parts(self) -> LMHeadParts | None:
        head = getattr(self.hf_model, "lm_head", None)
        if head is None:
            return None

        def transform(h: torch.Tensor) -> torch.Tensor:
            return head.layer_norm(nn.functional.gelu(head.dense(h)))

        return LMHeadParts(transform, head.decoder.weight, head.decoder.bias)


class DebertaV2Adapter(ModelAdapter):
    """DeBERTa v2 and v3."""

    family = "deberta-v2"

    @property
    def blocks(self) -> Sequence[nn.Module]:
        return self.backbone.encoder.layer

    def classification_head(self, h: torch.Tensor) -> torch.Tensor:
        m = self.hf_model
        return m.classifier(m.dropout(m.pooler(h[:, None, :])))

    def lm_head_full(self, h: torch.Tensor) -> torch.Tensor:
        m = self.hf_model
        if getattr(m, "lm_predictions", None) is not None:
            return m.lm_predictions(h, self.word_embeddings)
        return m.cls(h)

    def lm_head_parts(self) -> LMHeadParts | None:
        return None


class ElectraAdapter(ModelAdapter):
    family = "electra"

    @property
    def blocks(self) -> Sequence[nn.Module]:
        return self.backbone.encoder.layer

    def classification_head(self, h: torch.Tensor) -> torch.Tensor:
        return self.hf_model.classifier(h[:, None, :])

    def lm_head_parts(self) -> LMHeadParts | None:
        m = self.hf_model
        if not hasattr(m, "generator_lm_head"):
            return None
        lin = m.generator_lm_head
        return LMHeadParts(m.generator_predictions, lin.weight, lin.bias)


class _DecoderAdapter(ModelAdapter):
    """Causal decoders: pre-LN blocks, a final norm, a ``score`` or ``lm_head`` linear head."""

    is_decoder = True

    @property
    def uses_token_types(self) -> bool:
        return False

    def classification_head(self, h: torch.Tensor) -> torch.Tensor:
        return self.hf_model.score(h)

    def lm_head_parts(self) -> LMHeadParts | None:
        lin = getattr(self.hf_model, "lm_head", None)
        if lin is None:
            return None
        return LMHeadParts(_identity, lin.weight, lin.bias)


class GPT2Adapter(_DecoderAdapter):
    family = "gpt2"

    @property
    def blocks(self) -> Sequence[nn.Module]:
        return self.backbone.h

    @property
    def final_norm(self) -> nn.Module | None:
        return self.backbone.ln_f

    def lrp_roles(self) -> LRPRoles:
        """Pre-LN blocks with ``Conv1D`` linears (weights stored transposed) and a fused QKV projection."""
        blocks = []
        for layer in self.blocks:
            att, mlp = layer.attn, layer.mlp
            blocks.append(
                BlockRoles(
                    attention=att,
                    linears=linear_sites(att.c_attn, att.c_proj, mlp.c_fc, mlp.c_proj, transposed=True),
                    norms=[_layer_norm(layer.ln_1), _layer_norm(layer.ln_2)],
                    activations=[mlp.act],
                    residuals=[ResidualSite(att.c_proj, layer.ln_1), ResidualSite(mlp.c_proj, layer.ln_2)],
                )
            )
        head = linear_sites(self.hf_model.score) if self.task in ("classification", "regression") else []
        return LRPRoles(blocks=blocks, head_linears=head, head_norms=[_layer_norm(self.backbone.ln_f)])


class OPTAdapter(_DecoderAdapter):
    family = "opt"

    @property
    def blocks(self) -> Sequence[nn.Module]:
        return self.backbone.decoder.layers

    @property
    def final_norm(self) -> nn.Module | None:
        dec = self.backbone.decoder
        steps = [m for m in (dec.final_layer_norm, dec.project_out) if m is not None]
        return nn.Sequential(*steps) if steps else None


class LlamaAdapter(_DecoderAdapter):
    """Llama-style decoders (Llama, Mistral, Qwen2, SmolLM2): RMSNorm, gated MLP, rotary positions."""

    family = "llama"

    @property
    def blocks(self) -> Sequence[nn.Module]:
        return self.backbone.layers

    @property
    def final_norm(self) -> nn.Module | None:
        return self.backbone.norm

    def lrp_roles(self) -> LRPRoles:
        """Pre-norm blocks: ``x + o(attn(rope(q(n(x))), rope(k(n(x))), v(n(x))))`` then
        ``h + down(act(gate(n(h))) * up(n(h)))``; head = final RMSNorm and the score / LM head."""
        blocks = []
        for layer in self.blocks:
            att, mlp = layer.self_attn, layer.mlp
            blocks.append(
                BlockRoles(
                    attention=att,
                    linears=linear_sites(att.q_proj, att.k_proj, att.v_proj, att.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj),
                    norms=[_rms_norm(layer.input_layernorm), _rms_norm(layer.post_attention_layernorm)],
                    activations=[mlp.act_fn],
                    residuals=[
                        ResidualSite(att.o_proj, layer.input_layernorm),
                        ResidualSite(mlp.down_proj, layer.post_attention_layernorm),
                    ],
                    products=[ProductSite(mlp.act_fn, mlp.up_proj, mlp.down_proj)],
                    rotary=[att.q_proj, att.k_proj],
                )
            )
        head = linear_sites(self.hf_model.score) if self.task in ("classification", "regression") else []
        return LRPRoles(blocks=blocks, head_linears=head, head_norms=[_rms_norm(self.backbone.norm)])


FAMILIES: dict[str, type[ModelAdapter]] = {
    "bert": BertAdapter,
    "distilbert": DistilBertAdapter,
    "roberta": RobertaAdapter,
    "xlm-roberta": RobertaAdapter,
    "camembert": RobertaAdapter,
    "deberta-v2": DebertaV2Adapter,
    "electra": ElectraAdapter,
    "gpt2": GPT2Adapter,
    "opt": OPTAdapter,
    "llama": LlamaAdapter,
    "mistral": LlamaAdapter,
    "qwen2": LlamaAdapter,
}
