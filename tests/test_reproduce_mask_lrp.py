"""``heedful reproduce mask-lrp`` end to end on a tiny model: the report, its plots, the paper's
numbers beside ours, the random-mask ablation; and (slow) a rerun that reuses the results store."""

from __future__ import annotations

import csv
import re

import numpy as np
import pytest
from tiny import CORPUS, tiny_hf

from heedful.evaluate import ResultsStore
from heedful.lrp.masks import HeadMask
from heedful.reproduce import REPORTS, ReportSettings, report_writer
from heedful.reproduce import mask_lrp as report


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    root = tmp_path_factory.mktemp("mask-lrp")
    hf_model, tokenizer = tiny_hf("bert", "classification", initializer_range=0.2)
    hf_model.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    data = root / "reviews.csv"
    with open(data, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["text", "label"])
        for i in range(4):
            text = " ".join(CORPUS[i : i + 3])  # three sentences: well over 20 tokens
            writer.writerow([text, "POSITIVE" if i % 2 == 0 else "NEGATIVE"])
    mask = HeadMask.from_array(np.array([[1, 0, 0, 0], [0, 0, 0, 0]]), {"model": "tiny", "dataset": "reviews"})
    mask_path = mask.save(root / "mask.json")
    # the deeper classifier: a tiny Llama with a score head, and a mask with both kinds of heads (Table 3 runs on it)
    deep_model, deep_tokenizer = tiny_hf("llama", "classification", initializer_range=0.2)
    deep_model.save_pretrained(root / "deep")
    deep_tokenizer.save_pretrained(root / "deep")
    synt, pos = np.zeros((2, 4, 4), bool), np.zeros((2, 4), bool)
    synt[1, 2, 0], pos[0, 1], pos[1, 3] = True, True, True
    deep_mask = HeadMask(synt.any(-1) | pos, synt, pos, {"model": "deep", "dataset": "movies"}).save(root / "deep-mask.json")
    options = {
        "model": str(root / "model"),
        "datasets": [str(data)],
        "methods": ["random", "raw_attention", "chefer", "mask_lrp"],
        "head_mask": str(mask_path),
        "mask_seeds": 2,
        "random_seeds": 2,
        "batch_size": 2,
        "planted_model": "none",  # the planted section needs a decoder: tested on its own below
        "deep_model": str(root / "deep"),
        "deep_head_mask": str(deep_mask),
    }
    return root, options


def _counts(store_dir):
    with ResultsStore(store_dir) as store:
        return {t: store.db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in ("explanations", "metrics")}


def test_report_is_registered():
    assert REPORTS["mask-lrp"][0] == "mask_lrp"
    assert report_writer("mask-lrp") is report.write


