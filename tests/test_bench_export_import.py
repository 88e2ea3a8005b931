"""Columnar export of a results store and import of explanations computed elsewhere.

The export read back (pandas, pyarrow, CSV) equals what the store holds, value for value; its
manifest names the version, fingerprints, options, seeds, protocols and machine. Importing a
heedful method's own exported explanations scores exactly like the method itself; Captum's
attribution tensors and Inseq's saved files are aligned to the model's tokens with their values
unchanged; explanations that cannot be aligned fail with one line naming the example and the
position; Parquet without pyarrow is a one-line error naming the extra.
"""

from __future__ import annotations

import csv
import json
import math
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import run_cli, saved_tiny

import heedful
from heedful.engine.precision import support
from heedful.evaluate import (
    ResultsStore,
    export_store,
    from_captum,
    from_inseq,
    from_json,
    from_parquet,
    from_records,
    get_protocol,
)
from heedful.evaluate.alignment import AlignmentError
from heedful.evaluate.bench import BenchSpec, run_bench
from heedful.evaluate.bench_import import ImportSpec, run_import
from heedful.evaluate.export import COLUMNS, arrow_schema, distinct_runs
from heedful.fingerprint import model_fingerprint

ROWS = [
    ("a charming and often affecting journey", "POSITIVE"),
    ("the movie was dull and far too long", "NEGATIVE"),
    ("an intelligent , funny and moving film", "POSITIVE"),
    ("what a waste of a talented cast", "NEGATIVE"),
    ("a dull , boring plot", "NEGATIVE"),
]
METRICS = ["aopc", "sufficiency"]
DOCS = Path(__file__).resolve().parents[1] / "docs"


def _write_csv(path: Path) -> str:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["text", "label"])
        writer.writerows(ROWS)
    return str(path)


def _bench(model, data: str, out: Path, methods=("grad_x_input", "random")):
    spec = BenchSpec(
        model=model, dataset=data, methods=list(methods), metrics=METRICS,
        protocol=get_protocol("default", random_seeds=2), out=out, batch_size=4,
    )
    return run_bench(spec, progress=False)


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    """A store of grad_x_input and the random baseline (2 seeds) on five reviews, and its
    Parquet and CSV exports."""
    from conftest import cached_model

    folder = tmp_path_factory.mktemp("bench")
    model = cached_model("bert")
    data = _write_csv(folder / "reviews.csv")
    result = _bench(model, data, folder / "store")
    parquet = export_store(folder / "store", folder / "export.parquet")
    table = export_store(folder / "store", folder / "export.csv", format="csv")
    return {"model": model, "data": data, "result": result, "store": folder / "store", "parquet": parquet, "csv": table, "folder": folder}


def _stored_rows(store_path: Path) -> dict[tuple[str, str, str], tuple[float, list | None]]:
    """(run, metric, example) -> (value, curve) straight from the store."""
    found = {}
    with ResultsStore(store_path) as store:
        for key in distinct_runs(store):
            for metric, phash, _ in store.metric_counts(key):
                for ident, (value, curve, _extra) in store.get_metrics(key, metric, phash).items():
                    found[(key.digest, metric, ident)] = (value, curve)
    return found


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


# ---------------------------------------------------------------------------- export
def test_parquet_export_reads_back_equal_to_the_store(bench):
    import pyarrow as pa
    import pyarrow.parquet as pq

    frame = pd.read_parquet(bench["parquet"].path)
    assert list(frame.columns) == [name for name, _, _ in COLUMNS]
    assert pq.read_schema(bench["parquet"].path).equals(arrow_schema(pa))
    stored = _stored_rows(bench["store"])
    assert len(frame) == len(stored) == bench["parquet"].rows == 3 * len(ROWS) * len(METRICS)  # grad_x_input + 2 seeds
    for row in frame.itertuples():
        value, curve = stored[(row.run, row.metric, row.example_id)]
        assert _same(float("nan") if row.value is None else row.value, value)
        assert (row.curve is None and curve is None) or np.array_equal(np.asarray(row.curve, dtype=float), np.asarray(curve, dtype=float), equal_nan=True)
    with ResultsStore(bench["store"]) as store:
        for key in distinct_runs(store):
            explanations = store.get_explanations(key)
            mine = frame[frame.run == key.digest]
            assert set(mine.example_id) == set(explanations)
            for row in mine.itertuples():
                expl = explanations[row.example_id]
                assert list(row.tokens) == expl.tokens and list(row.scores) == expl.scores.tolist()
                assert row.text == expl.text and list(row.target_indices) == expl.target.indices
                assert [None if o is None else tuple(o) for o in row.offsets] == expl.offsets
    seeds = frame[frame.method == "random"].groupby("seed").size()
    assert sorted(seeds.index) == [0, 1]
    assert set(frame.source) == {"heedful"} and frame.precision.isna().all()
    assert list(frame[frame.run == frame.run.iloc[0]].drop_duplicates("example_id").example_index) == list(range(len(ROWS)))


