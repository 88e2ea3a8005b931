"""``heedful counterfactual``: test explanation methods' hypotheses on realistic edits of a
dataset's texts (Ye et al. 2021). Registered in :mod:`heedful.cli`; heavy imports happen inside."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def counterfactual(
    method: Annotated[list[str], typer.Option("--method", "-M", help="Method to test; repeat to compare.")],
    model: Annotated[str, typer.Option("--model", "-m", help="Classifier: zoo name, model directory or hub id.")] = "minilm-sentiment",
    dataset: Annotated[str, typer.Option("--dataset", "-d", help="movies, amazon, nyt, tweets, or a CSV / JSONL path.")] = "movies",
    split: Annotated[str, typer.Option("--split", help="Dataset split.")] = "test",
    n: Annotated[int, typer.Option("--n", "-n", help="Test on the first N texts.")] = 100,
    k: Annotated[int, typer.Option("--k", help="Top words the hypothesis names (the replace edit).")] = 1,
    edit: Annotated[list[str] | None, typer.Option("--edit", help="replace, negate or swap; repeatable (default: all three).")] = None,
    margin: Annotated[float, typer.Option("--margin", help="How much more the top words' edit must lower p(class) than the control's.")] = 0.05,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the replacements and control words.")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (every hypothesis) instead of the table.")] = False,
    csv: Annotated[Path | None, typer.Option("--csv", help="Also write the summary as CSV.")] = None,
) -> None:
    """Counterfactual tests of explanations: does editing the top-scoring words change the prediction as predicted?

    Each method explains each text's predicted class; its hypothesis "the top-k words drive
    the prediction" is tested by replacing them with other corpus words of the same
    part-of-speech tag (spaCy), negating the top adjective, and swapping the two top
    words, each against a control edit of other words. Prints per method and edit the share of
    hypotheses confirmed with its 95 % Wilson interval.
    """
    import json

    from heedful import datasets
    from heedful.commands.console import check_writable, load_model, out
    from heedful.errors import InputError
    from heedful.inside.counterfactual import EDITS, check_test, counterfactual_test

    check_test(k, tuple(edit or EDITS), margin)
    if n < 1:
        raise InputError(f"--n must be a positive number of texts, got {n}", hint="e.g. --n 100")
    if csv is not None:
        check_writable(csv, "--csv")
    data = datasets.load(dataset, split, n=n)
    loaded = load_model(model)
    report = counterfactual_test(loaded, data.texts, method, k=k, edits=tuple(edit or EDITS), seed=seed, margin=margin)
    if as_json:
        out.print_json(json.dumps(report.to_dict(), default=float))
    else:
        out.print(report.table())
    if csv is not None:
        report.summary().to_csv(csv, index=False)
