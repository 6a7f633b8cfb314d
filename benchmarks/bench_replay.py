"""Replay benchmark: the real controller through the shared Summit week, in the settings a site will have.

Every figure comes from the controller that runs pilots (``pilotfill replay``
drives it on a simulated clock) and is measured in this one run: samples, jobs
finished, node-hours held and used as a share of the idle node-hours, what the
site sees (pilots per time the trace made a node idle, releases, nodes
re-requested within a minute of their release, job stops) and the time per
event inside the controller (journal writes included): wall time, and this
process's CPU time — on a shared machine the wall time includes waiting for a
core, the CPU time is what the controller itself costs. It judges nothing:
targets are printed beside the ratios.

The matrix (defaults: every job file row, no cap on concurrent jobs, the
learned horizon):

* machine: the first 64 nodes over BFTrainer's window
  (2021-02-10T20:21:15Z → 02-17T00:00Z), and the whole machine (4,734 nodes,
  the whole trace);
* accounting: ``bftrainer`` (starts free, stops cost a shrink: BFTrainer's
  replayer) and ``realistic`` (a start costs 30 s of progress, a stop loses the
  work since the last commit, every 60 s of training);
* profiles: ``known`` (the job file's curves and costs) and ``learned`` (every
  job cold, JPA learns curves and costs from 3 %-noisy reports; the median of
  three noise seeds, with min and max; controller times are the worst seed's
  and re-requests are summed over the seeds);
* queue delay: 0 and 30 s per pilot.

Then the realistic cells again with BFTrainer's fixed T_fwd = 10 s instead of
the learned horizon; BFTrainer's own setup (64 nodes, at most 10 jobs, T_fwd = 10 s, its
figures: 6.11e9 samples, 43 jobs, 98.2 % efficiency) and a saturating demand:
the shared job file eight times over, submitted evenly through the week
(8,008 jobs), on the whole machine with realistic accounting and a 30 s queue
delay — where the question is how much of the idle time becomes training.
Apart (``--only twice``, not in the default matrix): the next machines, twice Summit — the week beside itself
(9,468 nodes, its events twice as large at the same instants) under the job file sixteen times over (16,016 jobs).

The ordering (``--only order``): on the realistic cells of 64 nodes and of the whole machine, the samples objective
with admission by worth (the default), the samples objective with first-come-first-served admission (BFTrainer's),
and the share objective (groups: the models), each with its samples, the longest wait of any job (for a first
start; a job never started waits until the end) and the controller's CPU per pass; the guard: samples >= every other
figure in every cell, and share at most 3 % below samples. Known curves (``--order-profiles known,learned`` adds
one noise seed of learned curves). BFTrainer's setup is replayed with arrival admission, as its comparison is.

Controller time is per pass of the controller's loop (at most 256 messages, then a step: what a reply or a decision
waits for), and, apart, for the busiest instant of the trace in all its passes (a preemption of thousands of nodes).

    python benchmarks/bench_replay.py [--data ../shared/data] [--only 64|whole|bftrainer|horizon|saturating|twice|order] [--accounting bftrainer|realistic]
        [--queue-delay 0|30] [--seeds 3] [--saturating-seeds 1] [--order-machine 64|whole] [--order-profiles known,learned] [--jobs N] [--out results.jsonl]

``--jobs N`` runs N replays at once in separate processes (each replay's CPU time is its own process's; on a machine
with fewer free cores than N, wall times are upper bounds).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

from pilotfill.replay import replay
from pilotfill.traces import JobSpec, Trace, parse_time, read_jobs, read_trace

BFTRAINER = {"samples": 6.11e9, "jobs_completed": 43, "efficiency": 0.982}
HERE = Path(__file__).resolve().parent
WINDOW = dict(start=parse_time("2021-02-10T20:21:15Z"), end=parse_time("2021-02-17T00:00:00Z"))
TARGETS = ("targets: learned/known >= 0.97 (realistic, 30 s); re-requested 0; pilots <= idle transitions + pilots that reached their walltime "
           "(a node idle past a pilot's walltime needs another); controller ms max <= 100; saturating used/idle >= 0.90")


ORDER = (("samples, admission by worth", {}), ("samples, arrival admission", {"admission": "arrival"}),
         ("share (groups: models)", {"objective": "share", "share_by": "model"}))
"""What the ordering part compares on each cell: the samples objective as it is, the same with BFTrainer's admission,
and the share objective."""
SHARE_COST = 0.03
"""The most the share objective may cost of the samples objective's samples."""