def test_csv_export_holds_the_same_rows_with_lists_as_json(bench):
    parquet = pd.read_parquet(bench["parquet"].path)
    table = pd.read_csv(bench["csv"].path, keep_default_na=False, na_values=[""])
    assert list(table.columns) == list(parquet.columns) and len(table) == len(parquet) == bench["csv"].rows
    for a, b in zip(parquet.itertuples(), table.itertuples(), strict=True):
        assert (a.run, a.method, str(a.example_id), a.metric) == (b.run, b.method, str(b.example_id), b.metric)
        assert _same(a.value, float(b.value))
        assert json.loads(b.tokens) == list(a.tokens) and json.loads(b.scores) == list(a.scores)
        assert json.loads(b.options) == json.loads(a.options)


def test_manifest_names_version_fingerprints_options_seeds_and_machine(bench):
    manifest = json.loads(bench["parquet"].manifest.read_text())
    assert bench["parquet"].manifest.name == "export.manifest.json"
    assert manifest["heedful_version"] == heedful.__version__ and manifest["rows"] == bench["parquet"].rows
    assert manifest["models"][0]["fingerprint"] == model_fingerprint(bench["model"]).digest
    assert set(manifest["models"][0]["parts"]) == {"weights", "config", "tokenizer"}
    assert manifest["datasets"][0]["fingerprint"] == bench["result"].runs[0].key.dataset_fingerprint
    assert manifest["seeds"] == [0, 1] and manifest["metrics"] == sorted(METRICS)
    assert manifest["protocols"][0]["name"].startswith("default") and manifest["protocols"][0]["fields"]["label"] == "predicted"
    methods = {r["method"]: r for r in manifest["runs"]}
    assert methods["grad_x_input"]["options"] == json.loads(bench["result"].runs[0].key.options)
    assert methods["grad_x_input"]["examples"] == len(ROWS) and methods["grad_x_input"]["cost"]["examples"] == len(ROWS)
    assert {m["metric"] for m in methods["grad_x_input"]["metrics"]} == set(METRICS)
    assert {"platform", "cpu", "cores", "torch", "threads", "python"} <= set(manifest["machine"])
    assert manifest["machine"]["torch"] == torch.__version__
    assert [c["name"] for c in manifest["columns"]] == [name for name, _, _ in COLUMNS]


TINY = {
    'heedful.load("minilm-sentiment")': 'heedful.testing.conformance_model("bert")',
    'heedful.load("smollm2-135m")': 'heedful.testing.conformance_model("gpt2", "causal_lm")',
}


def _doc_blocks(section: str) -> list[str]:
    """The python blocks of docs/bench.md's ``section``: ``export`` (up to "## Dump and load"),
    ``dump`` (up to "## Import"), ``import`` (up to "## Lower precision") or ``precision`` (the rest)."""
    text = (DOCS / "bench.md").read_text(encoding="utf-8")
    export, _, rest = text.partition("## Dump and load")
    dump, _, rest = rest.partition("## Import")
    imports, _, precision = rest.partition("## Lower precision")
    part = {"export": export, "dump": dump, "import": imports, "precision": precision}[section]
    return re.findall(r"```python\n(.*?)```", part, re.S)


