"""``heedful bench import``: explanations computed elsewhere, scored in the results store beside
heedful's own methods.

:func:`run_import` reads a file (:func:`read_file`: JSON / JSON lines / CSV / Parquet records, a
Captum tensor file, an Inseq JSON file), aligns it to the model's tokens
(:mod:`heedful.evaluate.imports`), stores the explanations under the imported method's name and
derives every asked metric under the protocol, exactly as ``heedful bench`` does for its
methods. The examples are those of ``dataset`` that the file explains (matched by id, else by
text), or -- without a dataset -- the file's own texts (with their gold ``label`` / ``rating`` /
``evidence`` when it has them, and its targets: heedful's methods then explain the same
outputs).

Keys
----
An imported run's :class:`~heedful.evaluate.store.RunKey` is the name it is imported under,
with options ``{"file_sha256": <hash of the file's bytes>, "format": ..., ...}`` and version
:data:`IMPORT_VERSION`, on the usual model / dataset fingerprints and setting: a changed file
is a new key (its explanations are read again and the run says why), never served stale.

Side by side
------------
The table holds the imported run and, on the same examples, the heedful methods asked for
(``methods``: explained now, or read from the store) and every run already in the store for
this model, dataset and setting whose explanations cover the examples -- heedful methods under
their current keys, and other imported files.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from heedful.datasets.examples import Dataset, Example
from heedful.engine.options import canonical_json
from heedful.engine.targets import Target
from heedful.errors import HeedfulError, InputError
from heedful.evaluate.alignment import align
from heedful.evaluate.bench import (
    BenchResult,
    BenchSpec,
    LocalEngine,
    Plan,
    Run,
    _progress,
    check_options,
    collect,
    list_tasks,
    make_runs,
    progress_share,
    select_inputs,
    spec_subject,
)
from heedful.evaluate.evaluation import ModelInput, check_metric, gold_class_index
from heedful.evaluate.export import IMPORTED_OPTION
from heedful.evaluate.imported_records import (
    Record,
    captum_records,
    inseq_records,
    read_csv,
    read_json,
    read_parquet,
)
from heedful.evaluate.metrics import METRICS, metric_names
from heedful.evaluate.protocol import Protocol, get_protocol
from heedful.evaluate.store import (
    ResultsStore,
    RunKey,
    Subject,
    dataset_label,
    model_label,
    run_key,
)
from heedful.evaluate.tasks import Settings
from heedful.fingerprint import DIGITS, dataset_fingerprint, model_fingerprint
from heedful.model import Model

IMPORT_VERSION = 1
"""Version of the import (reading and alignment): it enters imported runs' keys."""

FORMATS = ("auto", "json", "csv", "parquet", "captum", "inseq")


@dataclass
class ImportSpec:
    """What to import and how to score it. ``file``: the explanations; ``name``: the method
    name they are stored and shown under; ``dataset``: the examples they explain (``None``: the
    file's own texts); ``format``: one of :data:`FORMATS`; ``method``: which method's rows of a
    table holding several (``heedful bench export``'s); ``methods``: heedful methods to run
    beside them; ``steps``: Inseq -- every generated token (``"all"``) or the first."""

    model: Model
    file: Path
    name: str
    metrics: Sequence[str]
    protocol: Protocol | str
    out: Path
    dataset: str | None = None
    split: str = "test"
    format: str = "auto"
    method: str | None = None
    methods: Sequence[str] = ()
    method_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    n: int | None = None
    seed: int = 0
    batch_size: int = 16
    dataset_options: dict[str, Any] = field(default_factory=dict)
    model_label: str | None = None
    steps: str = "all"


