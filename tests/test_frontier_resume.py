"""benchmarks/frontier.py keeps every method's explanations and metric values in a results store
as they finish: a second run computes no explanation, Ctrl-C keeps the finished methods and writes
no report, ``--share`` splits the methods between processes, and ``--report-only`` states the
sentences each method reached; its counterfactual values are the model's own behaviour on the
edited texts. On a tiny seeded model, a six-review CSV and a dictionary tagger for the
sampled-replacement operator and the counterfactual tests."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import write_reviews
from test_evaluate_operators import _words, dictionary_tagger  # noqa: F401  (a fixture, used below)

from heedful.evaluate.store import ResultsStore
from heedful.inside.counterfactual import Word

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import frontier  # noqa: E402
import frontier_store  # noqa: E402

pytestmark = pytest.mark.usefixtures("dictionary_tagger")


def _tagged(texts):
    """The dictionary tagger's words, each with its universal tag as its fine tag."""
    return [[Word(a, b, t[a:b], pos, pos) for a, b, pos in words] for t, words in zip(texts, _words(texts), strict=True)]


@pytest.fixture
def setting(tmp_path, monkeypatch, tiny):
    """The frontier on the tiny BERT (``tiny-bert``, six reviews, its F-Fidelity copy the same
    weights); returns the model, a counter of the methods it explained with, and the
    command-line arguments every run shares."""
    model = tiny("bert")
    calls: Counter = Counter()
    explain = model.explain

    def counted(texts, method, *args, **kwargs):
        calls[method] += 1
        return explain(texts, method, *args, **kwargs)

    monkeypatch.setattr(model, "explain", counted)
    monkeypatch.setattr(frontier, "MODELS", {"tiny-bert": 6})
    monkeypatch.setattr(frontier, "FFIDELITY", {"tiny-bert": "tiny-bert-ffidelity"})
    monkeypatch.setattr(frontier, "load_model", lambda name: model)
    monkeypatch.setattr(frontier, "is_built", lambda name: True)
    monkeypatch.setattr(frontier, "DATASET", write_reviews(tmp_path / "reviews.csv"))
    monkeypatch.setattr(frontier, "write_results", lambda path, text: path.write_text(text, encoding="utf-8"))
    monkeypatch.setattr(frontier_store, "counterfactual_tagger", _tagged)
    base = ["--store", str(tmp_path / "store"), "--out", str(tmp_path / "frontier.md"), "--front", str(tmp_path / "frontier.json"),
            "--threads", "1", "--batch-size", "4", "--samples", "2", "--progress", "never"]
    return model, calls, base


def _rows(path: Path) -> dict[str, str]:
    """The report's table rows by method."""
    return {line.split("`")[1]: line for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("| `")}


def test_a_second_run_computes_no_explanation_and_writes_the_same_table(setting, tmp_path):
    _, calls, base = setting
    args = [*base, "--methods", "saliency,random"]
    assert frontier.main(args) == 0
    assert set(calls) == {"saliency", "random"}
    first = _rows(tmp_path / "frontier.md")
    assert set(first) == {"saliency", "random"}
    assert "FFid+" in (tmp_path / "frontier.md").read_text(encoding="utf-8")
    calls.clear()
    (tmp_path / "frontier.md").unlink()
    assert frontier.main(args) == 0
    assert not calls  # every explanation and value came from the store
    assert _rows(tmp_path / "frontier.md") == first


def test_an_interrupted_run_keeps_the_finished_methods_and_writes_no_report(setting, tmp_path, monkeypatch, capsys):
    model, calls, base = setting
    counted = model.explain

    def stopped(texts, method, *args, **kwargs):
        if method == "saliency":  # run after random (cheaper by its cost model)
            raise KeyboardInterrupt
        return counted(texts, method, *args, **kwargs)

    monkeypatch.setattr(model, "explain", stopped)
    args = [*base, "--methods", "saliency,random"]
    assert frontier.main(args) == 130
    assert calls["random"] > 0
    assert not (tmp_path / "frontier.md").exists() and not (tmp_path / "frontier.json").exists()
    err = capsys.readouterr().err
    assert "interrupted: kept 0 of 6 examples of saliency" in err and "nothing was written to" in err
    monkeypatch.setattr(model, "explain", counted)
    calls.clear()
    assert frontier.main(args) == 0
    assert set(calls) == {"saliency"}  # random was kept whole: not explained again
    assert set(_rows(tmp_path / "frontier.md")) == {"saliency", "random"}


