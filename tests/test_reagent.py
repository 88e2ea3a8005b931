"""reagent (Zhao & Shan 2024) against a plain loop over the paper's update rule and stopping test,
run text by text on the raw transformers model with the same seeded draws."""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
import torch
from conftest import cached_model
from test_oracles import Alone, assert_matches

import heedful

TEXTS = ("a charming , unbelievably affecting journey", "the movie was dull")
MASKED = ("the plot is {mask} yet the actors are wonderful", "a {mask} film")


def _texts(model) -> list[str]:
    return [t.format(mask=model.tokenizer.mask_token) for t in MASKED] if model.task == "masked_lm" else list(TEXTS)


def _logit(p: float, eps: float = 1e-6) -> float:
    p = min(max(p, eps), 1 - eps)
    return math.log(p / (1 - p))


class Loop:
    """ReAGent for one text alone: every chain, step and token in plain Python."""

    def __init__(self, model, text: str, *, chains: int, ratio: float, keep: int, top_k: int, max_steps: int, replacement: str, seed: int):
        self.one = Alone(model, text)
        self.tok = model.tokenizer
        one = self.one
        removable = [i for i in range(one.n) if not one.special[i] and not (one.task == "masked_lm" and i == one.anchor)]
        self.removable = removable
        gen = torch.Generator()
        gen.manual_seed(seed * 1_000_003 + zlib.crc32(f"{text}\x00".encode()))
        m = len(removable)
        special = set(self.tok.all_special_ids)
        vocab = [i for i in range(len(self.tok)) if i not in special]
        with torch.no_grad():
            logits = one.logits(one.hf(input_ids=one.ids))
        p0 = float(torch.softmax(logits, -1)[one.label])
        k = max(1, min(top_k, logits.shape[-1] - 1))
        lm = self.lm_tokens() if replacement == "lm" else None
        s = torch.rand((chains, m), generator=gen, dtype=torch.float64).tolist()
        stopped = [False] * chains
        self.steps = 0
        for _ in range(max_steps):
            if all(stopped):
                break
            self.steps += 1
            chosen = (torch.rand((chains, m), generator=gen) < ratio).tolist()
            if lm is None:
                update = [[vocab[i] for i in row] for row in torch.randint(len(vocab), (chains, m), generator=gen).tolist()]
                test = [[vocab[i] for i in row] for row in torch.randint(len(vocab), (chains, m), generator=gen).tolist()]
            else:
                update = test = [lm] * chains
            for c in range(chains):
                if stopped[c]:
                    continue
                p, _ = self.run({removable[j]: update[c][j] for j in range(m) if chosen[c][j]}, k)
                delta = p0 - p
                for j in range(m):
                    d = delta if chosen[c][j] else -delta
                    s[c][j] += _logit(0.5 + 0.5 * d)
                scores = self.softmax(s[c])
                order = sorted(range(m), key=lambda j: (-scores[j], j))
                kept = set(order[:keep])
                _, hit = self.run({removable[j]: test[c][j] for j in range(m) if j not in kept}, k)
                stopped[c] = hit
        use = [c for c in range(chains) if stopped[c]] or list(range(chains))
        mean = [sum(self.softmax(s[c])[j] for c in use) / len(use) for j in range(m)]
        self.scores = np.zeros(one.n)
        for j, i in enumerate(removable):
            self.scores[i] = mean[j]
        self.stopped = sum(stopped)

    @staticmethod
    def softmax(row: list[float]) -> list[float]:
        top = max(row)
        e = [math.exp(v - top) for v in row]
        return [v / sum(e) for v in e]

    def run(self, replaced: dict[int, int], k: int) -> tuple[float, bool]:
        one = self.one
        ids = one.ids.clone()
        for i, t in replaced.items():
            ids[0, i] = t
        with torch.no_grad():
            logits = one.logits(one.hf(input_ids=ids))
        above = sum(1 for v in logits.tolist() if v > float(logits[one.label]))
        return float(torch.softmax(logits, -1)[one.label]), above < k

    def lm_tokens(self) -> list[int]:
        """Each removable token's replacement: the model's best other (non-special) token there,
        predicted from the tokens before it (causal LM; the first from the start token) or with
        it masked (masked LM)."""
        one, tok = self.one, self.tok
        ids = one.ids[0].tolist()
        special = set(tok.all_special_ids)

        def best(row: torch.Tensor, own: int) -> int:
            ranked = sorted(((float(v), t) for t, v in enumerate(row.tolist()) if t not in special and t != own), key=lambda x: (-x[0], x[1]))
            return ranked[0][1]

        found = []
        if one.task == "masked_lm":
            for i in self.removable:
                masked = [tok.mask_token_id if j == i else t for j, t in enumerate(ids)]
                with torch.no_grad():
                    found.append(best(one.hf(input_ids=torch.tensor([masked])).logits[0, i], ids[i]))
            return found
        lead = not one.special[0]
        start = next(t for t in (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) if t is not None)
        with torch.no_grad():
            logits = one.hf(input_ids=torch.tensor([[start, *ids] if lead else ids])).logits[0]
        return [best(logits[i if lead else i - 1], ids[i]) for i in self.removable]


