"""Results-store keys never serve stale results: a changed default, a bumped method version,
other weights or edited data are recomputed (and the run says why); nothing changed computes
nothing; a schema-1 store is kept but never read; Mask-LRP's cached head mask belongs to one
model's fingerprint; bad bench options fail before any work."""

from __future__ import annotations

import csv
import functools
import inspect
import sqlite3
from contextlib import contextmanager

import pandas as pd
import pytest
from conftest import run_cli, saved_tiny
from tiny import tiny_hf

import heedful
from heedful import datasets
from heedful.evaluate import ResultsStore, get_protocol
from heedful.evaluate.bench import BenchSpec, check_options, run_bench
from heedful.evaluate.store import LEGACY_REASON, run_key, subject
from heedful.fingerprint import dataset_fingerprint, model_fingerprint
from heedful.interest import rectify as rect
from heedful.registry import register, registered, unregister

ROWS = [
    ("a charming and often affecting journey", "POSITIVE"),
    ("the movie was dull and far too long", "NEGATIVE"),
    ("an intelligent , funny and moving film", "POSITIVE"),
    ("what a waste of a talented cast", "NEGATIVE"),
]


def _write_csv(path, rows=ROWS) -> str:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["text", "label"])
        writer.writerows(rows)
    return str(path)


@pytest.fixture
def data_csv(tmp_path) -> str:
    return _write_csv(tmp_path / "reviews.csv")


def _bench(model, data, out, methods=("integrated_gradients",), **kw):
    spec = BenchSpec(
        model=model, dataset=data, methods=list(methods), metrics=["aopc"], protocol=get_protocol("default", random_seeds=2),
        out=out, batch_size=4, **kw,
    )
    return run_bench(spec, progress=False)


def _register_like(info, fn, version: int) -> None:
    register(
        info.name, family=info.family, cost=info.cost, citation=info.citation, summary=info.summary, tasks=info.tasks,
        needs_hidden=info.needs_hidden, needs_attentions=info.needs_attentions, reference=info.reference,
        version=version, per_dimension=info.per_dimension, spans=info.spans, quantities=info.quantities,
        needs_sources=info.needs_sources, needs=info.needs, passes=info.passes,
    )(fn)


@contextmanager
def replaced(name: str, *, version: int | None = None, **defaults):
    """Method ``name`` re-registered under the same name, with other ``defaults`` in its
    signature and/or another ``version``; the original is registered again afterwards."""
    original = registered()[name]
    fn = original.fn
    if defaults:
        signature = inspect.signature(fn)
        params = [p.replace(default=defaults.get(p.name, p.default)) for p in signature.parameters.values()]

        @functools.wraps(original.fn)
        def fn(problem, **options):
            return original.fn(problem, **options)

        fn.__signature__ = signature.replace(parameters=params)
    unregister(name)
    _register_like(original, fn, original.version if version is None else version)
    try:
        yield
    finally:
        unregister(name)
        _register_like(original, original.fn, original.version)


# ---------------------------------------------------------------------------- recomputation
def test_a_changed_default_recomputes_that_method_and_says_why(tiny, data_csv, tmp_path):
    model = tiny("bert")
    first = _bench(model, data_csv, tmp_path, methods=["integrated_gradients", "saliency"])
    assert first.computed["explanations"] == 2 * len(ROWS) and first.notes == []
    with replaced("integrated_gradients", n_steps=40):
        assert heedful.get_method("integrated_gradients").defaults["n_steps"] == 40
        changed = _bench(model, data_csv, tmp_path, methods=["integrated_gradients", "saliency"])
        assert changed.computed["explanations"] == len(ROWS)  # saliency's are reused
        assert changed.notes == [f"integrated_gradients: {len(ROWS)} explanations recomputed (default n_steps 50 -> 40)"]
        again = _bench(model, data_csv, tmp_path, methods=["integrated_gradients", "saliency"])
        assert again.computed == {"explanations": 0, "measurements": 0, "metrics": 0} and again.notes == []
        key = changed.runs[0].key
        with ResultsStore(tmp_path) as store:  # the new key has its own cost record
            assert store.cost(key)["examples"] == len(ROWS)
    back = _bench(model, data_csv, tmp_path, methods=["integrated_gradients", "saliency"])
    assert back.computed["explanations"] == 0  # the old rows were kept
    assert back.groups["integrated_gradients"].summaries["aopc"].value == pytest.approx(
        first.groups["integrated_gradients"].summaries["aopc"].value
    )


