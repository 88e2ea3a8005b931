"""The co-perturbation reproduction report: registration, option checks, graceful skipping of
models that are not there, and the sentences it derives from the numbers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from heedful.errors import HeedfulError
from heedful.interest.rectify import MethodGain, Rectification
from heedful.interest.studies import LambdaSweep
from heedful.reproduce import REPORTS, ReportSettings, report_writer
from heedful.reproduce import coperturbation as cp


def test_registered():
    assert "coperturbation" in REPORTS
    assert report_writer("coperturbation") is cp.write


def test_unknown_option_fails_before_any_work(tmp_path):
    with pytest.raises(HeedfulError, match="no option 'nonsense'"):
        cp.write(tmp_path, ReportSettings(options={"nonsense": 1}))
    with pytest.raises(HeedfulError, match="budget"):
        cp.write(tmp_path, ReportSettings(options={"budget": "huge"}))
    with pytest.raises(HeedfulError, match="steering"):
        cp.write(tmp_path, ReportSettings(options={"steering": "maybe"}))
    with pytest.raises(HeedfulError, match="stability"):
        cp.write(tmp_path, ReportSettings(options={"stability": "maybe"}))
    with pytest.raises(HeedfulError):
        cp.write(tmp_path, ReportSettings(options={"only": "everything"}))
    with pytest.raises(HeedfulError):
        cp.write(tmp_path, ReportSettings(options={"share": "2/2"}))
    with pytest.raises(HeedfulError):
        cp.write(tmp_path, ReportSettings(options={"until": "noon"}))
    with pytest.raises(HeedfulError, match="workers=0"):
        cp.write(tmp_path, ReportSettings(options={"workers": "0"}))
    with pytest.raises(HeedfulError, match="not a number"):
        cp.write(tmp_path, ReportSettings(options={"workers": "two"}))


def test_workers_run_the_benchmarks_on_ray_workers_that_load_the_model_by_name(tmp_path, tiny):
    from heedful.evaluate.ray_engine import RayEngine

    model = tiny("bert")
    assert cp._plan(ReportSettings(store=tmp_path)).workers is None
    assert cp._engine(model, None) is None
    run = cp._plan(ReportSettings(store=tmp_path, options={"workers": "2"}))
    engine = cp._engine(model, run.workers)
    assert isinstance(engine, RayEngine) and engine.workers == 2 and engine.threads == 1
    assert engine.loader.args == (model.name,) and engine.loader.keywords == {"max_memory": None, "progress": False}


def test_models_missing_from_the_zoo_are_skipped_with_a_note():
    found, notes = cp._available(["no-such-model"])
    assert found == [] and "not in this heedful's zoo" in notes[0]


def _result(fixed: dict[str, list[int]]) -> Rectification:
    result = Rectification(
        model="m", dataset="movies", split="test", ratios=[0.1, 0.2, 0.5], n_total=100, correct=80,
        error_ids=[str(i) for i in range(20)], gold=np.zeros(20, int), predicted=np.ones(20, int),
    )
    for name, values in fixed.items():
        result.methods[name] = MethodGain(name, {}, np.zeros((20, 3), int), np.array(values), np.array(values), np.ones(3), 0.0)
    return result


def test_comparison_sentences_follow_the_numbers():
    text = "\n".join(cp._comparison({"m": _result({"coperturbation": [2, 8, 1], "random": [1, 2, 3], "lime": [9, 10, 4]})}))
    assert "fixes 40.0% of the errors at its best ratio r = 0.2" in text
    assert "above random at r = 0.1, 0.2" in text
    assert "`lime` (50.0%)" in text
    assert "falls back to less than half of its peak" in text
    text = "\n".join(cp._comparison({"m": _result({"coperturbation": [1, 1, 1], "random": [2, 2, 2]})}))
    assert "nowhere above random" in text and "does not collapse" in text


def test_lambda_notes_follow_the_numbers():
    sweep = LambdaSweep(
        text="t", tokens=[], words=["good", "and"], lams=[0.2, 0.6, 1.0],
        interest=np.array([[0.1, 0.2], [0.3, 0.2], [0.4, 0.1]]), distortion=np.array([0.1, 0.2, 0.3]),
        objective=np.zeros(3), scores=np.zeros((3, 1)), target="POSITIVE",
    )
    text = " ".join(cp._lambda_notes(sweep))
    assert "`good` gets more interest than `and` at lambda = 0.6, 1" in text
    assert "lowest at lambda = 0.2" in text and "grows with lambda" in text


def test_timings_keep_the_longest_run(tmp_path: Path):
    first = cp.Timings({"rectification": 600.0})
    assert cp._record_timings(tmp_path, first)["rectification"] == 600.0
    assert cp._record_timings(tmp_path, cp.Timings({"rectification": 5.0}))["rectification"] == 600.0


def test_seed_check_compares_the_stored_seed_with_the_next(tmp_path: Path, tiny):
    from scipy.stats import spearmanr

    from heedful.evaluate.store import ResultsStore, Subject, run_key
    from heedful.fingerprint import model_fingerprint

    model = tiny("bert")
    texts = ["a good and moving film", "dull , flat and far too long"]
    options = {"max_steps": 5, "keep": "last"}
    result = _result({})
    result.error_ids = ["7", "9"]
    about = Subject("m", model_fingerprint(model), cp.DATASET, "0" * 16, "test")
    first_key = run_key(about, "coperturbation", {**options, "seed": 0})
    with ResultsStore(tmp_path) as db:
        db.put_explanations(first_key, list(zip(result.error_ids, model.explain(texts, "coperturbation", seed=0, **options), strict=True)))
    check = cp._seed_check(model, result.error_ids, options, tmp_path, about, 0, 2)
    second = model.explain(texts, "coperturbation", seed=1, **options)
    first = model.explain(texts, "coperturbation", seed=0, **options)
    for k in range(2):
        content = ~np.asarray(first[k].special)
        expected = spearmanr(first[k].scores[content], second[k].scores[content]).statistic
        assert check["spearman"][k] == pytest.approx(expected)
        assert check["tokens"][k] == int(content.sum())
    assert check["seeds"] == (0, 1) and all(0.0 <= o <= 1.0 for o in check["overlap"])
    with ResultsStore(tmp_path) as db:  # the second seed is stored for the next run
        again = run_key(about, "coperturbation", {**options, "seed": 1})
        assert set(db.get_explanations(again)) == {"7", "9"}


def test_overlap_sentence_names_neighbours_and_their_intervals():
    rows = [("a", 0.5, 0.4, 0.6), ("b", 0.3, 0.2, 0.35), ("c", 0.32, 0.25, 0.38)]
    text = cp.overlap_sentence(rows)
    assert text == "`a` > `c` (intervals apart); `c` ~ `b` (intervals overlap)."
    assert cp.overlap_sentence(rows, higher_better=False).startswith("`b` ~ `c`")


def test_lambda_units_convert_the_normalised_lambda_exactly(tiny):
    """The paper-unit lambda that :func:`lambda_units` reports gives the linearized solver the same
    noise under ``objective="paper"`` as lambda = 0.6 under the normalised objective."""
    import torch

    from heedful.attribution import coperturbation as cop
    from heedful.reproduce import coperturbation_studies as st

    model = tiny("bert")
    texts = ["a good and moving film", "dull , flat and far too long"]
    units = st.lambda_units(model, texts)
    problem = model.prepare(texts, None, hidden_states=True)
    ex, key = torch.arange(2), torch.full((2,), -1)
    settings = cop.Settings(solver="linearized", scale=1e3)
    norm = cop.fit_interest(problem, ex, key, torch.full((2,), 0.6), settings)
    paper = cop.fit_interest(problem, ex, key, torch.tensor(units["lambda_paper"], dtype=torch.float32), cop.Settings(solver="linearized", objective="paper", scale=1e3))
    torch.testing.assert_close(paper.sigma, norm.sigma, rtol=1e-4, atol=0)
    assert units["at_ceiling_paper"].shape == (2,) and (units["at_ceiling_paper"] >= units["at_ceiling_normalised"]).all()


def test_studies_return_one_row_per_sentence(tiny):
    from heedful.reproduce import coperturbation_studies as st

    model = tiny("bert")
    texts = ["a good and moving film", "dull , flat and far too long", "fine"]
    lam = st.lambda_study(model, texts, lams=(0.2, 0.6))
    assert lam["measured"].shape == (3, 2) and np.isfinite(lam["measured"]).all()
    assert np.all(lam["predicted"][:, 1] >= lam["predicted"][:, 0])  # more lambda, more noise
    layers = st.layer_study(model, texts, probes=4)
    assert layers["concentration"].shape == (3, model.adapter.num_layers)
    probes = st.probe_stability(model, texts, 1, [4])
    assert len(probes[4]["spearman"]) == 3


def test_stored_sizes_follow_what_the_store_holds(tmp_path: Path, tiny):
    from heedful.evaluate.store import ResultsStore

    model = tiny("bert")
    run = cp._plan(ReportSettings(store=tmp_path, options={"n_compare": "stored", "n_rectify": "stored"}))
    assert run.n_compare is None and run.n_rectify == "stored"
    ids, texts = cp._compare_inputs(model, run)
    key = cp._optimised_key(model, run)
    fake = model.explain(texts[:3], "random", seed=0)
    with ResultsStore(tmp_path) as db:
        db.put_explanations(key, list(zip([ids[0], ids[1], ids[3]], fake, strict=True)))
    assert cp._stored_prefix(model, run) == 2  # the third sentence is missing
    n = cp._stored_rectify_n(model, run, 20)
    assert 0 <= n <= 20


def test_stability_off_leaves_the_section_to_its_own_report(tmp_path: Path):
    assert cp._plan(ReportSettings(store=tmp_path)).stability is True
    assert cp._plan(ReportSettings(store=tmp_path, options={"stability": "off"})).stability is False
    run = cp._plan(ReportSettings(store=tmp_path, options={"workers": "2", "stability": "off"}))
    assert run.command == "heedful reproduce coperturbation -O stability=off -O workers=2"


def test_sizes_say_which_targets_were_reached():
    class Bench:
        n_examples = cp.N_BENCH
        groups = {"coperturbation": None, "random": None}

    found = cp.Found(notes=[], compare={"n": cp.N_COMPARE - 1}, bench=Bench(), check={"n": 8})
    found.rect["minilm-sentiment"] = _result({"coperturbation": [1, 2, 3], "random": [1, 1, 1]})
    lines = "\n".join(cp._sizes(cp._plan(ReportSettings()), found))
    assert f"{cp.N_COMPARE - 1} test sentences (target >= {cp.N_COMPARE}: not reached)" in lines
    assert f"{cp.N_BENCH} test sentences (target >= {cp.N_BENCH}: reached)" in lines
    assert "100 test sentences classified (target >= 500: not reached), 20 errors explained by 2 methods" in lines
    assert "`coperturbation-stability.md`" in lines and "stability=off" in lines
    found.lam_study = {"measured": [0.0] * 100}
    assert "the optimised solver on one sentence" in "\n".join(cp._sizes(cp._plan(ReportSettings()), found))
    found.lam_optimised = {"flip_lambda": np.zeros(100)}
    found.layer_optimised = {"concentration": np.zeros((48, 6))}
    lines = "\n".join(cp._sizes(cp._plan(ReportSettings()), found))
    assert "100 sentences (linearized solver); the optimised solver: lambda 100, layers 48 sentences" in lines


def test_grid_is_a_markdown_table_with_a_corner():
    assert cp._grid("r", ["a", "b"], [("0.1", ["1%", "2%"]), ("0.2", ["3%", "4%"])]) == [
        "| r | a | b |",
        "|---|---|---|",
        "| 0.1 | 1% | 2% |",
        "| 0.2 | 3% | 4% |",
    ]


def _fixing(fixed_per_ratio: list[int], ratios=(0.1, 0.25, 0.5), errors: int = 40) -> MethodGain:
    """A method whose top tokens fix the first ``fixed_per_ratio[r]`` errors at ratio ``r``."""
    predictions = np.ones((errors, len(ratios)), int)
    for r, k in enumerate(fixed_per_ratio):
        predictions[:k, r] = 0  # gold is 0
    fixed = np.array(fixed_per_ratio)
    return MethodGain("m", {}, predictions, fixed, fixed, np.ones(len(ratios)), 0.0)


def test_claims_use_the_five_verdicts_with_paired_intervals():
    from heedful.reproduce.toolkit import VERDICTS

    ratios = [0.1, 0.25, 0.5]
    apart = Rectification("m", "movies", "test", ratios, 100, 60, [str(i) for i in range(40)], np.zeros(40, int), np.ones(40, int))
    apart.methods = {"coperturbation": _fixing([10, 20, 18]), "random": _fixing([1, 2, 3])}
    tied = Rectification("d", "movies", "test", ratios, 100, 60, [str(i) for i in range(40)], np.zeros(40, int), np.ones(40, int))
    tied.methods = {"coperturbation (linearized)": _fixing([5, 8, 6]), "random": _fixing([5, 8, 6])}
    rng = np.random.default_rng(0)
    low = rng.uniform(0.2, 0.3, 50)
    found = cp.Found(notes=[], rect={"apart": apart, "tied": tied},
                     layer_study={"concentration": np.stack([low, low + 0.1 + rng.normal(0, 0.01, 50)], 1), "layers": [1, 6]})
    text = "\n".join(cp._claims(found))
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[1] for line in text.splitlines() if line.startswith("| ") and " | " in line}
    assert all(any(v.startswith(word) for word in VERDICTS) for v in list(rows.values())[1:]), rows
    assert rows["Suppressing the highest-interest tokens of misclassified sentences fixes more errors than chance (5.4.1, Tables 1/3) -- apart"] == "holds"
    assert rows["Suppressing the highest-interest tokens of misclassified sentences fixes more errors than chance (5.4.1, Tables 1/3) -- tied"] == "not separated"
    assert rows["Error-set gains of 1.1-44.3 % on SST-2 (Table 3) -- apart"].startswith("not comparable (the paper's error set is the intersection")
    assert rows["The gain peaks near r = 0.2 (Figure 8) -- apart"] == "holds"
    assert rows["... and collapses with more erasure, towards r = 0.9 (Figure 8) -- apart"] == "cannot be tested here (the r grid stops at 0.5)"
    assert rows["Higher layers concentrate interest on fewer, more relevant words (5.3, Figure 5)"] == "holds"
    assert "paired difference" in text and "**not separated**" in text and "**not comparable**" in text


# ----------------------------------------------------------------------------- Figure 3: plausibility, function words, positions
def _fake_explanation(scores):
    """[CLS] the cat and a dog [SEP] with the given content scores ``[5]``."""
    from types import SimpleNamespace

    offsets = [(0, 0), (0, 3), (4, 7), (8, 11), (12, 13), (14, 17), (0, 0)]
    return SimpleNamespace(special=[True] + [False] * 5 + [True], offsets=offsets,
                           scores=np.array([9.0, *scores, 9.0]), text="the cat and a dog")


WORDS = [(0, 3, "DET"), (4, 7, "NOUN"), (8, 11, "CCONJ"), (12, 13, "DET"), (14, 17, "NOUN")]


def test_token_classes_and_focus_of_read_function_words_and_thirds():
    from heedful.reproduce.coperturbation.focus import focus_of, token_classes

    keep, function, third = token_classes(_fake_explanation([0.0] * 5), WORDS)
    assert keep.tolist() == [1, 2, 3, 4, 5]  # the special tokens are not content
    assert function.tolist() == [True, False, True, True, False]
    assert third.tolist() == [0, 0, 1, 2, 2]  # relative positions 0, .25, .5, .75, 1
    # top 20 % of 5 tokens = 1 token: the largest |score|
    np.testing.assert_allclose(focus_of(np.array([0.1, -3.0, 0.2, 0.3, 0.4]), function, third, 0.2), [0, 1, 0, 0])
    # top 2 (share 0.4): "and" (function, middle) 3.0 and "dog" (content, last) 1.0
    np.testing.assert_allclose(focus_of(np.array([0.1, 0.2, 3.0, 0.0, -1.0]), function, third, 0.4), [0.75, 0, 0.75, 0.25])
    assert np.isnan(focus_of(np.array([1.0, 2.0]), function[:2], third[:2])).all()  # fewer than 3 tokens
    assert np.isnan(focus_of(np.zeros(5), function, third)).all()  # no mass


def _focus_found(shap_function: float, rise_middle: float):
    """A Found whose focus has per-sentence shares: random at chance (0.3 function words, thirds
    equal), SHAP and RISE shifted as given."""
    rng = np.random.default_rng(0)
    n = 60

    def shares(function, middle):
        ends = (1 - middle) / 2
        return np.column_stack([function + rng.normal(0, 0.05, n), *(np.array([ends, middle, ends])[:, None]
                                                                     + rng.normal(0, 0.05, (3, n)))])

    focus = {"shares": {"random": shares(0.3, 1 / 3), "kernel_shap": shares(shap_function, 1 / 3),
                        "rise": shares(0.3, rise_middle)}, "base": np.full(n, 0.3), "n": n}
    return cp.Found(notes=[], focus=focus)


def _claim_rows(found) -> dict[str, str]:
    text = "\n".join(cp._claims(found))
    # every row of the claims table has its three cells (no stray | inside a cell)
    assert all(line.count("|") == 4 for line in text.splitlines() if line.startswith("|")), text
    return {line.split(" | ")[0].lstrip("| "): line.split(" | ")[1] for line in text.splitlines()
            if line.startswith("| ") and " | " in line}


def test_function_word_and_position_claims_read_the_paired_difference_from_random():
    rows = _claim_rows(_focus_found(shap_function=0.6, rise_middle=0.15))
    shap = next(v for k, v in rows.items() if k.startswith("SHAP focuses on function words"))
    middle = next(v for k, v in rows.items() if k.startswith("RISE focuses on the middle"))
    ends = next(v for k, v in rows.items() if k.startswith("... or on both ends"))
    assert (shap, middle, ends) == ("holds", "does not hold", "holds")
    rows = _claim_rows(_focus_found(shap_function=0.3, rise_middle=1 / 3))
    assert next(v for k, v in rows.items() if k.startswith("SHAP focuses")).startswith("not separated")
    rows = _claim_rows(cp.Found(notes=[]))
    assert next(v for k, v in rows.items() if k.startswith("SHAP focuses")).startswith("cannot be tested here")
    assert next(v for k, v in rows.items() if k.startswith("Co-perturbation's interest falls")).startswith("cannot be tested here")


def test_plausibility_claim_against_the_papers_baselines_with_lrp_as_attnlrp():
    from types import SimpleNamespace

    from heedful.evaluate.metrics import Summary
    from heedful.reproduce.coperturbation.focus import PAPER_FIGURE3, PAPER_LRP, paper_name

    assert PAPER_LRP == "attnlrp" and "lrp" not in PAPER_FIGURE3
    assert paper_name("attnlrp").startswith("LRP (Ali et al. 2022") and "not the paper's LRP" in paper_name("lrp")
    assert paper_name("normxlogit") == "–"

    def bench(values: dict[str, float]):
        groups = {g: SimpleNamespace(summaries={m: Summary(v, 0.1, 50, None, v - 0.03, v + 0.03)
                                                for m in ("average_precision", "dot_product")})
                  for g, v in values.items()}
        return SimpleNamespace(groups=groups, runs=[], ids=[], n_examples=50)  # no store: marginal intervals

    ahead = {"coperturbation": 0.7, **{g: 0.4 for g in PAPER_FIGURE3}, "lrp": 0.9, "random": 0.3}
    found = cp.Found(notes=[], plausibility={"signed": bench(ahead), "magnitude": bench(ahead)})
    rows = _claim_rows(found)
    claims = [v for k, v in rows.items() if k.startswith("Co-perturbation's interest falls")]
    assert claims == ["holds", "holds"]  # Bach-style lrp, above it, is not the paper's LRP
    behind = {**ahead, "rise": 0.9}
    rows = _claim_rows(cp.Found(notes=[], plausibility={"signed": bench(behind)}))
    assert [v for k, v in rows.items() if k.startswith("Co-perturbation's interest falls")] == ["does not hold"]
    from heedful.reproduce.coperturbation.focus import focus_section

    text = "\n".join(focus_section(found))
    assert "## 4b. Plausibility" in text and "| attnlrp | LRP (Ali et al. 2022" in text
    table = [line for line in text.splitlines() if line.startswith("|")]
    assert len({line.count("|") for line in table}) == 1  # every row as wide as the header


def test_plausibility_and_focus_run_on_the_stored_explanations(tmp_path: Path, tiny):
    """The plausibility benches read the faithfulness bench's stored explanations (nothing is
    explained again) and every method gets a focus row, on a tiny model in quick settings."""
    from heedful.evaluate.store import ResultsStore
    from heedful.reproduce.coperturbation import focus as fc
    from heedful.reproduce.coperturbation.run import _bench

    model = tiny("bert")
    run = cp._plan(ReportSettings(store=tmp_path, quick=True))
    methods = ["coperturbation", "rise", "random"]
    options = {m: run.method_options[m] for m in methods}
    bench = _bench(model, run, methods, 4, options, False)
    written = []
    original = ResultsStore.put_explanations
    try:
        ResultsStore.put_explanations = lambda self, *a, **k: written.append(a) or original(self, *a, **k)
        found = cp.Found(notes=[], bench=bench)
        found.plausibility = fc.plausibility(
            lambda m, n, o, metrics, protocol: _bench(model, run, m, n, o, False, metrics, protocol),
            methods, 4, options)
    finally:
        ResultsStore.put_explanations = original
    assert written == []
    signed = found.plausibility["signed"].groups["coperturbation"].summaries
    assert 0 <= signed["average_precision"].value <= 1 and 0 <= signed["dot_product"].value <= 1
    from heedful.reproduce.coperturbation.statistics import _bench_ids

    ids = _bench_ids(model, bench)[0]

    def tagger(texts):  # every word a determiner: all the mass on function words
        import re

        return [[(m.start(), m.end(), "DET") for m in re.finditer(r"\S+", t)] for t in texts]

    found.focus = fc.focus(bench, run.store, model, tagger=tagger)
    assert set(found.focus["shares"]) == set(methods) and found.focus["n"] == len(ids)
    finite = found.focus["shares"]["rise"][np.isfinite(found.focus["shares"]["rise"][:, 0])]
    np.testing.assert_allclose(finite[:, 0], 1.0)
    np.testing.assert_allclose(finite[:, 1:].sum(axis=1), 1.0)
    text = "\n".join(fc.focus_section(found))
    assert "| rise | " in text and "Where each method puts its weight" in text


# ----------------------------------------------------------------------------- the optimised lambda and layer studies
def _content_explanation(scores):
    """An explanation stand-in: [CLS] + content ``scores`` (``[N]`` or ``[L, N]``) + [SEP]."""
    from types import SimpleNamespace

    scores = np.asarray(scores, dtype=float)
    pad = np.full(scores.shape[:-1] + (1,), 5.0)
    return SimpleNamespace(special=[True] + [False] * scores.shape[-1] + [True], scores=np.concatenate([pad, scores, pad], axis=-1))


def test_lambda_order_counts_reversals_of_the_two_leading_tokens_by_a_plain_loop():
    from heedful.reproduce.coperturbation import optimised as op

    rng = np.random.default_rng(3)
    lams = list(op.LAMS)
    ids = [str(k) for k in range(30)]
    per_lam = {lam: {} for lam in lams}
    seed = {}
    for i in ids:
        base = rng.dirichlet(np.ones(6))
        for lam in lams:
            per_lam[lam][i] = _content_explanation(base + rng.normal(0, 0.08, 6) * lam)
        seed[i] = _content_explanation(base + rng.normal(0, 0.02, 6))
    found = op.lambda_order(per_lam, seed, ids)
    for s, i in enumerate(ids):  # the oracle: the pair from the mean of the normalised rows, strict reversals only
        rows = [per_lam[lam][i].scores[1:-1] for lam in lams] + [seed[i].scores[1:-1]]
        mean = sum(r / np.abs(r).sum() for r in rows) / len(rows)
        a, b = sorted(range(6), key=lambda k: (-mean[k], k))[:2]
        first, last, ref = rows[0], rows[len(lams) - 1], rows[lams.index(0.6)]
        assert found["flip_lambda"][s] == float((first[a] - first[b]) * (last[a] - last[b]) < 0)
        assert found["flip_seed"][s] == float((ref[a] - ref[b]) * (rows[-1][a] - rows[-1][b]) < 0)
        assert found["top_same"][s, 0] == float(np.argmax(first) == np.argmax(ref))
    np.testing.assert_allclose(found["spearman_to_ref"][:, lams.index(0.6)], 1.0)
    assert found["flip_lambda"].sum() > found["flip_seed"].sum()  # the noise grows with lambda here, not between seeds


def test_layer_concentration_matches_the_linearized_studys_keys():
    from heedful.reproduce.coperturbation import optimised as op

    layerwise = {"a": _content_explanation([[0.25, 0.25, 0.25, 0.25, 0.0], [0.9, 0.05, 0.05, 0.0, 0.0]])}
    head = {"a": _content_explanation([0.7, 0.1, 0.1, 0.1, 0.0])}
    found = op.layer_concentration(layerwise, head, ["a"])
    assert list(found["layers"]) == [1, 2]
    np.testing.assert_allclose(found["concentration"], [[0.25, 0.9]])  # the top 20 % of 5 tokens: one token
    np.testing.assert_allclose(found["head_concentration"], [0.7])
    assert found["spearman_to_head"][0, 1] > found["spearman_to_head"][0, 0]


def test_the_lambda_claim_reads_the_optimised_study_against_seed_noise():
    n = 100
    apart = {"lams": np.array([0.1, 0.6, 1.0]), "ref": np.array(0.6), "flip_lambda": np.r_[np.ones(40), np.zeros(60)],
             "flip_seed": np.r_[np.ones(5), np.zeros(95)]}
    rows = _claim_rows(cp.Found(notes=[], lam_optimised=apart))
    (claim, verdict), = ((k, v) for k, v in rows.items() if k.startswith("lambda changes which of two words"))
    assert verdict == "holds" and f"tested on {n} sentences" in claim
    tied = {**apart, "flip_lambda": apart["flip_seed"][::-1].copy()}
    rows = _claim_rows(cp.Found(notes=[], lam_optimised=tied))
    assert next(v for k, v in rows.items() if k.startswith("lambda changes which")).startswith("not separated")
    sweep = LambdaSweep(text="a b", tokens=["a", "b"], words=["a", "b"], lams=[0.1, 0.5, 1.0],
                        interest=np.array([[0.3, 0.2], [0.2, 0.3], [0.3, 0.1]]), distortion=np.zeros(3),
                        objective=np.zeros(3), scores=np.zeros((3, 2)), target="pos")
    rows = _claim_rows(cp.Found(notes=[], sweep=sweep))  # without the study: the one sentence, as before
    assert next(v for k, v in rows.items() if k.startswith("lambda changes which")) == "holds"


def test_optimised_studies_store_every_run_and_reuse_it(tmp_path: Path, tiny):
    from heedful.evaluate.store import ResultsStore, run_key, subject
    from heedful.reproduce.coperturbation import optimised as op

    model = tiny("bert")
    texts = ["a charming and often affecting journey", "the movie was dull and far too long"]
    ids, about, options = ["a", "b"], subject(model, "movies", "test"), {"max_steps": 3, "samples": 2}
    lo, ly = op.optimised_studies(model, tmp_path, about, ids, texts, options, 0, lambda _: None)
    assert lo["spearman_to_ref"].shape[1] == len(op.LAMS) and ly["concentration"].shape == (2, model.adapter.num_layers)
    with ResultsStore(tmp_path) as db:
        for _, run in op.study_runs(options, 0):
            assert db.explanation_ids(run_key(about, "coperturbation", run)) == set(ids)
        layer = db.get_explanations(run_key(about, "coperturbation", {**options, "seed": 0, "layerwise": True}))["a"]
    direct = model.explain(texts[0], "coperturbation", seed=0, layerwise=True, **options)
    np.testing.assert_allclose(layer.scores, direct.scores, atol=1e-6)  # stored as a plain explanation under its options
    again = op.optimised_studies(model, tmp_path, about, ids, texts, options, 0, lambda _: None)
    np.testing.assert_array_equal(again[0]["flip_lambda"], lo["flip_lambda"])


def test_section_6_shows_the_optimised_studies_beside_the_linearized_ones(tmp_path: Path):
    from heedful.reproduce.coperturbation.markdown import _studies_section

    rng = np.random.default_rng(0)
    lams = np.array([0.1, 0.6, 1.0])
    lam_optimised = {"lams": lams, "ref": np.array(0.6), "spearman_to_ref": rng.uniform(0.5, 1, (20, 3)), "top_same": np.ones((20, 3)),
                     "flip_lambda": np.r_[np.ones(7), np.zeros(13)], "flip_seed": np.r_[np.ones(2), np.zeros(18)],
                     "spearman_seed": rng.uniform(0.8, 1, 20), "top_same_seed": np.ones(20)}
    layers = {"layers": np.array([1, 2]), "concentration": rng.uniform(0.2, 0.4, (20, 2)), "head_concentration": rng.uniform(0.3, 0.4, 20),
              "spearman_to_head": rng.uniform(0.3, 0.9, (20, 2))}
    found = cp.Found(notes=[], layer_study=layers, layer_optimised=layers, lam_optimised=lam_optimised,
                     files={"layer study": tmp_path / "coperturbation-layer-study.png"})
    text = "\n".join(_studies_section(found))
    assert "Over 20 of the same sentences, optimised solver" in text and "| 0.6, second seed |" in text
    assert "reversed order between lambda = 0.1 and 1 in 7 of 20 sentences, and between the two seeds at 0.6 in 2 of 20" in text
    assert "The same with the optimised solver" in text and text.count("| head |") == 2
    assert text.count("![layer study](coperturbation-layer-study.png)") == 1


def test_the_layer_claim_is_read_for_each_solver():
    rng = np.random.default_rng(1)
    low = rng.uniform(0.2, 0.3, 60)
    rising = {"concentration": np.stack([low, low + 0.1 + rng.normal(0, 0.01, 60)], 1), "layers": np.array([1, 6])}
    flat = {"concentration": np.stack([low, low + rng.normal(0, 0.05, 60)], 1), "layers": np.array([1, 6])}
    rows = _claim_rows(cp.Found(notes=[], layer_study=rising, layer_optimised=flat))
    assert rows["Higher layers concentrate interest on fewer, more relevant words (5.3, Figure 5)"] == "holds"
    assert rows["Higher layers concentrate interest on fewer, more relevant words (5.3, Figure 5; the optimised solver)"].startswith("not separated")
