"""solvability_beam (Zhou & Shah 2023) against a brute-force search over every ordering of the
removable tokens and a greedy search written as a plain loop, on the raw transformers model."""

from __future__ import annotations

import itertools

import pytest
import torch
from conftest import cached_model
from test_oracles import Alone

import heedful
from heedful.attribution.solvability import beam_forwards

TEXTS = {"bert": ("a bad film", "so good"), "llama": ("good", "bad")}
"""Texts of at most 6 removable tokens on each tiny tokenizer (the brute force tries M! orderings)."""


class Curves:
    """The explained probability of one text with any set of its removable tokens removed (or all
    others removed), by hand: each of ``operators`` -- ``"auto"`` (``[MASK]`` for an encoder,
    deletion for a decoder), ``"unk"`` or ``"delete"`` -- its curves summed in the objective."""

    def __init__(self, one: Alone, operators: tuple[str, ...] = ("auto",)) -> None:
        self.one, self.operators = one, operators
        self.removable = [i for i in range(one.n) if not one.special[i]]
        self.cache: dict[tuple[frozenset[int], str], float] = {}
        self.full = self.prob(frozenset())

    def prob(self, removed: frozenset[int], operator: str = "auto") -> float:
        if operator == "auto":
            operator = "mask" if self.one.is_encoder else "delete"
        if (removed, operator) not in self.cache:
            ids = self.one.ids[0]
            if operator == "delete":
                kept = torch.tensor([t for i, t in enumerate(ids.tolist()) if i not in removed])
            else:
                kept = ids.clone()
                kept[sorted(removed)] = getattr(self.one.tok, f"{operator}_token_id")
            with torch.no_grad():
                logits = self.one.logits(self.one.hf(input_ids=kept[None]))
            self.cache[removed, operator] = float(torch.softmax(logits, -1)[self.one.label])
        return self.cache[removed, operator]

    def gain(self, prefix: tuple[int, ...], objective: str) -> float:
        """The objective's term for one prefix, summed over the operators: its removal's drop
        (comprehensiveness), minus the drop of keeping only it (sufficiency)."""
        value = 0.0
        for op in self.operators:
            if objective != "sufficiency":
                value += self.full - self.prob(frozenset(prefix), op)
            if objective != "comprehensiveness":
                value -= self.full - self.prob(frozenset(self.removable) - frozenset(prefix), op)
        return value

    def value(self, order: tuple[int, ...], objective: str) -> float:
        """The objective summed over the ordering's prefixes (AOPC x M), the last (whole-text) prefix
        left out as the search leaves it out: it is the same for every ordering."""
        return sum(self.gain(order[: k + 1], objective) for k in range(len(order) - 1))


def _orders(model, texts, **options) -> list[tuple[int, ...]]:
    """heedful's orderings: positions by descending score, the special tokens (score 0) left out."""
    found = model.explain(list(texts), "solvability_beam", output="probability", **options)
    return [tuple(sorted((i for i, s in enumerate(e.scores) if s > 0), key=lambda i: -e.scores[i])) for e in found]


@pytest.mark.parametrize("objective", ["comprehensiveness", "sufficiency", "both"])
@pytest.mark.parametrize(("family", "task"), [("bert", "classification"), ("llama", "classification")])
def test_solvability_beam_finds_the_brute_force_optimum_when_the_beam_holds_every_ordering(family, task, objective):
    model = cached_model(family, task)
    texts = TEXTS[family]
    curves = [Curves(Alone(model, t)) for t in texts]
    assert all(2 <= len(c.removable) <= 6 for c in curves), [len(c.removable) for c in curves]
    found = _orders(model, texts, beam=720, objective=objective)
    for c, order in zip(curves, found, strict=True):
        assert sorted(order) == c.removable, "every removable token is ranked, nothing else"
        best = max(c.value(p, objective) for p in itertools.permutations(c.removable))
        assert c.value(order, objective) >= best - 1e-5, (order, c.value(order, objective), best)


@pytest.mark.parametrize("objective", ["comprehensiveness", "both"])
@pytest.mark.parametrize(("family", "removal", "also"), [("bert", "mask", "delete"), ("bert", "unk", "delete"), ("llama", "pad", "delete")])
def test_a_second_operator_sums_both_curves_and_the_search_finds_their_brute_force_optimum(family, removal, also, objective):
    model = cached_model(family, "classification")
    texts = TEXTS[family]
    curves = [Curves(Alone(model, t), (removal, also)) for t in texts]
    found = _orders(model, texts, beam=720, objective=objective, removal=removal, also_removal=also)
    for c, order in zip(curves, found, strict=True):
        orders = list(itertools.permutations(c.removable))
        best = max(c.value(p, objective) for p in orders)
        assert c.value(order, objective) >= best - 1e-5, (order, c.value(order, objective), best)
        assert any(c.value(p, objective) < best - 1e-3 for p in orders), "the texts must tell orderings apart"


