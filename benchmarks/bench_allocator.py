"""Allocator benchmark: how fast each formulation answers, and whether they agree.

Two measurements, both on jobs read from the shared job file
(``jobs-imagenet-1001.csv``: measured scalability curves, 1…64 nodes, rescale
costs in seconds), T_fwd = 10 s:

1. 10 jobs on 32, 64 and 128 identical nodes, a few seeded instances per size
   (random jobs from the file, random remaining work, a random current map that
   respects each job's bounds). Each instance is solved by the aggregated path
   (the exact DP), the aggregated MILP (``"milp"``, CBC) and BFTrainer's
   node-level MILP (``"node-level"``). Printed per instance: wall time of each,
   node-level/DP and node-level/MILP, and whether all three reached the same
   objective where the node-level model proved optimality.
   Target: the same optimum wherever node-level proves it, and node-level/DP
   ≥ 40 at 10 × 128.

2. 200 jobs on 4,654 nodes (Summit's peak idle count, Feb 2021) over ~100
   successive events: each answer's assignment becomes the next current map,
   jobs progress and finish (replaced by new ones from the file), and between
   events the main scheduler takes back some nodes and frees others. Only the
   ``allocate(problem)`` call is timed (value tables, DP, realising the counts
   as nodes). Printed: p50, p99 and max in ms, and p99 / 100 ms.
   Target: p99 under 100 ms (ratio < 1).

3. Several kinds of node (``--typed``, the default section list includes it):
   the data set's typed Summit (4,734 nodes: V100, P100 and K80 in thirds,
   ``shared/data/heterogeneous``) and 200 of its jobs (Gavel's curves per
   type), decision after decision as in 2, the pool following the trace's
   idle nodes (a few to ~1,700 nodes) and, apart, at 4,654 idle. Each
   decision is solved by the shipped exact path (``allocate``: a node price
   per type, reduced-cost fixing, an exact search over the jobs torn between
   types), by HiGHS on the whole model (SciPy's ``milp``, one binary per job,
   type and count) and by CBC (python-mip 1.15, the aggregated MILP), same
   instances, value tables included in every time. Printed: p50, p99 and max
   of each, side by side (the shipped path's also in this process's CPU time,
   which the machine's other load does not inflate), and whether each reached
   the shipped path's optimum.
   Target: p99 and max under 100 ms for the shipped path.

Every figure is measured in this run with ``time.perf_counter``; the script
prints ratios and leaves the verdicts to the reader.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_allocator.py [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import gc
import os
import platform
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pilotfill.allocator import Allocation, Job, NodePool, Problem, ScalingCurve, allocate, milp

REPO = Path(__file__).resolve().parents[1]
DEFAULT_JOBS = REPO.parent / "shared" / "data" / "jobs-imagenet-1001.csv"
T_FWD = 10.0
SUMMIT_NODES = 4734
SUMMIT_PEAK_IDLE = 4654


@dataclass(frozen=True)
class JobSpec:
    """One row of the shared job file."""

    name: str
    min_nodes: int
    max_nodes: int
    total_samples: float
    scale_up_cost_s: float
    scale_down_cost_s: float
    curve: ScalingCurve


def read_jobs(path: Path) -> list[JobSpec]:
    """Rows of a jobs CSV; ``nodes`` and ``samples_per_s`` are ';'-separated curve points."""
    specs = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            nodes = tuple(int(x) for x in row["nodes"].split(";"))
            rates = tuple(float(x) for x in row["samples_per_s"].split(";"))
            specs.append(
                JobSpec(
                    name=row["name"],
                    min_nodes=int(row["min_nodes"]),
                    max_nodes=int(row["max_nodes"]),
                    total_samples=float(row["total_samples"]),
                    scale_up_cost_s=float(row["scale_up_cost_s"]),
                    scale_down_cost_s=float(row["scale_down_cost_s"]),
                    curve=ScalingCurve(nodes, rates),
                )
            )
    return specs


def make_job(spec: JobSpec, job_id: str, remaining: float) -> Job:
    return Job(
        id=job_id,
        min_nodes=spec.min_nodes,
        max_nodes=spec.max_nodes,
        throughput=spec.curve,
        scale_up_cost_s=spec.scale_up_cost_s,
        scale_down_cost_s=spec.scale_down_cost_s,
        remaining_samples=remaining,
    )


def random_current(rng: random.Random, jobs: list[Job], nodes: list[str], p_running: float = 0.7) -> dict[str, frozenset[str]]:
    """Who holds what now: each job runs with probability p_running at a size within its bounds."""
    free = list(nodes)
    rng.shuffle(free)
    current = {}
    for job in jobs:
        if rng.random() > p_running:
            continue
        n = rng.randint(job.min_nodes, job.max_nodes)
        if n <= len(free):
            current[job.id] = frozenset(free[:n])
            del free[:n]
    return current


def instance(rng: random.Random, specs: list[JobSpec], n_jobs: int, n_nodes: int) -> Problem:
    picked = rng.sample(specs, n_jobs)
    jobs = [make_job(s, f"{s.name}", s.total_samples * rng.uniform(0.05, 1.0)) for s in picked]
    nodes = [f"node{i:05d}" for i in range(n_nodes)]
    return Problem(tuple(jobs), NodePool(tuple(nodes)), random_current(rng, jobs, nodes), T_FWD)


def quiet_solver(enabled: bool = True):
    """CBC's own stdout (e.g. "Coin0505I …") off the benchmark's table; the allocator's helper does it."""
    return milp.quiet_solver() if enabled else contextlib.nullcontext()


