"""Knowing the machine (heedful.engine.precision.support, heedful.engine.machine, ``heedful info``) and
choosing by it: ``precision="auto"`` and the warning / refusal of an explicit precision the
machine runs slower than fp32. The outcomes are tested on both kinds of machine by stubbing the
probe's result; the probe itself runs for real, and the one test that depends on this
processor's bf16 / int8 speed is skipped where the probe says it lacks the instructions."""

from __future__ import annotations

import csv
import json
import sqlite3
import warnings

import numpy as np
import pytest
from conftest import run_cli, saved_tiny
from tiny import CORPUS, tiny_model

import heedful.engine.precision as precision_module
from heedful.engine.machine import cpuinfo, is_native, native_route, relevant_flags
from heedful.engine.precision import (
    SlowPrecisionWarning,
    Support,
    resolve_precision,
    strict_precision,
    support,
)
from heedful.errors import InputError
from heedful.evaluate import evaluate, get_protocol

TEXTS = list(CORPUS[:4])

WITH_AVX512_BF16 = Support(
    device="cpu", processor="Intel Xeon (stub)", flags=("avx512_bf16", "avx512_vnni", "avx2", "fma"),
    routes={"fp32": "native", "bf16": "AVX-512 BF16", "int8": "AVX-512 VNNI"},
    speed={"fp32": 1.0, "bf16": 2.3, "int8": 2.5}, probe="stub", threads=1, torch="stub", seconds=0.0,
)
WITHOUT_AVX512 = Support(
    device="cpu", processor="AMD EPYC (stub)", flags=("avx2", "fma"),
    routes={"fp32": "native", "bf16": "no AVX-512 BF16 or AMX", "int8": "no VNNI or AMX"},
    speed={"fp32": 1.0, "bf16": 0.15, "int8": 1.4}, probe="stub", threads=1, torch="stub", seconds=0.0,
)


@pytest.fixture(scope="module")
def model():
    return tiny_model("bert", initializer_range=0.2)


@pytest.fixture
def machine(monkeypatch):
    """``machine(support)``: the probe's result stubbed for the test (warnings shown afresh)."""
    monkeypatch.setattr(precision_module, "_WARNED", set())

    def stub(found: Support) -> None:
        monkeypatch.setattr(precision_module, "support", lambda device="cpu", refresh=False: found)

    return stub


def _scores(explanations) -> np.ndarray:
    return np.concatenate([np.asarray(e.scores, dtype=float) for e in explanations])


# ---------------------------------------------------------------------------- auto
def test_auto_picks_bf16_where_the_machine_has_avx512_bf16_and_the_method_allows(model, machine):
    machine(WITH_AVX512_BF16)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SlowPrecisionWarning)  # a fast machine never warns
        lime = model.explain(TEXTS, "lime", precision="auto", n_samples=64, seed=0)
        loo = model.explain(TEXTS, "leave_one_out", precision="auto")
        explicit = model.explain(TEXTS, "lime", precision="bf16", n_samples=64, seed=0)
    assert [e.options["precision"] for e in lime] == ["bf16"] * len(TEXTS)
    np.testing.assert_array_equal(_scores(lime), _scores(explicit))  # the bf16 copy ran
    assert [e.options["precision"] for e in loo] == ["fp32"] * len(TEXTS)  # differences of logits: fp32
    expl = model.explain(TEXTS, "grad_x_input")
    auto = evaluate(model, expl, ["aopc"], "ferret", precision="auto")["aopc"].per_example.values
    bf16 = evaluate(model, expl, ["aopc"], "ferret", precision="bf16")["aopc"].per_example.values
    fp32 = evaluate(model, expl, ["aopc"], "ferret")["aopc"].per_example.values
    np.testing.assert_array_equal(auto, bf16)
    assert not np.array_equal(auto, fp32)
    assert get_protocol("ferret", precision="auto").resolved("cpu").precision == "bf16"


