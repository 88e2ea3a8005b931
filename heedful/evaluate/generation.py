"""Faithfulness of generation explanations: does removing the prompt tokens an explanation
ranks highest change how likely the model finds what it wrote?

For a prompt ``x`` and its continuation ``y`` (generated or forced), an explanation ranks the
prompt's tokens by their attribution to the whole continuation (its scores summed over the
steps, :meth:`~heedful.GenerationExplanation.sequence_scores`). At each ratio ``r`` the top
``k = max(1, round(r * n))`` of the ``n`` non-special prompt tokens form the rationale ``x_r``
(at most ``n - 1`` when no special token stays, so that a prompt is never empty);
with the continuation teacher-forced after the edited prompt (removed tokens deleted, as for
any causal language model; an encoder–decoder's prompt is its source side and decoder-start
token, a special token, so the tokens removed are source tokens and its target side stays whole):

* comprehensiveness ``log p(y | x) - log p(y | x \\ x_r)`` (ERASER, DeYoung et al. 2020, in
  log-probabilities of the whole continuation as ContextCite's top-k drop);
* sufficiency ``log p(y | x) - log p(y | x_r)``;

and their AOPC, the mean over ratios (ERASER's bins 1, 5, 10, 20, 50 % by default). A
faithful explanation has a high comprehensiveness and a low sufficiency.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from heedful.adapters import ModelAdapter
from heedful.engine.chunks import length_chunks
from heedful.engine.memory import Fit, Need
from heedful.engine.targets import ResolvedTarget
from heedful.errors import InputError
from heedful.evaluate.intervals import bootstrap_mean
from heedful.generation_explanation import GenerationExplanation

RATIOS = (0.01, 0.05, 0.1, 0.2, 0.5)
"""ERASER's AOPC bins."""


@dataclass
class GenerationFaithfulness:
    """Per explanation ``[G]`` and ratio ``[R]``: ``comprehensiveness`` and ``sufficiency``
    (``[G, R]``, in nats of the continuation's log-probability), ``sizes`` (``[G, R]`` tokens
    in each rationale) and ``original`` (``[G]``, ``log p(y | x)``)."""

    ratios: tuple[float, ...]
    comprehensiveness: np.ndarray
    sufficiency: np.ndarray
    sizes: np.ndarray
    original: np.ndarray

    @property
    def aopc_comprehensiveness(self) -> np.ndarray:
        """``[G]``: comprehensiveness averaged over the ratios."""
        return self.comprehensiveness.mean(axis=1)

    @property
    def aopc_sufficiency(self) -> np.ndarray:
        """``[G]``: sufficiency averaged over the ratios."""
        return self.sufficiency.mean(axis=1)

    def summary(self, n_boot: int = 1000, seed: int = 0) -> dict[str, tuple[float, float, float]]:
        """Mean AOPC comprehensiveness and sufficiency over the explanations, each with a 95 %
        percentile bootstrap interval over explanations: ``{name: (mean, low, high)}``."""
        return {
            "comprehensiveness": bootstrap_mean(self.aopc_comprehensiveness, n_boot, seed),
            "sufficiency": bootstrap_mean(self.aopc_sufficiency, n_boot, seed),
        }


