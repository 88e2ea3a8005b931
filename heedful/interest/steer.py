"""Steering generation by suppressing prompt words (the seed paper's Section 5.4.2, Figure 9).

:func:`steer` takes a causal LM and a prompt, and

1. estimates co-perturbation interest over the prompt's tokens (the distortion of the head's
   next-token logits at the last prompt position: the model's next token is the explained
   output);
2. suppresses the chosen words: their tokens' *input word embeddings* are scaled by ``weight``
   (default 0, :func:`~heedful.interest.suppress.downweight`);
3. generates a continuation of the original and of the suppressed prompt, by greedy decoding
   and by beam search;
4. estimates interest again over the suppressed prompt.

Why down-weighting rather than attention masking: scaling an embedding works the same way for
every family (the adapter only has to expose the word-embedding layer and a forward pass from
``inputs_embeds``), ``weight`` between 0 and 1 weakens a word gradually instead of all or
nothing, and the suppressed tokens keep their place, so the positions of the other tokens --
and every position-dependent part of the model -- are unchanged. Masking the attention to a
token instead removes it from every layer's context (at ``weight=0`` both remove the word's
content; masking also removes its position) and has no partial setting. The paper says
"suppressing" without fixing the operation; down-weighting is our choice.

Generation runs ``generate`` of the underlying ``transformers`` model from ``inputs_embeds``:
the suppressed embeddings enter the first (prompt) pass, whose keys and values are cached, so
every generated token attends to the suppressed prompt; generated tokens are embedded as
usual. The paper's decoding settings (Figure 9b: ``max_length=150, num_beam_groups=1,
do_sample=False, num_beams=3``) are the defaults: greedy decoding is the same without beams
(``num_beams=1``), and ``max_length=150`` counts the prompt, so by default a continuation has
up to ``150 - prompt tokens`` new tokens (it stops earlier at the end-of-sequence token).

Both interest estimates are one batched optimisation (two problems: the prompt as it is and
with the suppressed words) with the same seed -- hence the same initial ``theta`` and noise
draws -- and the same noise ceiling (``scale``: 3 x the std of the original prompt's embedding
output, the method's default for that prompt), so the two bar charts are directly comparable.
The first problem is what ``model.explain(prompt, "coperturbation")`` computes (up to float
rounding between batch shapes).
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from heedful.adapters import ModelAdapter
from heedful.attribution import coperturbation as cp
from heedful.attribution.noise import HEAD, SCALE_FACTOR, NoiseProbe
from heedful.engine.batch import Batch
from heedful.engine.sequences import check_new_tokens, check_positions
from heedful.errors import Hint, InputError
from heedful.interest.studies import settings_from
from heedful.interest.suppress import downweight
from heedful.model import Model
from heedful.progress import task

PAPER_MAX_LENGTH = 150
"""``generate(max_length=150)`` in the paper's Figure 9b: prompt and continuation together."""
PAPER_BEAMS = 3
"""``num_beams=3`` (with ``num_beam_groups=1, do_sample=False``) in the paper's Figure 9b."""


@dataclass
class Continuation:
    """One decoding mode's two continuations: of the prompt as it is (``original``) and with the
    suppressed words (``steered``); ``settings``: the ``generate`` arguments used."""

    mode: str
    settings: dict
    original: str
    steered: str
    original_ids: list[int] = field(repr=False)
    steered_ids: list[int] = field(repr=False)
    seconds: float = 0.0


