"""Reproduction report of the co-perturbation paper ("Do Pre-Trained Language Models Truly Focus
on the Content They Are Expected to?") on the heedful zoo: ``heedful reproduce coperturbation``.

What it runs (on ``minilm-sentiment`` unless said, movie-review snippets, test split):

1. the units of lambda: the default (normalised) lambda in the paper's Eq. 9 units, per sentence
   (:func:`~heedful.reproduce.coperturbation_studies.lambda_units`);
2. co-perturbation's linearized solver against the optimised one (Adam, Algorithm 1) on the first
   :data:`N_COMPARE` sentences: rank agreement, AOPC / sufficiency, cost;
3. seed stability of both solvers;
4. faithfulness (AOPC, sufficiency) of co-perturbation and the paper's Figure 3 baselines on the
   first :data:`N_BENCH` sentences (:func:`heedful.evaluate.bench.run_bench`, preset ``default``;
   the paper's LRP, Ali et al. 2022, as ``attnlrp``), and on the same stored explanations their
   plausibility against the lexicon evidence and where their top mass falls -- function words,
   thirds of the sentence (:mod:`heedful.reproduce.coperturbation.focus`);
5. rectification (Section 5.4.1, Tables 1 / 3, Figure 8): the model's errors, the top-``r`` tokens
   by each method toward the wrong prediction suppressed, for a sweep of ratios
   (:func:`heedful.interest.rectify.rectify`); on ``smollm2-sentiment`` too (linearized solver);
6. lambda and layer studies over :data:`N_STUDY` sentences with the linearized solver and with
   the optimised one (each lambda of the grid, a second seed, every layer; stored like every
   other explanation, :mod:`heedful.reproduce.coperturbation.optimised`), and on one sentence
   (optimised; :mod:`heedful.interest.studies`);
7. steering generation by suppressing prompt words (Section 5.4.2, Figure 9) with
   :func:`heedful.interest.steer` on ``smollm2-135m``
   (:mod:`heedful.reproduce.coperturbation_steering`);
8. the paper's claims, each with a verdict from the numbers above.

Explanations are kept in one results store (``settings.store``, default
``$HEEDFUL_HOME/reproduce/coperturbation``) shared by every part, so a second run computes only
what is missing. Report options (``--option key=value``): ``n_compare``, ``n_bench``,
``n_study``, ``n_rectify`` (sentences classified, for every model; default :data:`N_RECTIFY`;
``n_compare=stored`` / ``n_rectify=stored``: as many as the store already holds optimised
explanations for -- the longest prefix, or every error -- so a run sized to the compute at hand
grows with the store),
``check`` (sentences of the optimised solver's seed check, 0 to skip it; by default ``n_study``,
whose second seed the lambda study stores anyway), ``methods`` (comma-separated), ``models`` (comma-separated zoo names), ``seed``, ``budget`` (``report``: the
reduced compute budget of :data:`BUDGET`; ``default``: every method's defaults), ``steering``
(``on``, the default, or ``off``: leave out the steering case study), ``stability`` (``on``, the
default, or ``off``: leave out the section on cost, stability and the first-order limit, hours of
compute of its own -- the report then points to ``coperturbation-stability.md``, written by
``only=stability``); for the section on cost,
stability and the first-order limit (:mod:`heedful.reproduce.coperturbation_stability`, on a
dev split of the *train* sentences): ``n_seed`` (sentences of the seed-agreement grid, default
:data:`N_SEED`), ``n_warm`` (sentences of the warm-start comparison, default :data:`N_WARM`),
``until=HH:MM`` (UTC: start no unit of that section after this time; the report says what was
reached), ``share=i/k`` (measure only every ``k``-th unit from the ``i``-th: ``k`` processes side
by side on one store) and ``only=stability`` (that section alone, written to ``coperturbation-stability.md``);
``workers=N``: the faithfulness and comparison benchmarks run on ``N`` local Ray workers (one
torch thread each; :class:`heedful.evaluate.ray_engine.RayEngine`) instead of this process.
"""

from __future__ import annotations

import time
from pathlib import Path

from heedful.errors import HeedfulError
from heedful.reproduce import ReportSettings
from heedful.reproduce.coperturbation.claims import _claims, _comparison, _lambda_notes
from heedful.reproduce.coperturbation.markdown import _grid, _markdown, _sizes, overlap_sentence
from heedful.reproduce.coperturbation.run import (
    DATASET,
    MODELS,
    N_BENCH,
    N_COMPARE,
    NAME,
    STABILITY_MODEL,
    STEERING_HEADING,
    Found,
    Timings,
    _available,
    _compare_inputs,
    _engine,
    _main_model,
    _optimised_key,
    _plan,
    _printer,
    _record_timings,
    _second_model,
    _seed_check,
    _stability,
    _stability_alone,
    _stored_prefix,
    _stored_rectify_n,
    seed_agreement_of,
)

__all__ = ["DATASET", "Found", "N_BENCH", "N_COMPARE", "Timings", "_available", "_claims", "_compare_inputs", "_comparison", "_engine", "_grid", "_lambda_notes", "_optimised_key", "_plan", "_record_timings", "_seed_check", "_sizes", "_stored_prefix", "_stored_rectify_n", "overlap_sentence", "write"]


def write(out_dir: Path, settings: ReportSettings) -> Path:
    """Run the experiments (see the module docstring) and write ``out_dir/coperturbation.md``
    with its ``coperturbation-*.png`` figures and ``coperturbation-*.csv`` tables."""
    import heedful

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    run = _plan(settings)
    if run.only == "stability":
        return _stability_alone(out_dir, run)
    for m in run.methods:
        heedful.get_method(m)
    models, notes = _available(run.chosen)
    notes += [
        f"`{m}` is not in this run (`--option models={','.join(run.chosen)}`); it is skipped" for m in MODELS if m not in run.chosen
    ]
    if not models:
        raise HeedfulError("no zoo model of this report is built", hint="heedful models build minilm-sentiment")
    found = Found(notes=notes)
    say = _printer(settings.progress)
    if run.steering:
        from heedful.reproduce.coperturbation_steering import steering_section

        began = time.perf_counter()
        found.steering = steering_section(out_dir, quick=run.quick, seed=run.seed, say=say, heading=STEERING_HEADING)
        run.timings.add("steering", began)
    for name in models:
        began = time.perf_counter()
        say(f"loading {name}")
        model = heedful.load(name)
        run.timings.add(f"load {name}", began)
        if name == models[0]:
            _main_model(model, name, run, found, out_dir, say, settings.progress)
            if name == STABILITY_MODEL and run.stability:
                began = time.perf_counter()
                found.stability = _stability(model, run, say)
                found.seed_agreement = seed_agreement_of(found.stability) or found.seed_agreement
                run.timings.add("cost, stability and the first-order limit", began)
        else:
            _second_model(model, name, run, found, out_dir, say, settings.progress)
        del model
    longest = _record_timings(run.store, run.timings)
    path = out_dir / f"{NAME}.md"
    path.write_text(_markdown(run, found, longest), encoding="utf-8")
    return path
