"""LRP rules (heedful.lrp): forward values untouched, true gradients in gradient mode, relevance
conservation per block, Chefer's rules against an explicit re-implementation of their relprop,
AttnLRP on a linear-only model against gradient x input (and against the lxt package, slow)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from heedful.adapters.roles import LRPBlock, LRPRoles, linear_sites
from heedful.attribution.attention_gradient import attention_gradients
from heedful.lrp import AttnLRPRules, CheferRules, LRPSession, propagate

TEXTS = ["a charming and often affecting journey", "the movie was dull"]
CASES = [("bert", "classification"), ("bert", "regression"), ("bert", "masked_lm"), ("llama", "classification"), ("llama", "causal_lm"), ("qwen2", "classification")]
# Documented tolerances, measured on the tiny models (INIT_RANGE 0.2):
# Chefer's rules conserve to float precision: per block the sum moved by <= 5e-7 (seed 1).
CHEFER_TOLERANCE = 1e-4
# AttnLRP is not conservative by design: its softmax rule R_in = x (R - s sum R) has a bias-like
# term (and BERT's biases / LayerNorm shifts absorb their share). Per block, the change of the sum
# relative to the block output's L1 mass sum|R| stayed <= 0.22 (BERT masked LM; 0.08-0.11 otherwise).
ATTNLRP_TOLERANCE = 0.3


def _setup(model, texts=TEXTS, target=None):
    if model.task == "masked_lm":
        texts = ["a charming and [MASK] journey", "the [MASK] was dull"]
    # (hidden states and attentions: transformers installs its capturing hooks once)
    problem = model.prepare(texts, target, hidden_states=True, attentions=True)
    return model.adapter, problem.batch, problem.target, problem.reference


def _hooks(model: nn.Module) -> list:
    return [(name, list(m._forward_hooks), list(m._forward_pre_hooks)) for name, m in model.named_modules()]


@pytest.mark.parametrize(
    "family,task,rules",
    [
        ("bert", "classification", "chefer"),
        ("bert", "masked_lm", "attnlrp"),
        ("bert", "regression", "lrp"),
        ("llama", "causal_lm", "chefer"),
        ("llama", "classification", "attnlrp"),
        ("qwen2", "classification", "lrp"),
        ("gpt2", "causal_lm", "chefer"),
    ],
)
def test_forward_values_unchanged_and_model_restored(tiny, family, task, rules):
    model = tiny(family, task)
    adapter, batch, target, ref = _setup(model)
    rule_set = AttnLRPRules() if rules == "attnlrp" else CheferRules("renormalised" if rules == "chefer" else "z")
    before = model.hf_model.config._attn_implementation
    hooks = _hooks(model.hf_model)  # transformers keeps output-capturing hooks of its own
    found = propagate(adapter, batch, target, rule_set)
    torch.testing.assert_close(found.score, target.score(ref.logits), rtol=1e-5, atol=1e-6)
    assert model.hf_model.config._attn_implementation == before
    assert _hooks(model.hf_model) == hooks
    with torch.no_grad():
        again = adapter.forward(batch, target.anchor).logits
    torch.testing.assert_close(again, ref.logits)


@pytest.mark.parametrize("family", ["bert", "qwen2"])
def test_gradient_mode_gives_true_attention_gradients(tiny, family):
    adapter, batch, target, _ = _setup(tiny(family))
    found = propagate(adapter, batch, target, CheferRules(), gradients=True, inputs=False, last_layer_only=True)
    fwd, grads, _ = attention_gradients(tiny(family).prepare(TEXTS))
    for ours, theirs, probs, eager in zip(found.attn_grads, grads, found.probs, fwd.attentions, strict=True):
        torch.testing.assert_close(probs, eager, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-6)


def _block_sums(found) -> torch.Tensor:
    """``[B, L + 1]``: relevance summed at every block input and the last block output."""
    return torch.stack([r.sum(dim=(1, 2)) for r in found.blocks], dim=1).double()


@pytest.mark.parametrize(
    "family,task,add",
    [(f, t, "renormalised") for f, t in CASES] + [("bert", "classification", "z"), ("llama", "causal_lm", "z"), ("gpt2", "classification", "renormalised")],
)
def test_chefer_rules_conserve_relevance_through_every_block(tiny, family, task, add):
    adapter, batch, target, _ = _setup(tiny(family, task))
    found = propagate(adapter, batch, target, CheferRules(add), blocks=True)
    sums = _block_sums(found)
    seed = target.weights.sum().double()  # one-hot seed: 1 (a contrast would give 0)
    assert torch.allclose(sums, torch.full_like(sums, float(seed)), rtol=0, atol=CHEFER_TOLERANCE)
    torch.testing.assert_close(found.inputs.sum(dim=(1, 2)).double(), sums[:, 0])


@pytest.mark.parametrize("family,task", CASES)
def test_attnlrp_block_conservation_within_documented_tolerance(tiny, family, task):
    adapter, batch, target, _ = _setup(tiny(family, task))
    found = propagate(adapter, batch, target, AttnLRPRules(), blocks=True)
    sums = _block_sums(found)
    mass = torch.stack([r.abs().sum(dim=(1, 2)) for r in found.blocks[1:]], dim=1).double()
    change = (sums[:, :-1] - sums[:, 1:]).abs() / mass
    assert change.max() < ATTNLRP_TOLERANCE, change


def test_contrast_target_relevance_sums_to_zero(tiny):
    model = tiny("bert")
    adapter, batch, target, _ = _setup(model, target="POSITIVE vs NEGATIVE")
    found = propagate(adapter, batch, target, CheferRules())
    assert found.inputs.sum(dim=(1, 2)).abs().max() < 1e-4


# ---------------------------------------------------------------------- Chefer oracle (BERT)
def _safe(a, b):
    return torch.where(b == 0, torch.zeros_like(a), a / (b + torch.where(b >= 0, 1e-9, -1e-9)))


def _lin(rel, x, w):
    wp, wn, xp, xn = w.clamp(min=0), w.clamp(max=0), x.clamp(min=0), x.clamp(max=0)
    s = _safe(rel, xp @ wp.T + xn @ wn.T)
    return xp * (s @ wp) + xn * (s @ wn)


def _halves(rel, a, b):
    s = _safe(rel, a @ b)
    return a * (s @ b.transpose(-1, -2)) / 2, b * (a.transpose(-1, -2) @ s) / 2


def _add(rel, a, b, renormalise):
    s = _safe(rel, a + b)
    ra, rb = a * s, b * s
    if not renormalise:
        return ra, rb
    sa, sb = ra.sum(), rb.sum()
    fa = _safe(sa.abs(), sa.abs() + sb.abs()) * rel.sum()
    fb = _safe(sb.abs(), sa.abs() + sb.abs()) * rel.sum()
    return ra * _safe(fa, sa), rb * _safe(fb, sb)


@torch.no_grad()
def _bert_relprop(hf, ids: torch.Tensor, label: int, renormalise: bool, head_mask: torch.Tensor | None = None):
    """Chefer et al.'s BERT relprop written out layer by layer (methods spec 1.1), one example.

    ``head_mask`` ``[L, H]``: Mask-LRP as Song et al. 2024 write it (Sec. 4.3) -- each head's
    context relevance times its mask entry, the relevance of ``A`` and ``V`` then rescaled by
    ``sum R_ctx / sum (R_A + R_V)``; a layer without kept heads sends everything down the residual."""
    bert, n = hf.bert, ids.shape[1]
    h = bert.embeddings(input_ids=ids)
    heads = hf.config.num_attention_heads
    d = hf.config.hidden_size // heads
    split = lambda t: t.view(1, n, heads, d).transpose(1, 2)  # noqa: E731
    merge = lambda t: t.transpose(1, 2).reshape(1, n, heads * d)  # noqa: E731
    saved = []
    for layer in bert.encoder.layer:
        sa = layer.attention.self
        q, k, v = split(sa.query(h)), split(sa.key(h)), split(sa.value(h))
        probs = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d), dim=-1)
        ctx = merge(probs @ v)
        a = layer.attention.output.dense(ctx)
        h1 = layer.attention.output.LayerNorm(a + h)
        g = layer.intermediate.intermediate_act_fn(layer.intermediate.dense(h1))
        o = layer.output.dense(g)
        saved.append((h, q, k, v, probs, ctx, a, h1, g, o))
        h = layer.output.LayerNorm(o + h1)
    first = h[:, 0]
    pooled = bert.pooler.activation(bert.pooler.dense(first))
    rel = torch.zeros(1, hf.config.num_labels)
    rel[0, label] = 1.0
    rel = _lin(_lin(rel, pooled, hf.classifier.weight), first, bert.pooler.dense.weight)
    rel_h = torch.zeros_like(h)
    rel_h[:, 0] = rel
    maps = []
    for index in reversed(range(len(saved))):
        layer, (h, q, k, v, probs, ctx, a, h1, g, o) = bert.encoder.layer[index], saved[index]
        rel_o, rel_h1 = _add(rel_h, o, h1, renormalise)
        rel_h1 = rel_h1 + _lin(_lin(rel_o, g, layer.output.dense.weight), h1, layer.intermediate.dense.weight)
        if head_mask is not None and not head_mask[index].any():
            rel_a, rel_res = torch.zeros_like(rel_h1), rel_h1
        else:
            rel_a, rel_res = _add(rel_h1, a, h, renormalise)
        rel_ctx = split(_lin(rel_a, ctx, layer.attention.output.dense.weight))
        if head_mask is None:
            rel_probs, rel_v = _halves(rel_ctx, probs, v)
        else:
            rel_probs, rel_v = _halves(rel_ctx * head_mask[index].view(1, -1, 1, 1), probs, v)
            factor = _safe(rel_ctx.sum(), rel_probs.sum() + rel_v.sum())
            rel_probs, rel_v = rel_probs * factor, rel_v * factor
        maps.insert(0, rel_probs)
        rel_q, rel_kt = _halves(rel_probs, q, k.transpose(-1, -2))
        sa = layer.attention.self
        rel_h = rel_res + sum(
            _lin(merge(r), h, lin.weight)
            for r, lin in ((rel_q, sa.query), (rel_kt.transpose(-1, -2), sa.key), (rel_v, sa.value))
        )
    return rel_h, maps


@pytest.mark.parametrize("add", ["renormalised", "z"])
def test_chefer_rules_match_explicit_bert_relprop(tiny, add):
    # The z-rule on Q K^T and A V divides by products of mixed-sign operands, so entries where
    # they nearly cancel amplify float rounding: the two implementations (and even the same text
    # alone or in a padded batch) differ by up to ~3e-4 of the largest relevance.
    TOL = 2e-3
    model = tiny("bert")
    adapter, batch, target, _ = _setup(model)
    found = propagate(adapter, batch, target, CheferRules(add), maps=True)
    for b in range(len(batch)):
        n = int(batch.lengths[b])
        label = int(target.classes[b, 0])
        rel, maps = _bert_relprop(model.hf_model, batch.input_ids[b : b + 1, :n], label, add == "renormalised")
        scale = rel.abs().max()
        torch.testing.assert_close(found.inputs[b, :n] / scale, rel[0] / scale, rtol=0, atol=TOL)
        for layer, expected in enumerate(maps):
            got = found.maps[layer][b, :, :n, :n]
            torch.testing.assert_close(got / expected.abs().max(), expected[0] / expected.abs().max(), rtol=0, atol=TOL)


# ---------------------------------------------------------------------- Mask-LRP under a head mask
# layer 0 keeps two heads (the kept heads' relevance is renormalised), layer 1 none (the residual
# takes everything); and one kept head per layer
HEAD_MASKS = [[[0, 1, 1, 0], [0, 0, 0, 0]], [[1, 0, 0, 0], [0, 0, 1, 0]]]
MASK_CONSERVATION = 1e-5


# blocks beyond the plain ones: a three-term residual split (GPT-NeoX, Phi), sandwich and post norms
# (Gemma 3, OLMo 2), fused projections (Phi-3), query / key norms (Qwen3)
RECENT = [("gpt_neox", "classification"), ("phi", "causal_lm"), ("gemma3_text", "classification"), ("olmo2", "causal_lm"), ("phi3", "classification"), ("qwen3", "causal_lm")]


@pytest.mark.parametrize("mask", HEAD_MASKS)
@pytest.mark.parametrize("family,task", CASES + [("gpt2", "classification")] + RECENT)
def test_literal_mask_lrp_conserves_relevance_through_every_block(tiny, family, task, mask):
    # Song et al. 2024 Sec. 4.3: the renormalisation "ensures the conservation rule" (Eq. 3) under the mask
    adapter, batch, target, _ = _setup(tiny(family, task))
    found = propagate(adapter, batch, target, CheferRules(), blocks=True, head_mask=torch.tensor(mask), mask_variant="literal")
    sums = _block_sums(found)
    entering, leaving = sums[:, 1:], sums[:, :-1]  # block l maps blocks[l + 1] (its output) to blocks[l] (its input)
    assert (entering - leaving).abs().max() < MASK_CONSERVATION, sums
    assert torch.allclose(sums, torch.ones_like(sums), rtol=0, atol=MASK_CONSERVATION)


def test_reference_mask_lrp_loses_the_cut_heads_relevance(tiny):
    # the authors' code cuts heads after the residual split: every block with a cut head leaks
    adapter, batch, target, _ = _setup(tiny("bert"))
    found = propagate(adapter, batch, target, CheferRules(), blocks=True, head_mask=torch.tensor(HEAD_MASKS[1]), mask_variant="reference")
    sums = _block_sums(found)
    assert ((sums[:, 1:] - sums[:, :-1]) > 0.05).all(), sums


@pytest.mark.parametrize("mask", HEAD_MASKS)
def test_literal_mask_lrp_matches_explicit_masked_bert_relprop(tiny, mask):
    TOL = 2e-3  # as test_chefer_rules_match_explicit_bert_relprop
    model = tiny("bert")
    adapter, batch, target, _ = _setup(model)
    head_mask = torch.tensor(mask, dtype=torch.float32)
    found = propagate(adapter, batch, target, CheferRules(), maps=True, head_mask=head_mask, mask_variant="literal")
    for b in range(len(batch)):
        n = int(batch.lengths[b])
        rel, maps = _bert_relprop(model.hf_model, batch.input_ids[b : b + 1, :n], int(target.classes[b, 0]), True, head_mask)
        scale = rel.abs().max()
        torch.testing.assert_close(found.inputs[b, :n] / scale, rel[0] / scale, rtol=0, atol=TOL)
        for layer, expected in enumerate(maps):
            got = found.maps[layer][b, :, :n, :n]
            top = expected.abs().max().clamp(min=1e-12)
            torch.testing.assert_close(got / top, expected[0] / top, rtol=0, atol=TOL)
            cut = head_mask[layer] == 0
            assert got[cut].abs().max() == 0  # cut heads have no relevance


# ---------------------------------------------------------------------- linear-only model
class _LinearOnly:
    """A duck-typed adapter over a stack of linear maps (with biases): what LRPSession needs."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.hf_model = nn.Sequential(nn.Linear(6, 8), nn.Linear(8, 8), nn.Identity(), nn.Linear(8, 3))
        self.blocks = [self.hf_model[0]]

    def lrp_roles(self, rules: str | None = None) -> LRPRoles:
        net = self.hf_model
        block = LRPBlock(attention=nn.Identity(), linears=linear_sites(net[0], net[1]), norms=[], activations=[net[2]], residuals=[])
        return LRPRoles(blocks=[block], head_linears=linear_sites(net[3]))