# ---------------------------------------------------------------------------- reading
def file_digest(path: Path) -> str:
    """SHA-256 of the file's bytes (``DIGITS`` hex digits), read in blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:DIGITS]


def detect_format(path: Path) -> str:
    """The format of ``path`` from its name (``.parquet``, ``.pt`` / ``.pth`` for Captum, JSON /
    JSON lines), telling an Inseq JSON file by its content."""
    name = path.name.lower()
    if name.endswith(".parquet"):
        return "parquet"
    if name.endswith((".pt", ".pth")):
        return "captum"
    if name.endswith((".json", ".json.gz")):
        head = path.read_bytes()[:4096]
        if head[:2] == b"\x1f\x8b" or b"sequence_attributions" in head or b"FeatureAttributionOutput" in head:
            return "inseq"
        return "json"
    if name.endswith((".jsonl", ".ndjson")):
        return "json"
    if name.endswith(".csv"):
        return "csv"
    raise InputError(
        f"cannot tell the format of {path.name}",
        hint="name it .jsonl / .json / .csv / .parquet / .pt, or pass --format json|csv|parquet|captum|inseq",
    )


def read_captum_file(path: Path, tokenizer: Any) -> list[Record]:
    """Records from a ``torch.save`` d dict: ``attributions`` ``[B, S(, H)]`` and ``input_ids``
    ``[B, S]``, optionally ``attention_mask``, ``target`` (one or per example), ``texts``,
    ``text_pairs`` and ``ids``."""
    import torch

    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for a file that is not a tensor file
        raise InputError(f"{path} is not a torch file: {exc}", hint="torch.save({'attributions': ..., 'input_ids': ...}, path)") from exc
    if not isinstance(data, dict) or "attributions" not in data or "input_ids" not in data:
        raise InputError(
            f"{path} does not hold a dict with 'attributions' and 'input_ids'",
            hint="torch.save({'attributions': attr, 'input_ids': ids, 'target': 1}, path)",
        )
    return captum_records(
        data["attributions"], data["input_ids"], tokenizer,
        texts=data.get("texts"), text_pairs=data.get("text_pairs"), attention_mask=data.get("attention_mask"),
        target=data.get("target"), ids=data.get("ids"),
    )


def read_file(path: str | Path, tokenizer: Any, format: str = "auto", method: str | None = None, steps: str = "all") -> tuple[list[Record], str]:
    """The records of an explanations file and its format."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise InputError(f"no such file: {path}", hint="give the path of the explanations file")
    if format not in FORMATS:
        raise InputError(f"unknown format {format!r}", hint=f"use one of: {', '.join(FORMATS)}")
    fmt = detect_format(path) if format == "auto" else format
    if method is not None and fmt not in ("json", "csv", "parquet"):
        raise InputError(f"--from-method picks rows of a table; a {fmt} file has no methods", hint="drop --from-method")
    if fmt == "parquet":
        return read_parquet(path, method), fmt
    if fmt == "csv":
        return read_csv(path, method), fmt
    if fmt == "captum":
        return read_captum_file(path, tokenizer), fmt
    if fmt == "inseq":
        return inseq_records(path, tokenizer, steps), fmt
    return read_json(path, method), fmt


# ---------------------------------------------------------------------------- examples
def _record_target(item: Record) -> Target | None:
    if item.target_indices is not None:
        return Target("given", item.target_indices[0]) if len(item.target_indices) == 1 else Target(
            "contrast", item.target_indices[0], item.target_indices[1]
        )
    return None if item.target is None else Target.parse(item.target)


