"""``heedful steer``: change what a language model writes, by activation steering (a vector
added to one layer's residual stream: contrastive activation addition, a mean-difference vector,
or Subramani et al.'s extracted vector; or inference-time intervention, probe-chosen heads
shifted along their direction) or by input suppression (scaling chosen prompt words'
embeddings, the seed paper's Section 5.4.2), and the measured sentiment sweep (``--sweep``).
Registered in :mod:`heedful.cli`; heavy imports happen inside."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from heedful.commands.interest import OptionOpt, check_run, settings_options

VECTORS = ("caa", "mean", "extract", "iti")
POSITIVE_LABELS = {"1", "positive", "pos"}
NEGATIVE_LABELS = {"0", "negative", "neg"}


def steer(
    prompt: Annotated[str | None, typer.Option("--prompt", "-p", help="Prompt to continue (not with --sweep).")] = None,
    suppress: Annotated[
        list[str] | None, typer.Option("--suppress", "-s", help="Input suppression: word or phrase of the prompt to suppress; repeatable.")
    ] = None,
    vector: Annotated[str | None, typer.Option("--vector", help="Activation steering: caa (contrastive pair), mean (mean difference over --dataset's labels), extract (Subramani et al.: --sentence) or iti (inference-time intervention: --heads probe-chosen heads shifted by --coefficient standard deviations).")] = None,
    positive: Annotated[list[str] | None, typer.Option("--positive", help="caa: positive prompt; repeatable, paired with --negative.")] = None,
    negative: Annotated[list[str] | None, typer.Option("--negative", help="caa: negative prompt; repeatable.")] = None,
    positive_file: Annotated[str | None, typer.Option("--positive-file", help="mean, iti: positive texts, one per line (instead of --dataset).")] = None,
    negative_file: Annotated[str | None, typer.Option("--negative-file", help="mean, iti: negative texts, one per line.")] = None,
    layer: Annotated[int | None, typer.Option("--layer", help="Block whose output the vector is added to (0-based; default 6; iti chooses its heads).")] = None,
    coefficient: Annotated[float, typer.Option("--coefficient", "-c", help="Factor on the vector.")] = 4.0,
    dataset: Annotated[str, typer.Option("--dataset", "-d", help="mean, iti: labelled texts (movies, ... or a CSV / JSONL path); --sweep: the snippets to continue.")] = "movies",
    n: Annotated[int, typer.Option("--n", "-n", help="mean, iti: the first N texts of each sentiment; --sweep: N prompts.")] = 100,
    sentence: Annotated[str | None, typer.Option("--sentence", help="extract: the sentence the vector must make the model write.")] = None,
    steps: Annotated[int, typer.Option("--steps", help="extract: optimisation steps (Adam).")] = 300,
    lr: Annotated[float, typer.Option("--lr", help="extract: Adam's learning rate.")] = 0.1,
    heads: Annotated[int, typer.Option("--heads", help="iti: the K heads of best probe accuracy that are shifted.")] = 16,
    direction: Annotated[str, typer.Option("--direction", help="iti: mass_mean (the paper's) or probe (the probe's weights).")] = "mass_mean",
    sweep: Annotated[bool, typer.Option("--sweep", help="Measure success (judged by --judge) against perplexity over --coefficients on movie snippets.")] = False,
    coefficients: Annotated[str, typer.Option("--coefficients", help="--sweep: comma-separated coefficients.")] = "-8,-4,0,4,8",
    judge: Annotated[str, typer.Option("--judge", help="--sweep: sentiment classifier judging the continuations.")] = "minilm-sentiment",
    toward: Annotated[str, typer.Option("--toward", help="--sweep: the judge's label counted as success.")] = "POSITIVE",
    prompt_words: Annotated[int, typer.Option("--prompt-words", help="--sweep: words of each snippet kept as its prompt.")] = 6,
    out_json: Annotated[Path | None, typer.Option("--out", help="--sweep: also write the result as JSON.")] = None,
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
    """Steer generation: by a steering vector (--vector) or by suppressing prompt words (--suppress).

    Activation steering (--vector caa|mean|extract): builds the vector at --layer, generates from
    PROMPT greedily without and with --coefficient times the vector added to the block's output
    at every position, and prints both; --sweep measures it on movie snippets instead.

    Inference-time intervention (--vector iti): a probe per attention head on the labelled texts
    chooses the --heads best heads; each is shifted along its --direction by --coefficient
    standard deviations before the attention output projection, at every position.

    Input suppression (--suppress): estimates co-perturbation interest over PROMPT (explained output: the next-token logits),
    suppresses the --suppress words by scaling their tokens' input word embeddings by --weight
    (default 0: their content is erased, their positions kept; no attention masking, so the
    other tokens' positions are unchanged and --weight can weaken a word partially), then
    generates from the original and from the suppressed prompt by greedy decoding and by beam
    search (do_sample=False; the paper's num_beams=3 and max_length=150), re-estimates interest
    after suppression, and shows both side by side. The suppressed embeddings feed the prompt
    pass, whose cached keys and values every generated token attends to.
    """
    from heedful.errors import InputError

    if vector is not None or sweep:
        if suppress:
            raise InputError("--suppress (input suppression) and --vector (activation steering) are two modes", hint="give one of them")
        _activation_steering(
            model, prompt, vector or "caa", positive, negative, layer, coefficient, dataset, n, sentence, sweep,
            coefficients, judge, toward, prompt_words, out_json, max_new_tokens, seed, steps, lr,
            positive_file, negative_file, heads, direction,
        )
        return
    if not suppress or prompt is None:
        raise InputError("nothing to steer with", hint="--vector caa --positive ... --negative ..., or --suppress WORDS, with --prompt")
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


def _activation_steering(
    model, prompt, kind, positive, negative, layer, coefficient, dataset, n, sentence, sweep,
    coefficients, judge, toward, prompt_words, out_json, max_new_tokens, seed, steps, lr,
    positive_file=None, negative_file=None, heads=16, direction="mass_mean",
) -> None:
    import json

    from rich.table import Table

    from heedful.commands.console import check_writable, err, load_model, out
    from heedful.datasets import load as load_dataset
    from heedful.errors import InputError, did_you_mean
    from heedful.inside import steering

    if kind not in VECTORS:
        raise InputError(f"unknown steering vector {kind!r}", hint=did_you_mean(kind, VECTORS, "vector"))
    if kind == "iti" and layer is not None:
        raise InputError("inference-time intervention chooses its heads by their probes; it takes no --layer", hint="drop --layer, set --heads")
    if kind not in ("mean", "iti") and (positive_file is not None or negative_file is not None):
        raise InputError("--positive-file and --negative-file are the labelled sets of --vector mean or iti", hint="--positive / --negative for caa")
    if (positive_file is None) != (negative_file is None):
        raise InputError("give both --positive-file and --negative-file", hint="one text per line in each")
    if kind == "iti":
        from heedful.inside.iti import DIRECTIONS

        if direction not in DIRECTIONS:
            raise InputError(f"unknown --direction {direction!r}", hint=did_you_mean(direction, DIRECTIONS, "direction"))
        if heads < 1:
            raise InputError(f"--heads must be at least 1, got {heads}", hint="the paper shifts 48 of LLaMA-7B's 1024 heads")
    layer = 6 if layer is None else layer
    if kind == "caa" and (not positive or not negative):
        raise InputError("a contrastive vector needs --positive and --negative prompts", hint='e.g. --positive "I love this" --negative "I hate this"')
    if kind == "extract" and sentence is None:
        raise InputError("an extracted vector needs the --sentence it must make the model write", hint='e.g. --sentence "the taste is excellent!"')
    if sweep and kind == "extract":
        raise InputError("the sweep adds one vector to every prompt; an extracted vector belongs to its sentence", hint="--vector caa, mean or iti")
    if not sweep and kind != "extract" and prompt is None:
        raise InputError("what should the model continue?", hint='--prompt "The movie was"')
    chosen = _coefficients(coefficients) if sweep else []
    if n < 1 or prompt_words < 1 or steps < 1:
        raise InputError("--n, --prompt-words and --steps must be at least 1", hint="drop them for the defaults")
    if not lr > 0:
        raise InputError(f"--lr must be positive, got {lr}", hint="e.g. --lr 0.1")
    if out_json is not None:
        check_writable(out_json, "--out")
    new_tokens = max_new_tokens if max_new_tokens is not None else 20
    loaded = load_model(model)
    if kind == "caa":
        found = steering.contrastive(loaded, positive, negative, layer)
    elif kind in ("mean", "iti"):
        pos, neg = _labelled_sets(dataset, n, positive_file, negative_file)
        if kind == "mean":
            found = steering.mean_difference(loaded, pos, neg, layer)
        else:
            from heedful.inside.iti import iti

            found = iti(loaded, pos, neg, heads=heads, direction=direction, seed=seed)
            scores = found.head_accuracy
            err.print(f"iti: the {len(found.heads)} of {found.accuracy.numel()} heads whose probes score best on the held-out texts "
                      f"(validation accuracy {float(scores.min()):.2f} to {float(scores.max()):.2f})")
    else:
        extracted = steering.extract(loaded, sentence, layer, steps=steps, lr=lr, seed=seed)
        out.print(f"extracted at block {extracted.vector.layer} in {extracted.steps} steps (loss {extracted.loss:.4f} nats/token); "
                  f"reproduces the sentence: {'yes' if extracted.reproduced else 'no'}")
        table = Table(show_header=True)
        table.add_column("vector")
        table.add_column("greedy decoding from the first token")
        table.add_row("z(sentence)", extracted.decoded)
        table.add_row("none", steering.unsteered(loaded, sentence))
        out.print(table)
        return
    if sweep:
        from heedful.inside.sweep import sentiment_sweep, snippet_prompts

        data = load_dataset(dataset, "test")
        away = "0" if toward.upper().startswith("POS") else "1"  # steer snippets of the other sentiment
        prompts = snippet_prompts(data, prompt_words, label=away if any(e.label is not None for e in data) else None, n=n)
        result = sentiment_sweep(loaded, load_model(judge), prompts, found, chosen, toward=toward, max_new_tokens=new_tokens, seed=seed)
        table = Table(title=f"{kind} at {found.where}: {len(prompts)} prompts, judged {toward} by {judge}")
        for column in ("coefficient", "success", "95% interval", "perplexity (geo. mean)", "95% interval", "first continuation"):
            table.add_column(column)
        for row in result.rows:
            table.add_row(
                f"{row.coefficient:g}", f"{row.success:.2f}", f"[{row.success_low:.2f}, {row.success_high:.2f}]",
                f"{row.perplexity:.1f}", f"[{row.perplexity_low:.1f}, {row.perplexity_high:.1f}]", _one_line(row.examples[0]) if row.examples else "",
            )
        out.print(table)
        err.print(f"{result.seconds:.0f} s")
        if out_json is not None:
            out_json.write_text(json.dumps(result.to_dict(), indent=2), encoding="utf-8")
            err.print(f"wrote {out_json}")
        return
    plain = loaded.generate(prompt, new_tokens)
    steered = found.generate(loaded, prompt, coefficient, new_tokens)
    table = Table(title=f"{kind} at {found.where}, coefficient {coefficient:g} (greedy)")
    table.add_column("")
    table.add_column("generation")
    decode = loaded.tokenizer.decode
    table.add_row("without the vector", prompt + decode(plain.continuations[0], skip_special_tokens=True))
    table.add_row("with the vector", prompt + decode(steered.continuations[0], skip_special_tokens=True))
    out.print(table)


def _labelled_sets(dataset: str, n: int, positive_file: str | None, negative_file: str | None) -> tuple[list[str], list[str]]:
    """The positive and negative texts: the files' lines, or the first ``n`` texts of each
    sentiment of ``dataset``'s train split."""
    if positive_file is not None and negative_file is not None:
        from heedful.commands.console import read_text_file

        pos, neg = (
            [line.strip() for line in read_text_file(path, what).splitlines() if line.strip()]
            for path, what in ((positive_file, "--positive-file"), (negative_file, "--negative-file"))
        )
        return pos, neg
    from heedful.datasets import load as load_dataset

    texts = load_dataset(dataset, "train")
    pos = [e.text for e in texts if str(e.label).lower() in POSITIVE_LABELS][:n]
    neg = [e.text for e in texts if str(e.label).lower() in NEGATIVE_LABELS][:n]
    return pos, neg


def _one_line(text: str, width: int = 60) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def _coefficients(text: str) -> list[float]:
    from heedful.errors import InputError

    try:
        found = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise InputError(f"--coefficients takes comma-separated numbers, not {text!r}", hint="e.g. --coefficients -8,-4,0,4,8") from None
    if not found:
        raise InputError("--coefficients is empty", hint="e.g. --coefficients -8,-4,0,4,8")
    return found
