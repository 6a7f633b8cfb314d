"""Replay benchmarks: the shared week against BFTrainer's published figures, and at full scale.

Prints figures and ratios measured in this one run (the machine is shared and
noisy, so a ratio within one run is what compares); it judges nothing.

* 64 nodes, 2021-02-10T20:21:15Z → 2021-02-17T00:00:00Z, jobs-imagenet-1001,
  at most 10 jobs, T_fwd = 10 s — BFTrainer's setup. Its replayer reached
  6.11e9 samples, 43 jobs, 98.2 % efficiency. Targets: more samples, at least
  as many jobs, efficiency ≥ 98 %.
* the same with ``--profiles learned`` (every job cold, 3 % report noise).
  Target: ≥ 95 % of the samples that known profiles reach.
* the whole week: 4,734 nodes, 418,360 transitions, 1,001 jobs, 10 at once.
  Target: under 10 minutes (600 s) here.

    python benchmarks/bench_replay.py [--data ../shared/data] [--skip-full]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from pilotfill.schedulers.replay import replay
from pilotfill.traces import parse_time, read_jobs, read_trace

BFTRAINER = {"samples": 6.11e9, "jobs_completed": 43, "efficiency": 0.982}
HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=HERE.parent.parent / "shared" / "data")
    ap.add_argument("--skip-full", action="store_true", help="skip the whole-machine week")
    args = ap.parse_args()
    trace_file = args.data / "summit-2021-02-10-week.csv.gz"
    jobs = read_jobs(args.data / "jobs-imagenet-1001.csv")

    window = dict(start=parse_time("2021-02-10T20:21:15Z"), end=parse_time("2021-02-17T00:00:00Z"))
    trace64 = read_trace(trace_file, nodes=64, **window)
    known = replay(trace64, jobs, max_jobs=10, t_fwd=10.0, profiles="known").as_dict()
    learned = replay(trace64, jobs, max_jobs=10, t_fwd=10.0, profiles="learned", noise=0.03, seed=0).as_dict()

    print("64 nodes, BFTrainer's window and jobs (10 at once, T_fwd 10 s)")
    print(f"{'':28}{'BFTrainer':>12}{'known':>12}{'learned':>12}")
    print(f"{'samples':28}{BFTRAINER['samples']:>12.4g}{known['samples']:>12.4g}{learned['samples']:>12.4g}")
    print(f"{'jobs completed':28}{BFTRAINER['jobs_completed']:>12}{known['jobs_completed']:>12}{learned['jobs_completed']:>12}")
    print(f"{'efficiency':28}{BFTRAINER['efficiency']:>12.3%}{known['efficiency']:>12.3%}{learned['efficiency']:>12.3%}")
    print(f"{'node-hours used / idle':28}{'733.6/735.4':>12}{known['used_node_hours']:>6.1f}/{known['idle_node_hours']:<5.1f}{learned['used_node_hours']:>6.1f}/{learned['idle_node_hours']:<5.1f}")
    print(f"{'solve ms p50 / p99':28}{'':>12}{known['solve_ms_p50']:>6.2f}/{known['solve_ms_p99']:<5.2f}{learned['solve_ms_p50']:>6.2f}/{learned['solve_ms_p99']:<5.2f}")
    print(f"ratio samples known / BFTrainer:   {known['samples'] / BFTRAINER['samples']:.4f}   (target > 1)")
    print(f"ratio samples learned / known:     {learned['samples'] / known['samples']:.4f}   (target >= 0.95)")
    print(f"ratio jobs known / BFTrainer:      {known['jobs_completed'] / BFTRAINER['jobs_completed']:.4f}   (target >= 1)")

    if args.skip_full:
        return
    began = time.perf_counter()
    full_trace = read_trace(trace_file)
    read_s = time.perf_counter() - began
    full = replay(full_trace, jobs, max_jobs=10, t_fwd=10.0, keep_timeline=False).as_dict()
    total_s = time.perf_counter() - began
    print()
    print(f"whole week: {full['nodes']} nodes, {full['transitions']:,} transitions, {full['events']:,} allocations")
    print(f"  read {read_s:.1f} s + replay {full['wall_s']:.1f} s = {total_s:.1f} s; ratio to the 600 s target: {total_s / 600:.4f}")
    print(f"  samples {full['samples']:.4g}, jobs completed {full['jobs_completed']}, efficiency {full['efficiency']:.3%}")
    print(f"  solve ms p50 {full['solve_ms_p50']:.2f}, p99 {full['solve_ms_p99']:.2f}, max {full['solve_ms_max']:.2f}")


if __name__ == "__main__":
    main()
