"""Generation attribution: every step of what a language model writes, explained as its own
target, all steps of all prompts in one batched problem.

A prompt of ``P`` tokens followed by ``T`` generated (or forced) tokens ``y_0 .. y_{T-1}`` gives
``T`` *step rows*: row ``t`` is the sequence cut to its first ``P + t`` tokens, its anchor the
last of them (position ``P + t - 1``, whose output predicts ``y_t``), its target ``y_t``. Right
padding never changes a real position of a causal model, so a row is exactly the single-position
problem of that prefix, and every method that explains a causal language model explains a step
unchanged -- batched with every other step by the same chunking as any batch.

Forward-only methods (attention, rollout, the vector norms, ...) need no pass per step: a
causal model's states at positions ``< P + t`` do not depend on later tokens, so one pass over
each whole sequence serves all its steps (:func:`shared_reference`). Gradient methods take one
backward per step, in chunks of steps.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from heedful.adapters import Forward, ModelAdapter
from heedful.engine.batch import Batch
from heedful.engine.problem import Problem, prepare, reference_pass
from heedful.engine.runner import keeps_graph
from heedful.engine.sequences import check_new_tokens, check_positions, continue_batch, span_ids
from heedful.engine.targets import GENERATIVE, Columns, resolve_target
from heedful.errors import InputError
from heedful.registry import MethodInfo


@dataclass
class Generation:
    """Prompts and what follows them. ``batch``: each prompt's tokens followed by its
    continuation ``[B, S]`` (texts joined, offsets into the joined text); ``prompt_lengths[b]``
    = ``P_b``; ``continuations[b]``: the ``T_b`` continuation ids; ``forced``: the continuations
    were given (teacher forcing), not generated; ``seconds``: time spent generating."""

    batch: Batch
    prompt_lengths: list[int]
    continuations: list[list[int]]
    forced: bool
    seconds: float = 0.0
    prompts: list[str] | None = None
    """The prompts' texts (the start of each joined text); ``None``: up to the prompt tokens' end."""
    log_probs: list[list[float]] | None = None
    """Each continuation's tokens' log-probabilities under the model as :func:`generate` ran it
    (its raw distribution, before any sampling setting), ``T_b`` per prompt, so the steps' own
    probabilities need no second pass through the head; ``None`` for given continuations, or
    where keeping every step's logits would not fit a tenth of the adapter's ``max_memory``."""

    @property
    def steps(self) -> list[int]:
        return [len(c) for c in self.continuations]


def generate(
    adapter: ModelAdapter, prompts: Batch, max_new_tokens: int = 20, **options: Any
) -> Generation:
    """Continue every prompt of ``prompts`` with the model's own tokens (greedy unless
    ``options`` say otherwise: any ``transformers`` generation option, e.g. ``do_sample=True``).

    The prompts run as one left-padded batch; a continuation stops after the end-of-sequence
    token (kept, marked special) or after ``max_new_tokens``. Before any work, an
    :class:`InputError` when a prompt and ``max_new_tokens`` do not fit the model's positions.
    """
    _check_causal(adapter)
    check_new_tokens(max_new_tokens)
    tokenizer = adapter.tokenizer
    lengths = prompts.lengths.tolist()
    check_positions(adapter, lengths, [max_new_tokens] * len(lengths), generated=True)
    if adapter.task == "seq2seq_lm":
        return _generate_target(adapter, prompts, max_new_tokens, options)
    width = prompts.seq_len
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids = torch.full((len(prompts), width), pad if pad is not None else 0, dtype=prompts.input_ids.dtype)
    mask = torch.zeros_like(prompts.attention_mask)
    for b, n in enumerate(lengths):  # left padding: the next token follows every prompt directly
        ids[b, width - n :] = prompts.input_ids[b, :n]
        mask[b, width - n :] = 1
    settings = {"do_sample": False, "num_beams": 1, **options, "max_new_tokens": max_new_tokens}
    if pad is not None:
        settings.setdefault("pad_token_id", pad)
    began = time.perf_counter()
    with torch.no_grad():
        out = adapter.hf_model.generate(
            input_ids=ids.to(adapter.device), attention_mask=mask.to(adapter.device), **settings, **_logits_kept(adapter, len(prompts), max_new_tokens, settings)
        )
    seconds = time.perf_counter() - began
    continuations, log_probs = _continuations(adapter, out, width)
    return Generation(continue_batch(adapter, prompts, continuations), lengths, continuations, False, seconds, list(prompts.texts), log_probs)


def _generate_target(adapter: ModelAdapter, prompts: Batch, max_new_tokens: int, options: dict[str, Any]) -> Generation:
    """An encoder–decoder's outputs for the sources of ``prompts`` (rows of a source and the
    target side's first tokens, :mod:`heedful.adapters.seq2seq`): one ``generate`` call on the
    right-padded sources, the decoder started from each row's target-side tokens."""
    lengths = prompts.lengths.tolist()
    types = prompts.token_type_ids
    source = (prompts.attention_mask.bool() & ~types.bool()).sum(dim=1)
    width = int(source.max())
    prefix = [prompts.input_ids[b, int(source[b]) : n].tolist() for b, n in enumerate(lengths)]
    if len({tuple(p) for p in prefix}) != 1:
        raise InputError("the rows start their outputs differently", hint="generate rows with one target-side start together")
    mask = (torch.arange(width)[None, :] < source[:, None]).long()
    settings = {"do_sample": False, "num_beams": 1, **options, "max_new_tokens": max_new_tokens}
    began = time.perf_counter()
    with torch.no_grad():
        out = adapter.hf_model.generate(
            input_ids=prompts.input_ids[:, :width].to(adapter.device),
            attention_mask=mask.to(adapter.device),
            decoder_input_ids=torch.tensor([prefix[0]] * len(prompts), device=adapter.device),
            **settings,
            **_logits_kept(adapter, len(prompts), max_new_tokens, settings),
        )
    seconds = time.perf_counter() - began
    continuations, log_probs = _continuations(adapter, out, len(prefix[0]))
    return Generation(continue_batch(adapter, prompts, continuations), lengths, continuations, False, seconds, list(prompts.texts), log_probs)


