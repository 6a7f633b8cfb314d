"""The controller's decisions, in process: the real Controller on a simulated clock.

The batch system is the replay's trace-driven one and the runtime the replay's
simulated one — both real parts of pilotfill — so every call the controller
makes to them (submissions, releases, starts, resizes, stops) is what it
would make on a machine, and can be counted.
"""

from __future__ import annotations

import time

import json

import pytest
from conftest import JOB_HEADER

from pilotfill.allocator import DEFAULT_TYPE
from pilotfill.config import Config, ControllerConfig, PilotConfig
from pilotfill.controller import Controller
from pilotfill.controller import planner as planner_module
from pilotfill.controller import schedule
from pilotfill.controller.schedule import Phase
from pilotfill.controller.views import AllocatorViews
from pilotfill.elastic.simulated import SimulatedRuntime
from pilotfill.schedulers.replay import ReplayScheduler
from pilotfill.journal import Journal
from pilotfill.traces import read_jobs, read_trace

pytestmark = pytest.mark.unit

T0 = "2021-02-10T00:00:00Z"


class Machine:
    """A controller, its batch system and runtime, and a clock the test moves."""

    def __init__(self, tmp_path, write, nodes: int, jobs: list[str], busy: list[tuple[int, str, str]] = (), nodes_per_pilot: int = 1,
                 runtime=SimulatedRuntime, **pilots):  # fmt: skip
        lines = ["time,node,state"] + [f"{T0},n{i},idle" for i in range(nodes)]
        lines += [f"2021-02-10T00:{t // 60:02d}:{t % 60:02d}Z,{n},{s}" for t, n, s in busy]
        lines.append("2021-02-10T01:00:00Z,,end")
        self.trace = read_trace(write("trace.csv", "\n".join(lines) + "\n"))
        self.specs = {j.name: j for j in read_jobs(write("jobs.csv", "\n".join([JOB_HEADER, *jobs]) + "\n"))}
        self.now = self.trace.start
        self.scheduler = ReplayScheduler(self.trace, queue_delay_s=0.0, grace_s=5.0)
        self.runtime = runtime(self.specs, now=self.now)
        config = Config(
            scheduler="replay",
            pilots=PilotConfig(heartbeat_s=3600.0, heartbeat_deadline_s=7200.0, nodes_per_pilot=nodes_per_pilot, **pilots),
            controller=ControllerConfig(tick_s=1.0, t_fwd=10.0),
        )
        self.run_dir = tmp_path / "run"
        self.ctl = Controller(self.run_dir, config, scheduler=self.scheduler, runtime=self.runtime, clock=lambda: self.now)
        self.ids: dict[str, str] = {}

    def submit(self, name: str, **extra) -> str:
        spec = self.specs[name]
        job = {
            "name": name, "entry": "pilotfill.replay:simulated", "min_nodes": spec.min_nodes, "max_nodes": spec.max_nodes,
            "scale_up_cost_s": spec.scale_up_cost_s, "scale_down_cost_s": spec.scale_down_cost_s, "restart_cost_s": 0.0,
            "curve": {"nodes": list(spec.throughput.nodes), "samples_per_s": list(spec.throughput.values)}, **extra,
        }  # fmt: skip
        reply = self.ctl.handle({"type": "job.submit", "spec": job})
        assert reply["ok"], reply
        self.ids[name] = reply["job_id"]
        return reply["job_id"]

    def at(self, seconds: float) -> None:
        """Move the clock to ``seconds`` after the start and let everything that happens then happen."""
        self.now = self.trace.start + seconds
        self.runtime.advance(self.now)
        for _ in range(20):
            self.scheduler.advance(self.now)
            messages = self.runtime.outbox + self.scheduler.outbox
            self.runtime.outbox, self.scheduler.outbox = [], []
            for m in messages:
                assert self.ctl.handle(m)["ok"]
            self.ctl.step(self.now)
            starting = self.scheduler.free and any(p.start_at <= self.now for p in self.scheduler.queued.values())
            if not messages and not self.scheduler.outbox and not starting and not self.ctl.busy:
                return

    def job(self, name: str):
        return self.ctl.world.jobs[self.ids[name]]

    def events(self, kind: str | None = None) -> list[dict]:
        return self.ctl.journal.events(kind)


def linear(name: str, lo: int, hi: int, per_node: float, up: float = 10, down: float = 5, total: float = 1e12) -> str:
    counts = ";".join(str(n) for n in range(hi + 1))
    return f"{name},m,{T0},{lo},{hi},{total},{up},{down},{counts},{';'.join(str(per_node * n) for n in range(hi + 1))}"


def test_a_node_moving_between_jobs_in_one_allocation_is_never_released(tmp_path, write):
    """Regression: the node a job gives up to another in the same allocation stayed unassigned and was released.

    A holds two nodes, B two. A loses one to the main workload; its second node is
    worth more than B's second, so the same decision moves one of B's nodes to A.
    A comes first in the loop over jobs: the old code assigned the node to A, then
    cleared it while shrinking B, and gave it back to the batch system.
    """
    a = "a,m,2021-02-10T00:00:00Z,1,2,1e12,1,1,0;1;2,0;100;1000"
    m = Machine(tmp_path, write, 4, [a, linear("b", 1, 4, 300)], busy=[(60, "n0", "busy")])
    m.submit("a")
    m.submit("b")
    m.at(0)
    held = {n: m.ctl.world.nodes[n].job for n in m.ctl.world.ready}
    assert sorted(held.values()) == sorted([m.ids["a"]] * 2 + [m.ids["b"]] * 2)
    a_nodes = set(m.job("a").nodes)
    assert "n0" in a_nodes
    m.at(60)  # n0 is taken back: A shrinks to 1 and takes one of B's
    assert len(m.job("a").nodes) == 2 and len(m.job("b").nodes) == 1
    moved = (set(m.job("a").nodes) - a_nodes).pop()
    assert m.ctl.world.nodes[moved].job == m.ids["a"]
    assert m.ctl.world.counters["nodes_released"] == 0
    assert m.scheduler.holder[moved] == m.ctl.world.nodes[moved].pilot  # still ours in the batch system
    assert not m.events("node.released")


def test_a_pilot_of_four_nodes_leaving_is_one_decision_and_one_rescale_per_job(tmp_path, write):
    m = Machine(tmp_path, write, 8, [linear("a", 1, 4, 100), linear("b", 1, 4, 100)], busy=[(120, "n0", "busy")], nodes_per_pilot=4)
    m.submit("a")
    m.submit("b")
    m.at(0)
    assert len(m.ctl.world.pilots) == 2 and all(len(p.nodes) == 4 for p in m.ctl.world.pilots.values())
    before = {name: (m.runtime.jobs[m.ids[name]].rescales, m.runtime.jobs[m.ids[name]].preemptions) for name in "ab"}
    decisions = len(m.ctl.stats["solve_ms"])
    seq = m.events()[-1]["seq"]
    m.at(120)  # n0's pilot is preempted: its four nodes leave at once
    after = [e for e in m.events() if e["seq"] > seq]
    assert [e["kind"] for e in after].count("node.leaving") == 4
    assert len(m.ctl.stats["solve_ms"]) - decisions == 1, "one pilot leaving, one decision"
    for name in "ab":
        changes = [e for e in after if e["job"] == m.ids[name] and e["kind"] in ("job.resized", "job.stopped", "job.started")]
        assert len(changes) <= 1, changes
        job = m.runtime.jobs[m.ids[name]]
        assert job.rescales + job.preemptions - sum(before[name]) <= 2  # the loss, and at most one reallocation of it
    assert sum(len(m.job(n).nodes) for n in "ab") == 4


def test_fill_and_release_come_from_one_decision(tmp_path, write):
    """No pilot is submitted for nodes the jobs would not use, and nothing is released while a job waits."""
    m = Machine(tmp_path, write, 16, [linear("a", 1, 3, 100), linear("b", 4, 4, 100)])
    m.submit("a")
    m.at(0)
    assert m.ctl.world.counters["pilots_submitted"] == 3  # a can use 3 of the 16 idle nodes: 3 pilots, not 16
    assert len(m.job("a").nodes) == 3
    m.submit("b")  # needs 4 at once
    m.at(1)
    assert m.ctl.world.counters["pilots_submitted"] == 7
    assert len(m.job("b").nodes) == 4
    assert m.ctl.world.counters["nodes_released"] == 0
    # a finishes: its nodes go back at once, and nothing is asked for again.
    m.ctl.handle({"type": "job.result", "job_id": m.ids["a"], "value": 1})
    m.at(2)
    assert m.ctl.world.counters["nodes_released"] == 3
    assert m.ctl.world.counters["pilots_submitted"] == 7
    assert m.scheduler.counts.rerequested_within_60s == 0


