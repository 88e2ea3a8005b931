"""Scaling of ``heedful bench``: the local engine against a local Ray cluster of 1 and 2 workers on
the same bench, and from these measurements a projection for N machines.

The bench: ``--methods`` (random with the preset's 5 seeds, grad_x_input, normxlogit) on the first
``--n`` movie sentences, AOPC under the default protocol, on ``--model``. Each configuration writes
a fresh results store:

- ``local``: the local engine in this process, one torch thread (one core);
- ``ray-1``: the Ray engine, one worker actor (one core, one torch thread);
- ``ray-2``: the Ray engine, two worker actors (two cores);
- ``local, 2 threads``: the local engine with two torch threads (what the cores give without Ray).

Measured: wall time (worker start-up and model loading included; the cluster's own start is
reported apart), explanations per second per core, the store's bytes per explanation, the driver's
write throughput (rows per second while writing), the speed-up ray-2 / ray-1 (target >= 1.7) and
the overhead ray-1 / local. Every configuration's stored metric values are compared with the
local engine's. The projection (docs/scale.md explains it): N machines of ``--cores`` cores compute
N x cores x r explanations/s (r: ray-2's rate per core), until the single driver's store writes
(rows per explanation / write throughput) or the network into the driver (bytes per explanation)
bound it. Writes ``benchmarks/results/scale.md`` from this one run.

    python benchmarks/scale.py                 # 400 sentences (run on a quiet machine)
    python benchmarks/scale.py --n 40          # a quick check of the script
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import subprocess
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from _shared import ROOT, command_line, cpu_name, library_versions, write_results
from rich.console import Console
from rich.markdown import Markdown

import heedful
from heedful.evaluate import get_protocol
from heedful.evaluate.bench import BenchResult, BenchSpec, run_bench
from heedful.evaluate.ray_engine import RayEngine
from heedful.threads import torch_threads

MACHINES = (1, 2, 4, 8, 16, 32, 64, 128)
NETWORK = 125e6  # bytes/s into the driver: 1 Gbit/s


@dataclass
class Outcome:
    """One configuration's run: wall seconds, cores it used, explanations computed, the result."""

    name: str
    cores: int
    seconds: float
    result: BenchResult

    @property
    def explanations(self) -> int:
        return self.result.computed["explanations"]

    @property
    def rows(self) -> int:
        return sum(self.result.computed.values())

    @property
    def per_core(self) -> float:
        """Explanations (with their AOPC curves and values) per second per core."""
        return self.explanations / self.seconds / self.cores


def stored_values(path: Path) -> list[tuple]:
    """Every stored metric value, for comparing configurations."""
    with sqlite3.connect(path) as db:
        return db.execute("SELECT run, example_id, metric, value, curve FROM metrics ORDER BY 1, 2, 3").fetchall()


def store_bytes(path: Path) -> dict[str, float]:
    """Bytes per explanation in the store: the explanation JSON alone, all of an explanation's
    rows (explanation, raw curves, metric values), and the SQLite file (indexes, pages)."""
    with sqlite3.connect(path) as db:
        count, text = db.execute("SELECT COUNT(*), SUM(LENGTH(explanation)) FROM explanations").fetchone()
        curves = db.execute("SELECT COALESCE(SUM(LENGTH(data)), 0) FROM measurements").fetchone()[0]
        values = db.execute("SELECT COALESCE(SUM(LENGTH(curve)) + 8 * COUNT(*), 0) FROM metrics").fetchone()[0]
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    size = path.stat().st_size
    return {"explanation": text / count, "rows": (text + curves + values) / count, "file": size / count}


def run_one(name: str, cores: int, spec: BenchSpec, engine=None) -> Outcome:
    began = time.perf_counter()
    result = run_bench(spec, progress=False, engine=engine)
    return Outcome(name, cores, time.perf_counter() - began, result)