def test_shares_split_the_methods_and_the_report_comes_from_the_store(setting, tmp_path):
    _, calls, base = setting
    methods = ["--methods", "saliency,random,grad_x_input"]
    assert frontier.main([*base, *methods, "--share", "0/2"]) == 0
    assert set(calls) == {"random", "saliency"}  # cheapest first: random, grad_x_input, saliency -> 0 and 2
    assert not (tmp_path / "frontier.md").exists()  # a share writes no report
    calls.clear()
    assert frontier.main([*base, *methods, "--share", "1/2"]) == 0
    assert set(calls) == {"grad_x_input"}
    calls.clear()
    assert frontier.main([*base, *methods, "--report-only"]) == 0
    assert not calls
    assert set(_rows(tmp_path / "frontier.md")) == {"saliency", "random", "grad_x_input"}


def test_the_report_from_the_store_states_the_sizes_reached(setting, tmp_path):
    _, calls, base = setting
    assert frontier.main([*base, "--methods", "random"]) == 0
    assert frontier.main([*base, "--methods", "saliency", "--n", "3"]) == 0
    calls.clear()
    assert frontier.main([*base, "--methods", "random,saliency", "--report-only"]) == 0
    assert not calls
    text = (tmp_path / "frontier.md").read_text(encoding="utf-8")
    rows = _rows(tmp_path / "frontier.md")
    assert "| **3 of 6** |" in rows["saliency"] and "| 6 |" in rows["random"]
    assert "Sentences reached: all 6 by 1 of 2 methods; fewer by (bold in the table, scored on the sentences they have): `saliency` 3." in text
    assert "from the results store as it stood" in text
    methods = json.loads((tmp_path / "frontier.json").read_text(encoding="utf-8"))["tasks"]["classification"]["methods"]
    assert methods["saliency"]["examples"] == 3 and "examples" not in methods["random"]


def test_a_report_from_an_empty_store_writes_nothing(setting, tmp_path):
    _, calls, base = setting
    assert frontier.main([*base, "--methods", "random", "--report-only"]) == 2
    assert not (tmp_path / "frontier.md").exists() and not calls


def _untimed(rows: dict[str, str]) -> dict[str, list[str]]:
    """Table rows without their measured wall time (the sixth column, s / sentence)."""
    return {m: [c for k, c in enumerate(row.split("|")) if k != 6] for m, row in rows.items()}


def _rebuilt_copy(model):
    """The F-Fidelity copy as another machine builds it: the same model with other weights (its
    classifier weights scaled), so its fingerprint and the hash its values are stored under differ."""
    import copy

    from heedful import fingerprint

    rebuilt = copy.deepcopy(model)
    if hasattr(rebuilt.adapter, fingerprint._CACHED):
        delattr(rebuilt.adapter, fingerprint._CACHED)
    with torch.no_grad():
        rebuilt.hf_model.classifier.weight.mul_(1.5)
    return rebuilt


