"""Method versions are held to the methods' outputs: ``tests/data/method_outputs.json`` (written
by ``tests/regenerate_method_outputs.py``) must know every registered method at its current
version, and a method whose outputs moved must have had its version bumped -- stored results
are keyed by the version, so a silent change would serve stale results."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
from regenerate_method_outputs import (
    FLOOR,
    LAYOUTS,
    PATH,
    SAFETY,
    TEST_LAYOUTS,
    differences,
    load,
    load_bounds,
)

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


def test_the_file_records_a_measured_bound_for_every_family(golden):
    bounds = load_bounds()
    assert set(bounds) == {info.family for info in heedful.methods()}
    for name, entry in golden.items():
        worst = max(entry["float32_error"].values(), default=0.0)
        assert bounds[entry["family"]] >= max(FLOOR, SAFETY * worst), name
    # every bound still catches a change of 1 % of the largest score (what a changed rule moves)
    assert max(bounds.values()) < 1e-2
    assert len(TEST_LAYOUTS) >= 3 and {LAYOUTS[layout][0] for layout in TEST_LAYOUTS} == {1, 2}


def test_another_processors_rounding_is_no_change(golden):
    """An AVX-512 processor's ``lrp`` scores differed from an AMD EPYC's by 2.6e-05 of the largest
    score, on an element far smaller than the largest (the z-rule's divisions of nearly cancelling
    sums amplify float32 rounding about 400 times); that is rounding, not a new version."""
    info = heedful.get_method("lrp")
    nearby = copy.deepcopy(golden["lrp"])
    row = nearby["scores"]["bert"][0]
    smallest = min(range(len(row)), key=lambda k: abs(row[k]))
    row[smallest] += 2.62e-05 * max(abs(s) for s in row)
    assert differences({"lrp": nearby}, {"lrp": info}) == []
    beyond = copy.deepcopy(golden["lrp"])
    beyond["scores"]["bert"][0][smallest] += 2 * load_bounds()["relevance"] * max(abs(s) for s in row)
    assert len(differences({"lrp": beyond}, {"lrp": info})) == 1


def test_the_file_and_the_registry_list_the_same_methods(golden):
    names = {info.name: info for info in heedful.methods()}
    missing = {k: v for k, v in names.items() if k != "saliency"}
    problems = differences({"saliency": golden["saliency"]}, missing | {"saliency": names["saliency"]})
    assert len(problems) == len(missing) and all("not in method_outputs.json" in p for p in problems)


def test_mask_lrp_runs_with_an_explicit_head_mask(golden):
    for options in golden["mask_lrp"]["options"].values():
        assert isinstance(options["head_mask"], list)