def test_attnlrp_on_a_linear_only_model_is_gradient_times_input():
    toy = _LinearOnly()
    x = torch.randn(5, 6)

    def relevance(rules):
        inputs = x.clone().requires_grad_(True)
        with LRPSession(toy, rules), torch.enable_grad():
            out = toy.hf_model(inputs)[:, 1]
            (grad,) = torch.autograd.grad(out.sum(), inputs)
        return inputs.detach() * grad, out.detach()

    rel, out = relevance(AttnLRPRules())
    inputs = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(toy.hf_model(inputs)[:, 1].sum(), inputs)
    torch.testing.assert_close(rel, x * grad)
    # and it is the epsilon rule (eps -> 0) written out layer by layer, biases absorbing their share
    with torch.no_grad():
        acts = [x]
        for layer in toy.hf_model:
            acts.append(layer(acts[-1]))
        r = torch.zeros(5, 3)
        r[:, 1] = acts[-1][:, 1]
        for i in (3, 1, 0):
            lin = toy.hf_model[i]
            r = acts[i] * ((r / acts[i + 1]) @ lin.weight)
    torch.testing.assert_close(rel, r, rtol=1e-4, atol=1e-6)


def test_chefer_linear_rule_on_a_linear_only_model_matches_alpha1_beta0():
    toy = _LinearOnly()
    x = torch.randn(5, 6)
    session = LRPSession(toy, CheferRules())
    with session, torch.enable_grad():
        out = toy.hf_model(x)[:, 1]  # the first block's input becomes a leaf: relevance is read there
    session.mode = "relevance"
    (rel,) = torch.autograd.grad(out.sum(), session.block_inputs[0])
    with torch.no_grad():
        acts = [x]
        for layer in toy.hf_model:
            acts.append(layer(acts[-1]))
        r = torch.zeros(5, 3)
        r[:, 1] = 1.0
        for i in (3, 1, 0):
            r = _lin(r, acts[i], toy.hf_model[i].weight)
    torch.testing.assert_close(rel, r, rtol=1e-4, atol=1e-5)
    # conserved, except where an output had no positive contribution (Z = 0 drops its relevance)
    assert (rel.sum(dim=1) <= 1 + 1e-5).all() and (rel.sum(dim=1) - r.sum(dim=1)).abs().max() < 1e-5


