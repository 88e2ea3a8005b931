"""Co-perturbation report, what Figure 3 shows: plausibility of every method's scores against
the words a person expects (the VADER lexicon's sentiment words, through the bench's plausibility
metrics), and where each method puts its weight -- on function words (spaCy's part-of-speech
tags) and by position in the sentence (first, middle, last third).

The paper compares the methods of its Figure 3 by heatmaps only. Its LRP baseline is Ali et al.
2022 ("XAI for Transformers: Better Explanations through Conservative Propagation": relevance
conserved through attention and LayerNorm by treating their normalisations as constants, then
gradient x input); heedful has no method of exactly those rules, and its nearest is ``attnlrp``
(Achtibat et al. 2024: the same treatment of LayerNorm's division, and conservative rules through
the attention products where Ali et al. hold the attention weights constant). Bach-style
``lrp`` (alpha1-beta0 and z-rules, Chefer et al.'s baseline) is not the paper's LRP.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from heedful.reproduce.coperturbation.statistics import _ahead, _bench_ids, _summary_row
from heedful.reproduce.toolkit import (
    HOLDS,
    Verdict,
    all_of,
    interval_text,
    mean_interval,
    paired_verdict,
    untestable,
)

PAPER_LRP = "attnlrp"
"""The registered method nearest to the paper's LRP baseline (Ali et al. 2022; see the module docstring)."""
PAPER_FIGURE3 = ("lime", "kernel_shap", "rise", PAPER_LRP, "tdd", "individual_perturbation")
"""The paper's Figure 3 baselines as heedful runs them (SHAP as Kernel SHAP, LRP as AttnLRP)."""
PAPER_NAMES = {
    "coperturbation": "co-perturbation", "lime": "LIME", "kernel_shap": "SHAP", "rise": "RISE",
    PAPER_LRP: "LRP (Ali et al. 2022; the nearest registered method: AttnLRP's rules)", "tdd": "TDD",
    "individual_perturbation": "individual perturbation",
    "lrp": "– (Bach-style LRP, alpha1-beta0 / z-rules: not the paper's LRP)",
}
"""Each method's name in the paper's Figure 3 (``–``: not in it; a control of this report)."""
PLAUSIBILITY = ("average_precision", "dot_product")
"""The bench's plausibility metrics the report reads: the ranking's average precision against the
evidence words, and (protocol ``dot_normalization="l1"``) the share of ``|score|`` mass on them."""
FUNCTION_POS = ("DET", "ADP", "PRON", "CCONJ", "SCONJ", "AUX", "PART")
"""Closed-class universal parts of speech: the function words."""
TOP_SHARE = 0.2
"""The top share of a sentence's content tokens (by ``|score|``, at least one) whose mass is read."""
THIRDS = ("first", "middle", "last")


def paper_name(method: str) -> str:
    """The method's name in the paper's Figure 3, or ``–`` for this report's controls."""
    return PAPER_NAMES.get(method, "–")


# ----------------------------------------------------------------------------- plausibility
def plausibility(bench_of, methods: list[str], n: int, options: dict) -> dict[str, Any]:
    """The bench's plausibility metrics of ``methods`` on the first ``n`` test sentences, whose
    lexicon-derived evidence (:mod:`heedful.datasets.evidence`) the movie snippets carry:
    ``"signed"`` -- average precision of the scores' ranking and the dot product of their softmax
    (the default protocol); ``"magnitude"`` -- the share of ``|score|`` mass on the evidence (dot
    product after ``l1``). ``bench_of(methods, n, options, metrics, protocol)`` runs a bench on the
    report's store: the explanations are the faithfulness bench's, nothing is explained again."""
    from heedful.evaluate import get_protocol

    base = get_protocol("default", random_seeds=3)
    return {
        "signed": bench_of(methods, n, options, list(PLAUSIBILITY), base),
        "magnitude": bench_of(methods, n, options, ["dot_product"], base.with_(dot_normalization="l1")),
    }


