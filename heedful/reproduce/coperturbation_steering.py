"""The co-perturbation report's steering section: the paper's Section 5.4.2 case study (Figure 9)
run with :func:`heedful.interest.steer` on the zoo's causal LM.

The paper estimates Llama3-8B-Instruct's interest over "The impact of climate change has become
more evident in recent years.", suppresses "in recent years" and shows that the continuation
then dwells less on time and more on the impact (greedy and beam search, ``max_length=150``,
``num_beams=3``). Here the same prompts (the wording of the paper's text and of its Figure 9a
caption) run on ``smollm2-135m``; besides the texts and the interest bars, each continuation is
measured by what the paper's claim is about:

- time expressions (:data:`TIME_WORDS`) -- the phrase's influence the suppression should reduce;
- impact words (:data:`IMPACT_WORDS`) -- the content the paper wanted more of;
- distinct word trigrams / all trigrams -- 1 for text that never repeats itself, near 0 for a
  loop (a small model's usual failure, which the counts alone would hide).

The claim counts as holding for a decoding mode when the steered continuation has fewer time
expressions than the original (none, when the original has none), more impact words, and a
distinct-trigram share of at least :data:`COHERENT` (the paper calls the steered text "more
coherent").
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from heedful.interest.steer import Steering
from heedful.reproduce.toolkit import exact_verdict

MODEL = "smollm2-135m"
CASES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("The impact of climate change has become more evident in recent years.", ("in recent years",)),
    ("The impact of climate change is becoming more evident in recent years.", ("in recent years",)),
)
"""The paper's prompt as its Section 5.4.2 text and its Figure 9a caption word it, each with the
phrase the paper suppresses."""
TIME_WORDS = re.compile(r"\b(?:years?|decades?|centur(?:y|ies)|since|recent(?:ly)?|today|now|\d{4}s?)\b", re.I)
IMPACT_WORDS = re.compile(r"\b(?:impacts?|effects?|consequences?|affect(?:s|ed|ing)?|damage[sd]?)\b", re.I)
COHERENT = 0.5
"""Distinct-trigram share below which a continuation counts as looping rather than coherent."""
QUICK = {"max_steps": 5, "samples": 2}
QUICK_TOKENS = 12


@dataclass
class TextMeasures:
    """What :func:`measure` reads off one continuation."""

    time_words: int
    impact_words: int
    distinct_trigrams: float
    words: int


def measure(text: str) -> TextMeasures:
    """Counts of :data:`TIME_WORDS` and :data:`IMPACT_WORDS` in ``text``, its word count and its
    share of distinct word trigrams (1.0 when it has fewer than three words)."""
    words = re.findall(r"\w+", text.lower())
    trigrams = list(zip(words, words[1:], words[2:], strict=False))
    distinct = len(set(trigrams)) / len(trigrams) if trigrams else 1.0
    return TextMeasures(len(TIME_WORDS.findall(text)), len(IMPACT_WORDS.findall(text)), distinct, len(words))


def holds(before: TextMeasures, after: TextMeasures) -> bool:
    """The paper's claim for one decoding mode (see the module docstring)."""
    less_time = after.time_words < before.time_words or before.time_words == after.time_words == 0
    return less_time and after.impact_words > before.impact_words and after.distinct_trigrams >= COHERENT


def suppressed_share(s: Steering) -> tuple[float, float]:
    """Sum of the suppressed tokens' normalised interest before and after suppression."""
    hit = np.asarray(s.suppressed, dtype=bool)
    return float(s.interest_before[hit].sum()), float(s.interest_after[hit].sum())


def plot_interest(s: Steering, out: Path) -> Path:
    """Interest bars over the prompt before and after suppression (the paper's Figure 9a)."""
    from heedful.render.figures import pyplot

    plt = pyplot()

    labels = [lab + (" (x)" if hit else "") for lab, hit in zip(s.labels, s.suppressed, strict=True)]
    x = np.arange(len(labels))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(labels) + 2), 3.6))
    ax.bar(x - 0.2, s.interest_before, width=0.4, color="white", edgecolor="black", label="original prompt")
    ax.bar(x + 0.2, s.interest_after, width=0.4, color="gold", edgecolor="black", label="words (x) suppressed")
    ax.set_xticks(x, labels, rotation=45, ha="right")
    ax.set_ylabel("interest (normalised 1/sigma)")
    ax.set_title(f"co-perturbation interest of {s.model} over the prompt")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=150)
    plt.close(fig)
    return out