def test_measure_stored_fills_a_rebuilt_copys_values_without_explaining_again(setting, tmp_path, monkeypatch, capsys):
    """A store whose F-Fidelity values were measured on another copy is reported as it was, the
    copy it was measured on named; with --measure-stored it explains nothing, measures the stored
    explanations on the rebuilt copy, and then writes the table a run on that copy from the start
    writes."""
    model, calls, base = setting
    rebuilt = _rebuilt_copy(model)
    methods = ["--methods", "saliency,random"]
    fresh = [*base[:1], str(tmp_path / "fresh"), *base[2:]]
    monkeypatch.setattr(frontier, "load_model", lambda name: rebuilt if name.endswith("-ffidelity") else model)
    assert frontier.main([*fresh, *methods]) == 0  # the rebuilt copy from the start
    expected = _untimed(_rows(tmp_path / "frontier.md"))
    monkeypatch.setattr(frontier, "load_model", lambda name: model)
    assert frontier.main([*base, *methods]) == 0  # the store as the first machine left it
    first = _untimed(_rows(tmp_path / "frontier.md"))
    assert first != expected and "as the store holds it" not in (tmp_path / "frontier.md").read_text(encoding="utf-8")
    monkeypatch.setattr(frontier, "load_model", lambda name: rebuilt if name.endswith("-ffidelity") else model)
    capsys.readouterr()
    assert frontier.main([*base, *methods, "--report-only"]) == 0  # the first copy's values: the rebuilt one has none
    assert _untimed(_rows(tmp_path / "frontier.md")) == first
    text = (tmp_path / "frontier.md").read_text(encoding="utf-8")
    digests = [frontier_store.model_fingerprint(m).digest for m in (model, rebuilt)]
    assert (f"as the store holds it: 12 FFid+ values measured on the copy with weights `{digests[0]}`, fine-tuned on another machine" in text
            and f"This machine's copy has weights `{digests[1]}` and 0 values" in text)
    calls.clear()
    assert frontier.main([*base, *methods, "--measure-stored"]) == 0
    assert not calls  # nothing explained again
    assert "F-Fidelity of 6 stored explanations" in capsys.readouterr().err
    assert _untimed(_rows(tmp_path / "frontier.md")) == expected  # as many values on this machine's copy: it is read
    text = (tmp_path / "frontier.md").read_text(encoding="utf-8")
    assert "measuring what its stored explanations lacked" in text and "as the store holds it" not in text


def test_a_store_moved_to_a_machine_without_the_copy_reads_the_stored_f_fidelity(setting, tmp_path, monkeypatch):
    """Where the fine-tuned copy is not built, --report-only still reads the F-Fidelity values the
    store holds (the table is the one the measuring machine wrote) and names their copy; with no
    values stored either, it says the copy is not built."""
    model, _, base = setting
    methods = ["--methods", "saliency,random"]
    assert frontier.main([*base, *methods]) == 0
    expected = _untimed(_rows(tmp_path / "frontier.md"))
    monkeypatch.setattr(frontier, "is_built", lambda name: not name.endswith("-ffidelity"))
    assert frontier.main([*base, *methods, "--report-only"]) == 0
    assert _untimed(_rows(tmp_path / "frontier.md")) == expected
    text = (tmp_path / "frontier.md").read_text(encoding="utf-8")
    assert f"the copy with weights `{frontier_store.model_fingerprint(model).digest}`" in text and "This machine's copy is not built here (`heedful models build tiny-bert-ffidelity`)" in text
    empty = [*base[:1], str(tmp_path / "other"), *base[2:]]
    assert frontier.main([*empty, *methods]) == 0
    assert "F-Fidelity: not measured (`tiny-bert-ffidelity` is not built: `heedful models build tiny-bert-ffidelity`)." in (
        tmp_path / "frontier.md").read_text(encoding="utf-8")


def test_the_report_compares_the_copies_the_store_holds_f_fidelity_of(setting, tmp_path, monkeypatch):
    """With F-Fidelity stored on two copies, the report reads one and sets the other against it:
    the Spearman correlation of the rows' means and the largest difference of a row's mean are
    those of the stored values, computed here row by row."""
    from scipy.stats import spearmanr

    model, _, base = setting
    rebuilt = _rebuilt_copy(model)
    rows = ["saliency", "random", "grad_x_input"]
    assert frontier.main([*base, "--methods", ",".join(rows)]) == 0
    monkeypatch.setattr(frontier, "load_model", lambda name: rebuilt if name.endswith("-ffidelity") else model)
    assert frontier.main([*base, "--methods", ",".join(rows), "--measure-stored"]) == 0
    text = (tmp_path / "frontier.md").read_text(encoding="utf-8")
    front = frontier_store.model_frontier("tiny-bert", model, 6, tmp_path / "store", frontier.DATASET, frontier.SPLIT, 4, rebuilt, 2)
    assert front.ffid_read.local  # a tie: this machine's copy is read
    digests = [frontier_store.model_fingerprint(m).digest for m in (model, rebuilt)]
    assert f"F-Fidelity on another copy the store holds, weights `{digests[0]}` (18 FFid+ values; the table reads `{digests[1]}`)" in text
    hashes = [frontier_store.ffidelity_hash(m, front.ffid[1], 2)[0] for m in (rebuilt, model)]
    with ResultsStore(tmp_path / "store") as store:
        for metric, label in (("ffid_plus", "FFid+"), ("ffid_minus", "FFid-")):
            means = []
            for h in hashes:
                got = [store.get_metrics(front.run(m).key, metric, h, front.ids) for m in rows]
                means.append([sum(g[i][0] for i in front.ids) / len(front.ids) for g in got])
            rho = spearmanr(means[0], means[1]).statistic
            gaps = [b - a for a, b in zip(*means, strict=True)]
            far = max(range(len(rows)), key=lambda k: abs(gaps[k]))
            assert f"{label}: 3 rows, Spearman {rho:.3f}, largest difference of a row's mean {gaps[far]:+.4f} (`{rows[far]}`)" in text


