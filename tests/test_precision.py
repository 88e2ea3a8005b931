"""Lower-precision forward passes (heedful.engine.precision): bf16 / int8 outputs stay close to fp32,
store keys change only away from fp32, gradient methods refuse a precision, the low-precision
copy is built once and reused, its outputs follow the model's device and dtype, and
``heedful bench --precision`` records the precision."""

from __future__ import annotations

import csv
import json
import sqlite3

import numpy as np
import pytest
import torch
from conftest import run_cli, saved_tiny
from tiny import CORPUS, tiny_model

from heedful.engine.precision import active_precision, forward_precision, lowered_model
from heedful.errors import InputError
from heedful.evaluate import evaluate, get_protocol
from heedful.evaluate.store import run_key, subject
from heedful.registry import registered

TEXTS = list(CORPUS[:6])
FORWARD_ONLY = tuple(sorted(name for name, info in registered().items() if info.takes("precision")))
"""The forward-only methods: those whose options include ``precision`` (from the registry, so a
new one is covered without editing this file)."""

# Tolerances (tiny BERT, weights at std 0.2, 2 classes): class probabilities of one forward
# within 0.01 (bf16: 8-bit mantissa products, float32 sums) and 0.05 (int8: 8-bit weights and
# activations); attribution scores within 10 % (bf16) / 30 % (int8) of the largest fp32 score
# (leave-one-out differences of logits amplify the rounding most).
PROB_TOL = {"bf16": 0.01, "int8": 0.05}
SCORE_TOL = {"bf16": 0.10, "int8": 0.30}


@pytest.fixture(scope="module")
def model():
    return tiny_model("bert", initializer_range=0.2)


def _probs(model, precision: str) -> torch.Tensor:
    problem = model.prepare(TEXTS)
    with forward_precision(precision):
        fwd = problem.forward()
    return fwd.logits.softmax(-1)


@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_lowered_forward_is_close_to_fp32_and_float32(model, precision):
    fp32 = _probs(model, "fp32")
    low = _probs(model, precision)
    assert low.dtype == torch.float32 and low.device == model.adapter.device
    assert float((low - fp32).abs().max()) <= PROB_TOL[precision]
    assert not torch.equal(low, fp32)  # the low-precision copy really ran


@pytest.mark.parametrize("precision", ["bf16", "int8"])
@pytest.mark.parametrize("method", FORWARD_ONLY)
def test_forward_only_methods_close_to_fp32(model, method, precision):
    base = model.explain(TEXTS, method)
    low = model.explain(TEXTS, method, precision=precision)
    scale = max(float(np.abs(np.asarray(e.scores)).max()) for e in base)
    worst = max(float(np.abs(np.asarray(a.scores) - np.asarray(b.scores)).max()) for a, b in zip(base, low, strict=True))
    assert worst <= SCORE_TOL[precision] * scale
    assert [e.tokens for e in low] == [e.tokens for e in base]


def test_aopc_at_lower_precision_is_close(model):
    expl = model.explain(TEXTS, "grad_x_input")
    fp32 = evaluate(model, expl, ["aopc"], "ferret")["aopc"].per_example.values
    for precision in ("bf16", "int8"):
        low = evaluate(model, expl, ["aopc"], "ferret", precision=precision)["aopc"].per_example.values
        assert np.abs(low - fp32).max() <= PROB_TOL[precision]
    again = evaluate(model, expl, ["aopc"], get_protocol("ferret", precision="fp32"))["aopc"].per_example.values
    np.testing.assert_array_equal(again, fp32)


def test_the_precision_option_is_declared_on_exactly_the_forward_only_methods():
    assert {"leave_one_out", "lime", "kernel_shap", "rise"} <= set(FORWARD_ONLY)
    for name in FORWARD_ONLY:
        info = registered()[name]
        assert info.family in ("perturbation", "context"), f"{name} takes a precision but is not forward-only"
        spec = info.option("precision")
        assert spec.default == "fp32" and spec.choices == ("fp32", "bf16", "int8", "auto") and spec.keyed_when_set