WORST_OF_SEEDS = ("controller_ms_max", "controller_cpu_ms_max", "controller_cpu_ms_max_few_messages", "controller_messages_max", "controller_ms_p99",
                  "controller_cpu_ms_p99", "instant_ms_max", "instant_cpu_ms_max")  # fmt: skip


def saturating_demand(jobs: list[JobSpec], trace: Trace, copies: int = 8) -> list[JobSpec]:
    """The job file ``copies`` times over, submitted at even intervals from the trace's start to its end."""
    out = []
    total = copies * len(jobs)
    step = (trace.end - trace.start) / total
    for k in range(total):
        spec = jobs[k % len(jobs)]
        out.append(replace(spec, name=f"{spec.name}#{k // len(jobs)}", submit_time=trace.start + k * step, line=k + 2))
    return out


@lru_cache(maxsize=None)
def _inputs(data: Path, machine: str, demand: str) -> tuple[Trace, list[JobSpec]]:
    """The trace and job file of a cell (read once per process)."""
    trace_file = data / "summit-2021-02-10-week.csv.gz"
    trace = read_trace(trace_file, nodes=64, **WINDOW) if machine == "64" else read_trace(trace_file)
    if machine == "twice":  # the next machines: twice Summit, the week beside itself
        trace = trace.beside(trace, "b/")
    jobs = read_jobs(data / "jobs-imagenet-1001.csv")
    copies = 16 if machine == "twice" else 8
    return trace, saturating_demand(jobs, trace, copies) if demand == "saturating" else jobs


def run_one(data: Path, machine: str, demand: str, options: dict) -> dict:
    """One replay of the matrix (in a worker process with ``--jobs``)."""
    trace, jobs = _inputs(data, machine, demand)
    return replay(trace, jobs, keep_timeline=False, **options).as_dict()


class Runner:
    """Runs a cell's replays here, or in worker processes (``--jobs``), and gathers each cell when its replays are done."""

    def __init__(self, data: Path, jobs: int):
        self.data = data
        self.pool = ProcessPoolExecutor(max_workers=jobs) if jobs > 1 else None

    def submit(self, machine: str, demand: str, options: dict) -> Future | dict:
        if self.pool is None:
            return run_one(self.data, machine, demand, options)
        return self.pool.submit(run_one, self.data, machine, demand, options)

    def close(self) -> None:
        """The worker processes stopped before the interpreter exits (left to its exit hooks, they may fail there)."""
        if self.pool is not None:
            self.pool.shutdown()

    def cell(self, label: str, machine: str, demand: str, seeds: int, **options) -> Pending:
        """Known curves once and learned curves over ``seeds`` noise seeds, started now, gathered by :meth:`Pending.result`."""
        known = self.submit(machine, demand, {**options, "profiles": "known"})
        learned = [self.submit(machine, demand, {**options, "profiles": "learned", "noise": 0.03, "seed": s}) for s in range(seeds)]
        return Pending(label, options, known, learned)


class Pending:
    def __init__(self, label: str, options: dict, known, learned: list):
        self.label, self.options, self.known, self.learned = label, options, known, learned

    def result(self) -> dict:
        get = lambda r: r.result() if isinstance(r, Future) else r  # noqa: E731
        return summarise(self.label, self.options, get(self.known), [get(r) for r in self.learned])