def test_a_given_option_that_changes_is_not_called_a_default(tiny, data_csv, tmp_path):
    model = tiny("bert")
    _bench(model, data_csv, tmp_path, method_options={"integrated_gradients": {"n_steps": 8}})
    changed = _bench(model, data_csv, tmp_path, method_options={"integrated_gradients": {"n_steps": 4}})
    assert changed.notes == [f"integrated_gradients: {len(ROWS)} explanations recomputed (n_steps 8 -> 4)"]


def test_a_new_method_version_recomputes(tiny, data_csv, tmp_path):
    model = tiny("bert")
    _bench(model, data_csv, tmp_path, methods=["saliency"])
    with replaced("saliency", version=2):
        bumped = _bench(model, data_csv, tmp_path, methods=["saliency"])
    assert bumped.computed["explanations"] == len(ROWS)
    assert bumped.notes == [f"saliency: {len(ROWS)} explanations recomputed (method version 1 -> 2)"]


def _save_tiny(folder, seed: int) -> str:
    hf_model, tokenizer = tiny_hf("bert", "classification", seed, initializer_range=0.2)
    hf_model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def test_other_weights_in_the_same_folder_recompute(data_csv, tmp_path):
    folder = _save_tiny(tmp_path / "model", seed=0)
    before = heedful.load(folder)
    _bench(before, data_csv, tmp_path / "out", methods=["saliency"])
    _save_tiny(tmp_path / "model", seed=1)  # rebuilt: same folder, name and config, other weights
    after = heedful.load(folder)
    assert model_fingerprint(after).changes(model_fingerprint(before)) == ["model weights changed"]
    rebuilt = _bench(after, data_csv, tmp_path / "out", methods=["saliency"])
    assert rebuilt.computed["explanations"] == len(ROWS)
    assert rebuilt.notes == [f"saliency: {len(ROWS)} explanations recomputed (model weights changed)"]
    assert rebuilt.model_name == str((tmp_path / "model").resolve())


def test_an_edited_csv_recomputes_and_the_same_model_by_another_name_does_not(tiny, data_csv, tmp_path):
    model = tiny("bert")
    _bench(model, data_csv, tmp_path / "out", methods=["saliency"])
    same = heedful.from_pretrained_objects(model.hf_model, model.tokenizer, name="another name")
    assert _bench(same, data_csv, tmp_path / "out", methods=["saliency"]).computed["explanations"] == 0
    _write_csv(data_csv, [(text, "POSITIVE") for text, _ in ROWS])  # the gold labels changed
    edited = _bench(model, data_csv, tmp_path / "out", methods=["saliency"])
    assert edited.computed["explanations"] == len(ROWS)
    assert edited.notes == [f"saliency: {len(ROWS)} explanations recomputed (dataset changed)"]


def test_keys_hold_complete_options_and_fingerprints(tiny, data_csv):
    model = tiny("bert")
    about = subject(model, data_csv, "test")
    assert about.dataset_fingerprint == dataset_fingerprint(datasets.load(data_csv, "test"))
    implicit, explicit = run_key(about, "integrated_gradients"), run_key(about, "integrated_gradients", {"n_steps": 50})
    assert implicit.digest == explicit.digest  # a default and the same value given are one key
    assert '"n_steps":50' in implicit.options and "internal_batch_size" not in implicit.options  # runtime options stay out
    assert run_key(about, "integrated_gradients", {"internal_batch_size": 2}).digest == implicit.digest
    assert run_key(about, "integrated_gradients", max_length=8).digest != implicit.digest
    assert run_key(about, "integrated_gradients", label="gold").digest != implicit.digest
    with pytest.raises(heedful.InputError, match="n_steps"):
        run_key(about, "integrated_gradients", {"n_steps": "abc"})


def test_rectify_recomputes_after_a_version_change_and_says_why(tiny, tmp_path):
    model = tiny("distilbert")
    before = rect.classify(model, [t for t, _ in ROWS])
    data = _write_csv(tmp_path / "d.csv", [(t, (int(y) + 1) % 3) for (t, _), y in zip(ROWS, before, strict=True)])
    first = rect.rectify(model, data, ["random"], [0.5], store=tmp_path / "store")
    assert first.n_errors == len(ROWS) and first.notes == []
    with replaced("random", version=2):
        again = rect.rectify(model, data, ["random"], [0.5], store=tmp_path / "store")
    assert again.methods["random"].from_store == 0
    assert again.notes == [f"random: {len(ROWS)} explanations recomputed (method version 1 -> 2)"]


