"""Bad input gets a heedful error that names the problem and says what to do -- never a raw
torch / Python error from deep inside a method."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
from conftest import cached_model

import heedful
from heedful import registry

LONG_TEXT = " ".join(["the movie was dull and far too long"] * 12)  # > 64 tokens


def raises_heedful(error: type[heedful.HeedfulError], fn, *words: str) -> heedful.HeedfulError:
    """``fn()`` raises ``error``; its message names each of ``words``; it carries a hint."""
    with pytest.raises(heedful.HeedfulError) as info:
        fn()
    err = info.value
    assert type(err) is error, f"expected {error.__name__}, got {type(err).__name__}: {err}"
    for word in words:
        assert word.lower() in err.message.lower(), f"{word!r} not in {err.message!r}"
    assert err.hint, f"no hint for: {err.message}"
    assert err.hint in str(err)
    return err


@pytest.fixture
def bert():
    return cached_model("bert")


# --------------------------------------------------------------------------- texts


@pytest.mark.parametrize("text", ["", "   ", "\n\t "])
def test_empty_or_blank_text(bert, text):
    raises_heedful(heedful.InputError, lambda: bert.explain(text), "empty")


def test_one_empty_text_among_many_is_named(bert):
    err = raises_heedful(heedful.InputError, lambda: bert.explain(["good", "fine", " "]), "empty")
    assert "2" in err.message


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_too_long_without_truncation(family):
    model = cached_model(family)
    err = raises_heedful(
        heedful.InputError, lambda: model.explain(LONG_TEXT, truncation=False), "tokens", "at most 64"
    )
    assert "truncat" in err.hint


@pytest.mark.parametrize("family", ["bert", "roberta", "gpt2"])
def test_too_long_with_truncation_warns_and_flags(family):
    model = cached_model(family)
    with pytest.warns(UserWarning, match="truncated"):
        long, short = model.explain([LONG_TEXT, "good fun"], "saliency")
    assert long.truncated and not short.truncated
    assert len(long.tokens) == model.adapter.max_length == 64
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning when nothing is cut
        assert not model.explain("good fun").truncated


def test_max_length_option_truncates(bert):
    with pytest.warns(UserWarning, match="truncated"):
        e = bert.explain("the movie was dull and far too long", max_length=5)
    assert e.truncated and len(e.tokens) == 5 and e.tokens[-1] == "[SEP]"


def test_text_pairs_must_match(bert):
    with pytest.raises(heedful.InputError, match="pairs"):
        bert.explain(["a", "b"], text_pair=["c"])


def test_batch_size_must_be_positive(bert):
    with pytest.raises(heedful.InputError, match="batch_size"):
        bert.explain("good", batch_size=0)


# --------------------------------------------------------------------------- methods


def test_unknown_method_lists_the_available_ones(bert):
    err = raises_heedful(heedful.MethodError, lambda: bert.explain("good", method="normxlogitt"), "normxlogitt")
    assert err.hint == "did you mean 'normxlogit'?"  # a close name: that one, not the whole list
    with pytest.raises(heedful.MethodError) as caught:
        heedful.get_method("no_such_method")
    for name in ("normxlogit", "saliency", "integrated_gradients", "leave_one_out", "rollout"):
        assert name in caught.value.hint


@pytest.fixture
def causal_only_method():
    """A test-only method registered for causal LMs alone; removed again afterwards."""
    name = "_test_causal_only"

    @registry.register(name, family="baseline", cost="0", citation="test", summary="test", tasks=("causal_lm",))
    def _method(problem):
        return problem.batch.attention_mask.float()

    yield name
    registry.unregister(name)


def test_method_that_does_not_support_the_task(bert, causal_only_method):
    err = raises_heedful(
        heedful.MethodError, lambda: bert.explain("good", method=causal_only_method), causal_only_method, "classification"
    )
    assert "causal_lm" in err.hint
    # the same method works where it is supported
    e = cached_model("gpt2", "causal_lm").explain("the capital of", method=causal_only_method)
    assert e.scores.tolist() == [1.0] * len(e.tokens)
    assert causal_only_method not in [m.name for m in heedful.methods(task="classification")]


def test_registry_is_clean_after_the_fixture():
    assert not any(name.startswith("_test") for name in registry._REGISTRY)


@pytest.mark.parametrize(
    ("method", "options", "words"),
    [
        ("saliency", {"foo": 1}, ("saliency", "foo")),
        ("normxlogit", {"n_steps": 5}, ("normxlogit", "n_steps")),
        ("integrated_gradients", {"steps": 5}, ("integrated_gradients", "steps")),
    ],
)
def test_unknown_option(bert, method, options, words):
    err = raises_heedful(heedful.InputError, lambda: bert.explain("good", method, **options), *words)
    assert "option" in err.hint or err.hint == "did you mean 'n_steps'?"


@pytest.mark.parametrize(
    ("method", "options", "word"),
    [
        ("integrated_gradients", {"n_steps": 0}, "n_steps"),
        ("integrated_gradients", {"baseline": "noise"}, "baseline"),
        ("integrated_gradients", {"rule": "simpson"}, "rule"),
        ("smoothgrad", {"n_samples": 0}, "n_samples"),
        ("normxlogit", {"norm": "l1"}, "norm"),
        ("leave_one_out", {"removal": "drop"}, "removal"),
        ("leave_one_out", {"output": "odds"}, "output"),
        ("raw_attention", {"layer": 7}, "layer"),
        ("raw_attention", {"head": 9}, "head"),
        ("rollout", {"start_layer": -5}, "layer"),
        ("alti", {"rollout": "maybe"}, "rollout"),
        ("globenc", {"layerwise": "every"}, "layerwise"),
        ("decompx", {"bias_decomp": "mean"}, "bias_decomp"),
    ],
)
def test_bad_option_values(bert, method, options, word):
    with pytest.raises(heedful.InputError) as info:
        bert.explain("good fun", method, **options)
    assert word in info.value.message


def test_mask_baseline_needs_a_mask_token():
    gpt2 = cached_model("gpt2")
    raises_heedful(heedful.InputError, lambda: gpt2.explain("good", "integrated_gradients", n_steps=2, baseline="mask"), "mask")


# --------------------------------------------------------------------------- targets


def test_unknown_label(bert):
    err = raises_heedful(heedful.InputError, lambda: bert.explain("good", target="HAPPY"), "HAPPY")
    for label in ("NEGATIVE", "NEUTRAL", "POSITIVE"):
        assert label in err.hint


@pytest.mark.parametrize("target", [3, -1, "7", (0, 5)])
def test_class_index_out_of_range(bert, target):
    err = raises_heedful(heedful.InputError, lambda: bert.explain("good", target=target), "out of range")
    assert "0..2" in err.hint


@pytest.mark.parametrize("target", [1.5, True, (0,), ("POSITIVE", "NEGATIVE", "NEUTRAL")])
def test_malformed_target(bert, target):
    with pytest.raises(heedful.InputError):
        bert.explain("good", target=target)


def test_multi_token_target_for_a_method_that_explains_one_position():
    gpt2 = cached_model("gpt2", "causal_lm")
    err = raises_heedful(
        heedful.InputError, lambda: gpt2.explain("the capital of france is", target=" unbelievably"), "one output position"
    )
    assert "single-token target" in err.hint and "saliency" in err.hint
    raises_heedful(heedful.InputError, lambda: gpt2.explain("the capital of", target=""), "no tokens")


def test_token_id_out_of_range_for_a_language_model():
    gpt2 = cached_model("gpt2", "causal_lm")
    raises_heedful(heedful.InputError, lambda: gpt2.explain("the capital of", target=10**6), "out of range")


def test_masked_lm_text_without_a_mask_token():
    mlm = cached_model("bert", "masked_lm")
    err = raises_heedful(heedful.InputError, lambda: mlm.explain("the movie was dull"), "[MASK]")
    assert "[MASK]" in err.hint
    # several texts: the one without a mask is named
    err = raises_heedful(heedful.InputError, lambda: mlm.explain(["the [MASK] was dull", "no mask here"]), "1")


@pytest.mark.parametrize("target", ["POSITIVE", 1, (0, 1), "value vs value"])
def test_regression_model_with_a_class_target(target):
    reg = cached_model("bert", "regression")
    err = raises_heedful(heedful.InputError, lambda: reg.explain("good", target=target), "regression")
    assert "target" in err.hint
    assert reg.explain("good", target=None).target.kind == "regression"


def test_classes_of_a_language_model_are_tokens():
    gpt2 = cached_model("gpt2", "causal_lm")
    e = gpt2.explain("the capital of", target=" the")
    assert e.target.label == gpt2.tokenizer.decode(e.target.indices[:1]) == " the"  # as people read it


def test_digit_strings_are_class_indices_for_classifiers_and_tokens_for_language_models(bert):
    assert bert.explain("good", target="2").target.indices == [2]
    gpt2 = cached_model("gpt2", "causal_lm")
    digit = gpt2.tokenizer("5", add_special_tokens=False)["input_ids"]
    assert len(digit) == 1
    assert gpt2.explain("one two", target="5").target.indices == digit
    assert gpt2.explain("one two", target=5).target.indices == [5]


# --------------------------------------------------------------------------- models


def test_load_of_a_missing_path():
    with pytest.raises(heedful.HeedfulError) as info:
        heedful.load("./no/such/model/dir")
    assert info.value.hint


def test_errors_print_their_hint():
    err = heedful.InputError("the text is empty", hint="give a text")
    assert str(err) == "the text is empty\n  hint: give a text"
    assert isinstance(heedful.MethodError("x"), heedful.HeedfulError)
    assert isinstance(heedful.UnsupportedModelError("x"), heedful.HeedfulError)


@pytest.mark.parametrize("texts", [None, [], ["fine", 3]])
def test_missing_or_non_string_texts(bert, texts):
    with pytest.raises(heedful.InputError) as info:
        bert.explain(texts)
    assert info.value.hint or "string" in info.value.message


# --------------------------------------------------------------------------- counts: no runaway work


@pytest.fixture
def no_work(monkeypatch):
    """Fail the test at the first pass of any model or method: a refused count does no work."""
    from heedful.adapters import ModelAdapter

    def boom(*args, **kwargs):
        raise AssertionError("work started before the count was checked")

    monkeypatch.setattr(ModelAdapter, "forward", boom)
    monkeypatch.setattr(ModelAdapter, "reference", boom, raising=False)
    for name, info in list(registry._REGISTRY.items()):
        monkeypatch.setitem(registry._REGISTRY, name, dataclasses.replace(info, fn=boom))
    return boom


def test_generating_beyond_the_models_positions_is_refused_before_generating(monkeypatch):
    lm = cached_model("gpt2", "causal_lm")  # 64 positions
    monkeypatch.setattr(lm.hf_model, "generate", lambda *a, **k: pytest.fail("generated before the check"))
    prompt_tokens = len(lm.encode("the capital of").tokens[0])
    for call in (
        lambda: lm.generate("the capital of", 100),
        lambda: lm.explain_generation("the capital of", max_new_tokens=100),
        lambda: lm.estimate_generation("the capital of", max_new_tokens=100),
    ):
        err = raises_heedful(heedful.InputError, call, "100 new tokens", "at most 64")
        assert f"at most {64 - prompt_tokens} tokens" in err.hint and "--generate" in err.hint
    with pytest.raises(heedful.InputError, match="at least 1"):
        lm.generate("the capital of", 0)


@pytest.mark.parametrize(
    ("method", "option"),
    [
        ("integrated_gradients", "n_steps"),
        ("smoothgrad", "n_samples"),
        ("lime", "n_samples"),
        ("kernel_shap", "n_samples"),
        ("rise", "n_masks"),
        ("individual_perturbation", "samples"),
        ("coperturbation", "samples"),
        ("guan2019", "max_steps"),
    ],
)
def test_counts_beyond_the_memory_budget_are_refused_before_any_pass(bert, no_work, method, option):
    budget = bert.max_memory
    bert.max_memory = "64MiB"
    # Gauss-Legendre refuses 10**8 steps for its nodes already (test_gradient_methods.py)
    options = {option: 10**8, **({"rule": "riemann_trapezoid"} if method == "integrated_gradients" else {})}
    try:
        err = raises_heedful(
            heedful.InputError, lambda: bert.explain("a dull plot", method, **options), method, f"{option}=100,000,000", "budget"
        )
        assert f"use {option} <=" in err.hint and "--max-memory" in err.hint
        raises_heedful(heedful.InputError, lambda: bert.estimate("a dull plot", method, **options), "budget")
        raises_heedful(heedful.InputError, lambda: bert.compare("a dull plot", [method], **options), "budget")
    finally:
        bert.max_memory = budget


def test_context_cite_ablations_beyond_the_memory_budget(no_work):
    lm = cached_model("gpt2", "causal_lm")
    budget = lm.max_memory
    lm.max_memory = "64MiB"
    try:
        raises_heedful(
            heedful.InputError,
            lambda: lm.explain("The cat sat. The dog ran.", "context_cite", target=" the", n_ablations=10**8),
            "n_ablations=100,000,000",
        )
    finally:
        lm.max_memory = budget


def test_generated_steps_beyond_the_memory_budget_are_refused_before_generating(monkeypatch, no_work):
    lm = cached_model("gpt2", "causal_lm")
    monkeypatch.setattr(lm.hf_model, "generate", lambda *a, **k: pytest.fail("generated before the check"))
    budget = lm.max_memory
    lm.max_memory = "64MiB"
    try:
        raises_heedful(
            heedful.InputError,
            lambda: lm.explain_generation("the capital of", "integrated_gradients", max_new_tokens=40, n_steps=10**6),
            "n_steps=1,000,000",
        )
    finally:
        lm.max_memory = budget


def test_the_estimate_counts_the_passes_a_run_takes(bert):
    work = bert.estimate("a dull plot", "integrated_gradients", n_steps=50)
    tokens = len(bert.encode("a dull plot").tokens[0])
    assert (work.forward, work.backward, work.tokens) == (51, 50, tokens)
    longer = bert.estimate(["a dull plot", "a dull plot"], "integrated_gradients", n_steps=500)
    assert longer.forward == 2 * 501 and longer.seconds == pytest.approx(work.seconds * 2 * (501 + 2 * 500) / (51 + 2 * 50))
    assert bert.estimate("a dull plot", "lime", n_samples=300).forward == 301
    assert "forward and 50 backward passes of" in work.describe() and work.describe().startswith("about ")
    lm = cached_model("gpt2", "causal_lm")
    steps = lm.estimate_generation("the capital of", "saliency", max_new_tokens=5)
    assert steps.generated == 5 and steps.forward == steps.backward == 5 and 0 < steps.generating < steps.seconds


# --------------------------------------------------------------------------- the same on the command line


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Tiny models saved as folders the command line loads: ``saved[family]``."""
    from conftest import saved_tiny

    root = tmp_path_factory.mktemp("saved")
    return {
        "bert": saved_tiny(root / "bert", "bert", "classification"),
        "gpt2": saved_tiny(root / "gpt2", "gpt2", "causal_lm"),
    }


