"""Model: a loaded model plus its adapter, with ``explain`` -- heedful's main entry point."""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from heedful.adapters import Forward, ModelAdapter
from heedful.batch import Batch
from heedful.errors import InputError
from heedful.explanation import Cost, Explanation, TargetInfo
from heedful.registry import MethodInfo, get_method
from heedful.targets import ResolvedTarget, Target, resolve_target

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
            batch = self.adapter.encode(items[start : start + batch_size])
            anchor, _ = self.adapter.anchor_positions(batch)
            found.extend(self._predictions(self.adapter.forward(batch, anchor).logits))
        return found

    def _predictions(self, logits: torch.Tensor) -> list[dict[str, Any]]:
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
        texts: str | Sequence[str],
        method: str = "normxlogit",
        target: Target | int | str | tuple | None = None,
        *,
        text_pair: str | Sequence[str] | None = None,
        batch_size: int = 16,
        truncation: bool = True,
        max_length: int | None = None,
        progress: ProgressHook | None = None,
        **options: Any,
    ) -> Explanation | list[Explanation]:
        """Explain the model's output for one text (returns an :class:`Explanation`) or many
        (returns a list, computed ``batch_size`` texts at a time).

        ``target``: ``None`` (predicted class / next token), a class index or label, a token
        string for language models, ``"A vs B"`` or ``(A, B)`` for a contrast. ``options`` go to
        the method (e.g. ``n_steps=100`` for integrated gradients, ``layerwise=True`` for
        NormXLogit); stochastic methods take ``seed``.

        >>> model = heedful.load("minilm-sentiment")                          # doctest: +SKIP
        >>> e = model.explain("a charming and often affecting journey")        # doctest: +SKIP
        >>> e.top(2)                                                          # doctest: +SKIP
        [('charming', ...), ('affecting', ...)]
        """
        info = get_method(method, self.task)
        _check_options(info, options)
        spec = Target.parse(target)
        single = isinstance(texts, str)
        items = _text_list(texts)
        pairs = self._pairs(text_pair, len(items), single)
        if batch_size < 1:
            raise InputError(f"batch_size must be positive, got {batch_size}")
        results: list[Explanation] = []
        for start in range(0, len(items), batch_size):
            stop = start + batch_size
            batch = self.adapter.encode(
                items[start:stop], None if pairs is None else pairs[start:stop], truncation, max_length
            )
            results.extend(self._explain_batch(batch, info, spec, options))
            if progress is not None:
                progress(len(batch))
        return results[0] if single else results

    @staticmethod
    def _pairs(text_pair, count: int, single: bool) -> list[str] | None:
        if text_pair is None:
            return None
        pairs = [text_pair] if isinstance(text_pair, str) else list(text_pair)
        if len(pairs) != count:
            raise InputError(f"{count} texts but {len(pairs)} text pairs")
        return pairs

    def run_method(
        self, batch: Batch, info: MethodInfo, spec: Target, options: dict[str, Any]
    ) -> tuple[torch.Tensor, ResolvedTarget, Forward]:
        """Reference forward, target resolution and the method itself on an encoded batch.

        Returns scores ``[B, N]`` (or ``[B, L, N]``), the resolved target and the reference pass.
        """
        anchor, _ = self.adapter.anchor_positions(batch)
        if info.reference_pass is not None:
            reference = info.reference_pass(self.adapter, batch, anchor)
        else:
            with torch.no_grad():
                reference = self.adapter.forward(
                    batch, anchor, hidden_states=info.needs_hidden, attentions=info.needs_attentions
                )
        resolved = resolve_target(spec, self.adapter, batch, reference.logits.detach())
        scores = info.fn(self.adapter, batch, resolved, reference, **options)
        if reference.inputs_embeds is not None or reference.logits.requires_grad:
            reference = Forward(reference.logits.detach(), reference.hidden_states, reference.attentions)
        return scores.detach(), resolved, reference

    def _explain_batch(
        self, batch: Batch, info: MethodInfo, spec: Target, options: dict[str, Any]
    ) -> list[Explanation]:
        counter = self.adapter.counter
        counter.reset()
        began = time.perf_counter()
        scores, resolved, reference = self.run_method(batch, info, spec, options)
        elapsed = time.perf_counter() - began
        bsz = len(batch)
        cost = Cost(elapsed / bsz, counter.forward / bsz, counter.backward / bsz)
        predictions = self._predictions(reference.logits)
        explanations = []
        for b in range(bsz):
            n = len(batch.tokens[b])
            row = scores[b, ..., :n].float().cpu().numpy().astype(np.float64)
            explanations.append(
                Explanation(
                    text=batch.texts[b],
                    text_pair=batch.text_pairs[b],
                    tokens=batch.tokens[b],
                    offsets=batch.offsets[b],
                    word_ids=batch.word_ids[b],
                    special=batch.special_mask[b, :n].tolist(),
                    segments=batch.sequence_ids[b],
                    scores=row,
                    target=TargetInfo(
                        kind="regression" if self.task == "regression" else spec.kind,
                        indices=resolved.classes[b].tolist(),
                        label=resolved.labels[b],
                        anchor=int(resolved.anchor[b]),
                    ),
                    method=info.name,
                    options={**info.defaults, **options},
                    cost=cost,
                    model=self.name,
                    prediction=predictions[b],
                    truncated=bool(batch.truncated[b]) if batch.truncated else False,
                )
            )
        return explanations

    def compare(
        self, text: str, methods: Sequence[str], target: Target | int | str | tuple | None = None, **options: Any
    ) -> list[Explanation]:
        """Explanations of one text by several methods (options shared where a method takes them)."""
        found = []
        for name in methods:
            info = get_method(name, self.task)
            params = inspect.signature(info.fn).parameters
            accepted = {k: v for k, v in options.items() if k in params}
            found.append(self.explain(text, name, target, **accepted))
        return found


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


def _check_options(info: MethodInfo, options: dict[str, Any]) -> None:
    """Unknown method options, and values outside an option's declared choices, fail before any
    work, naming what the method takes."""
    params = inspect.signature(info.fn).parameters
    taken = [name for name in params if name not in ("adapter", "batch", "target", "reference")]
    unknown = sorted(set(options) - set(taken))
    if unknown and not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        raise InputError(
            f"{info.name} does not take the option(s) {', '.join(unknown)}",
            hint=f"{info.name}'s options: {', '.join(taken) or 'none'} (see `heedful methods`)",
        )
    for name, allowed in info.choices.items():
        if name in options and not any(type(options[name]) is type(a) and options[name] == a for a in allowed):
            raise InputError(
                f"{info.name}: {name}={options[name]!r} is not one of {', '.join(repr(a) for a in allowed)}",
                hint=f"e.g. {name}={next(a for a in allowed if a is not None)!r}",
            )