# ---------------------------------------------------------------------------- schema 1
_SCHEMA1 = """
CREATE TABLE info (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE explanations (
    model TEXT, dataset TEXT, split TEXT, example_id TEXT, method TEXT, options_hash TEXT,
    explanation TEXT NOT NULL, created REAL,
    PRIMARY KEY (model, dataset, split, method, options_hash, example_id));
CREATE TABLE measurements (
    model TEXT, dataset TEXT, split TEXT, example_id TEXT, method TEXT, options_hash TEXT,
    source TEXT, protocol_hash TEXT, data TEXT NOT NULL, created REAL,
    PRIMARY KEY (model, dataset, split, method, options_hash, source, protocol_hash, example_id));
CREATE TABLE metrics (
    model TEXT, dataset TEXT, split TEXT, example_id TEXT, method TEXT, options_hash TEXT,
    metric TEXT, protocol_hash TEXT, value REAL, curve TEXT, extra TEXT, created REAL,
    PRIMARY KEY (model, dataset, split, method, options_hash, metric, protocol_hash, example_id));
CREATE TABLE costs (
    model TEXT, dataset TEXT, split TEXT, method TEXT, options_hash TEXT,
    examples INTEGER, seconds REAL, forward REAL, backward REAL, peak_mb REAL,
    PRIMARY KEY (model, dataset, split, method, options_hash));
CREATE TABLE protocols (protocol_hash TEXT PRIMARY KEY, name TEXT, fields TEXT);
INSERT INTO info VALUES ('schema', '1');
"""


def _schema1_store(folder, model, data_csv) -> int:
    """A store as heedful wrote it before fingerprints, holding saliency explanations of the
    data under the old key form; returns how many."""
    folder.mkdir(parents=True)
    db = sqlite3.connect(folder / "results.sqlite")
    db.executescript(_SCHEMA1)
    explained = model.explain([t for t, _ in ROWS], "saliency")
    rows = [("tiny@1a2b3c4d", data_csv, "test", str(i), "saliency", "0" * 16, e.to_json(), 0.0) for i, e in enumerate(explained)]
    db.executemany("INSERT INTO explanations VALUES (?,?,?,?,?,?,?,?)", rows)
    db.commit()
    db.close()
    return len(rows)


def test_a_schema1_store_is_opened_kept_and_never_read(tiny, data_csv, tmp_path):
    model = tiny("bert")
    old = _schema1_store(tmp_path / "out", model, data_csv)
    result = _bench(model, data_csv, tmp_path / "out", methods=["saliency"])
    assert result.computed["explanations"] == len(ROWS)  # nothing reused
    assert result.notes == [f"{result.store_path}: {old} explanations left unused ({LEGACY_REASON})"]
    with ResultsStore(tmp_path / "out") as store:
        assert store.db.execute("SELECT COUNT(*) FROM schema1_explanations").fetchone()[0] == old  # nothing deleted
        assert store.legacy == {"explanations": old}
    assert _bench(model, data_csv, tmp_path / "out", methods=["saliency"]).computed["explanations"] == 0


def test_a_store_of_a_newer_schema_is_refused(tmp_path):
    db = sqlite3.connect(tmp_path / "results.sqlite")
    db.executescript("CREATE TABLE info (key TEXT PRIMARY KEY, value TEXT); INSERT INTO info VALUES ('schema', '99');")
    db.close()
    with pytest.raises(heedful.HeedfulError, match="newer heedful"):
        ResultsStore(tmp_path)