def file_examples(model: Model, path: Path, items: Sequence[Record]) -> tuple[Dataset, list[ModelInput]]:
    """The file as the dataset: one example per record (text, gold label / rating / evidence,
    and the record's target in ``meta``, so the dataset's fingerprint changes with the texts and
    targets but not with the scores), and the model inputs explaining the records' targets."""
    from heedful.datasets.user import _evidence, _label

    examples, inputs = [], []
    for row, item in enumerate(items):
        words, spans = _evidence(item.gold.get("evidence"), item.text, item.text_pair, row)
        label = _label(item.gold.get("label"))
        rating = item.gold.get("rating")
        meta = {"target": item.target, "target_indices": None if item.target_indices is None else list(item.target_indices)}
        examples.append(
            Example(item.id, item.text, item.text_pair, label, None if rating is None else float(rating), words, spans, meta=meta)
        )
        gold = gold_class_index(label, model.adapter, None) if model.task == "classification" else -1
        inputs.append(
            ModelInput(item.id, item.text, item.text_pair, _record_target(item), spans, gold, float("nan") if rating is None else float(rating))
        )
    has_label = any(e.label is not None for e in examples)
    data = Dataset(
        name=path.stem, split="all", examples=examples, task="classification" if has_label else "unlabelled",
        evidence_source="user-provided" if any(e.evidence_spans for e in examples) else None,
        description=f"texts of the explanations in {path}",
    )
    return data, inputs


def match_records(items: Sequence[Record], inputs: Sequence[ModelInput], data: Dataset, dataset: str) -> tuple[list[Record], list[ModelInput], int]:
    """The records of the run's examples, in the dataset's order, with their inputs, and how
    many records are of examples the model or protocol leaves out. A record belongs to the
    example of its id, else to the one example whose text (as the model reads it) is its text;
    a record of no example, or whose text differs from its example's, is an error."""
    known = set(data.ids)
    by_text: dict[tuple[str, str | None], list[str]] = {}
    for i in inputs:
        by_text.setdefault((i.text, i.text_pair), []).append(i.id)
    for e in data:
        by_text.setdefault((e.text, e.text_pair), []).append(e.id)
    owner: dict[str, Record] = {}
    for item in items:
        ident = item.id if item.id in known else None
        if ident is None:
            found = list(dict.fromkeys(by_text.get((item.text, item.text_pair), [])))
            ident = found[0] if len(found) == 1 else None
        if ident is None:
            raise InputError(
                f"record {item.id!r} matches no example of {dataset} by id or text",
                hint="give the dataset's example ids (the 'id' field), or drop --dataset to score the file's own texts",
            )
        if ident in owner:
            raise InputError(f"records {owner[ident].id!r} and {item.id!r} both explain example {ident!r} of {dataset}", hint="keep one of them")
        owner[ident] = item
    kept_items, kept_inputs = [], []
    for model_input in inputs:
        item = owner.get(model_input.id)
        if item is None:
            continue
        if (item.text, item.text_pair) != (model_input.text, model_input.text_pair):
            raise InputError(
                f"record {item.id!r} explains {item.text[:40]!r}, but the model reads example {model_input.id!r} of {dataset} as {model_input.text[:40]!r}",
                hint="give the text the model reads for that example, or drop --dataset",
            )
        kept_items.append(replace(item, id=model_input.id))
        kept_inputs.append(model_input)
    return kept_items, kept_inputs, len(owner) - len(kept_items)


# ---------------------------------------------------------------------------- runs
def import_key(about: Subject, spec: ImportSpec, protocol: Protocol, digest: str, fmt: str) -> RunKey:
    """The imported run's key (see the module docstring)."""
    options: dict[str, Any] = {IMPORTED_OPTION: digest, "format": fmt}
    if spec.method is not None:
        options["from_method"] = spec.method
    if fmt == "inseq":
        options["steps"] = spec.steps
    return RunKey(
        model=about.model,
        dataset=about.dataset,
        split=about.split,
        method=spec.name,
        options=canonical_json(options),
        version=IMPORT_VERSION,
        model_fingerprint=about.model_fingerprint,
        dataset_fingerprint=about.dataset_fingerprint,
        setting=canonical_json({"label": protocol.label, "max_length": protocol.max_length, "lm_word": "target"}),
        given=tuple(sorted(options)),
    )