def generation_faithfulness(
    adapter: ModelAdapter,
    explanations: Sequence[GenerationExplanation],
    ratios: Sequence[float] = RATIOS,
) -> GenerationFaithfulness:
    """Comprehensiveness and sufficiency of every explanation at every ratio (see the module
    docstring); all edited prompts run batched, chunked by length."""
    if not explanations:
        raise InputError("no generation explanations to evaluate")
    if any(not 0 < r <= 1 for r in ratios):
        raise InputError(f"ratios must be in (0, 1], got {list(ratios)}")
    tokenizer = adapter.tokenizer
    rows: list[list[int]] = []
    lengths: list[int] = []  # prompt tokens left in each row
    owners: list[tuple[int, list[int]]] = []  # (explanation, its continuation ids)
    sides: list[int | None] = []  # an encoder–decoder row's source tokens (None: one side)
    sizes = np.zeros((len(explanations), len(ratios)), dtype=int)
    for g, expl in enumerate(explanations):
        ids = tokenizer.convert_tokens_to_ids(expl.raw_tokens)
        prompt, continuation = ids[: expl.prompt_length], ids[expl.prompt_length : expl.prompt_length + expl.steps]
        eligible = [j for j in range(expl.prompt_length) if not expl.special[j]]
        keeps_one = len(eligible) < expl.prompt_length  # a special token (BOS) stays in every edited prompt
        if len(eligible) < (1 if keeps_one else 2):
            raise InputError(f"explanation {g}'s prompt is too short to remove tokens from", hint="use longer prompts")
        scores = expl.sequence_scores()[: expl.prompt_length]
        order = sorted(eligible, key=lambda j: (-scores[j], j))
        variants = [prompt]
        for r, ratio in enumerate(ratios):
            k = min(len(order) - (0 if keeps_one else 1), max(1, round(ratio * len(order))))
            sizes[g, r] = k
            top = set(order[:k])
            variants.append([t for j, t in enumerate(prompt) if j not in top])  # comprehensiveness
            variants.append([t for j, t in enumerate(prompt) if j in top or expl.special[j]])  # sufficiency
        kept = None if expl.source_length is None else expl.prompt_length - expl.source_length  # all special
        for variant in variants:
            rows.append(variant + continuation)
            lengths.append(len(variant))
            owners.append((g, continuation))
            sides.append(None if kept is None else len(variant) - kept)
    log_p = _continuation_log_probs(adapter, rows, lengths, owners, sides)
    per = log_p.reshape(len(explanations), 1 + 2 * len(ratios))
    original = per[:, 0]
    comprehensiveness = original[:, None] - per[:, 1::2]
    sufficiency = original[:, None] - per[:, 2::2]
    return GenerationFaithfulness(tuple(ratios), comprehensiveness, sufficiency, sizes, original)


@torch.no_grad()
def _continuation_log_probs(
    adapter: ModelAdapter,
    rows: list[list[int]],
    prompt_lengths: list[int],
    owners: list[tuple[int, list[int]]],
    sides: list[int | None] | None = None,
) -> np.ndarray:
    """``log p(continuation | prompt)`` of every row ``[R]``: rows of equal continuation length
    run together, in chunks of similar length under the memory budget (:mod:`heedful.engine.memory`),
    each a span target read at its positions. ``sides[r]``: row ``r``'s source tokens, its first
    ones (an encoder–decoder's; ``None``: the row is one side)."""
    found = np.zeros(len(rows))
    pad = adapter.pad_token_id if adapter.pad_token_id is not None else 0
    by_steps: dict[int, list[int]] = {}
    for i, (_, continuation) in enumerate(owners):
        by_steps.setdefault(len(continuation), []).append(i)
    for steps, members in by_steps.items():
        total = torch.tensor([len(rows[i]) for i in members])
        need = Need(anchors=steps)
        fits: dict[int, Fit] = {}

        def max_rows(width: int, need: Need = need, fits: dict[int, Fit] = fits) -> int:
            fits[width] = adapter.fit(width, need)
            return fits[width].rows

        for part, width in length_chunks(total, max_rows=max_rows):
            picked = [members[i] for i in part.tolist()]
            ids = torch.full((len(picked), width), pad, dtype=torch.long)
            mask = torch.zeros(len(picked), width, dtype=torch.long)
            for r, i in enumerate(picked):
                ids[r, : len(rows[i])] = torch.tensor(rows[i])
                mask[r, : len(rows[i])] = 1
            start = torch.tensor([prompt_lengths[i] - 1 for i in picked])
            positions = start[:, None] + torch.arange(steps)[None, :]
            classes = torch.tensor([owners[i][1] for i in picked], dtype=torch.long)
            target = ResolvedTarget(
                positions[:, -1], "fixed", classes, torch.ones(steps), [""] * len(picked), adapter.task,
                quantity="log_prob", positions=positions,
            )
            types = None
            if sides is not None and sides[picked[0]] is not None:
                cut = torch.tensor([sides[i] for i in picked])
                types = ((torch.arange(width)[None, :] >= cut[:, None]) & mask.bool()).long().to(adapter.device)
            ids, mask = ids.to(adapter.device), mask.to(adapter.device)
            logits = adapter.forward(
                _Plain(ids, mask, types), positions, input_ids=ids, attention_mask=mask, token_type_ids=types,
                prefill=fits[width].need.queries,
            ).logits
            found[picked] = target.score(logits).double().cpu().numpy()
    return found


