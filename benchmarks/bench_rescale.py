"""What in-place resizes give back: the realistic replay of the shared Summit week with today's rescale costs and with
the costs the torch runtime's in-place resize measures, side by side in one run (issue 58).

The realistic replay (``pilotfill replay``'s accounting ``realistic``: a start costs 30 s of progress, a stop loses the
work since the job's last commit, every 60 s of training; a 30 s queue delay per pilot) charges each grow and shrink
the job file's costs (``jobs-imagenet-1001.csv``: what restarting real models measured, a median of 18 s to grow) —
what the torch runtime pays when every change restarts every worker. In place (``--up-s``/``--down-s``: what
``bench_elastic.py`` and the controller's ``job.cost`` measure, a node that joins trains ~1.5 s after, a shrink pauses
the others ~0.1 s) every job's costs are those, and a stop loses nothing since its commit: the ranks leave at a step
boundary and commit first, within the pilot's grace (``Replay(rescale="in_place")``). The start cost is left at 30 s in
both (a real model's own loading dominates it; warm pilots save only torch's import).

    python benchmarks/bench_rescale.py [--data ../shared/data] [--only 64|whole] [--up-s 1.5] [--down-s 0.1] [--seeds 1]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

from pilotfill.replay import replay
from pilotfill.traces import parse_time, read_jobs, read_trace

HERE = Path(__file__).resolve().parent
WINDOW = dict(start=parse_time("2021-02-10T20:21:15Z"), end=parse_time("2021-02-17T00:00:00Z"))


def cells(data: Path, machine: str, up_s: float, down_s: float, seeds: int) -> dict[tuple[str, str], dict]:
    """(rescale, profiles) -> the replay's figures (learned: the median of ``seeds`` noise seeds)."""
    trace_file = data / "summit-2021-02-10-week.csv.gz"
    trace = read_trace(trace_file, nodes=64, **WINDOW) if machine == "64" else read_trace(trace_file)
    today = read_jobs(data / "jobs-imagenet-1001.csv")
    in_place = [replace(j, scale_up_cost_s=up_s, scale_down_cost_s=down_s) for j in today]
    out = {}
    for rescale, jobs in (("restart", today), ("in_place", in_place)):
        common = dict(accounting="realistic", queue_delay_s=30.0, keep_timeline=False, rescale=rescale)
        out[(rescale, "known")] = replay(trace, jobs, profiles="known", **common).as_dict()
        runs = [replay(trace, jobs, profiles="learned", noise=0.03, seed=s, **common).as_dict() for s in range(seeds)]
        out[(rescale, "learned")] = sorted(runs, key=lambda r: r["samples"])[len(runs) // 2]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=HERE.parent.parent / "shared" / "data")
    ap.add_argument("--only", choices=["64", "whole"], action="append")
    ap.add_argument("--up-s", type=float, default=1.5, help="in place: what a grow costs a job, s of its rate (measured: bench_elastic.py)")
    ap.add_argument("--down-s", type=float, default=0.1, help="in place: what a shrink or a preemption with a grace costs, s of its rate")
    ap.add_argument("--seeds", type=int, default=1, help="noise seeds for learned curves (the median is shown)")
    args = ap.parse_args()
    for machine in args.only or ["64", "whole"]:
        started = time.monotonic()
        got = cells(args.data, machine, args.up_s, args.down_s, args.seeds)
        print(f"{'64 nodes, BFTrainer' + chr(39) + 's window' if machine == '64' else 'the whole machine, the week'}: realistic accounting, "
              f"30 s queue delay; in place: grow {args.up_s:g} s, shrink {args.down_s:g} s, stops keep their last step ({time.monotonic() - started:.0f} s)")
        print(f"  {'':8}{'':10}{'samples':>12}{'lost / ideal':>14}{'redone':>12}{'rescales':>10}{'stops':>8}")
        for profiles in ("known", "learned"):
            for rescale in ("restart", "in_place"):
                r = got[(rescale, profiles)]
                lost = 1.0 - r["efficiency"]
                print(f"  {profiles:8}{rescale:10}{r['samples']:>12.4g}{lost:>13.2%}{r['samples_redone']:>12.3g}{r['rescales']:>10,}{r['job_stops']:>8,}")
            a, b = got[("restart", profiles)], got[("in_place", profiles)]
            gain = b["samples"] / a["samples"] - 1.0 if a["samples"] else float("nan")
            back = ((1 - a["efficiency"]) - (1 - b["efficiency"])) / (1 - a["efficiency"]) if a["efficiency"] < 1 else float("nan")
            print(f"  {profiles:8}in place / restart samples {1 + gain:.4f} ({gain:+.2%}); of what was lost, {back:.0%} comes back")
        print(flush=True)


if __name__ == "__main__":
    main()