def test_measure_stored_cuts_batches_as_the_run_that_stored_them(setting, tmp_path, monkeypatch):
    """A row stored at --n 5 (batches of 4: the second holds one sentence) and measured on the
    copy later by --measure-stored at the full 6 gets the F-Fidelity values a run at --n 5 with the
    copy built stores: batches are cut from the stored ids, so every sentence keeps its neighbours."""
    model, calls, base = setting
    fresh = [*base[:1], str(tmp_path / "fresh"), *base[2:]]
    assert frontier.main([*fresh, "--methods", "random", "--n", "5"]) == 0  # the copy built from the start
    monkeypatch.setattr(frontier, "is_built", lambda name: not name.endswith("-ffidelity"))
    assert frontier.main([*base, "--methods", "random", "--n", "5"]) == 0
    monkeypatch.setattr(frontier, "is_built", lambda name: True)
    calls.clear()
    assert frontier.main([*base, "--methods", "random", "--measure-stored"]) == 0
    assert not calls
    values = []
    for folder in (tmp_path / "fresh", tmp_path / "store"):
        front = frontier_store.model_frontier("tiny-bert", model, 6, folder, frontier.DATASET, frontier.SPLIT, 4, model, 2)
        with ResultsStore(folder) as store:
            run = front.run("random")
            assert store.explanation_ids(run.key, front.ids) == set(front.ids[:5])
            got = store.get_metrics(run.key, "ffid_plus", front.ffid[2], front.ids)
            assert set(got) == set(front.ids[:5])
            values.append([got[i][0] for i in front.ids[:5]])
    assert values[0] == values[1]


def test_measure_stored_and_report_only_are_refused_together(setting, capsys):
    _, _, base = setting
    with pytest.raises(SystemExit) as exc:
        frontier.main([*base, "--report-only", "--measure-stored"])
    assert exc.value.code == 2 and "drop --measure-stored" in capsys.readouterr().err


@torch.no_grad()
def _p(model, text: str) -> np.ndarray:
    enc = model.tokenizer(text, return_tensors="pt")
    return torch.softmax(model.hf_model(**enc).logits[0].double(), -1).numpy()


