"""heedful's encoder–decoder attributions equal Inseq 0.7's (its raw per-dimension tensors,
reduced as heedful reduces them) on tiny T5 and Marian models, to float32 rounding.

Definitions, side by side:
- saliency: Inseq's ``|grad|`` per dimension (Captum ``Saliency``, ``abs=True``), its L2 norm over
  the embedding = heedful's ``saliency`` (L2 norm of the gradient);
- input x gradient: Inseq's per-dimension ``grad * e`` summed = heedful's ``grad_x_input``
  (``aggregate="sum"``);
- integrated gradients: Inseq's baseline is the unknown token in place of every token but the
  end-of-sequence and decoder-start tokens, Gauss-Legendre points = heedful's
  ``baseline="unk"``, ``rule="gausslegendre"``;
- attention: Inseq's cross-attention (source) and decoder self-attention (target), last layer,
  mean over heads = heedful's ``raw_attention`` on the laid-out rows.
Both explain each step's logit (Inseq ``attributed_fn="logit"``, heedful ``quantity="logit"``).

One definition differs: Marian with ``scale_embedding=True`` (every released opus-mt model).
Inseq 0.7.1 multiplies the embeddings it passes to both stacks by ``embed_scale``; under
``transformers`` 5 Marian's decoder multiplies ``decoder_inputs_embeds`` by it again, so Inseq's
pass is not the model's from the second step on (its step logits differ from the model's own).
heedful passes each stack what it expects (:attr:`Seq2SeqAdapter._rescaled`), so its logits are the
model's; the equality is checked on a Marian without embedding scaling, and the difference is a
test of its own.
"""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pytest
import torch

from heedful.tiny_seq2seq import tiny_seq2seq

inseq = pytest.importorskip("inseq")

SOURCE = "The house is wonderful."
TARGET = "Das Haus ist wunderbar."

METHODS = {
    # inseq method: (heedful method, heedful options, inseq options, reduction of inseq's raw tensor)
    "saliency": ("saliency", {}, {}, lambda a: a.norm(dim=-1)),
    "input_x_gradient": ("grad_x_input", {"aggregate": "sum"}, {}, lambda a: a.sum(dim=-1)),
    "integrated_gradients": (
        "integrated_gradients", {"aggregate": "sum", "baseline": "unk", "rule": "gausslegendre", "n_steps": 20},
        {"n_steps": 20}, lambda a: a.sum(dim=-1),
    ),
    "attention": ("raw_attention", {}, {}, lambda a: a[..., -1, :].mean(dim=-1)),
}


@functools.cache
def model(family: str, scaled: bool = True):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tiny_seq2seq(family) if scaled else tiny_seq2seq(family, scale_embedding=False)


def _inseq(m, method: str, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        wrapped = inseq.load_model(m.hf_model, method, tokenizer=m.tokenizer)
        if method != "attention":  # attention is one final step: no attributed function, no step scores
            options.update(attributed_fn="logit", step_scores=["logit"])
        return wrapped.attribute(SOURCE, TARGET, attribute_target=True, show_progress=False, **options)


@functools.cache
def model64(family: str):
    """The unscaled model in float64: both sides' sums then agree to far below the tolerance
    whatever order the threads add in (in float32, cancellation across the embedding dimensions
    of the random-weight T5 left 0.7 % between 1 and 2 threads' orders)."""
    import copy

    import heedful

    m = model(family, scaled=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return heedful.from_pretrained_objects(copy.deepcopy(m.hf_model).double(), m.tokenizer)


@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize("family", ["t5", "marian"])
def test_both_sides_equal_inseq(family, method):
    m = model64(family)
    name, options, inseq_options, reduce = METHODS[method]
    found = _inseq(m, method, **inseq_options).sequence_attributions[0]
    g = m.explain_generation(SOURCE, name, continuation=TARGET, quantity="logit", **options)
    assert [t.token for t in found.source] == g.raw_tokens[: g.source_length]
    assert [t.token for t in found.target][: len(g.tokens) - g.source_length] == g.raw_tokens[g.source_length :]
    source = reduce(found.source_attributions).T[: g.steps].double().numpy()  # [steps, source tokens]
    target = reduce(found.target_attributions).T[: g.steps, : len(g.tokens) - g.source_length].double().numpy()
    scale = max(1.0, float(np.nanmax(np.abs(source))), float(np.nanmax(np.abs(target))))
    assert np.abs(g.source_scores - source).max() <= 2e-6 * scale
    assert np.array_equal(np.isnan(g.target_scores), np.isnan(target))
    assert np.nanmax(np.abs(g.target_scores - target)) <= 2e-6 * scale


def test_inseq_scales_a_marian_decoders_embeddings_twice_and_heedful_does_not():
    m = model("marian")
    assert m.hf_model.config.scale_embedding
    steps = _inseq(m, "saliency").sequence_attributions[0].step_scores["logit"]
    ids = m.adapter.continuation_ids(TARGET)
    source = m.tokenizer(SOURCE, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        own = m.hf_model(input_ids=source, decoder_input_ids=torch.tensor([m.adapter.decoder_prefix + ids[:-1]])).logits[0]
    own = own[torch.arange(len(ids)), ids]
    assert float((steps[1 : len(ids)] - own[1:]).abs().max()) > 1e-2  # Inseq's pass is another model's
    problem = m.prepare(SOURCE, target=TARGET)
    assert torch.allclose(problem.reference.logits[0, torch.arange(len(ids)), ids], own, atol=1e-5)
