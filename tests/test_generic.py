"""The generic path: any ``transformers`` checkpoint of a family heedful has not mapped loads with
the generic adapter, runs every method its structure allows and refuses the others in one line
before any work.

The unknown families here are ones heedful gives no roles to and is not planned to: BLOOM, MPT,
GPT-J, GPTBigCode (StarCoder), CodeGen (causal LMs), Falcon and BioGPT (decoder classifiers),
ALBERT, MPNet and Funnel (encoders). Families with roles are run through the generic adapter
explicitly (``generic=True``) as the oracle: the same scores as their mapped adapter.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
import pytest
import torch
import transformers as tf

import heedful
from heedful.adapters import GenericAdapter
from heedful.adapters.needs import NEEDS
from heedful.loading import GenericModelWarning
from heedful.testing import (
    INIT_RANGE,
    MASKED_TEXTS,
    SOURCES,
    bytelevel_tokenizer,
    fast_options,
    tiny_hf,
    wordpiece_tokenizer,
)
from heedful.testing import TEXTS as CONFORMANCE_TEXTS

SMALL = {"initializer_range": INIT_RANGE}


def _bpe() -> int:
    return len(bytelevel_tokenizer())


def _wordpiece() -> int:
    return len(wordpiece_tokenizer())


UNKNOWN: dict[str, tuple[Callable[[], tf.PretrainedConfig], str, str]] = {
    # name: (config, task, tokenizer: "bpe" or "wordpiece") -- 2 layers, width 32, 4 heads
    "bloom": (lambda: tf.BloomConfig(vocab_size=_bpe(), hidden_size=32, n_layer=2, n_head=4, **SMALL), "causal_lm", "bpe"),
    "mpt": (lambda: tf.MptConfig(vocab_size=_bpe(), d_model=32, n_layers=2, n_heads=4, max_seq_len=64, init_config={"init_std": INIT_RANGE}), "causal_lm", "bpe"),
    "gpt_neo": (lambda: tf.GPTNeoConfig(vocab_size=_bpe(), hidden_size=32, num_layers=2, num_heads=4, attention_types=[[["global", "local"], 1]], max_position_embeddings=64, window_size=8, **SMALL), "causal_lm", "bpe"),
    "gpt_bigcode": (lambda: tf.GPTBigCodeConfig(vocab_size=_bpe(), n_embd=32, n_layer=2, n_head=4, n_positions=64, **SMALL), "causal_lm", "bpe"),
    "codegen": (lambda: tf.CodeGenConfig(vocab_size=_bpe(), n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=64, n_ctx=64, **SMALL), "causal_lm", "bpe"),
    "falcon": (lambda: tf.FalconConfig(vocab_size=_bpe(), hidden_size=32, num_hidden_layers=2, num_attention_heads=4, **SMALL), "classification", "bpe"),
    "biogpt": (lambda: tf.BioGptConfig(vocab_size=_bpe(), hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, **SMALL), "classification", "bpe"),
    "albert": (lambda: tf.AlbertConfig(vocab_size=_wordpiece(), embedding_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, **SMALL), "classification", "wordpiece"),
    "mpnet": (lambda: tf.MPNetConfig(vocab_size=_wordpiece(), hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, **SMALL), "masked_lm", "wordpiece"),
    "funnel": (lambda: tf.FunnelConfig(vocab_size=_wordpiece(), block_sizes=[1, 1], d_model=32, n_head=4, d_head=8, d_inner=64, **SMALL), "classification", "wordpiece"),
}
"""Tiny configurations of families heedful does not map, as data."""

AUTO = {
    "classification": tf.AutoModelForSequenceClassification,
    "masked_lm": tf.AutoModelForMaskedLM,
    "causal_lm": tf.AutoModelForCausalLM,
}
TEXTS = ["the plot is predictable yet the actors are wonderful", "a dull plot"]
MASKED = ["the plot is [MASK] yet the actors are wonderful", "a [MASK] plot"]
ROLE_METHODS = ("lrp", "attnlrp", "decompx", "alti", "value_zeroing", "normxlogit", "logat")
"""Methods that read block roles, relevance rules or the head as a module."""


def unknown_model(name: str) -> heedful.Model:
    config, task, kind = UNKNOWN[name]
    tokenizer = bytelevel_tokenizer() if kind == "bpe" else wordpiece_tokenizer()
    cfg = config()
    cfg.pad_token_id = tokenizer.pad_token_id  # as a checkpoint saved with its tokenizer has it
    if task == "classification":
        cfg.num_labels = 3
    torch.manual_seed(0)
    hf_model = AUTO[task].from_config(cfg, attn_implementation="eager")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GenericModelWarning)
        return heedful.from_pretrained_objects(hf_model, tokenizer, name=f"tiny-{name}")


def _texts(model: heedful.Model) -> list[str]:
    return MASKED if model.task == "masked_lm" else TEXTS


def test_the_families_here_are_unknown():
    assert not set(UNKNOWN) & set(heedful.adapters.FAMILIES)


@pytest.mark.parametrize("name", sorted(UNKNOWN))
def test_an_unknown_family_loads_and_says_once_how_many_methods_it_gets(name):
    config, task, kind = UNKNOWN[name]
    tokenizer = bytelevel_tokenizer() if kind == "bpe" else wordpiece_tokenizer()
    hf_model = AUTO[task].from_config(config(), attn_implementation="eager")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = heedful.from_pretrained_objects(hf_model, tokenizer, name="m")
    said = [w for w in caught if issubclass(w.category, GenericModelWarning)]
    assert len(said) == 1
    runs = sum(not missing for missing in model.methods().values())
    assert f"{runs} of {len(model.methods())} methods" in str(said[0].message)
    assert isinstance(model.adapter, GenericAdapter) and model.task == task


@pytest.mark.parametrize("name", sorted(UNKNOWN))
def test_an_unknown_family_runs_embedding_and_attention_methods(name):
    model = unknown_model(name)
    allowed = model.methods()
    pooled = name == "funnel"  # pools positions between blocks: no per-token attention or hidden states
    assert (allowed["raw_attention"] == ()) != pooled
    for method in ("saliency", "grad_x_input", "leave_one_out", "integrated_gradients", "raw_attention", "gae"):
        if allowed[method]:
            with pytest.raises(heedful.UnsupportedModelError, match=f"^{method} needs the attention probabilities"):
                model.explain(_texts(model), method)
            continue
        found = model.explain(_texts(model), method)
        for e in found:
            scores = torch.as_tensor(e.scores)
            assert torch.isfinite(scores).all() and scores.abs().sum() > 0, method
    # a classifier's prediction is the model's own, whatever heedful reads
    if model.task == "classification":
        with torch.no_grad():
            batch = model.encode(TEXTS)
            own = model.hf_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        torch.testing.assert_close(model.prepare(TEXTS).reference.logits, own, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(UNKNOWN))
def test_a_role_method_refuses_in_one_line_before_any_work(name):
    model = unknown_model(name)
    model.adapter.counter.reset()
    for method in ROLE_METHODS:
        with pytest.raises(heedful.UnsupportedModelError) as refused:
            model.explain(_texts(model), method)
        message = refused.value.message
        assert "\n" not in message and message.startswith(f"{method} needs ")
        assert "docs/extending.md" in refused.value.hint
        missing = model.methods()[method]
        assert missing and all(NEEDS[need] in message for need in missing)
    assert model.adapter.counter.forward == 0 and model.adapter.counter.backward == 0


@pytest.mark.parametrize("name", ["bloom", "falcon", "mpnet"])
def test_every_method_a_model_allows_runs_on_it(name):
    """Every method the generic adapter allows -- gradients, perturbations, co-perturbation at the
    first block's input, attention and attention-gradient methods, TDD, the context methods --
    runs on an unknown family's padded batch and gives finite scores; a decoder LM also
    explains its generation."""
    model = unknown_model(name)
    texts = [t.format(mask=model.tokenizer.mask_token) for t in MASKED_TEXTS] if model.task == "masked_lm" else list(CONFORMANCE_TEXTS)
    allowed = [m for m, missing in model.methods().items() if not missing]
    assert {"saliency", "lime", "kernel_shap", "rise", "smoothgrad", "coperturbation", "source_loo", "rollout"} <= set(allowed)
    for method in allowed:
        info = heedful.get_method(method)
        options = {**fast_options(info, model), **({"n_ablations": 16} if info.takes("n_ablations") else {})}
        found = model.explain(texts, method, **({"sources": SOURCES} if info.needs_sources else {}), **options)
        for e in found:
            assert np.isfinite(np.asarray(e.scores, dtype=float)).all(), method
    if model.task == "causal_lm":
        generation = model.explain_generation("the plot is", "saliency", max_new_tokens=3)
        assert generation.scores.shape[0] == 3


def test_causality_is_measured():
    assert unknown_model("falcon").adapter.is_decoder
    assert unknown_model("biogpt").adapter.is_decoder
    assert not unknown_model("albert").adapter.is_decoder
    assert not unknown_model("funnel").adapter.is_decoder


def test_a_model_without_one_module_per_layer_refuses_the_block_methods():
    """ALBERT shares one layer group across its layers: no list of blocks, so noise on the first
    block's input (co-perturbation) is refused; the embedding-only methods run."""
    model = unknown_model("albert")
    assert model.methods()["coperturbation"] == ("blocks",)
    assert model.methods()["integrated_gradients"] == ()


