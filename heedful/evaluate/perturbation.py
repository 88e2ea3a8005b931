"""Batched perturbation curves: every (example x ratio) perturbed copy built at once with
:func:`heedful.engine.perturb.remove_tokens` and sent through the model in chunks.

Shapes: B examples, N positions (padded), R ratios, M perturbed rows (``M <= B * R``).

The flow is :func:`prepare` (re-encode the explained texts, rank their tokens by score, watch
the explained output on the originals) -> :func:`curve` (remove the top-ranked tokens --
comprehensiveness / deletion -- or keep only them -- sufficiency / insertion -- at every ratio)
and :func:`leave_one_out` (for tau-LOO). Nothing here names an architecture: removal tokens,
anchors and special tokens come from the adapter's roles and the tokenizer's own flags.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from heedful.adapters import ModelAdapter
from heedful.engine.batch import Batch
from heedful.engine.perturb import Perturbed, removal_id, remove_tokens, trailing_special_positions
from heedful.engine.problem import Problem
from heedful.engine.problem import prepare as prepare_problem
from heedful.engine.runner import Copies, Runner
from heedful.engine.targets import Columns, ResolvedTarget
from heedful.errors import HeedfulError, InputError
from heedful.evaluate import operators
from heedful.evaluate.protocol import Protocol
from heedful.explanation import Explanation


@dataclass
class Outputs:
    """What the model gives for the explained target on some rows ``[M]`` (float64 / long).

    ``output``: the watched quantity (probability or logit per the protocol; the value for
    regression); ``probability`` / ``log_probability`` of the target (NaN for regression);
    ``predicted``: argmax class (-1 for regression); ``value``: the raw first output (regression).
    """

    output: np.ndarray
    probability: np.ndarray
    log_probability: np.ndarray
    predicted: np.ndarray
    value: np.ndarray

    FIELDS = ("output", "probability", "log_probability", "predicted", "value")

    @classmethod
    def empty(cls, shape: tuple[int, ...]) -> Outputs:
        nan = np.full(shape, np.nan)
        return cls(nan.copy(), nan.copy(), nan.copy(), np.full(shape, -1, dtype=np.int64), nan.copy())

    def take(self, index: np.ndarray) -> Outputs:
        return Outputs(*(getattr(self, f)[index] for f in self.FIELDS))

    def put(self, index: tuple[np.ndarray, ...], rows: Outputs) -> None:
        for f in self.FIELDS:
            getattr(self, f)[index] = getattr(rows, f)

    @classmethod
    def of(cls, values: tuple[torch.Tensor, ...]) -> Outputs:
        return cls(*(v.cpu().numpy() for v in values))


def target_outputs(target: ResolvedTarget, logits: torch.Tensor, output: str) -> Outputs:
    """:class:`Outputs` from anchor logits ``[M, C]`` for rows of ``target`` (already selected)."""
    return Outputs.of(output_tensors(target, logits, output))


def output_tensors(target: ResolvedTarget, logits: torch.Tensor, output: str) -> tuple[torch.Tensor, ...]:
    """The :class:`Outputs` fields as tensors ``[M]`` (float64 / long) from anchor logits
    ``[M, C]`` for rows of ``target``."""
    logits = logits.detach().float()
    weights = target.weights.to(torch.float64)
    classes = target.classes.to(logits.device)
    picked = logits.gather(1, classes).double()  # [M, K]
    score = (picked * weights).sum(dim=1)
    value = logits[:, 0].double()
    if target.task == "regression":
        nan = torch.full_like(score, float("nan"))
        pred = torch.full(score.shape, -1, dtype=torch.long)
        return score, nan, nan, pred, value
    log_probs = torch.log_softmax(logits, dim=-1)  # float32; exp in float64 below
    picked_lp = log_probs.gather(1, classes).double()  # [M, K]
    prob = (picked_lp.exp() * weights).sum(dim=1)
    log_prob = picked_lp[:, 0] if picked_lp.shape[1] == 1 else torch.log(prob.clamp(min=1e-300))
    chosen = prob if output == "probability" else score
    return chosen, prob, log_prob, logits.argmax(dim=-1), value


@dataclass
class Prepared:
    """Explained examples ready to be perturbed: the :class:`~heedful.Problem` of the explained
    texts and targets, and the explanations' rankings.

    ``scores`` ``[B, N]`` float64 (last layer for layer-wise explanations); ``rankable``
    ``[B, N]``: positions that may be ranked and removed; ``eligible``: rankable positions that
    may enter a rationale (positive ones only under ``only_positive``); ``ranks`` ``[B, N]``:
    0 for the highest-scored eligible position; ``base`` ``[B]``: the token count ratios are
    fractions of; ``kept`` ``[B]``: examples long enough for the protocol; ``original``: the
    unperturbed outputs ``[B]``; ``replacements`` ``[B, N]``: each position's in-distribution
    replacement under the ``sample`` operator (:mod:`heedful.evaluate.operators`; ``None``
    when the protocol does not sample).
    """

    problem: Problem
    protocol: Protocol
    scores: torch.Tensor
    rankable: torch.Tensor
    eligible: torch.Tensor
    ranks: torch.Tensor
    base: torch.Tensor
    kept: np.ndarray
    original: Outputs
    replacements: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.problem)

    @property
    def adapter(self) -> ModelAdapter:
        return self.problem.adapter

    @property
    def batch(self) -> Batch:
        return self.problem.batch

    @property
    def target(self) -> ResolvedTarget:
        return self.problem.target

    def runner(self, chunk: int | None = None) -> Runner:
        return Runner.for_problem(self.problem, rows=chunk)


def _scores_matrix(explanations: Sequence[Explanation], width: int) -> torch.Tensor:
    scores = torch.zeros(len(explanations), width, dtype=torch.float64)
    for b, expl in enumerate(explanations):
        row = np.asarray(expl.scores, dtype=np.float64)
        if row.ndim == 2:
            row = row[-1]
        scores[b, : row.shape[0]] = torch.from_numpy(np.nan_to_num(row, nan=0.0))
    return scores


def explained_columns(explanations: Sequence[Explanation]) -> Columns:
    """The output each explanation explained, so a metric watches exactly that output."""
    widths = {len(e.target.indices) for e in explanations}
    if len(widths) != 1:
        raise InputError("explanations of one evaluation must all explain the same kind of target")
    return Columns(
        tuple(tuple(e.target.indices) for e in explanations),
        (1.0,) if widths == {1} else (1.0, -1.0),
        tuple(e.target.label for e in explanations),
    )


def rankable_positions(
    batch: Batch, target: ResolvedTarget, specials: str, scores: torch.Tensor | None = None, skip_lowest: bool = False
) -> torch.Tensor:
    """``[B, N]`` bool: positions a protocol may rank and remove (see :class:`Protocol`)."""
    real = batch.attention_mask.bool()
    special = batch.special_mask.bool() & real
    if specials == "exclude":
        allowed = real & ~special
    elif specials == "leading":
        allowed = (real & ~special) | trailing_special_positions(batch)
    else:
        allowed = real.clone()
    if target.anchor_kind == "fixed":  # a masked LM's target position is never removed
        allowed[torch.arange(len(batch)), target.anchor] = False
    if skip_lowest and scores is not None:
        # Mask-LRP's replace_words walks argsort(-scores) but stops before its last entry
        key = torch.where(real, -scores, torch.full_like(scores, -torch.inf))
        lowest = torch.sort(key, dim=1, stable=True).indices[:, -1]
        allowed[torch.arange(len(batch)), lowest] = False
    return allowed


def descending_ranks(scores: torch.Tensor, eligible: torch.Tensor) -> torch.Tensor:
    """``[B, N]`` rank of each position by descending score among ``eligible`` ones (ties: the
    earlier position first); ineligible positions rank after all eligible ones."""
    key = torch.where(eligible, -scores, torch.full_like(scores, torch.inf))
    order = torch.sort(key, dim=1, stable=True).indices
    ranks = torch.empty_like(order)
    ranks.scatter_(1, order, torch.arange(scores.shape[1]).expand_as(order).contiguous())
    return ranks


@torch.no_grad()
def prepare(
    adapter: ModelAdapter,
    explanations: Sequence[Explanation],
    protocol: Protocol,
    chunk: int | None = None,
) -> Prepared:
    """Re-encode the explained texts, check they give the explanations' tokens, rank and watch.

    Raises :class:`HeedfulError` when an explanation's tokens differ from the re-encoding (it was
    computed with another tokenizer or ``max_length``).
    """
    if not explanations:
        raise InputError("no explanations to evaluate")
    texts = [e.text for e in explanations]
    pairs = [e.text_pair for e in explanations]
    batch = adapter.encode(texts, pairs if any(p is not None for p in pairs) else None, True, protocol.max_length)
    for b, expl in enumerate(explanations):
        if batch.tokens[b] != list(expl.raw_tokens):
            raise HeedfulError(
                f"explanation {b} ({expl.method}) has {len(expl.tokens)} tokens but the text encodes to "
                f"{len(batch.tokens[b])} here",
                hint="evaluate with the model and max_length the explanation was computed with",
            )
    problem = _prepared_once(adapter, batch, explanations)
    target = problem.target
    scores = _scores_matrix(explanations, batch.seq_len)
    rankable = rankable_positions(batch, target, protocol.specials, scores, protocol.skip_lowest)
    eligible = rankable & (scores > 0) if protocol.only_positive else rankable
    ranks = descending_ranks(scores, eligible)
    base = rankable.sum(dim=1) if protocol.count_base == "rankable" else batch.attention_mask.sum(dim=1)
    kept = (batch.lengths >= protocol.min_length).numpy()
    original = target_outputs(target, problem.reference.logits, protocol.output)
    sampled = "sample" in (protocol.removal, protocol.loo_removal)
    replacements = operators.sampled_replacements(adapter, batch) if sampled else None
    return Prepared(problem, protocol, scores, rankable, eligible, ranks, base, kept, original, replacements)


def _prepared_once(adapter: ModelAdapter, batch: Batch, explanations: Sequence[Explanation]) -> Problem:
    """The problem of the explained examples, each distinct (text, pair, explained output) run
    through the model once: explanations of one text by several methods share their original."""
    keys = [(e.text, e.text_pair, tuple(e.target.indices)) for e in explanations]
    index: dict[tuple, int] = {}
    first = [index.setdefault(key, b) for b, key in enumerate(keys)]
    if len(index) == len(keys):
        return prepare_problem(adapter, batch, explained_columns(explanations))
    unique = list(index.values())
    problem = prepare_problem(adapter, batch.select(unique), explained_columns([explanations[b] for b in unique]))
    slot = {b: u for u, b in enumerate(unique)}
    return replace(problem.select([slot[b] for b in first]), batch=batch)


# ---------------------------------------------------------------------------- schedules
def rationale_sizes(prepared: Prepared) -> tuple[np.ndarray, torch.Tensor, torch.Tensor]:
    """Curve x values ``[R]``, rationale sizes ``[B, R]`` (long) and validity ``[B, R]`` (bool).

    A size is how many eligible top-ranked tokens form the rationale at that ratio (capped at the
    number of eligible tokens); invalid entries are skipped ratios (duplicates under
    ``linspace`` or ``skip_repeated``) and examples the protocol skips.
    """
    p = prepared.protocol
    base = prepared.base.to(torch.float64)
    x = p.curve_ratios
    if p.schedule == "count":
        counts = torch.tensor(p.ratios, dtype=torch.float64).expand(len(prepared), -1).clone()
    else:
        fractions = np.linspace(0.0, 1.0, p.linspace_points) if p.schedule == "linspace" else np.asarray(p.ratios)
        raw = base[:, None] * torch.from_numpy(fractions)[None, :]
        counts = torch.floor(raw) if p.rounding == "floor" else torch.from_numpy(np.round(raw.numpy()))
    counts = counts.long()
    valid = torch.ones_like(counts, dtype=torch.bool)
    if p.schedule == "linspace":
        # numpy's dict.fromkeys de-duplication keeps first occurrences; then [1:] drops k = 0
        valid = torch.cat([torch.zeros(len(prepared), 1, dtype=torch.bool), counts[:, 1:] != counts[:, :-1]], dim=1)
        counts, valid = counts[:, 1:], valid[:, 1:]
    n_eligible = prepared.eligible.sum(dim=1, keepdim=True)
    sizes = torch.minimum(counts, n_eligible)
    if p.skip_repeated:
        previous = torch.cat([torch.zeros(len(prepared), 1, dtype=torch.long), sizes[:, :-1]], dim=1)
        valid &= (sizes > 0) & (sizes != previous)
    valid &= torch.from_numpy(prepared.kept)[:, None]
    return x, sizes, valid


def removal_masks(prepared: Prepared, sizes: torch.Tensor, mode: str) -> torch.Tensor:
    """``[B, R, N]`` positions removed at each ratio: the rationale (``"remove"``) or every
    rankable position outside it (``"keep"``)."""
    top = prepared.eligible[:, None, :] & (prepared.ranks[:, None, :] < sizes[:, :, None])
    if mode == "remove":
        return top
    if mode == "keep":
        return prepared.rankable[:, None, :] & ~top
    raise InputError(f"unknown curve mode {mode!r}", hint="use 'remove' or 'keep'")


@torch.no_grad()
def curve(prepared: Prepared, mode: str, chunk: int | None = None) -> tuple[np.ndarray, Outputs, np.ndarray]:
    """Outputs at every ratio: x ``[R]``, :class:`Outputs` of shape ``[B, R]``, valid ``[B, R]``.

    ``mode="remove"``: the top-ranked tokens are removed (comprehensiveness, deletion curve);
    ``"keep"``: only they are kept (sufficiency, insertion curve). Rows whose removal set is
    empty reuse the original outputs; all other rows run as chunked batches.
    """
    x, sizes, valid = rationale_sizes(prepared)
    remove = removal_masks(prepared, sizes, mode)  # [B, R, N]
    bsz, n_ratios = sizes.shape
    result = Outputs.empty((bsz, n_ratios))
    nonempty = remove.any(dim=2)
    same = valid & ~nonempty
    if same.any():
        b_idx = same.nonzero(as_tuple=True)[0].numpy()
        result.put(tuple(t.numpy() for t in same.nonzero(as_tuple=True)), prepared.original.take(b_idx))
    todo = valid & nonempty
    if todo.any():
        ex, ratio = todo.nonzero(as_tuple=True)
        rows = forward_removed(prepared, ex, remove[ex, ratio], prepared.protocol.removal, chunk)
        result.put((ex.numpy(), ratio.numpy()), rows)
    return x, result, valid.numpy()


@torch.no_grad()
def leave_one_out(prepared: Prepared, chunk: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Output drop ``original - perturbed`` when each rankable token alone is removed.

    Returns drops ``[B, N]`` (NaN at positions not removed) and the rankable mask ``[B, N]``.
    Removal is ``loo_removal`` (or ``removal``), re-tokenised when the protocol says so.
    """
    mask = prepared.rankable & torch.from_numpy(prepared.kept)[:, None]
    ex, pos = mask.nonzero(as_tuple=True)
    drops = np.full(tuple(mask.shape), np.nan)
    if len(ex):
        remove = torch.zeros(len(ex), prepared.batch.seq_len, dtype=torch.bool)
        remove[torch.arange(len(ex)), pos] = True
        removal = prepared.protocol.loo_removal or prepared.protocol.removal
        rows = forward_removed(prepared, ex, remove, removal, chunk)
        drops[ex.numpy(), pos.numpy()] = prepared.original.output[ex.numpy()] - rows.output
    return drops, mask.numpy()


