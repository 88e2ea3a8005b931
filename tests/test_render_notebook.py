"""Notebooks and `heedful serve` show one HTML: an explanation's `_repr_html_` is the renderer's
fragment, and a list of explanations (several texts, or several methods on one text) renders
inline as exactly its explanations' fragments in order."""

from __future__ import annotations

import heedful
from heedful.render.html import explanation_fragment, explanations_fragment


def _joined(explanations) -> str:
    return '<div class="hf-many">' + "".join(e._repr_html_() for e in explanations) + "</div>"


def test_explanation_repr_html_is_the_fragment(tiny):
    expl = tiny("bert").explain("a charming and often affecting journey", "grad_x_input")
    assert expl._repr_html_() == explanation_fragment(expl)
    assert expl._repr_html_().count('class="hf-tok') == len(expl.tokens)


def test_several_texts_render_inline_as_their_fragments(tiny):
    many = tiny("bert").explain(["a charming journey", "the movie was dull"], "grad_x_input")
    assert isinstance(many, heedful.Explanations) and isinstance(many, list)
    assert many._repr_html_() == _joined(many) == explanations_fragment(many)
    assert many._repr_html_().count('class="hf-expl"') == 2


def test_several_methods_render_inline_as_their_fragments(tiny):
    model = tiny("bert")
    found = model.compare("the plot is predictable yet the actors are wonderful", ["grad_x_input", "leave_one_out"])
    assert isinstance(found, heedful.Explanations)
    html = found._repr_html_()
    assert html == _joined(found)
    assert html.index("<b>grad_x_input</b>") < html.index("<b>leave_one_out</b>")
    page = found.to_html()
    assert page.startswith("<!DOCTYPE html>") and page.count('class="hf-expl"') == 2


def test_user_text_is_escaped_in_the_list_view(tiny):
    many = tiny("bert").explain(["<b>dull</b> & long", "fine"], "grad_x_input")
    html = many._repr_html_()
    assert "<b>dull" not in html and "&lt;" in html and "&amp;" in html


def _selectors(html: str) -> list[str]:
    import re

    styles = "".join(re.findall(r"<style>(.*?)</style>", html, flags=re.S))
    return [sel.strip() for rule in re.findall(r"([^{}]+)\{", styles) for sel in rule.split(",")]


def test_notebook_fragments_style_only_their_own_elements(tiny):
    """A notebook cell's HTML must not restyle the notebook: no ``body { margin: 2rem }``."""
    expl = tiny("bert").explain("a charming journey", "grad_x_input")
    generation = tiny("gpt2", "causal_lm").explain_generation("the cat", "grad_x_input", max_new_tokens=2)
    for html in (expl._repr_html_(), heedful.Explanations([expl])._repr_html_(), generation._repr_html_()):
        selectors = _selectors(html)
        assert selectors and all(s.startswith((".hf-", "table.hf-")) for s in selectors), selectors
    assert "body" in _selectors(expl.to_html())[0]  # a page of its own still sets its margins