ORACLE_METHODS = (
    ("saliency", {}),
    ("integrated_gradients", {"n_steps": 8}),
    ("leave_one_out", {}),
    ("raw_attention", {}),
    ("gae", {}),
    ("attcat", {}),
    ("kernel_shap", {"n_samples": 32}),
)


@pytest.mark.parametrize(
    ("family", "task"),
    [("llama", "classification"), ("gpt2", "causal_lm"), ("bert", "classification"), ("roberta", "masked_lm"), ("qwen2", "regression")],
)
def test_the_generic_adapter_gives_the_mapped_adapters_scores(family, task):
    """On a mapped family the generic adapter is an oracle of its own: the model run as
    ``transformers`` runs it gives the scores the family's roles give, padded batch included."""
    texts = ["the plot is <mask> yet the actors are wonderful", "a <mask> plot"] if task == "masked_lm" else TEXTS
    mapped = heedful.from_pretrained_objects(*tiny_hf(family, task, **SMALL), name="mapped")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GenericModelWarning)
        generic = heedful.from_pretrained_objects(*tiny_hf(family, task, **SMALL), name="generic", generic=True)
    assert isinstance(generic.adapter, GenericAdapter) and generic.adapter.is_decoder == mapped.adapter.is_decoder
    for method, options in ORACLE_METHODS:
        ours = generic.explain(texts, method, **options)
        theirs = mapped.explain(texts, method, **options)
        for a, b in zip(ours, theirs, strict=True):
            torch.testing.assert_close(torch.as_tensor(a.scores), torch.as_tensor(b.scores), rtol=1e-4, atol=1e-5, msg=method)


def test_methods_command_lists_what_a_model_allows(tmp_path, monkeypatch, capsys):
    from conftest import run_cli

    model = unknown_model("bloom")
    model.hf_model.save_pretrained(tmp_path)
    model.tokenizer.save_pretrained(tmp_path)
    monkeypatch.setenv("COLUMNS", "250")
    code, out, err = run_cli(monkeypatch, capsys, "methods", "--model", str(tmp_path))
    assert code == 0, err
    runs = sum(not missing for missing in model.methods().values())
    # the title wraps at the table's width, which the folder's name decides
    assert f"{runs} of {len(model.methods())} run on the bloom family" in " ".join(out.split())
    rows = {line.split("│")[1].strip(): line for line in out.splitlines() if line.count("│") > 3}
    assert "yes" in rows["saliency"] and "no" in rows["lrp"] and "block roles" in rows["lrp"]
    assert "warning:" in err and f"{runs} of" in err  # loading said how many methods it gets
