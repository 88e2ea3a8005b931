"""benchmarks/processor_stability.py: its comparison of two runs' scores, and its refusals of bad
input (before any process is started)."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import processor_stability as ps  # noqa: E402


def test_compare_counts_texts_whose_removal_order_is_unchanged():
    a = np.array([np.array([0.3, 0.2, 0.1]), np.array([1.0, -1.0]), np.array([0.5, 0.4])], dtype=object)
    b = np.array([np.array([0.3, 0.2, 0.1 + 1e-7]), np.array([1.0, -1.0]), np.array([0.4, 0.5])], dtype=object)
    same, rho, rel = ps.compare(a, b)
    # by hand: texts 1 and 2 keep their order, text 3 swaps its two tokens (rho -1)
    assert same == 2
    assert rho == pytest.approx((1 + 1 - 1) / 3)
    assert rel == pytest.approx(0.1 / 0.5)


@pytest.mark.parametrize(("argv", "says"), [(["--methods", "no_such_method"], "no method 'no_such_method'"),
                                            (["--n", "0"], "--n must be a positive number"),
                                            (["--methods", ","], "--methods names no method")])
def test_bad_input_is_one_line_and_exit_code_2(argv, says, capsys):
    with pytest.raises(SystemExit) as exc:
        ps.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert says in err[-1] and not any("Traceback" in line for line in err)


def test_registered_methods_pass_the_checks(monkeypatch):
    class Started(Exception):
        pass

    def run(*args, **kwargs):
        raise Started

    monkeypatch.setattr(ps.subprocess, "run", run)
    with pytest.raises(Started):  # the checks passed: the first worker is being started
        ps.main(["--methods", "cam,lrp,integrated-gradients", "--n", "2"])