def test_docs_load_the_export_in_pandas_and_duckdb(bench, tmp_path):
    """docs/bench.md's export blocks run as written against exports at results/bench.*."""
    (tmp_path / "results").mkdir()
    export_store(bench["store"], tmp_path / "results" / "bench.parquet")
    export_store(bench["store"], tmp_path / "results" / "bench.csv", format="csv")
    blocks = _doc_blocks("export")
    assert len(blocks) >= 4
    done = subprocess.run([sys.executable, "-c", "\n\n".join(blocks)], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "grad_x_input" in done.stdout and "random" in done.stdout and "top_token" in done.stdout


def test_docs_dump_and_load_example_runs_as_written(bench, tmp_path):
    """docs/bench.md's dump-and-load block, run as written on a copy of the bench's store at
    results/, leaves elsewhere/ holding every explanation and metric row of it."""
    shutil.copytree(bench["store"], tmp_path / "results")
    blocks = _doc_blocks("dump")
    assert len(blocks) == 1
    done = subprocess.run([sys.executable, "-c", blocks[0]], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert _stored_rows(tmp_path / "elsewhere" / "results.sqlite") == _stored_rows(bench["store"] / "results.sqlite")


def test_docs_import_examples_run_on_tiny_models(tmp_path):
    """docs/bench.md's import blocks run as written, with the zoo models they load replaced by
    the tests' tiny seeded models of the same kinds (nothing is downloaded)."""
    pytest.importorskip("inseq")
    blocks = _doc_blocks("import")
    assert len(blocks) == 3
    script = "\n\n".join(blocks)
    for name, tiny in TINY.items():
        assert name in script
        script = script.replace(name, tiny)
    done = subprocess.run([sys.executable, "-c", "import heedful.testing\n" + script], cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "lexicon" in done.stdout and "grad_x_input" in done.stdout
    assert (tmp_path / "ig.pt").is_file() and (tmp_path / "inseq.json").is_file()


@pytest.mark.slow  # a bench process at two precisions, about 16 s on 2 cores: run with -m slow
def test_docs_precision_example_runs_on_a_tiny_model(tmp_path):
    """docs/bench.md's lower-precision block runs as written (on the tests' tiny BERT)."""
    blocks = _doc_blocks("precision")
    assert len(blocks) == 1
    script = blocks[0].replace('heedful.load("minilm-sentiment")', 'heedful.testing.conformance_model("bert")')
    assert script != blocks[0]
    done = subprocess.run([sys.executable, "-c", "import heedful.testing\n" + script], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    aopc, chosen = done.stdout.split()[:2]
    assert 0.0 <= float(aopc) <= 1.0
    assert chosen == support().auto(("bf16",))  # the precision auto picks for LIME on this machine


def test_export_cli_writes_the_table_and_the_manifest(bench, tmp_path, monkeypatch, capsys):
    out = tmp_path / "rows.csv"
    code, _, err = run_cli(monkeypatch, capsys, "bench", "export", str(bench["store"]), "--format", "csv", "--out", str(out))
    assert code == 0, err
    assert len(pd.read_csv(out)) == bench["csv"].rows and (tmp_path / "rows.manifest.json").is_file()
    code, _, err = run_cli(monkeypatch, capsys, "bench", "export", str(tmp_path / "nothing"), "--format", "csv")
    assert code == 2 and "no results store" in err and "Traceback" not in err
    code, _, err = run_cli(monkeypatch, capsys, "bench", "export", str(bench["store"]), "--format", "xml")
    assert code == 2 and "--format must be one of" in err and "Traceback" not in err


def test_parquet_without_pyarrow_is_one_line_naming_the_extra(bench, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow now raises ImportError
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    code, _, err = run_cli(monkeypatch, capsys, "bench", "export", str(bench["store"]), "--format", "parquet", "--out", str(tmp_path / "x.parquet"))
    assert code == 2 and "heedful[parquet]" in err and "Traceback" not in err
    assert len([line for line in err.splitlines() if line.strip()]) <= 2  # the error and its hint
    assert not (tmp_path / "x.parquet").exists()
    assert export_store(bench["store"], tmp_path / "x.csv", format="csv").rows == bench["csv"].rows  # CSV needs no pyarrow


# ---------------------------------------------------------------------------- round trip
def test_heedful_explanations_imported_back_score_like_the_method(bench, tmp_path):
    model = bench["model"]
    store = Path(shutil.copytree(bench["store"], tmp_path / "store"))  # the module's store stays as the bench left it
    imported = from_parquet(model, bench["parquet"].path, method="grad_x_input")
    with ResultsStore(bench["store"]) as opened:
        key = next(r.key for r in bench["result"].runs if r.method == "grad_x_input")
        own = opened.get_explanations(key)
    assert [e.details["example_id"] for e in imported] == [str(i) for i in range(len(ROWS))]
    for expl in imported:
        original = own[expl.details["example_id"]]
        assert expl.tokens == original.tokens and np.array_equal(expl.scores, original.scores)
        assert expl.target.indices == original.target.indices and expl.details["aligned_by"] == "same tokens"
    result = run_import(ImportSpec(
        model=model, file=bench["parquet"].path, name="gxi_again", metrics=METRICS, protocol=get_protocol("default", random_seeds=2),
        out=store, dataset=bench["data"], method="grad_x_input", batch_size=4,
    ), progress=False)
    assert set(result.groups) == {"gxi_again", "grad_x_input", "random"}  # the stored runs, side by side
    assert result.computed["explanations"] == len(ROWS)
    for metric in METRICS:
        assert result.groups["gxi_again"].summaries[metric].value == result.groups["grad_x_input"].summaries[metric].value
    stored = _stored_rows(store)
    mine = next(r.key.digest for r in result.runs if r.method == "gxi_again")
    theirs = next(r.key.digest for r in result.runs if r.method == "grad_x_input")
    for metric in METRICS:
        for i in range(len(ROWS)):
            assert _same(stored[(mine, metric, str(i))][0], stored[(theirs, metric, str(i))][0])
    from_csv = run_import(ImportSpec(
        model=model, file=bench["csv"].path, name="gxi_csv", metrics=METRICS, protocol=get_protocol("default", random_seeds=2),
        out=store, dataset=bench["data"], method="grad_x_input", batch_size=4,
    ), progress=False)
    assert "gxi_again" in from_csv.groups  # the imported run stored before is shown beside
    for metric in METRICS:
        assert from_csv.groups["gxi_csv"].summaries[metric].value == result.groups["grad_x_input"].summaries[metric].value
    again = run_import(ImportSpec(
        model=model, file=bench["parquet"].path, name="gxi_again", metrics=METRICS, protocol=get_protocol("default", random_seeds=2),
        out=store, dataset=bench["data"], method="grad_x_input", batch_size=4,
    ), progress=False)
    assert again.computed == {"explanations": 0, "measurements": 0, "metrics": 0}


def test_a_changed_file_is_imported_again_never_served_stale(bench, tmp_path):
    model = bench["model"]
    path = tmp_path / "mine.jsonl"
    rows = [{"id": str(i), "text": t, "tokens": t.split(), "scores": [float(len(w)) for w in t.split()]} for i, (t, _) in enumerate(ROWS)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = ImportSpec(model=model, file=path, name="by_length", metrics=["aopc"], protocol="default", out=tmp_path / "store", batch_size=4)
    first = run_import(spec, progress=False)
    assert first.computed["explanations"] == len(ROWS) and first.notes == []
    rows[0]["scores"] = [-s for s in rows[0]["scores"]]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    changed = run_import(spec, progress=False)
    assert changed.computed["explanations"] == len(ROWS)
    assert len(changed.notes) == 1 and changed.notes[0].startswith(f"by_length: {len(ROWS)} explanations imported again (file_sha256 ")
    assert changed.groups["by_length"].summaries["aopc"].value != first.groups["by_length"].summaries["aopc"].value
    moved = tmp_path / "elsewhere" / "mine.jsonl"  # the same bytes under another path: the same key
    moved.parent.mkdir()
    moved.write_bytes(path.read_bytes())
    same = run_import(replace(spec, file=moved), progress=False)
    assert same.computed == {"explanations": 0, "measurements": 0, "metrics": 0} and same.notes == []


# ---------------------------------------------------------------------------- alignment
def test_word_scores_spread_to_each_sub_word_token(bench):
    model = bench["model"]
    text = "a charming and often affecting journey"
    words = text.split()
    scores = [0.1, 0.9, 0.2, 0.3, 0.8, 0.4]
    expl = from_records(model, [{"text": text, "tokens": words, "scores": scores}])[0]
    starts = [text.index(w) for w in words]
    for token, offset, special, value in zip(expl.tokens, expl.offsets, expl.special, expl.scores, strict=True):
        if special:
            assert value == 0.0
            continue
        owner = max(k for k, s in enumerate(starts) if s <= offset[0])  # oracle: the word the token lies in
        assert value == pytest.approx(scores[owner]), token
    assert expl.details["aligned_by"] == "tokens"
    by_offsets = from_records(model, [{"text": text, "offsets": [[s, s + len(w)] for s, w in zip(starts, words, strict=True)], "scores": scores}])[0]
    assert np.array_equal(by_offsets.scores, expl.scores) and by_offsets.details["aligned_by"] == "offsets"


def test_alignment_errors_name_the_example_the_position_and_the_fix(bench, tmp_path, monkeypatch, capsys):
    model = bench["model"]
    text = "a dull , boring plot"
    with pytest.raises(AlignmentError, match=r"example 'r1': token 1 \('bright'\) is not found at character 1 of text") as info:
        from_records(model, [{"id": "r1", "text": text, "tokens": ["a", "bright", ",", "boring", "plot"], "scores": [0.0] * 5}])
    assert "offsets" in info.value.hint
    with pytest.raises(AlignmentError, match=r"example '0': the model's token \d+ \('plot'.*covered by no imported token"):
        from_records(model, [{"text": text, "offsets": [[0, 1], [2, 6], [7, 8], [9, 15]], "scores": [0.0] * 4}])
    ids = model.tokenizer(text)["input_ids"]
    wrong = list(ids)
    wrong[2] = (wrong[2] + 1) % len(model.tokenizer)
    with pytest.raises(AlignmentError, match=r"example '0': imported token 2 \(id \d+\) differs from the model's token 2"):
        from_records(model, [{"text": text, "token_ids": wrong, "scores": [0.0] * len(ids)}])
    with pytest.raises(heedful.InputError, match="3 scores but 5 tokens"):
        from_records(model, [{"text": text, "tokens": text.split(), "scores": [0.0] * 3}])
    folder = saved_tiny(tmp_path / "model", "bert")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"id": "x7", "text": text, "tokens": ["a", "dull", "!", "boring", "plot"], "scores": [0.0] * 5}) + "\n")
    code, _, err = run_cli(monkeypatch, capsys, "bench", "import", str(bad), "--model", folder, "--metrics", "aopc", "--out", str(tmp_path / "o"))
    assert code == 2 and "example 'x7': token 2 ('!')" in err and "Traceback" not in err


def test_import_cli_scores_a_file_beside_heedful_methods(tmp_path, monkeypatch, capsys):
    folder = saved_tiny(tmp_path / "model", "bert")
    data = _write_csv(tmp_path / "reviews.csv")
    path = tmp_path / "words.jsonl"
    path.write_text("".join(
        json.dumps({"id": str(i), "text": t, "tokens": t.split(), "scores": [float("dull" in w or "charming" in w) for w in t.split()]}) + "\n"
        for i, (t, _) in enumerate(ROWS)
    ))
    code, out, err = run_cli(
        monkeypatch, capsys, "bench", "import", str(path), "--model", folder, "--dataset", data, "--metrics", "aopc",
        "--methods", "grad_x_input", "--name", "lexicon", "--out", str(tmp_path / "o"), "--batch-size", "4",
    )
    assert code == 0, err
    assert "lexicon" in out and "grad_x_input" in out and "aopc" in out
    frame = pd.read_csv(next((tmp_path / "o").glob("*_curves.csv")))
    assert set(frame.method) == {"lexicon", "grad_x_input"}


# ---------------------------------------------------------------------------- Captum
def test_captum_attributions_are_imported_unchanged(bench, tmp_path):
    from captum.attr import LayerIntegratedGradients

    model = bench["model"]
    hf = model.hf_model
    texts = [t for t, _ in ROWS[:3]]
    enc = model.tokenizer(texts, padding=True, return_tensors="pt")

    def forward(ids, mask):
        return hf(input_ids=ids, attention_mask=mask).logits

    ig = LayerIntegratedGradients(forward, hf.get_input_embeddings())
    attr = ig.attribute(enc["input_ids"], additional_forward_args=(enc["attention_mask"],), target=1, n_steps=4)  # [B, S, H]
    assert attr.dim() == 3
    summed = attr.sum(dim=-1).double()
    explained = from_captum(model, attr, enc["input_ids"], attention_mask=enc["attention_mask"], target=1, texts=texts)
    for b, expl in enumerate(explained):
        n = int(enc["attention_mask"][b].sum())
        assert expl.raw_tokens == model.tokenizer.convert_ids_to_tokens(enc["input_ids"][b, :n].tolist())
        assert np.allclose(expl.scores, summed[b, :n].numpy(), rtol=0, atol=1e-6)
        assert expl.target.indices == [1] and expl.details["aligned_by"] == "token ids"
    decoded = from_captum(model, attr.sum(-1), enc["input_ids"], target=[1, 1, 1])  # no mask, no texts: decoded, pads dropped
    assert [np.allclose(a.scores, b.scores, atol=1e-6) for a, b in zip(decoded, explained, strict=True)] == [True] * 3
    torch.save({"attributions": attr, "input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], "target": 1, "texts": texts}, tmp_path / "ig.pt")
    result = run_import(ImportSpec(
        model=model, file=tmp_path / "ig.pt", name="captum_ig", metrics=["aopc"], protocol="default", out=tmp_path / "store",
        dataset=bench["data"], methods=["grad_x_input"], batch_size=4,
    ), progress=False)
    assert set(result.groups) == {"captum_ig", "grad_x_input"} and result.n_examples == 3
    direct = heedful.evaluate.evaluate(model, explained, ["aopc"], "default")["aopc"].summary.value
    assert result.groups["captum_ig"].summaries["aopc"].value == pytest.approx(direct, abs=1e-12)


# ---------------------------------------------------------------------------- Inseq
def test_inseq_saved_output_is_imported_per_generated_token(tmp_path):
    inseq = pytest.importorskip("inseq")
    from conftest import cached_model

    model = cached_model("gpt2", "causal_lm")
    tokenizer = model.tokenizer
    wrapped = inseq.load_model(model.hf_model, "input_x_gradient", tokenizer=tokenizer)
    prompts = ["the movie was dull and", "a charming journey"]
    out = inseq.merge_attributions([  # one prompt per call: Inseq pads a batch without a mask for GPT-2-like tokenizers
        wrapped.attribute(p, generation_args={"max_new_tokens": 2, "do_sample": False}, show_progress=False) for p in prompts
    ])
    out.save(tmp_path / "out.json", overwrite=True)
    out.save(tmp_path / "plain.json", overwrite=True, use_primitives=True)  # a form Inseq itself cannot load back
    explained = from_inseq(model, tmp_path / "out.json")
    loaded = inseq.FeatureAttributionOutput.load(tmp_path / "out.json")
    expected = []  # oracle: every step whose prefix is how the tokenizer encodes its decoded text
    for i, seq in enumerate(loaded.sequence_attributions):
        for j in range(seq.attr_pos_end - seq.attr_pos_start):
            ids = [t.id for t in seq.target[: seq.attr_pos_start + j]]
            text = tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
            if tokenizer(text, add_special_tokens=False)["input_ids"] == ids:
                expected.append(str(i) if j == 0 else f"{i}.{j}")
    assert [e.details["example_id"] for e in explained] == expected and {"0", "1"} <= set(expected)
    for expl in explained:
        seq_id, _, step = expl.details["example_id"].partition(".")
        seq = loaded.sequence_attributions[int(seq_id)]
        j = int(step or 0)
        position = seq.attr_pos_start + j
        scores = seq.target_attributions[:position, j].sum(-1)  # granular: summed over the hidden size
        assert expl.raw_tokens == tokenizer.convert_ids_to_tokens([t.id for t in seq.target[:position]])
        assert np.allclose(expl.scores, scores.double().numpy(), rtol=0, atol=1e-7)
        assert expl.target.indices == [seq.target[position].id]
    assert explained[0].text == prompts[0] and explained[expected.index("1")].text == prompts[1]
    for other in (from_inseq(model, out), from_inseq(model, tmp_path / "plain.json")):  # the object; the plain JSON
        assert [e.details["example_id"] for e in other] == expected
        assert all(np.array_equal(a.scores, b.scores) for a, b in zip(other, explained, strict=True))
    first = from_inseq(model, tmp_path / "out.json", steps="first")
    assert [e.details["example_id"] for e in first] == ["0", "1"]
    scored = heedful.evaluate.evaluate(model, explained, ["aopc"], "default")["aopc"].per_example.values
    assert np.isfinite(scored).all()
    with pytest.raises(heedful.InputError, match="Inseq explains generation"):
        from_inseq(cached_model("bert"), tmp_path / "out.json")


def test_json_and_jsonl_files_read_the_same(bench, tmp_path):
    model = bench["model"]
    rows = [{"id": f"e{i}", "text": t, "tokens": t.split(), "scores": list(range(len(t.split())))} for i, (t, _) in enumerate(ROWS)]
    (tmp_path / "a.json").write_text(json.dumps(rows))
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    one, two = from_json(model, tmp_path / "a.json"), from_json(model, tmp_path / "a.jsonl")
    assert [e.details["example_id"] for e in one] == [r["id"] for r in rows]
    assert all(np.array_equal(a.scores, b.scores) for a, b in zip(one, two, strict=True))
    assert one[0].method == "a"
