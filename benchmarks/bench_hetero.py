"""Heterogeneous machine benchmark: what node types and the similarity policy are worth, through ``pilotfill replay``.

The data set's typed machine (``shared/data/heterogeneous``: the Summit week with its node-type map, the first
``--nodes-per-type`` nodes of each of V100, P100 and K80) and its 1,000 jobs (Gavel's measured curves per GPU
type), realistic accounting, pilots queued 30 s. Printed, each from a replay run here:

1. type-aware vs type-blind, both with known per-type curves: samples processed and their ratio. Type-blind: the
   controller is told nothing of types; jobs run at their own rate on the type they land on (the slowest type's
   pace on mixed nodes). Target: aware / blind >= 1.2.
2. cold start, leave-one-family-out: for each of the five families, a replay whose similarity library (built
   from ``gpu-throughputs.csv`` by ``scripts/gavel_library.py``) leaves that family out, against known curves
   and against per-type learning from nothing (no library). Reported per family: the family's samples / its
   samples with known curves, with the similarity policy and from nothing. Target: >= 0.95, and above nothing.
   The library does not learn during these replays: held-out models stay held out.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_hetero.py [--nodes-per-type 64] [--families ResNet-18,...]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

from gavel_library import build  # noqa: E402

from pilotfill.replay import replay  # noqa: E402
from pilotfill.traces import read_jobs, read_models, read_trace, with_models  # noqa: E402

DATA = REPO.parent / "shared" / "data"
FAMILIES = ("ResNet-18", "ResNet-50", "Transformer", "Recommendation", "A3C")


def family(model: str) -> str:
    return model.rsplit("-bs", 1)[0]


def by_family(result) -> dict[str, float]:
    out: dict[str, float] = {}
    for j in result.jobs:
        out[family(j.model)] = out.get(family(j.model), 0.0) + j.samples
    return out


def run(label: str, trace, jobs, **options):
    t0 = time.perf_counter()
    r = replay(trace, jobs, accounting="realistic", queue_delay_s=30, keep_timeline=False, **options)
    d = r.as_dict()
    print(f"   {label:<34} samples {r.samples:.4g}  completed {r.jobs_completed:>4}  solve p99 {d['solve_ms_p99']:6.1f} ms, max {d['solve_ms_max']:6.1f} ms"
          f"  ({time.perf_counter() - t0:.0f} s)", flush=True)  # fmt: skip
    return r


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes-per-type", type=int, default=64)
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    folder = DATA / "heterogeneous"
    print(f"python {platform.python_version()}, {os.cpu_count()} CPU(s); data {folder}")
    trace = read_trace(DATA / "summit-2021-02-10-week.csv.gz", types=folder / "node-types-summit.csv", nodes_per_type=args.nodes_per_type)
    jobs = with_models(read_jobs(folder / "jobs-hetero-train.csv"), read_models(folder / "models.csv"))
    print(f"{len(trace.nodes)} nodes {trace.type_counts()}, {len(jobs)} jobs, realistic accounting, queue delay 30 s")
    print()
    print("== 1. known per-type curves: type-aware vs type-blind")
    known = run("type-aware, known curves", trace, jobs)
    blind = run("type-blind, known curves", trace, jobs, node_types="blind")
    print(f"   aware / blind = {known.samples / blind.samples:.3f}   (target >= 1.2)")
    print()
    print("== 2. cold start: similarity (leave one family out) vs per-type learning from nothing; each / known curves")
    nothing = run("learned, no library (from nothing)", trace, jobs, profiles="learned", seed=args.seed)
    k_fam, n_fam = by_family(known), by_family(nothing)
    rows = []
    for fam in args.families.split(","):
        lib = build(folder, {fam})
        sim = run(f"learned, library without {fam}", trace, jobs, profiles="learned", seed=args.seed, library=lib)
        s_fam = by_family(sim)
        rows.append((fam, s_fam[fam] / k_fam[fam], n_fam[fam] / k_fam[fam], sim.samples / known.samples))
    print()
    print(f"   {'held-out family':<16} {'similarity/known':>17} {'nothing/known':>14} {'all jobs, similarity/known':>27}")
    for fam, s, n, total in rows:
        print(f"   {fam:<16} {s:>17.3f} {n:>14.3f} {total:>27.3f}")
    print(f"   all jobs, nothing/known: {nothing.samples / known.samples:.3f}   (targets: similarity >= 0.95 and above nothing, per family)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
