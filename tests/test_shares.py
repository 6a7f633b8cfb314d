"""The share objective: each group its share's optimum first, then the most total worth (allocator/shares.py)."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from pilotfill.allocator import Job, NodePool, Objective, Problem, ScalingCurve, allocate, due, shares, typed
from pilotfill.allocator.typed import Choice

pytestmark = pytest.mark.unit


def _brute(tables: list[dict[str, np.ndarray]], caps: dict[str, int]) -> float:
    """The most total worth, by enumerating every job's choices (a few jobs; more: the typed solver, itself checked
    against HiGHS in test_allocator)."""
    if len(tables) > 4:
        return typed.solve(tables, {t: n for t, n in caps.items()})[1]
    options = [[(None, 0)] + [(t, n) for t, tb in job.items() for n in range(1, len(tb)) if np.isfinite(tb[n])] for job in tables]
    best = -np.inf
    for pick in itertools.product(*options):
        used = {t: 0 for t in caps}
        for t, n in pick:
            if t is not None:
                used[t] += n
        if all(used[t] <= caps[t] for t in caps):
            best = max(best, sum(float(job[t][n]) if n else float(next(iter(job.values()))[0]) for job, (t, n) in zip(tables, pick)))
    return best


def _worth(tables, choices: list[Choice], members) -> float:
    return sum(float(tables[j][choices[j].node_type][choices[j].count]) if choices[j].count else float(next(iter(tables[j].values()))[0]) for j in members)


def _random(rng: random.Random, jobs: int, types: list[str]) -> list[dict[str, np.ndarray]]:
    out = []
    for _ in range(jobs):
        stop = rng.choice([0.0, 0.0, -rng.uniform(0, 50)])  # a running job: stopping it costs
        lo, hi = rng.choice([1, 1, 2]), rng.randint(2, 4)
        job = {}
        for t in rng.sample(types, rng.randint(1, len(types))):
            rate = 10 ** rng.uniform(0, 2.5)
            tb = np.array([stop] + [stop + rate * n ** rng.uniform(0.5, 1.0) if n >= lo else -np.inf for n in range(1, hi + 1)])
            job[t] = tb
        out.append(job)
    return out


def test_split_is_even_and_spreads_the_remainders():
    caps = {"a": 10, "b": 7, "c": 2}
    users = {"a": {"x", "y", "z"}, "b": {"x", "y", "z"}, "c": {"y"}}
    share = shares.split(caps, users)
    assert {g: share[g]["a"] for g in "xyz"} in ({"x": 4, "y": 3, "z": 3}, {"x": 3, "y": 4, "z": 3}, {"x": 3, "y": 3, "z": 4})
    assert sum(share[g]["a"] for g in "xyz") == 10 and sum(share[g]["b"] for g in "xyz") == 7
    assert share["y"]["c"] == 2 and "c" not in share["x"]  # only the group that can use a type shares it
    assert sorted(share[g]["a"] + share[g]["b"] for g in "xyz") == [5, 6, 6]  # one group does not take both remainders


TYPES = ["k80", "p100", "v100"]


def _instances(seed: int, n: int = 60):
    """``n`` random typed instances: tables, each job's group, capacities."""
    rng = random.Random(seed)
    for _ in range(n):
        tables = _random(rng, rng.randint(2, 9), TYPES)
        yield tables, [rng.choice("AB C") for _ in tables], {t: rng.randint(0, 6) for t in TYPES}


def _assert_fits(tables, choices: list[Choice], caps: dict[str, int], value: float) -> None:
    """Every type within its capacity, every choice a finite one, ``value`` their total worth."""
    for t in caps:
        assert sum(c.count for c in choices if c.node_type == t) <= caps[t]
    for j, c in enumerate(choices):
        assert c.count == 0 or np.isfinite(tables[j][c.node_type][c.count])
    assert value == pytest.approx(_worth(tables, choices, range(len(tables))))


def test_every_group_gets_at_least_its_share_optimum_and_the_answer_fits():
    types = TYPES
    for tables, groups, caps in _instances(7):
        choices, value, how = shares.solve(tables, groups, caps, cost=1.0)
        assert how == "share" or how.startswith("share-")
        _assert_fits(tables, choices, caps, value)
        users = {t: {g for job, g in zip(tables, groups) if t in job and np.isfinite(job[t][1 : caps[t] + 1]).any()} for t in types}
        share = shares.split(caps, users)
        for g in set(groups):
            members = [j for j in range(len(tables)) if groups[j] == g]
            own = _brute([tables[j] for j in members], share.get(g, {t: 0 for t in types}) | {t: 0 for t in types if t not in share.get(g, {})})
            assert _worth(tables, choices, members) >= own - 1e-6 * max(1.0, abs(own)), f"group {g!r} below its share's optimum"
        assert value <= typed.solve(tables, caps)[1] + 1e-6 * max(1.0, abs(value))  # never above the samples objective's optimum


def test_one_group_is_the_samples_objective():
    rng = random.Random(3)
    types = ["k80", "v100"]
    for _ in range(30):
        tables = _random(rng, rng.randint(1, 7), types)
        caps = {t: rng.randint(0, 5) for t in types}
        _, value, _ = shares.solve(tables, ["g"] * len(tables), caps)
        _, best, _ = typed.solve(tables, caps)
        assert value == pytest.approx(best)