QUIET = True


def timed(problem: Problem, formulation: str, time_limit_s: float, repeats: int = 1) -> tuple[Allocation, float]:
    """The answer and the median wall time in ms over ``repeats`` solves (solver chatter silenced outside the timing)."""
    times, answer = [], None
    with quiet_solver(QUIET):
        for _ in range(repeats):
            t0 = time.perf_counter()
            answer = allocate(problem, formulation, time_limit_s=time_limit_s, clock=time.thread_time)  # the controller's clock
            times.append((time.perf_counter() - t0) * 1e3)
    return answer, statistics.median(times)


def migrations(problem: Problem, a: Allocation) -> int:
    added, removed = a.added(problem.current), a.removed(problem.current)
    return sum(1 for j in problem.jobs if added.get(j.id) and removed.get(j.id))


def same(x: float, y: float, rel: float = 1e-6) -> bool:
    return abs(x - y) <= rel * max(1.0, abs(x), abs(y))


def compare_formulations(specs: list[JobSpec], sizes: list[int], seeds: int, nl_limit_s: float) -> None:
    print(f"== 10 jobs: DP vs aggregated MILP vs node-level MILP ({seeds} seeded instance(s) per size, node-level limit {nl_limit_s:g} s)")
    print("   DP and MILP: median of 5 and 3 solves; node-level: one solve. 'match': all three objectives equal (rel 1e-6).")
    header = f"{'nodes':>5} {'seed':>4} {'DP ms':>8} {'MILP ms':>8} {'NL ms':>9} {'NL/DP':>8} {'NL/MILP':>8} {'NL optimal':>10} {'match':>6} {'migr':>4}"
    print(header)
    print("-" * len(header))
    summary = {}
    for n_nodes in sizes:
        ratios_dp, ratios_milp, matched, proven = [], [], 0, 0
        for seed in range(seeds):
            rng = random.Random(1000 * n_nodes + seed)
            p = instance(rng, specs, 10, n_nodes)
            dp_a, dp_ms = timed(p, "aggregated", 60.0, repeats=5)
            mi_a, mi_ms = timed(p, "milp", 60.0, repeats=3)
            nl_a, nl_ms = timed(p, "node-level", nl_limit_s)
            ok = nl_a.method == "node-level" and nl_a.optimal
            match = same(dp_a.objective, nl_a.objective) and same(mi_a.objective, nl_a.objective)
            proven += ok
            matched += ok and match
            ratios_dp.append(nl_ms / dp_ms)
            ratios_milp.append(nl_ms / mi_ms)
            migr = migrations(p, dp_a) + migrations(p, mi_a) + migrations(p, nl_a)
            shown = ("yes" if match else "NO") if ok else "n/a"
            print(
                f"{n_nodes:>5} {seed:>4} {dp_ms:>8.2f} {mi_ms:>8.2f} {nl_ms:>9.1f} {nl_ms / dp_ms:>8.0f} {nl_ms / mi_ms:>8.1f}"
                f" {str(ok):>10} {shown:>6} {migr:>4}"
            )
        summary[n_nodes] = (ratios_dp, ratios_milp, matched, proven)
    print()
    print(f"{'nodes':>5} {'NL/DP min':>10} {'NL/DP median':>13} {'NL/MILP min':>12} {'NL/MILP median':>15} {'matched/proven':>15}")
    for n_nodes, (rd, rm, matched, proven) in summary.items():
        print(f"{n_nodes:>5} {min(rd):>10.0f} {statistics.median(rd):>13.0f} {min(rm):>12.1f} {statistics.median(rm):>15.1f} {matched:>7}/{proven:<7}")
    if 128 in summary:
        rd = summary[128][0]
        print(f"10 x 128: node-level/DP median {statistics.median(rd):.0f}x, min {min(rd):.0f}x; "
              f"min ratio / 40x target = {min(rd) / 40:.1f}")
    print()