def _logits_kept(adapter: ModelAdapter, rows: int, steps: int, settings: dict[str, Any]) -> dict[str, bool]:
    """``generate`` keywords that keep each step's raw logits ``steps`` x ``[rows, V]`` (float32),
    when they and their log-softmax fit a tenth of the adapter's ``max_memory``; else none -- and
    none for beam search, whose kept logits are the beams', not the chosen sequence's."""
    vocab = adapter.hf_model.get_output_embeddings().weight.shape[0]
    if settings.get("num_beams", 1) != 1 or 2 * rows * steps * vocab * 4 > adapter.max_memory // 10:
        return {}
    return {"return_dict_in_generate": True, "output_logits": True}


def _continuations(adapter: ModelAdapter, out: Any, start: int) -> tuple[list[list[int]], list[list[float]] | None]:
    """Each row's generated ids of ``generate``'s output ``out`` from position ``start``, cut
    after the end-of-sequence token, and their log-probabilities ``log_softmax(z_t)[y_t]`` from
    the kept raw logits ``z_t`` (``None`` where ``generate`` did not keep them)."""
    sequences = out if torch.is_tensor(out) else out.sequences
    tokens = sequences[:, start:]
    eos = _eos_ids(adapter)
    continuations = []
    for row in tokens.cpu().tolist():
        stop = next((k + 1 for k, token in enumerate(row) if token in eos), len(row))
        continuations.append(row[:stop])
    if torch.is_tensor(out) or not out.logits:
        return continuations, None
    logits = torch.stack(out.logits, dim=1).float()  # [B, T, V]
    chosen = logits.gather(2, tokens[:, : logits.shape[1], None].to(logits.device)).squeeze(2) - logits.logsumexp(dim=2)
    return continuations, [row[: len(c)] for row, c in zip(chosen.cpu().tolist(), continuations, strict=True)]


def force(adapter: ModelAdapter, prompts: Batch, continuations: str | Sequence[str]) -> Generation:
    """The prompts followed by given continuation texts (teacher forcing): each continuation is
    tokenized alone, without special tokens (``" Paris."`` keeps its leading space), and its
    ids follow the prompt's -- the prompt is never re-tokenized with it."""
    _check_causal(adapter)
    texts = [continuations] * len(prompts) if isinstance(continuations, str) else list(continuations)
    if len(texts) != len(prompts):
        raise InputError(f"{len(texts)} continuations for {len(prompts)} prompts", hint="give one per prompt, or one for all")
    ids = [span_ids(adapter, text) for text in texts]
    return Generation(continue_batch(adapter, prompts, ids), prompts.lengths.tolist(), ids, True, 0.0, list(prompts.texts))


