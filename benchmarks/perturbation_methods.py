"""Speed of heedful's perturbation family: batched co-perturbation, and LIME / KernelSHAP vs Captum.

On the first ``--n`` sentences of the movies test split and the zoo model ``minilm-sentiment``
this script

1. runs co-perturbation over all sentences as one batch and one sentence at a time, at equal
   steps and samples (no early stop, so both do exactly ``--steps`` steps per sentence), and
   gives the throughput ratio and the largest score difference between the two (batch
   invariance);
2. runs heedful's ``lime`` (configured as Captum can be: Bernoulli sampling, exponential cosine
   kernel on the interpretable sample, ridge with intercept) and ``kernel_shap`` against Captum's
   ``Lime`` / ``KernelShap`` at equal samples. Captum gets heedful's samples through its
   ``perturb_func`` (the generator it calls for each sample), so the two attributions must agree;
   the largest absolute difference is reported. Captum runs one example at a time (its
   recommended use) with ``perturbations_per_eval`` = 1 (its default) and = ``n_samples`` (every
   sample of an example in one forward: its fastest setting); removed tokens become ``[MASK]``
   on both sides; both explain the class probability of the predicted class.
3. times co-perturbation to a given objective value, cold start (theta = 0, the defaults) against
   the warm start (``init="linearized"``), one sentence at a time as ``heedful explain`` runs it,
   on "a charming and often affecting journey" and the first ``--warm-n`` sentences: the value
   is the cold start's final level (mean ``J`` over its last 10 steps), the time the moment a
   run's trailing 10-step mean of ``J`` reaches it (the warm start's closed form included), CPU
   and wall seconds, same seed and noise draws on both sides;
4. writes a markdown table with machine information to ``--out`` and prints it.

Timing: ``torch.set_num_threads`` fixed for both sides; each measurement has a short warm-up,
then ``--repeats`` timed runs (median reported), sides interleaved. heedful's time is the whole
``model.explain`` call; Captum's is its ``attribute`` calls with targets handed to it. On a
shared machine run with ``OMP_WAIT_POLICY=PASSIVE``: with spinning OpenMP threads and other
processes on the cores, small per-step workloads (one sentence at a time) slow down many times
over and the comparison measures the contention, not the code.

    python benchmarks/perturbation_methods.py [--model minilm-sentiment] [--n 32] [--steps 20]
        [--samples 4] [--surrogate-samples 200] [--surrogate-n N] [--repeats 1] [--threads 2]
        [--warm-n 8] [--parts coperturbation,surrogates,warmstart]
        [--out benchmarks/results/perturbation_methods.md] [--tiny]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _shared import finish, fmt_s, library_versions, machine_lines, measure, start  # noqa: E402  (benchmarks/ is the script's folder)
from captum._utils.models.linear_model import SkLearnRidge
from captum.attr import KernelShap, Lime

import heedful
from heedful.attribution import surrogate
from heedful.attribution._masks import features_of
from heedful.engine.seeding import example_generators

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

COPERTURBATION_TARGET = 5.0  # batched >= 5x the throughput of one sentence at a time
CAPTUM_TARGET = 2.0  # heedful LIME / KernelSHAP >= 2x faster than Captum at equal samples
KERNEL_WIDTH = 0.25
RIDGE_ALPHA = 1.0


# ---------------------------------------------------------------------------------- part 1
def coperturbation_part(
    model: heedful.Model, texts: list[str], args: argparse.Namespace
) -> dict[str, Any]:
    opts = {"max_steps": args.steps, "samples": args.samples, "tol": 0.0, "seed": 0}
    warm = {"max_steps": 1, "samples": args.samples, "tol": 0.0, "seed": 0}

    def batched() -> list[heedful.Explanation]:
        return model.explain(texts, "coperturbation", batch_size=len(texts), **opts)

    def one_at_a_time() -> list[heedful.Explanation]:
        return [model.explain(t, "coperturbation", **opts) for t in texts]

    timed = measure(
        {"batched": batched, "one_at_a_time": one_at_a_time},
        args.repeats,
        warmups={"warm": lambda: model.explain(texts[:2], "coperturbation", batch_size=2, **warm)},
    )
    diffs = [
        float(np.abs(a.scores - b.scores).max())
        for a, b in zip(timed["batched"].result, timed["one_at_a_time"].result, strict=True)
    ]
    return {
        "batched": timed["batched"].median,
        "sequential": timed["one_at_a_time"].median,
        "ratio": timed["one_at_a_time"].median / timed["batched"].median,
        "batched_cpu": timed["batched"].cpu_median,
        "sequential_cpu": timed["one_at_a_time"].cpu_median,
        "cpu_ratio": timed["one_at_a_time"].cpu_median / timed["batched"].cpu_median,
        "scaling": position_cost(model, texts, args.samples),
        "max_diff": max(diffs),
        "max_score": max(float(np.abs(e.scores).max()) for e in timed["batched"].result),
    }


def position_cost(model: heedful.Model, texts: list[str], samples: int, repeats: int = 3) -> list[tuple[int, float]]:
    """CPU microseconds per noised token position of one co-perturbation step's work (noised
    forward + backward to the noise), for one sentence run as 1, 4, 16 and 32 problems at once:
    ``(positions per call, us per position)``, best of ``repeats``. If this is flat, batching
    can only save per-call overhead."""
    from heedful.attribution.noise import HEAD, NoiseProbe

    problem = model.prepare([max(texts, key=len)], hidden_states=True)
    probe = NoiseProbe.build(problem, (HEAD,))
    n = int(problem.batch.lengths[0])
    rows_out = []
    for problems in (1, 4, 16, 32):
        rows = problems * samples
        example, key = torch.zeros(rows, dtype=torch.long), torch.full((rows,), HEAD)
        z = torch.randn(rows, n, probe.dim, generator=torch.Generator().manual_seed(0))
        best = float("inf")
        for _ in range(repeats):
            theta = torch.zeros(rows, n, 1, requires_grad=True)
            began = time.process_time()
            with torch.enable_grad():
                dist = probe.distortion(example, key, 0.1 * torch.sigmoid(theta) * z)
                torch.autograd.grad(dist.sum(), theta)
            best = min(best, time.process_time() - began)
        rows_out.append((rows * n, best / (rows * n) * 1e6))
    return rows_out


# ---------------------------------------------------------------------------------- part 3
ACCEPTANCE_SENTENCE = "a charming and often affecting journey"


def warmstart_part(model: heedful.Model, texts: list[str], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Per sentence (one at a time, default options, seed 0): the cold start's final objective
    level and the CPU / wall seconds and steps each start needs to reach it. Each side runs
    ``--repeats`` times, the two sides interleaved and their order alternated; a fit with one
    seed is deterministic, so the steps are the same every time and the times are medians."""
    from heedful.attribution import coperturbation as cp
    from heedful.reproduce.coperturbation_stability import final_level, steps_to_level

    sides = {"cold": "zeros", "warm": "linearized"}
    rows = []
    for text in [ACCEPTANCE_SENTENCE, *texts[: args.warm_n]]:
        problem = model.prepare([text], hidden_states=True)
        found: dict[str, Any] = {"text": text, "tokens": int(problem.batch.lengths[0])}
        runs: dict[str, list] = {side: [] for side in sides}
        for repeat in range(max(1, args.repeats)):
            for side in (list(sides) if repeat % 2 == 0 else list(reversed(sides))):
                runs[side].append(cp.estimate_interest(problem, settings=cp.Settings(init=sides[side]), seed=0)[0])
        fits = {side: fitted[0] for side, fitted in runs.items()}
        level = final_level(fits["cold"].history[:, 0].numpy())
        found["level"] = level
        for side, fit in fits.items():
            steps = steps_to_level(fit.history[:, 0].numpy(), level)
            at = int(steps) - 1 if np.isfinite(steps) else None
            found[side] = {
                "steps": steps,
                "cpu": _median_at(runs[side], "elapsed_cpu", at),
                "wall": _median_at(runs[side], "elapsed", at),
                "run_cpu": _median_at(runs[side], "elapsed_cpu", -1),
                "run_steps": int(fit.steps[0]),
                "init_cpu": fit.init_cpu,
                "start": float(fit.history[0, 0]),
            }
        rows.append(found)
    return rows


