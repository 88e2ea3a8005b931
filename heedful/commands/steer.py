"""``heedful steer``: suppress prompt words and compare the generations and the interest
(the seed paper's Section 5.4.2). Registered in :mod:`heedful.cli`; heavy imports happen inside."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from heedful.commands.interest import OptionOpt, check_run, settings_options


def steer(
    prompt: Annotated[str, typer.Option("--prompt", "-p", help="Prompt to continue.")],
    suppress: Annotated[
        list[str], typer.Option("--suppress", "-s", help="Word or phrase of the prompt to suppress; repeatable.")
    ],
    model: Annotated[str, typer.Option("--model", "-m", help="Causal LM: zoo name, model directory or hub id.")] = "smollm2-135m",
    weight: Annotated[float, typer.Option("--weight", "-w", help="Factor on the suppressed tokens' input embeddings (0 erases their content).")] = 0.0,
    max_new_tokens: Annotated[
        int | None, typer.Option("--max-new-tokens", help="Tokens to generate (default: up to 150 with the prompt, the paper's max_length).")
    ] = None,
    beams: Annotated[int, typer.Option("--beams", help="Beams of the beam-search mode (the paper's: 3).")] = 3,
    html: Annotated[Path | None, typer.Option("--html", help="Also write a self-contained HTML page.")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the interest estimation's noise draws.")] = 0,
    option: OptionOpt = None,
) -> None:
    """Steer generation by suppressing prompt words (seed paper, Section 5.4.2).

    Estimates co-perturbation interest over PROMPT (explained output: the next-token logits),
    suppresses the --suppress words by scaling their tokens' input word embeddings by --weight
    (default 0: their content is erased, their positions kept; no attention masking, so the
    other tokens' positions are unchanged and --weight can weaken a word partially), then
    generates from the original and from the suppressed prompt by greedy decoding and by beam
    search (do_sample=False; the paper's num_beams=3 and max_length=150), re-estimates interest
    after suppression, and shows both side by side. The suppressed embeddings feed the prompt
    pass, whose cached keys and values every generated token attends to.
    """
    from heedful.commands.console import err, load_model, out
    from heedful.interest.steer import steer as run_steer
    from heedful.interest.steering_view import steering_page, steering_renderable

    settings = settings_options(option)
    check_run(seed, html)
    loaded = load_model(model)
    result = run_steer(  # the solver's steps and the generations show as bars (heedful.progress)
        loaded, prompt, suppress, weight=weight, max_new_tokens=max_new_tokens, beams=beams, seed=seed, **settings
    )
    out.print(steering_renderable(result))
    if html is not None:
        html.write_text(steering_page(result), encoding="utf-8")
        err.print(f"wrote {html}")
