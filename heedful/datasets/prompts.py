"""Prompts for generation benchmarks: a JSON-lines (or CSV) file with a ``prompt`` column and,
optionally, a ``continuation`` to explain instead of what the model generates."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from heedful.datasets.user import read_table
from heedful.errors import InputError


@dataclass(frozen=True)
class Prompt:
    """One prompt; ``continuation``: the text to force after it (``None``: generate)."""

    prompt: str
    continuation: str | None = None


def load_prompts(path: str | Path, n: int | None = None) -> list[Prompt]:
    """The first ``n`` (all by default) prompts of a file; rows need a non-empty ``prompt``.

    >>> import json, tempfile, pathlib
    >>> f = pathlib.Path(tempfile.mkdtemp()) / "p.jsonl"
    >>> _ = f.write_text(json.dumps({"prompt": "The capital of France is"}) + "\\n")
    >>> load_prompts(f)
    [Prompt(prompt='The capital of France is', continuation=None)]
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"no prompts file {path}", hint="give a JSON-lines file with a 'prompt' field per line")
    frame = read_table(path)
    if "prompt" not in frame.columns:
        raise InputError(f"{path} has no 'prompt' column", hint="each line needs {\"prompt\": ...} (and may have \"continuation\")")
    found = []
    for row, record in enumerate(frame.to_dict("records")):
        prompt = record.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise InputError(f"row {row} of {path} has no prompt text")
        continuation = record.get("continuation")
        if continuation is not None and not isinstance(continuation, str):
            continuation = None if continuation != continuation else str(continuation)  # NaN: not given
        found.append(Prompt(prompt, continuation or None))
    return found[:n] if n is not None else found