def step_rows(generation: Generation) -> tuple[Batch, torch.Tensor, torch.Tensor]:
    """The step rows of a generation: a batch ``[R, W]`` with one row per (example, step), row
    ``(b, t)`` cut to the first ``P_b + t`` tokens; and ``example`` ``[R]``, ``step`` ``[R]``."""
    full = generation.batch
    steps = torch.tensor(generation.steps)
    if int(steps.sum()) == 0:
        raise InputError("nothing was generated to explain", hint="raise max_new_tokens, or give a continuation")
    example = torch.repeat_interleave(torch.arange(len(full)), steps)
    step = torch.cat([torch.arange(n) for n in generation.steps])
    lengths = torch.tensor(generation.prompt_lengths)[example] + step
    width = int(lengths.max())
    mask = (torch.arange(width)[None, :] < lengths[:, None]).to(full.attention_mask.dtype)
    rows = example.tolist()
    cut = lengths.tolist()
    batch = Batch(
        input_ids=full.input_ids[example, :width],
        attention_mask=mask,
        token_type_ids=None if full.token_type_ids is None else full.token_type_ids[example, :width] * mask,
        special_mask=full.special_mask[example, :width] & mask.bool(),
        texts=[_prefix_text(full, b, n) for b, n in zip(rows, cut, strict=True)],
        text_pairs=[None] * len(rows),
        tokens=[full.tokens[b][:n] for b, n in zip(rows, cut, strict=True)],
        offsets=[full.offsets[b][:n] for b, n in zip(rows, cut, strict=True)],
        word_ids=[full.word_ids[b][:n] for b, n in zip(rows, cut, strict=True)],
        sequence_ids=[full.sequence_ids[b][:n] for b, n in zip(rows, cut, strict=True)],
        truncated=[full.truncated[b] for b in rows] if full.truncated else [],
    )
    return batch, example, step


def _prefix_text(batch: Batch, b: int, n: int) -> str:
    """Example ``b``'s text up to the end of its first ``n`` tokens (a step row's own text: what
    seeds a stochastic method, as for the same prefix explained on its own)."""
    ends = [offset[1] for offset in batch.offsets[b][:n] if offset is not None]
    return batch.texts[b][: max(ends)] if ends else ""


def step_request(adapter: ModelAdapter, generation: Generation, example: torch.Tensor, step: torch.Tensor) -> Columns:
    """The step rows' targets: row ``r`` explains token ``y_t`` of example ``b`` (``example[r]``,
    ``step[r]``) ``[R]``."""
    tokens = [generation.continuations[b][t] for b, t in zip(example.tolist(), step.tolist(), strict=True)]
    return Columns(indices=tuple((y,) for y in tokens), weights=(1.0,), labels=tuple(adapter.output_name(y) for y in tokens))


def prepare_steps(
    adapter: ModelAdapter, generation: Generation, info: MethodInfo | None = None, quantity: str = "log_prob"
) -> tuple[Problem, torch.Tensor, torch.Tensor]:
    """The :class:`~heedful.Problem` of every step of ``generation`` (one row per step, target
    the step's token, explained as its ``quantity``), prepared the way ``info`` wants it, with
    the rows' ``example`` and ``step`` ``[R]``.

    A method with a reference pass of its own (gradient, LRP) gets it per step row when the rows'
    kept graph fits the memory budget (:func:`~heedful.engine.runner.keeps_graph`); any other method,
    and any problem larger than that, gets :func:`shared_reference` -- one pass per sequence for
    all its steps -- and the method runs its own passes chunk by chunk."""
    batch, example, step = step_rows(generation)
    request = step_request(adapter, generation, example, step)
    hidden = info is not None and info.needs_hidden
    attentions = info is not None and info.needs_attentions
    fits = keeps_graph(adapter, batch.lengths) is not None
    own = None if info is None else info.reference_for(None, adapter)
    if own is not None and fits:
        problem = prepare(adapter, batch, request, reference=own, quantity=quantity)
    else:
        anchor = batch.lengths - 1
        reference = shared_reference(
            adapter, generation, example, step, hidden_states=hidden, attentions=attentions,
            head=generation.log_probs is None or info is None or info.reads_logits,
        )
        target = resolve_target(request, adapter, anchor, "last", None)  # columns: no logits read
        target.quantity = quantity
        problem = Problem(adapter, batch, target, reference, request)
    return problem, example, step


def step_probabilities(generation: Generation, example: torch.Tensor, step: torch.Tensor, problem: Problem) -> torch.Tensor:
    """Each step row's probability of its token ``[R]``: from :attr:`Generation.log_probs` where
    the generation kept them, else the softmax of ``problem``'s reference logits at the rows'
    anchors."""
    if generation.log_probs is None:
        target = replace(problem.target, quantity="logit")
        return target.score(torch.softmax(problem.reference.logits.detach().float(), dim=-1))
    kept = torch.full((len(generation.log_probs), max(generation.steps)), float("nan"), dtype=torch.float64)
    for b, row in enumerate(generation.log_probs):
        kept[b, : len(row)] = torch.tensor(row, dtype=torch.float64)
    return kept[example.cpu(), step.cpu()].exp()