# ---------------------------------------------------------------------------- forwards
def replacement_for(adapter: ModelAdapter, protocol: Protocol, removal: str) -> int | None:
    """Token id that replaces removed tokens (``None``: delete them)."""
    if protocol.removal_id is not None and removal == protocol.removal:
        return int(protocol.removal_id)
    return removal_id(adapter, removal)


def replaced_ids(prepared: Prepared, ex: torch.Tensor, remove: torch.Tensor, removal: str) -> torch.Tensor | None:
    """The input builder of the operators that keep the length: ids ``[M, N]`` of examples
    ``ex`` with the ``remove`` ``[M, N]`` positions replaced -- by one special token, or under
    ``sample`` by each position's in-distribution replacement
    (:func:`~heedful.evaluate.operators.sampled_replacements`); ``None`` for deletion."""
    ids = prepared.batch.input_ids[ex]
    remove = remove.bool() & prepared.batch.attention_mask[ex].bool()
    if removal == "sample":
        if prepared.replacements is None:
            raise InputError("the sample operator needs its replacements prepared", hint="prepare with a protocol whose removal is 'sample'")
        return torch.where(remove, prepared.replacements[ex], ids)
    token = replacement_for(prepared.adapter, prepared.protocol, removal)
    return None if token is None else torch.where(remove, torch.full_like(ids, token), ids)


