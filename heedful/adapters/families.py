"""Architecture families: where each role lives inside a ``transformers`` model.

Each class names only the modules of its family; the behaviour is in :class:`ModelAdapter`.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.activations import ACT2FN

from heedful.adapters.base import ModelAdapter
from heedful.adapters.family_hooks import LMHeadParts
from heedful.adapters.roles import (
    Activation,
    BlockRoles,
    HeadRoles,
    LinearSite,
    NormSite,
    Projection,
    Site,
    linear_sites,
)

CLASSIFIER_TASKS = ("classification", "regression")
ALL_RULES = frozenset({"chefer", "lrp", "attnlrp"})
"""Every relevance rule set (:data:`heedful.lrp.rules.RULE_SETS`)."""


def _identity(h: torch.Tensor) -> torch.Tensor:
    return h


def _layer_norm(module: nn.Module, layout: nn.Module | None = None) -> NormSite:
    return NormSite(module, "layernorm", float(module.eps), layout)


def _rms_norm(module: nn.Module) -> NormSite:
    return NormSite(module, "rmsnorm", float(module.variance_epsilon))


def _sites(heads: int, *modules: nn.Module, **where) -> tuple[Site, ...]:
    """Output sites of ``modules`` whose last dimension holds ``heads`` heads."""
    return tuple(Site(m, heads=heads, **where) for m in modules)


def _lm_steps(dense: nn.Module, act, norm: NormSite, projection: LinearSite | Projection) -> tuple:
    """The head chain of a masked-LM transform ``norm(act(dense(h)))`` and its vocabulary
    ``projection``."""
    return (LinearSite(dense), Activation(act), norm, projection)


def _block(
    layer: nn.Module,
    *,
    attention: nn.Module,
    qkv: tuple[Site, ...],
    out: nn.Module,
    mlp: tuple[nn.Module, nn.Module | Site | None, nn.Module | None, nn.Module],
    norms: tuple[NormSite | None, NormSite | None],
    heads: int,
    pre_ln: bool,
    probs: Site | None = None,
    layout: nn.Module | None = None,
    **facts,
) -> BlockRoles:
    """A block's roles from its modules: ``qkv`` the query, key and value sites; ``out`` the
    attention output projection (its input holds the merged heads); ``mlp`` the MLP's
    ``(entry, up, activation, down)`` modules, seeing flattened tokens when ``layout`` is given
    (``up`` may be a :class:`Site`, a column range of a fused projection; ``up`` and
    ``activation`` ``None`` for a mixture of experts);
    ``norms`` at the attention and MLP sub-layers. The probabilities come from the attention
    implementation unless ``probs`` says where else; ``facts``: the remaining
    :class:`BlockRoles` fields (``mlp_gate``, ``transposed``, ``rotary``)."""
    entry, up, act, down = mlp
    return BlockRoles(
        block=layer,
        attention=attention,
        query=qkv[0],
        key=qkv[1],
        value=qkv[2],
        probs=probs or Site(attention, "attention"),
        context=Site(out, "input", heads=heads),
        attn_out=Site(out),
        attn_norm=norms[0],
        mlp_in=Site(entry, "input", layout=layout),
        mlp_up=up if up is None or isinstance(up, Site) else Site(up, layout=layout),
        mlp_act=None if act is None else Site(act, layout=layout),
        mlp_out=Site(down, layout=layout),
        mlp_norm=norms[1],
        pre_ln=pre_ln,
        **facts,
    )


class _EncoderAdapter(ModelAdapter):
    """Encoders: blocks below ``encoder.layer``, an embedding LayerNorm before the first block."""

    blocks_at = "encoder.layer"
    anchored_blocks = True

    def embedding_norm_sites(self) -> list[NormSite]:
        return [_layer_norm(self.backbone.embeddings.LayerNorm)]

    def block_roles(self, layer: nn.Module) -> BlockRoles:
        """BERT-shaped post-LN block (BERT, RoBERTa, ELECTRA; ``modeling_bert.BertLayer``):
        ``h = LN(x + dense(attn(x)))``, then ``LN(h + dense(act(dense(h))))``."""
        att, inter, out = layer.attention, layer.intermediate, layer.output
        sa = att.self
        return _block(
            layer,
            attention=sa,
            qkv=_sites(self.config.num_attention_heads, sa.query, sa.key, sa.value),
            out=att.output.dense,
            mlp=(inter, inter.dense, inter.intermediate_act_fn, out.dense),
            norms=(_layer_norm(att.output.LayerNorm), _layer_norm(out.LayerNorm)),
            heads=self.config.num_attention_heads,
            pre_ln=False,
        )


class BertAdapter(_EncoderAdapter):
    """BERT (and MiniLM and other BERT-shaped checkpoints)."""

    family = "bert"
    relevance_rules = ALL_RULES

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

    def head_roles(self) -> HeadRoles:
        """The pooler (dense + tanh) and classifier, or the masked-LM transform (dense,
        activation, LayerNorm)."""
        m = self.hf_model
        if self.task in CLASSIFIER_TASKS:
            pooler = getattr(self.backbone, "pooler", None)
            pooling = () if pooler is None else (LinearSite(pooler.dense), Activation(pooler.activation))
            return HeadRoles(
                linears=linear_sites(pooler.dense if pooler is not None else None, m.classifier),
                activations=[pooler.activation] if pooler is not None else [],
                steps=(*pooling, LinearSite(m.classifier)),
            )
        if getattr(m, "cls", None) is not None:
            transform = m.cls.predictions.transform
            norm = _layer_norm(transform.LayerNorm)
            return HeadRoles(
                linear_sites(transform.dense),
                [norm],
                [transform.transform_act_fn],
                steps=_lm_steps(transform.dense, transform.transform_act_fn, norm, LinearSite(m.cls.predictions.decoder)),
            )
        return HeadRoles()


class DistilBertAdapter(_EncoderAdapter):
    family = "distilbert"
    anchored_blocks = False  # its own block layout (``block_roles`` below)
    blocks_at = "transformer.layer"
    token_types = False

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

    def block_roles(self, layer: nn.Module) -> BlockRoles:
        """Post-LN block (``modeling_distilbert.TransformerBlock``): ``h = LN(x + out_lin(attn(x)))``,
        then ``LN(h + lin2(act(lin1(h))))``."""
        att, ffn = layer.attention, layer.ffn
        return _block(
            layer,
            attention=att,
            qkv=_sites(self.config.num_attention_heads, att.q_lin, att.k_lin, att.v_lin),
            out=att.out_lin,
            mlp=(ffn, ffn.lin1, ffn.activation, ffn.lin2),
            norms=(_layer_norm(layer.sa_layer_norm), _layer_norm(layer.output_layer_norm)),
            heads=self.config.num_attention_heads,
            pre_ln=False,
        )

    def head_roles(self) -> HeadRoles:
        """Pre-classifier and classifier (the ReLU between them is a function), or the masked-LM
        transform."""
        m = self.hf_model
        if self.task in CLASSIFIER_TASKS:
            steps = (LinearSite(m.pre_classifier), Activation(torch.relu), LinearSite(m.classifier))
            return HeadRoles(linear_sites(m.pre_classifier, m.classifier), steps=steps)
        norm = _layer_norm(m.vocab_layer_norm)
        steps = _lm_steps(m.vocab_transform, m.activation, norm, LinearSite(m.vocab_projector))
        return HeadRoles(linear_sites(m.vocab_transform), [norm], [m.activation], steps=steps)


class RobertaAdapter(_EncoderAdapter):
    """RoBERTa (and XLM-R, CamemBERT): classification head reads the first token itself."""

    family = "roberta"
    token_types = False

    def classification_head(self, h: torch.Tensor) -> torch.Tensor:
        return self.hf_model.classifier(h[:, None, :])

    def lm_head_parts(self) -> LMHeadParts | None:
        head = getattr(self.hf_model, "lm_head", None)
        if head is None:
            return None

        def transform(h: torch.Tensor) -> torch.Tensor:
            return head.layer_norm(nn.functional.gelu(head.dense(h)))

        return LMHeadParts(transform, head.decoder.weight, head.decoder.bias)

    def head_roles(self) -> HeadRoles:
        """The classifier's dense and output projection (tanh between them is a function), or
        the masked-LM dense and LayerNorm."""
        m = self.hf_model
        if self.task in CLASSIFIER_TASKS:
            cls = m.classifier
            steps = (LinearSite(cls.dense), Activation(torch.tanh), LinearSite(cls.out_proj))
            return HeadRoles(linear_sites(cls.dense, cls.out_proj), steps=steps)
        head = m.lm_head
        norm = _layer_norm(head.layer_norm)
        steps = _lm_steps(head.dense, nn.functional.gelu, norm, LinearSite(head.decoder))
        return HeadRoles(linear_sites(head.dense), [norm], steps=steps)


class DebertaV2Adapter(_EncoderAdapter):
    """DeBERTa v2 and v3."""

    family = "deberta-v2"
    anchored_blocks = False  # disentangled (relative-position) attention

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

    def block_roles(self, layer: nn.Module) -> BlockRoles:
        """Post-LN block like BERT's (``modeling_deberta_v2.DebertaV2Layer``) whose
        ``DisentangledSelfAttention`` computes the softmax inline and passes the probabilities
        through its ``dropout`` module: that module's output is the ``probs`` role. The query and
        key projections also run on the relative-position embeddings (``share_att_key``); only
        their first call in each attention call is the tokens'."""
        heads = self.config.num_attention_heads
        att, inter, out = layer.attention, layer.intermediate, layer.output
        sa = att.self
        return _block(
            layer,
            attention=sa,
            qkv=(*_sites(heads, sa.query_proj, sa.key_proj, first_call_within=sa), Site(sa.value_proj, heads=heads)),
            out=att.output.dense,
            mlp=(inter, inter.dense, inter.intermediate_act_fn, out.dense),
            norms=(_layer_norm(att.output.LayerNorm), _layer_norm(out.LayerNorm)),
            heads=heads,
            pre_ln=False,
            probs=Site(sa.dropout),
        )

    def head_roles(self) -> HeadRoles:
        """Pooler dense (its activation is a function) and classifier, or the masked-LM transform."""
        m = self.hf_model
        if self.task in CLASSIFIER_TASKS:
            act = ACT2FN[m.pooler.config.pooler_hidden_act]
            steps = (LinearSite(m.pooler.dense), Activation(act), LinearSite(m.classifier))
            return HeadRoles(linear_sites(m.pooler.dense, m.classifier), steps=steps)
        if getattr(m, "lm_predictions", None) is not None:  # the vocabulary projection is tied to the word embeddings
            lm = m.lm_predictions.lm_head
            projection: LinearSite | Projection = Projection(self.word_embeddings.weight, lm.bias)
        else:
            lm = m.cls.predictions.transform
            projection = LinearSite(m.cls.predictions.decoder)
        norm = _layer_norm(lm.LayerNorm)
        steps = _lm_steps(lm.dense, lm.transform_act_fn, norm, projection)
        return HeadRoles(linear_sites(lm.dense), [norm], [lm.transform_act_fn], steps=steps)