def one_line_error(code: int, err: str) -> str:
    """The refusal's ``error:`` line, after checking it is one error line, one hint, exit 2."""
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("hint: "), err
    return lines[0]


def test_cli_generate_beyond_the_models_positions(monkeypatch, capsys, saved):
    import transformers

    monkeypatch.setattr(transformers.GenerationMixin, "generate", lambda *a, **k: pytest.fail("generated before the check"))
    from conftest import run_cli

    code, out, err = run_cli(monkeypatch, capsys, "explain", "the cat sat", "--model", saved["gpt2"], "--generate", "100000")
    line = one_line_error(code, err)
    assert "100,000 new tokens" in line and "at most 64" in line and "--generate" in err and not out


def test_cli_counts_beyond_the_memory_budget(monkeypatch, capsys, saved, no_work):
    from conftest import run_cli

    code, _, err = run_cli(
        monkeypatch, capsys, "explain", "a dull plot", "--model", saved["bert"], "--method", "integrated_gradients",
        "-o", "n_steps=100000000", "-o", "rule=riemann_trapezoid", "--max-memory", "64MiB",
    )
    assert "n_steps=100,000,000" in one_line_error(code, err) and "use n_steps <=" in err


def test_cli_says_how_long_long_work_will_take_before_it_starts(monkeypatch, capsys, saved):
    from conftest import run_cli

    from heedful.engine import workload

    args = ("explain", "a dull plot", "--model", saved["bert"], "--method", "integrated_gradients", "-o", "n_steps=10", "--json")
    code, _, err = run_cli(monkeypatch, capsys, *args)
    assert code == 0 and "about" not in err  # short work: nothing said
    monkeypatch.setattr(workload, "LONG_SECONDS", 0.0)
    code, out, err = run_cli(monkeypatch, capsys, *args)
    assert code == 0 and out
    line = err.strip().splitlines()[0]
    assert line.startswith("about ") and "11 forward and 10 backward passes of" in line and line.endswith("(estimated on this machine)")
    code, _, err = run_cli(
        monkeypatch, capsys, "explain", "the cat", "--model", saved["gpt2"], "--generate", "3", "-M", "saliency", "-M", "grad_x_input", "--json"
    )
    assert code == 0 and err.strip().splitlines()[0].startswith("about ") and "3 tokens to generate, 6 forward and 6 backward" in err