@dataclass
class Steering:
    """The result of :func:`steer`. ``interest_before`` / ``interest_after`` ``[N]``: normalised
    co-perturbation interest of each prompt token (``rho = 1/sigma``, content tokens summing to
    1) before and after suppression; ``suppressed`` ``[N]``: the tokens whose embeddings were
    scaled by ``weight``; ``next_before`` / ``next_after``: the model's next token (the
    explained output) without and with suppression, as text."""

    model: str
    prompt: str
    words: list[str]
    weight: float
    tokens: list[str]
    offsets: list[tuple[int, int] | None]
    special: list[bool]
    suppressed: list[bool]
    interest_before: np.ndarray
    interest_after: np.ndarray
    next_before: str
    next_after: str
    continuations: list[Continuation]
    steps: list[int]
    seconds: dict[str, float]

    @property
    def labels(self) -> list[str]:
        """Each token as the prompt's text it covers (the token itself for special tokens)."""
        return [tok if o is None else self.prompt[o[0] : o[1]] for tok, o in zip(self.tokens, self.offsets, strict=True)]

    @property
    def suppressed_text(self) -> list[str]:
        """The prompt's text pieces that were suppressed, one per suppressed token."""
        return [
            self.prompt[o[0] : o[1]] for o, s in zip(self.offsets, self.suppressed, strict=True) if s and o is not None
        ]


def phrase_positions(batch: Batch, phrases: Sequence[str], example: int = 0) -> torch.Tensor:
    """``[N]`` bool: the tokens of ``example`` covering any occurrence of any of ``phrases`` (words
    or runs of words of the text, matched case-insensitively on word boundaries; every occurrence
    counts). Raises :class:`InputError` naming a phrase that is not in the text."""
    text = batch.texts[example]
    phrases = [p.strip() for p in phrases]
    if not phrases or not all(phrases):
        raise InputError("no words to suppress given", hint=Hint('name words of the prompt, e.g. words=["in recent years"]', 'name words of the prompt, e.g. --suppress "in recent years"'))
    offsets = batch.offsets[example]
    hit = torch.zeros(batch.seq_len, dtype=torch.bool)
    for phrase in phrases:
        pattern = r"(?<!\w)" + r"\s+".join(re.escape(w) for w in phrase.split()) + r"(?!\w)"
        spans = [m.span() for m in re.finditer(pattern, text, flags=re.IGNORECASE)]
        covered = [
            i for i, off in enumerate(offsets)
            if off is not None and off[1] > off[0] and any(off[0] < end and off[1] > start for start, end in spans)
        ]
        if not covered:
            shown = " ".join(re.findall(r"\w+", text)[:30])
            raise InputError(f"{phrase!r} is not in the prompt", hint=f"suppress words of the prompt: {shown}")
        hit[covered] = True
    return hit


def decoding_modes(max_new_tokens: int, beams: int = PAPER_BEAMS) -> dict[str, dict]:
    """``generate`` arguments of the two decoding modes: greedy and beam search (paper: 3 beams)."""
    if beams < 2:
        raise InputError(f"beam search needs at least 2 beams, got {beams}", hint=Hint("e.g. beams=3 (the paper's)", "e.g. --beams 3 (the paper's)"))
    common = {"max_new_tokens": max_new_tokens, "do_sample": False, "num_beam_groups": 1}
    return {"greedy": {**common, "num_beams": 1}, "beam": {**common, "num_beams": int(beams)}}


@torch.no_grad()
def generate(adapter: ModelAdapter, embeds: torch.Tensor, settings: dict) -> list[int]:
    """New token ids continuing the prompt given as word embeddings ``embeds`` ``[1, N, E]``."""
    from transformers import GenerationConfig

    tok = adapter.tokenizer
    eos = getattr(adapter.hf_model.generation_config, "eos_token_id", None)
    if eos is None:
        eos = getattr(tok, "eos_token_id", None)
    known = {k: v for k, v in settings.items() if k != "num_beam_groups"}  # 1 is generate's default
    config = GenerationConfig(**known, pad_token_id=adapter.pad_token_id, eos_token_id=eos)
    mask = torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)
    out = adapter.hf_model.generate(inputs_embeds=embeds, attention_mask=mask, generation_config=config)
    # decoder-only models return only the new tokens when started from embeddings
    return out[0].tolist()


