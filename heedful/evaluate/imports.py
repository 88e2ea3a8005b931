"""Explanations computed elsewhere, read and aligned to a heedful model's tokens, so that every
metric and preset scores them exactly like heedful's own methods.

Readers
-------
* :func:`from_records` -- dicts (one per explanation) with the fields of :data:`FIELDS`;
* :func:`from_json` -- a JSON list of such dicts (or ``{"explanations": [...]}``) or JSON lines;
* :func:`from_parquet` -- a Parquet table with those columns (``heedful bench export`` writes
  one: importing it back gives heedful's own explanations);
* :func:`from_captum` -- Captum attributions ``[B, S]`` (or ``[B, S, H]``, summed over ``H`` as
  Captum's token attributions are) with the ``input_ids`` ``[B, S]`` they were computed for;
* :func:`from_inseq` -- Inseq's ``FeatureAttributionOutput`` or the JSON file its ``save()``
  writes (decoder-only models: one explanation per generated token, scoring the tokens before
  it); read without Inseq installed.

Alignment
---------
Each explanation becomes a :class:`~heedful.Explanation` of the model's own tokens of its text:

1. **token ids** (``token_ids``, or Captum's / Inseq's ids) are matched one to one with the
   model's ids; a special token on one side only is skipped (it scores 0 on the model's side);
2. otherwise **tokens equal to the model's** are taken as they are;
3. otherwise each imported token gets a **character span** -- its ``offsets``, or the place of
   the token's text in the text, found left to right (sub-word markers ``##``, ``Ġ``, ``▁``
   dropped; case and accents ignored) -- and each model token's score is the **sum of the
   scores of the imported tokens its characters overlap** (a word's score goes to each of its
   sub-words, so they rank together; finer imported pieces add up).

A model token (not special) that no imported token covers, an imported token found nowhere
(or with an out-of-range span), or ids that differ is a one-line :class:`AlignmentError`
naming the example, the position and the fix. Imported tokens past the model's ``max_length``
are dropped (the explanation is marked ``truncated``).

The target of each explanation is the record's ``target`` (a class index or label, a token;
``target_indices``: explicit output columns), else the model's predicted class / next token.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from heedful.errors import InputError
from heedful.evaluate.alignment import AlignmentError, align
from heedful.evaluate.imported_records import (
    captum_records,
    inseq_records,
    read_json,
    read_parquet,
    records,
)
from heedful.explanation import Explanations
from heedful.model import Model


# ---------------------------------------------------------------------------- public readers
def from_records(
    model: Model,
    items: Iterable[Mapping[str, Any]],
    *,
    name: str = "imported",
    method: str | None = None,
    max_length: int | None = None,
    batch_size: int = 16,
) -> Explanations:
    """Explanations of ``model`` from dicts with the fields of :data:`FIELDS` (``text``,
    ``scores`` and, to align them, ``tokens`` / ``token_ids`` / ``offsets``).

    >>> from heedful.evaluate import from_records, evaluate                       # doctest: +SKIP
    >>> expl = from_records(model, [{"text": "a dull plot", "tokens": ["a", "dull", "plot"],
    ...                              "scores": [0.1, 0.8, 0.1]}])                  # doctest: +SKIP
    >>> evaluate(model, expl, ["aopc"])["aopc"].summary.value                      # doctest: +SKIP
    """
    return align(model, records(items, method), name, max_length=max_length, batch_size=batch_size)


def from_json(model: Model, path: str | Path, *, name: str | None = None, method: str | None = None, **kw: Any) -> Explanations:
    """Explanations of ``model`` from a JSON or JSON-lines file of records (:func:`from_records`)."""
    return align(model, read_json(path, method), name or Path(path).stem, **kw)


def from_parquet(model: Model, path: str | Path, *, name: str | None = None, method: str | None = None, **kw: Any) -> Explanations:
    """Explanations of ``model`` from a Parquet table of records (:func:`from_records`; a
    ``heedful bench export`` table with ``method=``)."""
    return align(model, read_parquet(path, method), name or Path(path).stem, **kw)


def from_captum(
    model: Model,
    attributions: Any,
    input_ids: Any,
    *,
    texts: Sequence[str] | None = None,
    text_pairs: Sequence[str | None] | None = None,
    attention_mask: Any = None,
    target: int | str | Sequence[int | str] | None = None,
    ids: Sequence[str] | None = None,
    name: str = "captum",
    **kw: Any,
) -> Explanations:
    """Explanations of ``model`` from Captum attributions ``[B, S]`` / ``[B, S, H]`` and their
    ``input_ids`` (see :func:`captum_records`), aligned by id.

    >>> ig = captum.attr.LayerIntegratedGradients(forward, model.hf_model.get_input_embeddings())  # doctest: +SKIP
    >>> attr = ig.attribute(input_ids, target=1)                                   # doctest: +SKIP
    >>> from_captum(model, attr, input_ids, target=1)[0].top(3)                     # doctest: +SKIP
    """
    found = captum_records(
        attributions, input_ids, model.tokenizer, texts=texts, text_pairs=text_pairs,
        attention_mask=attention_mask, target=target, ids=ids,
    )
    return align(model, found, name, **kw)


def from_inseq(model: Model, source: Any, *, name: str = "inseq", steps: str = "all", **kw: Any) -> Explanations:
    """Explanations of ``model`` (a causal LM) from an Inseq ``FeatureAttributionOutput`` or the
    JSON file its ``save()`` wrote (see :func:`inseq_records`); the steps that cannot be aligned
    are left out (compare ``details["example_id"]``), and none aligned is an error.

    >>> out = inseq.load_model(hf_model, "saliency", tokenizer=tok).attribute("The cat")  # doctest: +SKIP
    >>> out.save("cat.json")                                                        # doctest: +SKIP
    >>> from_inseq(model, "cat.json")[0].target.label                               # doctest: +SKIP
    """
    if model.task != "causal_lm":
        raise InputError(f"Inseq explains generation; {model.name} is a {model.task} model", hint="use a causal language model")
    found = inseq_records(source, model.tokenizer, steps)
    explained = align(model, found, name, **kw)
    if found and not explained:
        raise AlignmentError(
            f"none of the {len(found)} Inseq steps matches {model.name}'s tokens",
            hint="import the output with the model (and tokenizer) Inseq attributed",
        )
    return explained