def _median_at(fits: list, times: str, at: int | None) -> float:
    """Median over ``fits`` of their ``times`` (``elapsed`` or ``elapsed_cpu``) at step index
    ``at`` (NaN for ``None``: the level was never reached)."""
    return float(np.median([float(getattr(f, times)[at]) for f in fits])) if at is not None else float("nan")


def warmstart_lines(rows: list[dict[str, Any]], repeats: int) -> tuple[list[str], list[str]]:
    lines = [
        f"## Co-perturbation to a given objective value: cold vs warm start ({len(rows)} sentences)",
        "",
        "Defaults (100 steps at most, 8 samples, seed 0), one sentence at a time. Value: the cold start's final "
        "level (mean J over its last 10 steps); a run is there when its trailing 10-step mean of J is. "
        f"Times from the start of the fit, the warm start's closed form included: medians of {repeats} run(s) per side, "
        "the sides interleaved.",
        "",
        "| sentence | tokens | J at step 1 cold / warm | steps cold / warm | CPU s cold / warm | wall s cold / warm | whole run CPU s cold / warm |",
        "|---|---:|---|---|---|---|---|",
    ]
    for r in rows:
        c, w = r["cold"], r["warm"]
        lines.append(
            f"| {r['text'][:40]} | {r['tokens']} | {c['start']:.4f} / {w['start']:.4f} | {c['steps']:.0f} / {w['steps']:.0f} | "
            f"{c['cpu']:.2f} / {w['cpu']:.2f} | {c['wall']:.2f} / {w['wall']:.2f} | {c['run_cpu']:.2f} / {w['run_cpu']:.2f} |"
        )
    finite = [r for r in rows if np.isfinite(r["warm"]["cpu"])]
    cold_cpu = sum(r["cold"]["cpu"] for r in finite)
    warm_cpu = sum(r["warm"]["cpu"] for r in finite)
    faster = sum(r["warm"]["cpu"] < r["cold"]["cpu"] for r in finite)
    lines += [
        "",
        f"The warm start reached the level on {len(finite)} of {len(rows)} sentences; there it took "
        f"{warm_cpu:.2f} CPU s against the cold start's {cold_cpu:.2f} ({cold_cpu / max(warm_cpu, 1e-9):.2f}x), "
        f"and was faster on {faster} of them.",
        "",
    ]
    first = rows[0]
    verdict = [
        f"- warm start faster than the cold start to the same objective value on \"{first['text']}\": "
        f"**{'holds' if first['warm']['cpu'] < first['cold']['cpu'] else 'missed'}** "
        f"({first['warm']['cpu']:.2f} vs {first['cold']['cpu']:.2f} CPU s)"
    ]
    return lines, verdict