def test_keys_unchanged_at_fp32_and_changed_otherwise(model, tmp_path):
    path = tmp_path / "d.csv"
    with open(path, "w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows([("text", "label"), ("a fine film", "POSITIVE"), ("a dull film", "NEGATIVE")])
    about = subject(model, str(path), "test")
    for method in FORWARD_ONLY:
        implicit = run_key(about, method)
        assert "precision" not in json.loads(implicit.options)
        assert run_key(about, method, {"precision": "fp32"}).digest == implicit.digest
        digests = {run_key(about, method, {"precision": p}).digest for p in ("bf16", "int8")}
        assert len(digests) == 2 and implicit.digest not in digests
    protocol = get_protocol("ferret")
    assert protocol.with_(precision="fp32").hash() == protocol.hash()
    assert "precision" not in protocol.key_dict()
    assert protocol.with_(precision="bf16").hash() != protocol.hash() != protocol.with_(precision="int8").hash()
    with pytest.raises(InputError, match="precision"):
        get_protocol("ferret", precision="fp16")
    with pytest.raises(InputError, match="precision"):
        run_key(about, "lime", {"precision": "fp16"})


@pytest.mark.parametrize("method", ["saliency", "integrated_gradients", "normxlogit"])
def test_gradient_and_other_methods_refuse_a_precision(model, method):
    with pytest.raises(InputError, match="has no precision option") as err:
        model.explain(TEXTS[:1], method, precision="bf16")
    assert "\n" not in str(err.value.args[0])


def test_the_low_precision_copy_is_built_once_and_reused(model):
    adapter = model.adapter
    first = adapter.at_precision("bf16")
    model.explain(TEXTS[:2], "leave_one_out", precision="bf16")
    model.explain(TEXTS[:2], "lime", precision="bf16")
    assert adapter.at_precision("bf16") is first and adapter.lowered["bf16"] is first
    assert adapter.at_precision("fp32") is adapter
    assert first.counter is adapter.counter and first.tokenizer is adapter.tokenizer
    assert first.hf_model is not adapter.hf_model
    # the float32 model is untouched; the copy is bfloat16, the int8 copy's linears quantised
    assert all(p.dtype == torch.float32 for p in adapter.hf_model.parameters())
    assert all(p.dtype == torch.bfloat16 for p in first.hf_model.parameters())
    quantised = adapter.at_precision("int8").hf_model
    assert not any(type(m) is torch.nn.Linear for m in quantised.modules())
    assert active_precision() == "fp32"  # the method's context was left
    with pytest.raises(InputError, match="lowered again"):
        first.at_precision("int8")


def test_lowered_model_leaves_the_model_and_refuses_int8_off_cpu():
    torch.manual_seed(0)
    layer = torch.nn.Sequential(torch.nn.Linear(8, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    x = torch.randn(4, 8)
    for precision, dtype in (("bf16", torch.bfloat16), ("int8", torch.float32)):
        with torch.no_grad():
            out, exact = lowered_model(layer, precision)(x.to(dtype)), layer(x)
        assert out.dtype == dtype and out.shape == (4, 2)
        assert float((out.float() - exact).abs().max()) < 0.05
    assert lowered_model(layer, "fp32") is layer
    assert all(p.dtype == torch.float32 for p in layer.parameters())
    with pytest.raises(InputError, match="one of"):
        lowered_model(layer, "fp8")

    class OnGpu(torch.nn.Module):
        def parameters(self, recurse=True):
            yield torch.nn.Parameter(torch.empty(0, device="meta"))

    with pytest.raises(InputError, match="CPU only"):
        lowered_model(OnGpu(), "int8")


def test_bench_precision_flag_is_recorded(monkeypatch, capsys, tmp_path):
    model_dir = saved_tiny(tmp_path / "m", "bert", "classification", initializer_range=0.2)
    data = tmp_path / "d.csv"
    with open(data, "w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows([("text", "label"), *[(t, "POSITIVE" if i % 2 else "NEGATIVE") for i, t in enumerate(CORPUS[:4])]])
    base = ["bench", "--model", model_dir, "--dataset", str(data), "--methods", "leave_one_out,saliency", "--metrics", "aopc"]
    code, out, err = run_cli(monkeypatch, capsys, *base, "--out", str(tmp_path / "r"), "--precision", "bf16")
    assert code == 0, err
    db = sqlite3.connect(tmp_path / "r" / "results.sqlite")
    options = dict(db.execute("SELECT method, options FROM runs").fetchall())
    assert json.loads(options["leave_one_out"])["precision"] == "bf16"
    assert "precision" not in json.loads(options["saliency"])
    protocols = [json.loads(f) for (f,) in db.execute("SELECT fields FROM protocols")]
    assert [p.get("precision") for p in protocols] == ["bf16"]
    code, out, err = run_cli(monkeypatch, capsys, *base, "--out", str(tmp_path / "r"), "--precision", "fp16")
    assert code == 2 and "precision" in err and "Traceback" not in err
