"""``heedful at2 train``: learn AT2's attention-head weights for a model (:mod:`heedful.attribution.at2`).

Registered in :mod:`heedful.cli`. Heavy imports happen inside the command.

The training set is generated: planted long documents of the train split
(:mod:`heedful.datasets.planted`; every sentence a source, lengths cycling through
``--lengths``), each continued by the model itself (greedy, ``--new-tokens`` tokens), whose
continuation is the target. For each document ``--ablations`` random source ablations are run
(each source kept with probability 1/2) and the target's logit-probability recorded, with the
head features of the full document; the weights maximise the mean correlation between the
surrogate's predictions and those outputs (Cohen-Wang et al. 2025).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(help="AT2: learn a model's attention-head weights for context attribution.", no_args_is_help=True)


@app.command("train")
def train(
    model: Annotated[str, typer.Option("--model", "-m", help="Zoo name, model directory or hub id (a decoder).")] = "smollm2-135m",
    docs: Annotated[int, typer.Option("--docs", help="Generated training documents.")] = 24,
    lengths: Annotated[str, typer.Option("--lengths", help="Document lengths in tokens, cycled over the documents.")] = "256,512",
    new_tokens: Annotated[int, typer.Option("--new-tokens", help="Tokens the model generates after each document: the target.")] = 1,
    ablations: Annotated[int, typer.Option("--ablations", help="Random source ablations per document.")] = 32,
    steps: Annotated[int, typer.Option("--steps", help="Adam steps.")] = 1000,
    learning_rate: Annotated[float, typer.Option("--learning-rate", help="Adam's step size.")] = 1e-3,
    non_negative: Annotated[bool, typer.Option("--non-negative", help="Keep every head's weight at 0 or above.")] = False,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the documents and the ablations.")] = 0,
    held_out: Annotated[float, typer.Option("--held-out", help="Share of the documents kept out of learning, to report the objective on.")] = 0.25,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Weights file to write (default: the cache, where the at2 method finds it).")] = None,
    ship: Annotated[bool, typer.Option("--ship", help="Write into the package (heedful/attribution/at2_heads/MODEL.json) and print the pin to add.")] = False,
) -> None:
    """Generate training documents with MODEL, ablate their sources at random, and learn one
    weight per attention head so that AT2's scores predict the ablations' effects."""
    from rich.console import Console

    from heedful import datasets
    from heedful.attribution import at2
    from heedful.commands.console import check_writable, load_model, progress
    from heedful.errors import InputError
    from heedful.fingerprint import model_fingerprint

    sizes = [int(x) for x in lengths.split(",") if x.strip().isdigit()]
    if not sizes or len(sizes) != len([x for x in lengths.split(",") if x.strip()]):
        raise InputError(f"--lengths must be whole numbers of tokens, got {lengths!r}", hint="e.g. --lengths 256,512")
    for flag, value in (("--docs", docs), ("--new-tokens", new_tokens), ("--ablations", ablations), ("--steps", steps)):
        if value < 1 or (flag == "--ablations" and value < 3):
            raise InputError(f"{flag} must be at least {3 if flag == '--ablations' else 1}, got {value}", hint=f"drop {flag} for the default")
    if not 0 <= held_out < 1:
        raise InputError(f"--held-out must be a share in [0, 1), got {held_out}", hint="e.g. --held-out 0.25")
    if out is not None:
        check_writable(out, "the weights file")
    loaded = load_model(model)
    if not loaded.adapter.is_decoder:
        raise InputError(f"{model} is not a decoder; AT2 is learned on what a language model generates", hint="pass a causal LM, e.g. --model smollm2-135m")
    fingerprint = model_fingerprint(loaded.adapter).weights
    began = time.perf_counter()
    found = []
    sets = {size: datasets.load("planted", "train", n=docs, length=size, tokenizer=loaded.tokenizer, seed=seed) for size in sizes}
    with progress() as bar:
        task = bar.add_task(f"ablating {docs} generated documents", total=docs)
        for i in range(docs):
            example = sets[sizes[i % len(sizes)]][i]
            generated = loaded.generate(example.text, new_tokens)
            continuation = generated.batch.texts[0][len(example.text):]
            if not continuation.strip():
                bar.advance(task)
                continue
            spans = [tuple(s) for s in example.meta["sources"]]
            problem = loaded.prepare(example.text, target=continuation, sources=spans)
            found += at2.ablations(problem, n_ablations=ablations, seed=seed + i)
            bar.advance(task)
    held = int(round(held_out * len(found)))
    learned_on, kept_out = found[: len(found) - held], found[len(found) - held :]
    weights = at2.fit_heads(learned_on, steps=steps, learning_rate=learning_rate, non_negative=non_negative, seed=seed)
    uniform = at2.np.full(len(weights), 1.0 / len(weights))
    shape = (len(loaded.adapter.roles().blocks), -1)
    record = {
        "model": loaded.name, "documents": len(found), "lengths": sizes, "new_tokens": new_tokens, "ablations": ablations,
        "output": "logit_prob", "steps": steps, "learning_rate": learning_rate, "non_negative": non_negative, "seed": seed,
        "held_out": len(kept_out),
        "objective": at2.objective(weights, learned_on), "objective_uniform": at2.objective(uniform, learned_on),
        "objective_held_out": at2.objective(weights, kept_out) if kept_out else None,
        "objective_held_out_uniform": at2.objective(uniform, kept_out) if kept_out else None,
        "seconds": round(time.perf_counter() - began, 1), "data": "planted documents, train split, continued by the model (greedy)",
    }
    heads = at2.HeadWeights(weights.reshape(shape), fingerprint, record)
    path = at2.HEADS_DIR / f"{loaded.name}.json" if ship else out if out is not None else at2.cache_path(fingerprint)
    heads.save(path)
    console = Console()
    console.print(
        f"AT2 head weights for {loaded.name}: objective {record['objective']:.4f} (uniform heads {record['objective_uniform']:.4f}) "
        f"on {len(learned_on)} documents" + (f", {record['objective_held_out']:.4f} (uniform {record['objective_held_out_uniform']:.4f}) on {held} held out" if held else "")
        + f" -> {path}"
    )
    if ship:
        console.print(
            f'pin in heedful/attribution/at2.py SHIPPED: ShippedHeads(model="{loaded.name}", fingerprint="{fingerprint}", '
            f'file="{path.name}", sha256="{at2.file_sha256(path)}")'
        )
