"""``heedful reproduce lecture``: the lecture "Interpreting NLP Models" (CSE 5525,
``../shared/seeds/lecture-interpreting-nlp-models.md``) beyond input attribution, on the zoo.

1. **Edge probing across layers** of ``minilm-sentiment`` and ``smollm2-135m``: part of speech
   and dependency relations (spaCy silver labels on movie snippets), control tasks and
   selectivity, and Tenney et al.'s expected layer with a bootstrap interval over texts -- does
   MiniLM "rediscover the pipeline" (part of speech at an earlier layer than dependencies)?
2. **Causal tracing of factual recall** on ``smollm2-135m``: country prompts generated here,
   kept when the model answers them correctly; the subject corrupted, MLP and attention outputs
   restored per (layer, position); Meng et al.'s early MLP site at the last subject token and
   late attention site at the last token tested across prompts.
3. **Steering**: the lecture's table ("the taste is excellent!" with ``+k z_tonegative``) with
   SmolLM2's own outputs, and a coefficient sweep of a mean-difference vector: success judged
   by ``minilm-sentiment`` against the model's own perplexity.
4. **Counterfactual tests** (Ye et al. 2021) of six attribution methods: the share of their
   hypotheses confirmed, against random rankings.

Each finished unit (a probe, a trace, a vector, a sweep coefficient, a method's tests) is
stored at once in the unit store (``--store``, default ``$HEEDFUL_HOME/reproduce/lecture``),
keyed by the model's fingerprint and the unit's settings: a rerun computes only what is
missing, and Ctrl-C writes the report of what was finished before it stops. Report options
(``--option key=value``): the sizes of :data:`~heedful.reproduce.lecture.run.DEFAULTS`
(``n_probe`` also by ``--n``), ``coefficients`` (comma-separated; 0 is always added),
``methods`` (comma-separated; ``random`` is always added), ``models`` (the probed models) and
``seed``. ``--quick`` runs a few examples of everything and writes ``lecture-quick.md``.
"""

from __future__ import annotations

from pathlib import Path

from heedful.reproduce import ReportSettings
from heedful.reproduce.lecture.claims import Found, all_claims, claims_section
from heedful.reproduce.lecture.markdown import (
    counterfactual_section,
    coverage,
    probe_section,
    run_section,
    steering_section,
    trace_section,
    traced_prompts,
)
from heedful.reproduce.lecture.plots import plot_probes, plot_sweep, plot_traces
from heedful.reproduce.lecture.run import (
    CLASSIFIER,
    LM,
    NAME,
    PROPERTIES,
    TRACE_KINDS,
    Plan,
    Units,
    clock,
    correct_facts,
    counterfactual_unit,
    plan_of,
    probe_unit,
    steering_table,
    sweep_units,
    trace_unit,
    traced_facts,
)
from heedful.reproduce.lecture.statistics import probe_stats, trace_stats

__all__ = ["Found", "all_claims", "write"]


class _Models:
    """Each model loaded once, on first use (the tests replace :func:`run.load` and
    :func:`run.available` with tiny stand-ins)."""

    def __init__(self) -> None:
        self.loaded: dict[str, object] = {}

    def __call__(self, name: str):
        if name not in self.loaded:
            from heedful.reproduce.lecture import run

            self.loaded[name] = run.load(name)
        return self.loaded[name]


def _usable(name: str) -> str | None:
    from heedful.reproduce.lecture import run

    return run.available(name)


def _probing(plan: Plan, units: Units, models: _Models, found: Found) -> None:
    for name in plan.models:
        why = _usable(name)
        if why:
            found.missing["probes"] = why
            continue
        results = {prop: probe_unit(units, models(name), name, prop, plan) for prop in PROPERTIES}
        texts = sorted({t for r in results.values() for t in r["per_item"]["text"]})
        for prop, result in results.items():
            found.probes[(name, prop)] = probe_stats(result, texts, plan.seed)


def _tracing(plan: Plan, units: Units, models: _Models, found: Found) -> tuple[dict | None, list]:
    why = _usable(LM)
    if why:
        found.missing["traces"] = why
        return None, []
    lm = models(LM)
    facts = correct_facts(units, lm, plan)
    chosen = traced_facts(facts, plan.count("n_facts"))
    if not chosen:
        found.missing["traces"] = f"`{LM}` answers none of the candidate prompts correctly"
        return facts, []
    traces: dict[str, list[dict]] = {kind: [] for kind in TRACE_KINDS}
    rows = []
    for fact in chosen:
        for kind in TRACE_KINDS:
            t = trace_unit(units, lm, fact, kind, plan)
            traces[kind].append(t)
            rows.append((fact.prompt, fact.answer, t | {"kind": kind}))
    found.traces = trace_stats(traces)
    return facts, rows


