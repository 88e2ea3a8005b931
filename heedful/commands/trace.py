"""``heedful trace``: causal tracing and activation patching of one prompt, with attribution
patching's estimate beside the exact grid. Registered in :mod:`heedful.cli`; heavy imports
happen inside."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def trace(
    prompt: Annotated[str, typer.Argument(help="The prompt whose prediction is traced.")],
    model: Annotated[str, typer.Option("--model", "-m", help="Zoo name, model directory or hub id.")] = "smollm2-135m",
    corrupt: Annotated[str | None, typer.Option("--corrupt", "-c", help="Span of the prompt whose word embeddings are noised (ROME's subject).")] = None,
    counterfactual: Annotated[
        str | None, typer.Option("--counterfactual", help="Instead of noise: a prompt of the same token length to patch into (clean/corrupted pair).")
    ] = None,
    target: Annotated[str | None, typer.Option("--target", "-t", help="Output read: a class, or one token (e.g. ' Paris'); default: the prediction.")] = None,
    kind: Annotated[str, typer.Option("--kind", "-k", help="What is restored: residual, attn, mlp or head.")] = "residual",
    window: Annotated[int, typer.Option("--window", help="Layers restored per cell (ROME: 10 for attn and mlp).")] = 1,
    metric: Annotated[str, typer.Option("--metric", help="prob, logprob, logit or logit_diff (against --contrast).")] = "prob",
    contrast: Annotated[str | None, typer.Option("--contrast", help="Token subtracted by --metric logit_diff (default: the counterfactual's prediction).")] = None,
    noise: Annotated[float, typer.Option("--noise", help="Noise in standard deviations of the embeddings (ROME: 3).")] = 3.0,
    samples: Annotated[int, typer.Option("--samples", help="Noise samples averaged (ROME: 10).")] = 10,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the noise.")] = 0,
    no_atp: Annotated[bool, typer.Option("--no-atp", help="Skip attribution patching.")] = False,
    graddrop: Annotated[bool, typer.Option("--graddrop", help="Also AtP*'s GradDrop magnitudes (L more backward rows).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of the grids.")] = False,
    html: Annotated[Path | None, typer.Option("--html", help="Also write a self-contained HTML page.")] = None,
    csv: Annotated[Path | None, typer.Option("--csv", help="Also write one row per cell as CSV.")] = None,
    max_memory: Annotated[str | None, typer.Option("--max-memory", help="Memory budget of one pass, e.g. 4GB (default: half the free memory).")] = None,
    device: Annotated[str, typer.Option("--device", help="Where the model runs: cpu, cuda, mps.")] = "cpu",
) -> None:
    """Causal tracing (Meng et al. 2022): corrupt a span, restore each layer x position, print the indirect effects.

    The prompt's --corrupt span is noised (or --counterfactual is run instead); each cell
    restores one hidden state (--kind residual), one sub-layer output (attn, mlp; --window layers)
    or one head (head: a layer x head grid) to its clean value, in as few batched passes as the
    memory budget allows. A cell's value is the change of --metric of --target it brings back.
    Attribution patching (AtP) estimates the same grid from one backward; its Spearman
    correlation with the exact grid is printed. Ctrl-C prints the layers computed so far.
    """
    from heedful.commands.console import check_writable, err, load_model, out
    from heedful.engine.memory import parse_memory
    from heedful.inside.tracing import check_options
    from heedful.inside.tracing import trace as run_trace
    from heedful.render.grid import trace_page, trace_renderable

    check_options(kind, metric, samples, noise, window)
    for path, what in ((html, "--html"), (csv, "--csv")):
        if path is not None:
            check_writable(path, what)
    budget = parse_memory(max_memory) if max_memory is not None else None
    loaded = load_model(model, device=device, max_memory=budget)
    result = run_trace(
        loaded, prompt, corrupt=corrupt, counterfactual=counterfactual, target=target, kind=kind, window=window,
        metric=metric, contrast=contrast, noise=noise, samples=samples, seed=seed, atp=not no_atp, gradient_dropout=graddrop,
    )
    if as_json:
        out.print_json(result.to_json())
    else:
        out.print(trace_renderable(result))
    if html is not None:
        html.write_text(trace_page(result), encoding="utf-8")
        err.print(f"wrote {html}")
    if csv is not None:
        result.to_frame().to_csv(csv, index=False)
        err.print(f"wrote {csv}")
    if not result.complete:
        err.print("[yellow]interrupted[/]: the layers above were computed; the others are blank")
        raise typer.Exit(130)