def test_no_node_a_job_would_gain_from_is_left_idle():
    # Group "slow" has one job that can use 1 node; its share is 4: the 3 it leaves go to group "fast".
    fast = {"v100": np.array([0.0] + [100.0 * n for n in range(1, 9)])}
    slow = {"v100": np.array([0.0, 5.0])}
    choices, _, _ = shares.solve([fast, slow], ["fast", "slow"], {"v100": 8}, cost=1.0)
    assert choices == [Choice("v100", 7), Choice("v100", 1)]


def _problem(groups: list[str], rates: list[float], nodes: int, hi: int = 8) -> Problem:
    jobs = tuple(Job(f"j{i}", 1, hi, ScalingCurve((0, hi), (0.0, rate * hi)), group=g) for i, (g, rate) in enumerate(zip(groups, rates)))
    return Problem(jobs, NodePool(tuple(f"n{i}" for i in range(nodes))), {}, 10.0)


def test_a_slow_group_is_not_starved_under_whole_shares_and_is_under_samples():
    problem = _problem(["fast", "fast", "slow", "slow"], [100.0, 90.0, 1.0, 1.0], nodes=16)
    samples = allocate(problem)
    share = allocate(problem, objective=Objective.SHARE, share_cost=1.0)
    assert samples.counts["j2"] + samples.counts["j3"] == 0  # every node earns more on the fast group's jobs
    assert share.counts["j2"] + share.counts["j3"] == 8 and share.counts["j0"] + share.counts["j1"] == 8
    assert share.method.startswith("share-") and share.objective < samples.objective
    assert allocate(problem, objective="share", share_cost=1.0).counts == share.counts


def test_the_share_objective_never_costs_more_than_its_bound():
    for tables, groups, caps in _instances(11):
        stopped = sum(float(next(iter(tb.values()))[0]) for tb in tables)
        best = typed.solve(tables, caps)[1]
        for cost in (0.0, 0.03, 0.3):
            choices, value, _ = shares.solve(tables, groups, caps, cost=cost)
            _assert_fits(tables, choices, caps, value)
            assert value - stopped >= (1 - cost) * (best - stopped) - 1e-6 * max(1.0, abs(best)), f"share at cost {cost} below its bound"


def test_shares_that_cost_little_are_kept_whole():
    # Two groups of like jobs: the even split costs nothing, so the default bound keeps each group's whole share.
    problem = _problem(["a", "a", "b", "b"], [10.0, 10.0, 10.0, 10.0], nodes=8)
    bounded = allocate(problem, objective=Objective.SHARE)
    whole = allocate(problem, objective=Objective.SHARE, share_cost=1.0)
    assert bounded.counts == whole.counts
    assert bounded.counts["j0"] + bounded.counts["j1"] == 4 == bounded.counts["j2"] + bounded.counts["j3"]


def test_where_whole_shares_cost_too_much_they_shrink_to_what_the_bound_allows():
    # The slow group's nodes earn a hundredth of the fast group's: its whole share would cost about half the samples.
    problem = _problem(["fast", "fast", "slow", "slow"], [100.0, 90.0, 1.0, 1.0], nodes=16)
    samples = allocate(problem)
    slow = {}
    for cost in (0.0, 0.03, 0.3, 1.0):
        answer = allocate(problem, objective=Objective.SHARE, share_cost=cost)
        assert answer.objective >= (1 - cost) * samples.objective - 1e-6
        slow[cost] = answer.counts["j2"] + answer.counts["j3"]
    assert slow[0.0] == 0 and slow[1.0] == 8
    assert slow[0.0] <= slow[0.03] <= slow[0.3] <= slow[1.0] and slow[0.3] > 0  # more bound, more of the share


def test_share_without_groups_decides_as_samples():
    problem = _problem(["", "", ""], [3.0, 2.0, 1.0], nodes=10)
    assert allocate(problem, objective=Objective.SHARE).counts == allocate(problem).counts


def test_with_due_jobs_share_keeps_every_due_job_and_its_price_is_on_the_jobs_worth_not_the_bonuses():
    """Due jobs earn bonuses (allocator/due.py) much larger than a node's worth; the share objective's bound is on what
    the jobs earn, so 3 % of a total swollen by bonuses neither buys a larger price nor the place of a due job."""
    rng = random.Random(5)
    checked = 0
    for _ in range(150):
        tables = _random(rng, rng.randint(4, 9), TYPES[:1])
        groups = [rng.choice("AB") for _ in tables]
        caps = {TYPES[0]: rng.randint(3, 10)}
        order = [j for j in range(len(tables)) if rng.random() < 0.4]
        samples, plain, _ = due.solve(tables, order, caps)
        share, value, how = due.solve(tables, order, caps, groups=groups, share_cost=0.03)
        _assert_fits(tables, share, caps, value)
        running = lambda picked: [picked[j].count > 0 for j in order]  # noqa: E731
        assert running(share) == running(samples) or sum(running(share)) == sum(running(samples)), how
        assert order == [] or share[order[0]].count > 0 or samples[order[0]].count == 0
        stopped = sum(float(next(iter(tb.values()))[0]) for tb in tables)
        assert value - stopped >= 0.97 * (plain - stopped) - 1e-6 * max(1.0, abs(plain)), f"share cost more than 3 %: {how}"
        checked += how.startswith("due-share") and "(0 shared)" not in how
    assert checked > 20  # shares were taken (whole or cut), not only the samples answer