def test_counterfactual_values_are_the_models_behaviour_on_the_edited_texts(setting, tmp_path):
    model, _, base = setting
    assert frontier.main([*base, "--methods", "saliency"]) == 0
    assert "cf. replace" in (tmp_path / "frontier.md").read_text(encoding="utf-8")
    front, *_ = frontier.setup("tiny-bert", 6, frontier.arguments(base))
    key, cf = front.run("saliency").key, front.counterfactual
    with ResultsStore(front.store) as store:
        stored = {m: store.get_metrics(key, m, cf.hash, front.ids) for m in frontier_store.COUNTERFACTUAL}
        explained = store.get_explanations(key, front.ids)
    tested = 0
    for edit, metric in zip(frontier_store.COUNTERFACTUAL_EDITS, frontier_store.COUNTERFACTUAL, strict=True):
        for item, words in zip(front.inputs, _tagged([i.text for i in front.inputs]), strict=True):
            value, _, extra = stored[metric][item.id]
            if extra is None:
                assert np.isnan(value)
                continue
            # the top word: the content word whose first tokens score highest (a plain loop)
            expl = explained[item.id]
            score = dict.fromkeys(range(len(words)), 0.0)
            for t, offset in enumerate(expl.offsets):
                for w, word in enumerate(words):
                    if offset is not None and not expl.special[t] and word.start <= offset[0] < word.end:
                        score[w] += float(expl.scores[t])
            content = [w for w, word in enumerate(words) if word.pos in ("ADJ", "NOUN", "VERB", "ADV") and (edit == "replace" or word.pos == "ADJ")]
            assert extra["top"][0] == words[max(content, key=lambda w: (score[w], -w))].text
            before = _p(model, item.text)
            c = int(before.argmax())
            drops = [before[c] - _p(model, text)[c] for text in extra["texts"]]
            assert drops == pytest.approx([extra["drop"], extra["control_drop"]], abs=1e-5)
            assert value == float(drops[0] > drops[1] + 0.05)
            tested += 1
    assert tested >= 4


def test_counterfactual_values_resumed_on_some_sentences_equal_those_of_one_pass(setting, tmp_path):
    _, _, base = setting
    assert frontier.main([*base, "--methods", "saliency"]) == 0
    front, *_ = frontier.setup("tiny-bert", 6, frontier.arguments(base))
    run, cf = front.run("saliency"), front.counterfactual
    with ResultsStore(front.store) as store:
        whole = {m: store.get_metrics(run.key, m, cf.hash, front.ids) for m in frontier_store.COUNTERFACTUAL}
        with store.transaction():
            store.db.execute("DELETE FROM metrics WHERE metric LIKE 'counterfactual_%' AND example_id IN (?, ?, ?)", front.ids[1::2])
        assert frontier_store.store_counterfactual(store, front, run) == 3
        again = {m: store.get_metrics(run.key, m, cf.hash, front.ids) for m in frontier_store.COUNTERFACTUAL}
    for m in whole:
        for i in front.ids:
            (v, _, extra), (w, _, kept) = again[m][i], whole[m][i]
            assert v == w or (np.isnan(v) and np.isnan(w))
            if extra is None:
                assert kept is None
                continue
            # the same draws, edited texts and verdicts; the drops to float32 rounding (other batches)
            assert {k: extra[k] for k in ("top", "control", "texts")} == {k: kept[k] for k in ("top", "control", "texts")}
            assert [extra["drop"], extra["control_drop"]] == pytest.approx([kept["drop"], kept["control_drop"]], abs=1e-5)


def test_the_targets_compare_two_methods_over_the_sentences_both_have():
    n = 8
    beam = np.array([0.9, 0.9, 0.9, 0.9] + [np.nan] * 4)  # heedful's, measured on half the sentences
    lime = np.array([0.5, 0.5, 0.5, 0.5, 0.95, 0.95, 0.95, 0.95])  # a peer's: mean 0.725 over all 8
    found = {"aopc_mask": {"solvability_beam": beam, "lime": lime}}
    lines = frontier.targets(found, {"solvability_beam": 1000.0, "lime": 100.0}, {"solvability_beam": 4, "lime": 8}, n)
    # over all of lime's sentences beam would be 124 % of it; over the four both have, 180 %
    assert "0.900 [0.900, 0.900] against `lime` (Captum, Inseq, ferret) 0.500 [0.500, 0.500], over the 4 sentences both have: 180.0% of it" in lines[0]
    assert "`solvability_beam` (on 4 of 8 sentences) 0.900" in lines[2] and "`lime` 0.500 (55.6%, over the 4 sentences both have)" in lines[2]
    # the cheap method's paired difference from the best, over the same four sentences
    assert "paired difference -0.400 [-0.400, -0.400], 55.6% to 55.6% of the best." in lines[2]


