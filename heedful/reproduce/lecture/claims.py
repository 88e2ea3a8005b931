"""Lecture report, the claims: each claim the lecture makes (or cites) about probes, causal
tracing, steering and counterfactual tests, with this run's number, 95 % interval and verdict
from the toolkit."""

from __future__ import annotations

from dataclasses import dataclass, field

from heedful.reproduce.lecture.run import LM
from heedful.reproduce.lecture.statistics import (
    ProbeStats,
    TraceStats,
    against_random,
    band_difference,
    cell_text,
    centre_difference,
    confirmation,
    expected_difference,
)
from heedful.reproduce.toolkit import (
    LEGEND,
    Verdict,
    difference_verdict,
    exact_verdict,
    interval_text,
    interval_verdict,
    threshold_verdict,
    untestable,
)

SEED = "`../shared/seeds/lecture-interpreting-nlp-models.md`"
AGREEMENT = 0.5
"""AtP's grid "agrees" with the exact grid when their mean Spearman correlation is above this."""
EDITS = ("replace", "negate")
"""The counterfactual edits whose hypotheses are compared with random rankings' (``swap``
predicts that the class stays, which nearly every ranking's swap does)."""


@dataclass
class Claim:
    """One row of the claims table: the claim with its source in the lecture, where it was
    tested, our number and the verdict."""

    claim: str
    where: str
    number: str
    verdict: Verdict


@dataclass
class Found:
    """What the run measured (None: the section did not run, ``missing`` says why)."""

    probes: dict[tuple[str, str], ProbeStats] = field(default_factory=dict)
    traces: TraceStats | None = None
    table: dict | None = None
    sweep: dict | None = None
    counterfactual: dict[str, dict] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)


def probe_claims(found: Found) -> list[Claim]:
    rows: list[Claim] = []
    models = list(dict.fromkeys(m for m, _ in found.probes))
    for model in models:
        pos, dep = found.probes.get((model, "pos")), found.probes.get((model, "dep"))
        claim = ("The model rediscovers the NLP pipeline: part of speech is resolved at an earlier layer than "
                 "dependency relations (Tenney et al. 2019's expected layer, Eq. 4; lecture slide \"BERT rediscovers the "
                 "NLP pipeline\")")
        if pos is None or dep is None:
            rows.append(Claim(claim, f"`{model}`", "–", untestable(found.missing.get("probes", "a property was not probed"))))
        else:
            diff = expected_difference(dep, pos)
            rows.append(Claim(claim, f"`{model}`, movie snippets, spaCy silver labels",
                              f"E[pos] = {interval_text(*pos.expected, digits=2)}, E[dep] = {interval_text(*dep.expected, digits=2)}; "
                              f"E[dep] − E[pos] = {interval_text(*diff, digits=2, sign=True)} (paired over texts)",
                              difference_verdict(diff)))
        for s in (pos, dep):
            if s is None:
                continue
            rows.append(Claim(
                f"A contextual layer encodes {s.property} better than the word embeddings (Tenney et al.'s P^(0) baseline "
                "against the best layer; lecture slide \"Edge Probing\")", f"`{model}`, {s.property}, layer {s.best} vs 0",
                f"accuracy gain {interval_text(*s.gain, sign=True)}", threshold_verdict(s.gain, 0.0)))
            rows.append(Claim(
                f"The {s.property} probe's accuracy is the representation's, not the probe's: it beats the control task "
                "(Hewitt & Liang 2019; lecture slide \"Issues with Probing\": \"probe solved task by itself\")",
                f"`{model}`, {s.property}, layer {s.best}", f"selectivity {interval_text(*s.best_selectivity, sign=True)}",
                threshold_verdict(s.best_selectivity, 0.0)))
    return rows


def trace_claims(found: Found) -> list[Claim]:
    names = ("Early site: at the last subject token, restoring MLP outputs in the first half of the layers recovers more of "
             "p(answer) than restoring attention outputs (Meng et al. 2022, lecture slide \"ROME\")",
             "Late site: at the last token, restoring attention outputs in the second half of the layers recovers more than "
             "restoring MLP outputs (Meng et al. 2022)",
             "The MLP effect at the last subject token lies at earlier layers than the attention effect at the last token "
             "(Meng et al. 2022's two sites; effect-weighted mean layer)")
    stats = found.traces
    if stats is None or stats.prompts < 2:
        why = found.missing.get("traces", "fewer than two prompts traced")
        return [Claim(n, f"`{LM}`", "–", untestable(why)) for n in names]
    half = stats.layers // 2
    where = f"`{LM}`, {stats.prompts} factual prompts it answers correctly"
    early = band_difference(stats, "last subject token", "mlp", "attn", slice(0, half))
    late = band_difference(stats, "last token", "attn", "mlp", slice(half, None))
    a, b, diff = centre_difference(stats, ("mlp", "last subject token"), ("attn", "last token"))
    rows = [
        Claim(names[0], where, f"MLP − attention, mean over layers 0–{half - 1}: {interval_text(*early, sign=True)} (paired over prompts)",
              difference_verdict(early)),
        Claim(names[1], where, f"attention − MLP, mean over layers {half}–{stats.layers - 1}: {interval_text(*late, sign=True)}",
              difference_verdict(late)),
        Claim(names[2], where, f"MLP at the last subject token: layer {interval_text(*a, digits=1)}; attention at the last token: "
              f"layer {interval_text(*b, digits=1)}; difference {interval_text(*diff, digits=1, sign=True)}",
              difference_verdict(diff)),
    ]
    for kind, value in stats.spearman.items():
        rows.append(Claim(f"Attribution patching ranks the {kind} grid's cells like the exact grid (Nanda 2023; Spearman above "
                          f"{AGREEMENT}, the issue's oracle check)", where, f"mean Spearman {interval_text(*value, digits=2)}",
                          threshold_verdict(value, AGREEMENT)))
    return rows


