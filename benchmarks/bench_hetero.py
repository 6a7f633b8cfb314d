"""Heterogeneous machine benchmark: what node types and the similarity policy are worth, through ``pilotfill replay``.

The data set's typed machine (``shared/data/heterogeneous``: the Summit week with its node-type map, the first
``--nodes-per-type`` nodes of each of V100, P100 and K80) and its 1,000 jobs (Gavel's measured curves per GPU
type), realistic accounting, pilots queued 30 s. Printed, each from a replay run here:

1. type-aware vs type-blind, both with known per-type curves: samples processed and their ratio. Type-blind: the
   controller is told nothing of types; jobs run at their own rate on the type they land on (the slowest type's
   pace on mixed nodes). Target: aware / blind >= 1.2.
2. cold start, leave-one-family-out: for each of the five families, replays whose similarity library (built
   from ``gpu-throughputs.csv`` by ``scripts/gavel_library.py``) leaves that family out, against known curves
   and against per-type learning from nothing (no library). Reported per family: the family's samples / its
   samples with known curves, with the similarity policy and from nothing, each the median over ``--seeds``
   noise seeds (3: one seed's noise moves a small family's share by a few per cent), with min and max.
   Target: >= 0.95, and above nothing. The library does not learn during these replays: held-out models stay
   held out. ``--control`` adds the held-out family learning from nothing while the other families use the
   library: the same machine and competitors as the similarity run, so it isolates what the policy does for the
   held-out family from what the library does for the jobs it competes with.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_hetero.py [--nodes-per-type 64] [--families ResNet-18,...] [--seeds 3] [--control]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from dataclasses import replace
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
          f"  controller CPU per pass p50 {d['controller_cpu_ms_p50']:.1f} p99 {d['controller_cpu_ms_p99']:.1f} max {d['controller_cpu_ms_max']:.1f} ms"
          f"  ({time.perf_counter() - t0:.0f} s)", flush=True)  # fmt: skip
    return r


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes-per-type", type=int, default=64)
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--seeds", type=int, default=3, help="noise seeds for learned curves (the median is judged)")
    ap.add_argument("--control", action="store_true", help="also: the held-out family from nothing, the others with the library")
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
    print(f"== 2. cold start: similarity (leave one family out) vs per-type learning from nothing; each / known curves, median of {args.seeds} seeds")
    seeds = range(args.seeds)
    k_fam = by_family(known)
    nothing = [run(f"learned, no library (from nothing), seed {s}", trace, jobs, profiles="learned", seed=s) for s in seeds]
    rows = []
    for fam in args.families.split(","):
        lib = build(folder, {fam})
        sim = [run(f"learned, library without {fam}, seed {s}", trace, jobs, profiles="learned", seed=s, library=lib) for s in seeds]
        row = {"similarity": [by_family(r)[fam] / k_fam[fam] for r in sim], "nothing": [by_family(r)[fam] / k_fam[fam] for r in nothing],
               "all": [r.samples / known.samples for r in sim]}  # fmt: skip
        if args.control:  # the held-out family without descriptors: it learns from nothing among the same competitors
            cold = [replace(j, descriptor=None) if family(j.model) == fam else j for j in jobs]
            ctl = [run(f"learned, library without {fam}, {fam} from nothing, seed {s}", trace, cold, profiles="learned", seed=s, library=lib) for s in seeds]
            row["control"] = [by_family(r)[fam] / k_fam[fam] for r in ctl]
        rows.append((fam, row))
    print()
    columns = ["similarity", "nothing", *(["control"] if args.control else []), "all"]
    titles = {"similarity": "similarity/known", "nothing": "nothing/known", "control": "family cold, others lib/known",
              "all": "all jobs, similarity/known"}
    print(f"   {'held-out family':<16} " + "  ".join(f"{titles[c]:>30}" for c in columns) + "   (median (min-max) of seeds)")
    for fam, row in rows:
        print(f"   {fam:<16} " + "  ".join(f"{_spread(row[c]):>30}" for c in columns))
    ratios = [r.samples / known.samples for r in nothing]
    print(f"   all jobs, nothing/known: {_spread(ratios)}   (targets: similarity >= 0.95 and above nothing, per family, on the medians)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