def forward_removed(
    prepared: Prepared, ex: torch.Tensor, remove: torch.Tensor, removal: str, chunk: int | None = None
) -> Outputs:
    """Outputs for perturbed copies: row ``r`` is example ``ex[r]`` with ``remove[r]`` ``[N]`` removed."""
    if len(ex) == 0:
        return Outputs.empty((0,))
    if prepared.protocol.retokenize:
        return _forward_retokenized(prepared, ex, remove, chunk)
    adapter, batch, protocol = prepared.adapter, prepared.batch, prepared.protocol
    types = None
    if adapter.uses_token_types:
        source = batch.token_type_ids if batch.token_type_ids is not None else torch.zeros_like(batch.input_ids)
        types = torch.zeros_like(source[ex]) if protocol.token_types == "zeros" else source[ex]
    replaced = replaced_ids(prepared, ex, remove, removal)
    if replaced is not None:  # an operator that keeps the length: only the ids change
        perturbed = Perturbed(replaced, batch.attention_mask[ex], types, prepared.target.anchor[ex])
    else:
        perturbed = remove_tokens(
            batch.input_ids[ex], batch.attention_mask[ex], remove, prepared.target.anchor[ex],
            prepared.target.anchor_kind, None, adapter.pad_token_id, types,
        )

    # a row that recurs (a rationale equal at several ratios; one text explained by several
    # methods, or everything removed) runs once: rows with the same ids, mask, segments, anchor
    # and explained output columns give the same outputs
    key = [prepared.target.classes[ex].long(), perturbed.input_ids, perturbed.attention_mask, perturbed.anchor.reshape(len(ex), -1)]
    if perturbed.token_type_ids is not None:
        key.append(perturbed.token_type_ids)
    first, inverse = distinct_rows(torch.cat(key, dim=1))
    unique = Perturbed(
        perturbed.input_ids[first],
        perturbed.attention_mask[first],
        None if perturbed.token_type_ids is None else perturbed.token_type_ids[first],
        perturbed.anchor[first],
    )

    def read(part, fwd):
        return output_tensors(part.target, fwd.logits, protocol.output)

    found = prepared.runner(chunk).map(Copies.of(unique, ex[first]), read)
    return Outputs.of(tuple(v[inverse] for v in found))