def test_a_node_a_job_leaves_is_kept_while_another_job_could_grow_then_given_back(tmp_path, write):
    """A job that ends frees a node no running job wants at that moment; the next decision often wants it (another
    job ends, one arrives). Releasing it and asking again seconds later is what a site sees as thrash (the README's
    campaign did exactly that), so it is kept for ``release_after_s`` while some job could still grow, then given back."""
    flat = "flat,m,2021-02-10T00:00:00Z,1,2,1e12,10,5,0;1;2,0;100;100"  # a second node adds nothing: never wanted now
    m = Machine(tmp_path, write, 2, [linear("x", 1, 1, 100), flat, linear("y", 1, 1, 100)], release_after_s=30.0)
    m.submit("x")
    m.submit("flat")
    m.at(0)
    assert len(m.job("x").nodes) == 1 and len(m.job("flat").nodes) == 1
    freed = m.job("x").nodes[0]
    m.ctl.handle({"type": "job.result", "job_id": m.ids["x"], "value": 1})
    m.at(10)
    assert m.ctl.world.nodes[freed].job is None and freed in m.ctl.world.ready  # unused, kept
    assert m.ctl.world.counters["nodes_released"] == 0
    m.submit("y")  # a job arriving within the window takes the kept node: no new pilot
    m.at(20)
    assert m.job("y").nodes == [freed]
    assert m.ctl.world.counters["pilots_submitted"] == 2 and m.ctl.world.counters["nodes_released"] == 0
    m.ctl.handle({"type": "job.result", "job_id": m.ids["y"], "value": 1})
    m.at(21)
    m.at(21 + 29)
    assert m.ctl.world.counters["nodes_released"] == 0  # still within the window
    m.at(21 + 31)
    assert m.ctl.world.counters["nodes_released"] == 1  # unused for release_after_s: given back
    assert [e["node"] for e in m.events("node.released")] == [freed]
    assert m.scheduler.counts.rerequested_within_60s == 0


def test_a_node_no_open_job_could_use_is_given_back_at_once(tmp_path, write):
    m = Machine(tmp_path, write, 2, [linear("x", 1, 1, 100), linear("z", 1, 1, 100)], release_after_s=30.0)
    m.submit("x")
    m.submit("z")
    m.at(0)
    m.ctl.handle({"type": "job.result", "job_id": m.ids["x"], "value": 1})
    m.at(1)  # z is at its maximum: nothing could use the node
    assert m.ctl.world.counters["nodes_released"] == 1


def test_a_job_is_stopped_only_when_the_allocation_gains_by_it(tmp_path, write):
    """A waiting job with a slightly better curve does not evict a running one that a restart would cost."""
    m = Machine(tmp_path, write, 2, [linear("run", 2, 2, 100), linear("new", 2, 2, 110)])
    m.submit("run", restart_cost_s=60.0)
    m.at(0)
    m.submit("new")
    m.at(1)
    assert m.job("run").status == "running" and m.job("new").status == "pending"
    assert not m.events("job.stopped")


def test_an_unmeasured_job_starts_on_free_nodes_and_never_evicts_a_measured_one(tmp_path, write):
    m = Machine(tmp_path, write, 4, [linear("old", 1, 4, 10), linear("cold", 1, 4, 10)])
    old = m.submit("old")
    m.at(0)
    assert len(m.job("old").nodes) == 4
    spec = m.specs["cold"]
    job = {"name": "cold", "entry": "pilotfill.replay:simulated", "min_nodes": 1, "max_nodes": 4, "scale_up_cost_s": 10.0, "scale_down_cost_s": 5.0}
    reply = m.ctl.handle({"type": "job.submit", "spec": job})  # no curve: the profiler must learn it
    m.ids["cold"] = reply["job_id"]
    for t in range(1, 30):
        m.at(t)
    assert m.job("cold").status == "pending" and len(m.job("old").nodes) == 4
    assert not m.events("job.stopped")
    m.ctl.handle({"type": "job.result", "job_id": old, "value": 1})
    m.at(31)
    assert m.job("cold").status == "running" and len(m.job("cold").nodes) == 1  # on free nodes, at its minimum
    del spec


def test_a_job_grown_to_be_measured_keeps_its_nodes_until_it_reports_at_that_size(tmp_path, write):
    """A learned job grows onto free nodes to measure a larger size (its optimistic curve); then jobs arrive whose
    known curves would use those nodes better than what it has confirmed. It is not shrunk before a steady report at
    the new size (judged by its confirmed curve, the next decision takes the nodes back before the measurement the
    growth paid for, and the one after grows it again: a shrink and a grow every few seconds, each charged); once
    measured there, its true curve decides."""
    m = Machine(tmp_path, write, 8, [linear("cold", 1, 8, 1000.0, up=5, down=5)] + [linear(f"b{i}", 1, 1, 400.0) for i in range(7)])
    job = {"name": "cold", "entry": "pilotfill.replay:simulated", "min_nodes": 1, "max_nodes": 8, "scale_up_cost_s": 5.0, "scale_down_cost_s": 5.0}
    reply = m.ctl.handle({"type": "job.submit", "spec": job})  # no curve: the profiler learns it
    m.ids["cold"] = reply["job_id"]
    grown_at = None
    for t in range(0, 600, 5):
        m.at(t)
        if len(m.job("cold").nodes) == 8:
            grown_at = t
            break
    assert grown_at is not None, "the learned job never grew to explore"
    assert 8 not in m.ctl.profiler.scales(m.ids["cold"])
    for i in range(7):
        m.submit(f"b{i}")
    sizes = []
    for t in range(grown_at, grown_at + 120, 2):
        m.at(t)
        sizes.append((t, len(m.job("cold").nodes), 8 in m.ctl.profiler.scales(m.ids["cold"])))
        if sizes[-1][2]:
            break
    assert sizes[-1][2], f"never measured at 8 nodes: {sizes}"
    assert all(n == 8 for _, n, _ in sizes), f"shrunk before it was measured at 8: {sizes}"
    assert len([e for e in m.events("job.resized") if e.get("job") == m.ids["cold"]]) <= 2


def test_a_spare_node_is_kept_while_a_job_about_to_end_would_make_it_wanted_again(tmp_path, write):
    """Three nodes: a short job, a job ending in about a minute, and a job that gains only with two more nodes (its
    curve is flat at two, four times its rate at three). When the short job ends its node is spare; unused past
    ``release_after_s``, it is not given back while the other job is about to end: that end frees the second node
    the growth needs, and a release now would be followed by a request for a node within the minute (what a site
    sees as thrash)."""
    jobs = [linear("ending", 1, 1, 100.0, total=7000.0), linear("short", 1, 1, 100.0, total=2000.0), f"grower,m,{T0},1,3,1e12,1,1,0;1;2;3,0;100;100;400"]
    m = Machine(tmp_path, write, 3, jobs, release_after_s=10.0)
    m.submit("ending", weight=10.0, total_samples=7000.0)  # on a node first, whatever the grower would do with three
    m.submit("short", weight=10.0, total_samples=2000.0)
    m.submit("grower")
    m.at(0)
    assert [len(m.job(n).nodes) for n in ("ending", "short", "grower")] == [1, 1, 1]
    for t in range(5, 200, 5):
        m.at(t)
        if len(m.job("grower").nodes) == 3:
            break
    assert m.job("short").status == m.job("ending").status == "finished"
    assert len(m.job("grower").nodes) == 3
    assert not m.events("node.released"), m.events("node.released")


