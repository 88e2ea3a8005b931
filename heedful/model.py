"""Model: a loaded model plus its adapter, with ``explain`` -- heedful's main entry point."""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from heedful.adapters import ModelAdapter
from heedful.attribution import get_method, methods, span_methods
from heedful.engine.batch import Batch
from heedful.engine.conversation import (
    Conversation,
    chat_batch,
    is_conversation,
    template,
    templated_batch,
)
from heedful.engine.memory import parse_memory
from heedful.engine.options import jsonable
from heedful.engine.problem import Problem, contrast_spans, prepare, span_request
from heedful.engine.readable import marked
from heedful.engine.sources import SourceSpec
from heedful.engine.targets import ResolvedTarget, Target
from heedful.engine.workload import Work, check, check_generation, step_lengths
from heedful.errors import InputError
from heedful.explanation import Cost, Explanation, Explanations, TargetInfo
from heedful.generation import Generation, force, generate, prepare_steps, step_probabilities
from heedful.generation_explanation import GenerationExplanation, assemble_generation
from heedful.generation_shared import explain_shared, generation_precision
from heedful.registry import MethodInfo

ProgressHook = Callable[[int], None]


class Model:
    """A model heedful can explain. Build it with :func:`heedful.load`.

    ``hf_model`` and ``tokenizer`` are the underlying ``transformers`` objects; an
    explanation's tokens are exactly ``tokenizer``'s tokens for the text.
    """

    def __init__(self, adapter: ModelAdapter, name: str, info: dict[str, Any] | None = None) -> None:
        self.adapter = adapter
        self.name = name
        self.info = info or {}

    def __repr__(self) -> str:
        return f"Model({self.name!r}, family={self.adapter.family!r}, task={self.task!r})"

    @property
    def hf_model(self) -> torch.nn.Module:
        return self.adapter.hf_model

    @property
    def tokenizer(self):
        return self.adapter.tokenizer

    @property
    def task(self) -> str:
        return self.adapter.task

    @property
    def labels(self) -> list[str]:
        return self.adapter.labels

    @property
    def max_memory(self) -> int:
        """Bytes one pass may use on top of what the process holds (:mod:`heedful.engine.memory`):
        the runner cuts its chunks so that each one's estimated peak stays under it. Set it to
        a size (``"4GB"``, ``"512MiB"``) or a number of bytes."""
        return self.adapter.max_memory

    @max_memory.setter
    def max_memory(self, value: str | int) -> None:
        self.adapter.max_memory = parse_memory(value)

    # ------------------------------------------------------------------ methods
    def method(self, name: str) -> MethodInfo:
        """The registered method ``name`` if this model allows it: a :class:`MethodError` for
        an unknown method or one the model's task lacks, an :class:`UnsupportedModelError`
        naming what the model does not give the method (:meth:`MethodInfo.require`)."""
        info = get_method(name, self.task)
        info.require(self.adapter)
        return info

    def methods(self) -> dict[str, tuple[str, ...]]:
        """Every registered method of the model's task, with the needs this model does not
        meet (empty: the method runs on it)."""
        return {info.name: info.missing(self.adapter) for info in methods(task=self.task)}

    # ------------------------------------------------------------------ problems
    def encode(
        self,
        texts: str | Sequence[str],
        *,
        text_pair: str | Sequence[str] | None = None,
        truncation: bool = True,
        max_length: int | None = None,
    ) -> Batch:
        """The texts (and second segments) tokenized into one right-padded :class:`Batch`."""
        items = _text_list(texts)
        pairs = _pairs(text_pair, len(items), isinstance(texts, str))
        return self.adapter.encode(items, pairs, truncation, max_length)

    def prepare(
        self,
        texts: str | Sequence[str] | Batch,
        target: Target | int | str | tuple | None = None,
        *,
        text_pair: str | Sequence[str] | None = None,
        truncation: bool = True,
        max_length: int | None = None,
        method: str | None = None,
        options: Mapping[str, Any] | None = None,
        inputs_embeds: torch.Tensor | None = None,
        hidden_states: bool = False,
        attentions: bool = False,
        quantity: str | None = None,
        sources: SourceSpec | str | Sequence[tuple[int, int]] | None = None,
    ) -> Problem:
        """The :class:`~heedful.Problem` of ``texts`` (all at once, one batch): encoded, anchor
        positions found, one reference pass run and ``target`` resolved against it.

        ``method``: prepare the reference pass the way that method wants it (with hidden states,
        attentions, or its own graph-keeping pass) so that it runs no pass twice; any method can
        still take the problem. ``options``: the options that method will run with, where they
        choose its reference pass (``hierarchical``'s coarse method); checked as ``explain``
        checks them. ``inputs_embeds`` ``[B, N, E]``: word embeddings to start from instead of
        the ids' (edited inputs). ``hidden_states`` / ``attentions``: keep them in
        the reference pass. ``quantity``: explain the target's ``"logit"`` or ``"log_prob"``
        (see :func:`heedful.prepare`; a span target of several tokens defaults to its summed
        log-probability).

        >>> model = heedful.load("minilm-sentiment")                        # doctest: +SKIP
        >>> problem = model.prepare(["great acting", "a dull plot"])        # doctest: +SKIP
        >>> model.explain(problem, "saliency")[0].top(1)                    # doctest: +SKIP
        [('great', ...)]
        """
        batch = texts if isinstance(texts, Batch) else self.encode(
            texts, text_pair=text_pair, truncation=truncation, max_length=max_length
        )
        info = self.method(method) if method is not None else None
        if options is not None:
            if info is None:
                raise InputError("options choose a method's reference pass, and no method was given", hint="pass method=NAME with options")
            options = info.bind(dict(options))
        return prepare(
            self.adapter,
            batch,
            target,
            inputs_embeds=inputs_embeds,
            hidden_states=hidden_states or (info is not None and info.needs_hidden),
            attentions=attentions or (info is not None and info.needs_attentions),
            reference=None if info is None else info.reference_for(options, self.adapter),
            quantity=quantity,
            sources=sources,
        )

    # ------------------------------------------------------------------ prediction
    @torch.no_grad()
    def predict(self, texts: str | Sequence[str], batch_size: int = 32) -> list[dict[str, Any]]:
        """Predicted label and probability (classification), value (regression), or most likely
        token (language models) for each text.

        >>> model = heedful.load("minilm-sentiment")                # doctest: +SKIP
        >>> model.predict("a charming and often affecting journey")[0]["label"]  # doctest: +SKIP
        'POSITIVE'
        """
        items = _text_list(texts)
        found: list[dict[str, Any]] = []
        for start in range(0, len(items), batch_size):
            problem = self.prepare(items[start : start + batch_size])
            found.extend(self._predictions(problem.reference.logits))
        return found

    def _predictions(self, logits: torch.Tensor, target: ResolvedTarget | None = None) -> list[dict[str, Any]]:
        if target is not None and target.is_span:
            log_p = replace(target, quantity="log_prob").score(logits).tolist()
            return [
                {"label": label, "log_probability": v, "probability": math.exp(v)}
                for label, v in zip(target.labels, log_p, strict=True)
            ]
        if self.task == "regression":
            return [{"value": float(v)} for v in logits[:, 0]]
        probs = torch.softmax(logits.float(), dim=-1)
        best = probs.argmax(dim=-1)
        return [
            {"label": self.adapter.output_name(int(i)), "index": int(i), "probability": float(p[i])}
            for i, p in zip(best, probs, strict=True)
        ]

    # ------------------------------------------------------------------ explanation
    def explain(
        self,
        texts: str | Sequence[str] | Sequence[Mapping[str, str]] | Problem,
        method: str = "normxlogit",
        target: Target | int | str | tuple | None = None,
        *,
        text_pair: str | Sequence[str] | None = None,
        batch_size: int = 16,
        truncation: bool = True,
        max_length: int | None = None,
        progress: ProgressHook | None = None,
        quantity: str | None = None,
        sources: SourceSpec | str | Sequence[tuple[int, int]] | None = None,
        **options: Any,
    ) -> Explanation | Explanations:
        """Explain the model's output for one text (returns an :class:`Explanation`) or many
        (returns an :class:`~heedful.explanation.Explanations` list, computed ``batch_size`` texts at a time), or every example of a prepared
        :class:`~heedful.Problem` (returns a list).

        ``target``: ``None`` (predicted class / next token), a class index or label, a token
        string for language models (several tokens: a span, explained as the sum of their
        log-probabilities in one pass), ``"A vs B"`` or ``(A, B)`` for a contrast.
        ``quantity``: ``"logit"`` or ``"log_prob"`` of the target. ``options`` go to
        the method (e.g. ``n_steps=100`` for integrated gradients, ``layerwise=True`` for
        NormXLogit); they are checked before any work (their copies must fit ``max_memory``;
        :meth:`estimate` says what a run will cost), and the explanation records every option
        of the method, defaults included (a forward-only method's ``precision`` as resolved for
        this machine: ``"auto"`` becomes the precision used, :mod:`heedful.engine.precision`).
        Stochastic methods take ``seed``. ``sources``: cut
        each text into sources -- ``"sentences"``, ``"paragraphs"``, ``"tokens:N"`` or
        ``(start, end)`` character spans (:mod:`heedful.engine.sources`) -- which the context
        attribution methods rank and ``Explanation.source_scores()`` pools any method's scores
        into (they default to sentences for the context methods).

        A conversation -- a list of ``{"role", "content"}`` messages, or a list of them -- is
        explained in the model's chat template with the assistant's turn opened (the template's
        tokens marked special, :mod:`heedful.engine.conversation`); ``sources="messages"`` (the context
        methods' default for conversations) ranks its turns for the target, e.g. the assistant's
        answer given as a span.

        >>> model = heedful.load("minilm-sentiment")                          # doctest: +SKIP
        >>> e = model.explain("a charming and often affecting journey")        # doctest: +SKIP
        >>> e.top(2)                                                          # doctest: +SKIP
        [('charming', ...), ('affecting', ...)]
        """
        info = self.method(method)
        bound = info.bind(options, self.adapter.device)
        if isinstance(texts, Problem):
            if target is not None or quantity is not None or sources is not None:
                raise InputError("a prepared problem has its target and sources", hint="pass them to model.prepare(...)")
            check(self.adapter, info, bound, texts.batch.lengths.tolist())
            return Explanations(self._explain_problem(texts, info, bound))
        conversations = self._conversations(texts)
        by_message = sources == "messages" or (conversations is not None and sources is None and info.needs_sources)
        if by_message and conversations is None:
            raise InputError(
                'sources="messages" needs a conversation',
                hint='pass a list of {"role": ..., "content": ...} messages (or a list of such lists)',
            )
        spec = SourceSpec.parse(sources) if not by_message and (sources is not None or info.needs_sources) else None
        request = Target.parse(target)
        span = self._check_span(info, request)
        quantity = info.quantity(quantity, "log_prob" if span else "logit")
        explain_batch = self._explain_contrast if contrast_spans(self.adapter, request) is not None else self._explain_batch
        if by_message:  # every conversation has its own turns: one problem each
            batches = [templated_batch(self.adapter, [c], truncation, max_length) for c in conversations]
            for batch in batches:
                check(self.adapter, info, bound, batch.lengths.tolist())
            results = Explanations()
            for conversation, batch in zip(conversations, batches, strict=True):
                results.extend(explain_batch(batch, info, request, bound, quantity, SourceSpec.parse(list(conversation.turns))))
                if progress is not None:
                    progress(1)
            return results[0] if is_conversation(texts) else results
        single = isinstance(texts, str) or is_conversation(texts)
        items = _text_list(texts) if conversations is None else conversations
        pairs = _pairs(text_pair, len(items), single)
        if batch_size < 1:
            raise InputError(f"batch_size must be positive, got {batch_size}")
        batches = [
            self.adapter.encode(items[start : start + batch_size], None if pairs is None else pairs[start : start + batch_size], truncation, max_length)
            if conversations is None
            else templated_batch(self.adapter, items[start : start + batch_size], truncation, max_length)
            for start in range(0, len(items), batch_size)
        ]
        for batch in batches:  # counts beyond the memory budget fail here, before the first batch's work
            check(self.adapter, info, bound, batch.lengths.tolist())
        results = Explanations()
        for batch in batches:
            results.extend(explain_batch(batch, info, request, bound, quantity, spec))
            if progress is not None:
                progress(len(batch))
        return results[0] if single else results

    def _conversations(self, texts: Any) -> list[Conversation] | None:
        """``texts`` as conversations in the model's chat template, if it is one conversation (a
        list of ``{"role", "content"}`` messages) or a list of them; else ``None``."""
        if is_conversation(texts):
            return [template(self.tokenizer, texts)]
        if isinstance(texts, Sequence) and not isinstance(texts, str) and texts and all(is_conversation(t) for t in texts):
            return [template(self.tokenizer, t) for t in texts]
        return None

    def _explain_batch(
        self,
        batch: Batch,
        info: MethodInfo,
        spec: Target,
        bound: dict[str, Any],
        quantity: str | None = None,
        sources: SourceSpec | None = None,
    ) -> list[Explanation]:
        problem, shared = self._timed(
            lambda: prepare(
                self.adapter,
                batch,
                spec,
                hidden_states=info.needs_hidden,
                attentions=info.needs_attentions,
                reference=info.reference_for(bound, self.adapter),
                quantity=quantity,
                sources=sources,
            )
        )
        return self._explain_problem(problem, info, bound, shared=shared)

    def _check_span(self, info: MethodInfo, spec: Target) -> bool:
        """Whether ``spec`` is a span target (or a contrast of spans); one for a method that
        explains one position fails before any work."""
        pair = contrast_spans(self.adapter, spec)
        span = span_request(self.adapter, spec) if pair is None else pair[0] + pair[1]
        if span is not None and not info.spans:
            label = _contrast_label(spec) if pair is not None else spec.value
            self._refuse_span(info, label, len(span))
        return span is not None

    def _explain_contrast(
        self,
        batch: Batch,
        info: MethodInfo,
        spec: Target,
        bound: dict[str, Any],
        quantity: str | None = None,
        sources: SourceSpec | None = None,
    ) -> list[Explanation]:
        """A contrast of spans ``"A vs B"``: the method on the texts continued by A and by B
        (one problem each), the prompt tokens' scores of the second subtracted from the first --
        exactly the attribution of ``log p(A | x) - log p(B | x)`` for the span methods, which
        are linear in their target. The explanations cover the texts' own tokens."""
        parts = []
        for value in (spec.value, spec.foil):
            problem, prepared = self._timed(
                lambda v=value: prepare(
                    self.adapter, batch, Target("given", v), reference=info.reference_for(bound, self.adapter),
                    hidden_states=info.needs_hidden, attentions=info.needs_attentions, quantity=quantity,
                    sources=sources,
                )
            )
            scores, own = self._timed(lambda p=problem: info.fn(p, **bound).detach())
            problem.release_graph()
            parts.append((problem, scores, [a + b for a, b in zip(prepared, own, strict=True)]))
        (first, a, cost_a), (second, b, cost_b) = parts
        width = batch.seq_len
        keep = batch.attention_mask.bool().to(a.device)
        scores = (a[..., :width] - b[..., :width]) * keep
        n = max(len(batch), 1)
        cost = Cost(*((x + y) / n for x, y in zip(cost_a, cost_b, strict=True)))
        log_a = first.target.score(first.reference.logits.detach().float())
        log_b = second.target.score(second.reference.logits.detach().float())
        label = _contrast_label(spec)
        target = ResolvedTarget(
            anchor=batch.lengths - 1,
            anchor_kind="last",
            classes=torch.cat([first.target.classes, second.target.classes], dim=1),
            weights=torch.cat([first.target.weights, -second.target.weights]),
            labels=[label] * len(batch),
            task=self.task,
            quantity=first.target.quantity,
        )
        joined = Problem(self.adapter, batch, target, first.reference, spec, sources=None if sources is None else first.sources)
        predictions = [
            {"label": label, "log_probability_difference": float(x - y), "log_probabilities": [float(x), float(y)]}
            for x, y in zip(log_a, log_b, strict=True)
        ]
        return self.explanations(joined, scores, info.name, bound, cost, predictions=predictions)

    @staticmethod
    def _refuse_span(info: MethodInfo, label: str, tokens: int) -> None:
        raise InputError(
            f"{info.name} explains one output position, and the target {label!r} is a span of {tokens} tokens",
            hint=f"use a method that explains spans ({', '.join(span_methods())}), or a single-token target",
        )

    def _timed(self, work: Callable[[], Any]) -> tuple[Any, tuple[float, int, int]]:
        """``work()`` and what it cost: wall seconds, sequences forward and backward."""
        counter = self.adapter.counter
        counter.reset()
        began = time.perf_counter()
        result = work()
        return result, (time.perf_counter() - began, counter.forward, counter.backward)

    def _explain_problem(
        self, problem: Problem, info: MethodInfo, bound: dict[str, Any], *, shared: tuple[float, int, int] = (0.0, 0, 0)
    ) -> list[Explanation]:
        """Run ``info`` with ``bound`` options on ``problem`` and build one explanation per
        example; the cost adds ``shared`` (what preparing the problem cost) to the method's own."""
        if not info.supports(self.task):
            get_method(info.name, self.task)  # raises the unsupported-task error
        info.require(self.adapter)
        if problem.target.is_span and not info.spans:
            self._refuse_span(info, problem.target.labels[0], problem.target.classes.shape[1])
        scores, own = self._timed(lambda: info.fn(problem, **bound).detach())
        problem.release_graph()
        n = max(len(problem), 1)
        cost = Cost(*((a + b) / n for a, b in zip(shared, own, strict=True)))
        return self.explanations(problem, scores, info.name, bound, cost)

    def explanations(
        self,
        problem: Problem,
        scores: torch.Tensor,
        method: str,
        options: dict[str, Any],
        cost: Cost | None = None,
        predictions: list[dict[str, Any]] | None = None,
    ) -> list[Explanation]:
        """One :class:`Explanation` per example of ``problem`` from ``scores`` ``[B, N]`` (or
        ``[B, L, N]``) computed by ``method`` with ``options``; ``predictions``: what the model
        predicted, per example (default: read from the problem's reference pass)."""
        batch, resolved = problem.batch, problem.target
        if predictions is None:
            predictions = self._predictions(problem.reference.logits.detach(), resolved)
        kind = "regression" if self.task == "regression" else problem.request.kind
        recorded = jsonable(options)
        found = []
        for b in range(len(batch)):
            n = len(batch.tokens[b])
            row = scores[b, ..., :n].float().cpu().numpy().astype(np.float64)
            found.append(
                Explanation(
                    text=batch.texts[b],
                    text_pair=batch.text_pairs[b],
                    tokens=self.adapter.readable_tokens(batch.input_ids[b, :n].tolist(), batch.tokens[b]),
                    offsets=batch.offsets[b],
                    word_ids=batch.word_ids[b],
                    special=batch.special_mask[b, :n].tolist(),
                    segments=batch.sequence_ids[b],
                    scores=row,
                    target=TargetInfo(
                        kind=kind,
                        indices=resolved.classes[b].tolist(),
                        label=resolved.labels[b],
                        anchor=int(resolved.anchor[b]),
                        quantity=resolved.quantity,
                        positions=None if resolved.positions is None else resolved.positions[b].tolist(),
                    ),
                    method=method,
                    options=dict(recorded),
                    cost=cost or Cost(0.0, 0.0, 0.0),
                    model=self.name,
                    prediction=predictions[b],
                    truncated=bool(batch.truncated[b]) if batch.truncated else False,
                    sources=None if problem.sources is None else list(problem.sources.spans[b]),
                    details={key: values[b] for key, values in problem.details.items()},
                    raw_tokens=list(batch.tokens[b]),
                )
            )
        return found

    def generate(
        self,
        prompts: str | Sequence[str],
        max_new_tokens: int = 20,
        *,
        continuation: str | Sequence[str] | None = None,
        generation_config: dict[str, Any] | None = None,
        chat: bool = False,
        truncation: bool = True,
        max_length: int | None = None,
    ) -> Generation:
        """The prompts followed by what the model writes (greedy, at most ``max_new_tokens``;
        ``generation_config``: any ``transformers`` generation option), or by ``continuation``
        (forced). ``chat``: each prompt is a user message in the model's chat template (the
        template's tokens marked special); a conversation (a list of ``{"role", "content"}``
        messages, or a list of them) is continued in the template, the assistant's turn opened. Pass the result to :meth:`explain_generation` to
        explain one generation with several methods.

        >>> lm = heedful.load("smollm2-135m")                               # doctest: +SKIP
        >>> lm.generate("The capital of France is", 3).batch.texts          # doctest: +SKIP
        ['The capital of France is Paris. The']
        """
        batch = self._prompts(prompts, chat, truncation, max_length)
        if continuation is not None:
            return force(self.adapter, batch, continuation)
        return generate(self.adapter, batch, max_new_tokens, **(generation_config or {}))

    def _prompts(self, prompts: str | Sequence[str], chat: bool, truncation: bool, max_length: int | None) -> Batch:
        """The prompts encoded (``chat``: as user messages in the model's chat template; a
        conversation or a list of them: in the template, the assistant's turn opened)."""
        conversations = self._conversations(prompts)
        if conversations is not None:
            return templated_batch(self.adapter, conversations, truncation, max_length)
        if chat:
            return chat_batch(self.adapter, _text_list(prompts), truncation, max_length)
        return self.encode(prompts, truncation=truncation, max_length=max_length)

    def explain_generation(
        self,
        prompts: str | Sequence[str] | Generation,
        method: str = "saliency",
        *,
        max_new_tokens: int = 20,
        continuation: str | Sequence[str] | None = None,
        generation_config: dict[str, Any] | None = None,
        chat: bool = False,
        quantity: str | None = None,
        truncation: bool = True,
        max_length: int | None = None,
        **options: Any,
    ) -> GenerationExplanation | list[GenerationExplanation]:
        """Explain every token a causal language model writes after each prompt: a
        :class:`~heedful.GenerationExplanation` per prompt, whose ``scores[t, j]`` say how much
        token ``j`` (of the prompt, or generated before step ``t``) contributed to generated
        token ``t``'s ``quantity`` (``"log_prob"`` by default, or ``"logit"``; LRP methods
        explain logits).

        The continuation is generated (greedy, at most ``max_new_tokens``; ``generation_config``:
        any ``transformers`` generation option), given (``continuation``: forced decoding, one
        text for all prompts or one per prompt), or taken from a :meth:`generate` result passed
        as ``prompts``; ``chat``: the prompts are user messages in the model's chat template. Every step of every prompt is explained as its
        own target, all in one batched problem (see :mod:`heedful.generation`); ``options`` go
        to the method, as for :meth:`explain` -- and ``precision="bf16"`` runs saliency,
        gradient x input and integrated gradients on the model's bfloat16 copy, forward and
        backward (:func:`heedful.generation_shared.generation_precision`; fast only on
        processors with bfloat16 arithmetic). A prompt and ``max_new_tokens`` beyond the
        model's positions, or steps whose copies cannot fit ``max_memory``, fail before anything
        is generated (:meth:`estimate_generation` says what a run will cost).

        >>> lm = heedful.load("smollm2-135m")                                       # doctest: +SKIP
        >>> g = lm.explain_generation("The capital of France is", max_new_tokens=4)  # doctest: +SKIP
        >>> g.generated_tokens, g.scores.shape                                      # doctest: +SKIP
        ([' Paris', '.', ' The', ' capital'], (4, 9))
        """
        info = self.method(method)
        options, precision = generation_precision(info, options, self.adapter.device)
        bound = info.bind(options, self.adapter.device)
        if bound.get("layerwise"):
            raise InputError("generation attribution gives one score per token and step", hint="drop layerwise=True")
        if info.needs_sources:
            raise InputError(
                f"{info.name} ranks sources for one target, not every generated step",
                hint=f"explain the generated answer as a span: lm.explain(prompt, {info.name!r}, target=answer)",
            )
        quantity = info.quantity(quantity, "log_prob")
        single = isinstance(prompts, str)
        generation = self._generation(
            info, bound, prompts, max_new_tokens, continuation, generation_config, chat, truncation, max_length
        )
        found_shared, shared = self._timed(lambda: explain_shared(self.adapter, generation, info, bound, quantity, precision))
        if found_shared is not None:  # one forward per sequence for all its steps
            problem, example, step, scores = found_shared
            own = (0.0, 0, 0)
        else:
            (problem, example, step), shared = self._timed(lambda: prepare_steps(self.adapter, generation, info, quantity))
            scores, own = self._timed(lambda: info.fn(problem, **bound).detach())
        problem.release_graph()
        rows = max(len(problem), 1)
        cost = Cost(*((a + b) / rows for a, b in zip(shared, own, strict=True)))
        probs = step_probabilities(generation, example, step, problem)
        found = assemble_generation(
            self.adapter, generation, example, step, scores, probs, info.name,
            jsonable(bound if precision == "fp32" else {**bound, "precision": precision}), quantity, cost, self.name,
        )
        return found[0] if single else found

    def _generation(
        self, info, bound, prompts, max_new_tokens, continuation, generation_config, chat, truncation, max_length
    ) -> Generation:
        """The generation :meth:`explain_generation` explains, its steps checked (positions, the
        method's copies under ``max_memory``) before anything is generated."""
        if isinstance(prompts, Generation):
            if continuation is not None:
                raise InputError("a generation has its continuations", hint="pass the prompts and continuation=...")
            generation = prompts
        else:
            batch = self._prompts(prompts, chat, truncation, max_length)
            if continuation is None:
                check_generation(self.adapter, info, bound, batch.lengths.tolist(), max_new_tokens)
                return generate(self.adapter, batch, max_new_tokens, **(generation_config or {}))
            generation = force(self.adapter, batch, continuation)
        check(self.adapter, info, bound, step_lengths(generation.prompt_lengths, generation.steps))
        return generation

    # ------------------------------------------------------------------ what a run will cost
    def estimate(
        self,
        texts: str | Sequence[str],
        method: str = "normxlogit",
        *,
        text_pair: str | Sequence[str] | None = None,
        truncation: bool = True,
        max_length: int | None = None,
        **options: Any,
    ) -> Work:
        """What :meth:`explain` of ``texts`` with ``method`` and ``options`` will cost on this
        machine -- passes, tokens and estimated seconds (:mod:`heedful.engine.workload`) -- without
        running it; an :class:`InputError` for what :meth:`explain` would refuse before any work.

        >>> lm = heedful.load("smollm2-135m")                                       # doctest: +SKIP
        >>> lm.estimate("The capital of France is", "integrated_gradients", n_steps=10_000, rule="riemann_trapezoid").describe()  # doctest: +SKIP
        'about 4 min: 10,001 forward and 10,000 backward passes of 6 tokens'
        """
        info = self.method(method)
        bound = info.bind(options, self.adapter.device)
        conversations = self._conversations(texts)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # explain itself says what it truncates
            if conversations is None:
                batch = self.encode(texts, text_pair=text_pair, truncation=truncation, max_length=max_length)
            else:
                batch = templated_batch(self.adapter, conversations, truncation, max_length)
        return check(self.adapter, info, bound, batch.lengths.tolist())

    def estimate_generation(
        self,
        prompts: str | Sequence[str],
        method: str = "saliency",
        *,
        max_new_tokens: int = 20,
        continuation: str | Sequence[str] | None = None,
        chat: bool = False,
        truncation: bool = True,
        max_length: int | None = None,
        **options: Any,
    ) -> Work:
        """What :meth:`explain_generation` will cost (generating ``max_new_tokens`` -- at most:
        generation may stop early -- or forcing ``continuation``, then explaining every step),
        without running it; an :class:`InputError` for what it would refuse before any work."""
        info = self.method(method)
        bound = info.bind(options, self.adapter.device)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            batch = self._prompts(prompts, chat, truncation, max_length)
        lengths = batch.lengths.tolist()
        if continuation is None:
            return check_generation(self.adapter, info, bound, lengths, max_new_tokens)
        generation = force(self.adapter, batch, continuation)
        return check(self.adapter, info, bound, step_lengths(lengths, generation.steps))

    def compare(
        self, text: str, methods: Sequence[str], target: Target | int | str | tuple | None = None, **options: Any
    ) -> Explanations:
        """Explanations of one text by several methods, from one prepared problem (a list that
        renders inline in notebooks). Each option
        goes to the methods that take it; an option none of them takes is an error."""
        infos = [self.method(name) for name in methods]
        if not infos:
            raise InputError("no method given", hint="name at least one method")
        unused = sorted(k for k in options if not any(info.takes(k) for info in infos))
        if unused:
            raise InputError(
                f"none of {', '.join(i.name for i in infos)} takes the option(s) {', '.join(unused)}",
                hint="see `heedful methods NAME` for a method's options",
            )
        bound = [info.bind({k: v for k, v in options.items() if info.takes(k)}, self.adapter.device) for info in infos]
        batch = self.encode(text)
        for info, opts in zip(infos, bound, strict=True):
            check(self.adapter, info, opts, batch.lengths.tolist())
        problem, shared = self._timed(
            lambda: self.prepare(
                batch,
                target,
                hidden_states=any(i.needs_hidden for i in infos),
                attentions=any(i.needs_attentions for i in infos),
            )
        )
        found = Explanations()
        for info, opts in zip(infos, bound, strict=True):
            found.extend(self._explain_problem(problem, info, opts, shared=shared))
        return found


def _contrast_label(spec: Target) -> str:
    """``"A vs B"`` as the user wrote it (a foil given a leading space by the parse keeps one)."""
    foil = str(spec.foil)
    return marked(f"{spec.value} vs{foil}" if foil.startswith(" ") else f"{spec.value} vs {foil}")


def _pairs(text_pair, count: int, single: bool) -> list[str] | None:
    if text_pair is None:
        return None
    pairs = [text_pair] if isinstance(text_pair, str) else list(text_pair)
    if len(pairs) != count:
        raise InputError(f"{count} texts but {len(pairs)} text pairs")
    return pairs


def _text_list(texts: str | Sequence[str] | None) -> list[str]:
    """``texts`` as a non-empty list of strings, or an :class:`InputError` saying what is wrong."""
    if isinstance(texts, str):
        return [texts]
    if texts is None or not isinstance(texts, Sequence) or len(texts) == 0:
        raise InputError("no text given", hint="pass a string or a non-empty list of strings")
    bad = [i for i, t in enumerate(texts) if not isinstance(t, str)]
    if bad:
        raise InputError(f"text {bad[0]} is a {type(texts[bad[0]]).__name__}, not a string")
    return list(texts)