@dataclass
class _Plain:
    """The two fields :meth:`~heedful.adapters.ModelAdapter.forward` reads from a batch of ids
    (no tokens, offsets or segments: rows built from ids)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    token_type_ids: torch.Tensor | None = None


@dataclass
class MethodFaithfulness:
    """One method's generation explanations and their faithfulness; ``seconds``: explaining
    every step of every prompt."""

    method: str
    explanations: list[GenerationExplanation]
    faithfulness: GenerationFaithfulness
    seconds: float


def bench_generation(
    model,
    prompts: Sequence,
    methods: Sequence[str],
    method_options: dict[str, dict] | None = None,
    *,
    max_new_tokens: int = 20,
    ratios: Sequence[float] = RATIOS,
) -> list[MethodFaithfulness]:
    """Explain what ``model`` writes after every prompt (:class:`~heedful.datasets.prompts.Prompt`:
    its continuation forced when given, else generated once, greedily) with every method, and
    measure each method's comprehensiveness and sufficiency on the same continuations."""
    import time

    forced = [p for p in prompts if p.continuation is not None]
    free = [p for p in prompts if p.continuation is None]
    generations = []
    if free:
        generations.append(model.generate([p.prompt for p in free], max_new_tokens))
    if forced:
        generations.append(model.generate([p.prompt for p in forced], continuation=[p.continuation for p in forced]))
    found = []
    for method in methods:
        began = time.perf_counter()
        explanations = [
            e for generation in generations
            for e in model.explain_generation(generation, method, **(method_options or {}).get(method, {}))
        ]
        seconds = time.perf_counter() - began
        found.append(MethodFaithfulness(method, explanations, generation_faithfulness(model.adapter, explanations, ratios), seconds))
    return found


def generation_report(results: Sequence[MethodFaithfulness], model_name: str, n_boot: int = 1000) -> str:
    """A Markdown table of every method's AOPC comprehensiveness and sufficiency with 95 %
    bootstrap intervals over prompts, and which methods' intervals overlap."""
    if not results:
        raise InputError("no methods were benchmarked")
    first = results[0]
    steps = sum(e.steps for e in first.explanations)
    lines = [
        f"# Generation faithfulness: {model_name}",
        "",
        f"{len(first.explanations)} prompts, {steps} explained steps; ratios "
        f"{', '.join(f'{r:g}' for r in first.faithfulness.ratios)} of each prompt's tokens; log-probability of the "
        "whole continuation, teacher-forced. Comprehensiveness: higher is better; sufficiency: lower is better.",
        "",
        "| method | AOPC comprehensiveness [95% CI] | AOPC sufficiency [95% CI] | seconds per step |",
        "|---|---|---|---:|",
    ]
    summaries = {r.method: r.faithfulness.summary(n_boot) for r in results}
    for r in results:
        comp, suff = summaries[r.method]["comprehensiveness"], summaries[r.method]["sufficiency"]
        lines.append(
            f"| {r.method} | {comp[0]:.3f} [{comp[1]:.3f}, {comp[2]:.3f}] | {suff[0]:.3f} [{suff[1]:.3f}, {suff[2]:.3f}] "
            f"| {r.seconds / max(sum(e.steps for e in r.explanations), 1):.4f} |"
        )
    for metric in ("comprehensiveness", "sufficiency"):
        overlapping = [
            f"{a} / {b}"
            for i, a in enumerate(summaries)
            for b in list(summaries)[i + 1 :]
            if summaries[a][metric][1] <= summaries[b][metric][2] and summaries[b][metric][1] <= summaries[a][metric][2]
        ]
        lines += ["", f"{metric.capitalize()} intervals that overlap (no difference claimed): {', '.join(overlapping) or 'none'}."]
    return "\n".join(lines) + "\n"


def generation_rows(results: Sequence[MethodFaithfulness]) -> list[dict]:
    """One row per (method, prompt, ratio): the values behind :func:`generation_report`."""
    rows = []
    for r in results:
        f = r.faithfulness
        for g, expl in enumerate(r.explanations):
            for k, ratio in enumerate(f.ratios):
                rows.append({
                    "method": r.method, "prompt": expl.prompt, "continuation": expl.continuation, "ratio": ratio,
                    "size": int(f.sizes[g, k]), "log_p": float(f.original[g]),
                    "comprehensiveness": float(f.comprehensiveness[g, k]), "sufficiency": float(f.sufficiency[g, k]),
                })
    return rows