# ---------------------------------------------------------------------- against lxt
# lxt 2.1 is installed with --no-deps (make's set-up): its requirements (bitsandbytes,
# open_clip_torch, torchvision) would replace the pinned torch. Every case runs in one
# subprocess, since lxt patches transformers' modules in place.
LXT_CASES = [
    ("llama", "causal_lm", "llama", None),
    ("llama", "causal_lm", "llama", " the mat is red"),  # a span: one backward from the sum of its logits
    ("qwen2", "classification", "qwen2", None),
    ("qwen3", "causal_lm", "qwen3", None),  # query / key norms
    ("qwen3", "classification", "qwen3", None),
    ("gemma3_text", "causal_lm", "gemma3", None),  # sandwich norms with 1 + w gains, scaled embeddings, sliding window
    ("gemma3_text", "classification", "gemma3", None),
    # mixtures of experts: lxt maps Qwen3-MoE after its 2.1 release; MOE_RULES below states its mapping
    ("qwen3_moe", "causal_lm", "qwen3_moe", None),
    ("qwen3_moe", "classification", "qwen3_moe", None),
    ("mixtral", "causal_lm", "mixtral", None),
]
MOE_RULES = """
from functools import partial
from lxt.efficient.patches import patch_method, patch_attention, rms_norm_forward, gated_mlp_forward
from lxt.efficient.rules import divide_gradient, identity_rule_implicit
from transformers.models.qwen3_moe import modeling_qwen3_moe as qm
from transformers.models.mixtral import modeling_mixtral as mm

def routed_experts(self, hidden, top_k_index, top_k_weights):
    # sum over the chosen experts k of w_k * E_k(x), E_k = down(act(gate(x)) * up(x)), with AttnLRP's
    # identity rule on act and the uniform rule (Eq. 7) on both products
    out = torch.zeros_like(hidden)
    for slot in range(top_k_index.shape[1]):
        for expert in top_k_index[:, slot].unique().tolist():
            rows = (top_k_index[:, slot] == expert).nonzero().flatten()
            gate, up = torch.nn.functional.linear(hidden[rows], self.gate_up_proj[expert]).chunk(2, dim=-1)
            inner = divide_gradient(identity_rule_implicit(self.act_fn, gate) * up, 2)
            term = divide_gradient(torch.nn.functional.linear(inner, self.down_proj[expert]) * top_k_weights[rows, slot, None], 2)
            out = out.index_add(0, rows, term.to(out.dtype))
    return out

for name, mod, mlp, norm, experts in (("qwen3_moe", qm, qm.Qwen3MoeMLP, qm.Qwen3MoeRMSNorm, qm.Qwen3MoeExperts), ("mixtral", mm, None, mm.MixtralRMSNorm, mm.MixtralExperts)):
    rules = types.ModuleType("lxt.efficient.models." + name)
    rules.attnLRP = {norm: partial(patch_method, rms_norm_forward), experts: partial(patch_method, routed_experts), mod: patch_attention}
    if mlp is not None:
        rules.attnLRP[mlp] = partial(patch_method, gated_mlp_forward)
    sys.modules[rules.__name__] = rules
"""
LXT_SCRIPT = """
import os, sys, types, importlib, torch
sys.path.insert(0, {tests!r})
from tiny import tiny_model
import heedful, lxt
from transformers import AttentionInterface
texts = {texts!r}
cases = {cases!r}
ours = {{}}
for family, task, _, target in cases:  # heedful first, before lxt patches transformers
    ours[(family, task, target)] = [e.scores for e in tiny_model(family, task, initializer_range=0.2).explain(texts, "attnlrp", target=target)]
base = os.path.dirname(lxt.__file__)
for name in ("lxt.efficient", "lxt.efficient.models"):  # skip lxt's BERT module (transformers 4 only)
    mod = types.ModuleType(name); mod.__path__ = [os.path.join(base, *name.split(".")[1:])]; sys.modules[name] = mod
{moe}
for module in sorted({{c[2] for c in cases}}):
    patches = importlib.import_module("lxt.efficient.models." + module)
    for patched, patch in patches.attnLRP.items():
        patch(patched)
        if isinstance(patched, types.ModuleType) and isinstance(patched.ALL_ATTENTION_FUNCTIONS, dict):
            iface = AttentionInterface(); iface._local_mapping.update(patched.ALL_ATTENTION_FUNCTIONS)
            patched.ALL_ATTENTION_FUNCTIONS = iface
for family, task, _, target in cases:
    model = tiny_model(family, task, initializer_range=0.2)
    # its reference pass keeps the graph from the embeddings; a span's score is the sum of its logits (lxt #39)
    problem = model.prepare(texts, target, method="grad_x_input", quantity="logit")
    emb = problem.reference.inputs_embeds
    (g,) = torch.autograd.grad(problem.target.score(problem.reference.logits).sum(), emb)
    rel = (g * emb).sum(-1).detach()
    worst = max(float((torch.tensor(s) - rel[i, : len(s)]).abs().max() / rel[i].abs().max()) for i, s in enumerate(ours[(family, task, target)]))
    print(family, task, repr(target), worst)
"""


def test_attnlrp_matches_lxt():
    try:
        import lxt  # noqa: F401
    except ImportError:
        pytest.fail("lxt is not installed: pip install --no-deps lxt==2.1 (make's set-up does)")
    script = LXT_SCRIPT.format(tests=str(Path(__file__).parent), texts=TEXTS, cases=LXT_CASES, moe=MOE_RULES)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env={**os.environ, "TRANSFORMERS_VERBOSITY": "error"})
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()[-len(LXT_CASES) :]
    assert len(lines) == len(LXT_CASES), done.stdout
    for line in lines:
        assert float(line.split()[-1]) < 1e-5, line