def test_auto_picks_fp32_without_avx512_bf16(model, machine):
    machine(WITHOUT_AVX512)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SlowPrecisionWarning)
        lime = model.explain(TEXTS, "lime", precision="auto", n_samples=64, seed=0)
        fp32 = model.explain(TEXTS, "lime", n_samples=64, seed=0)
        expl = model.explain(TEXTS, "grad_x_input")
        auto = evaluate(model, expl, ["aopc"], "ferret", precision="auto")["aopc"].per_example.values
    assert [e.options["precision"] for e in lime] == ["fp32"] * len(TEXTS)
    np.testing.assert_array_equal(_scores(lime), _scores(fp32))
    np.testing.assert_array_equal(auto, evaluate(model, expl, ["aopc"], "ferret")["aopc"].per_example.values)
    protocol = get_protocol("ferret", precision="auto")
    assert protocol.resolved("cpu").precision == "fp32"
    assert protocol.resolved("cpu").hash() == get_protocol("ferret").hash()  # stored fp32 results keep their key
    with pytest.raises(InputError, match="resolved"):
        protocol.hash()


def test_auto_never_picks_int8_even_where_it_is_faster(machine):
    machine(WITHOUT_AVX512)  # int8 1.4x here
    assert resolve_precision("auto", "cpu", ("bf16",)) == "fp32"
    assert resolve_precision("auto", "cpu", ()) == "fp32"
    assert WITHOUT_AVX512.auto(("bf16", "int8")) == "int8"  # were it tolerated
    machine(WITH_AVX512_BF16)
    assert resolve_precision("auto", "cpu", ("bf16",)) == "bf16"


# ---------------------------------------------------------------------------- say, or refuse
def test_explicit_bf16_on_a_machine_without_it_warns_once_with_the_ratio(model, machine):
    machine(WITHOUT_AVX512)
    with pytest.warns(SlowPrecisionWarning) as caught:
        found = model.explain(TEXTS[:2], "lime", precision="bf16", n_samples=32, seed=0)
        model.explain(TEXTS[:2], "rise", precision="bf16", n_masks=32, seed=0)
    slow = [w for w in caught if issubclass(w.category, SlowPrecisionWarning)]
    assert len(slow) == 1  # one line per precision, not one per call
    message = str(slow[0].message)
    assert message == (
        "bf16 runs 0.15x the speed of fp32 on this processor (AMD EPYC (stub): no AVX-512 BF16 or AMX); use precision=fp32 or auto"
    )
    assert [e.options["precision"] for e in found] == ["bf16", "bf16"]  # it ran anyway
    with warnings.catch_warnings():
        warnings.simplefilter("error", SlowPrecisionWarning)
        model.explain(TEXTS[:1], "lime", precision="int8", n_samples=32, seed=0)  # int8 is faster here


def test_strict_refuses_a_slow_precision_before_any_work(model, machine):
    machine(WITHOUT_AVX512)
    fresh = tiny_model("bert", initializer_range=0.2)
    with strict_precision():
        with pytest.raises(InputError, match=r"bf16 runs 0\.15x the speed of fp32") as err:
            fresh.explain(TEXTS, "leave_one_out", precision="bf16")
        assert "\n" not in str(err.value.args[0])
        with pytest.raises(InputError, match="0.15x"):
            evaluate(fresh, fresh.explain(TEXTS[:1], "grad_x_input"), ["aopc"], "ferret", precision="bf16")
        assert fresh.explain(TEXTS[:1], "lime", precision="auto", n_samples=32, seed=0)[0].options["precision"] == "fp32"
    assert "bf16" not in fresh.adapter.lowered  # refused before any bf16 pass
    machine(WITH_AVX512_BF16)
    with strict_precision():
        assert resolve_precision("bf16", "cpu") == "bf16"


