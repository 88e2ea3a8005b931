"""Causal tracing: which hidden states carry a prediction (Meng et al. 2022, ROME, Sec. 2.1).

    trace = heedful.trace(model, "The capital of France is", corrupt="France", target=" Paris")
    trace.show()          # layer x position grid of indirect effects, AtP's beside it
    trace.to_frame()      # one row per cell (pandas)

Three runs: the *clean* run on the prompt; the *corrupted* run, the subject span's word
embeddings noised with ``N(0, (noise * sigma)^2)`` (ROME: ``noise = 3``, ``sigma`` the standard
deviation of the embeddings; here of the whole embedding matrix), ``samples`` draws averaged --
or, with ``counterfactual``, a second prompt of the same token length (clean/corrupted pair,
one run); and the *corrupted-with-restoration* runs, one per cell, each restoring one site (a
hidden state, a sub-layer output, a head) to its clean value. A cell's indirect effect is
``M(restored) - M(corrupted)``, ``M`` the target's probability at the anchor (or another
:data:`~heedful.inside.patching.METRICS`). All restorations run batched
(:mod:`heedful.inside.patching`); attribution patching estimates the same grid from one
backward (:mod:`heedful.inside.atp`), and their Spearman correlation says how far the fast
estimate can be trusted on this prompt.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from heedful.errors import Hint, InputError
from heedful.inside.atp import attribution_patching, graddrop
from heedful.inside.patching import (
    KINDS,
    METRICS,
    Readout,
    Runs,
    patch,
    recorded,
    require_roles,
    restore_cells,
    unchanged_sites,
)

if TYPE_CHECKING:
    import pandas as pd

    from heedful.adapters import ModelAdapter
    from heedful.model import Model


@dataclass
class Trace:
    """A causal trace of one prompt.

    ``effect`` ``[L, N]`` (kind ``head``: ``[L, H]``): each cell's indirect effect, NaN where not
    computed (Ctrl-C); ``atp``: attribution patching's estimate of it (``None``: not asked);
    ``graddrop``: AtP*'s GradDrop magnitude estimate (``None``: not asked); ``columns``: the
    decoded tokens (or ``head 0`` ...); ``corrupted``: the positions noised (noise) or differing
    (a prompt pair); ``clean_score`` / ``corrupted_score``: the metric without restoration."""

    prompt: str
    kind: str
    metric: str
    target: str
    columns: list[str]
    corrupted: list[int]
    effect: np.ndarray
    clean_score: float
    corrupted_score: float
    atp: np.ndarray | None = None
    graddrop: np.ndarray | None = None
    window: int = 1
    samples: int = 1
    counterfactual: str | None = None
    contrast: str | None = None
    passes: int = 0
    seconds: float = 0.0
    atp_seconds: float = 0.0
    complete: bool = True
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def role(self) -> str:
        return KINDS[self.kind]

    @property
    def layers(self) -> int:
        return self.effect.shape[0]

    @property
    def spearman(self) -> float:
        """Spearman correlation of AtP's grid with the exact one over the computed cells (NaN
        without AtP, or with a constant grid)."""
        return _spearman(self.effect, self.atp)

    @property
    def graddrop_spearman(self) -> float:
        """Spearman correlation of GradDrop's magnitudes with the exact effects' magnitudes."""
        return _spearman(np.abs(self.effect), self.graddrop)

    def to_frame(self) -> pd.DataFrame:
        """One row per cell: ``layer``, ``position`` (or ``head``), ``token``, ``effect`` and, when
        computed, ``atp`` and ``graddrop``."""
        import pandas as pd

        layers, cols = np.meshgrid(np.arange(self.effect.shape[0]), np.arange(self.effect.shape[1]), indexing="ij")
        column = "head" if self.kind == "head" else "position"
        data: dict[str, Any] = {"layer": layers.ravel(), column: cols.ravel()}
        if self.kind != "head":
            data["token"] = [self.columns[c] for c in cols.ravel()]
        data["effect"] = self.effect.ravel()
        for name in ("atp", "graddrop"):
            if getattr(self, name) is not None:
                data[name] = getattr(self, name).ravel()
        return pd.DataFrame(data)

    def to_dict(self) -> dict[str, Any]:
        """Everything as plain JSON-ready data (NaN as ``None``)."""

        def grid(a: np.ndarray | None) -> list | None:
            return None if a is None else [[None if not math.isfinite(v) else float(v) for v in row] for row in a]

        def number(v: float) -> float | None:
            return float(v) if math.isfinite(v) else None

        return {
            "prompt": self.prompt,
            "counterfactual": self.counterfactual,
            "kind": self.kind,
            "role": self.role,
            "window": self.window,
            "metric": self.metric,
            "target": self.target,
            "contrast": self.contrast,
            "samples": self.samples,
            "columns": self.columns,
            "corrupted": self.corrupted,
            "clean_score": self.clean_score,
            "corrupted_score": self.corrupted_score,
            "effect": grid(self.effect),
            "atp": grid(self.atp),
            "graddrop": grid(self.graddrop),
            "spearman": number(self.spearman),
            "graddrop_spearman": number(self.graddrop_spearman),
            "passes": self.passes,
            "seconds": self.seconds,
            "atp_seconds": self.atp_seconds,
            "complete": self.complete,
            "options": self.options,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def show(self) -> None:
        """Print the grid (and AtP's beside it) in the terminal."""
        from rich.console import Console

        from heedful.render.grid import trace_renderable

        Console().print(trace_renderable(self))

    def html(self) -> str:
        """A self-contained HTML page of the grids."""
        from heedful.render.grid import trace_page

        return trace_page(self)

    def _repr_html_(self) -> str:
        from heedful.render.grid import trace_fragment

        return trace_fragment(self)


def _spearman(a: np.ndarray, b: np.ndarray | None) -> float:
    if b is None:
        return math.nan
    keep = np.isfinite(a) & np.isfinite(b)
    x, y = a[keep], b[keep]
    if x.size < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return math.nan
    from scipy.stats import spearmanr

    return float(spearmanr(x, y).statistic)


def span_positions(batch, text: str, span: str) -> list[int]:
    """The token positions of the first occurrence of ``span`` in ``text`` (every token whose
    characters overlap it); a one-line :class:`InputError` when it is not there."""
    if not span or not span.strip():
        raise InputError("the span to corrupt is empty", hint=Hint("give corrupt='a word of the prompt'", "give --corrupt 'a word of the prompt'"))
    start = text.find(span)
    if start < 0:
        lower = text.lower().find(span.lower())
        found = f" (it is there as {text[lower : lower + len(span)]!r}: the match is case-sensitive)" if lower >= 0 else ""
        raise InputError(f"{span!r} is not in the prompt {text!r}{found}", hint="corrupt a span that the prompt contains")
    stop = start + len(span)
    positions = [i for i, off in enumerate(batch.offsets[0]) if off is not None and off[0] < stop and off[1] > start and off[1] > off[0]]
    if not positions:
        raise InputError(f"{span!r} covers no token of the prompt", hint="corrupt a word, not whitespace")
    return positions


def _adapter(model: Model | ModelAdapter) -> ModelAdapter:
    return getattr(model, "adapter", model)


def check_options(kind: str, metric: str, samples: int, noise: float, window: int) -> None:
    """Refuse, in one line and before any work, options :func:`trace` cannot take."""
    if kind not in KINDS:
        raise InputError(f"unknown kind {kind!r}", hint=f"one of {', '.join(KINDS)}")
    if metric not in METRICS:
        raise InputError(f"unknown metric {metric!r}", hint=f"one of {', '.join(METRICS)}")
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise InputError(f"samples must be a positive integer, got {samples!r}", hint="ROME averages 10 noise samples")
    if not (isinstance(noise, int | float) and math.isfinite(noise) and noise > 0):
        raise InputError(f"noise must be a positive number of standard deviations, got {noise!r}", hint="ROME uses 3")
    if window < 1:
        raise InputError(f"window must be at least 1, got {window}", hint="window=1 restores one layer per cell; ROME uses 10 for MLP and attention")


def prepare_runs(
    adapter: ModelAdapter,
    prompt: str,
    *,
    corrupt: str | None,
    counterfactual: str | None,
    target: str | int | None,
    contrast: str | int | None,
    metric: str,
    noise: float,
    samples: int,
    seed: int,
) -> tuple[Runs, list[int], int | None]:
    """The clean and corrupted inputs of a trace, the corrupted positions and the contrast column."""
    if (corrupt is None) == (counterfactual is None):
        raise InputError(
            "give either a span to corrupt with noise or a counterfactual prompt, not both or neither",
            hint=Hint("pass corrupt='France' or counterfactual='The capital of Italy is'", "pass --corrupt France or --counterfactual 'The capital of Italy is'"),
        )
    texts = [prompt] if counterfactual is None else [prompt, counterfactual]
    batch = adapter.encode(texts, truncation=False)
    lengths = batch.lengths.tolist()
    if counterfactual is not None and lengths[0] != lengths[1]:
        raise InputError(
            f"the counterfactual prompt has {lengths[1]} tokens, the prompt {lengths[0]}; patching needs them aligned",
            hint="reword the counterfactual so that both tokenize to the same length (e.g. swap one single-token word)",
        )
    device = adapter.device
    clean_batch = batch.select([0]) if counterfactual is not None else batch
    anchor = adapter.anchor_positions(clean_batch)[0].to(device)  # [1]
    with torch.no_grad():
        embeds = adapter.embed(batch.input_ids.to(device))
    clean = embeds[:1]
    if counterfactual is None:
        positions = span_positions(clean_batch, prompt, corrupt)
        sigma = float(adapter.word_embeddings.weight.float().std()) * noise
        generator = torch.Generator().manual_seed(seed)
        draws = torch.randn((samples, len(positions), clean.shape[-1]), generator=generator).to(device, clean.dtype) * sigma
        corrupted = clean.repeat(samples, 1, 1)
        corrupted[:, positions] += draws
    else:
        positions = (batch.input_ids[0] != batch.input_ids[1]).nonzero().flatten().tolist()
        if not positions:
            raise InputError("the counterfactual prompt is the prompt itself", hint="change the words whose effect you want to trace")
        corrupted = embeds[1:]
    if target is None:
        with torch.no_grad():
            column = int(adapter.forward(clean_batch, anchor).logits[0].argmax())
    else:
        column = adapter.output_index(target)
    other: int | None = None
    if metric == "logit_diff":
        if contrast is None and counterfactual is None:
            raise InputError("metric 'logit_diff' needs a contrast token", hint=Hint("pass contrast=' Rome'", "pass --contrast ' Rome'"))
        if contrast is None:
            with torch.no_grad():
                other = int(adapter.forward(batch.select([1]), anchor).logits[0].argmax())
        else:
            other = adapter.output_index(contrast)
        if other == column:
            raise InputError("the contrast is the target itself", hint="contrast the target with another output")
    runs = Runs(clean_batch, anchor, clean, corrupted, Readout(metric, column, other))
    return runs, positions, other


def trace(
    model: Model | ModelAdapter,
    prompt: str,
    *,
    corrupt: str | None = None,
    counterfactual: str | None = None,
    target: str | int | None = None,
    kind: str = "residual",
    window: int = 1,
    metric: str = "prob",
    contrast: str | int | None = None,
    noise: float = 3.0,
    samples: int = 10,
    seed: int = 0,
    atp: bool = True,
    gradient_dropout: bool = False,
) -> Trace:
    """Trace which hidden states carry ``model``'s output for ``prompt`` (see the module docstring).

    ``corrupt``: the span of ``prompt`` whose word embeddings are noised (``noise`` standard
    deviations, ``samples`` draws from ``seed``); or ``counterfactual``: a prompt of the same
    token length to patch into. ``target``: the output read (default: the clean prediction; a
    language model's target is one token, e.g. ``" Paris"``). ``kind``: what is restored --
    ``residual`` (block outputs), ``attn`` / ``mlp`` (sub-layer outputs, ``window`` layers per
    cell) or ``head`` (each head at every position: an ``[L, H]`` grid). ``metric``: one of
    :data:`~heedful.inside.patching.METRICS` (``logit_diff`` against ``contrast``, by default
    the counterfactual's prediction). ``atp``: also attribution patching's grid;
    ``gradient_dropout``: also AtP*'s GradDrop magnitudes.

    Cells that restore only sites the corruption left unchanged (in a causal model, every
    position before the first corrupted token) run no pass: their effect is 0. Ctrl-C during the
    exact grid returns the cells computed so far (``complete=False``)."""
    check_options(kind, metric, samples, noise, window)
    adapter = _adapter(model)
    groups = require_roles(adapter, kind)
    runs, positions, other = prepare_runs(
        adapter, prompt, corrupt=corrupt, counterfactual=counterfactual, target=target, contrast=contrast,
        metric=metric, noise=noise, samples=samples, seed=seed,
    )
    layers, width = len(adapter.roles().blocks), runs.width
    cells = restore_cells(layers, width, groups, kind, window)
    with torch.no_grad():  # the clean and the corrupted rows in one pass
        states, both = recorded(adapter, runs, torch.cat([runs.clean, runs.corrupted]), kind)
    clean_states, corrupted_states = [s[:1] for s in states], [s[1:] for s in states]
    clean_score, corrupted_scores = both[:1], both[1:]
    began = time.perf_counter()
    estimate = attribution_patching(adapter, runs, kind, clean_states, cells) if atp else None
    dropped = graddrop(adapter, runs, kind, clean_states, cells) if gradient_dropout else None
    atp_seconds = time.perf_counter() - began
    began = time.perf_counter()
    unchanged = unchanged_sites(clean_states, corrupted_states, groups)
    needed = (cells & ~unchanged[None]).flatten(1).any(dim=1)  # a cell restoring only unchanged sites changes nothing
    patched = patch(adapter, runs, kind, clean_states, cells[needed], description=f"tracing {layers} layers")
    seconds = time.perf_counter() - began
    corrupted_score = float(corrupted_scores.mean())
    scores = torch.full((len(cells),), corrupted_score)
    scores[needed] = patched.scores
    shape = (layers, groups if kind == "head" else width)
    effect = (scores - corrupted_score).view(shape).numpy()
    columns = [f"head {h}" for h in range(groups)] if kind == "head" else adapter.readable_tokens(runs.batch.input_ids[0].tolist(), runs.batch.tokens[0])
    return Trace(
        prompt=prompt,
        kind=kind,
        metric=metric,
        target=adapter.output_name(runs.readout.target),
        columns=columns,
        corrupted=positions,
        effect=effect,
        clean_score=float(clean_score[0]),
        corrupted_score=corrupted_score,
        atp=None if estimate is None else estimate.view(shape).numpy(),
        graddrop=None if dropped is None else dropped.view(shape).numpy(),
        window=window,
        samples=runs.samples,
        counterfactual=counterfactual,
        contrast=None if other is None else adapter.output_name(other),
        passes=patched.passes + 1,
        seconds=seconds,
        atp_seconds=atp_seconds,
        complete=bool(patched.done.all()) and not patched.interrupted,
        options={"noise": noise, "seed": seed} if counterfactual is None else {},
    )