def projection(rate: float, rows_per_expl: float, write_rate: float, bytes_per_expl: float, cores: int) -> tuple[list[str], float, float]:
    """Markdown rows of the projected throughput for ``MACHINES`` machines of ``cores`` cores, and
    the machine counts at which the driver's writes and its network become the bound."""
    write_bound = write_rate / rows_per_expl  # explanations/s one driver can store
    net_bound = NETWORK / bytes_per_expl
    lines = []
    for n in MACHINES:
        compute = n * cores * rate
        got = min(compute, write_bound, net_bound)
        bound = "compute" if got == compute else ("driver writes" if got == write_bound else "network")
        hours = 25 * 10_000 / got / 3600
        lines.append(f"| {n} | {n * cores} | {compute:,.1f} | {got:,.1f} | {bound} | {hours:,.2f} h |")
    return lines, write_bound / (cores * rate), net_bound / (cores * rate)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="minilm-sentiment")
    parser.add_argument("--dataset", default="movies")
    parser.add_argument("--n", type=int, default=400, help="Sentences of the bench.")
    parser.add_argument("--methods", default="random,grad_x_input,normxlogit")
    parser.add_argument("--metrics", default="aopc")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--cores", type=int, default=16, help="Cores per machine in the projection.")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "scale.md")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    console = Console(stderr=True)
    load_before = os.getloadavg()[0]
    model = heedful.load(args.model, progress=False)
    loader = heedful.loading.loader(args.model)
    work = Path(tempfile.mkdtemp(prefix="heedful-scale-"))

    def spec(folder: str) -> BenchSpec:
        return BenchSpec(
            model=model, dataset=args.dataset, methods=args.methods.split(","), metrics=args.metrics.split(","),
            protocol=get_protocol("default"), out=work / folder, n=args.n, batch_size=args.batch_size,
        )

    import ray

    outcomes: list[Outcome] = []
    try:
        with torch_threads(1):
            console.print("local engine, 1 thread …")
            outcomes.append(run_one("local (1 process, 1 thread)", 1, spec("local")))
            began = time.perf_counter()
            env = {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", "PYTHONPATH": str(ROOT)}
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR", runtime_env={"env_vars": env})
            cluster_start = time.perf_counter() - began
            for workers in (1, 2):
                console.print(f"ray engine, {workers} worker(s) …")
                outcomes.append(run_one(f"ray, {workers} worker{'s' if workers > 1 else ''}", workers, spec(f"ray{workers}"), RayEngine(loader, workers)))
            ray.shutdown()
        with torch_threads(2):
            console.print("local engine, 2 threads …")
            outcomes.append(run_one("local (1 process, 2 threads)", 2, spec("local2")))
    finally:
        if ray.is_initialized():
            ray.shutdown()
    load_after = os.getloadavg()[0]
    local, ray1, ray2, local2 = outcomes
    reference = stored_values(local.result.store_path)
    same = {o.name: stored_values(o.result.store_path) == reference for o in outcomes[1:]}
    sizes = store_bytes(ray2.result.store_path)
    engine = ray2.result.engine
    write_rate = engine.rows / engine.write_seconds
    rows_per_expl = ray2.rows / ray2.explanations
    speedup, overhead = ray1.seconds / ray2.seconds, ray1.seconds / local.seconds
    rows, write_machines, net_machines = projection(ray2.per_core, rows_per_expl, write_rate, sizes["file"], args.cores)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    table = [
        "| configuration | cores | wall time | explanations | explanations/s per core | tasks | retries | driver writing |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for o in outcomes:
        e = o.result.engine
        table.append(
            f"| {o.name} | {o.cores} | {o.seconds:.1f} s | {o.explanations} | {o.per_core:.2f} | {e.tasks} | {e.retries} | {e.write_seconds:.2f} s |"
        )
    workers = "\n".join(f"  - {line.strip()}" for line in engine.lines()[1:])
    text = f"""# Scaling `heedful bench`: local engine vs Ray

`{args.model}`, {args.methods} (random: {get_protocol("default").random_seeds} seeds) x the first {local.result.n_examples} `{args.dataset}` test sentences, metrics {args.metrics} (default protocol), batch size {args.batch_size}, tasks of {args.batch_size * 4} examples. Every configuration starts from an empty results store; wall time includes starting the workers and loading the model in each (the Ray cluster's own start, {cluster_start:.1f} s, is not included).

{chr(10).join(table)}

- **ray-2 / ray-1 speed-up: {speedup:.2f}x** (target >= 1.7x)
- **ray-1 / local overhead: {overhead:.2f}x** wall time at one core each
- local with 2 threads vs ray with 2 workers: {local2.seconds / ray2.seconds:.2f}x
- stored metric values equal to the local engine's: {", ".join(f"{k}: {'yes' if v else 'NO'}" for k, v in same.items())}
- bytes per explanation in the store: {sizes["explanation"]:,.0f} (explanation JSON), {sizes["rows"]:,.0f} (all its rows: explanation, raw curves, values), {sizes["file"]:,.0f} (SQLite file / explanations)
- rows per explanation: {rows_per_expl:.2f}; driver write throughput: **{write_rate:,.0f} rows/s** ({engine.rows} rows in {engine.write_seconds:.2f} s of writing, one transaction per task)
- ray-2 workers:
{workers}

## Projection for N machines ({args.cores} cores each)

From the measured rate per core r = {ray2.per_core:.2f} explanations/s (ray-2), {rows_per_expl:.2f} rows and {sizes["file"]:,.0f} bytes per explanation, the driver's {write_rate:,.0f} rows/s, and {NETWORK / 1e6:.0f} MB/s into the driver (1 Gbit/s). Throughput = min(N x cores x r, write throughput / rows per explanation, network / bytes per explanation). The last column is the time for a study of 25 methods x 10,000 sentences at that rate.

| machines | cores | compute bound (expl/s) | projected (expl/s) | bound by | 25 methods x 10,000 sentences |
|---:|---:|---:|---:|---|---:|
{chr(10).join(rows)}

The single-writer store becomes the bound at **{write_machines:,.0f} machines** of {args.cores} cores (the network into the driver at {net_machines:,.0f}). Beyond that, run one bench per shard (methods or example ranges, each with its own `--out`) and join the stores with `heedful bench merge` (docs/scale.md).

## Set-up

{command_line()}
- heedful commit {commit}; date {time.strftime("%Y-%m-%dT%H:%M:%S%z")}
- machine: {cpu_name()}, {os.cpu_count()} logical cores; workers OMP_NUM_THREADS=1; load average {load_before:.2f} before, {load_after:.2f} after (shared machine)
- {library_versions("torch", "transformers", "ray")}
"""
    shutil.rmtree(work, ignore_errors=True)
    write_results(args.out, text)
    Console().print(Markdown(args.out.read_text(encoding="utf-8")))
    console.print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