def _dataset(path):
    with open(path, "w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows([("text", "label"), *[(t, "POSITIVE" if i % 2 else "NEGATIVE") for i, t in enumerate(CORPUS[:4])]])
    return str(path)


def _stored(folder):
    db = sqlite3.connect(folder / "results.sqlite")
    runs = {m: (json.loads(o), r) for m, o, r in db.execute("SELECT method, options, run FROM runs").fetchall()}
    protocols = [(h, json.loads(f)) for h, f in db.execute("SELECT protocol_hash, fields FROM protocols")]
    db.close()
    return runs, protocols


def test_bench_keys_the_precision_auto_resolved_to(monkeypatch, capsys, tmp_path, machine):
    model_dir = saved_tiny(tmp_path / "m", "bert", "classification", initializer_range=0.2)
    data = _dataset(tmp_path / "d.csv")
    base = ["bench", "--model", model_dir, "--dataset", data, "--methods", "leave_one_out,lime,saliency", "--metrics", "aopc",
            "--option", "lime.n_samples=32"]
    machine(WITHOUT_AVX512)
    code, _, err = run_cli(monkeypatch, capsys, *base, "--out", str(tmp_path / "plain"))
    assert code == 0, err
    code, _, err = run_cli(monkeypatch, capsys, *base, "--out", str(tmp_path / "slow"), "--precision", "auto")
    assert code == 0, err
    plain, slow = _stored(tmp_path / "plain"), _stored(tmp_path / "slow")
    assert slow == plain  # auto resolved to fp32: the keys of fp32 results, "auto" in none
    machine(WITH_AVX512_BF16)
    code, _, err = run_cli(monkeypatch, capsys, *base, "--out", str(tmp_path / "fast"), "--precision", "auto")
    assert code == 0, err
    runs, protocols = _stored(tmp_path / "fast")
    assert runs["lime"][0]["precision"] == "bf16"
    assert "precision" not in runs["leave_one_out"][0] and runs["leave_one_out"][1] == plain[0]["leave_one_out"][1]
    assert "precision" not in runs["saliency"][0]
    assert [p.get("precision") for _, p in protocols] == ["bf16"]


def test_bench_warns_or_refuses_a_slow_precision(monkeypatch, capsys, tmp_path, machine):
    model_dir = saved_tiny(tmp_path / "m", "bert", "classification", initializer_range=0.2)
    data = _dataset(tmp_path / "d.csv")
    base = ["bench", "--model", model_dir, "--dataset", data, "--methods", "leave_one_out", "--metrics", "aopc", "--precision", "bf16"]
    machine(WITHOUT_AVX512)
    code, _, err = run_cli(monkeypatch, capsys, *base, "--out", str(tmp_path / "warned"))
    assert code == 0, err
    assert err.count("warning: bf16 runs 0.15x the speed of fp32 on this processor") == 1
    code, _, err = run_cli(monkeypatch, capsys, *base, "--out", str(tmp_path / "refused"), "--strict")
    assert code == 2 and "error: bf16 runs 0.15x the speed of fp32" in err and "--strict" in err and "Traceback" not in err
    assert not (tmp_path / "refused" / "results.sqlite").exists()  # refused before the store was opened


def test_explain_warns_or_refuses_a_slow_precision(monkeypatch, capsys, tmp_path, machine):
    model_dir = saved_tiny(tmp_path / "m", "bert", "classification", initializer_range=0.2)
    base = ["explain", "a fine film", "--model", model_dir, "-M", "lime", "-o", "precision=bf16", "-o", "n_samples=16", "--json"]
    machine(WITHOUT_AVX512)
    code, out, err = run_cli(monkeypatch, capsys, *base)
    assert code == 0, err
    assert json.loads(out)["options"]["precision"] == "bf16" and "warning: bf16 runs 0.15x the speed of fp32" in err
    code, out, err = run_cli(monkeypatch, capsys, *base, "--strict")
    assert code == 2 and "error: bf16 runs 0.15x the speed of fp32" in err and not out.strip()


def test_info_shows_the_machine_and_what_auto_picks(monkeypatch, capsys, machine):
    machine(WITHOUT_AVX512)
    code, out, err = run_cli(monkeypatch, capsys, "info")
    assert code == 0, err
    assert "AMD EPYC (stub)" in out and "0.15x (slower)" in out and "1.40x (faster)" in out
    assert "lime: fp32" in out and "curves: fp32" in out
    machine(WITH_AVX512_BF16)
    code, out, err = run_cli(monkeypatch, capsys, "info", "--json")
    found = json.loads(out)
    assert code == 0 and found["support"]["speed"]["bf16"] == 2.3
    assert found["auto"]["lime"] == "bf16" and found["auto"]["curves"] == "bf16" and found["auto"]["leave_one_out"] == "fp32"


# ---------------------------------------------------------------------------- the probe, for real
def test_support_probes_once_and_reads_the_cache_after(monkeypatch, tmp_path):
    monkeypatch.setenv("HEEDFUL_HOME", str(tmp_path))
    first = support()
    assert first.speed["fp32"] == 1.0 and all(first.speed[p] > 0 for p in ("bf16", "int8"))
    name, flags = cpuinfo()
    assert first.processor == name and first.flags == relevant_flags(flags)
    assert first.routes["bf16"] == native_route("bf16", first.flags)
    assert (tmp_path / "precision-support.json").is_file()
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".part")]

    def no_probe(device):
        raise AssertionError("probed again although cached")

    monkeypatch.setattr(precision_module, "_probe", no_probe)
    assert support() == first
    monkeypatch.setattr(precision_module, "_probe", lambda device: ({"fp32": 1.0, "bf16": 9.0, "int8": None}, "stub"))
    assert support(refresh=True).speed["bf16"] == 9.0 and support().speed["bf16"] == 9.0
    (tmp_path / "precision-support.json").write_text("{not json", encoding="utf-8")
    assert support().probe == "stub"  # a damaged cache is probed again, not an error

    def read_only(dest):
        raise PermissionError(13, "Permission denied", str(dest))

    monkeypatch.setenv("HEEDFUL_HOME", str(tmp_path / "read-only"))
    monkeypatch.setattr(precision_module, "atomic_file", read_only)
    assert support().probe == "stub"  # a cache that cannot be written is no error
    monkeypatch.setattr(precision_module, "_probe", no_probe)
    assert support().probe == "stub"  # and this process keeps the result


