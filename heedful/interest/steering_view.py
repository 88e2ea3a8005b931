"""Steered generation side by side: the two continuations per decoding mode, and interest bars
over the prompt's tokens before and after suppression (terminal and self-contained HTML)."""

from __future__ import annotations

import html

import numpy as np
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from heedful.interest.steer import Steering
from heedful.render.colors import NEGATIVE, POSITIVE
from heedful.render.html import PAGE_CSS

BEFORE, AFTER = NEGATIVE, POSITIVE
EIGHTHS = " ▏▎▍▌▋▊▉"
BAR_WIDTH = 24


def _limit(s: Steering) -> float:
    content = ~np.asarray(s.special, dtype=bool)
    values = np.concatenate([s.interest_before[content], s.interest_after[content]])
    values = values[np.isfinite(values)]
    return float(values.max()) if values.size and values.max() > 0 else 1.0


def _suppressed_label(s: Steering) -> str:
    words = ", ".join(f"“{w}”" for w in s.words)
    return f"{words} suppressed (embeddings x {s.weight:g})"


def _mode_label(mode: str, settings: dict) -> str:
    shown = ", ".join(f"{k}={v}" for k, v in settings.items())
    return f"{mode} ({shown})"


def bar(value: float, limit: float, width: int = BAR_WIDTH) -> str:
    """A horizontal bar of ``value / limit`` x ``width`` cells, in eighths of a cell."""
    eighths = int(round(max(0.0, min(1.0, value / limit)) * width * 8)) if np.isfinite(value) else 0
    full, part = divmod(eighths, 8)
    return ("█" * full + (EIGHTHS[part] if part else "")).ljust(width)


# ---------------------------------------------------------------------------------- terminal
def steering_renderable(s: Steering) -> RenderableType:
    """Header, the continuations side by side (one row per decoding mode), and interest bars."""
    head = Text()
    head.append("steer", style="bold")
    head.append(f"  ·  {s.model}  ·  {_suppressed_label(s)}", style="dim")
    head.append(f"  ·  next token {s.next_before!r} → {s.next_after!r}", style="dim")

    gens = Table(show_header=True, header_style="bold", show_lines=True, expand=True)
    gens.add_column("decoding", style="bold", ratio=1)
    gens.add_column("original prompt", ratio=3)
    gens.add_column(_suppressed_label(s), ratio=3)
    for c in s.continuations:
        gens.add_row(
            _mode_label(c.mode, c.settings) + f"\n[dim]{c.seconds:.1f} s[/]",
            Text(s.prompt, style="dim") + Text(c.original),
            Text(s.prompt, style="dim") + Text(c.steered),
        )

    limit = _limit(s)
    bars = Table(
        title="co-perturbation interest over the prompt (normalised 1/sigma)",
        show_header=True,
        header_style="bold",
        box=None,
    )
    bars.add_column("token", no_wrap=True)
    bars.add_column("before", no_wrap=True)
    bars.add_column("after", no_wrap=True)
    for tok, before, after, hit, special in zip(
        s.labels, s.interest_before, s.interest_after, s.suppressed, s.special, strict=True
    ):
        label = Text(tok, style="bold strike" if hit else ("dim" if special else ""))
        if hit:
            label.append(" ✕", style="bold red")
        bars.add_row(
            label,
            Text(bar(before, limit), style="rgb({},{},{})".format(*BEFORE)) + Text(f" {before:.3f}", style="dim"),
            Text(bar(after, limit), style="rgb({},{},{})".format(*AFTER)) + Text(f" {after:.3f}", style="dim"),
        )
    took = ", ".join(f"{k} {v:.1f} s" for k, v in s.seconds.items())
    steps = f"optimisation steps: {s.steps[0]} before, {s.steps[1]} after · {took}"
    return Group(head, gens, bars, Text("✕ suppressed token · " + steps, style="dim"))


# ---------------------------------------------------------------------------------- HTML
STEER_CSS = """
.hf-bars td { padding: 0.1rem 0.5rem; font-size: 0.85rem; white-space: nowrap; }
.hf-bar { display: inline-block; height: 0.8rem; vertical-align: middle; border-radius: 0.15rem; }
.hf-num { color: #777; font-size: 0.75rem; margin-left: 0.3rem; }
.hf-hit { text-decoration: line-through; font-weight: bold; }
table.hf-cmp { border-collapse: collapse; width: 100%; }
table.hf-cmp th { text-align: left; padding: 0.4rem 0.8rem; border-bottom: 1px solid #ccc; }
table.hf-cmp td { border-bottom: 1px solid #eee; width: 45%; }
table.hf-cmp td.hf-mode { width: 10%; font-size: 0.8rem; color: #555; }
.hf-prompt { color: #888; }
"""


def _bar_html(value: float, limit: float, rgb: tuple[int, int, int]) -> str:
    share = max(0.0, min(1.0, value / limit)) if np.isfinite(value) else 0.0
    return (
        f'<span class="hf-bar" style="width:{12 * share:.2f}rem;background:rgb({rgb[0]},{rgb[1]},{rgb[2]})"></span>'
        f'<span class="hf-num">{value:.3f}</span>'
    )


def steering_page(s: Steering, title: str = "heedful steer") -> str:
    """A complete, self-contained HTML page (inline CSS, no scripts or fetches)."""
    esc = html.escape
    prompt = f'<span class="hf-prompt">{esc(s.prompt)}</span>'
    rows = "".join(
        f'<tr><td class="hf-mode"><b>{esc(c.mode)}</b><br>{esc(", ".join(f"{k}={v}" for k, v in c.settings.items()))}'
        f"<br>{c.seconds:.1f} s</td><td>{prompt}{esc(c.original)}</td><td>{prompt}{esc(c.steered)}</td></tr>"
        for c in s.continuations
    )
    gens = (
        '<table class="hf-cmp"><tr><th>decoding</th><th>original prompt</th>'
        f"<th>{esc(_suppressed_label(s))}</th></tr>{rows}</table>"
    )
    limit = _limit(s)
    bar_rows = "".join(
        f'<tr><td class="{"hf-hit" if hit else ""}">{esc(tok)}{" ✕" if hit else ""}</td>'
        f"<td>{_bar_html(b, limit, BEFORE)}</td><td>{_bar_html(a, limit, AFTER)}</td></tr>"
        for tok, b, a, hit in zip(s.labels, s.interest_before, s.interest_after, s.suppressed, strict=True)
    )
    bars = (
        '<table class="hf-bars"><tr><th>token</th><th>before</th><th>after</th></tr>' f"{bar_rows}</table>"
    )
    head = (
        f'<div class="hf-head"><b>steer</b> · {esc(s.model)} · {esc(_suppressed_label(s))} · next token '
        f"{esc(repr(s.next_before))} → {esc(repr(s.next_after))}</div>"
    )
    took = ", ".join(f"{k} {v:.1f} s" for k, v in s.seconds.items())
    legend = (
        '<div class="hf-legend">Interest: co-perturbation estimate over the prompt (normalised 1/sigma; '
        f"content tokens sum to 1), before and after suppression; ✕ marks suppressed tokens. "
        f"Optimisation steps: {s.steps[0]} before, {s.steps[1]} after · {esc(took)}.</div>"
    )
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{esc(title)}</title><style>{PAGE_CSS}{STEER_CSS}</style></head><body>"
        f"<h2>{esc(title)}</h2>{head}<div class='hf-expl'>{gens}</div>"
        f"<h3>Interest over the prompt</h3><div class='hf-expl'>{bars}</div>{legend}</body></html>"
    )