class ElectraAdapter(_EncoderAdapter):
    family = "electra"

    def classification_head(self, h: torch.Tensor) -> torch.Tensor:
        return self.hf_model.classifier(h[:, None, :])

    def lm_head_parts(self) -> LMHeadParts | None:
        m = self.hf_model
        if not hasattr(m, "generator_lm_head"):
            return None
        lin = m.generator_lm_head
        return LMHeadParts(m.generator_predictions, lin.weight, lin.bias)

    def head_roles(self) -> HeadRoles:
        """The classifier's dense, activation and output projection, or the generator's dense,
        activation and LayerNorm."""
        m = self.hf_model
        if self.task in CLASSIFIER_TASKS:
            cls = m.classifier
            steps = (LinearSite(cls.dense), Activation(cls.activation), LinearSite(cls.out_proj))
            return HeadRoles(linear_sites(cls.dense, cls.out_proj), activations=[cls.activation], steps=steps)
        gen = m.generator_predictions
        norm = _layer_norm(gen.LayerNorm)
        steps = _lm_steps(gen.dense, gen.activation, norm, LinearSite(m.generator_lm_head))
        return HeadRoles(linear_sites(gen.dense), [norm], [gen.activation], steps=steps)


class _DecoderAdapter(ModelAdapter):
    """Causal decoders: pre-LN blocks, a final norm, a ``score`` or ``lm_head`` linear head."""

    is_decoder = True
    token_types = False

    def classification_head(self, h: torch.Tensor) -> torch.Tensor:
        return self.hf_model.score(h)

    def lm_head_parts(self) -> LMHeadParts | None:
        lin = getattr(self.hf_model, "lm_head", None)
        if lin is None:
            return None
        return LMHeadParts(_identity, lin.weight, lin.bias)

    def head_roles(self) -> HeadRoles:
        """The ``score`` of a classifier (an LM head's vocabulary projection is not a module call
        in heedful, and is listed in the chain only)."""
        m = self.hf_model
        score = m.score if self.task in CLASSIFIER_TASKS else None
        output = score if score is not None else getattr(m, "lm_head", None)
        return HeadRoles(linear_sites(score), steps=() if output is None else (LinearSite(output),))

    def final_norm_site(self) -> NormSite | None:
        return None if self.final_norm is None else _layer_norm(self.final_norm)