def stored_runs(store: ResultsStore, about: Subject, setting: str, ids: Sequence[str], taken: set[str], exclude: str) -> list[Run]:
    """Runs already in ``store`` for ``about`` under ``setting`` whose explanations cover
    ``ids``: heedful methods under their current keys (a random baseline's seeds form one
    group) and other imported files (the latest file of each name); not ``taken`` groups and
    not the imported name ``exclude``."""
    from heedful.registry import registered

    methods = registered()
    wanted = set(ids)
    found: list[Run] = []
    imported: dict[str, Run] = {}
    seen: set[str] = set()
    for key, _created in store.run_keys():
        if key.digest in seen or key.model_fingerprint.digest != about.model_fingerprint.digest:
            continue
        seen.add(key.digest)
        if (key.dataset_fingerprint, key.split, key.setting) != (about.dataset_fingerprint, about.split, setting):
            continue
        if not wanted <= store.explanation_ids(key):
            continue
        options = json.loads(key.options)
        if IMPORTED_OPTION in options:
            if key.method != exclude and key.method not in taken:
                imported[key.method] = Run(key.method, key.method, options, key)  # later keys replace earlier ones
            continue
        info = methods.get(key.method)
        if info is None:
            continue
        given = {name: options[name] for name in key.given if name in options}
        try:
            current = run_key(about, key.method, given, **json.loads(setting))
        except HeedfulError:
            continue  # options the method no longer takes
        if current.digest != key.digest:
            continue  # an older version or default: not the method as it is now
        shown = {k: v for k, v in given.items() if k != "seed"}
        group = key.method if not shown else f"{key.method} ({', '.join(f'{k}={v}' for k, v in sorted(shown.items()))})"
        if group in taken:
            continue
        found.append(Run(key.method, group, given, key, given.get("seed")))
    return found + list(imported.values())


