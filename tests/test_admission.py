"""Which waiting jobs a decision weighs: by what starting each would add (``[controller] admission = "worth"``, the
default) or first come, first served (``"arrival"``, BFTrainer's); and the rule that keeps admission by worth from
passing a slow model over for ever (a job that has waited long enough is *due*: started first, at its minimum, within
a share of the machine: ``controller/waiting.py``, ``allocator/due.py``)."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
from test_replay import jobs_file, linear_job, trace_file

from pilotfill.allocator import Job, NodePool, Problem, ScalingCurve, allocate, due, typed
from pilotfill.config import ConfigError, load_config
from pilotfill.controller.waiting import WaitingJobs, admit, worth_order
from pilotfill.controller.world import World
from pilotfill.replay import replay
from pilotfill.journal import Journal

pytestmark = pytest.mark.unit


# ---------------------------------------------------------------- the order of admission


def admitted_in_order(lo: list[int], room: int | None, limit: int, running: int, order: list[int]) -> list[int]:
    """The rule as a loop over the jobs in ``order``: while their minimums fit the room (one that never could takes no
    place), or the first ``limit`` less the running ones."""
    out, need, count = [], 0, running
    for i in order:
        if limit and count >= limit:
            break
        if room is not None:
            if lo[i] > room:
                continue
            if not limit and need + lo[i] > room:
                break
        need += lo[i]
        out.append(i)
        count += 1
    return sorted(out)


@pytest.mark.parametrize("seed", range(30))
def test_admission_in_a_given_order_takes_jobs_in_that_order_while_they_fit(seed):
    rng = random.Random(seed)
    lo = [rng.choice([1, 1, 2, 4, 8, 64]) for _ in range(rng.randint(0, 50))]
    order = list(range(len(lo)))
    rng.shuffle(order)
    room = rng.choice([None, 0, 3, 17, 100])
    limit = rng.choice([0, 0, 5])
    running = rng.randint(0, 6)
    got = admit(np.array(lo, dtype=np.int64), room, limit, running, order=np.array(order, dtype=np.int64))
    assert got.tolist() == admitted_in_order(lo, room, limit, running, order)


def test_worth_order_puts_the_due_first_in_submission_order_then_the_most_worth_and_the_unvalued_last():
    nan = np.nan
    worth = np.array([(1.0, 1.0), (5.0, 0.0), (nan, nan), (1.0, 3.0), (9.0, 9.0), (5.0, 0.0), (0.0, 0.0)])
    due = np.array([False, False, False, False, False, False, True])
    assert worth_order(worth, due).tolist() == [6, 4, 1, 5, 3, 0, 2]
    assert worth_order(worth, np.array([True, False, True, False, False, False, False])).tolist() == [0, 2, 4, 1, 5, 3, 6]
    assert worth_order(np.zeros((0, 2)), np.zeros(0, dtype=bool)).tolist() == []


class Described:
    """A waiting job's kind is its min_nodes and its worth its ``rate`` (the spec's), each call counted."""

    def __init__(self):
        self.valued: list[str] = []

    def kind(self, job) -> int:
        return -1  # like no other

    def worth(self, job) -> tuple[float, float]:
        self.valued.append(job.id)
        return (float(job.spec["rate"]), 0.0)

    def waiting(self) -> WaitingJobs:
        return WaitingJobs(self.kind, self.worth, lambda job: 0, lambda job: (True, 0.0))


def _world(tmp_path) -> World:
    (tmp_path / "run").mkdir()
    return World(Journal(tmp_path / "run"))


def test_admission_by_worth_takes_the_jobs_a_node_earns_most_while_they_fit_and_the_due_first(tmp_path):
    world = _world(tmp_path)
    described = Described()
    waiting = described.waiting()
    rates = [3, 9, 1, 7, 5, 8]
    jobs = [world.add_job(f"j{i}", "sweep", {"min_nodes": 1 + (i == 1), "rate": r}, 0.0) for i, r in enumerate(rates)]
    waiting.sync(world, world.take_changed(), recheck=False, now=0.0)
    assert [j.id for j in waiting.admitted(3, 0, 0).jobs] == ["j0", "j1"]  # submission order: 1 + 2 nodes
    got = waiting.admitted(3, 0, 0, by_worth=True)
    assert [j.id for j in got.jobs] == ["j1", "j5"]  # the most worth: 9 on two nodes, then 8 (submission order back)
    assert [j.id for j in waiting.admitted(3, 0, 0, by_worth=True, due=[jobs[2].seq]).jobs] == ["j1", "j2"]  # the due first
    assert [j.id for j in waiting.admitted(None, 2, 0, by_worth=True).jobs] == ["j1", "j5"]  # a cap: the best two
    assert sorted(described.valued) == sorted(j.id for j in jobs)  # each valued once
    world.update_job(jobs[1], status="running", nodes=["n1"])
    waiting.sync(world, world.take_changed(), recheck=False, now=10.0)
    assert [j.id for j in waiting.admitted(2, 0, 0, by_worth=True).jobs] == ["j3", "j5"]
    assert len(described.valued) == len(jobs)  # nothing valued again


def test_a_campaign_submitted_at_once_is_valued_over_a_few_admissions_the_unvalued_taken_last(tmp_path, monkeypatch):
    from pilotfill.controller import waiting as waiting_module

    monkeypatch.setattr(waiting_module, "VALUED_PER_PASS", 4)
    world = _world(tmp_path)
    described = Described()
    waiting = described.waiting()
    for i in range(10):
        world.add_job(f"j{i}", "sweep", {"min_nodes": 1, "rate": i}, 0.0)
    waiting.sync(world, world.take_changed(), recheck=False, now=0.0)
    first = waiting.admitted(6, 0, 0, by_worth=True)
    assert sorted(described.valued) == ["j0", "j1", "j2", "j3"]
    assert [j.id for j in first.jobs] == ["j0", "j1", "j2", "j3", "j4", "j5"]  # the four valued, then two not yet
    waiting.admitted(6, 0, 0, by_worth=True)
    waiting.admitted(6, 0, 0, by_worth=True)
    assert len(described.valued) == 10
    assert [j.id for j in waiting.admitted(3, 0, 0, by_worth=True).jobs] == ["j7", "j8", "j9"]


def test_a_job_waits_since_its_submission_or_its_last_stop_and_a_change_of_it_keeps_that(tmp_path):
    world = _world(tmp_path)
    waiting = Described().waiting()
    a = world.add_job("a", "sweep", {"min_nodes": 1, "rate": 1}, 5.0)
    b = world.add_job("b", "sweep", {"min_nodes": 1, "rate": 1}, 7.0)
    waiting.sync(world, world.take_changed(), recheck=False, now=100.0)
    assert [j.id for j in waiting.overdue(6.0)] == ["a"]
    assert [j.id for j in waiting.overdue(7.0)] == ["a", "b"]
    world.update_job(a, status="running", nodes=["n0"], launches=1)
    waiting.sync(world, world.take_changed(), recheck=False, now=200.0)
    world.requeue(a)  # stopped: it waits again from now
    world.set_spec(b, {"min_nodes": 1, "rate": 2})  # changed while it waits: it has waited as long as before
    waiting.sync(world, world.take_changed(), recheck=False, now=300.0)
    assert [j.id for j in waiting.overdue(299.0)] == ["b"]
    assert [j.id for j in waiting.overdue(300.0)] == ["a", "b"]


def test_admission_is_a_controller_setting_checked_by_name(tmp_path):
    assert load_config(None).controller.admission == "worth"
    (tmp_path / "a.toml").write_text('[controller]\nadmission = "arrival"\n')
    assert load_config(tmp_path / "a.toml").controller.admission == "arrival"
    (tmp_path / "b.toml").write_text('[controller]\nadmission = "fifo"\n')
    with pytest.raises(ConfigError, match=r"controller\.admission: 'fifo' is not one of worth, arrival"):
        load_config(tmp_path / "b.toml")


# ---------------------------------------------------------------- due jobs in the allocator


def _job(name: str, rate: float, lo: int = 1, hi: int = 4, due_: bool = False, **kw) -> Job:
    job = Job(name, lo, hi, ScalingCurve((0, hi), (0.0, rate * hi)), **kw)
    return job.as_due() if due_ else job


def _brute_due(tables, due_: list[int], caps: dict[str, int]) -> tuple[tuple, float]:
    """By enumeration, the best answer by (the first due job runs, how many due jobs run, total worth): its key."""
    options = [[(None, 0)] + [(t, n) for t, row in tb.items() for n in range(1, len(row)) if np.isfinite(row[n])] for tb in tables]
    best = None
    for pick in itertools.product(*options):
        used = {t: 0 for t in caps}
        for t, n in pick:
            if t is not None:
                used[t] += n
        if all(used[t] <= caps[t] for t in caps):
            value = sum(float(tb[t][n]) if n else float(next(iter(tb.values()))[0]) for tb, (t, n) in zip(tables, pick))
            key = (bool(due_) and pick[due_[0]][1] > 0, sum(pick[j][1] > 0 for j in due_), value)
            best = key if best is None or key > best else best
    return best


@pytest.mark.parametrize("seed", range(100))
def test_the_oldest_due_job_runs_where_it_fits_then_as_many_due_jobs_as_fit_then_the_most_worth(seed):
    rng = random.Random(seed)
    types = rng.choice([["v100"], ["k80", "v100"]])
    tables = []
    for _ in range(rng.randint(1, 5)):
        lo, hi = rng.choice([1, 1, 2]), rng.randint(2, 3)
        stop = rng.choice([0.0, -rng.uniform(0, 20)])
        job = {}
        for t in rng.sample(types, rng.randint(1, len(types))):
            rate = 10 ** rng.uniform(0, 3)
            job[t] = np.array([stop] + [stop + rate * n ** rng.uniform(0.6, 1.1) if n >= lo else -np.inf for n in range(1, hi + 1)])
        tables.append(job)
    caps = {t: rng.randint(0, 5) for t in types}
    order = [j for j in range(len(tables)) if rng.random() < 0.5]
    choices, value, how = due.solve(tables, order, caps)
    assert how.startswith("due-")
    for t in types:
        assert sum(c.count for c in choices if c.node_type == t) <= caps[t]
    key = (bool(order) and choices[order[0]].count > 0, sum(choices[j].count > 0 for j in order), value)
    best = _brute_due(tables, order, caps)
    assert key[:2] == best[:2] and value == pytest.approx(best[2], rel=1e-9, abs=1e-6)
    assert value <= typed.solve(tables, caps)[1] + 1e-6  # the rule costs worth, never adds it
    if not order:
        assert value == pytest.approx(typed.solve(tables, caps)[1])


def test_a_due_job_runs_before_faster_ones_and_keeps_its_nodes_through_exploring():
    nodes = NodePool(tuple(f"n{i}" for i in range(4)))
    fast = [_job(f"f{i}", 100.0) for i in range(3)]
    slow = _job("slow", 1.0, lo=2)
    plain = allocate(Problem((*fast, slow), nodes, {}, 10.0))
    assert plain.counts["slow"] == 0
    answer = allocate(Problem((*fast, slow.as_due()), nodes, {}, 10.0))
    assert answer.counts["slow"] == 2 and sum(answer.counts.values()) == 4 and answer.method.startswith("due-")  # its minimum: more earns less
    # With an optimistic curve for the fast jobs (JPA exploring), the second stage does not take the due job's nodes.
    explorers = [Job(f"e{i}", 1, 4, ScalingCurve((0, 4), (0.0, 4.0)), explore=ScalingCurve((0, 4), (0.0, 4000.0))) for i in range(2)]
    answer = allocate(Problem((*explorers, slow.as_due()), nodes, {}, 10.0))
    assert answer.counts["slow"] == 2 and answer.counts["e0"] + answer.counts["e1"] == 2
    # Several kinds of node: where it costs the others least (the slow job is 2x faster on k80; the fast ones 2x on v100), kept through
    # the typed exploring stage.
    pool = NodePool(tuple(f"n{i}" for i in range(6)), {**{f"n{i}": "k80" for i in range(3)}, **{f"n{i}": "v100" for i in range(3, 6)}})
    curves = lambda k80, v100: {"k80": ScalingCurve((0, 3), (0.0, 3 * k80)), "v100": ScalingCurve((0, 3), (0.0, 3 * v100))}  # noqa: E731
    jobs = [Job(f"f{i}", 1, 3, curves(50.0, 100.0), explore=curves(500.0, 1000.0)) for i in range(3)] + [Job("s", 1, 1, curves(2.0, 1.0)).as_due()]
    answer = allocate(Problem(tuple(jobs), pool, {}, 10.0))
    assert (answer.counts["s"], answer.node_type["s"]) == (1, "k80")


def test_a_due_job_takes_nodes_from_ordinary_jobs_but_not_from_one_being_measured():
    """A due job's bonus outweighs what ordinary jobs lose (their worth, their rescale and restart costs), however fast
    they are, not a job being measured, whose move costs an exploring rate (10¹² samples/s)."""
    nodes = NodePool(("n0", "n1"))
    fast = [_job(f"f{i}", 100.0, hi=1, restart_cost_s=30.0) for i in range(2)]
    current = {"f0": frozenset({"n0"}), "f1": frozenset({"n1"})}
    slow = _job("slow", 1.0, hi=1).as_due()
    answer = allocate(Problem((*fast, slow), nodes, current, 10.0))
    assert answer.counts["slow"] == 1 and answer.counts["f0"] + answer.counts["f1"] == 1
    measured = [Job(f"m{i}", 1, 1, ScalingCurve((0, 1), (0.0, 1e12)), restart_cost_s=30.0) for i in range(2)]
    answer = allocate(Problem((*measured, slow), nodes, {"m0": frozenset({"n0"}), "m1": frozenset({"n1"})}, 10.0))
    assert answer.counts["slow"] == 0 and answer.counts["m0"] == answer.counts["m1"] == 1
    faster = [_job(f"g{i}", 1e6, hi=1, restart_cost_s=30.0) for i in range(2)]  # a faster job is displaced, though
    answer = allocate(Problem((*faster, slow), nodes, {"g0": frozenset({"n0"}), "g1": frozenset({"n1"})}, 10.0))
    assert answer.counts["slow"] == 1


def test_under_admission_by_worth_waiting_jobs_told_apart_only_by_their_work_are_weighed_a_few_at_a_time(write, monkeypatch):
    """Waiting jobs of one model differ in their work and costs; neither changes what starting one is worth but that
    more work may earn more: they are one chain, weighed the most work first, a few at a time (more only when every
    one weighed is used). In submission order each is a kind of its own, and all are weighed at once."""
    from pilotfill.controller import planner as planner_module

    tr = trace_file(write, {f"n{i}": True for i in range(30)}, [], end=HOURS)
    rows = [linear_job(f"a{i}", lo=1, hi=8, total=1e9 * (i + 1), up=10 + i, per_node=100) for i in range(12)]
    rows += [linear_job(f"b{i}", lo=1, hi=8, total=1e9 * (i + 1), per_node=50) for i in range(12)]
    jobs = jobs_file(write, rows)
    real = planner_module.allocate
    weighed: list[int] = []
    monkeypatch.setattr(planner_module, "allocate", lambda problem, *a, **k: weighed.append(len(problem.jobs)) or real(problem, *a, **k))
    worth = replay(tr, jobs, keep_timeline=False)
    most = max(weighed)
    weighed.clear()
    arrival = replay(tr, jobs, keep_timeline=False, admission="arrival")
    assert most <= 16 < max(weighed) == 24  # by worth: 4 of each chain, then 12 of the one whose 4 were all used
    assert worth.samples == pytest.approx(arrival.samples, rel=1e-9)  # the same answer: four "a" jobs on 8, 8, 8, 6 nodes
    started = {j.name for j in worth.jobs if j.admitted is not None}
    assert len(started) == 4 and all(name.startswith("a") for name in started)


# ---------------------------------------------------------------- through the controller, on a replayed machine

HOURS = 3600


def test_arrival_order_starves_the_best_job_and_admission_by_worth_starts_it(write):
    """Four slow jobs arrive first on a machine of two nodes; a job a hundred times faster arrives a minute later. In
    submission order the two nodes the machine could start admit the next two slow jobs, never the fast one: it waits
    the whole replay. By worth it is admitted at once and takes a node from a slow job."""
    tr = trace_file(write, {"n0": True, "n1": True}, [], end=12 * HOURS)
    rows = [linear_job(f"slow{i}", lo=1, hi=1, total=1e12, per_node=10) for i in range(4)] + [linear_job("fast", submit=60, lo=1, hi=1, total=1e12, per_node=1000)]
    jobs = jobs_file(write, rows)
    arrival = replay(tr, jobs, admission="arrival", keep_timeline=False)
    worth = replay(tr, jobs, keep_timeline=False)
    first = {r: {j.name: j.admitted for j in res.jobs} for r, res in (("arrival", arrival), ("worth", worth))}
    t0 = tr.start
    assert first["arrival"]["fast"] is None
    assert (arrival.jobs_never_started, arrival.longest_wait_s) == (3, pytest.approx(12 * HOURS))  # two slow ones too
    assert first["worth"]["fast"] - t0 == pytest.approx(60)
    assert worth.samples > 50 * arrival.samples / 2  # the fast job's node earns a hundred times a slow one's


@pytest.mark.parametrize("overdue_h", [1.0, None], ids=["bound-1h", "no-bound"])
def test_a_slow_job_passed_over_by_a_stream_of_faster_ones_starts_within_the_bound(write, overdue_h):
    """Three fast jobs arrive first, a slow one a minute later, then a fast one every five minutes, each fifteen
    minutes of work on one of the two nodes, so some always wait. Arrival order admits the slow job with the oldest
    fast one, and the allocator starts the fast one every time; admission by worth never weighs it. With the bound
    (here an hour) it is due after an hour: started at its minimum within the next decision, and kept running — it
    is never stopped for a faster job (only moved when its pilot reaches its walltime, every six hours). On two
    nodes the first due job has one of them: what the rule costs is at most the share it is given (here all the
    faster jobs' half of the machine)."""
    tr = trace_file(write, {"n0": True, "n1": True}, [], end=12 * HOURS)
    rows = [linear_job(f"fast{i}", submit=max(0, 300 * (i - 2)), lo=1, hi=1, total=9e5, per_node=1000) for i in range(3)]
    rows += [linear_job("slow", submit=60, lo=1, hi=1, total=1e12, per_node=10)]
    rows += [linear_job(f"fast{i}", submit=300 * (i - 2), lo=1, hi=1, total=9e5, per_node=1000) for i in range(3, 12 * 12)]
    jobs = jobs_file(write, rows)
    options = dict(keep_timeline=False, overdue_s=overdue_h * HOURS if overdue_h else 1e12)
    worth = replay(tr, jobs, **options)
    slow = next(j for j in worth.jobs if j.name == "slow")
    if overdue_h is None:
        assert slow.admitted is None
        assert worth.longest_wait_s == pytest.approx(12 * HOURS - 60)
        arrival = replay(tr, jobs, admission="arrival", keep_timeline=False)
        slow_arrival = next(j for j in arrival.jobs if j.name == "slow")  # started when both nodes free at once, then stopped
        assert slow_arrival.samples < 10 * 15 * 60
        assert worth.samples >= arrival.samples
        return
    assert slow.admitted is not None and 60 + overdue_h * HOURS <= slow.admitted - tr.start <= 60 + overdue_h * HOURS + 300
    assert slow.samples >= 0.999 * 10 * (tr.end - slow.admitted)  # never stopped for another job once started


def test_under_learned_curves_a_never_run_job_is_valued_by_its_model_so_the_fast_models_waiting_jobs_start_first(write):
    """Learned curves: no job's curve is given. On two nodes a slow job and a fast one start at once (both measured
    first); slow jobs, then fast ones, wait behind them. When the fast one ends, the waiting jobs were all worth the
    same (none ran), so by worth the oldest slow one took its node and kept it — the fast jobs never ran. Valued by
    what their model's jobs reported (the job file's model, declared by name), the fast ones start first and all end."""
    from pilotfill.allocator import Profiler

    tr = trace_file(write, {"n0": True, "n1": True}, [], end=12 * HOURS)

    def row(name: str, model: str, submit: float, per_node: float) -> str:
        return linear_job(name, submit=submit, lo=1, hi=1, total=9e5, per_node=per_node).replace(",m,", f",{model},", 1)

    rows = [row("slow0", "slowm", 0, 10), row("fast0", "fastm", 0, 1000)]
    rows += [row(f"slow{i}", "slowm", 10, 10) for i in range(1, 6)] + [row(f"fast{i}", "fastm", 20, 1000) for i in range(1, 6)]
    jobs = jobs_file(write, rows)
    worth = replay(tr, jobs, keep_timeline=False, profiles="learned", noise=0.0, accounting="realistic")
    fast = [j for j in worth.jobs if j.name.startswith("fast")]
    assert all(j.finished is not None for j in fast)
    assert sum(j.admitted is not None for j in worth.jobs if j.name.startswith("slow")) <= 2  # slow0, and the node left after the fast ones
    arrival = replay(tr, jobs, keep_timeline=False, profiles="learned", noise=0.0, accounting="realistic", admission="arrival")
    assert worth.samples > 2 * arrival.samples

    jpa = Profiler()  # pure: what the model's jobs reported values a declared job until its own reports arrive
    jpa.declare("a", "m")
    jpa.declare("b", "m")
    jpa.take_touched()
    assert jpa.confirmed("b", 1, 4).at(2) < 1  # no job of the model reported: cold
    jpa.observe("a", 2, 200.0, weight=60.0)
    assert "b" in jpa.take_touched()
    assert jpa.confirmed("b", 1, 4).at(2) == pytest.approx(200.0) and not jpa.measured("b")
    jpa.forget("a")  # ended: what it reported stays with its model
    assert jpa.confirmed("b", 1, 4).at(2) == pytest.approx(200.0)
    jpa.observe("b", 1, 50.0, weight=60.0)
    assert jpa.confirmed("b", 1, 4).at(1) == pytest.approx(50.0)  # its own reports replace the model's
    assert jpa.confirmed("c", 1, 4).at(2) < 1  # undeclared: cold