def test_the_cheap_target_costs_both_rows_over_the_sentences_both_have():
    n = 8
    beam = np.array([0.9, 0.9, 0.9, 0.9] + [np.nan] * 4)  # the best row, on the four shorter sentences
    lazy = np.array([0.88, 0.86, 0.87, 0.87, 0.5, 0.5, 0.5, 0.5])
    found = {"aopc_mask": {"solvability_beam": beam, "solvability_beam[beam=1,shortlist=2]": lazy}}
    costs = {"solvability_beam": 900.0, "solvability_beam[beam=1,shortlist=2]": 140.0}  # each over its own sentences
    reached = {"solvability_beam": 4, "solvability_beam[beam=1,shortlist=2]": 8}
    # the row's cost over all its sentences is above a tenth of the best's; over the four both have it is not
    assert "no method costs a tenth of that" in frontier.targets(found, costs, reached, n)[-1]
    per = {"solvability_beam": beam * 0 + 900.0, "solvability_beam[beam=1,shortlist=2]": np.array([80.0] * 4 + [200.0] * 4)}
    line = frontier.targets(found, costs, reached, n, per)[-1]
    assert "**holds**" in line and "at 900 forward passes; closest at <= 90: `solvability_beam[beam=1,shortlist=2]` 0.870 (96.7%" in line
    assert "at 80 (over the 4 sentences both have; over all its own 8: 140)" in line
    per["solvability_beam[beam=1,shortlist=2]"][0] = np.nan  # a sentence without a cost record: the rows' own costs
    assert "no method costs a tenth of that" in frontier.targets(found, costs, reached, n, per)[-1]


def test_target_one_judges_the_named_evaluations_and_picks_the_row_closest_to_holding():
    lime = np.array([0.50, 0.52, 0.48, 0.50, 0.51, 0.49])
    found = {
        "aopc_mask": {"solvability_beam": lime * 1.30, "solvability_beam[objective=both]": lime * 1.12, "lime": lime},
        "sufficiency_mask": {"solvability_beam": lime * 0 + 0.30, "solvability_beam[objective=both]": lime * 0, "lime": lime * 0 + 0.01},
        "counterfactual_replace": {"solvability_beam": lime * 0, "solvability_beam[objective=both]": lime * 0, "lime": lime * 0 + 1.0},
    }
    costs = {"solvability_beam": 1000.0, "solvability_beam[objective=both]": 2000.0, "lime": 100.0}
    line = frontier.targets(found, costs, dict.fromkeys(costs, 6), 6)[0]
    # the default beam has the larger margin but is worse on sufficiency, which the target names;
    # the combined row is worse only on the counterfactual test, which it does not name
    assert "**holds**" in line and "Closest (the row that holds" in line and "`solvability_beam[objective=both]`" in line
    assert "worse on evaluations the target does not name: cf. replace" in line
    found["aopc_mask"]["solvability_beam[objective=both]"] = lime * 1.05
    line = frontier.targets(found, costs, dict.fromkeys(costs, 6), 6)[0]
    assert "**does not hold**" in line and "`solvability_beam[objective=both]` 0.525" in line and "105.0% of it" in line


def test_target_one_does_not_hold_for_a_row_f_fidelity_has_not_reached():
    lime = np.array([0.50, 0.52, 0.48, 0.50, 0.51, 0.49])
    found = {
        "aopc_mask": {"solvability_beam": lime * 1.30, "lime": lime},
        "ffid_plus": {"solvability_beam": lime * np.nan, "lime": lime * 0 + 0.2},
        "ffid_minus": {"solvability_beam": lime * np.nan, "lime": lime * 0 + 0.1},
    }
    costs = {"solvability_beam": 1000.0, "lime": 100.0}
    line = frontier.targets(found, costs, dict.fromkeys(costs, 6), 6)[0]
    assert "**does not hold**" in line and "130.0% of it, intervals apart" in line
    assert "not worse (paired) on any of them measured; not measured for both: FFid+, FFid-" in line
    found["ffid_plus"]["solvability_beam"] = lime * 0 + 0.3
    found["ffid_minus"]["solvability_beam"] = lime * 0 + 0.05
    line = frontier.targets(found, costs, dict.fromkeys(costs, 6), 6)[0]
    assert "**holds**" in line and "not worse (paired) on any of them." in line


