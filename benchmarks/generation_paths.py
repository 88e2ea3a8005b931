"""heedful's two paths of generation attribution, back to back in one process on one machine
load: the per-step rows (every step its own forward and backward over its prefix,
:func:`heedful.generation.prepare_steps`) and the shared-prefix path (one forward per sequence,
per path point for integrated gradients, run in position segments and swept back once, each
step's backward through its own prefix, :mod:`heedful.generation_shared`) -- and, with
``--whole``, the shared path as one pass over the whole sequences with a backward through all of
it per step (vmapped over the steps; with ``--per-step-backward`` also a plain backward per
step), and with ``--segment N`` the swept path in segments of ``N`` positions
(:attr:`heedful.generation_shared.SharedSteps.segment`). Saliency, gradient x input and integrated
gradients by default; ``--methods smoothgrad attnlrp`` times the noised and the relevance paths
(``--samples``: SmoothGrad's noised samples); ``--methods raw_attention rollout`` times a
forward-only method's shared pass with the head at every step's anchor (a generation given
without its tokens' log-probabilities) against the pass without a head (the generation as
``generate`` returned it, :attr:`heedful.Generation.log_probs`). Their ratio holds on a loaded machine, where absolute times
do not; scores are checked equal.

    python benchmarks/generation_paths.py [--model smollm2-135m] [--n 16] [--steps 20] [--ig-steps 8]
                                          [--samples 3] [--repeats 1] [--threads 2] [--methods ...] [--whole] [--segment N]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from dataclasses import replace

import numpy as np
import torch
from generation import generation_inputs, prompts_of  # noqa: E402  (benchmarks/ is the script's folder)

import heedful
from heedful.generation import prepare_steps
from heedful.generation_shared import SharedSteps, explain_shared

OPTIONS = {"saliency": {}, "grad_x_input": {}, "integrated_gradients": {"baseline": "unk"}, "smoothgrad": {}, "attnlrp": {}}
FORWARD_ONLY = ("raw_attention", "rollout")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    generation_inputs(parser)
    parser.add_argument("--ig-steps", type=int, default=8)
    parser.add_argument("--samples", type=int, default=3, help="SmoothGrad's noised samples")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--methods", nargs="+", default=["saliency", "grad_x_input", "integrated_gradients"], choices=[*OPTIONS, *FORWARD_ONLY])
    parser.add_argument("--whole", action="store_true", help="also time the shared path as one pass over the whole sequences")
    parser.add_argument("--per-step-backward", action="store_true", help="with --whole: also with a plain backward per step")
    parser.add_argument("--segment", type=int, help="also time the swept path in segments of this many positions")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)
    print(f"load average {os.getloadavg()[0]:.2f} before", flush=True)
    lm = heedful.load(args.model)
    if lm.tokenizer.unk_token_id is None:
        OPTIONS["integrated_gradients"]["baseline"] = "pad"
    generation = lm.generate(prompts_of(args.n, args.words), args.steps, generation_config={"min_new_tokens": args.steps})
    print(f"{args.model}: {len(generation.steps)} prompts x {args.steps} tokens", flush=True)
    for method in args.methods:
        if method in FORWARD_ONLY:
            _head_or_not(lm, generation, method, args.repeats)
            continue
        info = lm.method(method)
        options = dict(OPTIONS[method], **({"n_steps": args.ig_steps} if method == "integrated_gradients" else {}))
        if method == "smoothgrad":
            options["n_samples"] = args.samples
        bound = info.bind(options, lm.adapter.device)

        def per_step(info=info, bound=bound):
            problem, _, _ = prepare_steps(lm.adapter, generation, info, "logit")
            return info.fn(problem, **bound).detach()

        def shared(info=info, bound=bound):
            return explain_shared(lm.adapter, generation, info, bound, "logit")[3]

        def setting(**values):
            def run():
                before = {name: getattr(SharedSteps, name) for name in values}
                for name, value in values.items():
                    setattr(SharedSteps, name, value)
                try:
                    return shared()
                finally:
                    for name, value in before.items():
                        setattr(SharedSteps, name, value)

            return run

        extra = {}
        if args.whole:
            extra["shared, whole pass"] = setting(segment=None)
            if args.per_step_backward:
                extra["shared, whole pass, a backward per step"] = setting(segment=None, steps_per_backward=1)
        if args.segment:
            extra[f"shared, segments of {args.segment}"] = setting(segment=args.segment)
        paths = {"per-step": per_step, "shared": shared, **extra}
        found = {name: [] for name in paths}
        scores = {}
        for _ in range(args.repeats):
            for name, call in paths.items():  # interleaved, so that both see the same load
                began = time.perf_counter()
                scores[name] = call()
                found[name].append(time.perf_counter() - began)
        worst = max(float((s - scores["per-step"]).abs().max()) for s in scores.values())
        largest = float(scores["per-step"].abs().max())
        times = ", ".join(f"{name} {min(t):.2f} s" for name, t in found.items())
        ratio = min(found["per-step"]) / min(found["shared"])
        print(f"{method}: {times}; per-step / shared {ratio:.2f}x; max abs diff {worst:.1e} (max abs score {largest:.3g})", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f} after", flush=True)
    return 0


def _head_or_not(lm: heedful.Model, generation: heedful.Generation, method: str, repeats: int) -> None:
    """A forward-only method's generation attribution with the head at every step's anchor and
    without it (the steps' probabilities then come from the generation), interleaved."""
    paths = {"with the head": replace(generation, log_probs=None, forced=True), "without": generation}
    found = {name: [] for name in paths}
    out = {}
    for _ in range(repeats):
        for name, given in paths.items():
            began = time.perf_counter()
            out[name] = lm.explain_generation(given, method)
            found[name].append(time.perf_counter() - began)
    pairs = list(zip(out["with the head"], out["without"], strict=True))
    scores = max(float(np.nanmax(np.abs(a.scores - b.scores))) for a, b in pairs)
    probs = max(float(np.abs(a.probabilities - b.probabilities).max()) for a, b in pairs)
    times = ", ".join(f"{name} {min(t):.2f} s" for name, t in found.items())
    ratio = min(found["with the head"]) / min(found["without"])
    print(f"{method}: {times}; with / without {ratio:.2f}x; max abs diff: scores {scores:.1e}, probabilities {probs:.1e}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