CASES = [  # family, task, the option, what "auto" means there, keep (a stopping test some chains fail)
    ("llama", "causal_lm", "auto", "lm", 2),
    ("gpt2", "causal_lm", "uniform", "uniform", 2),
    ("bert", "masked_lm", "auto", "lm", 1),
    ("bert", "masked_lm", "uniform", "uniform", 1),
    ("bert", "classification", "auto", "uniform", 1),
]
ONE_STEP = {("bert", "masked_lm", "lm")}
"""Cases whose every chain stops after its first step on the tiny model (its own masked-LM
replacements never move the [MASK] prediction): the replacements, one update and the stopping
test are compared, the recursion by the other cases."""


@pytest.mark.parametrize(("family", "task", "replacement", "resolved", "keep"), CASES)
def test_reagent_equals_a_plain_loop_over_the_update_rule_and_stopping_test(family, task, replacement, resolved, keep):
    model = cached_model(family, task)
    options = dict(chains=3, ratio=0.3, keep=keep, top_k=3 if keep > 1 else 1, max_steps=12, replacement=replacement, seed=5)
    texts = _texts(model)
    found = model.explain(texts, "reagent", **options)
    loops = [Loop(model, t, **{**options, "replacement": resolved}) for t in texts]
    if (family, task, resolved) not in ONE_STEP:
        assert max(loop.steps for loop in loops) > 1, "every chain stopped at once: the recursion went untested"
    for e, loop in zip(found, loops, strict=True):
        assert e.details["steps"] == loop.steps and e.details["stopped"] == loop.stopped, (e.details, loop.steps, loop.stopped)
        assert_matches(e.scores, loop.scores, f"reagent {family}/{task} {e.text!r}", tol=1e-5)
        assert abs(e.scores.sum() - 1) < 1e-5


def test_reagent_reports_two_passes_per_live_chain_and_step():
    model = cached_model("llama", "causal_lm")
    e = model.explain("a charming , unbelievably affecting journey", "reagent", chains=2, max_steps=7, keep=1, top_k=1)
    steps = e.details["steps"]
    assert 1 <= steps <= 7
    # reference + the LM's replacement pass + 2 per chain per step at most (a stopped chain runs no more)
    assert 2 + 2 * e.details["stopped"] <= e.cost.forward_passes <= 2 + 2 * 2 * steps


def test_reagent_refuses_lm_replacement_without_an_lm_head_in_one_line():
    with pytest.raises(heedful.InputError, match="replacement='lm'"):
        cached_model("bert", "classification").explain("a bad film", "reagent", replacement="lm")
