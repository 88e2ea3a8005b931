"""Do a method's token scores depend on the processor? Each method explains the same texts twice,
in two fresh processes: once with PyTorch's kernels for this processor's widest instruction set,
once restricted to AVX2 (``ATEN_CPU_CAPABILITY=avx2``, ``ONEDNN_MAX_CPU_ISA=AVX2``,
``MKL_ENABLE_INSTRUCTIONS=AVX2``: what a processor without AVX-512 runs; on such a processor, to
SSE4.1 and scalar code). The kernels sum in
other orders, so scores differ by float32 rounding; a well-conditioned method keeps every text's
removal order, an ill-conditioned one -- a rule that divides by a sum that cancels -- does not.

Per method: the texts whose removal order (scores sorted, highest first) is identical in both
runs, with a 95 % Wilson interval; the mean Spearman rho of the two score vectors; and the
largest difference relative to the text's largest score. Results of a faithfulness benchmark on
one processor carry over to another only for the methods that keep their orders.

    python benchmarks/processor_stability.py [--model minilm-sentiment] [--n 200]
        [--methods lrp,chefer,...] [--threads 1] [--progress auto|always|never]
        [--out benchmarks/results/processor-stability.md]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _shared import ROOT, cpu_name, emit, library_versions  # noqa: E402

from heedful.render.progress import MODES  # noqa: E402

#: The cheap methods of every family heedful registers for an encoder classifier.
METHODS = ("saliency", "grad_x_input", "integrated_gradients", "raw_attention", "rollout", "attention_gradcam", "cam",
           "attcat", "gae", "chefer", "lrp", "partial_lrp", "mask_lrp", "attnlrp", "alti", "globenc", "decompx",
           "normxlogit", "leave_one_out")
#: What restricts PyTorch's CPU kernels to AVX2 -- and, on a processor whose widest are AVX2, to
#: SSE4.1 and scalar code.
AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
NARROWER = {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}


def explain(model: str, n: int, methods: list[str], threads: int, out: Path, progress: str = "auto") -> None:
    """Worker: the first ``n`` movies test texts of 20 tokens or more explained by every method,
    the scores saved to ``out`` (``.npz``, one object array per method) with the kernels' level."""
    import warnings

    import torch

    import heedful
    from heedful import datasets

    warnings.filterwarnings("ignore")
    torch.set_num_threads(threads)
    lm = heedful.load(model)
    tok = lm.adapter.tokenizer
    texts = [e.text for e in datasets.load("movies", "test", None) if len(tok(e.text)["input_ids"]) >= 20][:n]
    from heedful.progress import task
    from heedful.render.progress import show_progress

    found = {}
    capability = torch.backends.cpu.get_cpu_capability()
    with show_progress(progress), task(f"{len(texts)} texts, {capability} kernels: methods", total=len(methods)) as steps:
        for method in methods:
            options = {}
            if method == "mask_lrp":  # the model's own mask, as the Mask-LRP report runs it
                from heedful.lrp.heads import default_head_mask

                options["head_mask"] = default_head_mask(lm.adapter).mask.astype(int).tolist()
            found[method] = np.array([np.asarray(e.scores, dtype=np.float64) for e in lm.explain(texts, method, **options)],
                                     dtype=object)
            steps.advance()
    np.savez(out, capability=capability, **found)


def compare(a: np.ndarray, b: np.ndarray) -> tuple[int, float, float]:
    """Texts with the same removal order, mean Spearman rho, largest relative difference."""
    from scipy.stats import spearmanr

    same = sum(np.array_equal(np.argsort(-x, kind="stable"), np.argsort(-y, kind="stable")) for x, y in zip(a, b, strict=True))
    rho = float(np.nanmean([spearmanr(x, y)[0] for x, y in zip(a, b, strict=True)]))
    rel = max(float(np.max(np.abs(x - y)) / max(float(np.max(np.abs(x))), 1e-30)) for x, y in zip(a, b, strict=True))
    return same, rho, rel


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="minilm-sentiment")
    parser.add_argument("--n", type=int, default=200, help="movies test texts of 20 tokens or more")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--progress", choices=MODES, default="auto", help="progress bars on stderr (auto: on a terminal)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "processor-stability.md")
    parser.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    methods = [m for m in args.methods.split(",") if m]
    if args.n < 1:
        parser.error(f"--n must be a positive number of texts, got {args.n}")
    import heedful.attribution  # noqa: F401  (registers the methods)
    from heedful.errors import MethodError
    from heedful.registry import find

    for method in methods:
        try:
            find(method)
        except MethodError:
            parser.error(f"no method {method!r}: `heedful methods` lists them")
    if not methods:
        parser.error("--methods names no method")
    if args.worker is not None:
        explain(args.model, args.n, methods, args.threads, args.worker, args.progress)
        return 0
    import torch

    load_before = os.getloadavg()[0]
    restricted = AVX2 if torch.backends.cpu.get_cpu_capability().startswith("AVX512") else NARROWER
    runs, seconds = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for side, extra in (("native", {}), ("restricted", restricted)):
            path = Path(tmp) / f"{side}.npz"
            began = time.perf_counter()
            subprocess.run([sys.executable, __file__, *(argv if argv is not None else sys.argv[1:]), "--worker", str(path)],
                           env={**os.environ, **extra}, check=True)
            seconds[side] = time.perf_counter() - began
            with np.load(path, allow_pickle=True) as found:
                runs[side] = {k: found[k] for k in found.files}
    native, other = (str(runs[s].pop("capability")) for s in ("native", "restricted"))
    if native == other:
        print(f"the restricted run used the same kernels ({native}): nothing to compare", file=sys.stderr)
        return 2
    from heedful.evaluate.intervals import wilson

    n = len(next(iter(runs["native"].values())))
    lines = [
        "# Processor dependence of token scores",
        "",
        f"`{args.model}`, the first {n} movies test texts of 20 tokens or more, every method at its defaults "
        f"(`mask_lrp` with the model's own head mask), explained twice in fresh processes: PyTorch's {native} kernels "
        f"and its {other} kernels (`{' '.join(f'{k}={v}' for k, v in restricted.items())}`"
        + (", what a processor without AVX-512 runs" if restricted is AVX2 else "") + "). Same order: texts whose removal order (scores sorted, highest first) is identical in both "
        "runs, with a 95 % Wilson interval.",
        "",
        "| method | same order | share [95% CI] | mean Spearman rho | largest difference / largest score |",
        "|---|---:|---|---:|---:|",
    ]
    unstable = []
    for method in methods:
        same, rho, rel = compare(runs["native"][method], runs["restricted"][method])
        low, high = wilson(same, n)
        lines.append(f"| `{method}` | {same}/{n} | {same / n:.3f} [{low:.3f}, {high:.3f}] | {rho:.4f} | {rel:.1e} |")
        if high < 0.95:
            unstable.append(f"`{method}`")
    lines += ["", "Methods whose interval lies below 0.95 (their token orders, and every removal curve drawn from them, "
              "move with the processor): " + (", ".join(unstable) or "none") + "."]
    notes = [
        f"- machine: {cpu_name()}, {os.cpu_count()} logical cores, {args.threads} torch thread(s); "
        f"load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after",
        f"- time: {seconds['native']:.0f} s with the {native} kernels, {seconds['restricted']:.0f} s with {other} "
        "(model loading included)",
        f"- {library_versions('torch', 'transformers')}",
    ]
    emit(lines, notes, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