def shared_reference(
    adapter: ModelAdapter,
    generation: Generation,
    example: torch.Tensor,
    step: torch.Tensor,
    *,
    hidden_states: bool = False,
    attentions: bool = False,
    head: bool = True,
) -> Forward:
    """The reference pass of every step row from one pass per whole sequence.

    ``logits`` ``[R, C]``: the head at each row's anchor ``P_b + t - 1``; ``hidden_states``
    ``L + 1`` x ``[R, W, D]`` and ``attentions`` ``L`` x ``[R, H, W, W]`` when asked for, each
    row's positions taken from its sequence and 0 beyond the row's own ``P_b + t`` positions --
    equal to the row's own pass because a causal model's state at a position does not depend
    on later tokens. Without ``head`` the pass reads the head nowhere and ``logits`` are
    ``[R, 0]``: for a method that never reads them (:attr:`~heedful.registry.MethodInfo.reads_logits`)
    of a generation that kept its steps' probabilities (:attr:`Generation.log_probs`), the
    ``R x D x V`` head -- on a large vocabulary the largest matrix of the model -- is not run;
    without the head, hidden states or attentions no pass runs at all."""
    if not (head or hidden_states or attentions):  # nothing of the pass would be read
        return Forward(torch.empty(len(example), 0, device=adapter.device))
    full = generation.batch
    prompt = torch.tensor(generation.prompt_lengths)
    longest = max(generation.steps)
    positions = (prompt[:, None] - 1 + torch.arange(longest)[None, :]).clamp(max=full.lengths[:, None] - 1)
    fwd = reference_pass(
        adapter, full, positions if head else positions[:, :0], hidden_states=hidden_states, attentions=attentions
    )
    lengths = prompt[example] + step
    width = int(lengths.max())
    own = (torch.arange(width)[None, :] < lengths[:, None]).to(adapter.device)
    hidden = None
    if fwd.hidden_states is not None:
        hidden = tuple(h[:, :width][example].mul_(own[..., None].to(h.dtype)) for h in fwd.hidden_states)
    probs = None
    if fwd.attentions is not None:
        probs = StepAttentions(fwd.attentions, example, own)
    logits = fwd.logits[example, step] if head else fwd.logits.new_empty(len(example), 0)
    return Forward(logits, hidden, probs)


class StepAttentions(Sequence[torch.Tensor]):
    """The step rows' attention probabilities, ``L`` x ``[R, H, W, W]``, from the sequences'
    ``attentions`` (``L`` x ``[B, H, S, S]``): row ``r`` is sequence ``example[r]`` cut to the
    rows' width ``W`` and masked to its own positions ``own[r]`` (``[R, W]``). A layer's rows
    are copied out when first read and kept -- a method that reads one layer (raw attention
    reads the last) copies ``R x H x W x W`` values once, not ``L`` times that."""

    def __init__(self, attentions: Sequence[torch.Tensor], example: torch.Tensor, own: torch.Tensor) -> None:
        self._layers, self._example, self._own = tuple(attentions), example, own
        self._rows: dict[int, torch.Tensor] = {}

    def __len__(self) -> int:
        return len(self._layers)

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return tuple(self[i] for i in range(*index.indices(len(self))))
        layer = range(len(self))[index]
        if layer not in self._rows:
            a = self._layers[layer]
            width = self._own.shape[1]
            pair = (self._own[:, :, None] & self._own[:, None, :])[:, None]
            # cut to the rows' width before copying rows out: copied once, masked in place
            self._rows[layer] = a[..., :width, :width][self._example.to(a.device)].mul_(pair.to(a.dtype))
        return self._rows[layer]


def _check_causal(adapter: ModelAdapter) -> None:
    if adapter.task not in GENERATIVE:
        raise InputError(
            f"generation attribution explains a language model (causal or encoder–decoder); this model is a {adapter.task} model",
            hint="load a causal language model, e.g. heedful.load('smollm2-135m')",
        )


def _eos_ids(adapter: ModelAdapter) -> set[int]:
    found = adapter.hf_model.generation_config.eos_token_id if hasattr(adapter.hf_model, "generation_config") else None
    ids = set(found if isinstance(found, list) else [] if found is None else [found])
    if adapter.tokenizer.eos_token_id is not None:
        ids.add(adapter.tokenizer.eos_token_id)
    return ids
