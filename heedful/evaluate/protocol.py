"""Every choice an evaluation makes, as one frozen, hashable :class:`Protocol`, and the presets
that reproduce each paper's protocol.

Faithfulness numbers move with the removal token, with what counts as a token, with the ratio
schedule, with the label whose probability is watched (Mask-LRP evaluates the gold label,
NormXLogit the predicted one) ... Reports must say which was used, and comparisons with a paper
are only meaningful under that paper's protocol. So each choice is a named field here, and
:data:`PRESETS` holds the protocols of the papers heedful reproduces:

* ``normxlogit`` -- Abbasi et al., NormXLogit (sinaabbasi1/NormXLogit, "Experiment 1" notebook;
  ``specs/methods.md`` §2.1): ``[MASK]`` for encoders and deletion for decoders; ``k`` in
  0, 0.1 .. 1.0 of all non-pad tokens (``int(len * k)``, [CLS] and [SEP] counted); [CLS] taken
  out of the ranking, [SEP] not; predicted label; AOPC / sufficiency averaged over k = 10 .. 90 %;
  accuracy of the perturbed predictions against the gold labels; inputs truncated to 90 tokens.
  Alignment (Experiment 2 notebook): the masked target position dropped from the ranking, [CLS]
  and [SEP] kept, dot product of softmax-normalised scores with the evidence vector, and
  average precision of the ranking.
* ``mask-lrp`` -- Song et al., Mask-LRP (LinxinS97/Mask-LRP ``evaluate_explanability.py``,
  ``utils/metrices.py``; ``specs/methods.md`` §1.6): examples of fewer than 20 tokens skipped;
  ``k = unique(round(linspace(0, 1, 10) * N))[1:]`` with N counting special tokens; tokens taken
  in descending score order skipping [CLS] / [SEP] and replaced by id 0 ([PAD] in BERT's vocab)
  with the length kept and ``token_type_ids=None``; probability of the gold label; AOPC and
  LOdds per k and their mean. ``replace_words`` stops one short of the end of the ranking, so the
  lowest-ranked position is never replaced (``skip_lowest``).
* ``ferret`` -- Attanasio et al., ferret (g8a9/ferret ``evaluators/faithfulness_measures.py``,
  ``plausibility_measures.py``, ``utils_from_soft_to_discrete.py``; ``specs/methods.md`` §4.1):
  first / last (special) tokens dropped; only positive scores enter a rationale; rationales of
  ``int(p * n)`` tokens for ``p`` in ``numpy.arange(0.1, 1.1, 0.1)`` of the n content tokens; a
  rationale equal to the previous one is skipped; rationale tokens deleted and the rest decoded
  and re-tokenised; comprehensiveness / sufficiency averaged over the remaining thresholds
  (0 and 1 when none remains); tau-LOO by deletion; token F1 and IOU on the top-5 hard
  rationale; AUPRC with negative scores set to 0.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import numpy as np

from heedful.engine.precision import CHOICES, resolve_precision
from heedful.errors import InputError

REMOVALS = ("auto", "mask", "pad", "unk", "delete", "sample")
SPECIALS = ("exclude", "leading", "include")
COUNT_BASES = ("rankable", "all")
SCHEDULES = ("fraction", "count", "linspace")
ROUNDINGS = ("floor", "round")
LABELS = ("predicted", "gold")
OUTPUTS = ("probability", "logit")
TOKEN_TYPES = ("keep", "zeros")
NORMALIZATIONS = ("softmax", "l1", "none")

TENTHS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)

LATER_FIELDS = {"precision_k": 20, "source_ks": (1, 3, 5), "lds_ablations": 32, "lds_keep": 0.5, "precision": "fp32"}
"""Fields added after results stores were first written, with their defaults: a protocol's
:meth:`Protocol.hash` leaves them out while they hold these values, so older stores keep their
keys (a changed value enters the hash as any other field)."""

CURVES_TOLERATE = ("bf16",)
"""The lower precisions ``precision="auto"`` may run the curves at (:mod:`heedful.engine.precision`):
bf16 moved AOPC by 0.0024 per example on average (at most 0.018) and kept the order of six
methods; int8 moved it by 0.09 (at most 0.84) -- 500 movie sentences, minilm-sentiment,
benchmarks/results/precision.md as of commit 5e8610f."""


@dataclass(frozen=True)
class Protocol:
    """How faithfulness and plausibility are measured. All fields have a documented meaning;
    :meth:`hash` identifies the protocol in the results store (``name``, ``citation`` and
    ``random_seeds`` do not enter the hash).

    Removal
        ``removal``: ``"auto"`` (the model's removal token: ``[MASK]`` for encoders, deletion for
        causal LMs), ``"mask"``, ``"pad"`` / ``"unk"`` (replace by that id, length kept),
        ``"delete"`` (drop the tokens; decoder anchors move), ``"sample"`` (each replaced by a
        corpus word of its part of speech: in-distribution, :mod:`heedful.evaluate.operators`).
        ``removal_id`` replaces by that
        exact id instead (Mask-LRP: 0). ``retokenize``: decode the perturbed tokens and tokenise
        the text again (ferret). ``token_types``: ``"zeros"`` sends all-zero segment ids with
        perturbed inputs (Mask-LRP passes ``token_type_ids=None``). ``loo_removal``: removal for
        tau-LOO's leave-one-out (``None``: ``removal``).
    Which tokens
        ``specials``: ``"exclude"`` (special tokens are never ranked or removed), ``"leading"``
        (only the special tokens before the first content token -- [CLS], BOS -- are kept out;
        NormXLogit), ``"include"``. A masked LM's target position is never removed.
        ``skip_lowest``: the lowest-scored position (over all tokens) is never removed
        (Mask-LRP's loop). ``only_positive``: only positively scored tokens enter a rationale.
    Ratio schedule
        ``schedule``: ``"fraction"`` (``ratios`` are fractions of ``count_base`` tokens, counts
        rounded by ``rounding``), ``"count"`` (``ratios`` are token counts, top-k),
        ``"linspace"`` (Mask-LRP: ``unique(round(linspace(0, 1, linspace_points) * N))[1:]``).
        ``count_base``: ``"rankable"`` tokens or ``"all"`` real tokens (special tokens counted).
        ``skip_repeated``: a ratio whose rationale equals the previous ratio's (or is empty) is
        skipped (ferret). ``mean_over``: inclusive range of ratios averaged into AOPC and the
        other curve means (``None``: all).
    What is watched
        ``label``: ``"predicted"`` class or ``"gold"`` label -- both the explained class and the
        class whose output is watched. ``output``: ``"probability"`` (softmax) or ``"logit"``.
        ``empty_rationale``: (comprehensiveness, sufficiency) of an example with no valid ratio
        (ferret: 0 and 1); ``None`` leaves it out.
    Examples
        ``min_length``: examples with fewer tokens (special tokens included) are skipped.
        ``max_length``: inputs are truncated to this many tokens.
    Plausibility
        ``plausibility_specials``: as ``specials`` for the evidence comparison. ``rationale_k``:
        size of the hard rationale for token F1 / IOU. ``dot_normalization``: scores are
        ``"softmax"``-ed (NormXLogit), ``"l1"``-normalised (``|s| / sum |s|``) or used as is
        before the dot product with the evidence vector.
    Context attribution (:mod:`heedful.evaluate.context`)
        ``precision_k``: how many top tokens precision@k reads (Mask-LRP: 20). ``source_ks``:
        numbers of top sources removed together for source comprehensiveness (ContextCite: 1,
        3, 5). ``lds_ablations``: random source ablations per example for the LDS, each source
        kept with probability ``lds_keep`` (ContextCite: 0.5). These fields enter :meth:`hash`
        only when they differ from their defaults (:data:`LATER_FIELDS`), so stores written
        before they existed keep their keys.
    Baseline
        ``random_seeds``: how many seeds the random baseline is run with (mean +- std).
    Speed
        ``precision``: the numeric precision of the perturbed and original forward passes --
        ``"fp32"`` (the model as loaded), ``"bf16"`` or ``"int8"`` (:mod:`heedful.engine.precision`:
        faster where the hardware has the instructions, outputs slightly off), or ``"auto"``
        (:meth:`resolved` for the model's device before any measurement: bf16 where this
        machine runs it faster, else fp32). It enters :meth:`hash` only when not ``"fp32"``.
    """

    name: str = "custom"
    removal: str = "auto"
    removal_id: int | None = None
    retokenize: bool = False
    token_types: str = "keep"
    loo_removal: str | None = None
    specials: str = "exclude"
    skip_lowest: bool = False
    only_positive: bool = False
    schedule: str = "fraction"
    ratios: tuple[float, ...] = TENTHS
    linspace_points: int = 10
    rounding: str = "floor"
    count_base: str = "rankable"
    skip_repeated: bool = False
    mean_over: tuple[float, float] | None = None
    label: str = "predicted"
    output: str = "probability"
    empty_rationale: tuple[float, float] | None = None
    min_length: int = 0
    max_length: int | None = None
    plausibility_specials: str = "exclude"
    rationale_k: int = 5
    dot_normalization: str = "softmax"
    precision_k: int = 20
    source_ks: tuple[int, ...] = (1, 3, 5)
    lds_ablations: int = 32
    lds_keep: float = 0.5
    random_seeds: int = 5
    precision: str = "fp32"
    citation: str = ""

    def __post_init__(self) -> None:
        choices = {
            "removal": REMOVALS,
            "specials": SPECIALS,
            "count_base": COUNT_BASES,
            "schedule": SCHEDULES,
            "rounding": ROUNDINGS,
            "label": LABELS,
            "output": OUTPUTS,
            "token_types": TOKEN_TYPES,
            "plausibility_specials": SPECIALS,
            "dot_normalization": NORMALIZATIONS,
            "precision": CHOICES,
        }
        for key, allowed in choices.items():
            value = getattr(self, key)
            if value not in allowed:
                raise InputError(f"protocol {key}={value!r} is not one of {', '.join(allowed)}")
        if self.loo_removal is not None and self.loo_removal not in REMOVALS:
            raise InputError(f"protocol loo_removal={self.loo_removal!r} is not one of {', '.join(REMOVALS)}")
        object.__setattr__(self, "ratios", tuple(float(r) for r in self.ratios))
        if self.schedule != "linspace" and not self.ratios:
            raise InputError("a protocol needs at least one ratio")
        if self.schedule == "fraction" and any(not 0.0 <= r <= 1.0 for r in self.ratios):
            raise InputError("fraction ratios must lie in [0, 1]", hint="use schedule='count' for token counts")
        if self.schedule == "count" and any(r < 0 or not float(r).is_integer() for r in self.ratios):
            raise InputError("count ratios must be whole numbers of tokens")
        if list(self.ratios) != sorted(self.ratios):
            raise InputError("ratios must be increasing")
        if self.schedule == "linspace" and self.linspace_points < 2:
            raise InputError("linspace_points must be at least 2")
        if self.mean_over is not None:
            object.__setattr__(self, "mean_over", (float(self.mean_over[0]), float(self.mean_over[1])))
            if not self.mean_mask.any():
                raise InputError(
                    f"protocol mean_over={self.mean_over} covers none of the curve's ratios {self.curve_ratios.tolist()}",
                    hint="set mean_over=None (all ratios) or a range that holds some of them",
                )
        if self.rationale_k < 1:
            raise InputError("rationale_k must be at least 1")
        if self.random_seeds < 1:
            raise InputError("random_seeds must be at least 1")
        if self.precision_k < 1:
            raise InputError("precision_k must be at least 1")
        object.__setattr__(self, "source_ks", tuple(int(k) for k in self.source_ks))
        if not self.source_ks or any(k < 1 for k in self.source_ks) or list(self.source_ks) != sorted(set(self.source_ks)):
            raise InputError(f"source_ks must be increasing numbers of sources from 1, got {list(self.source_ks)}", hint="e.g. (1, 3, 5)")
        if self.lds_ablations < 3:
            raise InputError(f"lds_ablations must be at least 3 (a rank correlation needs them), got {self.lds_ablations}")
        if not 0.0 < self.lds_keep < 1.0:
            raise InputError(f"lds_keep must lie strictly between 0 and 1, got {self.lds_keep}")

    # ------------------------------------------------------------------ derived views
    @property
    def curve_ratios(self) -> np.ndarray:
        """The x values of every curve ``[R]`` (nominal fractions for ``linspace``)."""
        if self.schedule == "linspace":
            return np.linspace(0.0, 1.0, self.linspace_points)[1:]
        return np.asarray(self.ratios, dtype=np.float64)

    @property
    def mean_mask(self) -> np.ndarray:
        """``[R]`` bool: the ratios averaged into curve means (AOPC and the others)."""
        x = self.curve_ratios
        if self.mean_over is None:
            return np.ones(len(x), dtype=bool)
        lo, hi = self.mean_over
        return (x >= lo - 1e-9) & (x <= hi + 1e-9)

    def key_dict(self) -> dict[str, Any]:
        """The fields that define the measurement (all but ``name``, ``citation`` and
        ``random_seeds``, which only says how many baseline runs there are)."""
        if self.precision == "auto":
            raise InputError("a protocol at precision 'auto' has no key until resolved", hint="call protocol.resolved(device) first")
        data = asdict(self)
        for label in ("name", "citation", "random_seeds"):
            data.pop(label)
        for label, default in LATER_FIELDS.items():
            if data[label] == default:
                data.pop(label)
        return data

    def hash(self) -> str:
        """Stable 16-hex-digit identity of the measurement."""
        raw = json.dumps(self.key_dict(), sort_keys=True, default=list)
        return hashlib.sha1(raw.encode()).hexdigest()[:16]

    def resolved(self, device: Any) -> Protocol:
        """This protocol with its ``precision`` resolved for ``device``
        (:func:`~heedful.engine.precision.resolve_precision`, tolerating :data:`CURVES_TOLERATE`):
        ``"auto"`` becomes the precision used; an explicit one this machine runs slower than
        fp32 warns (or, strict, is refused). The name is kept."""
        precision = resolve_precision(self.precision, device, CURVES_TOLERATE)
        return self if precision == self.precision else replace(self, precision=precision)

    def with_(self, **changes: Any) -> Protocol:
        """A copy with ``changes`` (validated); the name gets a ``*`` to show it was changed."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise InputError(f"protocol has no field {unknown[0]!r}", hint=f"fields: {', '.join(sorted(known))}")
        name = changes.pop("name", None) or (self.name if self.name.endswith("*") else self.name + "*")
        return replace(self, name=name, **changes)

    def describe(self) -> list[tuple[str, str]]:
        """``(field, value)`` pairs for reports."""
        return [(f.name, json.dumps(getattr(self, f.name), default=list)) for f in fields(self) if f.name != "citation"]


PRESETS: dict[str, Protocol] = {
    "normxlogit": Protocol(
        name="normxlogit",
        removal="auto",
        specials="leading",
        count_base="all",
        schedule="fraction",
        ratios=(0.0, *TENTHS),
        rounding="floor",
        mean_over=(0.1, 0.9),
        label="predicted",
        output="probability",
        max_length=90,
        plausibility_specials="include",
        dot_normalization="softmax",
        citation="Abbasi et al. 2025, NormXLogit, §4.1 Eq. 10 and §5.1 Eq. 11 (sinaabbasi1/NormXLogit notebooks)",
    ),
    "mask-lrp": Protocol(
        name="mask-lrp",
        removal="pad",
        removal_id=0,
        token_types="zeros",
        specials="exclude",
        skip_lowest=True,
        count_base="all",
        schedule="linspace",
        linspace_points=10,
        rounding="round",
        label="gold",
        output="probability",
        min_length=20,
        citation="Song et al. 2024, Mask-LRP, §4 Eq. 12-13 (LinxinS97/Mask-LRP evaluate_explanability.py)",
    ),
    "ferret": Protocol(
        name="ferret",
        removal="delete",
        retokenize=True,
        specials="exclude",
        only_positive=True,
        count_base="rankable",
        schedule="fraction",
        ratios=tuple(np.arange(0.1, 1.1, 0.1).tolist()),
        rounding="floor",
        skip_repeated=True,
        label="predicted",
        output="probability",
        empty_rationale=(0.0, 1.0),
        plausibility_specials="exclude",
        rationale_k=5,
        citation="Attanasio et al. 2023, ferret (g8a9/ferret evaluators/); DeYoung et al. 2020, ERASER",
    ),
}
PRESETS["default"] = PRESETS["normxlogit"].with_(name="default", max_length=None)


def get_protocol(protocol: str | Protocol | None = None, **changes: Any) -> Protocol:
    """A preset by name (``normxlogit``, ``mask-lrp``, ``ferret``, ``default``) or a
    :class:`Protocol`, with optional field ``changes``."""
    if protocol is None:
        protocol = "default"
    if isinstance(protocol, str):
        key = protocol.lower().replace("_", "-")
        if key not in PRESETS:
            raise InputError(f"unknown protocol preset {protocol!r}", hint=f"presets: {', '.join(PRESETS)}")
        protocol = PRESETS[key]
    return protocol.with_(**changes) if changes else protocol