def test_steering_beyond_the_models_positions_is_refused_before_any_pass(no_work):
    from heedful.interest.steer import steer

    lm = cached_model("gpt2", "causal_lm")
    raises_heedful(heedful.InputError, lambda: steer(lm, "the cat sat on the mat", ["the mat"], max_new_tokens=1000), "1,000 new tokens", "at most 64")


@pytest.fixture(scope="module")
def reviews_csv(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("data") / "reviews.csv"
    path.write_text("text,label\na dull plot,0\ngreat acting,1\nfar too long,0\na charming journey,1\n", encoding="utf-8")
    return str(path)


def test_bench_counts_beyond_the_memory_budget_leave_no_store(monkeypatch, capsys, saved, reviews_csv, tmp_path, no_work):
    from conftest import run_cli

    out = tmp_path / "results"
    code, _, err = run_cli(
        monkeypatch, capsys, "bench", "--model", saved["bert"], "--dataset", reviews_csv, "--methods", "saliency,lime",
        "--option", "lime.n_samples=100000000", "--max-memory", "64MiB", "--out", str(out),
    )
    assert "n_samples=100,000,000" in one_line_error(code, err) and not out.exists()


def test_bench_says_how_long_its_explanations_will_take(monkeypatch, capsys, saved, reviews_csv, tmp_path):
    from conftest import run_cli

    from heedful.engine import workload

    monkeypatch.setattr(workload, "LONG_SECONDS", 0.0)
    args = ("bench", "--model", saved["bert"], "--dataset", reviews_csv, "--methods", "lime", "--option", "lime.n_samples=10",
            "--metrics", "aopc", "--out", str(tmp_path))
    code, _, err = run_cli(monkeypatch, capsys, *args)
    assert code == 0, err
    first = err.strip().splitlines()[0]
    assert first.startswith("explanations: about ") and "44 forward passes of" in first  # 4 examples x (1 + 10)
    code, _, err = run_cli(monkeypatch, capsys, *args)  # all stored: nothing to explain, nothing said
    assert code == 0 and "explanations: about" not in err


def test_a_later_batch_beyond_the_budget_is_refused_before_the_first_batchs_work(bert, no_work):
    budget = bert.max_memory
    bert.max_memory = "64MiB"
    try:  # "good" alone fits (400,001 copies of 3 tokens: 18 MiB); the long text does not
        with pytest.warns(UserWarning, match="truncated"):
            raises_heedful(heedful.InputError, lambda: bert.explain(["good", LONG_TEXT], "lime", batch_size=1, n_samples=400_000), "budget")
    finally:
        bert.max_memory = budget
