"""Hints a new user can act on: "did you mean" for a misspelt method, option, model, label or
dataset option (one helper, :func:`heedful.errors.did_you_mean`); a fix said in Python to a
Python caller and in flags on the command line; plausibility data refused with the column and
its format named."""

from __future__ import annotations

import doctest

import pytest
import torch
from conftest import run_cli, saved_tiny, write_reviews

import heedful
import heedful.errors
from heedful.evaluate import get_protocol
from heedful.evaluate.bench import BenchSpec, run_bench

needs_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is available here")


def _error(call) -> heedful.HeedfulError:
    with pytest.raises(heedful.HeedfulError) as caught:
        call()
    return caught.value


def test_the_documented_hints_hold():
    outcome = doctest.testmod(heedful.errors)
    assert outcome.attempted > 0 and outcome.failed == 0


def test_a_misspelt_method_option_model_or_label_is_answered_with_the_close_name(tiny):
    assert _error(lambda: heedful.get_method("integrated_gradient")).hint == "did you mean 'integrated_gradients'?"
    assert _error(lambda: heedful.get_method("Integrated-Gradient")).hint == "did you mean 'integrated_gradients'?"
    assert "available methods: alti" in _error(lambda: heedful.get_method("qqq")).hint  # nothing close: the list
    assert _error(lambda: heedful.get_method("integrated_gradients").bind({"n_step": 3})).hint == "did you mean 'n_steps'?"
    assert "did you mean 'minilm-sentiment'" in _error(lambda: heedful.load("minilm-sentimnt")).hint
    model = tiny("bert")
    label = model.labels[1]
    assert _error(lambda: model.explain("fine", "saliency", target=label[:-1])).hint == f"did you mean {label!r}?"


def test_the_command_line_says_did_you_mean_instead_of_listing_every_method(monkeypatch, capsys, tmp_path):
    folder = saved_tiny(tmp_path / "tiny-bert", "bert")
    code, _, err = run_cli(monkeypatch, capsys, "explain", "fine", "--model", folder, "--method", "integrated_gradient")
    assert code == 2 and "did you mean 'integrated_gradients'?" in err and "alti" not in err, err
    code, _, err = run_cli(monkeypatch, capsys, "explain", "fine", "--model", folder, "--method", "integrated_gradients", "-o", "n_step=3")
    assert code == 2 and "did you mean 'n_steps'?" in err, err


@needs_no_cuda
def test_a_device_hint_speaks_python_to_python_and_flags_to_the_command_line(monkeypatch, capsys, tmp_path):
    error = _error(lambda: heedful.load("minilm-sentiment", device="cuda"))
    assert error.hint == "pass device='cpu'" and "--device" not in str(error)
    code, _, err = run_cli(monkeypatch, capsys, "explain", "fine", "--device", "cuda")
    assert code == 2 and "use --device cpu" in err and "device='cpu'" not in err, err


def _spec(model, data, out) -> BenchSpec:
    return BenchSpec(
        model=model, dataset=data, methods=["saliency"], metrics=["token_f1"], n=2,
        protocol=get_protocol("ferret"), out=out, batch_size=2, model_label="tiny-bert",
    )


def test_plausibility_on_a_csv_without_evidence_names_the_column_and_its_format(tiny, tmp_path):
    data = write_reviews(tmp_path / "mydata.csv")
    error = _error(lambda: run_bench(_spec(tiny("bert"), data, tmp_path / "out"), progress=False))
    assert "no 'evidence' column" in error.message
    assert "an 'evidence' column of words separated by | (dull|boring)" in error.hint and "its columns: text, label" in error.hint
    assert "docs/bench.md" in error.hint and not (tmp_path / "out").exists()

    renamed = tmp_path / "rationales.csv"
    renamed.write_text("text,label,rationale\nthe movie was dull,NEGATIVE,dull\n", encoding="utf-8")
    assert "rename 'rationale' to 'evidence'" in _error(lambda: run_bench(_spec(tiny("bert"), str(renamed), tmp_path / "o2"), progress=False)).hint

    commas = tmp_path / "commas.csv"
    commas.write_text('text,label,evidence\n"the movie was dull and far too long",NEGATIVE,"dull, long"\n', encoding="utf-8")
    error = _error(lambda: run_bench(_spec(tiny("bert"), str(commas), tmp_path / "o3"), progress=False))
    assert "separate evidence words with | (dull|boring)" in error.hint


def test_the_documented_csv_example_scores_plausibility(tiny, tmp_path):
    data = tmp_path / "mydata.csv"
    data.write_text(
        'text,label,evidence\n"a dull, boring plot",NEGATIVE,dull|boring\n"a charming and often affecting journey",POSITIVE,charming|affecting\n',
        encoding="utf-8",
    )
    result = run_bench(_spec(tiny("bert"), str(data), tmp_path / "out"), progress=False)
    assert result.computed["metrics"] > 0


def test_python_callers_are_told_the_python_fix(tiny):
    lm = tiny("gpt2", "causal_lm")
    assert _error(lambda: lm.explain_generation("the cat", "saliency", max_new_tokens=0)).hint == "e.g. max_new_tokens=12"
    error = _error(lambda: lm.explain("the cat " * 40, "saliency", truncation=False))
    assert "truncation=True" in error.hint and "--no-truncate" not in str(error) and "--no-truncate" in error.cli_hint
    from heedful.interest.steer import decoding_modes

    assert _error(lambda: decoding_modes(8, beams=1)).hint == "e.g. beams=3 (the paper's)"


def test_a_short_name_is_answered_with_the_names_it_abbreviates():
    """What Captum and Inseq users type: initials (``ig``, ``LOO``) or one word of the name
    (``shap``, ``steps``) -- difflib finds nothing close in those."""
    assert _error(lambda: heedful.get_method("ig")).hint == "did you mean 'integrated_gradients'?"
    assert _error(lambda: heedful.get_method("LOO")).hint == "did you mean 'leave_one_out' or 'source_loo'?"
    assert _error(lambda: heedful.get_method("shap")).hint == "did you mean 'kernel_shap'?"
    assert _error(lambda: heedful.get_method("integrated_gradients").bind({"steps": 3})).hint == "did you mean 'n_steps'?"
    assert heedful.errors.close_matches("x", ["x_input", "grad_x_input"]) == []  # one letter is no abbreviation
