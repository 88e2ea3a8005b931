"""Encoder–decoder models: the source and target sides on one row (heedful.adapters.seq2seq),
checked against ``transformers``' own passes, and every view, refusal and bad input."""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pytest
import torch
from cli_cases import run_cli_cases

import heedful
from heedful.evaluate.generation import generation_faithfulness
from heedful.tiny_seq2seq import TINY_SEQ2SEQ, build_tiny_marian, tiny_seq2seq

SOURCE = "The house is wonderful."
TARGET = "Das Haus ist wunderbar."


@functools.cache
def model(family: str) -> heedful.Model:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tiny_seq2seq(family)


def _teacher_forced(m: heedful.Model, source: str, target: str) -> torch.Tensor:
    """``transformers``' own logits ``[T, V]`` for ``target`` after the decoder's first tokens."""
    adapter = m.adapter
    ids = m.tokenizer(source, return_tensors="pt")["input_ids"]
    out_ids = adapter.decoder_prefix + adapter.continuation_ids(target)
    with torch.no_grad():
        logits = m.hf_model(input_ids=ids, decoder_input_ids=torch.tensor([out_ids[:-1]])).logits[0]
    return logits[len(adapter.decoder_prefix) - 1 :]


@pytest.mark.parametrize("family", sorted(TINY_SEQ2SEQ))
def test_every_family_reads_the_models_own_logits_from_ids_and_from_embeddings(family):
    m = model(family)
    assert m.task == "seq2seq_lm"
    problem = m.prepare([SOURCE, "What a waste."], target=TARGET)
    expected = _teacher_forced(m, SOURCE, TARGET)
    got = problem.reference.logits[0]
    assert torch.allclose(got, expected, atol=1e-5, rtol=1e-5)
    embeds = m.adapter.embed(problem.batch.input_ids)  # scaled as the encoder scales ids (Marian, Pegasus)
    again = m.adapter.forward(problem.batch, problem.target.read_at, inputs_embeds=embeds).logits
    assert torch.allclose(again, problem.reference.logits, atol=1e-5, rtol=1e-5)


def test_sides_are_laid_out_from_the_encoder_cross_and_decoder_attentions():
    m = model("marian")
    problem = m.prepare(SOURCE, target=TARGET, attentions=True, hidden_states=True)
    batch = problem.batch
    source = int((batch.token_type_ids[0] == 0).sum())
    ids = batch.input_ids[:, :source]
    out_ids = batch.input_ids[:, source:]
    with torch.no_grad():
        out = m.hf_model(input_ids=ids, decoder_input_ids=out_ids, output_attentions=True, output_hidden_states=True)
    for layer, probs in enumerate(problem.reference.attentions):
        assert torch.allclose(probs[0, :, :source, :source], out.encoder_attentions[layer][0], atol=1e-6)
        assert torch.allclose(probs[0, :, source:, :source], out.cross_attentions[layer][0], atol=1e-6)
        assert torch.allclose(probs[0, :, source:, source:], out.decoder_attentions[layer][0], atol=1e-6)
        assert float(probs[0, :, :source, source:].abs().max()) == 0.0  # the encoder never sees the target
    for layer, hidden in enumerate(problem.reference.hidden_states):
        assert torch.allclose(hidden[0, :source], out.encoder_hidden_states[layer][0], atol=1e-5)
        assert torch.allclose(hidden[0, source:], out.decoder_hidden_states[layer][0], atol=1e-5)


@pytest.mark.parametrize("method", ["rollout", "gae", "grad_sam", "attcat", "normxlogit", "coperturbation", "alti", "lrp"])
def test_methods_that_cannot_apply_refuse_in_one_line(method):
    with pytest.raises(heedful.UnsupportedModelError) as info:
        model("t5").explain(SOURCE, method, target=TARGET)
    assert "\n" not in str(info.value.message) and "encoder–decoder" in info.value.message


