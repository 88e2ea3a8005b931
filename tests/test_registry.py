"""The registry: options read from signatures, bound and validated; the README's method table
is the registry's."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Annotated, Literal

import pytest
import torch

import heedful
from heedful import registry
from heedful.engine.options import AT_LEAST_ONE, RUNTIME, option_specs
from heedful.render.methods import method_table

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_method_table_is_the_registry():
    text = README.read_text(encoding="utf-8")
    found = re.search(r"<!-- methods:.*?-->\n(.*?)\n<!-- /methods -->", text, re.S)
    assert found, "README.md has no generated method table"
    assert found.group(1) == method_table(heedful.methods()), "regenerate it with `heedful methods --markdown --write README.md`"


def test_every_registered_method_declares_complete_options():
    for info in heedful.methods():
        assert next(iter(inspect.signature(info.fn).parameters)) == "problem"
        bound = info.bind()
        assert bound == info.defaults and list(bound) == [s.name for s in info.options]
        for spec in info.options:  # every default is accepted by its own declaration
            assert spec.check(info.name, spec.default) == spec.default, (info.name, spec.name)


def test_bind_completes_and_coerces():
    info = heedful.get_method("integrated_gradients")
    bound = info.bind({"n_steps": 7})
    assert bound["n_steps"] == 7 and bound["baseline"] == "pad" and bound["internal_batch_size"] is None
    assert "internal_batch_size" not in info.key_options(bound)
    assert heedful.get_method("coperturbation").bind({"lr": 1})["lr"] == 1.0  # ints widen to float
    assert isinstance(heedful.get_method("coperturbation").bind({"lr": 1})["lr"], float)


@pytest.mark.parametrize(
    ("method", "options", "words"),
    [
        ("integrated_gradients", {"n_steps": "abc"}, ["n_steps", "int >= 1"]),
        ("integrated_gradients", {"n_steps": 0}, ["n_steps", ">= 1"]),
        ("integrated_gradients", {"n_steps": True}, ["n_steps"]),
        ("integrated_gradients", {"baseline": "blank"}, ["baseline", "'pad'", "'mask'", "'unk'", "'zero'"]),
        ("integrated_gradients", {"steps": 5}, ["steps", "n_steps"]),
        ("rise", {"p_keep": 1.0}, ["p_keep", "(0, 1)"]),
        ("lime", {"kernel_width": float("nan")}, ["kernel_width"]),
        ("smoothgrad", {"seed": "x"}, ["seed"]),
    ],
)
def test_bad_options_name_the_option_and_what_it_accepts(method, options, words):
    with pytest.raises(heedful.InputError) as info:
        heedful.get_method(method).bind(options)
    text = str(info.value)
    assert all(w in text for w in words), text


def test_registration_reads_literal_annotated_and_runtime():
    def method(
        problem,
        *,
        k: Annotated[int, AT_LEAST_ONE] = 3,
        mode: Literal["a", "b"] | None = "a",
        chunk: Annotated[int | None, RUNTIME] = None,
    ) -> torch.Tensor:
        return problem

    specs = {s.name: s for s in option_specs(method)}
    assert specs["k"].range.low == 1 and specs["k"].kinds == (int,)
    assert specs["mode"].choices == ("a", "b", None)
    assert specs["chunk"].runtime and not specs["k"].runtime


def test_a_method_without_defaults_or_hints_is_refused():
    def no_default(problem, k: int) -> torch.Tensor:
        return problem

    def no_hint(problem, k=1) -> torch.Tensor:
        return problem

    def not_a_problem(adapter, batch) -> torch.Tensor:
        return adapter

    for fn, word in ((no_default, "default"), (no_hint, "type hint")):
        with pytest.raises(TypeError, match=word):
            option_specs(fn)
    with pytest.raises(TypeError, match="problem"):
        registry.register("_test_not_a_problem", family="baseline", cost="0", citation="-", summary="-")(not_a_problem)
    assert "_test_not_a_problem" not in registry.registered()


def test_explanation_options_are_complete(tiny):
    e = tiny("bert").explain("great acting", "integrated_gradients", n_steps=4)
    info = heedful.get_method("integrated_gradients")
    assert e.options == info.bind({"n_steps": 4})
    again = tiny("bert").explain("great acting", "integrated_gradients", **e.options)
    assert (again.scores == e.scores).all()


def test_compare_refuses_an_option_no_method_takes(tiny):
    model = tiny("bert")
    with pytest.raises(heedful.InputError) as info:
        model.compare("great acting", ["saliency", "normxlogit"], n_steps=3)
    assert "n_steps" in str(info.value)
    found = model.compare("great acting", ["saliency", "integrated_gradients"], n_steps=3)
    assert found[1].options["n_steps"] == 3 and "n_steps" not in found[0].options
