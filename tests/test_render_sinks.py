"""First-token sinks: the views leave the first token (and the special tokens) out of the colour
scale by default, so that a decoder's attention sink does not wash out every other colour; the
stored scores are unchanged."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import numpy as np
import pytest

from heedful.render.colors import NEGATIVE, POSITIVE, scaled_positions
from heedful.render.generation import generation_fragment
from heedful.render.html import explanation_page, heatmap_html, layer_grid_html
from heedful.render.terminal import heatmap_text

TEXT = "the plot is predictable yet the actors are wonderful"


@pytest.fixture(scope="module")
def sunk(tiny):
    """A GPT-2 explanation (no BOS: the first token is a word) whose first token holds 100 and
    the next one 1, the rest less."""
    expl = tiny("gpt2", "causal_lm").explain(TEXT, "saliency")
    assert not expl.special[0]
    scores = np.linspace(0.5, 0.1, len(expl.tokens))
    scores[0], scores[1] = 100.0, 1.0
    return replace(expl, scores=scores)


def _backgrounds(html: str) -> list[tuple[int, ...]]:
    return [tuple(map(int, m)) for m in re.findall(r"background:rgb\((\d+),(\d+),(\d+)\)", html)]


def test_the_first_token_is_left_out_of_the_scale(sunk):
    shown = _backgrounds(heatmap_html(sunk))
    assert shown[0] == POSITIVE and shown[1] == POSITIVE  # the sink at full strength, the next one sets the scale
    plain = _backgrounds(heatmap_html(sunk, sinks=False))
    assert plain[0] == POSITIVE and plain[1] != POSITIVE and min(plain[1]) > 240  # washed out next to 100
    assert sunk.scores[0] == 100.0  # the stored scores are unchanged


def test_every_view_takes_the_option(sunk):
    colours = [tuple(span.style.bgcolor.triplet) for span in heatmap_text(sunk).spans]
    assert colours[1] == POSITIVE
    assert tuple(heatmap_text(sunk, sinks=False).spans[1].style.bgcolor.triplet) != POSITIVE
    page = explanation_page([sunk])
    assert "first token" in page and _backgrounds(page)[1] == POSITIVE
    layered = replace(sunk, scores=np.stack([sunk.scores, sunk.scores]))
    assert _backgrounds(layer_grid_html(layered))[1] == POSITIVE
    assert _backgrounds(layer_grid_html(layered, sinks=False))[1] != POSITIVE


def test_specials_and_a_lone_first_token():
    assert scaled_positions([True, False, False, True]) == [False, True, True, False]  # a BOS is the sink
    assert scaled_positions([False, False, False, True]) == [False, True, True, False]
    assert scaled_positions([True, False, False, True], sinks=False) == [False, True, True, False]
    assert scaled_positions([False, True]) == [True, False]  # nothing else to scale by
    assert scaled_positions([False]) == [True]


def test_a_generation_scales_each_step_without_the_first_token(tiny):
    """Each step's colours (in the page's data) leave a huge first-token score out of the scale:
    the first token is painted at full strength and the strongest of the others too; with
    ``sinks=False`` the first token alone is, every other one nearly white."""
    lm = tiny("gpt2", "causal_lm")
    found = lm.explain_generation("the plot is", "saliency", max_new_tokens=2)
    scores = np.array(found.scores, dtype=float)
    scores[:, 0] = 1e3
    sunk = replace(found, scores=scores)
    full = "rgb({},{},{})".format(*POSITIVE)

    def colours(fragment: str) -> list[list]:
        block = re.search(r'<script type="application/json">(.*?)</script>', fragment).group(1)
        return json.loads(block)["colors"]

    for t, row in enumerate(colours(generation_fragment(sunk))):
        assert row[0][0] == full
        strongest = 1 + int(np.nanargmax(np.abs(scores[t, 1:])))
        assert row[strongest][0] in (full, "rgb({},{},{})".format(*NEGATIVE))
    for row in colours(generation_fragment(sunk, sinks=False)):
        assert row[0][0] == full
        assert all(cell is None or cell[0] != full for cell in row[1:])