@pytest.mark.parametrize(
    "method", ["saliency", "grad_x_input", "integrated_gradients", "smoothgrad", "leave_one_out", "raw_attention", "random"]
)
def test_embedding_level_and_attention_methods_explain_both_sides(method):
    m = model("bart")
    options = {"n_steps": 8} if method == "integrated_gradients" else {"n_samples": 4} if method == "smoothgrad" else {}
    g = m.explain_generation(SOURCE, method, continuation=TARGET, **options)
    assert g.source_length == 6 and g.steps == len(m.adapter.continuation_ids(TARGET))
    assert np.isfinite(g.source_scores).all()
    assert np.isfinite(g.target_scores[-1, : g.steps]).all() and np.isnan(g.target_scores[0, 1:]).all()


def test_span_is_the_summed_log_probability_and_a_contrast_subtracts():
    m = model("t5")
    span = m.explain(SOURCE, "grad_x_input", target=TARGET)
    expected = torch.log_softmax(_teacher_forced(m, SOURCE, TARGET), dim=-1)
    ids = m.adapter.continuation_ids(TARGET)
    assert span.prediction["log_probability"] == pytest.approx(float(expected[torch.arange(len(ids)), ids].sum()), abs=1e-4)
    other = m.explain(SOURCE, "grad_x_input", target="Die Katze")
    both = m.explain(SOURCE, "grad_x_input", target=f"{TARGET} vs Die Katze")
    common = min(len(span.scores), len(other.scores))
    n = int((np.array(span.special) == 0).sum())
    assert n > 0
    src = slice(0, 6)  # the source side is the same in all three rows
    assert np.allclose(both.scores[src], span.scores[src] - other.scores[src], atol=1e-5), common


def test_generation_views_show_both_sides():
    m = model("marian")
    g = m.explain_generation(SOURCE, "saliency", max_new_tokens=3)
    assert g.source_length == 6 and g.prompt_length == 7  # the source with </s>, then the decoder-start token
    assert g.tokens[:5] == [" The", " house", " is", " wonderful", "."]
    words, scores = g.words()
    assert words[:4] == ["The", "house", "is", "wonderful."] or words[:4] == ["The", "house", "is", "wonderful"]
    sentences, _ = g.sentences()
    assert sentences[0] == SOURCE and len(sentences) == 1 + bool(g.continuation.strip())
    frame = g.to_pandas()
    assert set(frame.side) == {"source", "target"}
    page = g.to_html()
    assert 'data-side="source"' in page and 'data-side="target"' in page
    assert heedful.GenerationExplanation.from_dict(g.to_dict()).source_length == 6
    from rich.console import Console

    console = Console(width=120, record=True)
    console.print(g)
    shown = console.export_text()
    assert "source │ target prefix" in shown and shown.count("│") >= 1 + g.steps


def test_generation_faithfulness_removes_source_tokens_only():
    m = model("t5")
    g = m.explain_generation(SOURCE, "grad_x_input", continuation=TARGET)
    found = generation_faithfulness(m.adapter, [g], ratios=(0.2, 0.5))
    span = m.explain(SOURCE, "grad_x_input", target=TARGET)
    assert found.original[0] == pytest.approx(span.prediction["log_probability"], abs=1e-4)
    assert (found.sizes <= 5).all()  # of the 5 non-special source tokens
    assert np.isfinite(found.comprehensiveness).all() and np.isfinite(found.sufficiency).all()


def test_marian_python_tokenizer_gets_offsets_from_its_pieces():
    m = model("marian")
    assert not m.tokenizer.is_fast
    batch = m.encode([SOURCE])
    text = batch.texts[0]
    pieces = [text[o[0] : o[1]] if o else None for o in batch.offsets[0]]
    assert pieces == ["The", "house", "is", "wonderful", ".", None, None]
    assert batch.word_ids[0][:5] == [0, 1, 2, 3, 3]