@pytest.mark.slow  # ~10 s on an idle machine, several times that under load
def test_quick_report_on_tiny_model(setting, tmp_path):
    root, options = setting
    out, store = tmp_path / "results", tmp_path / "store"
    path = report.write(out, ReportSettings(n=3, quick=True, store=store, progress=False, options=options))
    assert path == out / "mask-lrp.md"
    text = path.read_text(encoding="utf-8")
    assert "smoke run" in text and "n = 3" in text
    assert "Table 1 analogue" in text and "Ours (Mask-LRP)" in text and "GAE [`chefer`]" in text
    assert "0.438" in text  # the paper's SST-2 AOPC of Mask-LRP, in the reference table
    assert "1 of 8 heads kept" in text and "12.5%" in text
    assert "random masks: mean ± std over seeds" in text and "no head kept" in text
    assert "Eq. 10 as written" in text and "Ours, the authors' code" in text and "mask_lrp (reference)" in text
    assert "## Headline ordering with 95 % bootstrap intervals" in text and "Adjacent pairs whose intervals overlap" in text
    assert "## Mask corruption (paper Figure 4)" in text and "| 25% |" in text
    assert "so the last column differs between methods" in text and "the input at 100 % keeps one token" in text
    assert "are this processor's: Chefer's z-rule shares" in text  # the rows that move with the kernels, named
    assert "precision@20 is not measured (planted section left out)" in text
    # Eq. 10's E_h over all heads beside the kept heads, in Table 1 and in words, for both models
    assert "Ours, E_h over all heads [`mask_lrp`, Eq. 10 as written, `heads_mean=\"all\"`]" in text
    readings = text[text.index("## E_h over the kept heads or over all heads"):]
    assert "is a reading of the paper" in readings and "deep " in readings.split("## ")[1]
    # the deeper classifier: its own Table 1, mask and per-block breakdown
    deep = text[text.index("## Table 1 on a deeper classifier: `deep`"):]
    deep = deep[: deep.index("\n## ", 5)]
    assert "kept 3 of 8 heads (37.5% mask rate)" in deep and "| block | heads kept | syntactic | positional | heads |" in deep
    assert "| 1 | 2 | 1 | 1 | 2, 3 |" in deep and "GAE [`chefer`]" in deep, deep
    # Table 3 in full where the ablations ran (the deep mask has both kinds; the main mask has no breakdown)
    table3 = text[text.index("## Table 3: without positional or without syntactic heads"):]
    table3 = table3[: table3.index("\n## ", 5)]
    assert "| Ours w/o M_pos | 1 |" in table3 and "| Ours w/o M_synt | 2 |" in table3 and "0.450 / -6.001 (-0.001 / +0.000)" in table3
    # Figure 6: decoded words, a row per baseline that ran
    figure = text[text.index("## One sentence, Mask-LRP against each baseline (paper Figure 6)"):]
    figure = figure[: figure.index("\n## ", 5)]
    assert "| GAE |" in figure and "| RawAtt |" in figure and "drawn with seed 0" in figure
    assert "▁" not in figure and "Ġ" not in figure and "##" not in figure[5:]
    claims = text[text.index("## Claims of the paper against this run"):]  # the report ends with the claims table
    assert "## " not in claims[3:] and "| The selected heads beat random heads" in claims and "cannot be tested here" in claims
    assert "heads_mean=\"all\"" in claims and "Dropping either mask type barely changes the result" in claims
    assert "deep " in claims  # the deeper classifier's rows join the claims
    coverage = text[text.index("## The paper's experiments here"):]
    assert "| Figure 6: Mask-LRP's scores minus each baseline's on one positive sentence | reproduced |" in coverage
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == [
        "mask-lrp-corruption.png", "mask-lrp-curves-reviews.png", "mask-lrp-deletion.png", "mask-lrp-figure6.png",
        "mask-lrp-heads.png", "mask-lrp-random-masks.png",
    ]
    for name in pngs:
        assert f"({name})" in text  # every plot is linked from the report


@pytest.mark.slow
def test_rerun_reuses_the_store(setting, tmp_path):
    _, options = setting
    out, store = tmp_path / "results", tmp_path / "store"
    settings = ReportSettings(n=3, quick=True, store=store, progress=False, options=options)
    report.write(out, settings)
    before = _counts(store)
    report.write(out, settings)
    assert _counts(store) == before  # every explanation and metric is read back, none computed again


def test_ranks_share_ties_and_follow_the_metric_direction():
    values = {"a": 0.41, "b": 0.43, "c": 0.4301, "d": float("nan")}
    assert report._ranks(values, higher_better=True) == {"a": 3, "b": 1, "c": 1}
    assert report._ranks({"a": -1.2, "b": -0.9}, higher_better=False) == {"a": 1, "b": 2}
    assert report._concordance({"a": 1.0, "b": 2.0, "c": 3.0}, {"a": 1.0, "b": 3.0, "c": 2.0}) == (2, 3)


def test_paper_table_is_complete():
    assert set(report.PAPER_ROWS.values()) == set(report.PAPER_TABLE1)
    for column in ("SST-2", "IMDB", "Yelp"):
        aopc = {row: cols[column][0] for row, cols in report.PAPER_TABLE1.items()}
        assert max(aopc, key=aopc.get) == "Ours (Mask-LRP)"  # the paper's claim, as transcribed


def test_unknown_option_is_refused(setting, tmp_path):
    from heedful.errors import InputError

    with pytest.raises(InputError, match="unknown mask-lrp report option"):
        report.write(tmp_path, ReportSettings(quick=True, store=tmp_path / "s", options={"bogus": 1}))