def test_the_journal_stays_bounded_as_pilots_come_and_go(tmp_path, write, monkeypatch):
    from pilotfill.controller import core

    monkeypatch.setattr(core, "KEEP_ENDED_PILOTS", 50)
    monkeypatch.setattr(core, "KEEP_EVENTS", 500)
    busy = [(t, f"n{t % 2}", "busy" if (t // 2) % 2 == 0 else "idle") for t in range(60, 3000, 2)]
    m = Machine(tmp_path, write, 2, [linear("a", 1, 2, 100, up=1, down=1)], busy=busy)
    m.submit("a")
    for t in range(0, 3000, 2):
        m.at(t)
    m.at(3100)
    assert m.ctl.world.counters["pilots_submitted"] > 300
    state = Journal(m.run_dir, readonly=True)
    try:
        ended = [p for p in state.pilots() if p["state"] in ("ended", "lost")]
        assert len(ended) <= 50 + 2
        assert len(state.events()) <= 500 + 200
    finally:
        state.close()
    assert len(m.ctl.world.pilots) <= 4
    json.dumps(m.ctl.world.snapshot())


@pytest.mark.parametrize("nodes_per_pilot", [1, 3])
def test_site_limits_on_queued_pilots_and_submissions_per_minute(tmp_path, write, nodes_per_pilot):
    m = Machine(tmp_path, write, 40, [linear("a", 1, 40, 100)], nodes_per_pilot=nodes_per_pilot, max_queued_pilots=4, max_submits_per_minute=6)
    m.scheduler.queue_delay_s = 30.0
    m.submit("a")
    m.at(0)
    assert len(m.ctl.world.queued) == 4  # the queue limit
    m.at(31)  # they started; two more fit the per-minute limit
    assert m.ctl.world.counters["pilots_submitted"] == 6
    m.at(61)
    assert m.ctl.world.counters["pilots_submitted"] == 10


def test_a_submission_the_per_minute_limit_held_back_is_made_when_the_minute_is_over(tmp_path, write):
    """Nothing else happens after the limit is reached (no pilot starts or ends, no job arrives, the idle count stands
    still): the held-back pilot is still asked for once the minute is over, not never."""
    m = Machine(tmp_path, write, 3, [linear("a", 1, 3, 100, up=0, down=0)], max_submits_per_minute=2)
    m.submit("a")
    for t in range(0, 60, 5):
        m.at(t)
    assert m.ctl.world.counters["pilots_submitted"] == 2 and len(m.job("a").nodes) == 2
    m.at(61)
    assert m.ctl.world.counters["pilots_submitted"] == 3
    m.at(62)
    assert len(m.job("a").nodes) == 3


def test_a_queue_of_identical_jobs_costs_a_decision_what_a_few_do_and_changes_nothing(tmp_path, write):
    """Ten nodes, 400 waiting copies of one job (a sweep) and one distinct job: the decision weighs a few copies at a
    time, more only while the answer uses every copy weighed — and reaches the answer that weighs them all."""
    from pilotfill.allocator import allocate

    jobs = [f"c{i},m,{T0},1,4,1e9,10,5,0;1;4,0;100;350" for i in range(400)] + [f"odd,m,{T0},2,8,1e9,10,5,0;2;8,0;300;1000"]
    m = Machine(tmp_path, write, 10, jobs)
    for name in list(m.specs):
        m.submit(name)
    m.at(0)
    m.at(1)
    ctl = m.ctl
    room = len(ctl.world.ready)
    active, problem, answer = ctl.planner.solve(room, extra=0)[:3]
    assert len(active) < 40, f"{len(active)} jobs weighed for {room} nodes"
    everyone = ctl.planner.active(room)
    assert len(everyone) >= room  # the machine admits as many as could start
    full = allocate(ctl.planner.problem(everyone, 0))
    assert answer.objective == pytest.approx(full.objective, rel=1e-9)
    assert sum(answer.counts.values()) == sum(full.counts.values()) == 10


def test_what_tells_waiting_jobs_apart_is_remembered_while_a_job_of_that_kind_is_open_and_forgotten_after(tmp_path, write):
    """Waiting jobs alike share a kind (a small number, hashed many times per decision); a kind no open job has any
    more is forgotten when the controller prunes, with the copies remembered of it, so a campaign of ever new specs
    does not grow the controller's memory."""
    from pilotfill.controller import core

    jobs = [f"a{i},m,{T0},1,4,1e9,10,5,0;1;4,0;100;350" for i in range(3)] + [f"b{i},m,{T0},1,4,1e9,10,5,0;1;4,0;90;300" for i in range(3)]
    m = Machine(tmp_path, write, 2, jobs)
    for name in m.specs:
        m.submit(name)
    m.at(0)
    ctl = m.ctl
    kinds = {name: ctl.views.kind(m.job(name)) for name in m.specs if m.job(name).status != "running" and not m.job(name).nodes}
    assert len(set(kinds.values())) == 2 and len(kinds) >= 4  # 2 run (2 nodes), the rest wait: of two kinds
    assert {kinds[n] for n in kinds if n[0] == "a"} != {kinds[n] for n in kinds if n[0] == "b"}
    b = next(number for name, number in kinds.items() if name[0] == "b")
    ctl.planner.copies[(False, b)] = 8
    for name in m.specs:
        if name[0] == "b":
            assert ctl.handle({"type": "job.cancel", "job_id": m.ids[name]})["ok"]
    m.at(core.PRUNE_EVERY_S + 1)
    assert b not in ctl.views.kind_ids.values() and (False, b) not in ctl.planner.copies
    assert len(ctl.views.kind_ids) == 1
    waiting = [n for n in m.specs if n[0] == "a" and m.job(n).status not in ("running", "finished") and not m.job(n).nodes]
    assert all(ctl.views.kind(m.job(n)) in ctl.views.kind_ids.values() for n in waiting)


def test_waiting_jobs_of_different_models_or_per_type_curves_are_not_alike():
    """Copies are weighed a few at a time only where the allocator cannot tell them apart: jobs that differ only in
    their model (what the similarity policy predicts from) or in their curve per node type are different kinds."""

    base = {"min_nodes": 1, "max_nodes": 4, "total_samples": 1e9, "weight": 1.0, "scale_up_cost_s": 10.0, "scale_down_cost_s": 5.0}
    kind = AllocatorViews.spec_kind
    assert kind(dict(base)) == kind(dict(base))
    assert kind({**base, "model": {"mix": {"lstm": 1.0}}}) != kind({**base, "model": {"mix": {"resnet": 1.0}}})
    assert kind({**base, "model": {"a": 1, "b": 2}}) == kind({**base, "model": {"b": 2, "a": 1}})
    v100 = {"v100": {"nodes": [0, 1], "samples_per_s": [0.0, 10.0]}}
    assert kind({**base, "curves": v100}) != kind({**base, "curves": {"v100": {"nodes": [0, 1], "samples_per_s": [0.0, 20.0]}}})
    assert kind({**base, "curves": v100}) != kind(dict(base))


@pytest.mark.parametrize("resumes", [True, False], ids=["stopped-with-progress", "never-run"])
def test_a_long_queue_of_waiting_jobs_is_weighed_the_most_promising_first_and_no_node_is_left_idle_for_the_limit(tmp_path, write, resumes, monkeypatch):
    """Thirty waiting jobs of one node each, each like no other, on twelve nodes, with ``controller.weigh_waiting``
    6: a solve first weighs the six whose nodes earn most among the twelve the machine admits; the six nodes that
    leaves free are not left idle for the limit: they are offered to the next six most promising in the same
    decision, alone (the running and weighed jobs are not solved again). All twelve start at once and no node is
    given back. (With a plain cap, as Slurm's ``bf_max_job_test``, six would wait a decision for nothing.)

    The same whether they were stopped with progress to resume or never ran: a saturated machine's queue of
    distinct jobs never run (a kind of its own each) was weighed whole, thousands in every decision."""
    import dataclasses

    rates = [(7 * i) % 30 + 1 for i in range(30)]  # every rate once, not in submission order
    m = Machine(tmp_path, write, 12, [linear(f"j{i}", 1, 1, float(r)) for i, r in enumerate(rates)])
    m.ctl.planner.config = dataclasses.replace(m.ctl.planner.config, weigh_waiting=6, admission="arrival")  # what a decision weighs, of the first submitted
    for name in list(m.specs):
        m.submit(name)
        if resumes:
            m.job(name).progress = 1.0  # resumes from a checkpoint

    solves: list[tuple[int, int, list[float]]] = []  # per solve: (nodes, jobs holding nodes, the waiting jobs' rates)
    real = planner_module.allocate

    def recording(problem, *args, **kwargs):
        waiting = sorted(j.throughput[DEFAULT_TYPE].at(1) for j in problem.jobs if j.id not in problem.current)
        solves.append((len(problem.pool.nodes), len(problem.current), waiting))
        return real(problem, *args, **kwargs)

    monkeypatch.setattr(planner_module, "allocate", recording)
    m.at(0)
    admitted = sorted(float(r) for r in rates[:12])
    first = next(i for i, (nodes, _, _) in enumerate(solves) if nodes > 6)  # the first decision with nodes to spare
    assert solves[first][2] == admitted[-6:]  # the six best of the first twelve submitted
    left_free = solves[first][0] - 6
    # The nodes left free, offered to as many of the next most promising, alone: no job holds a node in that solve.
    assert solves[first + 1] == (left_free, 0, admitted[:6][-left_free:])
    assert sum(len(j.nodes) for j in m.ctl.world.jobs.values()) == 12
    m.at(60)
    assert sum(len(j.nodes) for j in m.ctl.world.jobs.values()) == 12
    assert not [e for e in m.events("node.released")]


def test_stopped_jobs_do_not_crowd_new_ones_out_of_the_waiting_jobs_a_decision_weighs(tmp_path, write):
    """Waiting jobs are weighed from two queues, ``controller.weigh_waiting`` of each: those that ran (progress to
    resume) and those that never ran. In one queue ranked by what a node earns, eight stopped jobs that earn more
    would fill the limit and the new ones would never be weighed: with learned curves a job never measured ranks
    below every measured one, so on a saturated machine new jobs were never measured (23 % fewer samples)."""
    import dataclasses

    jobs = [linear(f"s{i}", 1, 1, 10.0) for i in range(8)] + [linear(f"n{i}", 1, 1, 1.0 + i) for i in range(6)]
    m = Machine(tmp_path, write, 16, jobs)  # room for all fourteen: every one is admitted
    m.ctl.planner.config = dataclasses.replace(m.ctl.planner.config, weigh_waiting=2)  # what a decision weighs
    for name in list(m.specs):
        m.submit(name)
        if name.startswith("s"):
            m.job(name).progress = 1.0  # stopped after it ran: resumes from a checkpoint
    weighed: list[list[str]] = []
    problem = m.ctl.planner.problem

    def recording(active, extra, without=()):
        weighed.append(sorted(j.spec["name"] for j in active if not j.nodes))
        return problem(active, extra, without)

    m.ctl.planner.problem = recording
    m.at(0)
    first = next(w for w in weighed if w)
    assert [n for n in first if n.startswith("s")] == ["s0", "s1"]  # the limit of the stopped ones, earliest first among equals
    assert [n for n in first if n.startswith("n")] == ["n4", "n5"]  # and the two new ones whose nodes earn most
    m.at(60)
    assert sum(len(j.nodes) for j in m.ctl.world.jobs.values()) == 14  # nodes left free: the rest weighed too


def test_a_job_is_measured_at_the_sum_of_its_ranks_rates_when_they_report_out_of_step():
    """Every rank reports what it did since its own last report, so two ranks' intervals never line up. The meter
    restarted its window whenever a report began before it: with two ranks 10 ms out of step it measured once (a
    window that began before either rank trained: 30 samples/s for 40) and never again."""
    from pilotfill.controller.throughput import METER_WINDOW_S, Meter

    meter = Meter(2, since=0.0)
    assert meter.add(0.0, 0.3, 0.3, first=True, rank=("n0", 11)) is None  # ready after 0.3 s of start-up
    assert meter.add(0.0, 0.31, 0.31, first=True, rank=("n1", 12)) is None
    measured = []
    for step in range(1, 41):  # each rank: 10 samples every 0.5 s (20 samples/s each, 40 for the job)
        t = 0.3 + 0.5 * step
        measured += [m for m in (meter.add(10.0, 0.5, t, rank=("n0", 11)), meter.add(10.0, 0.5, t + 0.01, rank=("n1", 12))) if m]
    assert len(measured) >= 8, measured  # one about every window
    assert all(rate == pytest.approx(40.0) and seconds >= METER_WINDOW_S for rate, seconds in measured)


def test_a_report_that_spans_a_change_is_not_counted_and_a_replaced_rank_is_not_waited_for_ever():
    from pilotfill.controller.throughput import RANK_SILENT_S, Meter

    meter = Meter(1, since=100.0)
    assert meter.add(500.0, 10.0, 105.0, rank=("n0", 1)) is None  # began at 95, before this size: not this size's rate
    assert meter.add(0.0, 1.0, 106.0, first=True, rank=("n0", 2)) is None
    assert meter.add(0.0, 1.0, 106.0, first=True, rank=("n0", 3)) is None
    out = [meter.add(5.0, 0.5, 106.0 + 0.5 * k, rank=("n0", 2)) for k in range(1, 200)]  # rank 3 never trains
    first = next(i for i, m in enumerate(out) if m)
    assert 0.5 * (first + 1) >= RANK_SILENT_S - 1.0  # waited for rank 3 while it might still report…
    assert out[first][0] == pytest.approx(10.0)  # …then measured the rank that trains, at its own rate


def test_the_pilots_question_on_a_saturated_machine_is_answered_without_a_solve_and_as_the_solve_answers(tmp_path, write, monkeypatch):
    """With more waiting jobs that gain from one node than nodes could be had, the jobs would use every node: the
    pilots' question is answered so without a solve of the whole machine (at 4,000 open jobs that solve cost as
    much as the decision), and the answer is the solve's."""

    jobs = [linear(f"w{i}", 1, 4, 100 + i) for i in range(12)]
    m = Machine(tmp_path, write, 3, jobs)
    for i in range(12):
        m.submit(f"w{i}")
    m.at(1)
    ctl = m.ctl
    assert len(ctl.world.ready) == 3 and sum(1 for j in ctl.world.open.values() if j.status != "running") >= 6
    solves = []
    real = planner_module.allocate
    monkeypatch.setattr(planner_module, "allocate", lambda *a, **k: solves.append(1) or real(*a, **k))
    for extra in (1, 4):
        ctl.planner.forget_answer()
        solves.clear()
        shortcut = ctl.planner.wanted(extra, None)
        assert not solves, "answered with a solve"
        solved = ctl.planner.solve(len(ctl.world.ready) + extra, extra).answer
        assert shortcut == sum(solved.counts.values()) == len(ctl.world.ready) + extra


@pytest.mark.parametrize("apart", [False, True])
def test_a_large_decision_sizes_the_pilots_in_the_next_pass_with_replies_between(tmp_path, write, monkeypatch, apart):
    """At machine scale the decision and the pilots' question are two solves of the whole machine: a decision that
    weighs many jobs leaves the sizing to the loop's next pass (``busy`` says to step again at once), so requests that
    arrived meanwhile are answered between them. The pilots asked for are the same either way."""

    if apart:
        monkeypatch.setattr(schedule, "SIZE_APART_JOBS", 2)  # the jobs of this test count as "many"
    m = Machine(tmp_path, write, 8, [linear("a", 1, 4, 100), linear("b", 1, 4, 100), linear("c", 1, 4, 100)])
    m.submit("a")
    m.submit("b")
    m.ctl.step(m.now)
    asked = m.events("pilot.submitted")
    assert m.ctl.busy is apart and (asked == []) is apart
    m.submit("c")  # a request between the passes: answered before the sizing
    m.ctl.step(m.now)
    if apart:
        # c changed the world after the decision was taken, before its answer was applied: the decision is taken
        # again with c and applied in this pass; the pilots are sized in the next one, which the loop takes at once.
        assert m.ctl.busy and m.ctl.solves_next and not m.events("pilot.submitted")
        assert m.events("allocation")
        m.ctl.step(m.now)
    assert m.events("pilot.submitted")
    m.at(0)
    assert not m.ctl.busy
    assert sum(e["data"]["nodes"] for e in m.events("pilot.submitted")) == 8
    assert sum(len(m.job(n).nodes) for n in "abc") == 8 and m.ctl.world.counters["nodes_released"] == 0


def test_a_large_decision_is_applied_in_the_next_pass_which_reads_no_request(tmp_path, write, monkeypatch):
    """At machine scale solving the machine and changing hundreds of jobs are two passes: the loop's decision is
    applied in the pass after it is taken (``solves_next``: that pass reads no request), offers and the pilots'
    sizing in the passes after that, and the jobs end up as a decision applied at once leaves them."""

    monkeypatch.setattr(schedule, "SIZE_APART_JOBS", 2)  # the jobs of this test count as "many"
    m = Machine(tmp_path, write, 4, [linear("a", 1, 4, 100), linear("b", 1, 4, 100), linear("c", 1, 4, 1000)])
    m.submit("a")
    m.submit("b")
    m.at(0)  # pilots asked for and started: four ready nodes, each job on some
    assert sum(len(m.job(n).nodes) for n in "ab") == 4
    m.submit("c")  # far the best per node: the decision takes nodes for it
    allocations = len(m.events("allocation"))
    m.ctl.step(m.now)
    assert m.ctl.decision.phase == Phase.APPLY and m.ctl.busy and m.ctl.solves_next  # decided, not applied
    assert len(m.events("allocation")) == allocations and m.job("c").status != "running"
    m.ctl.step(m.now)
    assert len(m.events("allocation")) == allocations + 1 and m.job("c").status == "running"
    m.at(0)
    assert not m.ctl.busy and m.ctl.decision.phase != Phase.APPLY
    assert sum(len(m.job(n).nodes) for n in "abc") == 4 and m.ctl.world.counters.get("nodes_released", 0) == 0


@pytest.mark.parametrize("wave", [None, "read", "endless"])
def test_the_pilots_question_after_a_pass_of_many_requests_at_scale_is_asked_in_the_next(tmp_path, write, monkeypatch, wave):
    """The pilots' question weighs the machine as a decision does: when the main workload moves in a pass that handled
    DECIDE_APART_MESSAGES requests or more, the question goes to the loop's next pass (at once: ``busy``; that pass
    reads no request), asked once there, and the idle node is asked for. Owed, it waits while a wave of requests is
    still read (``wave``), as a decision does, within FLOOD_DEFER_S: a wave and a question never add up in one pass."""

    monkeypatch.setattr(schedule, "SIZE_APART_JOBS", 2)
    n = schedule.DECIDE_APART_MESSAGES
    m = Machine(tmp_path, write, 5, [linear("a", 1, 2, 100), linear("b", 1, 2, 90), linear("c", 1, 2, 80, up=1)], busy=[(0, "n5", "busy"), (60, "n5", "idle")])
    for name in "abc":
        m.submit(name)
    m.at(0)
    m.at(30)
    assert not m.ctl.busy and sum(len(m.job(x).nodes) for x in "abc") == 5
    adjusted = []
    adjust = m.ctl.pilots.adjust
    m.ctl.pilots.adjust = lambda *a, **k: adjusted.append(1) or adjust(*a, **k)
    m.now = m.trace.start + 60
    m.scheduler.advance(m.now)  # n5 turns idle: the pilots' question is due
    assert all(r["ok"] for r in m.ctl.handle_batch([{"type": "state.snapshot"}] * n))
    m.ctl.step(m.now)
    assert adjusted == [] and m.ctl.busy and m.ctl.solves_next  # put off, not dropped
    asked = len(m.events("pilot.submitted"))
    if wave:  # the owed question's pass reads a wave (a full batch, more waiting): owed still, asked after the wave
        assert all(r["ok"] for r in m.ctl.handle_batch([{"type": "state.snapshot"}] * n))
        m.ctl.step(m.now, more=True)
        assert adjusted == [] and m.ctl.busy
        if wave == "endless":  # but not for ever: within FLOOD_DEFER_S of the first pass it waited
            m.ctl.step(m.now + schedule.FLOOD_DEFER_S / 2, more=True)
            assert adjusted == []
            m.now += schedule.FLOOD_DEFER_S
            m.ctl.step(m.now, more=True)
            assert adjusted == [1] and len(m.events("pilot.submitted")) == asked + 1
    if wave != "endless":
        m.ctl.step(m.now)
        assert adjusted == [1] and not m.ctl.solves_next and len(m.events("pilot.submitted")) == asked + 1  # n5, asked for once
    m.at(m.now - m.trace.start)
    assert sum(len(m.job(x).nodes) for x in "abc") == 6 and len(m.events("pilot.submitted")) == asked + 1


def test_a_wave_of_idle_nodes_is_asked_for_in_passes_and_every_node_is_asked_for_once(tmp_path, write):
    """300 nodes turn idle at once, with jobs for all of them: one pass of the controller's loop submits at most
    SUBMIT_BATCH pilots (no reply or decision waits behind hundreds of submissions), the loop steps again at once
    while more are owed, and every idle node is asked for exactly once."""
    from pilotfill.pilots.manager import SUBMIT_BATCH

    assert SUBMIT_BATCH < 300
    m = Machine(tmp_path, write, 300, [linear(f"j{i}", 1, 1, 10.0 + i) for i in range(300)], max_queued_pilots=1000, max_submits_per_minute=1000)
    for name in list(m.specs):
        m.submit(name)
    steps = _per_pass(m, "pilots_submitted", advance=True)
    assert max(steps) <= SUBMIT_BATCH and sum(steps) == 300, steps
    assert sum(1 for s in steps if s) >= 3  # 128, 128, 44: in passes
    assert not m.ctl.busy
    m.at(30)
    assert m.ctl.world.counters.get("pilots_submitted", 0) == 300  # none asked for twice
    assert sum(len(j.nodes) for j in m.ctl.world.jobs.values()) == 300


def _per_pass(m, counter: str, advance: bool = False) -> list[int]:
    """Step the controller's loop while it is busy (at most 10 passes), at one instant: how much ``counter`` grew in
    each pass (``advance``: the batch system moves on before each pass)."""
    seen = [m.ctl.world.counters.get(counter, 0)]
    for _ in range(10):
        if advance:
            m.scheduler.advance(m.now)
        m.ctl.step(m.now)
        seen.append(m.ctl.world.counters.get(counter, 0))
        if not m.ctl.busy:
            break
    return [b - a for a, b in zip(seen, seen[1:])]


def test_the_nodes_of_hundreds_of_pilots_no_job_needs_are_released_in_passes_each_once(tmp_path, write):
    """A campaign of 300 one-node jobs ends: the nodes of its 300 one-node pilots are given back, RELEASE_BATCH pilots
    in one pass of the loop (each release is a batch-system call: no reply or decision waits behind hundreds), the loop
    steps again at once while more are owed, and every node is released exactly once."""
    from pilotfill.pilots.manager import RELEASE_BATCH

    assert RELEASE_BATCH < 300
    m = Machine(tmp_path, write, 300, [linear(f"j{i}", 1, 1, 10.0 + i) for i in range(300)], max_queued_pilots=1000, max_submits_per_minute=1000)
    for name in list(m.specs):
        m.submit(name)
    m.at(0)
    m.at(30)
    assert sum(len(j.nodes) for j in m.ctl.world.jobs.values()) == 300
    for name in list(m.specs):
        assert m.ctl.handle({"type": "job.result", "job_id": m.ids[name], "value": 1})["ok"]
    steps = _per_pass(m, "nodes_released")
    assert max(steps) <= RELEASE_BATCH and sum(steps) == 300, steps
    assert sum(1 for s in steps if s) >= 3  # 128, 128, 44: in passes
    assert not m.ctl.busy
    m.at(90)
    gone = [e["node"] for e in m.events("node.released")]
    assert len(gone) == 300 and len(set(gone)) == 300 and m.ctl.world.counters["nodes_released"] == 300  # none twice


class _FormingRuntime(SimulatedRuntime):
    """The simulated runtime with realistic costs (a start takes 30 s before its ranks report), as a runtime whose ranks
    cannot lose a peer while they form the group (Elastic Horovod in hvd.init)."""

    def __init__(self, specs, now):
        super().__init__(specs, accounting="realistic", now=now)

    def shrinks_while_forming(self, job_id=None) -> bool:
        return False


def test_a_job_whose_ranks_cannot_lose_a_peer_while_forming_starts_again_on_the_rest_and_shrinks_once_training(tmp_path, write):
    m = Machine(tmp_path, write, 3, [linear("a", 1, 3, 100)], busy=[(10, "n2", "busy"), (100, "n1", "busy")], runtime=_FormingRuntime)
    m.submit("a")
    m.at(0)
    assert len(m.job("a").nodes) == 3
    for t in range(1, 11):
        m.at(t)  # n2 is taken back at 10 s, 20 s before the ranks' first report
    stopped = m.events("job.stopped")
    assert len(stopped) == 1 and stopped[0]["data"]["cause"] == "n2 leaving while its ranks were forming the group"
    started = m.events("job.started")
    assert len(started) == 2 and sorted(started[1]["data"]["nodes"]) == ["n0", "n1"]
    assert not m.events("job.resized")
    for t in range(11, 101):
        m.at(t)  # trained since 40 s: n1 taken back at 100 s is a shrink
    assert m.events("job.cost") and len(m.events("job.started")) == 2 and len(m.events("job.stopped")) == 1
    shrunk = [e for e in m.events("job.resized") if "n1 leaving" in e["data"].get("cause", "")]
    assert shrunk and shrunk[0]["data"]["after"] == 1 and m.job("a").status == "running"


def _weigh(m: Machine, n: int) -> None:
    import dataclasses

    m.ctl.planner.config = dataclasses.replace(m.ctl.planner.config, weigh_waiting=n, admission="arrival")  # what a decision weighs, of the first submitted


@pytest.mark.parametrize("changed_between", [False, True], ids=["quiet", "a-submission-between"])
def test_a_large_decision_offers_the_nodes_it_leaves_free_in_the_next_pass(tmp_path, write, monkeypatch, changed_between):
    """At machine scale one pass solves the machine once: a decision whose weighed jobs leave nodes free starts
    them, and the loop's next pass (at once: ``busy``) offers those nodes to the jobs it left out (the same solve
    of them alone as inside a small decision). The pilots are sized after both, on both answers: no node is given
    back or asked for twice. Something that changes the world in between (a submission) is decided anew instead."""

    monkeypatch.setattr(schedule, "SIZE_APART_JOBS", 2)  # the jobs of this test count as "many"
    rates = [(7 * i) % 30 + 1 for i in range(30)]
    m = Machine(tmp_path, write, 12, [linear(f"j{i}", 1, 1, float(r)) for i, r in enumerate(rates)] + [linear("late", 1, 1, 99.0)])
    _weigh(m, 6)
    for name in list(m.specs)[:30]:
        m.submit(name)
    running = lambda: sum(len(j.nodes) for j in m.ctl.world.jobs.values())  # noqa: E731
    passes = []  # after each pass: (nodes in use, an offer owed, busy, nodes ready)
    step = m.ctl.step

    def recording(now=None, more=False):
        step(now, more)
        passes.append((running(), (m.ctl.decision.phase == Phase.OFFER), m.ctl.busy, len(m.ctl.world.ready)))
        if changed_between and (m.ctl.decision.phase == Phase.OFFER) and "late" not in m.ids:
            m.submit("late")  # a request between the decision and the offer

    m.ctl.step = recording
    m.at(0)
    owed = next(i for i, p in enumerate(passes) if p[1])
    assert passes[owed][:3] == (6, True, True) and passes[owed][3] > 6  # the six weighed started; the free nodes offered in the next pass, at once
    if changed_between:
        assert passes[owed + 1][:2] == (6, False)  # dropped: decided anew
        assert not any("offered" in e["data"] for e in m.events("allocation"))  # the decision anew offered the nodes itself
    else:
        assert passes[owed + 1][:2] == (passes[owed][3], False)  # offered and started
        assert any(e["data"].get("offered") for e in m.events("allocation"))
    assert running() == 12 and not m.ctl.busy
    m.at(60)
    assert running() == 12 and not m.events("node.released")
    assert m.ctl.world.counters["pilots_submitted"] == 12


def test_a_large_decision_due_in_a_pass_of_many_requests_is_taken_in_the_next(tmp_path, write, monkeypatch):
    """A pass that handled DECIDE_APART_MESSAGES requests or more leaves a large decision to the loop's next pass
    (at once: ``busy``), so a thousand reports and a whole-machine solve never add up in one pass. That pass, the
    pass that applies its answer and the pilots' sizing after it read no request (``solves_next``), so requests arriving all the time cannot hold the
    decision back. With fewer requests it is taken in the pass that read them."""

    monkeypatch.setattr(schedule, "SIZE_APART_JOBS", 2)
    n = schedule.DECIDE_APART_MESSAGES
    m = Machine(tmp_path, write, 4, [linear(f"j{i}", 1, 2, 10.0 + i) for i in range(2 * n + 4)])

    def submission(name):
        spec = m.specs[name]
        return {"type": "job.submit", "spec": {"name": name, "entry": "pilotfill.replay:simulated", "min_nodes": 1, "max_nodes": 2,
                "scale_up_cost_s": 1.0, "scale_down_cost_s": 1.0, "curve": {"nodes": list(spec.throughput.nodes),
                "samples_per_s": list(spec.throughput.values)}}}  # fmt: skip

    names = list(m.specs)
    for name in names[:2]:
        m.submit(name)
    m.at(0)
    m.at(10)  # the machine's four nodes run the first two jobs; nothing owed, no pilot arriving
    assert not m.ctl.busy and sum(len(j.nodes) for j in m.ctl.world.open.values()) == 4
    decided = []
    decide = m.ctl.decide
    m.ctl.decide = lambda *a, **k: decided.append(1) or decide(*a, **k)

    def one_pass(batch):
        assert all(r["ok"] for r in m.ctl.handle_batch(batch))
        m.ctl.step(m.now)
        return len(decided)

    assert not m.ctl.solves_next
    assert one_pass([submission(x) for x in names[2 : 2 + n]]) == 0 and m.ctl.busy and m.ctl.dirty  # put off
    assert m.ctl.solves_next  # the next pass reads no request: it decides
    assert one_pass([]) == 1 and m.ctl.busy
    assert m.ctl.solves_next  # the pass after it applies the answer, reading no request either…
    assert one_pass([]) == 1 and m.ctl.decision.phase != Phase.APPLY and m.ctl.busy
    assert m.ctl.solves_next  # …and the pass after that sizes the pilots, reading none either
    adjusted = []
    adjust = m.ctl.pilots.adjust
    m.ctl.pilots.adjust = lambda *a, **k: adjusted.append(1) or adjust(*a, **k)
    assert one_pass([]) == 1 and adjusted == [1]
    while m.ctl.busy:
        m.ctl.step(m.now)
    assert not m.ctl.solves_next  # nothing owed: the loop reads requests again
    assert one_pass([submission(x) for x in names[2 + n : 2 + 2 * n]]) == 1 and m.ctl.solves_next  # put off again: not once in a row only
    assert one_pass([]) == 2
    while m.ctl.busy:
        m.ctl.step(m.now)
    decided.clear()
    assert one_pass([submission(x) for x in names[2 + 2 * n :]]) == 1  # a few requests: decided in the pass that read them


def test_a_large_decision_due_after_a_wave_of_batch_system_events_is_taken_in_the_next_pass(tmp_path, write, monkeypatch):
    """The main workload takes back DECIDE_APART_MESSAGES nodes or more at one instant: the pass that handles those
    events leaves the large decision they make due to the loop's next pass (at once: ``busy``), which reads no
    request and decides whatever it polls; a wave of events and a whole-machine solve never add up in one pass."""

    monkeypatch.setattr(schedule, "SIZE_APART_JOBS", 2)
    n = schedule.DECIDE_APART_MESSAGES
    taken = [(20, f"n{i}", "busy") for i in range(n + 2)]
    m = Machine(tmp_path, write, n + 6, [linear(f"j{i}", 1, 2, 10.0 + i) for i in range(n // 2 + 3)], busy=taken,
                max_queued_pilots=1000, max_submits_per_minute=1000)  # fmt: skip
    for name in m.specs:
        m.submit(name)
    for t in range(15):
        m.at(t)
    assert not m.ctl.busy and sum(len(j.nodes) for j in m.ctl.world.open.values()) == n + 6
    decided = []
    decide = m.ctl.decide
    m.ctl.decide = lambda *a, **k: decided.append(1) or decide(*a, **k)
    m.now = m.trace.start + 20
    m.runtime.advance(m.now)
    m.scheduler.advance(m.now)
    m.ctl.step(m.now)
    leaving = [e for e in m.events("pilot.preempted")]
    assert len(leaving) == n + 2 and decided == [] and m.ctl.busy and m.ctl.solves_next  # put off: the next pass decides
    m.ctl.step(m.now)
    assert decided == [1]
    held = {node for j in m.ctl.world.open.values() for node in j.nodes}
    assert not held & {name for _, name, _ in taken}  # the decision moved every job off the nodes taken back


def test_the_pilots_question_counts_the_free_nodes_the_jobs_left_out_would_take_without_solving_them(tmp_path, write, monkeypatch):
    """The pilots' question at machine scale weighs the most promising waiting jobs; the nodes they leave free go to
    the jobs left out. Where enough of those would each gain from one node, every free node is used: the question
    counts them without a second solve, and says what the second solve says. Where too few could, it solves them."""

    # Ten jobs that start on one node, then eight that start on two and earn most (weighed first). The question: with
    # sixteen nodes, which admit the ten and three of the eight (their minimums fill the sixteen).
    jobs = [linear(f"one{i}", 1, 1, 5.0 + i) for i in range(10)] + [linear(f"big{i}", 2, 2, 50.0 + i) for i in range(8)]
    m = Machine(tmp_path, write, 16, jobs)  # no pilot yet: no node ready
    _weigh(m, 6)
    for name in list(m.specs):
        m.submit(name)
    ctl = m.ctl
    solves = []
    real = planner_module.allocate
    monkeypatch.setattr(planner_module, "allocate", lambda *a, **k: solves.append(1) or real(*a, **k))
    assert ctl.planner.whole_pool(16) is None  # ten start on one node: fewer than the sixteen nodes
    counted = ctl.planner.wanted(16, None)
    assert len(solves) == 1, "the free nodes were solved for"
    full = ctl.planner.solve(16, 16).answer  # the free nodes offered to the jobs left out, by a solve of them
    assert len(solves) == 3
    assert counted == sum(full.counts.values()) == 16
    # Two jobs that start on one node, eight on two: too few to say the free nodes are all used: they are solved for.
    m2 = Machine(tmp_path / "2", write, 16, jobs[8:])
    _weigh(m2, 3)
    for name in list(m2.specs):
        m2.submit(name)
    solves.clear()
    counted = m2.ctl.planner.wanted(16, None)
    assert len(solves) == 2
    assert counted == sum(m2.ctl.planner.solve(16, 16).answer.counts.values())


def test_a_large_decision_that_weighs_more_copies_of_a_kind_weighs_them_in_the_next_pass(tmp_path, write, monkeypatch):
    """A large decision that used every copy weighed of a sweep's job does not apply that answer and solve the
    machine again in the same pass: the next pass (at once) decides with as many copies as could start, and reaches
    the answer that weighs them all (applied in the pass after, as every large decision of the loop is)."""
    from pilotfill.allocator import allocate

    monkeypatch.setattr(schedule, "SIZE_APART_JOBS", 2)
    jobs = [f"c{i},m,{T0},1,4,1e9,10,5,0;1;4,0;200;350" for i in range(40)] + [f"odd,m,{T0},2,8,1e9,10,5,0;2;8,0;300;1000"]
    m = Machine(tmp_path, write, 10, jobs)  # one node earns a copy most: the first copies weighed are all used
    for name in list(m.specs):
        m.submit(name)
    ctl = m.ctl
    passes = []  # per pass: (a solve of it said "again", allocations logged so far, nodes in use)
    solve, step = ctl.planner.solve, ctl.step
    said = []
    ctl.planner.solve = lambda *a, **k: (lambda out: said.append(out.again) or out)(solve(*a, **k))

    def recording(now=None, more=False):
        said.clear()
        step(now, more)
        passes.append((any(said), len(m.events("allocation")), sum(len(j.nodes) for j in ctl.world.open.values())))

    ctl.step = recording
    m.at(0)
    again = next(i for i, p in enumerate(passes) if p[0])
    assert passes[again][1:] == passes[again - 1][1:] == (1, 0)  # not applied: nothing logged, nothing started
    assert passes[again + 1][1:] == (1, 0)  # the next pass decides, with the copies that could start, at once…
    assert passes[again + 2][1:] == (2, 10)  # …and the pass after applies it
    full = allocate(ctl.planner.problem(ctl.planner.active(10), 0))
    assert sum(len(j.nodes) for j in ctl.world.open.values()) == sum(full.counts.values()) == 10
    assert not m.job("odd").nodes  # ten copies on one node each earn more than any answer with the odd job


def test_the_pilots_question_that_would_weigh_more_copies_counts_the_nodes_they_would_take_without_a_second_solve(tmp_path, write, monkeypatch):
    """The pilots' question used every copy of a sweep's job it weighed. Where the copies not weighed (and the jobs
    left out) would each gain from one of the nodes left free, the answer with more copies uses every node: counted
    without asking again, and what the solve weighing every job says."""
    from pilotfill.allocator import allocate

    # A job that starts on four nodes, then six copies that each earn on one node: with ten nodes to come, the four
    # copies first weighed are all used (again), six nodes are left free... of which two the copies not weighed take.
    jobs = [f"big,m,{T0},4,4,1e9,10,5,0;4,0;400"] + [f"c{i},m,{T0},1,1,1e9,10,5,0;1,0;200" for i in range(6)]
    m = Machine(tmp_path, write, 10, jobs)  # no pilot yet: no node ready
    for name in list(m.specs):
        m.submit(name)
    ctl = m.ctl
    assert ctl.planner.whole_pool(10) is None  # six could start on one node: fewer than the ten nodes
    said = []
    solve = ctl.planner.solve
    monkeypatch.setattr(ctl.planner, "solve", lambda *a, **k: (lambda out: said.append(out.again) or out)(solve(*a, **k)))
    solves = []
    monkeypatch.setattr(planner_module, "allocate", lambda *a, **k: solves.append(1) or allocate(*a, **k))
    counted = ctl.planner.wanted(10, None)
    assert said == [True] and len(solves) == 1  # every copy weighed was used; not asked again
    monkeypatch.setattr(planner_module, "allocate", allocate)
    full = allocate(ctl.planner.problem(ctl.planner.active(10), 10))
    assert counted == sum(full.counts.values()) == 10


def test_the_process_loop_reads_no_request_in_a_pass_that_solves_the_machine(tmp_path, write, monkeypatch):
    """The process's loop (``one_pass``, a real ZeroMQ server and client): after a pass of many requests at scale, the
    next pass takes the decision and leaves a waiting request unread; the pass after applies it and the one after that
    sizes the pilots, also without reading; then the request is answered."""
    import threading

    from pilotfill.controller.process import one_pass
    from pilotfill.transport import Client, Server

    monkeypatch.setattr(schedule, "SIZE_APART_JOBS", 2)
    n = schedule.DECIDE_APART_MESSAGES
    m = Machine(tmp_path, write, 4, [linear(f"j{i}", 1, 2, 10.0 + i) for i in range(n + 2)])
    names = list(m.specs)
    for name in names[:2]:
        m.submit(name)
    m.at(0)
    m.at(10)
    ctl = m.ctl
    assert not ctl.busy
    spec = m.specs[names[2]]
    submissions = [{"type": "job.submit", "spec": {"name": x, "entry": "pilotfill.replay:simulated", "min_nodes": 1, "max_nodes": 2,
                    "scale_up_cost_s": 1.0, "scale_down_cost_s": 1.0, "curve": {"nodes": list(spec.throughput.nodes),
                    "samples_per_s": list(spec.throughput.values)}}} for x in names[2:]]  # fmt: skip
    assert all(r["ok"] for r in ctl.handle_batch(submissions))
    ctl.step(m.now)
    assert ctl.solves_next  # the decision was put off

    decided, adjusted = [], []
    decide, adjust = ctl.decide, ctl.pilots.adjust
    ctl.decide = lambda *a, **k: decided.append(1) or decide(*a, **k)
    ctl.pilots.adjust = lambda *a, **k: adjusted.append(1) or adjust(*a, **k)
    server = Server(m.run_dir, ctl.key)
    server.publish()
    replies: list[dict] = []
    client = Client(m.run_dir, timeout_s=300.0)
    asker = threading.Thread(target=lambda: replies.append(client.request({"type": "state.snapshot"}, attempt_s=300.0)), daemon=True)
    try:
        asker.start()
        # Until the request is there to be read: the server answers the client's handshake meanwhile (reading nothing).
        while not server.socket.poll(0):
            server.serve(lambda message: pytest.fail(f"read {message}"), 100, max_batch=0)
            assert asker.is_alive(), "the client gave up"
        assert one_pass(ctl, server) == 0 and decided == [1] and not replies  # the decision; the request waits
        assert ctl.solves_next and ctl.decision.phase == Phase.APPLY
        assert one_pass(ctl, server) == 0 and ctl.decision.phase != Phase.APPLY and not replies  # its answer applied; it still waits
        assert ctl.solves_next
        assert one_pass(ctl, server) == 0 and adjusted == [1] and not replies  # the pilots' sizing; it still waits
        handled = 0
        while not handled:
            handled = one_pass(ctl, server)
        asker.join(600)
        assert handled == 1 and replies and replies[0]["ok"]
    finally:
        client.close()
        server.close()


def _saturated_counting(tmp_path, write, monkeypatch, method: str):
    """Forty-four one-node jobs on four nodes (none gains from taking a node from another), 30 s in, with the
    allocator views' ``method`` (a description of a waiting job) recording the job it is asked of: (machine, asked)."""
    asked: list[str] = []
    real = getattr(AllocatorViews, method)

    def counting(self, job):
        asked.append(job.id)
        return real(self, job)

    monkeypatch.setattr(AllocatorViews, method, counting)
    m = Machine(tmp_path, write, 4, [linear(f"j{i}", 1, 1, 10.0) for i in range(44)])
    for name in list(m.specs):
        m.submit(name)
    m.at(0)
    m.at(30)
    return m, asked


def test_the_pilots_question_asks_a_waiting_job_once_per_change_of_its_own_not_in_every_pass(tmp_path, write, monkeypatch):
    """Asked in every pass on a saturated machine, the pilots' question (how many nodes would the jobs use with more?)
    needs of each waiting job whether one node alone would serve it and what a rescale of it costs: made once per
    change of the job (:meth:`.WaitingJobs.traits`), not a view of every waiting job in every pass. Forty jobs wait
    for four nodes: asked at three instants, each waiting job is asked at most once, and the answer is the whole pool
    (every node would be used)."""
    m, asked = _saturated_counting(tmp_path, write, monkeypatch, "waiting_traits")
    waiting = {j.id for j in m.ctl.world.jobs.values() if j.status == "pending"}
    assert len(waiting) == 40
    asked.clear()
    answers = []
    for t in (60, 90, 120):
        m.at(t)
        answers.append(m.ctl.planner.wanted(8, None))
    assert answers == [len(m.ctl.world.ready) + 8] * 3
    assert asked and set(asked) <= waiting and len(asked) == len(set(asked))  # each once at most, then kept


def test_a_waiting_job_is_described_once_per_change_of_its_own_not_in_every_decision(tmp_path, write, monkeypatch):
    """A saturated machine's queue is thousands of waiting jobs, and a decision comes every few seconds: what a decision
    asks of each (its kind) is made when the job changes, not in every decision (:class:`.WaitingJobs`).
    Forty jobs wait for four nodes; decisions taken while the running ones report describe no waiting job again; a job
    stopped joins the queue and is described, once."""
    m, described = _saturated_counting(tmp_path, write, monkeypatch, "waiting_kind")
    running = [j for j in m.ctl.world.jobs.values() if j.status == "running"]
    assert len(running) == 4 and len(set(described)) == 44 and len(described) == 44  # each once

    solves: list[int] = []
    real_allocate = planner_module.allocate

    def recording(problem, *args, **kwargs):
        solves.append(len(problem.jobs))
        return real_allocate(problem, *args, **kwargs)

    monkeypatch.setattr(planner_module, "allocate", recording)
    described.clear()
    for t in (60, 90, 120):
        m.ctl.schedule.changed()  # a decision in each of these passes
        m.at(t)
    assert len(solves) >= 3 and min(solves) > 4  # decisions that weighed waiting jobs
    assert described == []
    stopped = running[0]
    m.ctl.applier.stop_for_a_start(stopped, list(stopped.nodes), set(), m.now, "test")  # back to the queue, with its progress
    m.ctl.schedule.changed()
    m.at(150)
    assert stopped.id in described and described.count(stopped.id) == 1


@pytest.mark.parametrize("restarts", [True, False], ids=["ranks-restart", "ranks-go-on"])
def test_what_old_ranks_report_after_a_resize_that_restarts_them_is_not_the_new_sizes_rate(tmp_path, write, restarts):
    """Seen on the real OpenPBS (benchmarks/bench_pbs.py): a torch job grown from one node to four was measured at
    645 samples/s on four nodes, two seconds after the resize — its one old rank, still training alone until the new
    rendezvous round, reported at the one-node rate, and the meter took that for four nodes. Learning that four nodes
    did a third of what three did, the controller cancelled the pilot coming back for the fourth: the job never grew
    back. Where a resize restarts every rank (torch: a new round), what the old ranks report before the new round's
    first report is not measured; where the ranks go on through it (the processes runtime, the replay's), it is."""
    from pilotfill.elastic.simulated import SimulatedRuntime

    class Restarting(SimulatedRuntime):
        def resize_restarts_ranks(self, job_id=None):
            return restarts

    m = Machine(tmp_path, write, 4, [linear("a", 1, 4, 100)], runtime=Restarting)
    job_id = m.submit("a", curve=None)  # learned: what the meter measures is what the allocator sees
    t = 0
    while len(m.job("a").nodes) < 4:
        t += 1
        assert t < 120, "the job never grew"
        m.at(t)
    resized = m.events("job.resized")[-1]["time"]
    assert not [e for e in m.events("job.cost") if e["time"] >= resized], "the new round has not reported yet"
    m.now = resized + 3.0  # the old rank on n0, 2.5 s of training at the one-node rate, reported after the resize
    assert m.ctl.handle({"type": "job.report", "job_id": job_id, "host": "n0", "samples": 250.0, "seconds": 2.5, "pid": 1, "first": False})["ok"]
    at_four = [e["data"]["samples_per_s"] for e in m.events("job.estimate") if e["data"]["nodes"] == 4]
    assert at_four == ([] if restarts else [100.0])


def test_a_submission_with_nothing_idle_is_a_wait_not_a_failure_and_asked_again_when_a_node_is(tmp_path, write, monkeypatch):
    """The batch system counted an idle node a moment ago and had none when asked for it (the main workload took it):
    the campaign waits for an idle node — said as a wait, never as a failed submission, with no back-off (issue 54,
    item 9: a full OpenPBS read as "pilot submission failed" for minutes)."""
    from pilotfill.schedulers.base import NothingIdle

    m = Machine(tmp_path, write, 2, [linear("a", 1, 2, 100)])
    submit = m.scheduler.submit_pilot
    full = {"now": True}

    def racing(pilot_id, nodes, node_type=None):
        if full["now"]:
            raise NothingIdle("qsub: not submitted: 1 node(s) wanted, 0 idle of 2 usable vnode(s)", reason="0 idle of 2 usable vnodes")
        return submit(pilot_id, nodes)

    monkeypatch.setattr(m.scheduler, "submit_pilot", racing)
    m.submit("a")
    m.at(0)
    [notice] = m.ctl.notices.as_list()
    assert (notice["level"], notice["text"]) == ("waiting", "waiting for an idle node (0 idle of 2 usable vnodes)")
    assert not m.events("pilot.submit_failed") and len(m.events("pilot.waiting")) == 1
    full["now"] = False
    m.ctl.schedule.changed()  # the next event (here: any) sizes the pilots again, with no back-off to wait out
    m.at(1)
    assert m.ctl.world.counters["pilots_submitted"] >= 1 and m.ctl.notices.as_list() == []


def test_a_batch_system_that_does_not_answer_is_a_notice_until_it_does(tmp_path, write, monkeypatch):
    from pilotfill.schedulers.commands import SchedulerCommandError

    m = Machine(tmp_path, write, 2, [linear("a", 1, 2, 100)])
    answers = {"ok": False}
    idle = m.scheduler.idle_nodes

    def unreachable():
        if not answers["ok"]:
            raise SchedulerCommandError(["sinfo"], "exited 1: sinfo: error: Unable to contact slurm controller", returncode=1,
                                        output="sinfo: error: Unable to contact slurm controller (connect failure)")  # fmt: skip
        return idle()

    monkeypatch.setattr(m.scheduler, "idle_nodes", unreachable)
    m.submit("a")
    m.at(0)
    notice = m.ctl.notices.as_list()[0]  # failing ones first: the progress line shows it
    assert notice["key"] == "scheduler.idle" and notice["level"] == "failing" and notice["retry_at"] is not None
    assert "did not answer (idle): sinfo: error: Unable to contact slurm controller (connect failure) (exit 1)" in notice["text"]
    answers["ok"] = True
    time.sleep(1.1)  # the first back-off (1 s, on the monotonic clock) is over
    m.at(2)
    assert [n["key"] for n in m.ctl.notices.as_list()] == []


def test_a_pilots_leaving_that_arrives_after_the_batch_system_requeued_it_is_normal(tmp_path, write):
    """Issue 58: the controller's poll saw PBS requeue a preempted pilot before its agent's "leaving" arrived, and the
    life cycle refused queued -> leaving (an internal error for the agent, 20 times in the recordings). Both orders are
    normal: the pilot stays queued, its run's nodes gone."""
    from pilotfill.schedulers.base import EndReason, EventKind, PilotEvent

    m = Machine(tmp_path, write, 2, [linear("a", 1, 2, 100)])
    m.submit("a")
    m.at(0)
    pilot = next(p for p in m.ctl.world.pilots.values() if p.state == "running")
    nodes = list(pilot.nodes)
    m.ctl.liveness.on_pilot_event(PilotEvent(EventKind.ENDED, pilot.id, pilot.scheduler_id or "", tuple(nodes), reason=EndReason.REQUEUED), m.now, m.now)
    assert m.ctl.world.pilots[pilot.id].state == "queued"
    reply = m.ctl.handle({"type": "pilot.leaving", "pilot": pilot.id, "nodes": nodes, "deadline": m.now + 5})
    assert reply == {"ok": True}, reply
    assert m.ctl.world.pilots[pilot.id].state == "queued" and all(m.ctl.world.nodes[n].state == "gone" for n in nodes)
    m.ctl.world.validate()


class _StallingRuntime(SimulatedRuntime):
    """The simulated runtime, whose ranks stop reporting and printing at 100 s (Elastic Horovod's driver waiting out its
    elastic timeout after a node left under load: issue 54), and train again once started anew."""

    def __init__(self, specs, now):
        super().__init__(specs, now=now)
        self.stall_at, self.starts = 100.0, 0
        self.t0 = now

    def start(self, job_id, spec, hosts):
        self.starts += 1
        super().start(job_id, spec, hosts)

    def advance(self, t: float) -> None:
        super().advance(t)
        if self.starts == 1 and t - self.t0 >= self.stall_at:
            self.outbox = [m for m in self.outbox if m.get("type") != "job.report"]

    def silent_s(self, job_id, now):
        return now - self.t0 - self.stall_at if self.starts == 1 else 0.0


def test_a_job_whose_ranks_go_silent_is_formed_again_from_its_commit_and_said_once(tmp_path, write):
    from pilotfill.controller.job_progress import SILENT_S

    m = Machine(tmp_path, write, 2, [linear("a", 1, 2, 100)], runtime=_StallingRuntime)
    m.submit("a")
    for t in range(0, 100, 10):
        m.at(t)
    assert m.job("a").status == "running" and m.ctl.notices.as_list() == []
    t = 100
    while not m.events("job.stopped") and t < 100 + 2 * SILENT_S:
        t += 10
        m.at(t)
    stopped = m.events("job.stopped")
    assert len(stopped) == 1 and stopped[0]["data"]["cause"] == f"its ranks were silent for {SILENT_S:.0f} s"
    assert 100 + SILENT_S <= stopped[0]["time"] - m.trace.start <= 100 + SILENT_S * 1.2
    assert any(n["key"].endswith(".silent") for n in m.ctl.notices.as_list())
    for _ in range(6):
        t += 10
        m.at(t)
    assert len(m.events("job.started")) == 2 and m.job("a").status == "running"
    assert m.ctl.notices.as_list() == []  # training again: no longer said
