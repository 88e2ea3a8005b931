"""The command line on a tiny model saved to disk: output formats and clear errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import run_cli, saved_tiny

from heedful import cli


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return saved_tiny(tmp_path_factory.mktemp("tiny-bert"), "bert", "classification")


def test_explain_json_has_tokens_scores_target_method(monkeypatch, capsys, model_dir):
    code, out, _ = run_cli(monkeypatch, capsys, "explain", "a charming and often affecting journey", "--model", model_dir, "--method", "normxlogit", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["method"] == "normxlogit"
    assert len(data["tokens"]) == len(data["scores"]) > 2
    assert data["tokens"][0] == "[CLS]" and data["special"][0] is True
    assert data["target"]["label"] in ("NEGATIVE", "NEUTRAL", "POSITIVE")


def test_explain_several_methods_and_texts(monkeypatch, capsys, model_dir):
    code, out, _ = run_cli(
        monkeypatch, capsys, "explain", "great acting", "a dull plot", "--model", model_dir,
        "--method", "saliency", "--method", "rollout", "--json",
    )
    assert code == 0
    data = json.loads(out)
    assert [d["method"] for d in data] == ["saliency", "rollout", "saliency", "rollout"]
    assert [d["text"] for d in data] == ["great acting", "great acting", "a dull plot", "a dull plot"]


def test_explain_heatmap_words_and_html(monkeypatch, capsys, model_dir, tmp_path):
    page = tmp_path / "out.html"
    code, out, _ = run_cli(
        monkeypatch, capsys, "explain", "the movie was dull", "--model", model_dir, "--method", "normxlogit",
        "--method", "grad_x_input", "--words", "--html", str(page),
    )
    assert code == 0
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>") and "grad_x_input" in text and "dull" in text
    assert "<script" not in text and "http" not in text.split("</style>", 1)[1]


def test_explain_reads_stdin_and_target_option(monkeypatch, capsys, model_dir):
    code, out, _ = run_cli(
        monkeypatch, capsys, "explain", "--file", "-", "--model", model_dir, "--method", "integrated_gradients",
        "-o", "n_steps=8", "--target", "NEGATIVE", "--json", stdin="first text\n\nsecond text\n",
    )
    assert code == 0
    data = json.loads(out)
    assert [d["text"] for d in data] == ["first text", "second text"]
    assert all(d["target"]["label"] == "NEGATIVE" and d["options"]["n_steps"] == 8 for d in data)


def test_layerwise_flag(monkeypatch, capsys, model_dir):
    code, out, _ = run_cli(monkeypatch, capsys, "explain", "great acting", "--model", model_dir, "--layerwise", "--json")
    assert code == 0
    data = json.loads(out)
    assert len(data["scores"]) == 2  # the tiny model's two layers
    assert all(len(row) == len(data["tokens"]) for row in data["scores"])


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["explain", "", "--model", "{m}"], "empty"),
        (["explain", "   ", "--model", "{m}"], "empty"),
        (["explain", "fine", "--model", "{m}", "--method", "nope"], "available methods"),
        (["explain", "fine", "--model", "{m}", "--target", "JOYFUL"], "labels are"),
        (["explain", "fine", "--model", "{m}", "--target", "7"], "out of range"),
        (["explain", "word " * 100, "--model", "{m}", "--no-truncate"], "at most"),
        (["explain", "fine", "--model", "{m}", "--method", "saliency", "--layerwise"], "layer-wise"),
        (["explain", "fine", "--model", "{m}", "-o", "bogus=1"], "does not take"),
        (["explain", "fine", "--model", "/no/such/folder"], "not a model directory"),
    ],
)
def test_bad_input_is_one_clear_error(monkeypatch, capsys, model_dir, args, needle):
    code, out, err = run_cli(monkeypatch, capsys, *[a.replace("{m}", model_dir) for a in args])
    assert code == 2
    assert "error:" in err and needle in err
    assert "Traceback" not in err + out


def test_long_text_is_truncated_with_a_warning(monkeypatch, capsys, model_dir):
    code, out, err = run_cli(monkeypatch, capsys, "explain", "word " * 100, "--model", model_dir, "--json")
    assert code == 0
    assert "truncated" in err
    data = json.loads(out)
    assert data["truncated"] is True and len(data["tokens"]) == 64


def test_methods_lists_at_least_twelve(monkeypatch, capsys):
    code, out, _ = run_cli(monkeypatch, capsys, "methods")
    assert code == 0
    for name in ("random", "embedding_norm", "logat", "normxlogit", "saliency", "grad_x_input",
                 "integrated_gradients", "smoothgrad", "raw_attention", "rollout", "leave_one_out"):
        assert name in out
    from heedful.catalog import entries

    names = {info.name for info in entries().methods}
    rows = [line.replace("│", " ").split() for line in out.splitlines()]
    assert sum(1 for cells in rows if cells and cells[0] in names) >= 12  # one row per method, whatever the width


def test_models_lists_the_zoo(monkeypatch, capsys):
    code, out, _ = run_cli(monkeypatch, capsys, "models")
    assert code == 0
    assert "minilm-sentiment" in out and "smollm2-135m" in out


def test_error_in_a_real_process_has_no_traceback(model_dir):
    done = subprocess.run(
        [sys.executable, "-m", "heedful.cli", "explain", "", "--model", model_dir],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 2
    assert "the text is empty" in done.stderr and "Traceback" not in done.stderr


def test_reproduce_quick_never_writes_over_the_committed_report(monkeypatch, tmp_path):
    import heedful.reproduce as reproduce

    written = []

    def fake_writer(out, settings):
        written.append((out, settings.quick, settings.options))
        return out / "report.md"

    monkeypatch.setattr(reproduce, "report_writer", lambda name: fake_writer)
    monkeypatch.chdir(tmp_path)
    cli.reproduce_command.reproduce("mask-lrp", out=None, n=None, quick=True, store=None, option=["ig_steps=4"])
    cli.reproduce_command.reproduce("mask-lrp", out=None, n=None, quick=False, store=None, option=None)
    assert written == [
        (reproduce.default_out_dir() / "quick", True, {"ig_steps": 4}),
        (reproduce.default_out_dir(), False, {}),
    ]
    with pytest.raises(cli.HeedfulError, match="unknown report"):
        cli.reproduce_command.reproduce("lime", out=None, n=None, quick=True, store=None, option=None)


def test_option_values_are_json_when_they_parse():
    from heedful.commands.options import key_value, options

    assert key_value(" n_steps =20") == ("n_steps", 20)
    assert key_value("baseline=mask") == ("baseline", "mask")
    assert key_value("ratios=[0.1, 0.2]") == ("ratios", [0.1, 0.2])
    assert options(["lam=0.5"], lam=0.6, samples=None, max_steps=10) == {"lam": 0.5, "max_steps": 10}
    with pytest.raises(cli.HeedfulError, match="not key=value"):
        key_value("n_steps")
