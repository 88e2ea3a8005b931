"""Generation attribution and span targets on tiny seeded causal language models.

The oracle for a generation is a plain loop: for each step, the prefix as its own problem (its
ids built by hand, the step's token as a single-position target) explained by the same method.
The oracle for a span is linearity: the gradient of a sum of log-probabilities is the sum of
the gradients of each, computed one token at a time.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from conftest import run_cli, saved_tiny

import heedful
import heedful.generation
from heedful.engine.sequences import continue_batch
from heedful.errors import InputError
from heedful.generation import step_rows

PROMPTS = ["the cat sat on", "a dog ran"]


def _prefix_problem(lm: heedful.Model, prompt: str, continuation: list[int], quantity: str) -> heedful.Problem:
    """The single-position problem of ``prompt`` followed by ``continuation[:-1]``, explaining
    ``continuation[-1]`` as the next token -- built from ids, never through the generation code."""
    prompt_ids = lm.tokenizer(prompt)["input_ids"]
    ids = torch.tensor([prompt_ids + continuation[:-1]])
    batch = lm.encode(prompt)
    batch = batch.with_ids(ids, torch.ones_like(ids))
    batch.texts = [prompt + lm.tokenizer.decode(continuation[:-1])]
    batch.tokens = [lm.tokenizer.convert_ids_to_tokens(ids[0].tolist())]
    batch.special_mask = torch.zeros_like(ids, dtype=torch.bool)
    return lm.prepare(batch, continuation[-1], quantity=quantity)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize(
    "method,options",
    [
        ("grad_x_input", {}),
        ("saliency", {}),
        ("integrated_gradients", {"n_steps": 8}),
        ("raw_attention", {}),
        ("rollout", {}),
        ("normxlogit", {}),
        ("leave_one_out", {}),
    ],
)
def test_three_steps_equal_a_loop_of_single_positions(tiny, family, method, options):
    lm = tiny(family, "causal_lm")
    found = lm.explain_generation(PROMPTS, method, max_new_tokens=3, **options)
    for g, prompt in zip(found, PROMPTS, strict=True):
        generated = lm.tokenizer.convert_tokens_to_ids(g.raw_tokens[g.prompt_length :])
        assert g.steps == 3 and g.scores.shape == (3, g.prompt_length + 3)
        for t in range(3):
            problem = _prefix_problem(lm, prompt, generated[: t + 1], "log_prob")
            alone = lm.explain(problem, method, **options)[0]
            width = g.prompt_length + t
            np.testing.assert_allclose(g.scores[t, :width], alone.scores, atol=1e-5, rtol=1e-4)
            assert np.isnan(g.scores[t, width:]).all()
            if alone.prediction["index"] == generated[t]:  # greedy: the step's token is the prediction
                assert g.probabilities[t] == pytest.approx(alone.prediction["probability"], abs=1e-6)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_a_generation_keeps_each_tokens_log_probability_so_forward_only_steps_run_no_head(tiny, family, monkeypatch):
    lm = tiny(family, "causal_lm")
    generation = lm.generate(PROMPTS, 4)
    for b, (prompt, continuation) in enumerate(zip(PROMPTS, generation.continuations, strict=True)):
        assert len(generation.log_probs[b]) == len(continuation)
        for t, token in enumerate(continuation):  # oracle: the step's own pass, log-softmax at its token
            logits = _prefix_problem(lm, prompt, continuation[: t + 1], "log_prob").reference.logits[0].double()
            assert generation.log_probs[b][t] == pytest.approx(float(torch.log_softmax(logits, -1)[token]), abs=1e-5)

    rows = []
    head = lm.adapter.head_logits
    monkeypatch.setattr(lm.adapter, "head_logits", lambda h, columns=None: rows.append(h.shape[:-1].numel()) or head(h, columns))
    kept = lm.explain_generation(generation, "raw_attention")
    assert sum(rows) == 0  # the steps' probabilities came with the generation
    given = lm.explain_generation(dataclasses.replace(generation, forced=True, log_probs=None), "raw_attention")
    assert sum(rows) == sum(generation.steps)  # without them: the head once at every step's anchor
    for a, b in zip(kept, given, strict=True):
        np.testing.assert_allclose(a.scores, b.scores, rtol=0, atol=1e-6)  # probabilities: float32 rounding of a pass chunked otherwise
        np.testing.assert_allclose(a.probabilities, b.probabilities, atol=1e-6)
    occlusion = lm.explain_generation(generation, "leave_one_out")  # a method that reads the reference logits gets them
    for a, b in zip(occlusion, lm.explain_generation(dataclasses.replace(generation, log_probs=None), "leave_one_out"), strict=True):
        np.testing.assert_allclose(a.scores, b.scores, atol=1e-6)

    beams = lm.generate(PROMPTS, 3, generation_config={"num_beams": 2})  # the kept logits would be the beams'
    assert beams.log_probs is None and all(len(c) > 0 for c in beams.continuations)
    monkeypatch.setattr(heedful.generation, "_logits_kept", lambda *args: {})  # the step logits would not fit the budget
    unkept = lm.generate(PROMPTS, 4)
    assert unkept.log_probs is None and unkept.continuations == generation.continuations


def test_greedy_generation_matches_transformers_one_prompt_at_a_time(tiny):
    lm = tiny("gpt2", "causal_lm")
    generation = lm.generate(PROMPTS, 4)
    for prompt, continuation in zip(PROMPTS, generation.continuations, strict=True):
        ids = torch.tensor([lm.tokenizer(prompt)["input_ids"]])
        out = lm.hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False,
                                   pad_token_id=lm.tokenizer.pad_token_id)
        assert out[0, ids.shape[1] :].tolist()[: len(continuation)] == continuation


def test_forced_continuation_keeps_its_own_ids_and_offsets(tiny):
    lm = tiny("gpt2", "causal_lm")
    g = lm.explain_generation("the cat", "grad_x_input", continuation=" sat on the mat")
    expected = lm.tokenizer(" sat on the mat", add_special_tokens=False)["input_ids"]
    assert lm.tokenizer.convert_tokens_to_ids(g.raw_tokens[g.prompt_length :]) == expected
    assert g.forced and g.text == "the cat sat on the mat" and g.continuation == " sat on the mat"
    for token, offset in zip(g.generated_tokens, g.offsets[g.prompt_length :], strict=True):
        assert g.text[offset[0] : offset[1]].strip() == token.replace("␣", " ").strip()
    words, matrix = g.words()
    assert words == ["the", "cat", "sat", "on", "the", "mat"]
    assert matrix.shape == (g.steps, 6) and np.isnan(matrix[0, 3:]).all()
    np.testing.assert_allclose(np.nansum(matrix, axis=1), np.nansum(g.scores, axis=1), atol=1e-9)


def test_sentences_group_tokens_by_sentence(tiny):
    lm = tiny("gpt2", "causal_lm")
    g = lm.explain_generation("the cat sat. a dog ran", "grad_x_input", continuation=" far. the end")
    sentences, matrix = g.sentences()
    assert sentences == ["the cat sat.", "a dog ran far.", "the end"]
    np.testing.assert_allclose(np.nansum(matrix, axis=1), np.nansum(g.scores, axis=1), atol=1e-9)
    assert np.isnan(matrix[0, 2]) and np.isfinite(matrix[-1, 2])


def test_step_rows_cover_each_prefix(tiny):
    lm = tiny("llama", "causal_lm")
    generation = lm.generate(PROMPTS, 3)
    batch, example, step = step_rows(generation)
    assert len(batch) == sum(generation.steps)
    assert (batch.lengths == torch.tensor(generation.prompt_lengths)[example] + step).all()


def test_span_target_is_one_pass_and_the_sum_of_its_tokens(tiny):
    lm = tiny("gpt2", "causal_lm")
    span = " the mat is red"
    ids = lm.tokenizer(span, add_special_tokens=False)["input_ids"]
    assert len(ids) > 1
    for method, options in [("grad_x_input", {}), ("integrated_gradients", {"n_steps": 6})]:
        e = lm.explain("the cat sat on", method, target=span, **options)
        if method == "grad_x_input":
            assert (e.cost.forward_passes, e.cost.backward_passes) == (1.0, 1.0)
        assert e.target.positions == list(range(e.target.anchor - len(ids) + 1, e.target.anchor + 1))
        assert e.text == "the cat sat on" + span
        total = np.zeros(len(e.tokens))
        for k in range(len(ids)):
            one = lm.explain(_prefix_problem(lm, "the cat sat on", ids[: k + 1], "log_prob"), method, **options)[0]
            total[: len(one.scores)] += one.scores
        np.testing.assert_allclose(e.scores, total, atol=1e-5, rtol=1e-4)
        assert e.prediction["label"] == span and 0.0 < e.prediction["probability"] <= 1.0


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_attnlrp_span_is_one_backward_and_the_sum_of_its_tokens_logits(tiny, family):
    lm = tiny(family, "causal_lm")
    span = " the mat is red"
    ids = lm.tokenizer(span, add_special_tokens=False)["input_ids"]
    e = lm.explain("the cat sat on", "attnlrp", target=span)
    assert e.target.quantity == "logit" and e.cost.backward_passes == 1.0
    total = np.zeros(len(e.tokens))
    for k in range(len(ids)):
        one = lm.explain(_prefix_problem(lm, "the cat sat on", ids[: k + 1], "logit"), "attnlrp")[0]
        total[: len(one.scores)] += one.scores
    np.testing.assert_allclose(e.scores, total, atol=1e-4, rtol=1e-4)
    with pytest.raises(InputError, match="logit"):
        lm.explain("the cat sat on", "attnlrp", target=span, quantity="log_prob")


def test_attnlrp_generation_explains_logits(tiny):
    lm = tiny("llama", "causal_lm")
    g = lm.explain_generation("the cat sat", "attnlrp", max_new_tokens=2)
    assert g.quantity == "logit" and np.isfinite(g.scores[1, : g.prompt_length + 1]).all()


def test_span_log_probability_is_the_sum_over_tokens(tiny):
    lm = tiny("llama", "causal_lm")
    span = " the mat is red"
    ids = lm.tokenizer(span, add_special_tokens=False)["input_ids"]
    e = lm.explain("the cat sat on", "saliency", target=span)
    prompt = lm.tokenizer("the cat sat on")["input_ids"]
    with torch.no_grad():
        logits = lm.hf_model(torch.tensor([prompt + ids])).logits[0].float()
    log_p = torch.log_softmax(logits, dim=-1)
    expected = sum(float(log_p[len(prompt) - 1 + k, token]) for k, token in enumerate(ids))
    assert e.prediction["log_probability"] == pytest.approx(expected, abs=1e-4)


def test_span_errors_name_the_problem(tiny):
    lm = tiny("gpt2", "causal_lm")
    with pytest.raises(InputError, match="explains one output position"):
        lm.explain("the cat", "raw_attention", target=" sat on the mat")
    with pytest.raises(InputError, match="explains one output position"):
        lm.explain("the cat", "raw_attention", target=" sat on vs the mat")
    with pytest.raises(InputError, match="two continuations"):
        lm.prepare("the cat", " sat on vs the mat")
    classifier = tiny("bert", "classification")
    with pytest.raises(InputError, match="causal language model"):
        classifier.explain_generation("great fun", max_new_tokens=2)


def test_generation_views_and_round_trip(tiny):
    lm = tiny("gpt2", "causal_lm")
    g = lm.explain_generation("the cat sat", "grad_x_input", max_new_tokens=3)
    frame = g.to_pandas()
    assert len(frame) == sum(g.prompt_length + t for t in range(g.steps))
    assert set(frame["step"]) == {0, 1, 2}
    back = heedful.GenerationExplanation.from_dict(json.loads(g.to_json()))
    np.testing.assert_array_equal(back.scores, g.scores)
    assert back.tokens == g.tokens and back.cost == g.cost
    np.testing.assert_allclose(g.sequence_scores(), np.nansum(g.scores, axis=0))
    page = g.to_html()
    assert "<script" in page and "http://" not in page and "https://" not in page
    assert page.count('class="hf-tok"') >= len(g.tokens)


def test_cli_generate_prints_the_matrix_and_writes_a_page(monkeypatch, capsys, tmp_path):
    folder = saved_tiny(tmp_path / "tiny-gpt2", "gpt2", "causal_lm")
    page = tmp_path / "gen.html"
    code, out, err = run_cli(
        monkeypatch, capsys, "explain", "the cat sat", "--model", folder, "--generate", "3",
        "--method", "grad_x_input", "--html", str(page),
    )
    assert code == 0, err
    text = page.read_text()
    assert "hf-gen" in text and "https://" not in text
    code, out, err = run_cli(
        monkeypatch, capsys, "explain", "the cat sat", "--model", folder, "--generate", "2", "--json",
    )
    assert code == 0, err
    data = json.loads(out)
    assert data["method"] == "saliency" and len(data["scores"]) == 2
    code, out, err = run_cli(
        monkeypatch, capsys, "explain", "the cat", "--model", folder, "--generate", "2", "--target", "x",
    )
    assert code == 2 and "--target" in err


def test_cli_generate_terminal_matrix(monkeypatch, capsys, tmp_path):
    folder = saved_tiny(tmp_path / "tiny-gpt2", "gpt2", "causal_lm")
    code, out, err = run_cli(
        monkeypatch, capsys, "explain", "the cat sat", "--model", folder, "--generate", "2", "--method", "grad_x_input",
    )
    assert code == 0, err
    assert "generated" in out and "step" in out


def test_continue_batch_decodes_after_the_prompt(tiny):
    lm = tiny("llama", "causal_lm")
    batch = lm.encode(["the cat", "a dog ran"])
    ids = [lm.tokenizer(" sat", add_special_tokens=False)["input_ids"], [lm.tokenizer.eos_token_id]]
    longer = continue_batch(lm.adapter, batch, ids)
    assert longer.texts == ["the cat sat", "a dog ran"]
    assert longer.special_mask[1, int(batch.lengths[1])]
    assert longer.offsets[1][-1] is None


def _log_p_continuation(lm: heedful.Model, prompt_ids: list[int], continuation: list[int]) -> float:
    """log p(continuation | prompt) from one plain transformers forward pass."""
    with torch.no_grad():
        logits = lm.hf_model(torch.tensor([prompt_ids + continuation])).logits[0].float()
    log_p = torch.log_softmax(logits, dim=-1)
    return sum(float(log_p[len(prompt_ids) - 1 + k, t]) for k, t in enumerate(continuation))


def test_generation_faithfulness_equals_a_hand_computation(tiny):
    from heedful.evaluate import generation_faithfulness

    lm = tiny("llama", "causal_lm")
    found = lm.explain_generation(["the cat sat on the mat today", "a dog ran far away"], "grad_x_input", max_new_tokens=3)
    result = generation_faithfulness(lm.adapter, found, ratios=(0.2, 0.5))
    for g, expl in enumerate(found):
        ids = lm.tokenizer.convert_tokens_to_ids(expl.raw_tokens)
        prompt, continuation = ids[: expl.prompt_length], ids[expl.prompt_length :]
        content = [j for j in range(expl.prompt_length) if not expl.special[j]]
        totals = np.nansum(expl.scores, axis=0)
        ranked = sorted(content, key=lambda j: (-totals[j], j))
        full = _log_p_continuation(lm, prompt, continuation)
        assert result.original[g] == pytest.approx(full, abs=1e-4)
        for r, ratio in enumerate((0.2, 0.5)):
            k = max(1, round(ratio * len(content)))
            top = set(ranked[:k])
            without = [t for j, t in enumerate(prompt) if j not in top]
            only = [t for j, t in enumerate(prompt) if j in top or expl.special[j]]
            assert result.sizes[g, r] == k
            assert result.comprehensiveness[g, r] == pytest.approx(full - _log_p_continuation(lm, without, continuation), abs=1e-4)
            assert result.sufficiency[g, r] == pytest.approx(full - _log_p_continuation(lm, only, continuation), abs=1e-4)
    mean, low, high = result.summary()["comprehensiveness"]
    assert low <= mean <= high


def test_bootstrap_interval_is_seeded_and_covers_the_mean():
    from heedful.evaluate import bootstrap_mean

    values = np.arange(20, dtype=float)
    assert bootstrap_mean(values) == bootstrap_mean(values)
    mean, low, high = bootstrap_mean(values)
    assert mean == 9.5 and low < mean < high


def test_bench_generate_on_a_prompts_file(monkeypatch, capsys, tmp_path):
    folder = saved_tiny(tmp_path / "tiny-llama", "llama", "causal_lm")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "\n".join(json.dumps(r) for r in [
            {"prompt": "the cat sat on the mat"},
            {"prompt": "a dog ran far away", "continuation": " and back"},
            {"prompt": "the bird sang all day"},
        ]) + "\n"
    )
    out = tmp_path / "out"
    code, stdout, err = run_cli(
        monkeypatch, capsys, "bench", "--model", folder, "--dataset", str(prompts), "--methods", "random,grad_x_input",
        "--generate", "3", "--out", str(out),
    )
    assert code == 0, err
    report = (out / "generation.md").read_text()
    assert "| grad_x_input |" in report and "| random |" in report and "overlap" in report
    import pandas as pd

    rows = pd.read_csv(out / "generation.csv")
    assert len(rows) == 2 * 3 * 5 and set(rows["method"]) == {"random", "grad_x_input"}
    assert (rows[rows["continuation"] == " and back"]["prompt"] == "a dog ran far away").all()
    code, _, err = run_cli(
        monkeypatch, capsys, "bench", "--model", folder, "--dataset", str(prompts), "--methods", "saliency",
        "--generate", "2", "--metrics", "accuracy", "--out", str(out),
    )
    assert code == 2 and "accuracy" in err


@pytest.mark.parametrize("method", ["grad_x_input", "integrated_gradients"])
def test_contrast_of_spans_is_the_difference_of_the_two_spans(tiny, method):
    lm = tiny("gpt2", "causal_lm")
    prompts = ["the cat sat on", "a dog"]
    options = {"n_steps": 6} if method == "integrated_gradients" else {}
    found = lm.explain(prompts, method, target=" the mat vs a red hat", **options)
    first = lm.explain(prompts, method, target=" the mat", **options)
    second = lm.explain(prompts, method, target=" a red hat", **options)
    for c, a, b in zip(found, first, second, strict=True):
        n = len(c.tokens)
        assert c.tokens == a.tokens[:n] == b.tokens[:n] and c.text in prompts
        np.testing.assert_allclose(c.scores, a.scores[:n] - b.scores[:n], atol=1e-6)
        assert c.target.kind == "contrast" and c.target.label == " the mat vs a red hat"
        difference = a.prediction["log_probability"] - b.prediction["log_probability"]
        assert c.prediction["log_probability_difference"] == pytest.approx(difference, abs=1e-5)
    if method == "grad_x_input":
        assert found[0].cost.backward_passes == 2.0


def test_chat_template_tokens_are_special(tiny, monkeypatch):
    lm = tiny("llama", "causal_lm")
    template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\\n{{ m['content'] }}<|im_end|>\\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\\n{% endif %}"
    )
    monkeypatch.setattr(lm.tokenizer, "chat_template", template, raising=False)
    g = lm.explain_generation("the cat sat", "grad_x_input", max_new_tokens=2, chat=True)
    assert g.prompt.startswith("<|im_start|>user\\nthe cat sat<|im_end|>")
    content = [t for t, s in zip(g.raw_tokens[: g.prompt_length], g.special[: g.prompt_length], strict=True) if not s]
    assert lm.tokenizer.convert_tokens_to_string(content).strip() == "the cat sat"
    words, _ = g.words()
    assert words[:3] == ["the", "cat", "sat"]
    monkeypatch.setattr(lm.tokenizer, "chat_template", None, raising=False)
    with pytest.raises(InputError, match="chat template"):
        lm.generate("the cat", 2, chat=True)


@pytest.mark.parametrize("info", [i for i in heedful.methods(task="causal_lm") if not i.needs_sources], ids=lambda i: i.name)
def test_every_causal_lm_method_explains_each_step_as_its_own_problem(tiny, info):
    from heedful.testing import fast_options

    lm = tiny("llama", "causal_lm")
    options = fast_options(info, lm)
    g = lm.explain_generation("the cat sat on the mat", info.name, max_new_tokens=2, **options)
    generated = lm.tokenizer.convert_tokens_to_ids(g.generated_tokens)
    for t in range(2):
        alone = lm.explain(_prefix_problem(lm, "the cat sat on the mat", generated[: t + 1], g.quantity), info.name, **options)[0]
        width = g.prompt_length + t
        scale = max(1.0, float(np.abs(alone.scores).max()))
        np.testing.assert_allclose(g.scores[t, :width], alone.scores, atol=1e-4 * scale, rtol=1e-3)


def _sentencepiece_llama():
    """A tiny seeded Llama with a SentencePiece-style tokenizer (BPE over ``▁``-marked words,
    a BOS token, and a decoder that drops the first word's leading space)."""
    import transformers as tf
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    from heedful.testing import CORPUS

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    fast = tf.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="</s>")
    torch.manual_seed(0)
    config = tf.LlamaConfig(vocab_size=fast.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=4, pad_token_id=fast.pad_token_id,
                            bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id)
    return heedful.from_pretrained_objects(tf.LlamaForCausalLM(config), fast)