def test_a_row_with_options_is_measured_and_reported_apart_from_the_defaults(setting, tmp_path, capsys):
    model, calls, base = setting
    rows = "random,solvability_beam,solvability_beam[objective=both]"
    assert frontier.main([*base, "--methods", rows]) == 0
    assert calls["solvability_beam"] == 2 * 2  # each row explained its two model batches of the six reviews
    reported = _rows(tmp_path / "frontier.md")
    assert set(reported) == {"random", "solvability_beam", "solvability_beam[objective=both]"}
    assert reported["solvability_beam[objective=both]"].split(" | ")[1] == "heedful"
    front = frontier_store.model_frontier("tiny-bert", model, 6, tmp_path / "store", frontier.DATASET, "test", 4)
    default, both = front.run("solvability_beam"), front.run("solvability_beam[objective=both]")
    assert default.key != both.key and both.options["objective"] == "both" and "objective" not in default.options
    with frontier_store.ResultsStore(tmp_path / "store") as store:
        ids = front.ids
        assert len(store.explanation_ids(default.key, ids)) == len(store.explanation_ids(both.key, ids)) == 6
    methods = json.loads((tmp_path / "frontier.json").read_text(encoding="utf-8"))["tasks"]["classification"]["methods"]
    assert methods["solvability_beam[objective=both]"]["options"] == {"objective": "both"} and "options" not in methods["solvability_beam"]
    calls.clear()
    assert frontier.main([*base, "--methods", rows]) == 0 and not calls  # both rows resumed from the store
    capsys.readouterr()
    assert frontier.main([*base, "--methods", "saliency[steps=3]"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "steps" in err and "Traceback" not in err


def test_the_ceiling_script_refuses_a_search_it_cannot_run_in_one_line(capsys):
    import aopc_ceiling  # benchmarks/, on the path above

    for bad in ("40", "0"):
        with pytest.raises(SystemExit) as info:
            aopc_ceiling.arguments(["--max-tokens", bad])
        assert info.value.code == 2
        assert capsys.readouterr().err.strip().splitlines()[-1].endswith(f"--max-tokens must be 1 to 20 (2^M forward passes per sentence), got {bad}")
    assert aopc_ceiling.arguments(["--max-tokens", "12"]).max_tokens == 12


def test_the_search_optimality_script_reorders_what_the_store_holds(setting, tmp_path, monkeypatch, capsys):
    import search_optimality  # benchmarks/, on the path above

    model, calls, base = setting
    defaults = [a for k, a in enumerate(base) if a not in ("--samples", "--batch-size") and base[k - 1] not in ("--samples", "--batch-size")]
    assert frontier.main([*defaults, "--methods", "random,saliency"]) == 0  # the script reads the frontier's defaults
    for name, value in (("MODEL", "tiny-bert"), ("MODELS", frontier.MODELS), ("PEER", "saliency"),
                        ("write_results", lambda path, text: path.write_text(text, encoding="utf-8"))):
        monkeypatch.setattr(search_optimality, name, value)
    out = tmp_path / "optimality.md"
    common = ["--n", "6", "--pool", "3", "--store", str(tmp_path / "store"), "--out", str(out), "--threads", "1", "--progress", "never"]
    assert search_optimality.main(["--rows", "random", *common]) == 0
    rows = {line.split("|")[1].strip(): line.split("|") for line in out.read_text(encoding="utf-8").splitlines() if line.startswith("| `")}
    assert set(rows) == {"`random`", "`saliency`"}  # the peer row is always read
    for cells in rows.values():
        stored, best, gain = (float(cells[k].split()[0]) for k in (4, 5, 6))
        assert best >= stored - 1e-6 and gain == pytest.approx(best - stored, abs=1e-3)  # its own order is one of those searched
    assert "differ from the search's values by at most" in out.read_text(encoding="utf-8")
    capsys.readouterr()
    assert search_optimality.main(["--rows", "lime", *common]) == 2  # nothing stored of it: one line, the file kept
    err = capsys.readouterr().err
    assert err.startswith("error: the store holds no explanation of lime") and "Traceback" not in err
    with pytest.raises(SystemExit) as info:
        search_optimality.arguments(["--pool", "30"])
    assert info.value.code == 2