# --------------------------------------------------------------------------- bad input


def test_a_text_pair_has_no_place_in_an_encoder_decoder():
    with pytest.raises(heedful.InputError) as info:
        model("t5").explain(SOURCE, "saliency", text_pair=TARGET)
    assert "text pair" in info.value.message and "target" in info.value.hint


def test_an_output_longer_than_the_decoder_takes_is_refused_before_any_pass():
    m = model("t5")
    with pytest.raises(heedful.InputError) as info:
        m.explain_generation(SOURCE, "saliency", continuation=" ".join(["Haus"] * 70))
    assert "at most 64" in info.value.message  # the target side's positions, not both sides' together
    with pytest.raises(heedful.InputError) as info:
        m.explain_generation(SOURCE, "saliency", max_new_tokens=64)
    assert "new tokens" in info.value.message


@pytest.mark.parametrize("given", ["", "   "])
def test_an_empty_output_is_refused(given):
    with pytest.raises(heedful.InputError) as info:
        model("t5").explain_generation(SOURCE, "saliency", continuation=given)
    assert "no tokens" in info.value.message


def test_an_encoder_decoder_without_a_chat_template_refuses_chat():
    with pytest.raises(heedful.InputError) as info:
        model("t5").explain_generation(SOURCE, "saliency", chat=True, max_new_tokens=2)
    assert "chat template" in info.value.message


def test_a_decoder_only_model_is_no_encoder_decoder():
    from heedful.adapters import Seq2SeqAdapter
    from heedful.testing import tiny_hf

    hf_model, tokenizer = tiny_hf("gpt2", "causal_lm")
    with pytest.raises(heedful.UnsupportedModelError) as info:
        Seq2SeqAdapter(hf_model=hf_model, tokenizer=tokenizer, task="seq2seq_lm")
    assert "no encoder–decoder" in info.value.message


def test_an_encoder_decoder_refuses_another_task():
    hf_model = model("t5").hf_model
    with pytest.raises(heedful.UnsupportedModelError):
        heedful.from_pretrained_objects(hf_model, model("t5").tokenizer, task="causal_lm")


@pytest.fixture(scope="module")
def marian_dir(tmp_path_factory):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build_tiny_marian(tmp_path_factory.mktemp("tiny-marian") / "opus-tiny")


def test_cli_prints_both_sides_and_writes_a_page_then_refuses_a_missing_output(marian_dir, tmp_path):
    written, refused = run_cli_cases([
        ["explain", SOURCE, "--model", str(marian_dir), "--continuation", TARGET, "--method", "saliency", "--html", "t.html"],
        ["explain", SOURCE, "--model", str(marian_dir), "--method", "saliency"],
    ], cwd=tmp_path)
    assert written.returncode == 0, written.stderr
    page = (tmp_path / "t.html").read_text(encoding="utf-8")
    assert 'data-side="source"' in page and "http" not in page.split("<body>")[1].split("</script>")[0]
    assert refused.returncode == 2, refused.stderr
    lines = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "output" in lines[0] and "--continuation" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_an_encoder_decoder_classifier_keeps_the_generic_adapter():
    from transformers import BartConfig, BartForSequenceClassification

    from heedful.adapters import GenericAdapter
    from heedful.tiny_seq2seq import _BART_LIKE, unigram_tokenizer

    tokenizer = unigram_tokenizer()
    ids = {"pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id, "bos_token_id": tokenizer.eos_token_id}
    torch.manual_seed(0)
    hf_model = BartForSequenceClassification(BartConfig(vocab_size=len(tokenizer), num_labels=2, **_BART_LIKE, **ids)).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = heedful.from_pretrained_objects(hf_model, tokenizer)
    assert m.task == "classification" and type(m.adapter) is GenericAdapter
    assert np.isfinite(m.explain(SOURCE, "leave_one_out").scores).all()  # from ids: BART classifies no embeddings