def test_sentencepiece_continuations_keep_their_spaces_offsets_and_words():
    lm = _sentencepiece_llama()
    g = lm.explain_generation("the cat sat", "grad_x_input", continuation=" on the mat")
    assert g.text == "the cat sat on the mat" and g.continuation == " on the mat"
    assert g.special[0] and g.tokens[0] == "<s>"
    for token, offset in zip(g.generated_tokens, g.offsets[g.prompt_length :], strict=True):
        assert g.text[offset[0] : offset[1]] == token.replace("▁", " ").strip()
    words, _ = g.words()
    assert words == ["the", "cat", "sat", "on", "the", "mat"]
    span = lm.explain("the cat sat", "grad_x_input", target=" on the mat")
    assert span.text == "the cat sat on the mat" and span.tokens == g.tokens


@pytest.mark.parametrize(
    "args,says",
    [
        (["--generate", "0"], "--generate must be at least 1"),
        (["--generate", "2", "--quantity", "prob"], "--quantity must be one of"),
        (["--generate", "2", "--chat"], "chat template"),
        (["--continuation", " sat", "--method", "attnlrp", "--quantity", "log_prob"], "not its log_prob"),
        (["--generate", "2", "--method", "normxlogit", "--layerwise"], "one score per token and step"),
    ],
)
def test_cli_generation_bad_input_is_one_line_and_exit_2(monkeypatch, capsys, tmp_path, args, says):
    folder = saved_tiny(tmp_path / "tiny-gpt2", "gpt2", "causal_lm")
    code, out, err = run_cli(monkeypatch, capsys, "explain", "the cat", "--model", folder, *args)
    assert code == 2 and says in err and "Traceback" not in err