@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_a_precision_the_processor_runs_natively_is_measured_faster(precision):
    found = support()
    if not is_native(precision, found.flags):
        pytest.skip(f"this processor lacks native {precision}: {found.routes[precision]} ({precision} {found.speed[precision]:.2f}x fp32)")
    probes = [found]
    while probes[-1].speed[precision] <= 1.0 and len(probes) < 3:  # a busy machine can disturb a whole probe
        probes.append(support(refresh=True))
    assert max(p.speed[precision] for p in probes) > 1.0, [p.summary() for p in probes]


def test_cpuinfo_reads_the_flags_that_decide_lower_precision(tmp_path):
    x86 = tmp_path / "x86"
    x86.write_text("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: fpu avx2 fma avx512f avx512_bf16 amx_tile amx_bf16 amx_int8 avx512_vnni\n")
    name, flags = cpuinfo(x86)
    assert name == "Intel(R) Xeon(R) Platinum 8480+"
    assert relevant_flags(flags) == ("amx_tile", "amx_bf16", "amx_int8", "avx512_bf16", "avx512_vnni", "avx512f", "avx2", "fma")
    assert native_route("bf16", flags) == "AMX, AVX-512 BF16" and native_route("int8", flags) == "AMX-INT8, AVX-512 VNNI"
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd asimddp bf16 i8mm\nCPU implementer\t: 0x41\n")
    assert is_native("bf16", cpuinfo(arm)[1]) and native_route("int8", cpuinfo(arm)[1]) == "ARM I8MM, ARM dot product"
    assert cpuinfo(tmp_path / "missing")[1] is None and native_route("bf16", None) == "flags unknown"
    assert is_native("bf16", ("avx2", "fma")) is False and is_native("fp32", None) is True
