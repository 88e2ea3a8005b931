"""GenerationExplanation: what every generated token relied on -- a matrix of scores, one row
per generated step, one column per token of the prompt and of the generation before it."""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from heedful.engine.batch import Batch
from heedful.engine.readable import marked
from heedful.explanation import Cost, Views

if TYPE_CHECKING:
    import pandas as pd

    from heedful.adapters.base import ModelAdapter
    from heedful.generation import Generation


@dataclass
class GenerationExplanation(Views):
    """One prompt's generation, explained step by step.

    ``tokens`` (``S = P + T``, as people read them, :mod:`heedful.engine.readable`; ``raw_tokens``:
    the tokenizer's symbols, equal to ``tokens`` when not given), ``offsets`` (into ``text``, the prompt and continuation
    joined), ``word_ids`` and ``special`` describe every token; the first ``prompt_length``
    (``P``) are the prompt's. ``scores`` ``[T, S]``: row ``t`` explains generated token
    ``tokens[P + t]`` (its ``quantity``, ``"log_prob"`` or ``"logit"``) over the tokens before
    it; cells ``j >= P + t`` are NaN (the token had not been written yet). ``probabilities``
    ``[T]``: ``p(y_t | prompt, y_<t)``. ``cost``: per step (seconds, sequences forward and
    backward); ``generation_seconds``: generating the continuation (0 when it was forced).
    ``source_length``: an encoder–decoder's source side, the first ``source_length`` tokens
    (the rest of the prompt -- the decoder-start token -- and the continuation are its target
    side, :mod:`heedful.adapters.seq2seq`); ``None`` for a decoder, whose tokens are one side.

    >>> import numpy as np
    >>> g = GenerationExplanation(prompt="Hi", text="Hi there", tokens=["Hi", " there"],
    ...     offsets=[(0, 2), (2, 8)], word_ids=[0, 1], special=[False, False], prompt_length=1,
    ...     scores=np.array([[0.7, np.nan]]), probabilities=np.array([0.4]), method="demo")
    >>> g.generated_tokens, g.continuation
    ([' there'], ' there')
    """

    prompt: str
    text: str
    tokens: list[str]
    offsets: list[tuple[int, int] | None]
    word_ids: list[int | None]
    special: list[bool]
    prompt_length: int
    scores: np.ndarray
    probabilities: np.ndarray
    method: str
    options: dict[str, Any] = field(default_factory=dict)
    quantity: str = "log_prob"
    forced: bool = False
    cost: Cost = field(default_factory=lambda: Cost(0.0, 0.0, 0.0))
    generation_seconds: float = 0.0
    model: str = ""
    raw_tokens: list[str] = field(default_factory=list)
    source_length: int | None = None

    def __post_init__(self) -> None:
        if not self.raw_tokens:
            self.raw_tokens = list(self.tokens)

    def side(self, position: int) -> str:
        """``"source"`` or ``"target"`` (an encoder–decoder's two sides), or ``"prompt"`` /
        ``"generated"`` (a decoder), for token ``position``."""
        if self.source_length is not None:
            return "source" if position < self.source_length else "target"
        return "prompt" if position < self.prompt_length else "generated"

    @property
    def source_scores(self) -> np.ndarray:
        """``[T, S]``: an encoder–decoder's scores over its source side (a decoder's: its prompt)."""
        return self.scores[:, : self.prompt_length if self.source_length is None else self.source_length]

    @property
    def target_scores(self) -> np.ndarray:
        """``[T, N - S]``: an encoder–decoder's scores over its target side -- the decoder-start
        token and the output written before each step (NaN where not yet written)."""
        return self.scores[:, self.prompt_length if self.source_length is None else self.source_length :]

    # ------------------------------------------------------------------ reading
    @property
    def steps(self) -> int:
        return int(self.scores.shape[0])

    @property
    def generated_tokens(self) -> list[str]:
        return self.tokens[self.prompt_length : self.prompt_length + self.steps]

    @property
    def continuation(self) -> str:
        return self.text[len(self.prompt) :]

    @property
    def prompt_scores(self) -> np.ndarray:
        """``[T, P]``: each step's scores over the prompt's tokens alone."""
        return self.scores[:, : self.prompt_length]

    def sequence_scores(self) -> np.ndarray:
        """``[S]``: the scores summed over the steps (NaN counted as 0) -- for a method that is
        linear in its target, the attribution of the whole continuation's summed output."""
        return np.nansum(self.scores, axis=0)

    def words(self, agg: str = "sum") -> tuple[list[str], np.ndarray]:
        """Words of the text (by the tokenizer's word numbers) and the ``[T, W]`` scores
        aggregated over each word's tokens (``"sum"``, ``"mean"`` or ``"max"`` by absolute
        value) written before the step; NaN for a word none of whose tokens was written yet."""
        groups: dict[int, list[int]] = {}
        for i, w in enumerate(self.word_ids):
            if w is not None and not self.special[i]:
                groups.setdefault(w, []).append(i)
        return self._grouped(list(groups.values()), agg)

    def sentences(self, agg: str = "sum") -> tuple[list[str], np.ndarray]:
        """Sentences of the text (ending at ``.``, ``!`` or ``?`` followed by a space, or at a
        line break) and the ``[T, S]`` scores aggregated over each sentence's tokens, as
        :meth:`words`."""
        bounds = [m.end() for m in re.finditer(r"[.!?]+[\"')\]]*\s+|\n+", self.text)]
        groups: dict[int, list[int]] = {}
        for i, offset in enumerate(self.offsets):
            if offset is not None and not self.special[i]:
                groups.setdefault(bisect.bisect_right(bounds, offset[0]), []).append(i)
        return self._grouped(list(groups.values()), agg)

    def _grouped(self, groups: list[list[int]], agg: str) -> tuple[list[str], np.ndarray]:
        """The text of each group of token positions and its ``[T, G]`` aggregated scores."""
        labels, columns = [], []
        for idx in groups:
            start, end = self.offsets[idx[0]][0], self.offsets[idx[-1]][1]
            words = self.text[start:end]
            labels.append(marked(words.strip() or words))
            block = self.scores[:, idx]
            written = ~np.isnan(block).all(axis=1)
            if agg == "sum":
                col = np.nansum(block, axis=1)
            elif agg == "mean":
                col = np.nansum(block, axis=1) / np.maximum((~np.isnan(block)).sum(axis=1), 1)
            elif agg == "max":
                filled = np.nan_to_num(block)
                col = filled[np.arange(self.steps), np.abs(filled).argmax(axis=1)]
            else:
                raise ValueError(f"agg must be 'sum', 'mean' or 'max', got {agg!r}")
            columns.append(np.where(written, col, np.nan))
        return labels, np.stack(columns, axis=1) if columns else np.zeros((self.steps, 0))

    def top(self, step: int, k: int = 5) -> list[tuple[str, float]]:
        """The ``k`` tokens with the largest scores for generated step ``step``."""
        row = self.scores[step]
        order = [i for i in np.argsort(-np.nan_to_num(row, nan=-np.inf)) if np.isfinite(row[i]) and not self.special[i]]
        return [(self.tokens[i], float(row[i])) for i in order[:k]]

    # ------------------------------------------------------------------ export
    def to_pandas(self) -> pd.DataFrame:
        """One row per (generated step, earlier token): ``step``, ``generated``, ``probability``,
        ``position``, ``token``, ``raw_token`` (the tokenizer's symbol), ``in_prompt``, ``side``
        (:meth:`side`), ``special``, ``score``."""
        rows = []
        for t, generated in enumerate(self.generated_tokens):
            for j in range(self.prompt_length + t):
                rows.append(
                    {
                        "step": t,
                        "generated": generated,
                        "probability": float(self.probabilities[t]),
                        "position": j,
                        "token": self.tokens[j],
                        "raw_token": self.raw_tokens[j],
                        "in_prompt": j < self.prompt_length,
                        "side": self.side(j),
                        "special": self.special[j],
                        "score": float(self.scores[t, j]),
                    }
                )
        import pandas as pd  # on use: pandas (and pyarrow) take a noticeable share of start-up

        return pd.DataFrame(rows)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (scores as lists, ``None`` where not yet written)."""
        data = self._plain()
        data["scores"] = [[None if np.isnan(v) else float(v) for v in row] for row in self.scores]
        data["probabilities"] = self.probabilities.tolist()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GenerationExplanation:
        data = cls._restored(data)
        data["scores"] = np.array([[np.nan if v is None else v for v in row] for row in data["scores"]], dtype=float)
        data["probabilities"] = np.asarray(data["probabilities"], dtype=float)
        return cls(**data)

    # ------------------------------------------------------------------ views
    def _page(self) -> str:
        from heedful.render.generation import generation_page

        return generation_page([self])

    def _snippet(self) -> str:
        from heedful.render.generation import generation_snippet

        return generation_snippet(self)

    def _renderable(self):
        from heedful.render.generation import generation_table

        return generation_table(self)


def assemble_generation(
    adapter: ModelAdapter,
    generation: Generation,
    example: torch.Tensor,
    step: torch.Tensor,
    scores: torch.Tensor,
    probabilities: torch.Tensor,
    method: str,
    options: dict[str, Any],
    quantity: str,
    cost: Cost,
    model: str,
) -> list[GenerationExplanation]:
    """One :class:`GenerationExplanation` per prompt from the step rows' ``scores`` ``[R, W]``
    and ``probabilities`` ``[R]`` (rows ``(example[r], step[r])``, see
    :func:`heedful.generation.step_rows`); ``adapter`` reads the tokens as people do."""
    batch = generation.batch
    types = batch.token_type_ids
    values = scores.float().cpu().numpy().astype(np.float64)
    probs = probabilities.float().cpu().numpy().astype(np.float64)
    found = []
    for b, steps in enumerate(generation.steps):
        n, prompt = int(batch.lengths[b]), generation.prompt_lengths[b]
        matrix = np.full((steps, n), np.nan)
        p = np.zeros(steps)
        for r in (example == b).nonzero().flatten().tolist():
            t = int(step[r])
            matrix[t, : prompt + t] = values[r, : prompt + t]
            p[t] = probs[r]
        found.append(
            GenerationExplanation(
                prompt=generation.prompts[b] if generation.prompts is not None else batch.texts[b][: _prompt_chars(batch, b, prompt)],
                text=batch.texts[b],
                tokens=adapter.readable_tokens(batch.input_ids[b, :n].tolist(), batch.tokens[b]),
                offsets=batch.offsets[b],
                word_ids=batch.word_ids[b],
                special=batch.special_mask[b, :n].tolist(),
                prompt_length=prompt,
                scores=matrix,
                probabilities=p,
                method=method,
                options=dict(options),
                quantity=quantity,
                forced=generation.forced,
                cost=cost,
                generation_seconds=generation.seconds / max(len(generation.steps), 1),
                model=model,
                raw_tokens=list(batch.tokens[b]),
                source_length=None if types is None else int((types[b, :n] == 0).sum()),
            )
        )
    return found


def _prompt_chars(batch: Batch, b: int, prompt: int) -> int:
    """Characters of example ``b``'s text that belong to its prompt: up to the end of its last
    prompt token (0 when all are special)."""
    return max((offset[1] for offset in batch.offsets[b][:prompt] if offset is not None), default=0)