def test_a_second_operator_the_first_already_is_refused_in_one_line():
    model = cached_model("llama", "classification")
    with pytest.raises(heedful.InputError, match="also_removal='delete' replaces tokens as removal='auto'"):
        model.explain("good", "solvability_beam", also_removal="delete")
    e = model.explain("a bad film", "solvability_beam", beam=2, objective="both", removal="pad", also_removal="delete")
    m = len(Curves(Alone(model, "a bad film")).removable)
    assert e.cost.forward_passes == 1 + beam_forwards(2, m, "both", operators=2) == 1 + 2 * beam_forwards(2, m, "both")


@pytest.mark.parametrize(("family", "task"), [("bert", "classification"), ("llama", "classification")])
def test_solvability_beam_of_one_is_the_greedy_search(family, task):
    model = cached_model(family, task)
    texts = ("a charming , unbelievably affecting journey", "dull")
    found = _orders(model, texts, beam=1)
    for text, order in zip(texts, found, strict=True):
        c = Curves(Alone(model, text))
        greedy: list[int] = []
        while len(greedy) < len(c.removable) - 1:
            left = [i for i in c.removable if i not in greedy]
            greedy.append(max(left, key=lambda i: c.gain((*greedy, i), "comprehensiveness")))
        greedy += [i for i in c.removable if i not in greedy]
        assert list(order) == greedy


@pytest.mark.parametrize(("family", "task"), [("bert", "classification"), ("llama", "classification")])
def test_solvability_beam_with_a_shortlist_is_the_lazy_greedy_search(family, task):
    """Lazy greedy by hand: the first step measures every token; every later step re-measures
    only the two tokens left whose last measured gain is largest and takes the better of them."""
    model = cached_model(family, task)
    texts = ("a charming , unbelievably affecting journey", "the plot is thin but the cast is great fun")
    found = _orders(model, texts, beam=1, shortlist=2)
    for text, order in zip(texts, found, strict=True):
        c = Curves(Alone(model, text))
        greedy: list[int] = []
        last = {i: c.gain((i,), "comprehensiveness") for i in c.removable}
        greedy.append(max(c.removable, key=lambda i: last[i]))
        while len(greedy) < len(c.removable) - 1:
            left = [i for i in c.removable if i not in greedy]
            for i in sorted(left, key=lambda i: -last[i])[:2]:
                last[i] = c.gain((*greedy, i), "comprehensiveness")
            greedy.append(max(sorted(left, key=lambda i: -last[i])[:2], key=lambda i: last[i]))
        greedy += [i for i in c.removable if i not in greedy]
        assert len(c.removable) > 4 and list(order) == greedy


@pytest.mark.parametrize(("family", "task"), [("bert", "classification"), ("llama", "classification")])
def test_a_prior_ranking_shortlists_the_tokens_measured_before_then_its_own_order(family, task):
    """Lazy greedy from a prior ranking, by hand: no step measures every token; each step
    re-measures the two tokens left that were measured before and gained most, topped up by
    the tokens never measured in the prior method's order (AttnLRP's scores, highest first)."""
    model = cached_model(family, task)
    texts = ("a charming , unbelievably affecting journey", "the plot is thin but the cast is great fun")
    found = _orders(model, texts, beam=1, shortlist=2, prior="attnlrp")
    for text, order in zip(texts, found, strict=True):
        c = Curves(Alone(model, text))
        prior = model.explain(text, "attnlrp").scores
        by_prior = sorted(c.removable, key=lambda i: -prior[i])
        last: dict[int, float] = {}
        greedy: list[int] = []
        while len(greedy) < len(c.removable) - 1:
            left = [i for i in by_prior if i not in greedy]
            seen = sorted((i for i in left if i in last), key=lambda i: -last[i])
            listed = (seen + [i for i in left if i not in last])[:2]
            for i in listed:
                last[i] = c.gain((*greedy, i), "comprehensiveness")
            greedy.append(max(listed, key=lambda i: last[i]))
        greedy += [i for i in c.removable if i not in greedy]
        assert len(c.removable) > 4 and list(order) == greedy


@pytest.mark.parametrize(("family", "task"), [("bert", "classification"), ("llama", "classification")])
def test_a_refresh_measures_every_token_left_again_every_few_steps(family, task):
    """Lazy greedy with refreshes, by hand: steps 0, 2, 4, ... measure every token left; the
    steps between re-measure only the two whose last measured gain is largest."""
    model = cached_model(family, task)
    texts = ("a charming , unbelievably affecting journey", "the plot is thin but the cast is great fun")
    found = _orders(model, texts, beam=1, shortlist=2, refresh=2)
    for text, order in zip(texts, found, strict=True):
        c = Curves(Alone(model, text))
        last: dict[int, float] = {}
        greedy: list[int] = []
        while len(greedy) < len(c.removable) - 1:
            left = [i for i in c.removable if i not in greedy]
            listed = left if len(greedy) % 2 == 0 else sorted(left, key=lambda i: -last[i])[:2]
            for i in listed:
                last[i] = c.gain((*greedy, i), "comprehensiveness")
            greedy.append(max(listed, key=lambda i: last[i]))
        greedy += [i for i in c.removable if i not in greedy]
        assert len(c.removable) > 5 and list(order) == greedy