def test_unknown_section_is_refused(tmp_path):
    from heedful.errors import InputError

    with pytest.raises(InputError, match="unknown mask-lrp section 'table'"):
        report.write(tmp_path, ReportSettings(quick=True, store=tmp_path / "s", options={"only": "table"}))
    with pytest.raises(InputError, match="only=planted needs a planted_model"):
        report.write(tmp_path, ReportSettings(quick=True, store=tmp_path / "s", options={"only": "planted", "planted_model": "none"}))


def test_planted_section_alone_on_a_tiny_decoder(tmp_path):
    """``-O only=planted``: precision@20 of every planted method on planted documents, with
    bootstrap intervals, written to its own file (never the full report)."""
    hf_model, tokenizer = tiny_hf("llama", "causal_lm", max_position_embeddings=1024)
    tokenizer.model_max_length = 1024
    hf_model.save_pretrained(tmp_path / "decoder")
    tokenizer.save_pretrained(tmp_path / "decoder")
    options = {
        "only": "planted", "planted_model": str(tmp_path / "decoder"), "planted_n": 3, "planted_length": 450,
        "planted_methods": "saliency,grad_x_input", "random_seeds": 2,
    }
    out = tmp_path / "results"
    path = report.write(out, ReportSettings(quick=True, store=tmp_path / "store", progress=False, options=options))
    assert path == out / "mask-lrp-planted.md" and not (out / "mask-lrp.md").exists()
    text = path.read_text(encoding="utf-8")
    assert "## Token precision@20 on planted long contexts" in text and "3 documents of at most 450 tokens" in text
    assert "| saliency |" in text and "| grad_x_input |" in text and "Precision@20 intervals that overlap" in text
    assert "RawAtt 28.97 / 27.85" in text  # the paper's Table 2 (GPT-2 column) beside ours
    row = next(line for line in text.splitlines() if line.startswith("| grad_x_input |"))
    value, low, high = (float(v) for v in re.findall(r"(-?\d\.\d{3}) \[(-?\d\.\d{3}), (-?\d\.\d{3})\]", row)[0])
    assert 0.0 <= low <= value <= high <= 1.0


def test_examples_per_dataset():
    from heedful.errors import InputError

    plan = report._plan(ReportSettings(store="/tmp/unused", options={"dataset_n": "amazon:20,movies:7"}))
    assert (plan.n_for("amazon"), plan.n_for("movies"), plan.n_for("tweets")) == (20, 7, report.DEFAULT_N)
    default = report._plan(ReportSettings(store="/tmp/unused"))
    assert default.n_for("amazon") == 500 and default.n_for("movies") == report.DEFAULT_N
    assert report._plan(ReportSettings(n=9, store="/tmp/unused")).n_for("amazon") == 9  # an explicit n applies to every data set
    with pytest.raises(InputError, match="dataset_n"):
        report._plan(ReportSettings(store="/tmp/unused", options={"dataset_n": "amazon=20"}))
    with pytest.raises(InputError, match="corruption_seeds must be a positive whole number"):
        report._plan(ReportSettings(store="/tmp/unused", options={"corruption_seeds": "two"}))
    with pytest.raises(InputError, match="mask_seeds must be a positive whole number"):
        report._plan(ReportSettings(store="/tmp/unused", options={"mask_seeds": 0}))
    with pytest.raises(InputError, match="extras names 'imdb'"):
        report._plan(ReportSettings(store="/tmp/unused", options={"extras": "imdb"}))
    assert report._plan(ReportSettings(store="/tmp/unused", options={"extras": "none"})).extras == []


def _synthetic_run(dataset: str, gains: dict[str, float], n: int = 80, seed: int = 0):
    """A data set's run with per-example AOPC / LOdds for the paper's methods: ``gains[m]`` is the
    AOPC that method ``m`` adds over the examples' shared difficulty (LOdds falls by as much)."""
    from types import SimpleNamespace

    from heedful.reproduce.mask_lrp.run import _DatasetRun

    rng = np.random.default_rng(seed)
    difficulty = rng.normal(0.3, 0.1, n)
    values = {m: {"aopc": difficulty + g + rng.normal(0, 0.01, n), "log_odds": -difficulty - g + rng.normal(0, 0.01, n)}
              for m, g in gains.items()}
    groups = {m: SimpleNamespace(seeds=1, summaries={k: SimpleNamespace(value=float(v.mean()), std=0.0) for k, v in vs.items()})
              for m, vs in values.items()}
    result = SimpleNamespace(groups=groups, model_name="tiny@x")
    return _DatasetRun(dataset, result, [str(i) for i in range(n)], {}, values, {}, 0.0)