def _readings(found: Any) -> list[tuple[str, Any, str]]:
    """(what, bench, metric) of the plausibility readings that ran."""
    p = found.plausibility or {}
    rows = []
    if "signed" in p:
        rows.append(("average precision of the ranking", p["signed"], "average_precision"))
    if "magnitude" in p:
        rows.append(("share of the absolute score mass on the evidence", p["magnitude"], "dot_product"))
    return rows


def plausibility_claims(found: Any) -> list[tuple[str, str, str]]:
    """The Figure 3 claim read as plausibility: co-perturbation against each of the paper's
    baselines, paired over the sentences, per reading."""
    readings = _readings(found)
    claim = ("Co-perturbation's interest falls on the words a person expects more than LIME's, SHAP's, RISE's, LRP's, "
             "TDD's and individual perturbation's (5.2, Figure 3; tested against the VADER lexicon's sentiment words, {what})")
    if not readings:
        return [(claim.format(what="plausibility"), str(untestable("the plausibility benches did not run")), "–")]
    rows = []
    for what, bench, metric in readings:
        others = [g for g in PAPER_FIGURE3 if g in bench.groups]
        if "coperturbation" not in bench.groups or not others:
            rows.append((claim.format(what=what), str(untestable("co-perturbation or the paper's baselines did not run")), "–"))
            continue
        versus = {g: _ahead(bench, "coperturbation", g, metric) for g in others}
        said = {word: [g for g, (v, _) in versus.items() if v.word == word] for word in (HOLDS, "does not hold")}
        cp = _summary_row(bench.groups["coperturbation"], metric)
        rows.append((
            claim.format(what=what),
            str(all_of(v for v, _ in versus.values())),
            f"co-perturbation {interval_text(*cp)}; ahead with paired intervals apart of: {', '.join(said[HOLDS]) or 'none'}; "
            f"behind, apart: {', '.join(said['does not hold']) or 'none'}; " + "; ".join(
                f"{g} {interval_text(*d, sign=True)}" for g, (_, d) in versus.items() if math.isfinite(d[1]))
            + f" (co-perturbation − method, paired; n = {_with_evidence(bench, metric)} sentences with evidence)",
        ))
    return rows


def _with_evidence(bench: Any, metric: str) -> int:
    return int(bench.groups["coperturbation"].summaries[metric].n)