def _quote(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|") or "(nothing)"


@dataclass
class SteeringSection:
    """The section's markdown ``lines``, its figures, and one claims-table row per decoding mode
    (``claims``: ``(claim, verdict, number)``)."""

    lines: list[str]
    figures: list[Path]
    claims: list[tuple[str, str, str]]
    seconds: float


def steering_section(
    out_dir: Path,
    *,
    quick: bool = False,
    seed: int = 0,
    options: dict | None = None,
    say: Callable[[str], None] = lambda _: None,
    load: Callable[[str], object] | None = None,
    heading: str = "## Steering generation by suppressing prompt words (paper Section 5.4.2, Figure 9)",
) -> SteeringSection:
    """Run every case of :data:`CASES` with :func:`~heedful.interest.steer` on :data:`MODEL`
    (co-perturbation at its defaults, or ``options``; ``quick``: a few steps and
    :data:`QUICK_TOKENS` new tokens), write one Figure 9a analogue per case into ``out_dir`` and
    return the section. ``load``: how to load the model (default :func:`heedful.load`)."""
    import time

    import heedful
    from heedful.interest import steer

    began = time.perf_counter()
    model = (load or heedful.load)(MODEL)
    options = dict(QUICK if quick else {}, **(options or {}))
    tokens = QUICK_TOKENS if quick else None
    lines = [
        heading,
        "",
        f"`heedful steer` on `{MODEL}` (the paper: Llama3-8B-Instruct, which no package here ships) for the paper's "
        "prompt in the two wordings the paper uses, suppressing the phrase the paper suppresses. Suppression scales "
        "the phrase's input word embeddings by 0 (positions kept); decoding as the paper's Figure 9b: "
        "`do_sample=False`, greedy and `num_beams=3`, up to 150 tokens with the prompt"
        + (f" (quick run: {QUICK_TOKENS} new tokens, co-perturbation {QUICK})" if quick else "")
        + ". Measures of each continuation: time expressions (`" + TIME_WORDS.pattern + "`), impact words (`"
        + IMPACT_WORDS.pattern + "`), and the share of distinct word trigrams (1 = never repeats itself). The "
        "paper's claim counts as holding for a decoding mode when the steered text has fewer time expressions "
        f"(none, when the original has none), more impact words and a distinct-trigram share of at least {COHERENT}.",
        "",
    ]
    figures: list[Path] = []
    claims: list[tuple[str, str, str]] = []
    for number, (prompt, words) in enumerate(CASES, start=1):
        say(f"steering case {number}: {prompt!r}")
        s = steer(model, prompt, list(words), max_new_tokens=tokens, seed=seed, **options)
        figure = plot_interest(s, Path(out_dir) / f"coperturbation-steering-{number}.png")
        figures.append(figure)
        before, after = suppressed_share(s)
        lines += [
            f"### Prompt {number}: “{prompt}”, suppressing " + ", ".join(f"“{w}”" for w in words),
            "",
            f"Interest of the suppressed tokens (share of the prompt's content tokens): {before:.3f} before, "
            f"{after:.3f} after suppression; the model's next token {s.next_before!r} → {s.next_after!r}. "
            f"Interest took {s.seconds['interest']:.0f} s ({', '.join(map(str, s.steps))} optimisation steps).",
            "",
            f"![interest before and after suppression]({figure.name})",
            "",
            "| decoding | prompt | continuation | time expr. | impact words | distinct trigrams | words | s |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for c in s.continuations:
            m_orig, m_steer = measure(c.original), measure(c.steered)
            for label, text, m in (("original", c.original, m_orig), ("suppressed", c.steered, m_steer)):
                lines.append(
                    f"| {c.mode} | {label} | {_quote(text)} | {m.time_words} | {m.impact_words} | "
                    f"{m.distinct_trigrams:.2f} | {m.words} | {c.seconds / 2:.1f} |"
                )
            verdict = str(exact_verdict(holds(m_orig, m_steer)))
            claims.append(
                (
                    f"Suppressing “{', '.join(words)}” steers the continuation away from time toward the impact "
                    f"(§5.4.2; prompt {number}, {c.mode})",
                    verdict,
                    f"time expr. {m_orig.time_words} → {m_steer.time_words}, impact words {m_orig.impact_words} → "
                    f"{m_steer.impact_words}, distinct trigrams {m_orig.distinct_trigrams:.2f} → {m_steer.distinct_trigrams:.2f}",
                )
            )
        lines.append("")
    lines += [
        "s: generation wall time per continuation (the two continuations of a mode are timed together). A one-prompt "
        "case study, as in the paper: it shows what the operation does on this model, not how often it helps.",
        "",
    ]
    return SteeringSection(lines, figures, claims, time.perf_counter() - began)