def test_claims_give_every_data_set_a_verdict_word_and_test_the_margin_on_paired_differences():
    from types import SimpleNamespace

    from heedful.reproduce.mask_lrp.claims import _claims_section
    from heedful.reproduce.mask_lrp.run import RANDOM_MASK
    from heedful.reproduce.toolkit import VERDICTS

    base = {"raw_attention": 0.0, "rollout": 0.01, "chefer": 0.05, "lrp": 0.02}
    movies = _synthetic_run("movies", {**base, "mask_lrp": 0.2, RANDOM_MASK: 0.0})  # far ahead: holds
    amazon = _synthetic_run("amazon", {**base, "mask_lrp": 0.0501, RANDOM_MASK: 0.05}, seed=1)  # level: not separated
    mask = SimpleNamespace(positional=np.array([1, 0]), syntactic=np.array([[0], [1]]), shape=(2, 1))
    lines = _claims_section([movies, amazon], mask, None, {})
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[1] for line in lines if line.startswith("| ") and " | " in line}
    assert all(any(v.startswith(w) for w in VERDICTS) for c, v in rows.items() if c != "claim (paper)"), rows
    beats = 'The selected heads beat random heads of the same rate (Table 1 "Random", Sec. 5.4 Q1)'
    assert rows[f"{beats} -- movies"] == "holds" and rows[f"{beats} -- amazon"].startswith("not separated")
    margin = "≥ 3.56 % better AOPC and LOdds than the best baseline (abstract, contribution 3; tested on the paired difference)"
    assert rows[f"{margin} -- movies"] == "holds"  # +0.15 against a margin of 3.56 % of 0.35
    assert rows[f"{margin} -- amazon"] == "does not hold"  # +0.0001 [-0.003, +0.003]: under a margin of 0.0125
    assert rows["Positional heads sit in earlier blocks, syntactic heads in later ones (Sec. 5.5, Figure 5)"] == "holds"


def _with_variants(run, shifts: dict[str, tuple[float, float]], noise: float = 0.01, seed: int = 3):
    """``run`` with Mask-LRP variants whose per-example AOPC / LOdds are Mask-LRP's shifted by
    ``shifts[label]`` (plus independent noise)."""
    from heedful.reproduce.mask_lrp.run import _Variant

    rng = np.random.default_rng(seed)
    for label, (da, dl) in shifts.items():
        values = {"aopc": run.values["mask_lrp"]["aopc"] + da + rng.normal(0, noise, len(run.ids)),
                  "log_odds": run.values["mask_lrp"]["log_odds"] + dl + rng.normal(0, noise, len(run.ids))}
        run.variants[label] = _Variant(label, ["key"], values, {m: [float(v.mean())] for m, v in values.items()}, {}, {}, 0.1, 1.0)
    return run


def test_table3_claim_gives_every_verdict_from_paired_differences_on_both_metrics():
    from heedful.reproduce.mask_lrp.claims import _table3_claim
    from heedful.reproduce.mask_lrp.run import NO_POSITIONAL, NO_SYNTACTIC

    def verdict(shifts, noise=0.01):
        run = _with_variants(_synthetic_run("movies", {"mask_lrp": 0.2}), shifts, noise)  # full: AOPC ~0.5, LOdds ~-0.5
        return str(_table3_claim(run)[0]), _table3_claim(run)[1]

    # margins ±0.025 on both metrics (5 % of 0.5)
    assert verdict({NO_POSITIONAL: (0.0, 0.0), NO_SYNTACTIC: (0.002, -0.002)})[0] == "holds"
    word, numbers = verdict({NO_POSITIONAL: (0.0, 0.0), NO_SYNTACTIC: (0.0, 0.2)})  # LOdds apart, beyond the margin
    assert word == "does not hold" and "w/o M_synt − full AOPC" in numbers and "LOdds +0.2" in numbers
    assert verdict({NO_POSITIONAL: (0.025, 0.0)})[0].startswith("not separated")  # the interval straddles the margin
    assert verdict({}).__getitem__(0).startswith("cannot be tested here")  # no ablation ran


