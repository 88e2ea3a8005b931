"""Method versions are held to the methods' outputs: ``tests/data/method_outputs.json`` (written
by ``tests/regenerate_method_outputs.py``) must know every registered method at its current
version, and a method whose outputs moved must have had its version bumped -- stored results
are keyed by the version, so a silent change would serve stale results."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
from regenerate_method_outputs import PATH, differences, load

import heedful


@pytest.fixture(scope="module")
def golden():
    if not PATH.is_file():
        pytest.fail(f"{PATH} is missing; write it with python tests/regenerate_method_outputs.py")
    return load()


def test_every_method_matches_its_golden_outputs_at_its_version(golden):
    problems = differences(golden, {info.name: info for info in heedful.methods()})
    assert not problems, "\n".join(problems)


def test_a_bumped_version_without_regenerating_fails(golden):
    info = heedful.get_method("saliency")
    problems = differences({"saliency": golden["saliency"]}, {"saliency": replace(info, version=info.version + 1)})
    assert len(problems) == 1 and "regenerate the file" in problems[0]


def test_moved_outputs_at_the_same_version_fail(golden):
    moved = copy.deepcopy(golden["saliency"])
    moved["scores"]["bert"][0][1] += 1e-2 * max(abs(s) for s in moved["scores"]["bert"][0])
    problems = differences({"saliency": moved}, {"saliency": heedful.get_method("saliency")})
    assert len(problems) == 1 and "bump version= in its @register(...)" in problems[0]
    # within float tolerance is no change
    close = copy.deepcopy(golden["saliency"])
    close["scores"]["bert"][0][1] *= 1 + 1e-6
    assert differences({"saliency": close}, {"saliency": heedful.get_method("saliency")}) == []


def test_the_file_and_the_registry_list_the_same_methods(golden):
    names = {info.name: info for info in heedful.methods()}
    missing = {k: v for k, v in names.items() if k != "saliency"}
    problems = differences({"saliency": golden["saliency"]}, missing | {"saliency": names["saliency"]})
    assert len(problems) == len(missing) and all("not in method_outputs.json" in p for p in problems)


def test_mask_lrp_runs_with_an_explicit_head_mask(golden):
    for options in golden["mask_lrp"]["options"].values():
        assert isinstance(options["head_mask"], list)