# ---------------------------------------------------------------------------------- part 2
class CaptumSurrogates:
    """Captum's Lime / KernelShap on each example's content tokens, fed heedful's samples."""

    def __init__(self, model: heedful.Model, texts: list[str], n_samples: int) -> None:
        self.adapter = model.adapter
        problem = model.prepare(texts)
        self.batch, self.target = problem.batch, problem.target
        self.features = features_of(self.batch, self.target)
        self.n_samples = n_samples
        self.mask_id = self.adapter.removal_token_id
        gens = example_generators(self.batch, 0)
        self.lime_keep = surrogate.lime_samples(self.features, n_samples, "bernoulli", gens)
        self.shap_keep = surrogate.shap_samples(
            self.features, n_samples, example_generators(self.batch, 0)
        )

    def _example(self, b: int):
        batch, target = self.batch, self.target
        m = int(self.features.counts[b])
        positions = self.features.positions[b, :m]
        n = int(batch.lengths[b])
        base = batch.input_ids[b : b + 1, :n]
        mask = batch.attention_mask[b : b + 1, :n]
        types = None if batch.token_type_ids is None else batch.token_type_ids[b : b + 1, :n]
        hf = self.adapter.hf_model
        label = int(target.classes[b, 0])

        def forward(content_ids: torch.Tensor) -> torch.Tensor:
            rows = content_ids.shape[0]
            ids = base.repeat(rows, 1)
            ids[:, positions] = content_ids
            kwargs = {"input_ids": ids, "attention_mask": mask.repeat(rows, 1)}
            if types is not None:
                kwargs["token_type_ids"] = types.repeat(rows, 1)
            logits = hf(**kwargs).logits
            return torch.softmax(logits.float(), dim=-1)[:, label]

        return m, positions, forward, base[:, positions]

    @staticmethod
    def _replay(samples: torch.Tensor):
        def perturb(original_inp, **kwargs):
            for row in samples:
                yield row[None].long()

        return perturb

    @torch.no_grad()
    def lime(self, per_eval: int) -> torch.Tensor:
        out = torch.zeros(self.batch.input_ids.shape)
        for b in range(len(self.batch)):
            m, positions, forward, inputs = self._example(b)

            def similarity(original, perturbed, interpretable, m=m, **kwargs):
                d = 1.0 - (float(interpretable.sum()) / m) ** 0.5
                return float(np.exp(-(d**2) / (2 * KERNEL_WIDTH**2)))

            lime = Lime(
                forward,
                interpretable_model=SkLearnRidge(alpha=RIDGE_ALPHA),
                similarity_func=similarity,
                perturb_func=self._replay(self.lime_keep[b, :, :m]),
            )
            attr = lime.attribute(
                inputs,
                baselines=self.mask_id,
                feature_mask=torch.arange(m)[None],
                n_samples=self.n_samples,
                perturbations_per_eval=per_eval,
            )
            out[b, positions] = attr[0].float()
        return out

    @torch.no_grad()
    def kernel_shap(self, per_eval: int) -> torch.Tensor:
        out = torch.zeros(self.batch.input_ids.shape)
        for b in range(len(self.batch)):
            m, positions, forward, inputs = self._example(b)
            ks = KernelShap(forward)
            ks.perturb_func = self._replay(self.shap_keep[b, :, :m])
            attr = ks.attribute(
                inputs,
                baselines=self.mask_id,
                feature_mask=torch.arange(m)[None],
                n_samples=self.n_samples,
                perturbations_per_eval=per_eval,
            )
            out[b, positions] = attr[0].float()
        return out