def test_all_heads_claim_and_a_missing_deep_model_in_the_claims_table():
    from types import SimpleNamespace

    from heedful.reproduce.mask_lrp.claims import _claims_section
    from heedful.reproduce.mask_lrp.deep import _DeepRun
    from heedful.reproduce.mask_lrp.run import ALL_HEADS

    gains = {"raw_attention": 0.0, "chefer": 0.05, "mask_lrp": 0.0}
    movies = _with_variants(_synthetic_run("movies", gains), {ALL_HEADS: (0.1, -0.1)})  # all heads: ahead of GAE
    amazon = _with_variants(_synthetic_run("amazon", gains, seed=1), {ALL_HEADS: (0.05, -0.05)})  # level with GAE
    mask = SimpleNamespace(positional=np.array([1, 0]), syntactic=np.array([[0], [1]]), shape=(2, 1))
    missing = _DeepRun("smollm2-sentiment", None, missing="`smollm2-sentiment` is not built on this machine")
    lines = _claims_section([movies, amazon], mask, None, {}, missing)
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[1] for line in lines if line.startswith("| ") and " | " in line}
    all_heads = '… the same with Eq. 10\'s E_h over all heads (heads_mean="all"; a reading, see above)'
    assert rows[f"{all_heads} -- movies"] == "holds" and rows[f"{all_heads} -- amazon"].startswith("not separated")
    deep = "The Table 1 and Table 3 claims above on a deeper classifier (Table 1; here the analogue on `smollm2-sentiment`)"
    assert rows[deep] == "cannot be tested here (`smollm2-sentiment` is not built on this machine)"


def test_deep_model_options_and_what_it_cannot_run(monkeypatch, tmp_path):
    from types import SimpleNamespace

    from heedful import zoo
    from heedful.reproduce.mask_lrp.deep import _deep_run, supported

    plan = report._plan(ReportSettings(store="/tmp/unused"))
    assert (plan.deep_model, plan.deep_n, plan.deep_head_mask) == ("smollm2-sentiment", report.run.DEEP_N, None)
    assert plan.deep_methods == [m for m in report.run.METHODS if m in report.run.DEEP_METHODS]
    assert "integrated_gradients" not in plan.deep_methods and "mask_lrp" in plan.deep_methods
    quick = report._plan(ReportSettings(quick=True, store="/tmp/unused", options={"methods": "chefer", "deep_model": "none"}))
    assert quick.deep_model is None and quick.deep_n == 4 and quick.deep_methods == ["chefer", "mask_lrp"]
    # a zoo model that is not built is named, never built (that takes the better part of an hour)
    monkeypatch.setattr(zoo, "is_built", lambda name: False)
    monkeypatch.setattr("heedful.load", lambda *a, **k: pytest.fail("the report must not load or build it"))
    found = _deep_run(plan, None)
    assert found.run is None and found.missing == "`smollm2-sentiment` is not built on this machine (`heedful models build smollm2-sentiment` builds it)"
    # methods a model cannot run are left out with what it lacks
    adapter = SimpleNamespace(task="classification", provides=lambda need: need not in ("attentions", "attention_flow"))
    runs, skipped = supported(["raw_attention", "grad_x_input"], adapter)
    assert runs == ["grad_x_input"] and skipped == {"raw_attention": "needs attentions"}


def test_the_sample_line_says_when_a_split_ran_out():
    from types import SimpleNamespace

    from heedful.reproduce.mask_lrp.markdown import _sample_text

    def run(n):
        return SimpleNamespace(dataset="amazon", result=SimpleNamespace(n_examples=n, skipped={"shorter than 20 tokens": 254},
                                                                       spec=SimpleNamespace(split="test")))

    assert _sample_text(run(246), 500) == "all 246 test texts of amazon that are 20 tokens or longer (of 500; 500 asked for)"
    assert _sample_text(run(200), 200) == "the first 200 test texts of amazon that are 20 tokens or longer"