def steer(
    model: Model,
    prompt: str,
    words: Sequence[str],
    *,
    weight: float = 0.0,
    max_new_tokens: int | None = None,
    beams: int = PAPER_BEAMS,
    seed: int | None = 0,
    **options,
) -> Steering:
    """Estimate interest over ``prompt``, suppress ``words`` (each a word or phrase of the prompt;
    their tokens' input embeddings are scaled by ``weight``), generate with and without the
    suppression by greedy decoding and by beam search (``beams`` beams), and estimate interest
    again. ``max_new_tokens`` ``None``: up to the paper's ``max_length=150`` tokens in all (or
    the model's positions, when fewer); more than the model's positions is an
    :class:`InputError` before any pass.
    ``options``: co-perturbation settings (``lam``, ``max_steps``, ``samples``, ...).

    >>> model = heedful.load("smollm2-135m")                                          # doctest: +SKIP
    >>> s = steer(model, "The impact of climate change has become more evident in recent years.",
    ...           ["in recent years"])                                                 # doctest: +SKIP
    >>> s.continuations[0].original, s.continuations[0].steered                        # doctest: +SKIP
    """
    adapter = model.adapter
    if adapter.task != "causal_lm":
        raise InputError(
            f"steering needs a causal language model; {model.name} is a {adapter.task} model",
            hint=Hint('use a causal LM, e.g. heedful.load("smollm2-135m")', "use a causal LM, e.g. --model smollm2-135m"),
        )
    weight = float(weight)
    if not np.isfinite(weight):
        raise InputError(f"weight must be a finite number, got {weight}")
    if max_new_tokens is not None:
        check_new_tokens(max_new_tokens)
    settings = settings_from(options)
    batch = model.encode([prompt, prompt], truncation=False)
    n = int(batch.lengths[0])
    if max_new_tokens is None:  # the paper's length, within the model's positions
        max_new_tokens = max(1, min(PAPER_MAX_LENGTH, adapter.max_length) - n)
    check_positions(adapter, [n], [max_new_tokens], generated=True)  # before any pass
    modes = decoding_modes(max_new_tokens, beams)
    hit = phrase_positions(batch, words)
    positions = torch.stack([torch.zeros_like(hit), hit])  # row 0: as it is; row 1: suppressed
    embeds = downweight(adapter, batch, positions, weight)
    seconds: dict[str, float] = {}

    began = time.perf_counter()
    problem = model.prepare(batch, inputs_embeds=embeds, hidden_states=True)
    target = problem.target
    probe = NoiseProbe.build(problem, (HEAD,), settings.space, settings.output)
    if settings.scale is None and settings.scale_basis == "input":  # one ceiling: the original prompt's
        settings = replace(settings, scale=float((settings.scale_factor or SCALE_FACTOR) * probe.input_std[0]))
    problems = torch.arange(2)
    fit = cp.fit_interest(problem, problems, torch.full((2,), HEAD), torch.full((2,), settings.lam), settings, seed, probe)
    scores = cp.interest_scores(fit.sigma, batch.content_mask, batch.attention_mask.bool())
    seconds["interest"] = time.perf_counter() - began

    continuations = []
    with task("generations (as it is, suppressed)", total=2 * len(modes)) as done:
        for mode, kwargs in modes.items():
            began = time.perf_counter()
            ids = []
            for row in (0, 1):
                ids.append(generate(adapter, embeds[row : row + 1], kwargs))
                done.advance()
            took = time.perf_counter() - began
            seconds[mode] = took
            texts = [adapter.tokenizer.decode(i, skip_special_tokens=True) for i in ids]
            continuations.append(Continuation(mode, dict(kwargs), texts[0], texts[1], ids[0], ids[1], took))

    return Steering(
        model=model.name,
        prompt=prompt,
        words=list(words),
        weight=weight,
        tokens=batch.tokens[0],
        offsets=batch.offsets[0],
        special=batch.special_mask[0, :n].tolist(),
        suppressed=hit[:n].tolist(),
        interest_before=scores[0, :n].numpy().astype(np.float64),
        interest_after=scores[1, :n].numpy().astype(np.float64),
        next_before=adapter.tokenizer.decode([int(target.classes[0, 0])]),
        next_after=adapter.tokenizer.decode([int(target.classes[1, 0])]),
        continuations=continuations,
        steps=fit.steps.tolist(),
        seconds=seconds,
    )