@pytest.mark.parametrize(
    "content,args,says",
    [
        (None, ["--generate", "2"], "no prompts file"),
        ('{"text": "the cat"}\n', ["--generate", "2"], "no 'prompt' column"),
        ('{"prompt": ""}\n', ["--generate", "2"], "no prompt text"),
        ('{"prompt": "the cat"}\n', ["--generate", "0"], "--generate must be at least 1"),
        ('{"prompt": "the cat"}\n', ["--generate", "2", "--option", "nosuch.k=1"], "nosuch"),
    ],
)
def test_bench_generate_bad_input_is_one_line_and_exit_2(monkeypatch, capsys, tmp_path, content, args, says):
    folder = saved_tiny(tmp_path / "tiny-gpt2", "gpt2", "causal_lm")
    prompts = tmp_path / "prompts.jsonl"
    if content is not None:
        prompts.write_text(content)
    code, _, err = run_cli(
        monkeypatch, capsys, "bench", "--model", folder, "--dataset", str(prompts), "--methods", "saliency",
        "--out", str(tmp_path / "out"), *args,
    )
    assert code == 2 and says in err and "Traceback" not in err


def test_api_generation_bad_input_names_the_problem(tiny):
    lm = tiny("gpt2", "causal_lm")
    with pytest.raises(InputError, match="max_new_tokens must be at least 1"):
        lm.explain_generation("the cat", max_new_tokens=0)
    with pytest.raises(InputError, match="quantity must be one of"):
        lm.explain_generation("the cat", max_new_tokens=1, quantity="prob")
    with pytest.raises(InputError, match="2 continuations for 1 prompts"):
        lm.explain_generation("the cat", continuation=[" a", " b"])
    generation = lm.generate("the cat", 1)
    with pytest.raises(InputError, match="has its continuations"):
        lm.explain_generation(generation, continuation=" sat")
    with pytest.raises(InputError, match="quantity must be one of"):
        lm.explain("the cat", "saliency", target=" sat on", quantity="prob")