def steering_claims(found: Found) -> list[Claim]:
    rows: list[Claim] = []
    table, sweep = found.table, found.sweep
    if table is None:
        rows.append(Claim("Steering vectors extracted by optimisation (lecture Algorithm 1)", f"`{LM}`", "–",
                          untestable(found.missing.get("steering", "the steering table did not run"))))
    else:
        made = [s for s, e in table["extracted"].items() if e["reproduced"]]
        rows.append(Claim("Algorithm 1 finds, for each sentence, a vector with which the model writes that sentence exactly "
                          "(Subramani et al. 2022; lecture slide \"Steering Vectors\")", f"`{LM}`, {len(table['extracted'])} sentences",
                          f"{len(made)} of {len(table['extracted'])} reproduced", exact_verdict(len(made) == len(table["extracted"]))))
        for row in table["rows"]:
            last = row["outputs"][-1]
            rows.append(Claim(
                f"+{last['coefficient']:g} × z_to{row['toward'].lower()} turns \"{row['sentence']}\" {row['toward'].lower()} "
                "(the lecture's steering table)", f"`{LM}`, judged by `minilm-sentiment`",
                f"\"{cell_text(last['text'])}\" → {last['label']}",
                exact_verdict(last["label"] == row["toward"],
                              missing=None if row["reproduced"] else "the sentence's own vector does not write the sentence")))
    if sweep is None:
        rows.append(Claim("Adding a steering vector controls the sentiment of continuations (lecture: \"light-weight methods "
                          "to control and steer models\")", f"`{LM}`", "–",
                          untestable(found.missing.get("sweep", "the sweep did not run"))))
        return rows
    by = {r["coefficient"]: r for r in sweep["rows"]}
    zero, top, bottom = by[0.0], by[max(by)], by[min(by)]

    def wilson(r: dict) -> tuple[float, float, float]:
        return (r["success"], r["success_low"], r["success_high"])

    def ppl(r: dict) -> tuple[float, float, float]:
        return (r["perplexity"], r["perplexity_low"], r["perplexity_high"])

    where = f"`{LM}`, {zero['n']} snippet prompts, judged by `minilm-sentiment`"
    if max(by) > 0:
        rows.append(Claim("Adding the positive-minus-negative vector steers continuations toward positive (lecture: steering "
                          "vectors and contrastive activation addition)", where,
                          f"share POSITIVE at {max(by):+g}: {interval_text(*wilson(top), digits=2)} vs unsteered "
                          f"{interval_text(*wilson(zero), digits=2)} (Wilson)", interval_verdict(wilson(top), wilson(zero))))
    if min(by) < 0:
        rows.append(Claim("Subtracting it steers toward negative", where,
                          f"share POSITIVE at {min(by):+g}: {interval_text(*wilson(bottom), digits=2)} vs unsteered "
                          f"{interval_text(*wilson(zero), digits=2)}", interval_verdict(wilson(zero), wilson(bottom))))
    far = max(by, key=abs)
    if far != 0:
        rows.append(Claim("Steering costs fluency: at the largest coefficient the unsteered model finds the continuations less "
                          "likely (the trade-off the sweep measures)", where,
                          f"perplexity at {far:+g}: {interval_text(*ppl(by[far]), digits=1)} vs unsteered {interval_text(*ppl(zero), digits=1)}",
                          interval_verdict(ppl(by[far]), ppl(zero))))
    return rows


def counterfactual_claims(found: Found) -> list[Claim]:
    rows: list[Claim] = []
    cf = found.counterfactual
    if "random" not in cf:
        return [Claim("Explanations predict the model's behaviour on realistic counterfactuals (Ye et al. 2021)", "–", "–",
                      untestable(found.missing.get("counterfactual", "the random control did not run")))]
    for method in cf:
        if method == "random":
            continue
        for edit in EDITS:
            share = confirmation(cf[method]["hypotheses"], edit)
            base = confirmation(cf["random"]["hypotheses"], edit)
            diff = against_random(cf, method, edit)
            rows.append(Claim(
                f"`{method}`'s top word drives the prediction more often than a random word's: its `{edit}` hypotheses are "
                "confirmed more often than random rankings' (Ye et al. 2021, lecture slides \"What to Expect from "
                "Explanations?\", \"Realistic Counterfactuals\")",
                f"`minilm-sentiment`, {share[3]} hypotheses",
                f"{interval_text(*share[:3], digits=2)} vs random {interval_text(*base[:3], digits=2)}; paired difference "
                f"{interval_text(*diff, digits=2, sign=True)}", difference_verdict(diff)))
    return rows


def all_claims(found: Found) -> list[Claim]:
    """Every claim row (for tests and the headline)."""
    return probe_claims(found) + trace_claims(found) + steering_claims(found) + counterfactual_claims(found)


def claims_section(found: Found) -> list[str]:
    """Markdown: every claim with this run's number and verdict."""
    rows = all_claims(found)
    lines = [
        "## The lecture's claims against this run", "",
        LEGEND + f" Claims are those of the lecture ({SEED}) or of the papers it cites on the slide named in the row; a "
        "single generated text or a count without sampling error is judged exactly (holds / does not hold).", "",
        "| claim | where tested | our number | verdict |", "|---|---|---|---|",
    ]
    lines += [f"| {c.claim} | {c.where} | {c.number.replace('|', '/')} | **{c.verdict.word}**"
              f"{f' ({c.verdict.reason})' if c.verdict.reason else ''} |" for c in rows]
    return lines + [""]