def surrogate_part(
    model: heedful.Model, texts: list[str], args: argparse.Namespace
) -> list[dict[str, Any]]:
    k = args.surrogate_samples
    captum = CaptumSurrogates(model, texts, k)
    ours_opts = {
        "lime": {
            "n_samples": k,
            "sampling": "bernoulli",
            "kernel_width": KERNEL_WIDTH,
            "alpha": RIDGE_ALPHA,
            "seed": 0,
        },
        "kernel_shap": {"n_samples": k, "seed": 0},
    }
    rows = []
    for name in ("lime", "kernel_shap"):

        def ours(name: str = name) -> torch.Tensor:
            found = model.explain(texts, name, batch_size=len(texts), **ours_opts[name])
            out = torch.zeros(captum.batch.input_ids.shape)
            for b, e in enumerate(found):
                out[b, : len(e.scores)] = torch.as_tensor(e.scores)
            return out

        theirs = getattr(captum, name)
        timed = measure(
            {
                "heedful": ours,
                "captum_1": lambda fn=theirs: fn(1),
                "captum_all": lambda fn=theirs, k=k: fn(k),
            },
            args.repeats,
            warmups={
                "warm": lambda name=name: model.explain(
                    texts[:2], name, batch_size=2, **{**ours_opts[name], "n_samples": 8}
                )
            },
        )
        diff = max(
            float((timed["heedful"].result - timed[c].result).abs().max())
            for c in ("captum_1", "captum_all")
        )
        rows.append(
            {
                "method": name,
                "heedful": timed["heedful"].median,
                "captum_1": timed["captum_1"].median,
                "captum_all": timed["captum_all"].median,
                "max_diff": diff,
                "max_score": float(timed["heedful"].result.abs().max()),
            }
        )
    return rows


