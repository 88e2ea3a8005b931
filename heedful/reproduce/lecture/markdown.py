"""Lecture report, the sections: probes per layer and expected layers, the traced prompts and
their mean effects, the steering table and sweep, the counterfactual confirmation rates, the
lecture's topics covered here, and the run's cost."""

from __future__ import annotations

import math
from pathlib import Path

from heedful.reproduce.lecture.claims import SEED, Found
from heedful.reproduce.lecture.run import (
    LAYER_STRIDE,
    LM,
    METHOD_OPTIONS,
    TABLE_NEGATIVE,
    TABLE_POSITIVE,
    Plan,
)
from heedful.reproduce.lecture.statistics import SITES, cell_text, confirmation, overlapping
from heedful.reproduce.toolkit import coverage_section, interval_text


def _cell(row) -> str:
    return interval_text(float(row[0]), float(row[1]), float(row[2]), digits=3)


def _figure(path: Path | None, alt: str) -> list[str]:
    return [f"![{alt}]({path.name})", ""] if path is not None else []


def probe_section(found: Found, plan: Plan, figure: Path | None) -> list[str]:
    lines = [
        "## 1. Edge probing across layers", "",
        f"Lecture slides \"What is a Probe?\", \"Edge Probing\" and \"BERT rediscovers the NLP pipeline\" (Tenney et al. 2019). "
        f"The first {plan.count('n_probe')} movie-review snippets of the test split are parsed by spaCy's `en_core_web_sm` "
        "(silver labels, as edge probing's silver tasks): part of speech for every word (a span) and the dependency relation "
        "for every edge (dependent and head spans, their mean-pooled representations concatenated). 20 % of the texts are "
        "held out; a linear probe (standardised features, L2 logistic regression) is trained per layer on the rest "
        f"(every layer of MiniLM; every {LAYER_STRIDE[LM]}rd of SmolLM2's and its last, to fit the time budget). The "
        "control task (Hewitt & Liang 2019) gives every word type (every dependent–head word pair) one random label; "
        "selectivity = accuracy − control accuracy. The expected layer is Tenney et al.'s Eq. 4 on the cumulative "
        "scalar-mix probes (layers 0..l): `E[l] = Σ l Δ(l) / Σ Δ(l)` with accuracy in place of F1. Intervals: 95 % "
        "bootstrap over the held-out texts (1000 resamples; a text's words and edges move together).", "",
    ]
    if not found.probes:
        return lines + [f"**Not run**: {found.missing.get('probes', 'no probe model available')}.", ""]
    lines += ["| model | property | test items | majority class | best layer | accuracy there | selectivity there | "
              "expected layer (Eq. 4) |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for (model, prop), s in found.probes.items():
        b = s.layers.index(s.best)
        lines.append(f"| `{model}` | {prop} | {s.items} | {s.majority:.3f} | {s.best} | {_cell(s.accuracy[b])} | "
                     f"{interval_text(*s.best_selectivity)} | {interval_text(*s.expected, digits=2)} |")
    lines += [""] + _figure(figure, "probe accuracy and selectivity per layer")
    for model in dict.fromkeys(m for m, _ in found.probes):
        props = [(p, s) for (m, p), s in found.probes.items() if m == model]
        lines += [f"<details><summary>`{model}`: every layer</summary>", "",
                  "| layer | " + " | ".join(f"{p} accuracy | {p} control | {p} selectivity" for p, _ in props) + " |",
                  "|---:|" + "---:|" * (3 * len(props))]
        for j, layer in enumerate(props[0][1].layers):
            lines.append(f"| {layer} | " + " | ".join(f"{_cell(s.accuracy[j])} | {_cell(s.control[j])} | {_cell(s.selectivity[j])}"
                                                      for _, s in props) + " |")
        lines += ["", "</details>", ""]
    return lines


def trace_section(found: Found, plan: Plan, facts: dict | None, figure: Path | None) -> list[str]:
    lines = [
        "## 2. Causal tracing of factual recall", "",
        f"Lecture slide \"ROME (Meng et al. 2022)\": causal tracing isolates the hidden states that carry a fact. Prompts are "
        f"generated here from two templates (\"The capital of X is\", \"The official language of X is\") over a list of "
        f"countries; `{LM}` is asked for its greedy next token and only the prompts it completes with the right word are "
        f"kept, the first {plan.count('n_facts')} of them traced. The subject's word embeddings are noised "
        f"(3 × the embedding standard deviation, {plan.count('samples')} draws per prompt); each cell restores the clean "
        f"MLP or attention output of a window of {plan.count('window')} layers centred on a layer, at one position "
        "(ROME restores windows of 10 of GPT-2 XL's 48 layers). The indirect effect is p(answer) restored − p(answer) "
        "corrupted. Positions before the subject are unchanged by the corruption and have effect 0. Attribution patching "
        "(AtP) estimates each grid from one backward pass. Intervals: 95 % bootstrap over prompts.", "",
    ]
    if facts is None:
        return lines + [f"**Not run**: {found.missing.get('traces', 'the language model is not available')}.", ""]
    right = sum(facts["correct"])
    by = {}
    for f, ok in zip(facts["facts"], facts["correct"], strict=True):
        by.setdefault(f["relation"], [0, 0])
        by[f["relation"]][0] += ok
        by[f["relation"]][1] += 1
    lines += [f"`{LM}` answers {right} of {len(facts['facts'])} candidate prompts correctly ("
              + ", ".join(f"{r}: {a} of {t}" for r, (a, t) in by.items()) + ").", ""]
    stats = found.traces
    if stats is None or not stats.prompts:
        return lines + [f"**Not traced**: {found.missing.get('traces', 'no prompt answered correctly')}.", ""]
    lines += _figure(figure, "mean indirect effect per layer")
    lines += ["| layer | " + " | ".join(f"{k} at the {s}" for k in sorted({k for k, _ in stats.means}) for s in SITES) + " |",
              "|---:|" + "---:|" * len(stats.means)]
    for layer in range(stats.layers):
        lines.append(f"| {layer} | " + " | ".join(_cell(stats.means[(k, s)][layer]) for k in sorted({k for k, _ in stats.means})
                                                  for s in SITES) + " |")
    return lines + [""]


def traced_prompts(rows: list[tuple[str, str, dict]]) -> list[str]:
    """The traced prompts with their clean and corrupted p(answer) and AtP's Spearman."""
    if not rows:
        return []
    lines = ["<details><summary>The traced prompts</summary>", "", "| prompt | answer | kind | p clean | p corrupted | AtP Spearman |",
             "|---|---|---|---:|---:|---:|"]
    lines += [f"| {p} | `{a}` | {t['kind']} | {t['clean']:.3f} | {t['corrupted_score']:.3f} | {t['spearman']:.2f} |" for p, a, t in rows]
    return lines + ["", "</details>", ""]


def steering_section(found: Found, plan: Plan, figure: Path | None) -> list[str]:
    lines = [
        "## 3. Steering vectors", "",
        "### The lecture's table", "",
        f"Lecture slides \"Steering Vectors\", \"Extracting steering vectors\" (Algorithm 1) and \"Steering vector results\" "
        f"(Subramani et al. 2022). A vector is extracted for each of {len(TABLE_POSITIVE)} positive and "
        f"{len(TABLE_NEGATIVE)} negative sentence(s) (added at block {plan.count('steer_layer')}'s output at every position; Adam, "
        f"at most {plan.count('extract_steps')} steps, until greedy decoding writes the sentence); "
        "`z_tonegative` = mean z(negative) − mean z(positive), `z_topositive` its opposite. The row's sentence is decoded "
        f"from its own vector plus k × the offset, with `{LM}`; `minilm-sentiment` judges each output.", "",
    ]
    table = found.table
    if table is None:
        lines += [f"**Not run**: {found.missing.get('steering', 'the language model is not available')}.", ""]
    else:
        lines += ["| steering vectors | SmolLM2-135M writes | judged |", "|---|---|---|"]
        for row in table["rows"]:
            label = "Positive" if row["toward"] == "NEGATIVE" else "Negative"
            lines.append(f"| {label} input | {cell_text(row['sentence'])} (without a vector: {cell_text(row['unsteered'])}) | |")
            for o in row["outputs"]:
                what = "z(input) alone" if o["coefficient"] == 0 else f"+{o['coefficient']:.1f} × z_to{row['toward'].lower()}"
                prob = o.get("probability")
                judged = o["label"] + (f" ({prob:.2f})" if isinstance(prob, float) and math.isfinite(prob) else "")
                lines.append(f"| {what} | {cell_text(o['text'])} | {judged} |")
        lines += ["", "Extraction: " + "; ".join(f"\"{s}\" {'reproduced' if e['reproduced'] else 'not reproduced (decodes to “' + cell_text(e['decoded']) + '”)'} "
                                                  f"after {e['steps']} steps" for s, e in table["extracted"].items()) + ".", ""]
    lines += [
        "### Success against fluency over coefficients", "",
        f"A mean-difference vector (the mean block-{plan.count('steer_layer')} output, over tokens, of "
        f"{plan.count('n_vector')} positive minus {plan.count('n_vector')} negative train snippets) is added, times each "
        f"coefficient, at every position while `{LM}` continues the first six words of the first {plan.count('n_sweep')} "
        "test snippets greedily for 20 tokens. Success: `minilm-sentiment` calls the continuation alone POSITIVE (Wilson "
        "95 % interval); fluency: the unsteered model's perplexity of the continuation given its prompt (geometric mean "
        "over prompts, bootstrap 95 % interval).", "",
    ]
    sweep = found.sweep
    if sweep is None:
        return lines + [f"**Not run**: {found.missing.get('sweep', 'the language model is not available')}.", ""]
    norm = sweep["rows"][0].get("norm")
    if norm is not None:
        lines += [f"The vector's norm is {norm:.2f}.", ""]
    lines += ["| coefficient | share POSITIVE | perplexity | first continuation |", "|---:|---:|---:|---|"]
    for r in sweep["rows"]:
        first = cell_text(r["examples"][0] if r["examples"] else "")
        lines.append(f"| {r['coefficient']:+g} | {interval_text(r['success'], r['success_low'], r['success_high'], 2)} | "
                     f"{interval_text(r['perplexity'], r['perplexity_low'], r['perplexity_high'], 1)} | {sweep['prompts'][0]} *{first}* |")
    return lines + [""] + _figure(figure, "steering sweep")


def counterfactual_section(found: Found, plan: Plan) -> list[str]:
    lines = [
        "## 4. Counterfactual tests of the attribution methods", "",
        f"Lecture slides \"What to Expect from Explanations?\" and \"Realistic Counterfactuals\" (Ye et al. 2021). Each method "
        f"explains `minilm-sentiment`'s prediction on the first {plan.count('n_counterfactual')} test snippets; the hypothesis "
        "\"the top word drives the prediction\" is tested by realistic edits: `replace` (the top content word by another word "
        "of its spaCy tag from the snippets; confirmed when p(class) falls by 0.05 more than when a random other content "
        "word is replaced), `negate` (\"not\" before the top adjective, against another adjective) and `swap` (the two top "
        "words trade places; confirmed when the class stays). Share confirmed with its Wilson 95 % interval; against random "
        "rankings: the paired difference over the snippets both tested (bootstrap 95 %)."
        + (f" Integrated gradients runs with {METHOD_OPTIONS['integrated_gradients']['n_steps']} steps." if "integrated_gradients" in found.counterfactual else ""), "",
    ]
    cf = found.counterfactual
    if not cf:
        return lines + [f"**Not run**: {found.missing.get('counterfactual', 'the classifier is not available')}.", ""]
    lines += ["| method | edit | hypotheses | confirmed | minus random (paired) |", "|---|---|---:|---:|---:|"]
    from heedful.reproduce.lecture.statistics import against_random

    notes = []
    for edit in ("replace", "negate", "swap"):
        rates = {m: confirmation(v["hypotheses"], edit) for m, v in cf.items()}
        for m, r in rates.items():
            diff = "–" if m == "random" or "random" not in cf else interval_text(*against_random(cf, m, edit), digits=2, sign=True)
            lines.append(f"| {m} | {edit} | {r[3]} | {interval_text(*r[:3], digits=2)} | {diff} |")
        pairs = overlapping(rates)
        apart = [(a, b) for i, a in enumerate(rates) for b in list(rates)[i + 1:] if (a, b) not in pairs and rates[a][3] and rates[b][3]]
        notes.append(f"- `{edit}`: the Wilson intervals of " + (
            "every pair of methods overlap" if not apart else
            f"{len(pairs)} of {len(pairs) + len(apart)} pairs overlap; apart: " + ", ".join(f"{a} / {b}" for a, b in apart)) + ".")
    return lines + ["", "Where the intervals overlap:", ""] + notes + [""]


COVERAGE = (
    ("Edge probing across layers (Tenney et al. 2019), POS and dependencies", "analogue",
     "MiniLM-L6 (sentiment fine-tuned) and SmolLM2-135M in place of BERT; spaCy silver labels on movie snippets; accuracy "
     "in place of F1; all layers"),
    ("\"BERT rediscovers the NLP pipeline\": expected layer (Eq. 4) and mixing weights' centre (Eq. 2)", "analogue",
     "Eq. 4 with a bootstrap interval; the other tasks of the figure (constituents, entities, SRL, coreference, SPR, "
     "relations) are not probed: no gold data ships here"),
    ("Control tasks and selectivity (Hewitt & Liang 2019; \"Issues with Probing\")", "reproduced", "per word type / word pair"),
    ("MDL probing (Voita & Titov 2020)", "not reproduced", "in `heedful probe --mdl`; left out of this report's time budget"),
    ("Amnesic probing (Elazar et al. 2021)", "not reproduced", "in `heedful probe --amnesic`; left out of this report's time budget"),
    ("Causal tracing (ROME, Meng et al. 2022)", "analogue",
     "SmolLM2-135M in place of GPT-2 XL; country prompts it answers correctly, generated here; MLP and attention windows"),
    ("ROME's rank-one edit", "not reproduced", "heedful traces, it does not edit weights"),
    ("Steering vectors, Algorithm 1 and the steering table (Subramani et al. 2022)", "analogue",
     "SmolLM2-135M in place of GPT-2; the offset from the table's two sentences, not a mean over many"),
    ("Inference-time intervention (Li et al. 2023)", "not reproduced", "not in this report"),
    ("Contrastive / mean-difference steering (Turner et al. 2023; Rimsky et al. 2023)", "analogue",
     "a mean-difference vector over labelled snippets, swept over coefficients, success against perplexity"),
    ("Realistic counterfactuals (Ye et al. 2021)", "analogue",
     "sentiment classifier and word edits in place of multi-hop QA; six attribution methods"),
)


def coverage() -> list[str]:
    return coverage_section(COVERAGE, "## The lecture's topics here")


UNIT_NAMES = {"probe": "probes", "facts": "factual prompts checked", "trace": "causal traces", "extract": "extracted vectors",
              "sweep": "sweep coefficients", "counterfactual": "counterfactual tests"}


def run_section(plan: Plan, units) -> list[str]:
    import torch

    lines = ["## Run", "", "| section | wall time, this run | CPU time, this run |", "|---|---:|---:|"]
    for stage, wall in plan.timings.items():
        lines.append(f"| {stage} | {wall / 60:.1f} min | {plan.cpu.get(stage, 0.0) / 60:.1f} min |")
    total, cpu = sum(plan.timings.values()), sum(plan.cpu.values())
    lines += [f"| total | {total / 60:.1f} min | {cpu / 60:.1f} min |", "",
              "What the units cost when they were computed (from the unit store; CPU time counts every thread):", "",
              "| units | wall time | CPU time |", "|---|---:|---:|"]
    for kind, (wall, cpu_first) in units.first.items():
        lines.append(f"| {UNIT_NAMES.get(kind, kind)} | {wall / 60:.1f} min | {cpu_first / 60:.1f} min |")
    first_wall = sum(v[0] for v in units.first.values())
    first_cpu = sum(v[1] for v in units.first.values())
    lines += [f"| total | {first_wall / 60:.1f} min | {first_cpu / 60:.1f} min |", "",
              f"{units.computed} units computed and {units.reused} reused from the unit store `{plan.store}` "
              f"({torch.get_num_threads()} torch thread(s)). A rerun reuses every stored unit; Ctrl-C keeps the units finished "
              f"so far. The lecture: {SEED}.", ""]
    return lines