# ---------------------------------------------------------------------------- the runner
def run_import(spec: ImportSpec, console=None, progress: bool = True) -> BenchResult:
    """Import, align, store and score ``spec.file`` (see the module docstring); the result is a
    :class:`~heedful.evaluate.bench.BenchResult` whose groups hold the imported method beside
    heedful's, for :mod:`heedful.evaluate.report`."""
    from heedful.registry import registered

    model = spec.model
    if not isinstance(model, Model):
        raise InputError(f"the import needs a loaded model, got {type(model).__name__}", hint="pass heedful.load(name)")
    name = spec.name.strip()
    if not name:
        raise InputError("the imported method needs a name", hint="pass --name NAME (e.g. captum_ig)")
    if name in registered():
        raise InputError(f"{name!r} is a heedful method", hint=f"import under another name, e.g. --name imported_{name}")
    protocol = get_protocol(spec.protocol).resolved(model.adapter.device)
    names = metric_names(spec.metrics)
    for metric in names:
        check_metric(METRICS[metric], model.task)
    if spec.batch_size < 1:
        raise InputError(f"batch size must be positive, got {spec.batch_size}")
    check_options(list(spec.methods), spec.method_options)
    path = Path(spec.file).expanduser()
    items, fmt = read_file(path, model.tokenizer, spec.format, spec.method, spec.steps)
    bench = BenchSpec(
        model=model, dataset=spec.dataset or str(path), methods=list(spec.methods), metrics=names, protocol=protocol,
        out=spec.out, split=spec.split if spec.dataset else "all", n=spec.n, seed=spec.seed, batch_size=spec.batch_size,
        method_options=dict(spec.method_options), dataset_options=dict(spec.dataset_options), model_label=spec.model_label,
    )
    skipped: dict[str, int] = {}
    if spec.dataset is not None:
        inputs, data = select_inputs(model, replace(bench, n=None), skipped)
        items, inputs, left = match_records(items, inputs, data, spec.dataset)
        if left:
            skipped["not usable with this model and protocol"] = left
        if spec.n is not None:
            items, inputs = items[: spec.n], inputs[: spec.n]
        if not items:
            raise HeedfulError(f"none of the file's explanations is of a usable example of {spec.dataset}", hint="check the ids and --split")
        about = spec_subject(bench, data)
        items = [_with_input_target(item, i) for item, i in zip(items, inputs, strict=True)]
    else:
        if spec.n is not None:
            items = items[: spec.n]
        data, inputs = file_examples(model, path, items)
        about = Subject(spec.model_label or model_label(model), model_fingerprint(model), dataset_label(str(path)), dataset_fingerprint(data), "all")
    if any(METRICS[n].family == "plausibility" for n in names) and not any(i.evidence_spans for i in inputs):
        raise HeedfulError("these examples have no evidence, so plausibility metrics are undefined", hint="drop the plausibility metrics")
    digest = file_digest(path)
    key = import_key(about, spec, protocol, digest, fmt)
    imported = Run(name, name, json.loads(key.options), key)
    heedful_runs = make_runs(replace(bench, protocol=protocol), about) if spec.methods else []
    store = ResultsStore(spec.out)
    phash = protocol.hash()
    store.put_protocol(phash, protocol.name, protocol.key_dict())
    notes = [note for note in [store.legacy_note()] if note]
    stored = store.explanation_ids(key)
    todo = [item for item in items if item.id not in stored]
    if todo:
        older = store.superseded(key, [i.id for i in todo])
        explanations = align(model, todo, name, max_length=protocol.max_length, batch_size=spec.batch_size, options=json.loads(key.options))
        store.put_explanations(key, [(e.details["example_id"], e) for e in explanations])
        if older is not None:
            notes.append(older.describe(name).replace("recomputed", "imported again"))
        left = {item.id for item in todo} - {e.details["example_id"] for e in explanations}
        if left:  # generated steps whose tokens no text encodes to (see heedful.evaluate.imported_records.Record.optional)
            notes.append(f"{name}: {len(left)} generation steps left out: their tokens are not how the model encodes their text")
            inputs = [i for i in inputs if i.id not in left]
            if not inputs:
                raise HeedfulError("no imported explanation could be aligned to the model's tokens", hint="check that the file is of this model")
    ids = [i.id for i in inputs]
    taken = {name, *(r.group for r in heedful_runs)}
    others = stored_runs(store, about, key.setting, ids, taken, name)
    runs = [imported, *heedful_runs, *others]
    settings = Settings(protocol, tuple(names), bench.batch_size)
    tasks, done = list_tasks(store, runs, ids, settings, bench.chunk, notes)
    plan = Plan(replace(bench, protocol=protocol), settings, inputs, data, about, skipped, runs, tasks, done, notes)
    bar = _progress(console) if progress else None
    with bar if bar is not None else nullcontext():
        task_id = bar.add_task("explain and evaluate (method x chunk)", total=plan.total, completed=done) if bar else None
        LocalEngine().run(plan, store, lambda part, result: bar.advance(task_id, progress_share(part, result)) if bar is not None else None)
    groups, x = collect(store, runs, ids, names, protocol)
    store.close()
    shown = replace(bench, protocol=protocol, methods=list(groups), dataset=about.dataset if spec.dataset is None else spec.dataset)
    return BenchResult(
        spec=shown,
        model_name=about.model,
        task=model.task,
        n_examples=len(ids),
        skipped=skipped,
        runs=runs,
        groups=groups,
        x=x,
        computed=dict(store.written),
        store_path=store.path,
        evidence_source=getattr(data, "evidence_source", None),
        notes=notes,
        ids=list(ids),
    )


def _with_input_target(item: Record, model_input: ModelInput) -> Record:
    """A record without a target explains its example's target (the prediction, or the gold
    label under ``label="gold"``)."""
    if item.target is not None or item.target_indices is not None or model_input.target is None:
        return item
    target = model_input.target
    if target.kind == "given":
        return replace(item, target=target.value) if isinstance(target.value, str) else replace(item, target_indices=(int(target.value),))
    return item