def evolving_machine(specs: list[JobSpec], n_jobs: int, n_idle: int, solves: int, seed: int) -> None:
    print(f"== {n_jobs} jobs on {n_idle} nodes: {solves} successive aggregated solves (answer -> next current map, pool perturbed)")
    rng = random.Random(seed)
    machine = [f"node{i:05d}" for i in range(SUMMIT_NODES)]
    idle = set(rng.sample(machine, n_idle))
    next_spec = iter(rng.sample(specs, len(specs)) * 10)
    serial = 0

    def new_job() -> Job:
        nonlocal serial
        s = next(next_spec)
        serial += 1
        return make_job(s, f"{s.name}#{serial}", s.total_samples * rng.uniform(0.05, 1.0))

    jobs = [new_job() for _ in range(n_jobs)]
    current = random_current(rng, jobs, sorted(idle), p_running=0.5)
    times, cpu, build_times, methods, changed, migr, sizes = [], [], [], {}, [], 0, []
    for _ in range(solves):
        pool_nodes = tuple(sorted(idle))
        t0 = time.perf_counter()
        p = Problem(tuple(jobs), NodePool(pool_nodes), current, T_FWD)
        t1, c1 = time.perf_counter(), time.process_time()
        a = allocate(p, clock=time.thread_time)  # as the controller asks
        t2 = time.perf_counter()
        cpu.append((time.process_time() - c1) * 1e3)
        build_times.append((t1 - t0) * 1e3)
        times.append((t2 - t1) * 1e3)
        methods[a.method] = methods.get(a.method, 0) + 1
        migr += migrations(p, a)
        changed.append(sum(1 for j in jobs if len(a.assignment[j.id]) != len(current.get(j.id, ()))))
        sizes.append(len(pool_nodes))
        # Jobs progress for T_fwd at their new size; finished ones leave and new ones arrive.
        survivors = []
        for j in jobs:
            done = j.throughput[next(iter(j.throughput))].at(a.counts[j.id]) * T_FWD
            if j.remaining_samples - done > 0:
                survivors.append(Job(j.id, j.min_nodes, j.max_nodes, j.throughput, j.scale_up_cost_s, j.scale_down_cost_s, j.remaining_samples - done))
        arrivals = [new_job() for _ in range(n_jobs - len(survivors))]
        alive = {j.id for j in survivors}
        current = {j: frozenset(ns) for j, ns in a.assignment.items() if ns and j in alive}
        jobs = survivors + arrivals
        # The main scheduler takes back some idle nodes and frees as many others.
        k = rng.randint(0, 60)
        taken = set(rng.sample(sorted(idle), k))
        freed = set(rng.sample(sorted(set(machine) - idle), min(k, SUMMIT_NODES - len(idle))))
        idle = (idle - taken) | freed
        current = {j: ns - taken for j, ns in current.items() if ns - taken}
    arr = np.array(times)
    p50, p99, worst = np.percentile(arr, 50), np.percentile(arr, 99), arr.max()
    print(f"   pool size {min(sizes)}..{max(sizes)}; methods {methods}; jobs resized per event: median {statistics.median(changed):.0f};"
          f" migrations {migr}")
    print(f"   allocate():       p50 {p50:7.1f} ms   p99 {p99:7.1f} ms   max {worst:7.1f} ms   mean {arr.mean():7.1f} ms")
    print(f"   allocate(), CPU:  p50 {np.percentile(cpu, 50):7.1f} ms   p99 {np.percentile(cpu, 99):7.1f} ms   max {max(cpu):7.1f} ms"
          "   (this process's: the machine's other load does not add to it)")
    print(f"   Problem(...) build: p50 {np.percentile(build_times, 50):5.1f} ms (validation, not timed above)")
    print(f"   p99 / 100 ms = {p99 / 100:.2f}   (max / 100 ms = {worst / 100:.2f})")
    print()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer instances and solves (about a minute)")
    ap.add_argument("--jobs-csv", type=Path, default=DEFAULT_JOBS, help=f"job file (default {DEFAULT_JOBS})")
    ap.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[32, 64, 128], help="node counts for the 10-job comparison")
    ap.add_argument("--seeds", type=int, default=None, help="instances per size (default 5, quick 2)")
    ap.add_argument("--solves", type=int, default=None, help="successive solves at machine scale (default 100, quick 30)")
    ap.add_argument("--node-level-limit", type=float, default=300.0, help="node-level time limit per solve, s")
    ap.add_argument("--solver-output", action="store_true", help="let CBC print its messages")
    ap.add_argument("--typed-only", action="store_true", help="only section 3 (several kinds of node)")
    ap.add_argument("--typed-solves", type=int, default=None, help="decisions per pool in section 3 (default 60, quick 15)")
    ap.add_argument("--milp-limit", type=float, default=2.0, help="HiGHS and CBC time limit per decision in section 3, s")
    args = ap.parse_args(argv)
    global QUIET
    QUIET = not args.solver_output
    seeds = args.seeds or (2 if args.quick else 5)
    solves = args.solves or (30 if args.quick else 100)

    import mip

    print(f"python {platform.python_version()}, numpy {np.__version__}, mip {mip.__version__}, "
          f"{os.cpu_count()} CPU(s), {platform.machine()} {platform.system()}")
    specs = read_jobs(args.jobs_csv)
    print(f"{len(specs)} jobs from {args.jobs_csv}")
    # Warm up: the first CBC call loads its library; not part of any figure.
    timed(instance(random.Random(0), specs, 10, 16), "milp", 60.0)
    timed(instance(random.Random(0), specs, 10, 16), "node-level", 60.0)
    print()
    if not args.typed_only:
        compare_formulations(specs, args.sizes, seeds, args.node_level_limit)
    if not args.typed_only:
        evolving_machine(specs, 200, SUMMIT_PEAK_IDLE, solves, seed=2021)
        evolving_machine(specs, 1000, SUMMIT_PEAK_IDLE, max(10, solves // 3), seed=2021)
        core_vs_dense(specs, [200, 500, 1000], SUMMIT_PEAK_IDLE, seeds)
    typed_machine(args.typed_solves or (15 if args.quick else 60), args.milp_limit)
    return 0


def typed_machine(solves: int, milp_limit_s: float) -> None:
    """Section 3: the typed Summit, 200 jobs, the shipped typed solver against HiGHS and CBC on the same decisions."""
    from pilotfill.allocator import objective_of, typed
    from pilotfill.allocator.values import value_tables
    from pilotfill.traces import read_jobs as read_job_file
    from pilotfill.traces import read_trace

    folder = REPO.parent / "shared" / "data" / "heterogeneous"
    hetero = read_job_file(folder / "jobs-hetero-train.csv")
    trace = read_trace(REPO.parent / "shared" / "data" / "summit-2021-02-10-week.csv.gz", types=folder / "node-types-summit.csv")
    print(f"== 200 jobs on the typed Summit ({len(trace.nodes)} nodes, {trace.type_counts()}): {solves} successive decisions per pool;"
          f" HiGHS and CBC limited to {milp_limit_s:g} s each")  # fmt: skip
    gc.freeze()  # as the controller does with what it holds for good: a full collection of it is not a solver's time
    for label, follow in (("pool: the trace's idle nodes", True), (f"pool: {SUMMIT_PEAK_IDLE} idle", False)):
        rng = random.Random(2021)
        idle = set(trace.initial_idle) if follow else set(rng.sample(trace.nodes, SUMMIT_PEAK_IDLE))
        steps = iter(trace.steps)
        serial = 0

        def new_job() -> Job:
            nonlocal serial
            s = rng.choice(hetero)
            serial += 1
            return Job(f"{s.name}#{serial}", s.min_nodes, s.max_nodes, dict(s.curves), s.scale_up_cost_s, s.scale_down_cost_s,
                       s.total_samples * rng.uniform(0.05, 1.0), restart_cost_s=45.0)  # fmt: skip

        jobs = [new_job() for _ in range(200)]
        current: dict[str, frozenset[str]] = {}
        times: dict[str, list[float]] = {"shipped": [], "shipped CPU": [], "highs": [], "cbc": []}
        reached = {"highs": 0, "cbc": 0}
        limited = {"highs": 0, "cbc": 0}
        sizes, methods = [], {}
        for _ in range(solves):
            nodes = tuple(sorted(idle))
            p = Problem(tuple(jobs), NodePool(nodes, {v: trace.types[v] for v in nodes}), current, 600.0)
            t0, c0 = time.perf_counter(), time.process_time()
            a = allocate(p, clock=time.thread_time)  # as the controller asks: its time limit on this thread's CPU time
            times["shipped"].append((time.perf_counter() - t0) * 1e3)
            times["shipped CPU"].append((time.process_time() - c0) * 1e3)  # this process's CPU: what the load beside it does not add
            methods[a.method] = methods.get(a.method, 0) + 1
            t0 = time.perf_counter()
            tables = value_tables(p)
            by_type = p.pool.by_type()
            caps = {t: len(by_type.get(t, ())) for t in trace.type_counts()}
            _, value, proven = typed.solve_milp([{x.node_type: x.values for x in ts} for ts in tables], caps, milp_limit_s)
            times["highs"].append((time.perf_counter() - t0) * 1e3)
            limited["highs"] += not proven
            reached["highs"] += same(value, a.objective)
            with quiet_solver(QUIET):
                t0 = time.perf_counter()
                r = milp.solve(p, milp_limit_s)
                times["cbc"].append((time.perf_counter() - t0) * 1e3)
            limited["cbc"] += not r.optimal
            reached["cbc"] += r.counts is not None and same(objective_of(p, r.counts, r.types), a.objective)
            sizes.append(len(nodes))
            # Jobs progress over the horizon at their new size; finished ones leave, new ones arrive; the pool moves.
            survivors = []
            for j in jobs:
                n, t = a.counts[j.id], a.node_type[j.id]
                done = j.throughput[t].at(n) * 600.0 if n else 0.0
                if j.remaining_samples - done > 0:
                    survivors.append(Job(j.id, j.min_nodes, j.max_nodes, j.throughput, j.scale_up_cost_s, j.scale_down_cost_s, j.remaining_samples - done,
                                         restart_cost_s=45.0))  # fmt: skip
            alive = {j.id for j in survivors}
            current = {j: frozenset(ns) for j, ns in a.assignment.items() if ns and j in alive}
            jobs = survivors + [new_job() for _ in range(200 - len(survivors))]
            if follow:
                for _ in range(25):
                    step = next(steps, None)
                    if step is None:
                        break
                    idle = (idle - set(step.to_busy)) | set(step.to_idle)
            else:
                k = rng.randint(0, 60)
                taken = set(rng.sample(sorted(idle), k))
                idle = (idle - taken) | set(rng.sample(sorted(set(trace.nodes) - idle), k))
            current = {j: ns & idle for j, ns in current.items() if ns & idle}
        print(f"   {label}: {min(sizes)}..{max(sizes)} nodes; shipped methods {methods}")
        print(f"   {'solver':<28} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'same optimum':>13} {'hit its limit':>14}")
        for name, title in (("shipped", "shipped (typed, exact): wall"), ("shipped CPU", "shipped: CPU"), ("highs", "HiGHS, whole model"),
                            ("cbc", "CBC, aggregated MILP")):  # fmt: skip
            arr = np.array(times[name])
            agree = "—" if name.startswith("shipped") else f"{reached[name]}/{solves}"
            limit = "—" if name.startswith("shipped") else f"{limited[name]}/{solves}"
            print(f"   {title:<28} {np.percentile(arr, 50):>8.1f} {np.percentile(arr, 99):>8.1f} {arr.max():>8.1f} {agree:>13} {limit:>14}")
        worst, cpu = np.array(times["shipped"]), np.array(times["shipped CPU"])
        print(f"   shipped: p99 / 100 ms = {np.percentile(worst, 99) / 100:.2f}, max / 100 ms = {worst.max() / 100:.2f}"
              f" (CPU: {np.percentile(cpu, 99) / 100:.2f}, {cpu.max() / 100:.2f})")
    print()


def core_vs_dense(specs: list[JobSpec], job_counts: list[int], n_nodes: int, seeds: int) -> None:
    """The exact solver the allocator ships (Lagrangian bound, reduced-cost fixing, DP on the core) against the
    plain DP over the whole capacity axis, on the same value tables: same optimum, and how much faster."""
    from pilotfill.allocator import dp
    from pilotfill.allocator.values import value_tables

    print(f"== exact solvers on {n_nodes} nodes: core DP (shipped) vs plain DP, same tables ({seeds} instance(s) per size)")
    print(f"{'jobs':>6} {'core ms':>9} {'plain ms':>9} {'plain/core':>11} {'same optimum':>13}")
    for n_jobs in job_counts:
        core_ms, plain_ms, same_opt = [], [], 0
        for seed in range(seeds):
            p = instance(random.Random(seed), specs, n_jobs, n_nodes)
            tables = [ts[0].values for ts in value_tables(p)]
            t0 = time.perf_counter()
            _, best_core = dp.solve(tables, n_nodes)
            t1 = time.perf_counter()
            _, best_plain = dp.dense(tables, n_nodes)
            t2 = time.perf_counter()
            core_ms.append((t1 - t0) * 1e3)
            plain_ms.append((t2 - t1) * 1e3)
            same_opt += same(best_core, best_plain)
        c, d = statistics.median(core_ms), statistics.median(plain_ms)
        print(f"{n_jobs:>6} {c:>9.1f} {d:>9.1f} {d / c:>11.1f} {same_opt:>7}/{seeds:<5}")
    print()


if __name__ == "__main__":
    sys.exit(main())