class GPT2Adapter(_DecoderAdapter):
    family = "gpt2"
    blocks_at = "h"
    final_norm_at = "ln_f"
    relevance_rules = ALL_RULES

    def block_roles(self, layer: nn.Module) -> BlockRoles:
        """Pre-LN block (``modeling_gpt2.GPT2Block``): ``h = x + c_proj(attn(ln_1(x)))``, then
        ``h + c_proj(act(c_fc(ln_2(h))))``, with ``Conv1D`` linears (weights stored transposed) and
        one fused projection ``c_attn`` whose output columns are query, key and value."""
        heads, width = self.config.num_attention_heads, self.hidden_size
        att, mlp = layer.attn, layer.mlp
        return _block(
            layer,
            attention=att,
            qkv=tuple(Site(att.c_attn, columns=(i * width, (i + 1) * width), heads=heads) for i in range(3)),
            out=att.c_proj,
            mlp=(mlp, mlp.c_fc, mlp.act, mlp.c_proj),
            norms=(_layer_norm(layer.ln_1), _layer_norm(layer.ln_2)),
            heads=heads,
            pre_ln=True,
            transposed=True,
        )


class OPTAdapter(_DecoderAdapter):
    family = "opt"
    blocks_at = "decoder.layers"

    @property
    def final_norm(self) -> nn.Module | None:
        dec = self.backbone.decoder
        steps = [m for m in (dec.final_layer_norm, dec.project_out) if m is not None]
        return nn.Sequential(*steps) if steps else None

    def block_roles(self, layer: nn.Module) -> BlockRoles:
        """``modeling_opt.OPTDecoderLayer``: pre-LN when ``config.do_layer_norm_before`` (125m,
        1.3b, ...) and post-LN otherwise (350m). The MLP is not a module: ``fc1`` and ``fc2`` see
        the tokens flattened to ``[B * N, D]`` (and so does the pre-LN ``final_layer_norm``); those
        roles are read and replaced as ``[B, N, ...]``. The query role is ``q_proj``'s output before
        OPT scales it by ``d**-0.5``."""
        pre_ln = bool(self.config.do_layer_norm_before)
        att = layer.self_attn
        return _block(
            layer,
            attention=att,
            qkv=_sites(self.config.num_attention_heads, att.q_proj, att.k_proj, att.v_proj),
            out=att.out_proj,
            mlp=(layer.fc1, layer.fc1, layer.activation_fn, layer.fc2),
            norms=(_layer_norm(layer.self_attn_layer_norm), _layer_norm(layer.final_layer_norm, layer if pre_ln else None)),
            heads=self.config.num_attention_heads,
            pre_ln=pre_ln,
            layout=layer,
        )

    def final_norm_site(self) -> NormSite | None:
        norm = self.backbone.decoder.final_layer_norm
        return None if norm is None else _layer_norm(norm)

    def head_roles(self) -> HeadRoles:
        """``project_out`` (when the model has one) and the score."""
        m = self.hf_model
        score = m.score if self.task in CLASSIFIER_TASKS else None
        output = score if score is not None else getattr(m, "lm_head", None)
        project = self.backbone.decoder.project_out
        steps = tuple(LinearSite(mod) for mod in (project, output) if mod is not None)
        return HeadRoles(linear_sites(project, score), steps=steps)


