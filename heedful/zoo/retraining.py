"""ROAR's retraining of zoo classifiers: a fresh copy of a zoo model from the initialisation its
build starts from, trained by the build's own training code and settings
(:mod:`heedful.evaluate.roar` measures with it).

>>> from heedful.zoo.retraining import retrainer                   # doctest: +SKIP
>>> retrainer("minilm-sentiment", epochs=1, threads=1).settings["epochs"]  # doctest: +SKIP
1

Importing this module imports neither torch nor transformers; :func:`retrainer` does.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from heedful.errors import InputError

if TYPE_CHECKING:
    from heedful.evaluate.roar import Retrainer

RETRAINABLE = ("minilm-sentiment",)
"""Zoo models whose build :func:`retrainer` can repeat on other data."""


def retrainer(name: str = "minilm-sentiment", **changes: Any) -> Retrainer:
    """The :class:`~heedful.evaluate.roar.Retrainer` of zoo model ``name``: ``minilm-sentiment``
    starts from the MiniLM package's encoder with a 2-way head drawn with the retrain's seed (seed
    0: the build's own start) and trains with the build's :data:`~heedful.zoo.builders.CLASSIFIER_CONFIG`
    (two epochs, AdamW 1e-4, batches of 32, texts cut to 64 tokens, 2 threads), with ``changes``
    to its fields (``epochs=1``, ``threads=1``)."""
    if name not in RETRAINABLE:
        raise InputError(
            f"ROAR cannot retrain {name!r}: its build is not repeatable on other data here",
            hint=f"retrainable zoo models: {', '.join(RETRAINABLE)}; for another model build a Retrainer (heedful.zoo.train.encoded_retrainer)",
        )
    from heedful.zoo import builders, sources, train

    known = {f.name for f in dataclasses.fields(builders.CLASSIFIER_CONFIG)} - {"seed"}
    unknown = sorted(set(changes) - known)
    if unknown:
        raise InputError(f"the training settings have no field {unknown[0]!r}", hint=f"fields: {', '.join(sorted(known))}")
    config = dataclasses.replace(builders.CLASSIFIER_CONFIG, **changes)
    start = f"{name}: {sources.MINILM.requirement} encoder + a 2-way head seeded with the retrain's seed"
    return train.encoded_retrainer(start, builders.minilm_sentiment_start, config)
