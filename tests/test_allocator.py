"""Behaviour tests for ``pilotfill.allocator``.

Nothing here compares against a stored answer: every check is either a
property every allocation must have (bounds, capacity, no node to two jobs, no
migration), an agreement between independent methods (DP, aggregated MILP,
BFTrainer's node-level MILP, brute force, an independent re-implementation of
the objective), or a decision on a small instance built so that the right
answer follows from the arithmetic written next to it.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random

import numpy as np
import pytest

from pilotfill.allocator import (
    DEFAULT_TYPE,
    Allocation,
    Job,
    NodePool,
    Problem,
    ProblemError,
    Profiler,
    ScalingCurve,
    allocate,
    objective_of,
)
from pilotfill.allocator import milp as milp_module
from pilotfill.allocator import nodelevel as nodelevel_module
from pilotfill.allocator import typed as typed_module
from pilotfill.allocator.profiler import EXPLORE_RATE, PROBE_RATE

pytestmark = pytest.mark.unit

POINTS = (0, 1, 2, 4, 8, 16, 32, 64)
"""Node counts at which the shared job files measure every curve."""

EXACT = ("aggregated", "milp", "node-level")


# --------------------------------------------------------------------------- helpers


def amdahl_curve(rng: random.Random, points=POINTS) -> ScalingCurve:
    """A curve shaped like the shared data: rate r1·n / (1 + f·(n−1)), sublinear, 0 at 0."""
    r1 = rng.uniform(900.0, 7200.0)
    f = rng.uniform(0.0, 0.03)
    return ScalingCurve(points, tuple(0.0 if n == 0 else r1 * n / (1.0 + f * (n - 1)) for n in points))


def linear(rate_per_node: float, upto: int = 64) -> ScalingCurve:
    return ScalingCurve((0, upto), (0.0, rate_per_node * upto))


def pool_of(n: int, prefix: str = "n", node_type: str | None = None) -> NodePool:
    nodes = tuple(f"{prefix}{i:05d}" for i in range(n))
    return NodePool(nodes, {v: node_type for v in nodes} if node_type else {})


def random_current(rng: random.Random, jobs, pool: NodePool, p_running: float = 0.7, respect_min: bool = True) -> dict[str, frozenset[str]]:
    """A map of who holds what now: each job runs with probability p_running, on one of its types."""
    free = {t: list(ns) for t, ns in pool.by_type().items()}
    for ns in free.values():
        rng.shuffle(ns)
    current = {}
    for job in jobs:
        if rng.random() > p_running:
            continue
        t = rng.choice(job.node_types)
        lo = job.min_nodes if respect_min else 1
        n = rng.randint(lo, job.max_nodes)
        if n > len(free.get(t, [])):
            continue
        current[job.id] = frozenset(free[t][:n])
        del free[t][:n]
    return current


def random_problem(rng: random.Random, n_jobs: int, n_nodes: int, extras: bool = False, data_bounds: bool = False) -> Problem:
    """Jobs shaped like the shared data (curves on 0;1;2;4;…;64, rescale costs of 10–20 s).

    ``data_bounds``: every job on 1…64 nodes, as in the shared job files; otherwise
    bounds vary. ``extras`` adds what the data does not exercise: min > 1, weights,
    a speedup objective, finite remaining work, and current counts below a job's minimum.
    """
    jobs = []
    for i in range(n_jobs):
        lo = 1 if data_bounds else rng.choice([1, 1, 1, 2, 3, 4])
        hi = 64 if data_bounds else rng.choice([lo, rng.randint(lo, 16), 64])
        kw = {}
        curve = amdahl_curve(rng)
        if extras and rng.random() < 0.2:  # a curve that claims a rate at 0 nodes: not running still earns nothing
            curve = ScalingCurve(curve.nodes, (rng.uniform(1.0, 500.0),) + curve.values[1:])
        if extras:
            if rng.random() < 0.3:
                kw["weight"] = rng.uniform(0.2, 3.0)
            if rng.random() < 0.3:
                kw["remaining_samples"] = rng.uniform(0.0, 3e5)
            if rng.random() < 0.3:
                kw["objective"] = curve.speedup()
        jobs.append(Job(f"j{i}", lo, hi, curve, rng.uniform(10.0, 20.0), rng.uniform(8.0, 14.0), **kw))
    pool = pool_of(n_nodes)
    current = random_current(rng, jobs, pool, respect_min=not extras)
    return Problem(tuple(jobs), pool, current, rng.choice([10.0, 10.0, 30.0, 120.0]) if extras else 10.0)


def standing_still(problem: Problem) -> tuple[dict[str, int], dict[str, str | None]] | None:
    """Every job keeps exactly what it holds, when that is a valid allocation."""
    counts, types = {}, {}
    for job in problem.jobs:
        held = problem.current.get(job.id, frozenset())
        kinds = {problem.pool.type_of(v) for v in held}
        if not held:
            counts[job.id], types[job.id] = 0, None
            continue
        if len(kinds) != 1 or not (job.min_nodes <= len(held) <= job.max_nodes) or next(iter(kinds)) not in job.node_types:
            return None
        counts[job.id], types[job.id] = len(held), next(iter(kinds))
    return counts, types


def assert_feasible(problem: Problem, alloc: Allocation) -> None:
    """Every property an answer must have, whichever method produced it."""
    pool = set(problem.pool.nodes)
    ids = {j.id for j in problem.jobs}
    assert set(alloc.counts) == ids, "every job gets a count"
    owner: dict[str, str] = {}
    for job in problem.jobs:
        n = alloc.counts[job.id]
        assert n == 0 or job.min_nodes <= n <= job.max_nodes, f"{job.id}: {n} outside 0 ∪ [{job.min_nodes}, {job.max_nodes}]"
        nodes = tuple(alloc.assignment.get(job.id, ()))
        assert len(nodes) == n and len(set(nodes)) == n, f"{job.id}: count {n} but nodes {nodes}"
        assert set(nodes) <= pool, f"{job.id}: nodes outside the pool"
        t = alloc.node_type.get(job.id)
        if n == 0:
            assert t is None
        else:
            assert t in job.node_types, f"{job.id}: runs on {t!r}, can use {job.node_types}"
            assert {problem.pool.type_of(v) for v in nodes} == {t}, f"{job.id}: nodes of several types or the wrong one"
        for v in nodes:
            assert v not in owner, f"node {v} given to {owner[v]} and {job.id}"
            owner[v] = job.id
    assert sum(alloc.counts.values()) <= len(problem.pool.nodes)
    added, removed = alloc.added(problem.current), alloc.removed(problem.current)
    for job in problem.jobs:
        held = problem.current.get(job.id, frozenset())
        moved = (
            added.get(job.id) and set(removed.get(job.id, ())) == set(held)
            and not {problem.pool.type_of(v) for v in held} & {problem.pool.type_of(v) for v in added[job.id]}
        )  # fmt: skip
        assert moved or not (added.get(job.id) and removed.get(job.id)), (
            f"migration: {job.id} adds {added.get(job.id)} and drops {removed.get(job.id)} in one decision (a move to another type drops all)"
        )
    assert math.isfinite(alloc.objective)
    assert alloc.objective == pytest.approx(objective_of(problem, alloc.counts, alloc.node_type), rel=1e-9, abs=1e-6)


def same(a: float, b: float, rel: float = 1e-6) -> bool:
    return abs(a - b) <= rel * max(1.0, abs(a), abs(b))


def reference_value(job: Job, held: int, n: int, t_fwd: float) -> float:
    """BFTrainer's per-job objective, written again from DESIGN and values.py's docstring (one node type).

    w · ( M(n)·min(T_fwd, R / S(max(n, c')))  −  [n > c]·up·M(c)  −  [n < c]·down·M(c) ),
    with M the metric, S the throughput, c the current count, M(c) = 0 when c is
    not a valid size, and nothing earned at 0 nodes; −inf for 0 < n < min or n > max;
    R the remaining work, but never less than T_fwd·S(min) (a job that has not
    returned is worth its minimum size at least), c' the current count (0 if
    the job does not run validly): shrunk, a job still needs as long as at its size now.
    """
    if 0 < n < job.min_nodes or n > job.max_nodes:
        return -math.inf
    thr = job.throughput[DEFAULT_TYPE]
    metric = (job.objective or job.throughput)[DEFAULT_TYPE]
    rate_now = metric.at(held) if job.min_nodes <= held <= job.max_nodes else 0.0
    gain = 0.0
    if n > 0:
        s = thr.at(n)
        remaining = max(job.remaining_samples, t_fwd * thr.at(job.min_nodes))
        ref = thr.at(max(n, held if held >= job.min_nodes else 0))  # shrunk, it still needs as long as at its size now
        busy = t_fwd if (math.isinf(remaining) or ref <= 0) else min(t_fwd, remaining / ref)
        gain = metric.at(n) * busy
    loss = job.scale_up_cost_s * rate_now if n > held else job.scale_down_cost_s * rate_now if n < held else 0.0
    return job.weight * (gain - loss)


def counts_of(alloc: Allocation) -> dict[str, int]:
    return dict(alloc.counts)


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: ScalingCurve((1, 2, 4), (1.0, 2.0, 4.0)), r"start at 0 nodes, starts at 1"),
        (lambda: ScalingCurve((0,), (0.0,)), r"at least two points"),
        (lambda: ScalingCurve((0, 1, 2), (0.0, 1.0)), r"3 node counts but 2 values"),
        (lambda: ScalingCurve((0, 2, 2), (0.0, 1.0, 2.0)), r"increase strictly"),
        (lambda: ScalingCurve((0, 4, 2), (0.0, 1.0, 2.0)), r"increase strictly"),
        (lambda: ScalingCurve((0, 1), (0.0, -1.0)), r"finite and non-negative"),
        (lambda: ScalingCurve((0, 1), (0.0, math.nan)), r"finite and non-negative"),
        (lambda: ScalingCurve((0, 1), (0.0, math.inf)), r"finite and non-negative"),
    ],
)
def test_bad_curves_are_refused_with_a_reason(make, message):
    with pytest.raises(ProblemError, match=message):
        make()


def test_problem_error_is_a_value_error():
    assert issubclass(ProblemError, ValueError)


GOOD = ScalingCurve((0, 1, 8), (0.0, 100.0, 500.0))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(min_nodes=5, max_nodes=2), r"job 'bad'.*min_nodes 5 > max_nodes 2"),
        (dict(min_nodes=0, max_nodes=2), r"job 'bad'.*min_nodes must be at least 1, got 0"),
        (dict(min_nodes=1.5, max_nodes=2), r"job 'bad'.*integers"),
        (dict(throughput={}), r"job 'bad'.*at least one node type"),
        (dict(throughput={"gpuA": "fast"}), r"node type 'gpuA' is a str, not a ScalingCurve"),
        (dict(scale_up_cost_s=-1.0), r"job 'bad'.*scale_up_cost_s must be finite and >= 0"),
        (dict(scale_down_cost_s=math.inf), r"job 'bad'.*scale_down_cost_s"),
        (dict(remaining_samples=-5.0), r"job 'bad'.*remaining_samples"),
        (dict(remaining_samples=math.nan), r"job 'bad'.*remaining_samples"),
        (dict(weight=0.0), r"job 'bad'.*weight must be finite and > 0"),
        (dict(throughput={"gpuA": GOOD, "gpuB": GOOD}, objective={"gpuA": GOOD}), r"job 'bad'.*same node types"),
    ],
)
def test_bad_jobs_are_refused_with_a_reason(kwargs, message):
    args = dict(id="bad", min_nodes=1, max_nodes=4, throughput=GOOD) | kwargs
    with pytest.raises(ProblemError, match=message):
        Job(**args)


def test_job_accepts_a_plain_curve_as_the_default_type():
    job = Job("ok", 1, 4, GOOD, objective=GOOD.speedup())
    assert job.node_types == (DEFAULT_TYPE,)
    assert job.metric(DEFAULT_TYPE).at(8) == pytest.approx(5.0)


def test_bad_pools_are_refused_with_a_reason():
    with pytest.raises(ProblemError, match="node twice"):
        NodePool(("a", "b", "a"))
    with pytest.raises(ProblemError, match=r"not in the pool: \['zz'\]"):
        NodePool(("a", "b"), {"a": "gpuA", "zz": "gpuB"})


def test_bad_problems_are_refused_with_a_reason():
    a, b = Job("a", 1, 4, GOOD), Job("b", 1, 4, GOOD)
    pool = NodePool(("n1", "n2", "n3"))
    with pytest.raises(ProblemError, match="share an id"):
        Problem((a, Job("a", 1, 2, GOOD)), pool)
    with pytest.raises(ProblemError, match="unknown job 'ghost'"):
        Problem((a, b), pool, {"ghost": frozenset({"n1"})})
    with pytest.raises(ProblemError, match=r"job 'a' holds nodes not in the pool: \['n9'\]"):
        Problem((a, b), pool, {"a": frozenset({"n1", "n9"})})
    with pytest.raises(ProblemError, match=r"held by two jobs: \['n2'\]"):
        Problem((a, b), pool, {"a": frozenset({"n1", "n2"}), "b": frozenset({"n2", "n3"})})
    for t_fwd in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ProblemError, match="t_fwd"):
            Problem((a, b), pool, {}, t_fwd)


def test_curve_interpolates_linearly_and_is_flat_past_its_last_point():
    c = ScalingCurve((0, 2, 4), (0.0, 10.0, 14.0))
    assert c.at(1) == pytest.approx(5.0)
    assert c.at(3) == pytest.approx(12.0)
    assert c.at(100) == pytest.approx(14.0)
    assert list(c.table(5)) == pytest.approx([0, 5, 10, 12, 14, 14])
    again = ScalingCurve.from_table(c.table(4))
    assert again.nodes == (0, 2, 4)  # collinear points dropped, corners kept


# --------------------------------------------------------------------------- the objective


def random_running_problem(rng: random.Random, kinds: list[str], most_nodes: int, most_jobs: int, typed: bool = True, torn: bool = False) -> Problem:
    """A small problem of jobs with random curves, costs and work, some holding nodes: each on one type it can use, or
    (``torn``) on nodes of any type, up to one past its maximum. ``typed`` False: one kind of node."""
    nodes = [f"n{i}" for i in range(rng.randint(2, most_nodes))]
    node_type = {n: rng.choice(kinds) for n in nodes} if typed else {}
    free = list(nodes)
    rng.shuffle(free)
    jobs, current = [], {}
    for k in range(rng.randint(1, most_jobs)):
        lo = rng.randint(1, 3)
        hi = rng.randint(lo, 8)
        usable = rng.sample(kinds, rng.randint(1, len(kinds))) if typed else [DEFAULT_TYPE]
        curves = {t: ScalingCurve((0, 1, hi + 1), (0.0, rng.uniform(1, 10), rng.uniform(10, 60))) for t in usable}
        job = Job(f"j{k}", lo, hi, curves, scale_up_cost_s=rng.uniform(0, 5), scale_down_cost_s=rng.uniform(0, 5), restart_cost_s=rng.uniform(0, 9),
                  remaining_samples=rng.choice([math.inf, rng.uniform(10, 5000)]), weight=rng.uniform(0.5, 2))  # fmt: skip
        if torn:
            mine = [n for n in free if rng.random() < 0.7][: rng.randint(0, hi + 1)]
        else:
            held_type = rng.choice(usable)
            mine = [n for n in free if node_type.get(n, DEFAULT_TYPE) == held_type][: rng.randint(0, hi)]
        if mine:
            current[job.id] = frozenset(mine)
            free = [n for n in free if n not in mine]
        jobs.append(job)
    return Problem(tuple(jobs), NodePool(tuple(nodes), node_type), current, t_fwd=rng.uniform(5, 500))


def test_the_objective_read_from_the_value_matrices_is_the_sum_over_the_tables_on_every_kind_of_node():
    """objective_of on a problem's own tables reads its value matrices (one gather per type); the same answer as
    summing table by table, feasible or not (a count past a job's cap, inside its gap below min_nodes, on a type it
    cannot use), with jobs running on one type and valued on others."""
    from pilotfill.allocator.values import value_tables

    rng = random.Random(5)
    kinds = ["a", "b", "c"]
    for _ in range(30):
        p = random_running_problem(rng, kinds, most_nodes=24, most_jobs=7)
        for _ in range(10):
            counts = {j.id: rng.randint(0, j.max_nodes + 2) for j in p.jobs}
            types = {j.id: (rng.choice(kinds) if counts[j.id] else None) for j in p.jobs}
            want = objective_of(p, counts, types, list(value_tables(p)))  # a copy: summed table by table
            got = objective_of(p, counts, types)
            assert got == want if math.isinf(want) else got == pytest.approx(want, rel=1e-12, abs=1e-9)


def test_each_row_of_the_value_matrices_is_the_jobs_table_made_alone_at_its_rate_now():
    """The matrices are made for all jobs at once, each job's rate now read from its own row: every row is the table
    made for that job alone (``_table``) at :func:`current_rate` (0 below its minimum, above its maximum, or across
    two types), and a job running on another type is charged its stop on every count."""
    from pilotfill.allocator.values import _table, current_rate, value_matrices

    rng = random.Random(11)
    checked = {"valid": 0, "below": 0, "above": 0, "moving": 0}
    for _ in range(60):
        p = random_running_problem(rng, ["a", "b"], most_nodes=30, most_jobs=8, typed=rng.random() < 0.6, torn=True)
        sizes = {t: len(ns) for t, ns in p.pool.by_type().items()}
        for t, (members, matrix) in value_matrices(p).items():
            for i, row in zip(members, matrix):
                job = p.jobs[i]
                held = p.held_by_type(job)
                c = held.get(t, 0)
                cap = min(job.max_nodes, sizes.get(t, 0))
                moving = bool(held) and (len(held) > 1 or t not in held)
                rate = current_rate(job, held)
                want = _table(job, t, cap, c, rate if c and not moving else 0.0, p.t_fwd).values
                if moving:
                    want = want - job.weight * (job.scale_down_cost_s + job.restart_cost_s) * rate
                    checked["moving"] += 1
                elif c:
                    checked["valid" if job.min_nodes <= c <= job.max_nodes else ("below" if c < job.min_nodes else "above")] += 1
                assert len(row) >= len(want) and np.isneginf(row[len(want) :]).all()  # one width for all: −inf past its cap
                row = row[: len(want)]
                finite = np.isfinite(want)
                assert (np.isfinite(row) == finite).all()
                assert row[finite] == pytest.approx(want[finite], rel=1e-12, abs=1e-9)
    assert min(checked.values()) > 0, checked  # every case was met


def test_each_row_of_the_exploration_tables_is_the_jobs_growth_made_alone_at_its_rate_by_the_curve_it_explores():
    """The second stage's tables, made for all jobs at once: each row is what adding 0 … k nodes to the job's base is
    worth in its table made alone (``_table``, by the optimistic curve it explores), at its rate now by that curve —
    0 below its minimum, above its maximum or across two types, and read off the curve where it holds more than the
    row reaches (a base below what it holds)."""
    from pilotfill.allocator.values import _table, exploration_tables

    rng = random.Random(12)
    checked = {"valid": 0, "past the row": 0, "not valid": 0}
    for _ in range(80):
        p = random_running_problem(rng, ["a", "b"], most_nodes=30, most_jobs=8, typed=rng.random() < 0.5, torn=rng.random() < 0.3)
        kinds = sorted({t for j in p.jobs for t in j.node_types})
        t = rng.choice(kinds)
        jobs = [j for j in p.jobs if t in j.node_types]
        if not jobs:
            continue
        jobs = [dataclasses.replace(j, explore={k: ScalingCurve(c.nodes, tuple(v * rng.uniform(1, 2) for v in c.values)) for k, c in j.throughput.items()})
                if rng.random() < 0.6 else j for j in jobs]  # fmt: skip
        p = dataclasses.replace(p, jobs=tuple(jobs) + tuple(j for j in p.jobs if t not in j.node_types))
        bases = [rng.choice([0, rng.randint(j.min_nodes, j.max_nodes)]) for j in jobs]  # what the first stage could give
        free = rng.randint(0, 6)
        got = exploration_tables(p, jobs, t, bases, free)
        for job, base, row in zip(jobs, bases, got):
            held = p.held_by_type(job)
            c = held.get(t, 0)
            curve = job.explore[t] if job.explore else job.metric(t)
            cap = max(base, min(job.max_nodes, base + free))
            valid = c and job.min_nodes <= c <= job.max_nodes and len(held) == 1
            checked["not valid" if c and not valid else "past the row" if valid and c > cap else "valid" if valid else "not valid"] += bool(c)
            alone = dataclasses.replace(job, throughput={t: job.explore[t] if job.explore else job.throughput[t]}, objective=None,
                                        explore=None) if job.explore else job  # fmt: skip
            want = _table(alone, t, cap, c, curve.at(c) if valid else 0.0, p.t_fwd).values
            want = want[base : cap + 1] - want[base]
            want[0] = 0.0
            assert np.isneginf(row[len(want) :]).all()
            row = row[: len(want)]
            finite = np.isfinite(want)
            assert (np.isfinite(row) == finite).all()
            assert row[finite] == pytest.approx(want[finite], rel=1e-12, abs=1e-9)
    assert min(checked.values()) > 0, checked  # every case was met


def test_what_one_node_earns_at_best_is_the_largest_rate_per_node_of_the_curve():
    """How a long queue is ranked (worth_per_node): max over 1…upto of rate(n)/n, remembered per curve and size."""
    sublinear = ScalingCurve((0, 1, 4), (0.0, 10.0, 30.0))
    assert sublinear.best_per_node(4) == pytest.approx(10.0)  # 10, 8.33, 7.78, 7.5
    superlinear = ScalingCurve((0, 1, 4, 8), (0.0, 1.0, 8.0, 12.0))
    assert superlinear.best_per_node(8) == pytest.approx(2.0)  # 8/4 at 4 nodes; 12/8 = 1.5 at 8
    assert superlinear.best_per_node(2) == pytest.approx(max(1.0, (1.0 + 7.0 / 3) / 2))
    assert superlinear.best_per_node(8) is superlinear.best_per_node(8)


def test_an_answer_joined_with_one_for_the_nodes_it_left_free_is_both():
    """The controller offers the nodes a decision leaves free to the waiting jobs it left out, in a problem of their
    own: the two answers, joined, are one allocation of every job, on disjoint nodes, worth what both are worth."""
    curve = ScalingCurve((0, 1, 4), (0.0, 10.0, 30.0))
    first = Problem((Job("a", 1, 4, curve), Job("b", 1, 4, curve)), NodePool(tuple(f"n{i}" for i in range(10))), {"a": frozenset({"n0"})}, t_fwd=100.0)
    one = allocate(first)
    free = tuple(n for n in first.pool.nodes if n not in {v for nodes in one.assignment.values() for v in nodes})
    assert len(free) == 2
    rest = allocate(Problem((Job("c", 1, 4, curve),), NodePool(free), {}, t_fwd=100.0))
    both = one.joined(rest)
    assert dict(both.counts) == {"a": 4, "b": 4, "c": 2}
    assert sorted(n for nodes in both.assignment.values() for n in nodes) == sorted(first.pool.nodes)
    assert set(both.assignment["a"]) >= {"n0"} and set(both.assignment["c"]) == set(free)
    assert both.objective == pytest.approx(one.objective + rest.objective) and both.method == one.method


def test_objective_matches_an_independent_reimplementation():
    """objective_of (the value tables every method optimises) against the formula written out again."""
    rng = random.Random(11)
    for _ in range(40):
        p = random_problem(rng, rng.randint(1, 6), rng.randint(1, 40), extras=True)
        for _ in range(5):
            counts = {j.id: rng.choice([0, j.min_nodes, rng.randint(j.min_nodes, j.max_nodes)]) for j in p.jobs}
            counts = {k: min(v, len(p.pool.nodes)) for k, v in counts.items()}
            types = {k: (DEFAULT_TYPE if v else None) for k, v in counts.items()}
            want = sum(reference_value(j, len(p.current.get(j.id, ())), counts[j.id], p.t_fwd) for j in p.jobs)
            got = objective_of(p, counts, types)
            if math.isinf(want):
                assert got == want
            else:
                assert got == pytest.approx(want, rel=1e-9, abs=1e-6)


# --------------------------------------------------------------------------- exact methods agree


@pytest.mark.slow
@pytest.mark.parametrize("n_nodes", [8, 16, 24, 32])
def test_dp_milp_and_node_level_reach_the_same_feasible_optimum(n_nodes):
    rng = random.Random(1000 + n_nodes)
    for _ in range(15):
        p = random_problem(rng, 10, n_nodes)
        answers = {f: allocate(p, f, time_limit_s=60.0) for f in EXACT}
        assert answers["aggregated"].method == "dp"
        assert answers["milp"].method == "milp" and answers["milp"].optimal
        assert answers["node-level"].method == "node-level" and answers["node-level"].optimal
        for a in answers.values():
            assert_feasible(p, a)
        ref = answers["node-level"].objective
        for f, a in answers.items():
            assert same(a.objective, ref), f"{f}: {a.objective} vs node-level {ref} (counts {a.counts})"
        still = standing_still(p)
        if still is not None:
            assert ref >= objective_of(p, *still) - 1e-6 * abs(ref)


@pytest.mark.slow  # ~12 s of MILPs: make test runs it, make test-fast does not
def test_exact_methods_agree_with_min_sizes_weights_objectives_and_finite_work():
    rng = random.Random(7)
    for _ in range(60):
        p = random_problem(rng, rng.randint(2, 6), rng.randint(1, 16), extras=True)
        answers = {f: allocate(p, f, time_limit_s=60.0) for f in EXACT}
        for a in answers.values():
            assert_feasible(p, a)
        ref = answers["node-level"].objective
        for f, a in answers.items():
            assert same(a.objective, ref), f"{f}: {a.objective} vs node-level {ref}"


def test_dp_is_the_true_optimum_by_brute_force():
    rng = random.Random(3)
    for _ in range(60):
        n_nodes = rng.randint(0, 8)
        p = random_problem(rng, 3, n_nodes, extras=True)
        best = -math.inf
        for cs in itertools.product(range(n_nodes + 1), repeat=3):
            if sum(cs) > n_nodes:
                continue
            if any(c and not (j.min_nodes <= c <= j.max_nodes) for c, j in zip(cs, p.jobs)):
                continue
            counts = {j.id: c for j, c in zip(p.jobs, cs)}
            best = max(best, objective_of(p, counts, {j.id: (DEFAULT_TYPE if c else None) for j, c in zip(p.jobs, cs)}))
        a = allocate(p, "aggregated")
        assert a.method == "dp"
        assert_feasible(p, a)
        assert same(a.objective, best), f"DP {a.objective} vs brute force {best}"


@pytest.mark.parametrize("n_nodes", [8, 10, 11])
def test_nodes_nobody_gains_from_are_left_free(n_nodes):
    # A flat curve past 4 nodes: 5…8 nodes earn exactly what 4 do, so the exact path takes 4.
    # With "other" (4 nodes at most) the capacity binds at 8 and 10, so the DP's own tie rule is used.
    job = Job("flat", 1, 8, ScalingCurve((0, 4, 8), (0.0, 400.0, 400.0)))
    other = Job("other", 1, 4, linear(10.0))
    p = Problem((job, other), pool_of(n_nodes))
    a = allocate(p, "aggregated")
    assert_feasible(p, a)
    assert counts_of(a) == {"flat": 4, "other": 4}


# --------------------------------------------------------------------------- rescale costs


def _almost_optimal_holder(up_cost: float) -> Problem:
    # Holds 4 of 5 nodes. A 5th node adds T_fwd·(401−400) = 10; growing costs up·S(4) = up·400.
    job = Job("j", 1, 5, ScalingCurve((0, 1, 4, 5), (0.0, 100.0, 400.0, 401.0)), scale_up_cost_s=up_cost)
    pool = pool_of(5)
    return Problem((job,), pool, {"j": frozenset(pool.nodes[1:])}, t_fwd=10.0)


@pytest.mark.parametrize("formulation", EXACT)
def test_a_tiny_gain_does_not_pay_for_a_costly_scale_up(formulation):
    p = _almost_optimal_holder(up_cost=0.1)  # loss 40 > gain 10: stay
    a = allocate(p, formulation, time_limit_s=30.0)
    assert_feasible(p, a)
    assert a.counts["j"] == 4
    assert set(a.assignment["j"]) == p.current["j"]
    assert not a.added(p.current) and not a.removed(p.current)


@pytest.mark.parametrize("formulation", EXACT)
def test_a_gain_larger_than_the_scale_up_cost_is_taken(formulation):
    p = _almost_optimal_holder(up_cost=0.01)  # loss 4 < gain 10: grow
    a = allocate(p, formulation, time_limit_s=30.0)
    assert_feasible(p, a)
    assert a.counts["j"] == 5
    assert a.added(p.current) == {"j": (p.pool.nodes[0],)}
    assert not a.removed(p.current)


def _holder_and_newcomer(down_cost: float) -> Problem:
    # A holds all 4 nodes; its 4th is worth T·(301−300) = 10. B would earn T·50 = 500 on one node.
    # Giving B a node: +500 − 10 − down·S_A(4) = 490 − 301·down.
    a = Job("A", 1, 4, ScalingCurve((0, 1, 3, 4), (0.0, 100.0, 300.0, 301.0)), scale_down_cost_s=down_cost)
    b = Job("B", 1, 1, ScalingCurve((0, 1), (0.0, 50.0)))
    pool = pool_of(4)
    return Problem((a, b), pool, {"A": frozenset(pool.nodes)}, t_fwd=10.0)


@pytest.mark.parametrize("formulation", EXACT)
def test_scale_down_cost_decides_whether_a_holder_gives_up_a_node(formulation):
    keep = _holder_and_newcomer(down_cost=2.0)  # 490 − 602 < 0
    a = allocate(keep, formulation, time_limit_s=30.0)
    assert_feasible(keep, a)
    assert counts_of(a) == {"A": 4, "B": 0}
    give = _holder_and_newcomer(down_cost=1.0)  # 490 − 301 > 0
    a = allocate(give, formulation, time_limit_s=30.0)
    assert_feasible(give, a)
    assert counts_of(a) == {"A": 3, "B": 1}
    assert not a.added(give.current).get("A") and len(a.removed(give.current)["A"]) == 1
    assert set(a.assignment["B"]) == set(a.removed(give.current)["A"])


# --------------------------------------------------------------------------- metrics, weights, remaining work


@pytest.mark.parametrize("formulation", EXACT)
def test_weights_change_who_gets_the_nodes(formulation):
    pool = pool_of(4)
    a, b = Job("A", 1, 4, linear(100.0)), Job("B", 1, 4, linear(80.0))
    p = Problem((a, b), pool)
    assert counts_of(allocate(p, formulation, time_limit_s=30.0)) == {"A": 4, "B": 0}
    b_heavy = Job("B", 1, 4, linear(80.0), weight=1.5)  # 1.5·80 = 120 > 100 per node
    p = Problem((a, b_heavy), pool)
    ans = allocate(p, formulation, time_limit_s=30.0)
    assert_feasible(p, ans)
    assert counts_of(ans) == {"A": 0, "B": 4}


@pytest.mark.parametrize("formulation", EXACT)
def test_a_speedup_objective_decides_differently_from_throughput(formulation):
    # A is fast but scales poorly (speedup 3 at 4 nodes), B is slow but linear (speedup 4 at 4).
    # Throughput on 5 nodes: (A,B) = (4,1) → 3000+10 beats (1,4) → 1000+40 and every other split.
    # Speedup: (1,4) → 1+4 = 5 beats (2,3) 4.67, (3,2) 4.33, (4,1) 4.
    ca, cb = ScalingCurve((0, 1, 4), (0.0, 1000.0, 3000.0)), ScalingCurve((0, 1, 4), (0.0, 10.0, 40.0))
    pool = pool_of(5)
    p = Problem((Job("A", 1, 4, ca), Job("B", 1, 4, cb)), pool)
    by_throughput = allocate(p, formulation, time_limit_s=30.0)
    assert counts_of(by_throughput) == {"A": 4, "B": 1}
    q = Problem((Job("A", 1, 4, ca, objective=ca.speedup()), Job("B", 1, 4, cb, objective=cb.speedup())), pool)
    by_speedup = allocate(q, formulation, time_limit_s=30.0)
    assert_feasible(q, by_speedup)
    assert counts_of(by_speedup) == {"A": 1, "B": 4}


@pytest.mark.parametrize("formulation", EXACT)
def test_a_job_near_its_end_is_not_shrunk_for_it(formulation):
    # A (1000/node) holds all 4 nodes with 10,000 samples left: 2.5 s at its size, within T_fwd. It earns only while it
    # runs, but for the time it needs at its size now: shrinking it to one node so that B gets three would value its
    # last samples over a longer run and forget that, finishing sooner, it frees its nodes sooner.
    pool = pool_of(4)
    b = Job("B", 1, 4, linear(100.0))
    p = Problem((Job("A", 1, 4, linear(1000.0)), b), pool, t_fwd=10.0)
    assert counts_of(allocate(p, formulation, time_limit_s=30.0)) == {"A": 4, "B": 0}
    q = Problem((Job("A", 1, 4, linear(1000.0), 1.0, 1.0, remaining_samples=10_000.0), b), pool, {"A": frozenset(pool.nodes)}, t_fwd=10.0)
    ans = allocate(q, formulation, time_limit_s=30.0)
    assert_feasible(q, ans)
    assert counts_of(ans) == {"A": 4, "B": 0}


@pytest.mark.parametrize("n_nodes", [4, 6])
def test_a_job_about_to_finish_is_not_given_extra_nodes(n_nodes):
    # 10,000 samples left at 1,000/s per node: one node finishes it within T_fwd = 10 s.
    job = Job("A", 1, 4, linear(1000.0), remaining_samples=10_000.0)
    other = Job("B", 1, 2, linear(1.0))
    p = Problem((job, other), pool_of(n_nodes), t_fwd=10.0)
    for formulation in ("aggregated", "greedy"):
        a = allocate(p, formulation)
        assert_feasible(p, a)
        assert counts_of(a) == {"A": 1, "B": 2}


# --------------------------------------------------------------------------- heterogeneous node types


def hetero_pool(n_a: int, n_b: int) -> NodePool:
    nodes = tuple(f"a{i:03d}" for i in range(n_a)) + tuple(f"b{i:03d}" for i in range(n_b))
    return NodePool(nodes, {v: ("gpuA" if v[0] == "a" else "gpuB") for v in nodes})


@pytest.mark.parametrize("formulation", ["aggregated", pytest.param("node-level", marks=pytest.mark.slow)])  # node-level: ~10 s of CBC
def test_each_job_runs_on_the_type_that_suits_it(formulation):
    pool = hetero_pool(4, 4)
    x = Job("X", 1, 8, {"gpuA": linear(1000.0), "gpuB": linear(100.0)})
    y = Job("Y", 1, 8, {"gpuA": linear(100.0), "gpuB": linear(1000.0)})
    p = Problem((x, y), pool)
    a = allocate(p, formulation, time_limit_s=30.0)
    if formulation == "aggregated":
        assert a.method.startswith("typed-")  # the exact solver across types, not the MILP
    assert_feasible(p, a)
    assert a.node_type == {"X": "gpuA", "Y": "gpuB"}
    assert counts_of(a) == {"X": 4, "Y": 4}


@pytest.mark.parametrize("formulation", ["aggregated", "node-level"])
def test_a_job_never_spans_two_types_even_when_that_would_give_it_more_nodes(formulation):
    pool = hetero_pool(4, 4)
    x = Job("X", 1, 8, {"gpuA": linear(1000.0), "gpuB": linear(900.0)})  # 4 A: 4000 > 4 B: 3600
    p = Problem((x,), pool)
    a = allocate(p, formulation, time_limit_s=30.0)
    assert_feasible(p, a)
    assert (a.node_type["X"], a.counts["X"]) == ("gpuA", 4)


@pytest.mark.parametrize("formulation", ["aggregated", "node-level"])
def test_the_type_chosen_depends_on_how_many_nodes_of_it_are_free(formulation):
    pool = hetero_pool(2, 6)
    x = Job("X", 1, 8, {"gpuA": linear(1000.0), "gpuB": linear(500.0)})  # 2 A: 2000 < 6 B: 3000
    p = Problem((x,), pool)
    a = allocate(p, formulation, time_limit_s=30.0)
    assert_feasible(p, a)
    assert (a.node_type["X"], a.counts["X"]) == ("gpuB", 6)


def random_hetero_problem(rng: random.Random, multi_type_jobs_hold_nodes: bool) -> Problem:
    pool = hetero_pool(rng.randint(0, 8), rng.randint(1, 8))
    jobs = []
    for i in range(rng.randint(2, 5)):
        types = rng.choice([["gpuA"], ["gpuB"], ["gpuA", "gpuB"]])
        lo = rng.choice([1, 1, 2])
        curves = {t: amdahl_curve(rng) for t in types}
        jobs.append(Job(f"j{i}", lo, rng.choice([lo + 1, 8, 64]), curves, rng.uniform(10, 20), rng.uniform(8, 14)))
    holders = jobs if multi_type_jobs_hold_nodes else [j for j in jobs if len(j.node_types) == 1]
    return Problem(tuple(jobs), pool, random_current(rng, holders, pool))


@pytest.mark.slow
def test_heterogeneous_aggregated_milp_matches_node_level():
    rng = random.Random(21)
    for i in range(120):
        p = random_hetero_problem(rng, multi_type_jobs_hold_nodes=bool(i % 2))
        agg, nl = allocate(p, "aggregated", time_limit_s=30.0), allocate(p, "node-level", time_limit_s=30.0)
        if any(len(j.node_types) > 1 for j in p.jobs):
            assert agg.method.startswith("typed-")
        for a in (agg, nl):
            assert_feasible(p, a)
        assert nl.optimal
        assert same(agg.objective, nl.objective), f"aggregated {agg.objective} vs node-level {nl.objective}"


def test_a_job_moves_to_a_faster_type_only_when_the_gain_pays_for_the_stop_and_start():
    # J holds 2 gpuA nodes where it runs at 10 samples/s; 4 gpuB nodes would give 400. Moving there is a stop
    # (scale-down 1 s + restart 30 s at its rate now, 10/s: 310 samples) and a start.
    j = Job("J", 1, 8, {"gpuA": ScalingCurve((0, 1, 8), (0.0, 5.0, 40.0)), "gpuB": ScalingCurve((0, 1, 8), (0.0, 100.0, 800.0))}, 1.0, 1.0,
            restart_cost_s=30.0)  # fmt: skip
    pool = hetero_pool(2, 4)
    held = {"J": frozenset({"a000", "a001"})}
    # Over 10 s on gpuB: 4000 samples, less the 310 the stop costs, against 100 by staying: it moves.
    p = Problem((j,), pool, held, t_fwd=10.0)
    for formulation in EXACT:
        a = allocate(p, formulation, time_limit_s=30.0)
        assert_feasible(p, a)
        assert (a.node_type["J"], a.counts["J"]) == ("gpuB", 4), formulation
        assert set(a.removed(p.current)["J"]) == {"a000", "a001"}  # it leaves every node it held: a stop, then a start
        assert a.objective == pytest.approx(4000.0 - 310.0)
    # Over 0.05 s the same move gains 20 - 0.5 samples of progress and costs 310: it stays where it is.
    p = Problem((j,), pool, held, t_fwd=0.05)
    for formulation in EXACT:
        a = allocate(p, formulation, time_limit_s=30.0)
        assert_feasible(p, a)
        assert a.node_type["J"] == "gpuA", formulation


@pytest.mark.slow
def test_typed_solver_is_exact_against_the_milp_on_random_instances():
    rng = random.Random(99)
    for i in range(150):
        p = random_hetero_problem(rng, multi_type_jobs_hold_nodes=bool(i % 2))
        agg, mi = allocate(p, "aggregated", time_limit_s=30.0), allocate(p, "milp", time_limit_s=30.0)
        assert_feasible(p, agg)
        assert mi.optimal
        assert same(agg.objective, mi.objective), f"typed {agg.objective} ({agg.method}) vs MILP {mi.objective}"


# --------------------------------------------------------------------------- the typed solver on its own tables


def random_typed_tables(rng: random.Random, n_models: int, n_jobs: int, types: list[str], widest: int = 4) -> list[dict[str, np.ndarray]]:
    """Tables shaped like the hard decisions of the benchmark: a few models, each with many waiting copies (identical
    tables), worths that differ by orders of magnitude between models (the weakest worth less than any gap), models
    torn between types (per-node rates within 3 %), and running jobs with tables of their own (a stop and a move
    cost, a resize costs)."""
    models = []
    for _ in range(n_models):
        scale = 10 ** rng.uniform(0.0, 5.0)
        lo = rng.choice([1, 1, 2])
        hi = rng.choice([lo, lo + 1, max(lo, widest)])
        base, f = rng.uniform(0.5, 1.5), rng.uniform(0.0, 0.4)
        torn = rng.random() < 0.6
        curves = {}
        for t in types:
            if rng.random() < 0.15:
                continue  # it does not run on this type
            speed = base * (rng.uniform(0.97, 1.03) if torn else rng.uniform(0.3, 2.0))
            curves[t] = [scale * speed * n / (1.0 + f * (n - 1)) for n in range(hi + 1)]
        models.append((lo, curves or {types[0]: [scale * n for n in range(hi + 1)]}))
    tables = []
    for _ in range(n_jobs):
        lo, curves = rng.choice(models)
        running = rng.random() < 0.3
        on = rng.choice(list(curves)) if running else None
        size = rng.randint(lo, len(next(iter(curves.values()))) - 1) if running else 0
        worth = max(max(c) for c in curves.values())
        stop, resize, move = (-rng.uniform(0.0, 0.3) * worth, rng.uniform(0.0, 0.2) * worth, rng.uniform(0.0, 0.3) * worth) if running else (0.0, 0.0, 0.0)
        job = {}
        for t, c in curves.items():
            tb = np.array([stop] + c[1:])
            tb[1:] -= resize * (np.arange(1, len(c)) != size) if t == on else move
            tb[1:lo] = -np.inf
            job[t] = tb
        tables.append(job)
    return tables


def reference_optimum(tables: list[dict[str, np.ndarray]], caps: dict[str, int]) -> float:
    """The optimum by a plain DP over the nodes of each type taken so far, every job and every choice: slow, exact."""
    types = sorted(caps)
    states = {(0,) * len(types): 0.0}
    for job in tables:
        stop = float(next(iter(job.values()))[0])
        nxt: dict[tuple[int, ...], float] = {}
        for used, worth in states.items():
            options = [(used, worth + stop)]
            for k, t in enumerate(types):
                for n, v in enumerate(job.get(t, [])[1:], start=1):
                    if math.isfinite(v) and used[k] + n <= caps[t]:
                        options.append((used[:k] + (used[k] + n,) + used[k + 1 :], worth + float(v)))
            for key, v in options:
                if v > nxt.get(key, -math.inf):
                    nxt[key] = v
        states = nxt
    return max(states.values())


def worth_of(tables: list[dict[str, np.ndarray]], caps: dict[str, int], choices) -> float:
    """What ``choices`` are worth by the tables, checking that they fit every type."""
    used = {t: 0 for t in caps}
    total = 0.0
    for job, c in zip(tables, choices):
        if c.count == 0:
            total += float(next(iter(job.values()))[0])
        else:
            total += float(job[c.node_type][c.count])
            used[c.node_type] += c.count
    assert all(used[t] <= caps[t] for t in caps), f"{used} on {caps}"
    return total


@pytest.mark.parametrize("grid", [True, False], ids=["grid DP", "prices and search"])
def test_typed_solver_matches_a_plain_dp_on_small_instances_with_copies_and_torn_jobs(grid, monkeypatch):
    from pilotfill.allocator import typegrid

    if not grid:
        monkeypatch.setattr(typegrid, "CELLS", 0)  # the path of larger machines, on instances the reference can check
        monkeypatch.setattr(typegrid, "WORK", 0)
    rng = random.Random(7)
    for _ in range(300):
        types = ["k80", "p100", "v100"][: rng.choice([2, 3])]
        tables = random_typed_tables(rng, rng.randint(1, 3), rng.randint(2, 9), types)
        caps = {t: rng.randint(0, 7) for t in types}
        choices, value, _ = typed_module.solve(tables, caps)
        best = reference_optimum(tables, caps)
        assert same(value, best, 1e-9), f"typed {value} vs plain DP {best} on {caps}"
        assert same(worth_of(tables, caps, choices), value, 1e-9)


def test_typed_solver_reaches_highs_optimum_on_medium_instances_with_many_copies(monkeypatch):
    """Dozens of jobs from a handful of models, capacity far below demand: the core search decides (counted below),
    and its answer is HiGHS's proven optimum, never worse."""
    from pilotfill.allocator import typecore

    from pilotfill.allocator import typegrid

    monkeypatch.setattr(typegrid, "WORK", 0)  # the grid DP would take some of these: the search is what is checked
    searched = []
    real = typecore.Core.search
    monkeypatch.setattr(typecore.Core, "search", lambda self, theta, *deadline: searched.append(len(self.order)) or real(self, theta, *deadline))
    rng = random.Random(11)
    for _ in range(30):
        types = ["k80", "p100", "v100"]
        tables = random_typed_tables(rng, rng.randint(3, 7), rng.randint(30, 70), types, widest=8)
        demand = sum(max(len(tb) - 1 for tb in job.values()) for job in tables)
        caps = {t: rng.randint(demand // 12, demand // 4) for t in types}
        choices, value, how = typed_module.solve(tables, caps)
        _, reference, proven = typed_module.solve_milp(tables, caps, time_limit_s=60.0)
        assert proven and how == "dp"
        assert abs(value - reference) <= 1e-8 * max(1.0, abs(reference)), f"typed {value} vs HiGHS {reference}"
        assert same(worth_of(tables, caps, choices), value, 1e-9)
    assert sum(1 for h in searched if h > 0) >= 10  # the search over hesitant jobs ran, not only the first answer


def unmeasured_running(rng: random.Random, types: list[str], on: str, count: int, lo: int = 1, hi: int = 8) -> dict[str, np.ndarray]:
    """A job running on ``on`` at ``count`` nodes that has not reported yet: it keeps its nodes until it does, so
    stopping or moving it loses its change times an exploring rate (some 10¹³), resizing too."""
    rate = EXPLORE_RATE * rng.uniform(5.0, 20.0)
    job = {}
    for t in types:
        tb = np.full(hi + 1, -1.3e13)
        tb[1:] = rate - (1.2e13 if t != on else 0.0) - np.where(np.arange(1, hi + 1) != count, 8e12, 0.0) * (t == on)
        tb[1:lo] = -np.inf
        job[t] = tb
    return job


def test_jobs_that_must_keep_their_nodes_are_pinned_and_the_rest_decided_exactly():
    """Jobs whose stop or move costs far more than all other jobs could gain (unmeasured, keeping their nodes) are
    pinned: in every optimum they run where they are, so they leave the search, and the other jobs' answer is the
    exact optimum on the nodes left (the plain DP, on the other jobs alone). Their huge values in one sum made the
    bound's tolerance coarser than most jobs' gains and the search hesitate over all of them."""
    rng = random.Random(5)
    types = ["k80", "p100", "v100"]
    for _ in range(12):
        others = random_typed_tables(rng, rng.randint(2, 5), rng.randint(6, 12), types, widest=4)
        caps = {t: rng.randint(3, 9) for t in types}
        pinned = []
        for _ in range(rng.randint(1, 3)):
            on = rng.choice(types)
            if caps[on] >= 2:
                count = rng.randint(1, 2)
                caps[on] -= count
                pinned.append((on, count, unmeasured_running(rng, types, on, count)))
        all_caps = {t: caps[t] + sum(c for o, c, _ in pinned if o == t) for t in types}
        tables = [job for _, _, job in pinned] + others
        values, stop = typed_module.value_matrix(tables, all_caps, types)
        _, _, decided, _ = typed_module.pin(values, stop, np.array([all_caps[t] for t in types], dtype=float))
        assert decided[: len(pinned)].all()  # (others may be too: where all that is left fits, each takes its best)
        choices, value, how = typed_module.solve(tables, all_caps)
        assert [(c.node_type, c.count) for c in choices[: len(pinned)]] == [(on, count) for on, count, _ in pinned]
        rest = worth_of(others, caps, choices[len(pinned) :])
        assert same(rest, reference_optimum(others, caps), 1e-12), f"the others: {rest} vs {reference_optimum(others, caps)}"


def test_a_pinned_job_whose_count_is_open_keeps_its_choice_of_counts():
    """Pinned to its type, a job whose best count is neither its smallest nor far above the others stays in the
    search on that type, shifted (its stop a loss larger than the rest could gain): it is never stopped or moved,
    and a cheaper count it can take is weighed against the other jobs as before."""
    types = ["k80", "v100"]
    big = np.array([-1e13, -5e12, 3e12, 3e12])  # 2 or 3 nodes alike: 1 node is far worse
    tables = [{"v100": big, "k80": np.array([-1e13, -2e13, -2e13, -2e13])},
              {"v100": np.array([0.0, 50.0, 60.0, 65.0])}, {"k80": np.array([0.0, 40.0])}]  # fmt: skip
    caps = {"k80": 1, "v100": 3}
    values, stop = typed_module.value_matrix(tables, caps, types)
    shifted, shifted_stop, decided, _ = typed_module.pin(values, stop, np.array([1.0, 3.0]))
    assert not decided[0] and shifted_stop[0] < -(50.0 + 65.0 + 40.0) and np.isneginf(shifted[0, 0]).all()
    assert list(shifted[0, 1, 2:]) == [0.0, 0.0]
    choices, value, _ = typed_module.solve(tables, caps)
    assert [(c.node_type, c.count) for c in choices] == [("v100", 2), ("v100", 1), ("k80", 1)]
    assert same(value, 3e12 + 50.0 + 40.0, 1e-15)


def test_a_lead_the_other_jobs_could_make_up_pins_nothing():
    """A job ahead on its best type by less than the other jobs could gain is not pinned: which type it takes
    depends on them."""
    tables = [{"v100": np.array([0.0, 100.0]), "k80": np.array([0.0, 90.0])},
              {"v100": np.array([0.0, 30.0])}]  # fmt: skip
    caps = {"k80": 1, "v100": 1}
    values, stop = typed_module.value_matrix(tables, caps, ["k80", "v100"])
    _, _, decided, _ = typed_module.pin(values, stop, np.array([1.0, 1.0]))
    assert not decided.any()
    choices, _, _ = typed_module.solve(tables, caps)
    assert [(c.node_type, c.count) for c in choices] == [("k80", 1), ("v100", 1)]


def test_the_typed_solver_keeps_to_its_time_limit(monkeypatch):
    """A search still running at half the time limit hands its core to the MILP with the rest: the answer is a
    solution (it fits, worth what it says, never above HiGHS's optimum) and the MILP gave it. (A clock that moves a
    second per reading stands for a slow machine: the test does not depend on how fast this one is. The clock is
    the caller's: the allocator reads none of its own.)"""
    from pilotfill.allocator import typegrid

    readings = iter(range(1, 10**9))

    def clock() -> float:
        return float(next(readings))

    monkeypatch.setattr(typegrid, "WORK", 0)
    rng = random.Random(11)
    types = ["k80", "p100", "v100"]
    cut = 0
    for _ in range(10):
        tables = random_typed_tables(rng, rng.randint(3, 7), rng.randint(30, 70), types, widest=8)
        demand = sum(max(len(tb) - 1 for tb in job.values()) for job in tables)
        caps = {t: rng.randint(demand // 12, demand // 4) for t in types}
        choices, value, how = typed_module.solve(tables, caps, time_limit_s=3.0, clock=clock)
        assert same(worth_of(tables, caps, choices), value, 1e-9)
        _, best, _ = typed_module.solve_milp(tables, caps, time_limit_s=60.0)
        assert value <= best + 1e-8 * max(1.0, abs(best))
        cut += how.startswith("dp+milp")
        assert typed_module.solve(tables, caps, time_limit_s=3.0)[2] == "dp"  # without a clock: its limit of states alone
    assert cut >= 5  # the search was cut short and the MILP answered


@pytest.mark.parametrize("merge", ["lexsort", "rank", "dense"])
def test_the_core_search_finds_the_best_solution_worth_the_threshold_and_nothing_below_it(monkeypatch, merge):
    from pilotfill.allocator import typecore
    from pilotfill.allocator.typeprices import prices

    if merge != "lexsort":  # every level merged as large levels are: by one integer's sort, or scattered by key
        monkeypatch.setattr(typecore, "RANK_MERGE_ABOVE", 0)
        monkeypatch.setattr(typecore, "DENSE_KEYS_PER_PAIR", 10**9 if merge == "dense" else 0)

    rng = random.Random(3)
    checked = 0
    for _ in range(150):
        types = ["k80", "p100", "v100"][: rng.choice([2, 3])]
        tables = random_typed_tables(rng, rng.randint(1, 3), rng.randint(3, 9), types)
        caps = {t: rng.randint(1, 7) for t in types}
        best = reference_optimum(tables, caps)
        values, stop = typed_module.value_matrix(tables, caps, types)
        cap = np.array([caps[t] for t in types], dtype=float)
        price, _ = prices(values - stop[:, None, None], np.ones(len(tables)), cap)
        n = np.arange(values.shape[2])
        reduced = values - price[None, :, None] * n[None, None, :]
        reduced[:, :, 0] = -np.inf
        upper = float(price @ cap + np.maximum(stop, reduced.reshape(len(tables), -1).max(axis=1)).sum())
        assert upper >= best - 1e-9 * max(1.0, abs(best))  # any prices bound the optimum
        for theta in (best - 0.5 * abs(best) - 1.0, best - 1e-6 * max(1.0, abs(best)), best + 1e-6 * max(1.0, abs(best))):
            core = typecore.Core(values, stop, cap, price, upper, theta)
            assert theta > best or core.root >= best - 1e-9 * max(1.0, abs(best))  # the bound never cuts off the optimum
            found = core.search(theta)
            if theta > best:
                assert found is None
                continue
            assert found is not None and same(found.value, best, 1e-9), f"search {found and found.value} vs {best}"
            ts, ns = found.spell()
            assert same(float(np.where(ns > 0, values[np.arange(len(ns)), ts, ns], stop).sum()), best, 1e-9)
            dived = core.dive(theta, 2)
            assert dived is None or dived.value <= best + 1e-9 * max(1.0, abs(best))
            checked += bool(len(core.order))
    assert checked >= 50  # cores with jobs torn between types


def test_a_search_level_keeps_each_keys_best_worth_the_same_way_whatever_its_size(monkeypatch):
    """The three ways a level is merged (lexsort; one integer's sort; an array indexed by key) keep, for every key in
    increasing order, the first of its best worths — ties included."""
    from pilotfill.allocator import typecore

    rng = np.random.default_rng(7)
    for n, span in ((1, 1), (50, 10), (3000, 40), (3000, 100_000), (20_000, 5_000)):
        keys = rng.integers(0, span, n).astype(np.int64)
        worth = rng.integers(-5, 5, n).astype(float)  # many ties
        order = np.lexsort((-worth, keys))
        expected = order[np.r_[True, keys[order][1:] != keys[order][:-1]]]
        for above, dense in ((10**9, 0), (0, 0), (0, 10**9)):
            monkeypatch.setattr(typecore, "RANK_MERGE_ABOVE", above)
            monkeypatch.setattr(typecore, "DENSE_KEYS_PER_PAIR", dense)
            assert typecore.best_per_key(keys, worth).tolist() == expected.tolist(), (n, span, above, dense)


@pytest.mark.parametrize("milp", [True, False])
def test_typed_solver_on_a_core_too_large_for_the_search_falls_back_to_the_milp_or_its_best(monkeypatch, milp):
    """A search that gives up hands its core to HiGHS (the optimum); with ``milp=False`` (the explore stage, whose
    answer is a bonus) it answers with the best solution it found — feasible, never above the optimum — and HiGHS
    is not called."""
    from pilotfill.allocator import typecore, typegrid

    monkeypatch.setattr(typecore, "STATE_LIMIT", 0)
    monkeypatch.setattr(typegrid, "CELLS", 0)
    monkeypatch.setattr(typegrid, "WORK", 0)
    if not milp:
        monkeypatch.setattr(typed_module, "_milp", lambda *a: pytest.fail("the MILP was called"))
    rng = random.Random(5)
    gave_up = 0
    for _ in range(60):
        types = ["k80", "p100", "v100"]
        tables = random_typed_tables(rng, rng.randint(2, 4), rng.randint(6, 12), types)
        caps = {t: rng.randint(1, 6) for t in types}
        choices, value, how = typed_module.solve(tables, caps, time_limit_s=30.0, milp=milp)
        gave_up += how == ("dp+milp" if milp else "dp (search limit)")
        best = reference_optimum(tables, caps)
        assert same(value, best, 1e-9) if milp else value <= best + 1e-9 * max(1.0, abs(value))
        assert same(worth_of(tables, caps, choices), value, 1e-9)
    assert gave_up >= 10


def test_the_grid_dp_of_a_small_machine_matches_highs_with_hundreds_of_jobs():
    """A few tens of idle nodes and a hundred jobs from a few models: the DP over the grid of node counts per type
    (:mod:`pilotfill.allocator.typegrid`) answers, and its answer is HiGHS's proven optimum."""
    from pilotfill.allocator import typegrid

    rng = random.Random(17)
    for i in range(8):
        types = ["k80", "p100", "v100"]
        tables = random_typed_tables(rng, rng.randint(4, 8), 100, types, widest=8)
        caps = {t: rng.randint(4, 16) if i < 6 else rng.randint(20, 24) for t in types}
        counts = np.array([caps[t] for t in types], dtype=float)
        values, stop = typed_module.value_matrix(tables, caps, types)
        assert typegrid.fits(counts, values, stop)
        assert (np.prod(counts + 1) > typegrid.CELLS) == (i >= 6)  # the last two: larger grids, taken for their small work
        choices, value, how = typed_module.solve(tables, caps)
        _, reference, proven = typed_module.solve_milp(tables, caps, time_limit_s=60.0)
        assert proven and how == "dp"
        assert abs(value - reference) <= 1e-8 * max(1.0, abs(reference)), f"grid {value} vs HiGHS {reference}"
        assert same(worth_of(tables, caps, choices), value, 1e-9)


def test_a_large_grid_is_tried_by_a_short_search_first_and_either_way_the_answer_is_the_optimum(monkeypatch):
    """Past ``PROBE_ABOVE`` cell updates the grid DP waits for a search of a few states: where it proves the optimum
    the grid is not run, where it gives up the grid answers — the same optimum both ways (HiGHS's, proven)."""
    from pilotfill.allocator import typegrid

    grids, probes = [], []
    real, search = typegrid.solve, typed_module._by_search
    monkeypatch.setattr(typegrid, "solve", lambda *a: grids.append(1) or real(*a))
    monkeypatch.setattr(typed_module, "_by_search", lambda *a: probes.append(a[-1]) or search(*a))
    monkeypatch.setattr(typed_module, "PROBE_ABOVE", 0)
    rng = random.Random(23)
    searched = gridded = 0
    for states in (1.0, 1e-12):  # a search of up to a state per update, then one of none (it gives up at once)
        monkeypatch.setattr(typed_module, "PROBE_STATES", states)
        for _ in range(12):
            types = ["k80", "p100", "v100"]
            tables = random_typed_tables(rng, rng.randint(3, 6), 40, types, widest=8)
            caps = {t: rng.randint(18, 24) for t in types}
            counts = np.array([caps[t] for t in types], dtype=float)
            values, stop = typed_module.value_matrix(tables, caps, types)
            if typegrid.work(counts, values, stop) == 0:  # a grid small enough to be taken on at once
                continue
            grids.clear(), probes.clear()
            choices, value, how = typed_module.solve(tables, caps)
            if not probes:
                continue  # every job's own best fits: no search, no grid
            _, reference, proven = typed_module.solve_milp(tables, caps, time_limit_s=60.0)
            assert proven and how == "dp"
            assert abs(value - reference) <= 1e-8 * max(1.0, abs(reference)), f"{value} vs HiGHS {reference}"
            assert same(worth_of(tables, caps, choices), value, 1e-9)
            if states < 1:
                assert grids, "a search of no states cannot prove anything: the grid answers"
            searched += not grids
            gridded += bool(grids)
    assert searched >= 8 and gridded >= 8


def test_a_grid_longer_than_the_time_limit_is_left_to_the_search_which_stops_on_time(monkeypatch):
    """The grid DP runs to its end once started, so a solve takes it only where its cell updates fit the time limit
    (the explore stage's 30 ms: a 55 ms grid had made its passes 90 ms); else the search, which stops on time — here
    with time enough to prove the same optimum."""
    from pilotfill.allocator import typegrid

    grids = []
    real = typegrid.solve
    monkeypatch.setattr(typegrid, "solve", lambda *a: grids.append(1) or real(*a))
    monkeypatch.setattr(typed_module, "PROBE_ABOVE", math.inf)  # no search before the grid: the limit alone decides
    rng = random.Random(29)
    left, taken = 0, 0
    for _ in range(10):
        types = ["k80", "p100", "v100"]
        tables = random_typed_tables(rng, rng.randint(3, 6), 40, types, widest=8)
        caps = {t: rng.randint(18, 24) for t in types}
        counts = np.array([caps[t] for t in types], dtype=float)
        values, stop = typed_module.value_matrix(tables, caps, types)
        work = typegrid.work(counts, values, stop)
        if not 0 < work <= typegrid.WORK:
            continue
        _, reference, proven = typed_module.solve_milp(tables, caps, time_limit_s=60.0)
        assert proven
        for over in (True, False):  # the grid would take 10 s of a 5 s limit; or next to nothing
            monkeypatch.setattr(typegrid, "UPDATE_S", 10.0 / work if over else 1e-12)
            grids.clear()
            choices, value, how = typed_module.solve(tables, caps, time_limit_s=5.0)
            if over:
                assert grids == [], "a grid over the limit is never started"
                left += how == "dp"
            else:
                taken += grids == [1]
            assert abs(value - reference) <= 1e-8 * max(1.0, abs(reference)) and same(worth_of(tables, caps, choices), value, 1e-9)
    assert left >= 5 and taken >= 5


def test_the_typed_prices_are_near_the_lp_relaxation():
    """Any prices bound the optimum, but the search is fast only with prices near the LP relaxation's optimum: the
    bound at the smoothed-and-polished prices is the LP's value (HiGHS) within 0.1 % (mostly within 1e-10)."""
    from scipy.optimize import linprog

    from pilotfill.allocator.typeprices import prices

    rng = random.Random(23)
    for _ in range(10):
        types = ["k80", "p100", "v100"]
        tables = random_typed_tables(rng, rng.randint(3, 7), rng.randint(40, 80), types, widest=8)
        demand = sum(max(len(tb) - 1 for tb in job.values()) for job in tables)
        cap = np.array([rng.randint(demand // 12, demand // 4) for _ in types], dtype=float)
        values, stop = typed_module.value_matrix(tables, dict(zip(types, cap.astype(int))), types)
        J, T, W = values.shape
        gain = values - stop[:, None, None]
        price, _ = prices(gain, np.ones(J), cap)
        n = np.arange(W)
        upper = float(price @ cap + np.maximum(0.0, np.where(n > 0, gain - price[None, :, None] * n, -np.inf).reshape(J, -1).max(axis=1)).sum())
        j, k, c = np.nonzero(np.isfinite(gain) & (n > 0))
        rows = np.zeros((J + T, len(j)))
        rows[j, np.arange(len(j))] = 1.0
        rows[J + k, np.arange(len(j))] = c
        lp = -linprog(-gain[j, k, c], A_ub=rows, b_ub=np.concatenate([np.ones(J), cap]), bounds=(0, None), method="highs").fun
        assert lp - 1e-9 * abs(lp) <= upper <= lp + 1e-3 * abs(lp), f"bound {upper} at the prices vs LP {lp}"


def test_copies_tied_between_types_fill_both_types():
    # 30 copies of a model worth the same per node on both types (every split is an optimum) and 10 of one a little
    # better on v100: the v100 model takes v100 first, the copies take every node left.
    even = {"p100": np.array([0.0, 100.0, 190.0]), "v100": np.array([0.0, 100.0, 190.0])}
    keen = {"p100": np.array([0.0, 50.0, 90.0]), "v100": np.array([0.0, 101.0, 192.0])}
    tables = [even] * 30 + [keen] * 10
    caps = {"p100": 17, "v100": 13}
    choices, value, _ = typed_module.solve(tables, caps)
    assert same(value, reference_optimum(tables, caps), 1e-12)
    assert same(worth_of(tables, caps, choices), value, 1e-12)
    assert sum(c.count for c in choices) == 30


# --------------------------------------------------------------------------- greedy and fallbacks


def test_greedy_is_always_feasible_and_never_worse_than_standing_still():
    rng = random.Random(5)
    for i in range(120):
        if i % 3 == 2:
            p = random_hetero_problem(rng, multi_type_jobs_hold_nodes=True)
        else:
            p = random_problem(rng, rng.randint(1, 12), rng.randint(0, 40), extras=bool(i % 2))
        g = allocate(p, "greedy")
        assert g.method == "greedy" and not g.optimal
        assert_feasible(p, g)
        still = standing_still(p)
        if still is not None:
            assert g.objective >= objective_of(p, *still) - 1e-9 * max(1.0, abs(g.objective))
        best = allocate(p, "node-level" if i % 3 == 2 else "aggregated", time_limit_s=30.0)
        assert g.objective <= best.objective + 1e-6 * max(1.0, abs(best.objective))


@pytest.mark.parametrize("formulation, n_jobs, n_nodes", [("milp", 200, 4654), ("node-level", 10, 128)])
def test_a_solver_without_time_still_answers_feasibly(formulation, n_jobs, n_nodes):
    # (The node-level model is kept small: CBC does not stop inside its root work, so a
    # 1 µs limit on 60 jobs × 900 nodes still took ~90 s while writing this test.)
    p = random_problem(random.Random(8), n_jobs, n_nodes, data_bounds=True)
    a = allocate(p, formulation, time_limit_s=1e-6)
    assert a.method in (formulation, "greedy")
    assert_feasible(p, a)
    still = standing_still(p)
    assert a.objective >= objective_of(p, *still) - 1e-9 * abs(a.objective)


def test_a_crashing_solver_falls_back_to_greedy(monkeypatch):
    rng = random.Random(9)
    p = random_problem(rng, 10, 32)

    def boom(*args, **kwargs):
        raise RuntimeError("CBC died")

    monkeypatch.setattr(milp_module, "solve", boom)
    monkeypatch.setattr(nodelevel_module, "solve", boom)
    monkeypatch.setattr(typed_module, "solve", boom)
    for formulation in ("milp", "node-level"):
        a = allocate(p, formulation)
        assert a.method == "greedy" and "CBC died" in a.note
        assert_feasible(p, a)
    hetero = random_hetero_problem(random.Random(1), multi_type_jobs_hold_nodes=False)
    a = allocate(Problem(hetero.jobs + (Job("both", 1, 4, {"gpuA": linear(5.0), "gpuB": linear(6.0)}),), hetero.pool, hetero.current), "aggregated")
    assert a.method == "greedy"  # the typed solver and the MILP behind it are both gone


def test_an_infeasible_incumbent_is_replaced_by_greedy(monkeypatch):
    p = Problem((Job("big", 4, 8, linear(100.0)), Job("small", 1, 8, linear(50.0))), pool_of(8))
    bad = milp_module.MilpResult({"big": 2, "small": 6}, {"big": DEFAULT_TYPE, "small": DEFAULT_TYPE}, False, "FEASIBLE")
    monkeypatch.setattr(milp_module, "solve", lambda *a, **k: bad)
    a = allocate(p, "milp")
    assert a.method == "greedy"
    assert_feasible(p, a)


# --------------------------------------------------------------------------- profiler (JPA)


def amdahl_truth(t1: float, serial: float):
    """Amdahl: T(n) = n / (a + b·n) with T(1) = t1 and serial fraction b/(a+b)."""
    b = serial / t1
    a = 1.0 / t1 - b
    return lambda n: n / (a + b * n)


@pytest.mark.parametrize("seed", range(6))
def test_profiler_learns_an_amdahl_curve_from_noisy_reports(seed):
    rng = np.random.default_rng(seed)
    truth = amdahl_truth(t1=rng.uniform(1000, 6000), serial=rng.uniform(0.005, 0.05))
    prof = Profiler()
    for n in (1, 2, 4, 8):
        for _ in range(8):
            prof.observe("job", n, truth(n) * (1 + 0.03 * rng.standard_normal()))
    curve = prof.curve("job", 1, 64)
    for n in range(1, 9):
        assert curve.at(n) == pytest.approx(truth(n), rel=0.04), f"n={n}"  # 8 reports of 3% noise per scale
    assert curve.at(0) == 0.0
    # Past the measured range it may be optimistic, never pessimistic by much.
    assert curve.at(32) >= 0.97 * truth(32)
    assert curve.at(64) <= 64 / 8 * truth(8) * 1.03  # no better than linear from the largest scale seen


def test_profiler_optimism_narrows_as_scales_accumulate():
    truth = amdahl_truth(t1=2000.0, serial=0.03)
    prof = Profiler()
    gaps = []
    for n in (1, 2, 4, 8):
        prof.observe("j", n, truth(n))
        if n == 1:
            continue
        curve = prof.curve("j", 1, 64)
        linear_from_top = truth(n) * 32 / n
        assert truth(32) * 0.999 <= curve.at(32) < linear_from_top, f"{n} scales: {curve.at(32)}"
        gaps.append(curve.at(32) - truth(32))
    assert gaps == sorted(gaps, reverse=True) and gaps[-1] < 0.5 * gaps[0], gaps


def test_profiler_is_per_job_and_starts_cold():
    prof = Profiler()
    for n, rate in ((1, 1000.0), (2, 1900.0), (4, 3500.0)):
        prof.observe("seen", n, rate)
    # Untouched by the other job's reports: a token by what is confirmed, "measure me first" by optimism.
    assert prof.confirmed("other", 1, 8) == ScalingCurve((0, 1, 8), (0, PROBE_RATE, PROBE_RATE))
    assert prof.curve("other", 1, 8) == ScalingCurve((0, 1, 8), (0, EXPLORE_RATE, EXPLORE_RATE))
    assert prof.scales("other") == {} and not prof.measured("other")
    prof.forget("seen")
    assert prof.scales("seen") == {}


def test_a_job_trying_a_size_past_every_one_it_reported_at_is_valued_there_as_exploring_expected_until_it_reports():
    prof = Profiler()
    prof.observe("j", 2, 2000.0)
    flat = prof.confirmed("j", 1, 16)
    assert flat.at(8) == pytest.approx(2000.0)  # one scale seen: nothing is known past it
    trying = prof.confirmed("j", 1, 16, trying=8)
    optimistic = prof.curve("j", 1, 16)
    assert [trying.at(n) for n in range(9)] == pytest.approx([optimistic.at(n) for n in range(9)])
    assert trying.at(8) == pytest.approx(8000.0) and trying.at(16) == pytest.approx(8000.0)  # flat past it: no growth on hope
    assert prof.confirmed("j", 1, 16, trying=2) == flat  # at a size it has reported at: what it reported
    prof.observe("j", 8, 5000.0)
    assert prof.confirmed("j", 1, 16, trying=8).at(8) == pytest.approx(5000.0, rel=0.02)  # measured there: the reports
    assert prof.confirmed("j", 1, 16, trying=8) == prof.confirmed("j", 1, 16)


def test_a_never_seen_job_starts_on_free_nodes_at_its_minimum():
    prof = Profiler()
    fresh = Job("fresh", 3, 16, prof.confirmed("fresh", 3, 16))
    rng = random.Random(4)
    others = [Job(f"o{i}", 1, 2, amdahl_curve(rng), 15.0, 10.0) for i in range(2)]
    pool = pool_of(32)
    current = {"o0": frozenset(pool.nodes[:2]), "o1": frozenset(pool.nodes[2:4])}  # 28 nodes free
    p = Problem(tuple(others) + (fresh,), pool, current)
    for formulation in ("aggregated", "milp"):
        a = allocate(p, formulation)
        assert_feasible(p, a)
        assert a.counts["fresh"] == 3, formulation


@pytest.mark.parametrize("formulation", ["aggregated", "milp"])
def test_a_never_seen_job_never_evicts_a_measured_one(formulation):
    """The probe is worth less than any real job: measuring a new job never costs a running one a restart."""
    prof = Profiler()
    prof.observe("old", 4, 40.0)  # a slow job, measured at 4 nodes
    old = Job("old", 4, 4, prof.confirmed("old", 4, 4), 10.0, 5.0, restart_cost_s=30.0, explore=prof.curve("old", 4, 4))
    fresh = Job("fresh", 1, 4, prof.confirmed("fresh", 1, 4))
    pool = pool_of(4)
    p = Problem((old, fresh), pool, {"old": frozenset(pool.nodes)})
    a = allocate(p, formulation)
    assert (a.counts["old"], a.counts["fresh"]) == (4, 0)


@pytest.mark.parametrize("formulation", ["aggregated", "milp"])
def test_exploration_grows_only_onto_nodes_nobody_values(formulation):
    prof = Profiler()
    prof.observe("a", 2, 2000.0)  # measured at 2 nodes only: optimism says it may scale further
    a_job = Job("a", 1, 8, prof.confirmed("a", 1, 8), 2.0, 1.0, explore=prof.curve("a", 1, 8))
    b_job = Job("b", 1, 4, ScalingCurve((0, 1, 4), (0, 1500, 6000)), 10.0, 5.0)  # known, scales linearly
    pool = pool_of(8)
    p = Problem((a_job, b_job), pool, {"a": frozenset(pool.nodes[:2])})
    answer = allocate(p, formulation)
    assert_feasible(p, answer)
    # b (known to scale) takes what it values by its confirmed curve; a explores on the nodes left over.
    assert answer.counts["b"] == 4
    assert answer.counts["a"] == 4 and answer.method.endswith("+explore")
    # With no node left over, a stays at its measured size: exploring never takes a node from b.
    small = pool_of(6)
    p = Problem((a_job, b_job), small, {"a": frozenset(small.nodes[:2])})
    answer = allocate(p, formulation)
    assert (answer.counts["a"], answer.counts["b"]) == (2, 4)


@pytest.mark.parametrize("formulation", ["aggregated", "milp"])
def test_a_restart_cost_keeps_a_running_job_running(formulation):
    """Without a restart cost a slightly better job takes the node; with the real cost of a restart it does not."""
    running = lambda restart: Job("run", 1, 1, ScalingCurve((0, 1), (0, 100)), 0.0, 1.0, restart_cost_s=restart)  # noqa: E731
    better = Job("new", 1, 1, ScalingCurve((0, 1), (0, 120)), 0.0, 1.0)
    pool = pool_of(1)
    cheap = Problem((running(0.0), better), pool, {"run": frozenset(pool.nodes)}, t_fwd=10)
    assert allocate(cheap, formulation).counts["new"] == 1
    costly = Problem((running(30.0), better), pool, {"run": frozenset(pool.nodes)}, t_fwd=10)
    assert allocate(costly, formulation).counts["run"] == 1


def test_one_scale_seen_extrapolates_linearly_but_confirms_nothing_beyond_it():
    prof = Profiler()
    prof.observe("j", 4, 4000.0, weight=2.0)
    prof.observe("j", 4, 4400.0, weight=2.0)  # mean 4200 at 4 nodes
    curve, confirmed = prof.curve("j", 1, 32), prof.confirmed("j", 1, 32)
    for n in (1, 2, 4, 8, 32):
        assert curve.at(n) == pytest.approx(4200.0 * n / 4)
        assert confirmed.at(n) == pytest.approx(4200.0 * min(n, 4) / 4)


def test_jpa_fitting_many_jobs_at_once_gives_exactly_the_curves_it_gives_one_by_one():
    """After a decision resized hundreds of jobs, the next one refits them all: :meth:`Profiler.prepare` does it in one
    array operation per width, and what the allocator is given must not change by a bit."""
    rng = np.random.default_rng(7)
    alone, together = Profiler(), Profiler()
    jobs = []
    for i in range(60):
        truth = amdahl_truth(t1=rng.uniform(500, 6000), serial=rng.uniform(0.0, 0.3))
        scales = sorted(rng.choice([1, 2, 3, 4, 6, 8, 12, 16, 32, 64], size=int(rng.integers(0, 5)), replace=False).tolist())
        if i % 7 == 0:
            scales = [1, 2, 4, 64]  # measured at its maximum: nothing beyond to be optimistic about
        if i % 11 == 0:
            scales = [2, 4]
            rates = [1000.0, 400.0]  # slower on more nodes: a fit that leans on one term
        else:
            rates = [truth(n) * (1 + 0.03 * rng.standard_normal()) for n in scales]
        for prof in (alone, together):
            for n, rate in zip(scales, rates):
                prof.observe(f"j{i}", n, rate)
        jobs.append((f"j{i}", int(rng.choice([16, 64])) if i % 5 else 8))
    together.prepare(jobs)
    fitted = sum(1 for job_id, hi in jobs if together.ready(job_id, hi))
    assert fitted >= 30  # most of them were fitted together, not left to be made one by one
    for job_id, hi in jobs:
        for trying in (0, 5, hi):
            assert together.confirmed(job_id, 1, hi, trying=trying) == alone.confirmed(job_id, 1, hi, trying=trying), job_id
        assert together.curve(job_id, 1, hi) == alone.curve(job_id, 1, hi), job_id
        assert together.curve(job_id, 1, hi).table(hi).tolist() == alone.curve(job_id, 1, hi).table(hi).tolist()
    together.observe("j1", 48, 1.0)  # a report moves the curve: what was prepared is dropped with the rest
    alone.observe("j1", 48, 1.0)
    together.prepare(jobs)
    assert together.curve("j1", 1, 64 if dict(jobs)["j1"] == 64 else dict(jobs)["j1"]) == alone.curve("j1", 1, dict(jobs)["j1"])


def test_profiler_ignores_meaningless_reports():
    prof = Profiler()
    for nodes, rate, weight in ((0, 100.0, 1.0), (2, math.nan, 1.0), (2, -5.0, 1.0), (2, 100.0, 0.0)):
        prof.observe("j", nodes, rate, weight)
    assert prof.scales("j") == {}


def test_profiler_estimate_changes_when_a_report_arrives():
    prof = Profiler()
    prof.observe("j", 2, 2000.0)
    before = prof.curve("j", 1, 16)
    prof.observe("j", 8, 4000.0)  # worse than linear: the curve must come down at 8
    after = prof.curve("j", 1, 16)
    assert after.at(8) < before.at(8)
    assert after.at(8) == pytest.approx(4000.0, rel=0.05)


def test_the_jobs_whose_version_moved_are_told_once_each_and_a_forgotten_job_is_not():
    """The controller describes again only the waiting jobs JPA's news changed (:meth:`Profiler.take_touched`)."""
    prof = Profiler()
    prof.observe("a", 2, 100.0)
    prof.observe("b", 4, 150.0)
    prof.observe_cost("c", "start", 20.0)
    assert prof.take_touched() == {"a", "b", "c"}
    assert prof.take_touched() == set()
    prof.observe("a", 2, 100.0)  # the same rate again: the curves stand, the version does not move
    prof.observe_cost("c", "start", 20.0)
    assert prof.take_touched() == set()
    prof.observe("a", 8, 300.0)
    prof.observe("b", 8, 200.0)
    prof.forget("b")
    assert prof.take_touched() == {"a"}


def test_a_cost_measured_again_unchanged_leaves_the_job_as_it_was_and_a_moved_one_is_charged_anew():
    """Each commit measures the interval since the last one: at machine scale a thousand running jobs commit every
    minute, and a steady interval measured again must not remake every job's view (the version callers cache on)."""
    prof = Profiler()
    assert prof.cost("j", "commit", prior=7.0) == 7.0 and prof.restart_cost("j", prior=30.0) == 30.0
    prof.observe_cost("j", "commit", 60.0)
    first = prof.version("j")
    assert prof.cost("j", "commit", prior=7.0) == 60.0
    for seconds in (60.02, 59.99, 60.01):  # jitter of a steady interval: within the tolerances
        prof.observe_cost("j", "commit", seconds)
    assert prof.version("j") == first and prof.cost("j", "commit", prior=0.0) == 60.0
    prof.observe_cost("j", "commit", 120.0)  # the interval doubled once: the mean moves by 15 s
    assert prof.version("j") > first
    assert prof.cost("j", "commit", prior=0.0) == pytest.approx((60.0 + 60.02 + 59.99 + 60.01 + 120.0) / 5)
    prof.observe_cost("j", "start", 20.0)  # a kind never measured before is charged at once
    assert prof.restart_cost("j", prior=30.0) == pytest.approx(20.0 + prof.cost("j", "commit", 0.0) / 2)


# --------------------------------------------------------------------------- at machine scale


@pytest.mark.parametrize("seed", [42, 43])
def test_dp_matches_the_milp_on_a_whole_machine(seed):
    """200 jobs on Summit's peak idle count (4,654 nodes): the DP answers, the MILP confirms the optimum.

    Measured while writing this (2 cores): DP ~60 ms, the MILP proves the optimum in 0.2–0.4 s.
    """
    rng = random.Random(seed)
    p = random_problem(rng, 200, 4654, data_bounds=True)
    assert sum(j.max_nodes for j in p.jobs) > len(p.pool.nodes)  # capacity binds
    dp_answer = allocate(p, "aggregated")
    assert dp_answer.method == "dp"
    assert_feasible(p, dp_answer)
    mip_answer = allocate(p, "milp", time_limit_s=55.0)
    assert mip_answer.method == "milp"
    assert_feasible(p, mip_answer)
    if mip_answer.optimal:
        assert same(dp_answer.objective, mip_answer.objective)
    else:  # CBC ran out of time: its incumbent can be no better than the exact answer
        assert dp_answer.objective >= mip_answer.objective - 1e-6 * abs(dp_answer.objective)


def test_milp_and_node_level_leave_nodes_free_on_ties():
    # Finishing A needs one node for the whole horizon; more nodes gain nothing, so none are taken.
    p = Problem((Job("A", 1, 4, ScalingCurve((0, 1, 4), (0, 1000, 4000)), remaining_samples=10_000),), NodePool(("n0", "n1", "n2", "n3")))
    for f in ("aggregated", "milp", "node-level", "greedy"):
        assert allocate(p, f).counts["A"] == 1, f


def test_a_model_with_nothing_to_decide_is_optimal_not_a_fallback():
    c = ScalingCurve((0, 1, 4), (0, 10, 40))
    p = Problem((Job("x", 2, 4, {"A": c, "B": c}),), NodePool(("a0", "b0"), {"a0": "A", "b0": "B"}))
    for formulation in ("aggregated", "milp"):
        a = allocate(p, formulation)
        assert (a.method in ("typed-dp", "milp"), a.optimal, a.counts["x"]) == (True, True, 0)


@pytest.mark.parametrize("formulation", ["aggregated", "milp"])
def test_a_node_the_first_stage_takes_from_one_job_for_another_is_never_left_idle(formulation):
    """The confirmed optimum stops "slow" (measured at one node) to give its node to "fast" (measured at one and two
    nodes) with the only free node. Exploring then re-decides the free nodes: it must hand out the stopped job's
    node too — before, it re-decided only the node nobody held, gave "fast" one node, and left the other idle."""
    prof = Profiler()
    prof.observe("slow", 1, 1193.3)
    prof.observe("fast", 1, 3245.7)
    prof.observe("fast", 2, 6001.9)
    slow = Job("slow", 1, 64, prof.confirmed("slow", 1, 64), 10.0, 5.0, 1.29e8, restart_cost_s=132.3, explore=prof.curve("slow", 1, 64))
    fast = Job("fast", 1, 64, prof.confirmed("fast", 1, 64), 9.2, 5.0, 1.19e8, restart_cost_s=83.0, explore=prof.curve("fast", 1, 64))
    pool = pool_of(2)
    p = Problem((slow, fast), pool, {"slow": frozenset(pool.nodes[:1])}, t_fwd=132.0)
    a = allocate(p, formulation)
    assert_feasible(p, a)
    assert sum(a.counts.values()) == 2, a.counts
    if a.counts["slow"] == 0:
        assert a.counts["fast"] == 2


@pytest.mark.parametrize("seed", range(6))
def test_dp_core_reaches_the_plain_dp_optimum_with_many_start_or_not_jobs(seed):
    """Hundreds of waiting jobs a decision weighs are "start on m nodes or not" (a token or one measured rate, flat
    past it) or flat tables with ties; the core solver groups them by step and drops dominated counts. Its value
    must be the plain DP's over every table, and its counts feasible."""
    from pilotfill.allocator import dp

    rng = np.random.default_rng(seed)
    tables = []
    for _ in range(120):
        kind = rng.integers(4)
        width = int(rng.integers(2, 20))
        if kind == 0:  # start on m nodes or not, flat past m (ties between copies: equal gains)
            m = int(rng.integers(1, 4))
            t = np.zeros(width + m)
            t[m:] = float(rng.choice([5.0, 7.0, 7.0, rng.uniform(1, 10)]))
        elif kind == 1:  # concave growth from a running size, with a stop penalty
            t = np.concatenate([[-float(rng.uniform(0, 30))], np.cumsum(np.sort(rng.uniform(0, 10, width))[::-1])])
        elif kind == 2:  # min_nodes > 1: −inf below it
            t = np.cumsum(rng.uniform(0, 5, width))
            t[0] = 0.0
            t[1 : int(rng.integers(2, width + 1))] = -np.inf
        else:  # irregular (a rescale cost dip)
            t = np.concatenate([[0.0], rng.uniform(-5, 20, width)])
        tables.append(t)
    for capacity in (0, 1, 7, 40, 150, 400):
        counts, value = dp.solve(tables, capacity)
        assert sum(counts) <= capacity
        assert all(np.isfinite(t[c]) for t, c in zip(tables, counts))
        assert value == pytest.approx(sum(float(t[c]) for t, c in zip(tables, counts)))
        _, plain = dp.dense(tables, capacity)
        assert value == pytest.approx(plain, rel=1e-9, abs=1e-9), f"capacity {capacity}: core {value} vs plain DP {plain}"


@pytest.mark.parametrize("seed", range(6))
def test_dp_core_is_exact_on_linear_growth_beside_huge_exploring_values(seed, monkeypatch):
    """Exploring, a decision weighs measured jobs growing along linear curves (every count as good as the next at the
    node price: fixing cannot tell them apart) beside jobs never measured, worth ~1e13 each (they are measured first).
    The core merges the concave tables into one and bounds rounding by the terms' size, not the total's: its value
    must be the plain DP's, and it must keep far fewer choices than a slack of a share of the total would."""
    from pilotfill.allocator import dp

    rng = np.random.default_rng(seed)
    tables = []
    for _ in range(300):
        kind = rng.integers(5)
        width = int(rng.integers(2, 40))
        if kind == 0:  # never measured: start on m nodes, worth a huge optimistic rate, flat past it
            m = int(rng.integers(1, 3))
            t = np.zeros(width + m)
            t[m:] = 3.6e13 * float(rng.choice([1.0, 1.0, rng.uniform(0.5, 1.0)]))
        elif kind == 1:  # measured once: linear growth from its size (ties at the node price)
            t = np.concatenate([[-float(rng.uniform(0, 1e5))], float(rng.uniform(1e4, 2e5)) * np.arange(1, width + 1)])
        elif kind == 2:  # concave growth
            t = np.concatenate([[0.0], np.cumsum(np.sort(rng.uniform(0, 1e5, width))[::-1])])
        elif kind == 3:  # concave, then a kink upward (an optimistic curve past the largest size measured)
            inc = np.concatenate([np.sort(rng.uniform(1e4, 1e5, width))[::-1], np.full(5, 2e5)])
            t = np.concatenate([[0.0], np.cumsum(inc)])
        else:  # min_nodes > 1
            t = np.concatenate([[0.0], np.cumsum(rng.uniform(0, 1e5, width))])
            t[1 : int(rng.integers(2, width + 1))] = -np.inf
        tables.append(t)
    cores = []
    real_core = dp.solve_core

    def core(values, keep, capacity, *bound):
        cores.append(int(keep.sum()) - len(keep))  # choices beyond one per job: what the DP weighs
        return real_core(values, keep, capacity, *bound)

    monkeypatch.setattr(dp, "solve_core", core)
    choices = sum(int(np.isfinite(t).sum()) for t in tables) - len(tables)
    for capacity in (5, 60, 250, 700):
        cores.clear()
        counts, value = dp.solve(tables, capacity)
        assert sum(counts) <= capacity
        assert all(np.isfinite(t[c]) for t, c in zip(tables, counts))
        _, plain = dp.dense(tables, capacity)
        assert value == pytest.approx(plain, rel=1e-15, abs=1.0), f"capacity {capacity}: core {value} vs plain DP {plain}"
        assert not cores or cores[-1] < choices / 4, f"capacity {capacity}: the core kept {cores[-1]} of {choices} choices"


@pytest.mark.parametrize("seed", range(4))
def test_the_compiled_dp_is_the_best_of_every_combination_and_breaks_ties_toward_fewer_nodes(seed):
    """The core's DP is compiled (numba): on small instances its value is the best over every combination of counts
    (enumerated), its counts reach that value within the capacity, and a count no better than a smaller one is not
    taken (nodes nobody gains from stay free)."""
    import itertools

    from pilotfill.allocator import compiled

    rng = np.random.default_rng(seed)
    for _ in range(30):
        tables = []
        for _ in range(int(rng.integers(1, 5))):
            t = np.round(rng.uniform(-3, 10, int(rng.integers(1, 5))), 1)  # rounded: ties happen
            t[1:][rng.random(len(t) - 1) < 0.25] = -np.inf
            tables.append(t)
        capacity = int(rng.integers(0, 9))
        best = max(sum(t[n] for t, n in zip(tables, ns)) for ns in itertools.product(*(range(len(t)) for t in tables)) if sum(ns) <= capacity)
        counts, value = compiled.knapsack(tables, capacity)
        assert value == pytest.approx(best, abs=1e-9)
        assert sum(counts) <= capacity and sum(t[n] for t, n in zip(tables, counts)) == pytest.approx(best, abs=1e-9)
    counts, value = compiled.knapsack([np.array([0.0, 5.0, 5.0, 5.0]), np.array([0.0, 2.0, 2.0])], 6)
    assert (counts, value) == ([1, 1], 7.0)


def _flat(tables):
    sizes = np.array([len(t) for t in tables], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    return np.concatenate(tables), offsets


@pytest.mark.parametrize("seed", range(4))
def test_the_dp_kept_to_the_states_that_can_reach_an_incumbent_gives_the_same_counts(seed):
    """Given a value some answer reaches (an incumbent's) and any node price, the compiled DP keeps only the states
    whose Lagrangian bound reaches it. Its counts must be the full DP's, ties included (rounded tables: many ties),
    for the tightest floor (the optimum itself) and for any feasible answer's; a floor above the optimum is said
    (None), and the DP that falls back answers the same."""
    from pilotfill.allocator import compiled, dp

    rng = np.random.default_rng(seed)
    for trial in range(150):
        tables = []
        for _ in range(int(rng.integers(1, 30))):
            width = int(rng.integers(1, 12))
            t = np.concatenate([[0.0], np.cumsum(rng.uniform(0, 4, width - 1) * rng.choice([0.0, 1.0], width - 1, p=[0.2, 0.8]))])
            if width > 1 and rng.random() < 0.4:  # a start or rescale cost: worth more where it runs now
                t[1:] -= float(rng.uniform(0, 3))
                t[int(rng.integers(1, width))] += float(rng.uniform(0, 3))
            t = np.round(t, 0 if trial % 2 else 1)
            t[1:][rng.random(width - 1) < 0.15] = -np.inf
            tables.append(t)
        capacity = int(rng.integers(0, sum(len(t) for t in tables)))
        flat, offsets = _flat(tables)
        full = compiled.knapsack_flat(flat, offsets, capacity)
        best = float(sum(t[n] for t, n in zip(tables, full)))
        greedy = np.zeros(len(tables), dtype=int)
        for j in rng.permutation(len(tables)):  # some feasible answer: each job in turn its largest count that fits
            fits = [n for n in range(len(tables[j])) if np.isfinite(tables[j][n]) and n <= capacity - greedy.sum()]
            greedy[j] = max(fits)
        reached = float(sum(t[n] for t, n in zip(tables, greedy)))
        for price in (0.0, float(rng.uniform(0, 3)), float(rng.uniform(0, 0.5))):
            for floor in (best - 1e-9, reached - 1e-9):
                kept = compiled.knapsack_flat(flat, offsets, capacity, price, floor)
                assert kept is not None and kept.tolist() == full.tolist(), f"trial {trial}, price {price}, floor {floor}"
                assert compiled.knapsack_cells(flat, offsets, capacity, price, floor) <= compiled.knapsack_cells(flat, offsets, capacity)
            assert compiled.knapsack_flat(flat, offsets, capacity, price, best + 1.0) is None
            assert dp.dense_flat(flat, np.diff(offsets), capacity, price, best + 1.0).tolist() == full.tolist()


def test_on_a_whole_machine_core_the_floor_leaves_a_fraction_of_the_dp():
    """A whole machine's core under saturating demand: hundreds of running jobs, each worth most at its own count (a
    rescale costs), concave around it, on hundreds of nodes. The states that can reach the incumbent are a band around
    the optimal path: the DP must weigh under a third of the cells the full DP does, for the same counts."""
    from pilotfill.allocator import compiled, dp

    rng = np.random.default_rng(7)
    tables = []
    for _ in range(600):
        width = int(rng.integers(4, 20))
        t = np.concatenate([[0.0], np.cumsum(np.sort(rng.uniform(1e3, 1e5, width - 1))[::-1])])
        now = int(rng.integers(1, width))
        t[1:] -= float(rng.uniform(1e3, 2e4))  # a rescale forfeits work
        t[now] += t[now] - t[now - 1] if now > 1 else 1e4  # where it runs, it pays nothing
        tables.append(t)
    values = np.full((len(tables), max(map(len, tables))), -np.inf)
    for j, t in enumerate(tables):
        values[j, : len(t)] = t
    capacity = 3000
    price, fits, over = dp.break_price(values, capacity)
    incumbent = dp.round_up(values, dp.toward(values, fits, over, capacity), capacity)
    lower = float(values[np.arange(len(values)), incumbent].sum())
    flat, offsets = _flat(tables)
    full = compiled.knapsack_flat(flat, offsets, capacity)
    kept = compiled.knapsack_flat(flat, offsets, capacity, price, lower - 1e-3)
    assert kept.tolist() == full.tolist()
    cells, all_cells = compiled.knapsack_cells(flat, offsets, capacity, price, lower - 1e-3), compiled.knapsack_cells(flat, offsets, capacity)
    assert cells < all_cells / 3, f"{cells:,} of {all_cells:,} cells"


@pytest.mark.parametrize("seed", range(3))
def test_the_node_price_read_from_the_hulls_is_the_one_bisection_finds(seed):
    """The price at which the jobs' own choices fit is read from the slopes of their concave hulls, not bisected: on
    random tables (ties, counts not allowed, many copies of one job) it is the bisection's price, its choices fit,
    and the choices just below it do not."""
    from pilotfill.allocator import dp

    rng = np.random.default_rng(seed)
    compared = 0
    for _ in range(150):
        jobs, width = int(rng.integers(1, 40)), int(rng.integers(2, 14))
        values = np.cumsum(rng.uniform(-1, 5, (jobs, width)), axis=1)
        values[:, 0] = 0.0
        if rng.random() < 0.5:
            values = np.round(values)  # ties between counts and between jobs
        values[:, 1:][rng.random((jobs, width - 1)) < 0.2] = -np.inf
        if rng.random() < 0.3:
            values = np.repeat(values[:1], jobs, axis=0)  # copies: they change their minds at one price
        capacity = int(rng.integers(0, jobs * width))
        if dp.choices_at(values, 0.0).sum() <= capacity:
            continue  # every job's own best fits: no price is asked for
        price, fits, over = dp.break_price(values, capacity)
        bisected, _, _ = dp.bisect_break_price(values, capacity)
        assert price == pytest.approx(bisected, rel=1e-9, abs=1e-9)
        assert fits.sum() <= capacity < over.sum()
        assert fits.tolist() == dp.choices_at(values, price).tolist()
        compared += 1
    assert compared > 60


def test_the_compiled_price_choice_and_rounding_are_the_numpy_rules_they_replace():
    """The node-price choice (argmax of value − price·n, the smallest count on ties) and the greedy rounding (the best
    gain per node first, the first job and smallest count on ties) are compiled; on random tables with ties and
    counts not allowed they answer what the numpy expressions they replaced answer."""
    from pilotfill.allocator import compiled

    rng = np.random.default_rng(7)
    for _ in range(40):
        values = np.round(rng.uniform(-5, 20, (int(rng.integers(1, 30)), int(rng.integers(2, 12)))), 0)
        values[:, 1:][rng.random((values.shape[0], values.shape[1] - 1)) < 0.2] = -np.inf
        values[:, 0] = np.round(rng.uniform(-3, 3, values.shape[0]), 0)
        n = np.arange(values.shape[1])
        for price in (0.0, 0.5, 1.0, 3.0, 100.0):
            assert compiled.choose(values, price).tolist() == np.argmax(values - price * n, axis=1).tolist()
        capacity = int(rng.integers(0, 3 * values.shape[0]))
        counts = np.zeros(values.shape[0], dtype=int)
        expected = counts.copy()
        free = capacity
        rows = np.arange(len(expected))
        while free > 0:  # the numpy rounding compiled.round_up replaced
            step = n[None, :] - expected[:, None]
            gain = values - values[rows, expected][:, None]
            allowed = (step > 0) & (step <= free) & np.isfinite(values) & (gain > 0)
            if not allowed.any():
                break
            rate = np.where(allowed, gain / np.maximum(step, 1), -np.inf)
            j, k = np.unravel_index(int(np.argmax(rate)), rate.shape)
            free -= int(k - expected[j])
            expected[j] = k
        assert compiled.round_up(values, counts, capacity).tolist() == expected.tolist()


@pytest.mark.parametrize("seed", range(5))
def test_a_curve_through_every_count_is_tabulated_as_its_rates_the_same_numbers_as_interpolating(seed):
    """JPA's fits are curves through every count (:meth:`ScalingCurve.dense`, :meth:`ScalingCurve.dense_rows`): their
    tables are their rates, read without interpolating, and must be the very numbers interpolation gives."""
    rng = np.random.default_rng(seed)
    rows = np.cumsum(rng.random((4, 1 + int(rng.integers(1, 40)))), axis=1) * 10.0 ** rng.integers(-3, 12)
    rows[:, 0] = 0.0
    for curve in [ScalingCurve.dense(rows[0]), *ScalingCurve.dense_rows(rows)]:
        assert curve.__dict__.get("_dense") is not None  # read as its rates, not interpolated
        last = len(curve.nodes) - 1
        for upto in (0, 1, last // 2, last, last + 1, 2 * last + 7):
            expected = np.interp(np.arange(upto + 1), curve.nodes, curve.values)
            table = curve.table(upto)
            assert np.array_equal(table, expected) and not table.flags.writeable
