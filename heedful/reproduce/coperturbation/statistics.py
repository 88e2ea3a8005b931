"""Co-perturbation report, statistics: bench rows as intervals, the paired comparisons of methods
and of rectification against random scores, the uniformity of each method's scores."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from heedful.reproduce.toolkit import (
    Verdict,
    bench_difference,
    difference_verdict,
    interval_verdict,
    mean_interval,
)


def _bench_ids(model, bench) -> tuple[list[str], list[str]]:
    from heedful.evaluate.bench import select_inputs

    inputs, _ = select_inputs(model, bench.spec, {})
    return [i.id for i in inputs], [i.text for i in inputs]


def _uniformity(bench, store: Path, model) -> dict[str, tuple]:
    """Per method: mean (and interval) over sentences of the normalised entropy of ``|scores|``
    over content tokens (1: every token the same magnitude), from the stored explanations."""
    from heedful.evaluate.store import ResultsStore
    ids, _ = _bench_ids(model, bench)
    found = {}
    with ResultsStore(store) as db:
        for run_ in bench.runs:
            if run_.group in found:
                continue
            stored = db.get_explanations(run_.key, ids)
            values = []
            for e in stored.values():
                keep = ~np.asarray(e.special)
                mag = np.abs(np.asarray(e.scores)[keep])
                if mag.size > 1 and mag.sum() > 0:
                    p = mag / mag.sum()
                    values.append(float(-(p * np.log(np.clip(p, 1e-300, None))).sum() / np.log(mag.size)))
            found[run_.group] = mean_interval(values)
    return found


def _summary_row(res, metric: str) -> tuple[float, float, float]:
    s = res.summaries[metric]
    return s.value, s.low, s.high


def _fixed(result, method: str, r: int) -> np.ndarray:
    """``[n_errors]``: 1 where suppressing ``method``'s top tokens at ratio index ``r`` gives the gold label."""
    return (result.methods[method].predictions[:, r] == result.gold).astype(float)


def _ahead(bench, a: str, b: str, metric: str) -> tuple[Verdict, tuple[float, float, float]]:
    """"``a`` is ahead of ``b``" on a bench metric: from the paired interval of the difference where the
    store holds both rows' per-example values, else from the two marginal intervals."""
    from heedful.evaluate.metrics import METRICS

    higher = METRICS[metric].higher_is_better
    d = bench_difference(bench, a, b, metric)
    if np.isfinite(d[1]):
        return difference_verdict(d, higher), d
    return interval_verdict(_summary_row(bench.groups[a], metric), _summary_row(bench.groups[b], metric), higher), d


def _fixed_interval(result, method: str, r: int) -> tuple[float, float, float, int]:
    """Share of the errors fixed at ratio index ``r`` with its bootstrap interval over errors."""
    return mean_interval(_fixed(result, method, r).tolist())