def distinct_rows(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The first occurrence of each distinct row of ``rows`` ``[M, W]`` (``[U]``, in order of
    appearance) and, for every row, which of them it equals (``[M]`` indices into ``[U]``)."""
    _, inverse = torch.unique(rows, dim=0, return_inverse=True)
    order = torch.full((int(inverse.max()) + 1,), rows.shape[0], dtype=torch.long)
    order.scatter_reduce_(0, inverse, torch.arange(rows.shape[0]), "amin")
    first, rank = torch.sort(order)
    position = torch.empty_like(rank)
    position[rank] = torch.arange(len(rank))
    return first, position[inverse]


def _forward_retokenized(prepared: Prepared, ex: torch.Tensor, remove: torch.Tensor, chunk: int | None) -> Outputs:
    """ferret's removal: drop the removed tokens, decode what is left of each segment, tokenise
    the text again (special tokens added anew) and run it.

    Each distinct text (pair) runs once -- ratios and examples that leave the same text (all
    tokens deleted, the same sentence twice, explanations of one text by several methods) share
    a row -- and the distinct rows run in chunks of similar length, each padded only to its own
    longest row (:func:`~heedful.engine.runner.length_chunks`).
    """
    adapter, batch, protocol = prepared.adapter, prepared.batch, prepared.protocol
    tokenizer = adapter.tokenizer
    seg = torch.where(batch.special_mask | ~batch.attention_mask.bool(), -1, _plain_segments(batch))
    seg_rows = seg[ex]
    keep = ~remove & (seg_rows >= 0)
    ids = batch.input_ids[ex]
    replaced = replaced_ids(prepared, ex, remove, protocol.removal)
    if replaced is not None:  # replaced, not deleted: the replacement is decoded in place
        ids = replaced
        keep = seg_rows >= 0
    first = [ids[r][keep[r] & (seg_rows[r] == 0)].tolist() for r in range(len(ex))]
    texts = tokenizer.batch_decode(first, skip_special_tokens=False)
    pairs = None
    if any(p is not None for p in batch.text_pairs):
        second = [ids[r][keep[r] & (seg_rows[r] == 1)].tolist() for r in range(len(ex))]
        pairs = tokenizer.batch_decode(second, skip_special_tokens=False)
    keys = list(zip(texts, pairs if pairs is not None else [None] * len(texts), strict=True))
    distinct = list(dict.fromkeys(keys))
    index = {key: u for u, key in enumerate(distinct)}
    which = torch.tensor([index[key] for key in keys], dtype=torch.long)  # [M] distinct row of each row
    limit = min(protocol.max_length or adapter.max_length, adapter.max_length)
    args = ([t for t, _ in distinct],) if pairs is None else ([t for t, _ in distinct], [p for _, p in distinct])
    enc = tokenizer(*args, padding=True, truncation=True, max_length=limit, return_tensors="pt", padding_side="right")
    input_ids, attention = enc["input_ids"], enc["attention_mask"]
    if input_ids.shape[1] == 0:  # nothing left and no special tokens to add
        input_ids = torch.full((input_ids.shape[0], 1), adapter.pad_token_id)
        attention = torch.zeros_like(input_ids)
    empty = attention.sum(dim=1) == 0
    attention[empty, 0] = 1
    input_ids[empty, 0] = adapter.pad_token_id
    types = None
    if adapter.uses_token_types:
        types = enc.get("token_type_ids")
        types = torch.zeros_like(input_ids) if types is None or protocol.token_types == "zeros" else types
    anchor = _anchor_of(prepared.target.anchor_kind, input_ids, attention, tokenizer)
    order = torch.argsort(which, stable=True)
    starts = torch.searchsorted(which[order], torch.arange(len(distinct) + 1))
    result = Outputs.empty((len(ex),))
    owner = ex[order[starts[:-1]]]  # the example of each distinct row's first member
    runner = prepared.runner(chunk)
    with torch.no_grad():
        for part in runner.chunks(Copies(owner, input_ids, attention, types, anchor)):
            fwd_logits = runner.forward(part).logits
            # every original row whose text is one of this chunk's distinct rows
            members = torch.cat([order[starts[u] : starts[u + 1]] for u in part.rows.tolist()])
            local = torch.empty(len(distinct), dtype=torch.long)
            local[part.rows] = torch.arange(len(part.rows))
            rows_target = prepared.target.select(ex[members]).with_anchor(anchor[which[members]])
            found = target_outputs(rows_target, fwd_logits[local[which[members]]], protocol.output)
            result.put((members.numpy(),), found)
    return result


def _plain_segments(batch: Batch) -> torch.Tensor:
    seg = torch.full(tuple(batch.input_ids.shape), -1, dtype=torch.long)
    for b, ids in enumerate(batch.sequence_ids):
        seg[b, : len(ids)] = torch.tensor([-1 if s is None else s for s in ids], dtype=torch.long)
    return seg


def _anchor_of(kind: str, input_ids: torch.Tensor, attention: torch.Tensor, tokenizer) -> torch.Tensor:
    """Anchor positions of freshly tokenised rows, by the anchor's kind."""
    if kind == "first":
        return torch.zeros(input_ids.shape[0], dtype=torch.long)
    if kind == "last":
        return (attention.sum(dim=1) - 1).clamp(min=0)
    mask_id = getattr(tokenizer, "mask_token_id", None)
    return (input_ids == mask_id).int().argmax(dim=1)