def test_bootstrap_interval_equals_a_plain_resampling_loop():
    from heedful.evaluate import bootstrap_mean

    values = np.random.default_rng(7).normal(size=25)
    rng = np.random.default_rng(3)
    means = []
    for _ in range(400):  # the textbook percentile bootstrap, one resample at a time
        picks = rng.integers(0, len(values), size=len(values))
        means.append(sum(values[i] for i in picks) / len(values))
    means.sort()
    low, high = np.percentile(means, [2.5, 97.5])
    assert bootstrap_mean(values, n_boot=400, seed=3) == pytest.approx((values.mean(), low, high), abs=1e-12)


def _matrix_rows(printed: str, steps: int) -> dict[int, list[float]]:
    """Each step's printed scores, read band after band (a row's blank future cells end it)."""
    rows: dict[int, list[float]] = {t: [] for t in range(steps)}
    for line in printed.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0].isdigit() and int(parts[0]) < steps and parts[1].isalpha():
            rows[int(parts[0])].extend(float(v) for v in parts[3:])
    return rows


@pytest.mark.parametrize("scale", [1.0, 1e-3])
def test_terminal_matrix_prints_every_score_right_within_80_columns(scale):
    from rich.console import Console

    prompt, steps = 30, 4
    tokens = [" the", " capital", " of", " France", " is", "⏎"] * 6
    scores = np.full((steps, prompt + steps), np.nan)
    rng = np.random.default_rng(0)
    for t in range(steps):
        scores[t, : prompt + t] = rng.normal(size=prompt + t) * scale
    scores[0, 3] = 10.3878 * scale
    g = heedful.GenerationExplanation(
        prompt="p", text="p", tokens=tokens[: prompt + steps], offsets=[None] * (prompt + steps), word_ids=[None] * (prompt + steps),
        special=[False] * (prompt + steps), prompt_length=prompt, scores=scores, probabilities=np.full(steps, 0.5),
        method="integrated_gradients", model="m",
    )
    console = Console(width=80, record=True, color_system=None)
    console.print(g)
    printed = console.export_text()
    assert max(len(line.rstrip()) for line in printed.splitlines()) <= 80
    decimals = 2 if scale == 1.0 else 3  # the largest score (.0104) keeps two significant digits
    for t, values in _matrix_rows(printed, steps).items():
        wanted = scores[t, : prompt + t]
        assert len(values) == len(wanted), (t, values)
        np.testing.assert_allclose(values, wanted, rtol=0, atol=0.5 * 10**-decimals + 1e-12)
