"""Conversations: a list of ``{"role", "content"}`` messages as a chat model reads them.

:func:`template` applies the model's chat template (with the assistant's turn opened) and
finds each message's content in the result, so that the turns -- a system prompt, each user
turn, a document placed in a turn -- can be the **sources** a context method ranks
(``sources="messages"``), and :func:`templated_batch` encodes conversations with every token
outside the messages' own text (role markers, separators, a default system prompt the template
adds) marked special, so methods, metrics and views treat the template as the template.

>>> import heedful
>>> lm = heedful.load("smollm2-135m")                                       # doctest: +SKIP
>>> chat = [{"role": "user", "content": "Where is the Eiffel tower?"}]
>>> e = lm.explain(chat, "source_loo", target=" Paris", sources="messages")  # doctest: +SKIP
>>> e.source_scores().ranked()[0][1]                                         # doctest: +SKIP
'Where is the Eiffel tower?'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from heedful.engine.batch import Batch
from heedful.errors import InputError

if TYPE_CHECKING:
    from heedful.adapters.base import ModelAdapter

Span = tuple[int, int]


@dataclass(frozen=True)
class Conversation:
    """A conversation in its chat template: ``text`` (what the model reads, without a beginning
    of sequence token the tokenizer adds itself), each message's ``role`` and the character span
    of its content in ``text`` (``turns``)."""

    text: str
    roles: tuple[str, ...]
    turns: tuple[Span, ...]


def is_conversation(value: Any) -> bool:
    """Whether ``value`` is one conversation: a non-empty list of mappings with a ``role``."""
    return isinstance(value, Sequence) and not isinstance(value, str) and len(value) > 0 and all(
        isinstance(m, Mapping) and "role" in m for m in value
    )


def _check(messages: Sequence[Mapping[str, Any]]) -> None:
    for k, message in enumerate(messages):
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str) or not role:
            raise InputError(f"message {k} has no role", hint='give each message as {"role": "user", "content": "..."}')
        if not isinstance(content, str) or not content.strip():
            raise InputError(f"message {k} ({role}) has no text content", hint='give each message a non-empty "content" string')


def template(tokenizer: Any, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> Conversation:
    """``messages`` in ``tokenizer``'s chat template, with each message's content located.

    The contents are found from the last message backwards, each before the next one's start, so
    that a default system prompt the template writes first never takes a user's words.
    """
    _check(messages)
    if not getattr(tokenizer, "chat_template", None):
        raise InputError("this tokenizer has no chat template", hint="explain the text itself, or use a chat model")
    text = tokenizer.apply_chat_template([dict(m) for m in messages], add_generation_prompt=add_generation_prompt, tokenize=False)
    bos = tokenizer.bos_token
    if bos and text.startswith(bos) and tokenizer(" ", add_special_tokens=True)["input_ids"][:1] == [tokenizer.bos_token_id]:
        text = text[len(bos) :]  # the tokenizer adds it back
    turns: list[Span] = []
    end = len(text)
    for message in reversed(messages):
        content = message["content"]
        start = text.rfind(content, 0, end)
        if start < 0:
            raise InputError(
                f"the chat template rewrites the {message['role']} message, so its turn cannot be found",
                hint="pass the text the template writes instead, with sources as (start, end) spans",
            )
        turns.append((start, start + len(content)))
        end = start
    return Conversation(text, tuple(m["role"] for m in messages), tuple(reversed(turns)))


def templated_batch(
    adapter: ModelAdapter, conversations: Sequence[Conversation], truncation: bool = True, max_length: int | None = None
) -> Batch:
    """The conversations encoded, every token outside their messages' contents marked special
    (its offsets and word id dropped)."""
    batch = adapter.encode([c.text for c in conversations], None, truncation, max_length)
    for b, conversation in enumerate(conversations):
        for pos, offset in enumerate(batch.offsets[b]):
            inside = offset is not None and any(s <= offset[0] <= offset[1] <= e for s, e in conversation.turns)
            if not inside:
                batch.special_mask[b, pos] = True
                batch.offsets[b][pos] = None
                batch.word_ids[b][pos] = None
    return batch


def chat_batch(adapter: ModelAdapter, prompts: Sequence[str], truncation: bool = True, max_length: int | None = None) -> Batch:
    """Prompts as user messages in the model's chat template (with the assistant's turn opened),
    encoded; every token outside the user's own text -- the template's role markers, system
    prompt and separators -- is marked special, so methods, metrics and views treat it as such."""
    conversations = [template(adapter.tokenizer, [{"role": "user", "content": prompt}]) for prompt in prompts]
    return templated_batch(adapter, conversations, truncation, max_length)