# ----------------------------------------------------------------------------- function words and positions
def token_classes(explanation: Any, words: list[tuple[int, int, str]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The content tokens of ``explanation`` (not special, in the text): their positions ``[M]``,
    whether each lies in a function word (a word of ``words`` -- ``(start, end, pos)`` from
    spaCy -- with a :data:`FUNCTION_POS` tag, found by the token's first character) ``[M]``, and
    the third of the sentence each falls in (0, 1, 2 by relative position ``i / (M - 1)``) ``[M]``."""
    keep = [i for i, (sp, off) in enumerate(zip(explanation.special, explanation.offsets, strict=True))
            if not sp and off is not None and off[1] > off[0]]
    starts = np.array([w[0] for w in words])
    ends = np.array([w[1] for w in words])
    function = np.zeros(len(keep), dtype=bool)
    for j, i in enumerate(keep):
        inside = np.flatnonzero((starts <= explanation.offsets[i][0]) & (explanation.offsets[i][0] < ends))
        function[j] = bool(inside.size) and words[inside[0]][2] in FUNCTION_POS
    m = len(keep)
    relative = np.arange(m) / max(m - 1, 1)
    third = np.minimum((relative * 3).astype(int), 2)
    return np.array(keep, dtype=int), function, third


def focus_of(scores: np.ndarray, function: np.ndarray, third: np.ndarray, share: float = TOP_SHARE) -> np.ndarray:
    """Where the top ``share`` of content tokens by ``|score|`` (``scores`` ``[M]``, at least one
    token) put their mass: ``[4]`` -- the share on function words, then on the first, middle and
    last third of the sentence; NaN when that mass is 0 or the sentence has fewer than 3 tokens."""
    m = scores.shape[0]
    if m < 3:
        return np.full(4, np.nan)
    mass = np.abs(scores)
    top = np.argsort(-mass, kind="stable")[: max(1, math.ceil(share * m))]
    total = mass[top].sum()
    if not total > 0:
        return np.full(4, np.nan)
    parts = [mass[top][function[top]].sum()] + [mass[top][third[top] == k].sum() for k in range(3)]
    return np.array(parts) / total


def focus(bench: Any, store: Path, model: Any, tagger=None) -> dict[str, Any]:
    """Per method of the faithfulness ``bench``: :func:`focus_of` of every sentence (``[n, 4]``; a
    seeded method: the mean over its seeds), read from the stored explanations; and the share of
    content tokens in function words (``base``, ``[n]``). ``tagger(texts) -> [(start, end, pos)]``
    per text (default: spaCy's ``en_core_web_sm``, :func:`heedful.lrp.heads.load_parser`)."""
    from heedful.evaluate.store import ResultsStore

    ids, texts = _bench_ids(model, bench)
    words = dict(zip(ids, (tagger or spacy_words)(texts), strict=True))
    per: dict[str, list[np.ndarray]] = {}
    base: dict[str, float] = {}
    with ResultsStore(store) as db:
        for run_ in bench.runs:
            stored = db.get_explanations(run_.key, ids)
            values = np.full((len(ids), 4), np.nan)
            for k, i in enumerate(ids):
                if i not in stored:
                    continue
                e = stored[i]
                keep, function, third = token_classes(e, words[i])
                scores = np.asarray(e.scores, dtype=float)
                values[k] = focus_of((scores[-1] if scores.ndim == 2 else scores)[keep], function, third)
                base.setdefault(i, float(function.mean()) if function.size else math.nan)
            per.setdefault(run_.group, []).append(values)
    with np.errstate(all="ignore"):
        shares = {g: np.nanmean(np.stack(v), axis=0) for g, v in per.items()}
    return {"shares": shares, "base": np.array([base.get(i, math.nan) for i in ids]), "n": len(ids)}


def spacy_words(texts: list[str]) -> list[list[tuple[int, int, str]]]:
    """``(start, end, universal part of speech)`` of every non-space word of each text, from spaCy's
    ``en_core_web_sm`` (the pinned pipeline heedful fetches for Mask-LRP)."""
    from heedful.lrp.heads import load_parser
    from heedful.progress import task

    nlp = load_parser()
    found = []
    with task("tagging parts of speech", len(texts)) as progress:
        for doc in nlp.pipe(list(texts), batch_size=64):
            found.append([(t.idx, t.idx + len(t.text), t.pos_) for t in doc if not t.is_space])
            progress.advance()
    return found


def _versus_random(found: Any, method: str, column) -> tuple[Verdict, tuple[float, float, float], tuple]:
    """``method``'s focus column (an index of :func:`focus_of`'s result, or a list summed) against
    random scores', paired over the sentences: verdict, difference, ``method``'s mean interval."""
    shares = found.focus["shares"]
    if method not in shares or "random" not in shares:
        return untestable(f"no {'random-scores' if method in shares else method} row in this run"), (math.nan,) * 3, (math.nan,) * 4
    cols = column if isinstance(column, list) else [column]
    a, b = shares[method][:, cols].sum(axis=1), shares["random"][:, cols].sum(axis=1)
    verdict, difference = paired_verdict(a, b)
    return verdict, difference, mean_interval(a)


def focus_claims(found: Any) -> list[tuple[str, str, str]]:
    """"SHAP focuses on function words; RISE on the middle or both ends", each part against random
    scores (where a ranking blind to the words puts its weight), paired over the sentences."""
    if not found.focus:
        why = "the focus reading (spaCy's part-of-speech tags of the bench's sentences) did not run"
        return [("SHAP focuses on function words; RISE on the middle or both ends of the input (5.2)", str(untestable(why)), "–")]
    top = f"top {100 * TOP_SHARE:.0f} % of content tokens by absolute score"
    rows = []
    parts = (
        ("SHAP focuses on function words (5.2; tested: share of the {top} mass on closed-class words ({pos}) above random "
         "scores', paired)", "kernel_shap", 0),
        ("RISE focuses on the middle of the input (5.2; tested: share of the {top} mass in the middle third above random "
         "scores', paired)", "rise", 2),
        ("... or on both ends of the input (5.2; tested: share in the first and last thirds above random scores', paired; "
         "the complement of the middle: one of the two holds exactly when RISE's positions differ from random's)",
         "rise", [1, 3]),
    )
    for claim, method, column in parts:
        verdict, d, mine = _versus_random(found, method, column)
        number = "–" if not math.isfinite(mine[0]) else (
            f"{method} {interval_text(*mine[:3])}; − random, paired {interval_text(*d, sign=True)} (n = {mine[3]} sentences)")
        rows.append((claim.format(top=top, pos=", ".join(FUNCTION_POS)), str(verdict), number))
    return rows


def focus_section(found: Any) -> list[str]:
    """Markdown: plausibility of every method against the lexicon evidence, and where each puts its
    top mass (function words, thirds of the sentence), beside random scores."""
    lines = []
    readings = _readings(found)
    if readings:
        bench = readings[0][1]
        lines += [
            "## 4b. Plausibility against the words a person expects (Figure 3)",
            "",
            "The paper reads Figure 3 as heatmaps against the words a reader expects. Here the expected words are the "
            "movie snippets' lexicon-derived evidence: words whose mean human valence in the VADER lexicon (Hutto & "
            "Gilbert 2014) has magnitude >= 1.5 (`good`, `dull`, `charming`; evidence *about the words*, not a human "
            "judgement of this sentence). Scores are read as the bench's plausibility metrics on the same "
            f"{bench.n_examples} sentences and stored explanations as section 4 (sentences without evidence left out): "
            "the average precision of each method's ranking (scores as the method gives them: a signed method ranks "
            "words against the prediction last), and the share of its absolute score mass on the evidence. [low, high]: 95 % "
            "bootstrap interval over sentences; the paired column is co-perturbation minus the method, bootstrapped "
            "over the same sentences.",
            "",
            "| method | in the paper's Figure 3 | " + " | ".join(
                f"{what} ↑ | co-perturbation − method" for what, _, _ in readings) + " |",
            "|---|---|" + "---|---|" * len(readings),
        ]
        for g in bench.groups:
            cells = []
            for _, b, metric in readings:
                if g not in b.groups:
                    cells += ["–", "–"]
                    continue
                d = _ahead(b, "coperturbation", g, metric)[1] if g != "coperturbation" else (math.nan,) * 3
                cells += [interval_text(*_summary_row(b.groups[g], metric)),
                          interval_text(*d, sign=True) if math.isfinite(d[0]) else "–"]
            lines.append(f"| {g} | {paper_name(g)} | " + " | ".join(cells) + " |")
        lines.append("")
    f = found.focus
    if f:
        base = mean_interval(f["base"])
        lines += [
            "**Where each method puts its weight** (the paper: \"SHAP focuses on function words; RISE on the middle or "
            f"both ends\"). For each sentence, the top {100 * TOP_SHARE:.0f} % of content tokens by absolute score (at least "
            "one): the share of their absolute score mass on function words (spaCy `en_core_web_sm`'s universal tags "
            f"{', '.join(FUNCTION_POS)}) and in the first, middle and last third of the sentence (by relative token "
            f"position). Means over {f['n']} sentences, 95 % bootstrap intervals; a seeded method: the mean over its seeds "
            f"per sentence. Function words make {interval_text(*base[:3])} of the content tokens.",
            "",
            "| method | function words | first third | middle third | last third |",
            "|---|---|---|---|---|",
        ]
        for g, values in f["shares"].items():
            lines.append(f"| {g} | " + " | ".join(interval_text(*mean_interval(values[:, k])[:3]) for k in range(4)) + " |")
        lines.append("")
    return lines