def summarise(label: str, options: dict, known: dict, learned_runs: list[dict]) -> dict:
    """One cell of the matrix: known curves once, learned curves over the seeds (the median kept)."""
    learned = sorted(learned_runs, key=lambda r: r["samples"])[len(learned_runs) // 2] if learned_runs else None
    if learned is not None:  # samples are the median seed's; what a site must never see counts in any seed
        learned = {**learned, **{k: max(r[k] for r in learned_runs) for k in WORST_OF_SEEDS},
                   "nodes_rerequested_within_60s": sum(r["nodes_rerequested_within_60s"] for r in learned_runs)}  # fmt: skip
    ratios = [r["samples"] / known["samples"] for r in learned_runs] if known["samples"] > 0 else []
    return {"cell": label, "options": dict(options), "known": known, "learned": learned,
            "learned_over_known": {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)} if ratios else None}  # fmt: skip


def row(name: str, r: dict) -> str:
    idle = max(r["idle_node_hours"], 1e-9)
    return (f"  {name:<8} samples {r['samples']:>10.4g}  jobs {r['jobs_completed']:>5}  held/idle {r['held_node_hours'] / idle:6.3f}  used/idle {r['used_node_hours'] / idle:6.3f}"
            f"  pilots/(idle transitions + walltime ends) {r['pilots_submitted'] / max(1, r['idle_transitions'] + r.get('pilots_walltime_ended', 0)):5.3f}  released {r['nodes_released']:>6,}  re-requested {r['nodes_rerequested_within_60s']:>3}"
            f"  job stops {r['job_stops']:>6,}  longest wait {r['longest_wait_s'] / 3600:5.1f} h  controller ms per pass, wall p50 {r['controller_ms_p50']:5.1f} p99 {r['controller_ms_p99']:6.1f} max {r['controller_ms_max']:6.1f}"
            f" / CPU p50 {r['controller_cpu_ms_p50']:5.1f} p99 {r['controller_cpu_ms_p99']:6.1f} max {r['controller_cpu_ms_max']:6.1f}"
            f" (passes of <= 100 messages: {r['controller_cpu_ms_max_few_messages']:6.1f}; busiest instant {r['controller_messages_max']:,} messages, "
            f"{r['instant_cpu_ms_max']:6.1f} CPU in all its passes)  ({r['wall_s']:.0f} s)")  # fmt: skip


def show(result: dict) -> None:
    print(f"{result['cell']}")
    print(row("known", result["known"]))
    if result["learned"] is not None:
        print(row("learned", result["learned"]))
        q = result["learned_over_known"]
        print(f"  learned / known samples: median {q['median']:.4f} (min {q['min']:.4f}, max {q['max']:.4f})")
    sys.stdout.flush()


def waits(r: dict) -> str:
    """The longest waits of one replay, in hours."""
    return (f"longest wait {r['longest_wait_s'] / 3600:6.1f} h (of those started {r['longest_wait_started_s'] / 3600:5.1f} h; to run again "
            f"{r['longest_rewait_s'] / 3600:5.1f} h; never started {r['jobs_never_started']:>4})")  # fmt: skip


def order_cells(runner: Runner, machines: list[str], delays: list[float], profiles: list[str]) -> list[tuple[str, list[tuple[str, Future | dict]]]]:
    """The ordering part's replays, started now: per cell, the samples objective with either admission, and share."""
    out = []
    for machine in machines:
        for delay in delays:
            for profile in profiles:
                learned = {"profiles": "learned", "noise": 0.03, "seed": 0} if profile == "learned" else {"profiles": "known"}
                label = (f"ordering: {'64 nodes' if machine == '64' else 'whole machine'}, realistic accounting, queue delay {delay:g} s, "
                         f"{profile} curves{' (seed 0)' if profile == 'learned' else ''}")  # fmt: skip
                base = dict(accounting="realistic", queue_delay_s=delay, **learned)
                out.append((label, [(name, runner.submit(machine, "shared", {**base, **extra})) for name, extra in ORDER]))
    return out