# ---------------------------------------------------------------------------------- report
def machine_info(
    model: heedful.Model, args: argparse.Namespace, texts: list[str], loads: tuple[float, float]
) -> list[str]:
    versions = library_versions("torch", "transformers", "captum", "heedful")
    return machine_lines(model, args, texts, loads, versions)


def render(
    cop: dict[str, Any] | None,
    surr: list[dict[str, Any]],
    info: list[str],
    args: argparse.Namespace,
    warm: list[dict[str, Any]] | None = None,
) -> str:
    lines = ["# heedful perturbation methods: speed", ""]
    verdicts = []
    if cop is not None:
        n = args.n
        first_cost, best_cost = cop["scaling"][0][1], min(c for _, c in cop["scaling"])
        lines += [
            f"## Co-perturbation: {n} sentences batched vs one at a time",
            "",
            f"{args.steps} steps x {args.samples} noise samples per sentence on both sides (tol=0: no early stop).",
            "",
            "| | wall time | sentences / s (wall) | CPU time | sentences / CPU s |",
            "|---|---:|---:|---:|---:|",
            f"| batched (one `explain` of {n}) | {fmt_s(cop['batched'])} | {n / cop['batched']:.2f} | "
            f"{fmt_s(cop['batched_cpu'])} | {n / cop['batched_cpu']:.2f} |",
            f"| one sentence at a time | {fmt_s(cop['sequential'])} | {n / cop['sequential']:.2f} | "
            f"{fmt_s(cop['sequential_cpu'])} | {n / cop['sequential_cpu']:.2f} |",
            "",
            f"Throughput ratio **{cop['ratio']:.2f}x** (wall), **{cop['cpu_ratio']:.2f}x** (CPU time); "
            f"largest score difference between the two {cop['max_diff']:.1e} (largest score "
            f"{cop['max_score']:.3g}).",
            "",
            "CPU cost of one step's noised forward + backward per noised token position, one "
            f"sentence ({cop['scaling'][0][0] // args.samples} tokens) as 1, 4, 16 and 32 problems in one call:",
            "",
            "| positions per call | " + " | ".join(str(p) for p, _ in cop["scaling"]) + " |",
            "|---|" + "---:|" * len(cop["scaling"]),
            "| us per position | " + " | ".join(f"{c:.0f}" for _, c in cop["scaling"]) + " |",
            "",
            "What batching can save: at equal steps and samples it cannot make the arithmetic "
            "cheaper; it removes per-call overhead and runs matrix products on more rows at once. "
            f"Measured above, one step's cost per noised position goes from {first_cost:.0f} us "
            f"({cop['scaling'][0][0]} positions per call) to {best_cost:.0f} us at best, so batching "
            f"can save at most about {first_cost / best_cost:.2f}x here: "
            + (
                "one sentence's noised copies already make a call large enough to keep the CPU busy. "
                if first_cost / best_cost < 1.5
                else "small calls leave the CPU underused, and batching pays. "
            )
            + "What cuts the work is already in the method and is switched off here to compare "
            "equal work: each sentence stops on its own when its objective is flat, and the batch "
            "shrinks.",
            "",
        ]
        ok = cop["ratio"] >= COPERTURBATION_TARGET
        verdicts.append(
            f"- co-perturbation batched >= {COPERTURBATION_TARGET:g}x one at a time: **{'holds' if ok else 'missed'}** ({cop['ratio']:.2f}x)"
        )
    if surr:
        lines += [
            f"## LIME and KernelSHAP vs Captum ({args.surrogate_n or args.n} sentences, {args.surrogate_samples} samples per sentence)",
            "",
            "| method | heedful | Captum, perturbations_per_eval=1 | ratio | Captum, perturbations_per_eval=n_samples | ratio | max abs diff | max abs score |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in surr:
            r1, r2 = r["captum_1"] / r["heedful"], r["captum_all"] / r["heedful"]
            lines.append(
                f"| {r['method']} | {fmt_s(r['heedful'])} | {fmt_s(r['captum_1'])} | {r1:.2f}x | "
                f"{fmt_s(r['captum_all'])} | {r2:.2f}x | {r['max_diff']:.1e} | {r['max_score']:.3g} |"
            )
            verdicts.append(
                f"- {r['method']} >= {CAPTUM_TARGET:g}x Captum at equal samples: default "
                f"**{'holds' if r1 >= CAPTUM_TARGET else 'missed'}** ({r1:.2f}x); against Captum's fastest "
                f"setting **{'holds' if r2 >= CAPTUM_TARGET else 'missed'}** ({r2:.2f}x)"
            )
        lines += [
            "",
            "Captum receives heedful's samples (same keep-masks, same order), so the attributions "
            "must agree up to float32 rounding (the differences above). heedful runs every "
            "distinct perturbed input of every sentence once, in length-sorted batches; Captum "
            "runs every sample of one sentence at a time.",
            "",
        ]
    if warm:
        more, verdict = warmstart_lines(warm, max(1, args.repeats))
        lines += more
        verdicts += verdict
    lines += ["## Targets", "", *verdicts, "", "## Machine", "", *info, ""]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="minilm-sentiment", help="zoo name or model directory")
    parser.add_argument("--n", type=int, default=32, help="number of held-out sentences")
    parser.add_argument("--steps", type=int, default=20, help="co-perturbation steps (both sides)")
    parser.add_argument(
        "--samples", type=int, default=4, help="co-perturbation noise samples per step (the method's default)"
    )
    parser.add_argument(
        "--surrogate-samples", type=int, default=200, help="LIME / KernelSHAP samples per sentence"
    )
    parser.add_argument(
        "--surrogate-n", type=int, default=None, help="sentences for the LIME / KernelSHAP part (default: --n)"
    )
    parser.add_argument(
        "--repeats", type=int, default=1, help="timed runs per measurement (median)"
    )
    parser.add_argument("--threads", type=int, default=2, help="torch threads, both sides")
    parser.add_argument("--warm-n", type=int, default=8, help="sentences of the cold vs warm start part (besides the acceptance sentence)")
    parser.add_argument(
        "--parts",
        default="coperturbation,surrogates",
        help="comma-separated: coperturbation, surrogates, warmstart",
    )
    parser.add_argument("--out", type=Path, default=HERE / "results" / "perturbation_methods.md")
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="a tiny random BERT and corpus instead (script debugging)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console, model, texts, load_before = start(args)
    parts = {p.strip() for p in args.parts.split(",")}
    cop = None
    if "coperturbation" in parts:
        console.print("[dim]timing co-perturbation ...[/dim]")
        cop = coperturbation_part(model, texts, args)
        console.print(
            f"  batched {fmt_s(cop['batched'])}, one at a time {fmt_s(cop['sequential'])}: {cop['ratio']:.2f}x"
        )
    surr: list[dict[str, Any]] = []
    if "surrogates" in parts:
        console.print("[dim]timing LIME / KernelSHAP against Captum ...[/dim]")
        surr = surrogate_part(model, texts[: args.surrogate_n or len(texts)], args)
        for r in surr:
            console.print(
                f"  {r['method']}: heedful {fmt_s(r['heedful'])}, Captum {fmt_s(r['captum_1'])} / {fmt_s(r['captum_all'])}"
            )
    warm = None
    if "warmstart" in parts:
        console.print("[dim]timing co-perturbation to a given objective value, cold vs warm start ...[/dim]")
        warm = warmstart_part(model, texts, args)
        for r in warm:
            console.print(f"  {r['text'][:40]}: CPU s cold {r['cold']['cpu']:.2f}, warm {r['warm']['cpu']:.2f}")
    text = render(cop, surr, machine_info(model, args, texts, (load_before, os.getloadavg()[0])), args, warm)
    return finish(text, args, console)


if __name__ == "__main__":
    raise SystemExit(main())
