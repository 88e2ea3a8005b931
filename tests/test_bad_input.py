"""Bad input gets a heedful error that names the problem and says what to do -- never a raw
torch / Python error from deep inside a method."""

from __future__ import annotations

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