def _steering(plan: Plan, units: Units, models: _Models, found: Found) -> None:
    why = _usable(LM) or _usable(CLASSIFIER)
    if why:
        found.missing["steering"] = found.missing["sweep"] = why
        return
    lm, judge = models(LM), models(CLASSIFIER)
    found.table = steering_table(units, lm, judge, plan)
    found.sweep = sweep_units(units, lm, judge, plan)


def _counterfactual(plan: Plan, units: Units, models: _Models, found: Found) -> None:
    why = _usable(CLASSIFIER)
    if why:
        found.missing["counterfactual"] = why
        return
    for method in plan.methods:
        found.counterfactual[method] = counterfactual_unit(units, models(CLASSIFIER), method, plan)


def write(out_dir: Path, settings: ReportSettings) -> Path:
    """Run the four experiments (see the module docstring) and write ``out_dir/lecture.md``
    (``lecture-quick.md`` with ``--quick``) with its ``lecture-*.png`` figures."""
    plan = plan_of(settings)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{NAME}-quick" if plan.quick else NAME
    units, models, found = Units(plan.store), _Models(), Found()
    facts, traced, interrupted = None, [], False
    try:
        for stage, step in (("edge probing", _probing), ("causal tracing", _tracing), ("steering", _steering),
                            ("counterfactual tests", _counterfactual)):
            began = clock()
            try:
                done = step(plan, units, models, found)
            finally:
                plan.timed(stage, began)
            if stage == "causal tracing":
                facts, traced = done
    except KeyboardInterrupt:
        interrupted = True
    figures = {
        "probes": plot_probes(found.probes, out_dir / f"{stem}-probes.png") if found.probes else None,
        "traces": plot_traces(found.traces, out_dir / f"{stem}-traces.png") if found.traces and found.traces.prompts else None,
        "sweep": plot_sweep(found.sweep["rows"], out_dir / f"{stem}-sweep.png") if found.sweep else None,
    }
    lines = _header(plan, settings, interrupted)
    lines += probe_section(found, plan, figures["probes"])
    lines += trace_section(found, plan, facts, figures["traces"]) + traced_prompts(traced)
    lines += steering_section(found, plan, figures["sweep"])
    lines += counterfactual_section(found, plan)
    lines += claims_section(found) + coverage() + run_section(plan, units)
    path = out_dir / f"{stem}.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    if interrupted:
        raise KeyboardInterrupt
    return path


def _header(plan: Plan, settings: ReportSettings, interrupted: bool) -> list[str]:
    from datetime import UTC, datetime

    command = (f"heedful reproduce lecture{' --quick' if plan.quick else ''}" + (f" --n {settings.n}" if settings.n else "")
               + "".join(f" -O {k}={v}" for k, v in sorted(settings.options.items())))
    sizes = ", ".join(f"`{k}={v}`" for k, v in plan.sizes.items())
    lines = [
        "# Inside the model: the lecture's probes, causal traces, steering vectors and counterfactual tests", "",
        "The lecture \"Interpreting NLP Models\" (CSE 5525, `../shared/seeds/lecture-interpreting-nlp-models.md`) teaches "
        "probing, causal tracing, steering vectors and realistic counterfactual tests beside input attribution. Its claims "
        "(and those of the papers it cites) are re-run here on heedful's zoo models, each with a number, a 95 % interval "
        "and a verdict.", "",
        f"Regenerate with `{command}` (unit store `{plan.store}`; a rerun reuses every finished unit). Sizes: {sizes}; "
        f"coefficients {', '.join(f'{c:+g}' for c in plan.coefficients)}; methods {', '.join(plan.methods)}; "
        f"seed {plan.seed}. Generated {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}.", "",
    ]
    if plan.quick:
        lines += ["> **Quick smoke run**: a handful of examples; the numbers are not the report's.", ""]
    if interrupted:
        lines += ["> **Interrupted** (Ctrl-C): the sections below hold what was finished; rerun the same command to "
                  "complete it (finished units are reused).", ""]
    return lines
