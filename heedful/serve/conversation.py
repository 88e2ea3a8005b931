"""``POST /api/conversation``: a chat model's conversation, each turn's share of the
assistant's answer.

The turns (system prompt, user turns, earlier assistant turns, documents placed in a turn) are
the sources a method ranks (``Model.explain(messages, method, target=answer,
sources="messages")``, :mod:`heedful.engine.conversation`); the answer is the one given, else
the conversation's last message when the assistant wrote it, else what the model writes after
the conversation (greedy, to its end of sequence or the request's ``max_new_tokens``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from heedful.errors import InputError
from heedful.model import Model
from heedful.registry import MethodInfo
from heedful.serve.errors import ApiError

Report = Callable[[str], None]
Messages = list[dict[str, str]]


def split_answer(messages: Messages, answer: str | None) -> tuple[Messages, str | None, str]:
    """The conversation to explain, the answer (``None``: to be generated) and where the answer
    came from (``"given"``, ``"last message"`` or ``"generated"``): a conversation that ends with
    the assistant's message without a given answer is explained for that message."""
    if answer is not None:
        if not answer.strip():
            raise ApiError(422, "the answer is empty", "give the assistant's answer, or leave it out to use the last assistant message")
        return messages, answer, "given"
    if messages[-1]["role"] == "assistant":
        if len(messages) == 1:
            raise ApiError(422, "the conversation is only the assistant's answer", "add the turns before it (system prompt, user turns)")
        return messages[:-1], messages[-1]["content"], "last message"
    return messages, None, "generated"


def shares(scores: Sequence[float]) -> np.ndarray:
    """``[S]`` each turn's signed share of the scores' total magnitude, ``s_i / sum_j |s_j|``
    (zeros when every score is zero): the absolute shares sum to 1, a negative share is a turn
    that works against the answer."""
    values = np.asarray(scores, dtype=float)
    total = np.abs(values).sum()
    return values / total if total > 0 else np.zeros_like(values)


def check_chat_model(model: Model) -> None:
    if model.task != "causal_lm":
        raise InputError(
            f"{model.name} is a {model.task} model; a conversation needs a chat (causal language) model",
            hint="pick a language model with a chat template (task causal_lm in GET /api/models)",
        )


def generated_answer(model: Model, messages: Messages, max_new_tokens: int) -> str:
    """What the model writes after the conversation (greedy, up to its end of sequence)."""
    generation = model.generate([messages], max_new_tokens)
    ids = list(generation.continuations[0])
    eos = getattr(model.tokenizer, "eos_token_id", None)
    kept = ids[: ids.index(eos)] if eos in ids else ids
    text = model.tokenizer.decode(kept)
    if not text.strip():
        raise InputError("the model wrote nothing but the end of the text", hint="give the assistant's answer as the last message or as answer")
    return text


def explain_conversation(
    model: Model,
    turns: Messages,
    answer: str | None,
    origin: str,
    info: MethodInfo,
    options: dict[str, Any],
    max_new_tokens: int,
    report: Report,
) -> dict[str, Any]:
    """Every turn of ``turns`` with its score and share for the assistant's ``answer`` (``None``:
    the model writes it), with ``info``'s method over the turns as sources; ``turns``,
    ``answer`` and ``origin`` as :func:`split_answer` gives them."""
    from heedful.serve.compute import number, numbers

    check_chat_model(model)
    if answer is None:
        report("writing the assistant's answer")
        answer = generated_answer(model, turns, max_new_tokens)
    report(f"ranking the turns with {info.name}")
    expl = model.explain(turns, info.name, target=answer, sources="messages", **options)
    pooled = expl.source_scores()
    return {
        "model": model.name,
        "method": info.name,
        "options": expl.options,
        "answer": answer,
        "answer_from": origin,
        "turns": [
            {"role": m["role"], "content": m["content"], "score": s, "share": h}
            for m, s, h in zip(turns, numbers(pooled.scores), numbers(shares(pooled.scores)), strict=True)
        ],
        "seconds": number(expl.cost.seconds),
    }