def test_a_prior_needs_a_shortlist_and_a_method_the_model_runs_each_refused_in_one_line():
    model = cached_model("bert", "classification")
    with pytest.raises(heedful.InputError, match="no shortlist is set"):
        model.explain("a bad film", "solvability_beam", prior="attnlrp")
    with pytest.raises(heedful.InputError, match="refresh=2 re-measures every token in a lazy search, and no shortlist is set"):
        model.explain("a bad film", "solvability_beam", refresh=2)
    with pytest.raises(heedful.InputError, match="prior='attnlrpp'") as refused:
        model.explain("a bad film", "solvability_beam", shortlist=2, prior="attnlrpp")
    assert "attnlrp" in str(refused.value.hint)
    with pytest.raises(heedful.InputError, match="run the search it orders"):
        model.explain("a bad film", "solvability_beam", shortlist=2, prior="solvability_beam")
    with pytest.raises(heedful.UnsupportedModelError, match="prior=alti_logit reads layer updates") as refused:
        model.explain("a bad film", "solvability_beam", shortlist=2, prior="alti_logit")  # post-LN blocks: no residual stream to read
    assert "decompx" in str(refused.value.hint)


def test_a_shortlist_as_long_as_the_text_is_the_full_search():
    model = cached_model("bert", "classification")
    texts = ["a charming , unbelievably affecting journey"]
    assert _orders(model, texts, beam=2, shortlist=64) == _orders(model, texts, beam=2)


def test_solvability_beam_reports_the_forwards_it_runs():
    model = cached_model("bert", "classification")
    e = model.explain("a bad film", "solvability_beam", beam=3, objective="both")
    m = len(Curves(Alone(model, "a bad film")).removable)
    assert e.cost.forward_passes == 1 + beam_forwards(3, m, "both")
    # M = 5, beam 3: steps try 5, 3 x 4, 3 x 3, 3 x 2 removals; twice for "both"
    assert beam_forwards(3, 5, "both") == 2 * (5 + 12 + 9 + 6)
    lazy = model.explain("a bad film", "solvability_beam", beam=2, shortlist=2)
    assert lazy.cost.forward_passes == 1 + beam_forwards(2, m, "comprehensiveness", 2)
    # M = 5, beam 2, shortlist 2: steps try 5, then 2 x 2 at each of the three steps with more than one token left
    assert beam_forwards(2, 5, "comprehensiveness", 2) == 5 + 4 + 4 + 4
    ordered = model.explain("a bad film", "solvability_beam", beam=2, shortlist=2, prior="attnlrp")
    assert ordered.cost.forward_passes == 1 + beam_forwards(2, m, "comprehensiveness", 2, prior=True) + 1  # + AttnLRP's forward
    assert ordered.cost.backward_passes == 1
    # M = 5, beam 2, shortlist 2, a prior: the first step tries the prior's 2, then 2 x 2 at each later step
    assert beam_forwards(2, 5, "comprehensiveness", 2, prior=True) == 2 + 4 + 4 + 4
    refreshed = model.explain("a bad film", "solvability_beam", beam=1, shortlist=2, refresh=2)
    assert refreshed.cost.forward_passes == 1 + beam_forwards(1, m, "comprehensiveness", 2, refresh=2)
    # M = 5, beam 1, shortlist 2, refresh 2: steps try 5, 2, then all 3 left, then 2
    assert beam_forwards(1, 5, "comprehensiveness", 2, refresh=2) == 5 + 2 + 3 + 2


def test_solvability_beam_refuses_a_beam_of_zero_in_one_line():
    with pytest.raises(heedful.InputError, match="beam=0"):
        cached_model("bert", "classification").explain("a bad film", "solvability_beam", beam=0)


def test_trailing_specials_are_ordered_with_the_words():
    model = cached_model("bert", "classification")
    for text in TEXTS["bert"]:
        c = Curves(Alone(model, text))
        c.removable = [i for i in range(1, c.one.n)]  # every token but [CLS]: the words and [SEP]
        (order,) = _orders(model, [text], beam=720, trailing_specials=True)
        assert sorted(order) == c.removable, "the words and [SEP] are ranked, [CLS] is not"
        best = max(c.value(p, "comprehensiveness") for p in itertools.permutations(c.removable))
        assert c.value(order, "comprehensiveness") >= best - 1e-5, (order, best)
    llama = cached_model("llama", "classification")  # no special token after the words: nothing changes
    assert _orders(llama, TEXTS["llama"], trailing_specials=True) == _orders(llama, TEXTS["llama"])