class LlamaAdapter(_DecoderAdapter):
    """Llama-style decoders (Llama, Mistral, Qwen2, SmolLM2): RMSNorm, gated MLP, rotary positions."""

    family = "llama"
    blocks_at = "layers"
    final_norm_at = "norm"
    relevance_rules = ALL_RULES

    def norm_site(self, module: nn.Module) -> NormSite:
        """What one of the family's norms computes: RMSNorm (override for a Llama-shaped family
        with another norm)."""
        return _rms_norm(module)

    def final_norm_site(self) -> NormSite | None:
        return self.norm_site(self.final_norm)

    def block_roles(self, layer: nn.Module) -> BlockRoles:
        """Pre-norm block (``modeling_llama.LlamaDecoderLayer``, and Mistral's and Qwen2's):
        ``h = x + o(attn(rope(q(n(x))), rope(k(n(x))), v(n(x))))``, then
        ``h + down(act(gate(n(h))) * up(n(h)))``; keys and values may have fewer heads than
        queries (grouped-query attention)."""
        heads = self.config.num_attention_heads
        kv_heads = getattr(self.config, "num_key_value_heads", None) or heads
        att, mlp = layer.self_attn, layer.mlp
        return _block(
            layer,
            attention=att,
            qkv=(Site(att.q_proj, heads=heads), *_sites(kv_heads, att.k_proj, att.v_proj)),
            out=att.o_proj,
            mlp=(mlp, mlp.up_proj, mlp.act_fn, mlp.down_proj),
            norms=(self.norm_site(layer.input_layernorm), self.norm_site(layer.post_attention_layernorm)),
            heads=heads,
            pre_ln=True,
            mlp_gate=Site(mlp.gate_proj),
            rotary=True,
        )


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