# ---------------------------------------------------------------------------- head masks
def test_two_models_wrapped_under_one_name_get_their_own_head_masks(monkeypatch, tmp_path):
    from heedful.lrp import heads
    from heedful.lrp.masks import cache_path

    monkeypatch.setenv("HEEDFUL_HOME", str(tmp_path))
    monkeypatch.setattr("heedful.datasets.load_split", lambda dataset, split: pd.DataFrame({"text": [t for t, _ in ROWS]}))
    monkeypatch.setattr(heads, "cached_arcs", lambda texts, key, **kw: [[] for _ in texts])  # no parser needed
    computed = []
    real = heads.head_statistics
    monkeypatch.setattr(heads, "head_statistics", lambda adapter, texts, **kw: computed.append(adapter) or real(adapter, texts, **kw))
    one, two = (heedful.from_pretrained_objects(*tiny_hf("bert", "classification", seed, initializer_range=0.2)) for seed in (0, 1))
    assert one.name == two.name == "model"
    assert cache_path(one) != cache_path(two)
    first, second = heads.default_head_mask(one.adapter), heads.default_head_mask(two.adapter)
    assert len(computed) == 2  # the second model did not get the first one's mask
    assert first.meta["fingerprint"] != second.meta["fingerprint"]
    assert first.statistics["offset_counts"] != second.statistics["offset_counts"]
    assert heads.default_head_mask(one.adapter).to_dict() == first.to_dict() and len(computed) == 2  # read back
    lower = heads.default_head_mask(one.adapter, xi_pos=0.0)  # other thresholds: selected from the statistics
    assert len(computed) == 2 and lower.mask.all() and lower.meta["xi_pos"] == 0.0
    heads.default_head_mask(one.adapter, limit=2)  # other data settings: another cache entry
    assert len(computed) == 3 and cache_path(one, limit=2) != cache_path(one)


def test_a_head_mask_computation_reports_its_progress(monkeypatch, tmp_path):
    from heedful.lrp import heads
    from heedful.progress import reporting

    monkeypatch.setenv("HEEDFUL_HOME", str(tmp_path))
    monkeypatch.setattr("heedful.datasets.load_split", lambda dataset, split: pd.DataFrame({"text": [t for t, _ in ROWS]}))
    monkeypatch.setattr(heads, "cached_arcs", lambda texts, key, progress=None, **kw: progress(len(texts)) or [[] for _ in texts])

    class Recorder:
        def __init__(self):
            self.seen = {}

        def start(self, description, total):
            self.seen[description] = [total, 0]
            return description

        def advance(self, handle, steps):
            self.seen[handle][1] += steps

        def finish(self, handle):
            pass

    recorder = Recorder()
    lm = heedful.from_pretrained_objects(*tiny_hf("bert", "classification", 0))
    with reporting(recorder):
        heads.default_head_mask(lm.adapter)
    statistics = next(v for k, v in recorder.seen.items() if k.startswith("head statistics"))
    assert statistics == [len(ROWS), len(ROWS)] and any(k.startswith("parsing") for k in recorder.seen)
    with reporting(recorder):
        recorder.seen.clear()
        heads.default_head_mask(lm.adapter)  # read from the cache: nothing to report
    assert recorder.seen == {}


# ---------------------------------------------------------------------------- bad options
def test_options_are_checked_before_any_work():
    with pytest.raises(heedful.InputError, match="not a method of this run") as exc:
        check_options(["saliency"], {"lime": {"n_samples": 20}})
    assert "\n" not in exc.value.message and "saliency" in exc.value.hint
    with pytest.raises(heedful.InputError, match="n_steps='abc'"):
        check_options(["integrated_gradients"], {"integrated_gradients": {"n_steps": "abc"}})
    assert check_options(["integrated-gradients"], {"integrated-gradients": {"n_steps": 3}}) == {"integrated_gradients": {"n_steps": 3}}


@pytest.mark.parametrize(
    ("methods", "option", "says"),
    [
        ("saliency", "lime.n_samples=20", "'lime', which is not a method of this run"),
        ("integrated_gradients", "integrated_gradients.n_steps=abc", "n_steps='abc' is not int"),
        ("saliency,integrated_gradients", "integrated_gradients.nope=1", "does not take the option(s) nope"),
    ],
)
def test_bad_bench_options_exit_2_with_one_message(monkeypatch, capsys, tmp_path, methods, option, says):
    loaded = []
    monkeypatch.setattr(heedful, "load", lambda *a, **kw: loaded.append(a))
    model = saved_tiny(tmp_path / "model", "bert")
    code, _, err = run_cli(
        monkeypatch, capsys, "bench", "--model", model, "--dataset", "movies", "--methods", methods, "--option", option,
        "--out", str(tmp_path / "out"),
    )
    assert code == 2 and says in " ".join(err.split()) and "Traceback" not in err
    assert err.count("error:") == 1 and loaded == []  # refused before the model loads