def show_order(label: str, runs: list[tuple[str, dict]]) -> tuple[float, float]:
    """One cell of the ordering: each run's samples, waits and CPU per pass, and the guard's two ratios (samples over
    the best other figure, share over samples)."""
    print(label)
    for name, r in runs:
        print(f"  {name:<30} samples {r['samples']:>10.4g}  jobs {r['jobs_completed']:>5}  {waits(r)}  controller CPU per pass p99 "
              f"{r['controller_cpu_ms_p99']:5.1f} max {r['controller_cpu_ms_max']:6.1f} ms  ({r['wall_s']:.0f} s)")  # fmt: skip
    samples = runs[0][1]["samples"]
    others = max(r["samples"] for _, r in runs[1:])
    share = runs[-1][1]["samples"] / samples if samples > 0 else 1.0
    over = samples / others if others > 0 else float("inf")
    print(f"  samples objective / the best other {over:.4f} (target >= 1); share / samples objective {share:.4f} (target >= {1 - SHARE_COST:.2f})")
    sys.stdout.flush()
    return over, share


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=HERE.parent.parent / "shared" / "data")
    ap.add_argument("--only", choices=["64", "whole", "bftrainer", "horizon", "saturating", "twice", "order"], action="append", help="run only these parts (repeatable)")
    ap.add_argument("--accounting", choices=["bftrainer", "realistic"], action="append", help="64/whole cells: only this accounting (repeatable)")
    ap.add_argument("--queue-delay", type=float, action="append", help="64/whole cells: only this queue delay in s (repeatable)")
    ap.add_argument("--horizon-machine", choices=["64", "whole"], action="append", help="horizon part: only this machine (repeatable)")
    ap.add_argument("--seeds", type=int, default=3, help="noise seeds for learned curves (the median is shown)")
    ap.add_argument("--saturating-seeds", type=int, default=1, help="noise seeds for learned curves under saturating demand (each run is long)")
    ap.add_argument("--order-machine", choices=["64", "whole"], action="append", help="ordering part: only this machine (repeatable)")
    ap.add_argument("--order-profiles", default="known", help="ordering part: known, learned (one noise seed), or both, comma-separated")
    ap.add_argument("--jobs", type=int, default=1, help="replays run at once, each in its own process")
    ap.add_argument("--out", type=Path, default=None, help="also write every cell's full figures as JSON lines")
    args = ap.parse_args()
    parts = args.only or ["bftrainer", "64", "whole", "horizon", "saturating", "order"]
    print(TARGETS)
    results = []
    began = time.perf_counter()
    runner = Runner(args.data, args.jobs)
    specs: list[tuple] = []  # (label, machine, demand, seeds, options), in the order they are printed
    if "bftrainer" in parts:
        specs.append(("64 nodes, BFTrainer's setup (at most 10 jobs, T_fwd 10 s, bftrainer accounting)", "64", "shared", args.seeds,
                      dict(max_jobs=10, t_fwd=10.0, admission="arrival")))  # fmt: skip
    for part in ("64", "whole"):
        if part not in parts:
            continue
        for accounting in args.accounting or ("bftrainer", "realistic"):
            for delay in args.queue_delay or (0.0, 30.0):
                label = f"{'64 nodes' if part == '64' else 'whole machine'}, {accounting} accounting, queue delay {delay:g} s"
                specs.append((label, part, "shared", args.seeds, dict(accounting=accounting, queue_delay_s=delay)))
    if "horizon" in parts:  # the learned horizon (every cell above) against BFTrainer's fixed look-ahead, in the realistic setting
        for machine in args.horizon_machine or ["64", "whole"]:
            label = "64 nodes" if machine == "64" else "whole machine"
            specs.append((f"{label}, realistic accounting, queue delay 30 s, fixed T_fwd = 10 s (compare with the learned horizon above)", machine,
                          "shared", args.seeds, dict(accounting="realistic", queue_delay_s=30.0, t_fwd=10.0)))  # fmt: skip
    if "saturating" in parts:
        specs.append(("whole machine, saturating demand (the job file 8 times over, submitted through the week), realistic accounting, queue delay 30 s",
                      "whole", "saturating", args.saturating_seeds, dict(accounting="realistic", queue_delay_s=30.0)))  # fmt: skip
    if "twice" in parts:  # not in the default matrix: about three times the saturating cell's time
        specs.append(("twice Summit (the week beside itself: 9,468 nodes), saturating demand (the job file 16 times over), realistic accounting, "
                      "queue delay 30 s", "twice", "saturating", args.saturating_seeds, dict(accounting="realistic", queue_delay_s=30.0)))  # fmt: skip
    # Every cell is started before any is gathered (with --jobs they run side by side), the longest first: the
    # saturating demand, then the whole machine, so the last to finish is not the longest.
    started = {i: None for i in sorted(range(len(specs)), key=lambda i: (specs[i][1] != "twice", specs[i][2] != "saturating", specs[i][1] != "whole"))}
    for i in started:
        label, machine, demand, seeds, options = specs[i]
        started[i] = runner.cell(label, machine, demand, seeds, **options)
    cells = [started[i] for i in range(len(specs))]
    ordering = []
    if "order" in parts:
        ordering = order_cells(runner, args.order_machine or ["64", "whole"], args.queue_delay or [0.0, 30.0], args.order_profiles.split(","))
    for pending in cells:
        r = pending.result()
        show(r)
        results.append(r)
        if args.out is not None:
            with open(args.out, "a") as f:
                f.write(json.dumps(r) + "\n")
        if r["cell"].startswith("64 nodes, BFTrainer's setup"):
            k = r["known"]
            print(f"  known / BFTrainer's replayer: samples {k['samples'] / BFTRAINER['samples']:.4f} (target >= 1), jobs {k['jobs_completed']} vs 43, "
                  f"efficiency {k['efficiency']:.3%} vs 98.2 %")
        if "saturating" in r["cell"]:
            for name in ("known", "learned"):
                x = r[name]
                if x is not None:
                    print(f"  {name}: used {x['used_node_hours']:,.0f} of {x['idle_node_hours']:,.0f} idle node-hours = {x['used_node_hours'] / x['idle_node_hours']:.3f} "
                          f"(held {x['held_node_hours'] / x['idle_node_hours']:.3f}); target >= 0.90")
        sys.stdout.flush()
    guard = []
    for label, pending in ordering:
        runs_here = [(name, r.result() if isinstance(r, Future) else r) for name, r in pending]
        guard.append(show_order(label, runs_here))
        results.append({"cell": label, "runs": dict(runs_here)})
        if args.out is not None:
            with open(args.out, "a") as f:
                f.write(json.dumps(results[-1]) + "\n")
    if guard:
        worst_over, worst_share = min(g[0] for g in guard), min(g[1] for g in guard)
        print(f"\nordering, every cell: samples objective / the best other at least {worst_over:.4f} ({'met' if worst_over >= 1 else 'MISSED'}: >= 1); "
              f"share / samples at least {worst_share:.4f} ({'met' if worst_share >= 1 - SHARE_COST else 'MISSED'}: >= {1 - SHARE_COST:.2f})")  # fmt: skip
    runs = [r[k] for r in results if "runs" not in r for k in ("known", "learned") if r[k] is not None]
    runs += [r for cell in results if "runs" in cell for r in cell["runs"].values()]
    worst = max((x["controller_ms_max"] for x in runs), default=0.0)
    worst_cpu = max((x["controller_cpu_ms_max"] for x in runs), default=0.0)
    worst_few = max((x["controller_cpu_ms_max_few_messages"] for x in runs), default=0.0)
    worst_instant = max((x["instant_cpu_ms_max"] for x in runs), default=0.0)
    rereq = sum(x["nodes_rerequested_within_60s"] for x in runs)
    print(f"\nevery cell: controller ms per pass at most {worst:.1f} wall, {worst_cpu:.1f} CPU (target <= 100; passes of <= 100 messages: {worst_few:.1f} CPU); "
          f"the busiest instant, all its passes: {worst_instant:.1f} ms CPU; nodes re-requested within 60 s, summed over every run: {rereq} (target 0); "
          f"{time.perf_counter() - began:.0f} s in all")
    runner.close()


if __name__ == "__main__":
    main()
