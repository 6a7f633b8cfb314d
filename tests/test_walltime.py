"""Walltime is a known end (issue "What users bring": walltimes).

A pilot's walltime end is told by the batch system with its start. The
controller drains the pilot before the batch system ends it — a job leaves at
its next commit within its commit interval of the drain, or at the drain at
the latest — and never grows a job onto a node whose drain comes before the
growth pays (scale-up plus scale-down cost). In process (the real controller
on the replay's batch system and simulated runtime, a clock the test moves),
then for real: the local cluster and a real Slurm.
"""

from __future__ import annotations

import pytest
from conftest import JOB_HEADER
from localrun import LocalRun, synthetic_job

from pilotfill.config import Config, ControllerConfig, PilotConfig
from pilotfill.controller import Controller
from pilotfill.controller.walltime import lead_s
from pilotfill.elastic.simulated import SimulatedRuntime
from pilotfill.schedulers.replay import ReplayScheduler
from pilotfill.traces import read_jobs, read_trace
from pilotfill.reasons import NodeWhy

pytestmark = pytest.mark.unit

T0 = "2021-02-10T00:00:00Z"
GRACE_S = 5.0


def stamp(seconds: int) -> str:
    return f"2021-02-10T00:{seconds // 60:02d}:{seconds % 60:02d}Z"


def linear(name: str, lo: int, hi: int, per_node: float, up: float, down: float, total: float = 1e12) -> str:
    counts = ";".join(str(n) for n in range(hi + 1))
    return f"{name},m,{T0},{lo},{hi},{total},{up},{down},{counts},{';'.join(str(per_node * n) for n in range(hi + 1))}"


class Machine:
    """The real controller over the replay's batch system (pilots with a walltime) and simulated runtime; the
    horizon learned (t_fwd 0), as a site runs it."""

    def __init__(self, tmp_path, write, idle: dict[str, bool], rows: list[tuple[int, str, str]], jobs: list[str], walltime_s: float,
                 **runtime) -> None:  # fmt: skip
        lines = ["time,node,state"] + [f"{T0},{n},{'idle' if i else 'busy'}" for n, i in idle.items()]
        lines += [f"{stamp(t)},{n},{s}" for t, n, s in rows] + [f"{stamp(3000)},,end"]
        self.trace = read_trace(write("trace.csv", "\n".join(lines) + "\n"))
        self.specs = {j.name: j for j in read_jobs(write("jobs.csv", "\n".join([JOB_HEADER, *jobs]) + "\n"))}
        self.now = self.trace.start
        self.scheduler = ReplayScheduler(self.trace, queue_delay_s=0.0, grace_s=GRACE_S, walltime_s=walltime_s)
        self.runtime = SimulatedRuntime(self.specs, now=self.now, **runtime)
        config = Config(scheduler="replay", pilots=PilotConfig(heartbeat_s=3600.0, heartbeat_deadline_s=7200.0, grace_s=GRACE_S),
                        controller=ControllerConfig(tick_s=1.0, t_fwd=0.0))  # fmt: skip
        self.ctl = Controller(tmp_path / "run", config, scheduler=self.scheduler, runtime=self.runtime, clock=lambda: self.now)
        self.ids: dict[str, str] = {}

    def submit(self, name: str) -> str:
        spec = self.specs[name]
        job = {
            "name": name, "entry": "pilotfill.replay:simulated", "min_nodes": spec.min_nodes, "max_nodes": spec.max_nodes,
            "scale_up_cost_s": spec.scale_up_cost_s, "scale_down_cost_s": spec.scale_down_cost_s, "restart_cost_s": 0.0,
            "total_samples": spec.total_samples, "curve": {"nodes": list(spec.throughput.nodes), "samples_per_s": list(spec.throughput.values)},
        }  # fmt: skip
        reply = self.ctl.handle({"type": "job.submit", "spec": job})
        assert reply["ok"], reply
        self.ids[name] = reply["job_id"]
        return reply["job_id"]

    def at(self, seconds: float) -> None:
        self.now = self.trace.start + seconds
        self.runtime.advance(self.now)
        for _ in range(20):
            self.scheduler.advance(self.now)
            messages = self.runtime.outbox + self.scheduler.outbox
            self.runtime.outbox, self.scheduler.outbox = [], []
            for m in messages:
                assert self.ctl.handle(m)["ok"]
            self.ctl.step(self.now)
            if not messages and not self.scheduler.outbox and not self.ctl.busy:
                return

    def run_to(self, start: int, end: int) -> None:
        for t in range(start, end + 1):
            self.at(t)

    def job(self, name: str):
        return self.ctl.world.jobs[self.ids[name]]

    def pilot_of(self, node: str):
        return self.ctl.world.pilots[self.ctl.world.nodes[node].pilot]

    def events(self, kind: str | None = None) -> list[dict]:
        return self.ctl.journal.events(kind)


def test_no_job_grows_onto_a_pilot_that_ends_before_the_growth_pays(tmp_path, write):
    """b trains on three fresh pilots; a's node frees up a few seconds before its pilot's drain, less than b's 10 s scale-up
    plus 5 s scale-down: b does not grow onto it (the pool's horizon, a minute, says growing pays). Once that pilot
    has ended and a fresh one holds the node, b grows onto it."""
    lead = lead_s(GRACE_S, 1.0)
    a = linear("a", 1, 1, 100, up=10, down=5, total=8000)  # done at 80 s on n0
    b = linear("b", 1, 4, 100, up=10, down=5)
    m = Machine(tmp_path, write, {"n0": True, "n1": False, "n2": False, "n3": False}, [(60, f"n{i}", "idle") for i in (1, 2, 3)], [a, b],
                walltime_s=100.0)  # fmt: skip
    m.submit("a")
    m.run_to(0, 50)
    m.submit("b")
    m.run_to(51, 79)
    assert len(m.job("b").nodes) == 3 and m.job("a").status == "running"
    end = m.pilot_of("n0").walltime_end
    assert m.trace.start + 100 <= end <= m.trace.start + 101  # submitted at 0, started within a tick
    m.run_to(80, 88)
    assert m.job("a").status == "finished"
    left = end - lead - m.now
    up, down = m.specs["b"].scale_up_cost_s, m.specs["b"].scale_down_cost_s
    assert 0 < left < up + down  # n0 is drained sooner than b's growth would pay
    assert m.ctl.horizon(m.now) > up + down  # …while the pool's horizon says growing pays
    assert sorted(m.job("b").nodes) == ["n1", "n2", "n3"], "b grew onto a node whose pilot ends within its rescale cost"
    grown = [e for e in m.events("job.resized") if e["job"] == m.ids["b"] and e["data"]["after"] > e["data"]["before"]]
    assert not grown
    m.run_to(91, 130)  # n0's pilot reached its walltime; a new pilot holds n0 for 100 s
    assert "n0" in m.job("b").nodes and len(m.job("b").nodes) == 4


def test_a_job_leaves_an_ending_pilot_at_its_commit_and_loses_nothing(tmp_path, write):
    """Realistic accounting (a stop loses the work since the last commit, every 20 s here). The only node's pilot
    ends at 100 s: the job leaves it at its commit within 20 s of the drain (80 s), not when the batch system ends
    the pilot, so it redoes nothing, then resumes on the next pilot from that commit and finishes."""
    job = linear("a", 1, 1, 100, up=1, down=1, total=15000)
    m = Machine(tmp_path, write, {"n0": True}, [], [job], walltime_s=100.0, accounting="realistic", start_cost_s=0.0, commit_interval_s=20.0)
    m.submit("a")
    m.run_to(0, 60)
    end = m.pilot_of("n0").walltime_end
    m.run_to(61, 110)
    leaving = [e for e in m.events("node.leaving") if e["node"] == "n0"]
    assert leaving, "n0 never left"
    first = leaving[0]
    assert NodeWhy.of(first["data"]["why"]) == NodeWhy.WALLTIME_AT_COMMIT
    assert first["time"] <= end - lead_s(GRACE_S, 1.0)  # gone before the batch system's SIGTERM (end - grace here)
    stopped = [e for e in m.events("job.stopped") if e["job"] == m.ids["a"]]
    assert stopped and stopped[0]["data"]["redone"] == 0
    m.run_to(111, 300)
    assert m.job("a").status == "finished"
    assert m.job("a").redone == 0
    assert m.runtime.jobs[m.ids["a"]].done == pytest.approx(15000)


def test_a_job_that_does_not_commit_in_time_leaves_at_the_drain(tmp_path, write):
    """Commits every 60 s, a walltime of 50 s: no commit comes in the window, so the job leaves when the drain
    comes (end - grace - margin), before the batch system's SIGTERM, losing what it did since it started."""
    job = linear("a", 1, 1, 100, up=1, down=1, total=1e6)
    m = Machine(tmp_path, write, {"n0": True}, [], [job], walltime_s=50.0, accounting="realistic", start_cost_s=0.0, commit_interval_s=60.0)
    m.submit("a")
    m.run_to(0, 10)
    end = m.pilot_of("n0").walltime_end
    m.run_to(11, 52)
    (first, *_) = [e for e in m.events("node.leaving") if e["node"] == "n0"]
    assert NodeWhy.of(first["data"]["why"]) == NodeWhy.WALLTIME
    assert first["time"] == end - lead_s(GRACE_S, 1.0)
    assert [e["pilot"] for e in m.events("pilot.walltime")] == [first["pilot"]]


# ------------------------------------------------------------------ for real: the local cluster and Slurm

COMMIT_S = 2.0
RATE = 40.0

LOCAL = """scheduler = "local"
[local]
nodes = 1
workload = "none"
pilot_walltime_s = 25.0
[pilots]
heartbeat_s = 0.5
heartbeat_deadline_s = 10.0
grace_s = 3.0
[controller]
tick_s = 0.1
[runtime]
kind = "processes"
"""

SLURM = """scheduler = "slurm"
[slurm]
partition = "scavenger"
min_nodes = 1
max_nodes = 1
time_min = "00:01:00"
time_max = "00:01:00"
poll_s = 0.5
command_timeout_s = 20.0
[pilots]
heartbeat_s = 0.5
heartbeat_deadline_s = 15.0
grace_s = 5.0
nodes_per_pilot = 1
max_queued_pilots = 1
[controller]
tick_s = 0.1
[runtime]
kind = "processes"
"""


def _walltime_job() -> dict:
    """Real rank processes committing every COMMIT_S seconds; about 40 s of work on one node, so it outlives a pilot."""
    return synthetic_job("walltime", total=RATE * 40, per_rank=RATE, lo=1, hi=1, commit_s=COMMIT_S, step_s=0.25)


def _drained_before_the_end_losing_at_most_one_commit(run: LocalRun, job: str, grace_s: float) -> None:
    events = run.events()
    ends = {e["pilot"]: e["data"]["walltime_end"] for e in events if e["kind"] == "pilot.started"}
    assert ends and all(end is not None for end in ends.values()), f"pilots without a walltime end: {ends}"
    drained = [e for e in events if e["kind"] == "node.leaving" and NodeWhy.of(str(e["data"]["why"])) in (NodeWhy.WALLTIME, NodeWhy.WALLTIME_AT_COMMIT)]
    assert drained, "no pilot was drained before its walltime"
    for e in drained:
        assert e["time"] <= ends[e["pilot"]] - grace_s, f"{e['node']} left only {ends[e['pilot']] - e['time']:.1f} s before its pilot's end"
    stopped = [e for e in events if e["kind"] == "job.stopped" and e["job"] == job]
    assert stopped, "the job never left a pilot"
    row = run.client.job(job)
    assert row["redone"] <= RATE * COMMIT_S, f"lost {row['redone']} samples: more than one commit interval's {RATE * COMMIT_S}"
    assert not [e for e in events if e["kind"] in ("rank.lost", "job.crashed")], "ranks were killed by the batch system, not drained"


@pytest.mark.local
def test_a_local_pilot_with_a_short_walltime_is_drained_and_the_job_goes_on(local):
    run = local(config=LOCAL)
    run.start()
    job = run.client.submit(_walltime_job())
    done = run.client.wait([job], timeout_s=300)[job]
    assert done["status"] == "finished", done.get("error")
    assert len({e["pilot"] for e in run.events("pilot.started")}) >= 2  # it outlived its first pilot
    _drained_before_the_end_losing_at_most_one_commit(run, job, grace_s=3.0)


@pytest.mark.site
def test_a_slurm_pilot_reaching_its_time_limit_is_drained_and_the_job_goes_on(slurm, tmp_path):
    run = LocalRun(tmp_path, config=SLURM)
    run.start(timeout_s=60)
    try:
        job = run.client.submit({**_walltime_job(), "kwargs": {**_walltime_job()["kwargs"], "total_samples": RATE * 100}})
        done = run.client.wait([job], timeout_s=480)[job]
        assert done["status"] == "finished", done.get("error")
        assert len({e["pilot"] for e in run.events("pilot.started")}) >= 2
        _drained_before_the_end_losing_at_most_one_commit(run, job, grace_s=5.0)
    finally:
        run.stop()
        run.wait_for(lambda: not run.leftover_processes(), 60, "no leftover processes")


STAGGERED = """scheduler = "local"
[local]
nodes = 2
workload = "script"
script = [{ at = 0, node = "pf-node-1", state = "busy" }, { at = 3, node = "pf-node-1", state = "idle" }]
pilot_walltime_s = 40.0
[pilots]
heartbeat_s = 0.5
heartbeat_deadline_s = 10.0
grace_s = 3.0
nodes_per_pilot = 1
[controller]
tick_s = 0.1
[runtime]
kind = "processes"
"""
UP_S, DOWN_S = 15.0, 5.0  # the growing job's rescale costs: a node whose drain is nearer than 20 s is not worth growing onto


def _short_then_grower(run: LocalRun, short_s: float) -> tuple[str, str]:
    """A one-node job of ``short_s`` seconds on the first node, then a job of up to two nodes that will outlive it."""
    short = run.client.submit({**synthetic_job("short", total=400.0 * short_s, per_rank=400.0, lo=1, hi=1), "restart_cost_s": 600.0})
    run.wait_for(lambda: run.client.job(short)["status"] == "running", 120, "the short job started on the first node")
    grower = run.client.submit({**synthetic_job("grower", total=40.0 * 1000, per_rank=40.0, lo=1, hi=2), "costs_known": True,
                                "scale_up_cost_s": UP_S, "scale_down_cost_s": DOWN_S})  # fmt: skip
    return short, grower


def _not_grown_onto_an_ending_pilot(run: LocalRun, short: str, grower: str, lead: float) -> None:
    """The short job freed its node within the growth's cost of its pilot's drain, and the grower did not get that
    node from that pilot; no node joined the grower nearer its own pilot's drain than the growth's cost."""
    run.client.wait([short], timeout_s=180)
    joins = run.events("node.joined")
    started = {e["pilot"]: e["data"]["walltime_end"] for e in run.events("pilot.started")}
    short_on = next(e for e in run.events("job.started") if e["job"] == short)["data"]["nodes"][0]
    pilot = [e for e in joins if e["node"] == short_on][-1]["pilot"]
    drain = started[pilot] - lead
    freed = next(e for e in run.events("job.finished") if e["job"] == short)["time"]
    assert drain - UP_S - DOWN_S < freed < drain, (
        f"the short job ended {drain - freed:.1f} s before its pilot's drain: the test needs it within {UP_S + DOWN_S:.0f} s "
        f"of it (a machine too slow for this timing)")  # fmt: skip
    run.wait_for(lambda: any(e["pilot"] == pilot for e in run.events("pilot.ended")), 120, "the first pilot's end")
    events = run.events()
    joins = [e for e in events if e["kind"] == "node.joined"]
    ends = {e["pilot"]: e["data"]["walltime_end"] - lead for e in events if e["kind"] == "pilot.started"}
    grown = [(e["time"], node) for e in events if e["job"] == grower and e["kind"] in ("job.started", "job.resized") for node in e["data"]["nodes"]]
    for t, node in grown:
        by = [j for j in joins if j["node"] == node and j["time"] <= t][-1]["pilot"]
        assert by != pilot or t < freed, f"the job was grown onto {node} {drain - t:.1f} s before its pilot's drain"
        assert ends[by] - t >= UP_S + DOWN_S - 1.0, f"{node} joined the job {ends[by] - t:.1f} s before its pilot's drain"


@pytest.mark.local
def test_a_job_is_not_grown_onto_a_local_pilot_whose_drain_comes_before_the_growth_pays(local):
    """Two pilots with staggered walltimes (pf-node-1 is busy for the first 3 s): a short job frees pf-node-0 within 20 s
    of its pilot's drain while a two-node job runs on pf-node-1. Growing onto it would pay 15 s up and 5 s down for
    less training than that: the job must not get it until a new pilot brings it back."""
    run = local(config=STAGGERED)
    run.start()
    short, grower = _short_then_grower(run, short_s=15.0)
    _not_grown_onto_an_ending_pilot(run, short, grower, lead_s(3.0, 0.1))
    run.client.cancel(grower)


SLURM_STAGGERED = SLURM.replace("max_queued_pilots = 1", "max_queued_pilots = 2")


@pytest.mark.site
def test_a_job_is_not_grown_onto_a_slurm_pilot_whose_drain_comes_before_the_growth_pays(slurm, tmp_path):
    """The same on a real Slurm: the main partition holds two nodes for the whole test and a third for its first
    10 s, so the two pilots' one-minute time limits end about 10 s apart."""
    slurm.command("sbatch", "--parsable", "-p", "main", "-N", "2", "-w", "node3,node4", "-o", "/dev/null", "--wrap", "sleep 600")
    slurm.command("sbatch", "--parsable", "-p", "main", "-N", "1", "-w", "node2", "-o", "/dev/null", "--wrap", "sleep 10")
    run = LocalRun(tmp_path, config=SLURM_STAGGERED)
    run.start(timeout_s=60)
    try:
        short, grower = _short_then_grower(run, short_s=35.0)
        _not_grown_onto_an_ending_pilot(run, short, grower, lead_s(5.0, 0.1))
        run.client.cancel(grower)
    finally:
        run.stop()
        run.wait_for(lambda: not run.leftover_processes(), 60, "no leftover processes")


def test_the_pools_horizon_follows_nodes_that_join_and_leave_and_the_walltimes_they_are_held_within(tmp_path, write):
    """The horizon reads each ready node's age and walltime left; the controller keeps those in arrays between
    decisions and reads the nodes again only when they change. At every second of a trace where nodes join, leave and
    come back under new pilots, it is what the nodes themselves say."""
    import math

    import numpy as np

    rows = [(t, f"n{i}", s) for t, i, s in [(5, 1, "idle"), (12, 2, "idle"), (20, 1, "busy"), (33, 3, "idle"), (41, 1, "idle"), (52, 2, "busy"),
                                            (70, 0, "busy"), (84, 0, "idle")]]  # fmt: skip
    m = Machine(tmp_path, write, {"n0": True, "n1": False, "n2": False, "n3": False}, rows, [linear("a", 1, 4, 100, up=1, down=1)], walltime_s=40.0)
    m.submit("a")
    sizes = set()
    for t in range(0, 120):
        m.at(t)
        world, ctl = m.ctl.world, m.ctl
        nodes = list(world.ready_nodes())
        ends = [world.pilots[n.pilot].walltime_end if n.pilot in world.pilots else None for n in nodes]
        expected = ctl.holds.expected([m.now - n.since for n in nodes], [e - m.now if e else math.inf for e in ends])
        want = float(np.median(expected)) if len(nodes) else ctl.holds.horizon([])
        if ctl.lifetimes.samples >= ctl.lifetimes.min_samples:
            want = min(want, float(ctl.lifetimes.expected([0.0])[0]))
        assert ctl.horizon(m.now) == pytest.approx(want), f"at {t} s"
        sizes.add(len(nodes))
    assert len(sizes) >= 3  # the pool did change


def test_at_machine_scale_the_pools_horizon_reads_the_nodes_again_when_a_hundredth_changed_or_after_a_while(tmp_path, write, monkeypatch):
    """With thousands of ready nodes (here: any number, by the threshold), reading every node at each change costs a
    decision milliseconds; the median they give moves little with a few nodes. The pool is read again when its size
    moved by a hundredth (here every join or leave) or HORIZON_REFRESH_S after the last read; in between, a change
    that keeps the count (a walltime told) waits. The ages always move with the clock."""
    import math

    import numpy as np

    from pilotfill.controller import pool_horizon as horizon

    monkeypatch.setattr(horizon, "HORIZON_EXACT_NODES", 0)
    rows = [(t, f"n{i}", s) for t, i, s in [(5, 1, "idle"), (12, 2, "idle"), (20, 1, "busy"), (33, 3, "idle"), (41, 1, "idle"), (52, 2, "busy"),
                                            (70, 0, "busy"), (84, 0, "idle")]]  # fmt: skip
    m = Machine(tmp_path, write, {"n0": True, "n1": False, "n2": False, "n3": False}, rows, [linear("a", 1, 4, 100, up=1, down=1)], walltime_s=40.0)
    m.submit("a")
    read = None  # (version, nodes' since, walltime ends, when read): what the controller should hold
    for t in range(0, 120):
        m.at(t)
        world, ctl = m.ctl.world, m.ctl
        nodes = list(world.ready_nodes())
        now_read = [(n.since, world.pilots[n.pilot].walltime_end if n.pilot in world.pilots else None) for n in nodes]
        if read is None or (read[0] != world.ready_version and (len(nodes) != len(read[1]) or m.now - read[2] >= horizon.HORIZON_REFRESH_S)):
            read = (world.ready_version, now_read, m.now)
        expected = ctl.holds.expected([m.now - since for since, _ in read[1]], [e - m.now if e else math.inf for _, e in read[1]])
        want = float(np.median(expected)) if len(read[1]) else ctl.holds.horizon([])
        if ctl.lifetimes.samples >= ctl.lifetimes.min_samples:
            want = min(want, float(ctl.lifetimes.expected([0.0])[0]))
        assert ctl.horizon(m.now) == pytest.approx(want), f"at {t} s"
    # A change that keeps the count: every ready node's pilot told it ends in 3 s. It waits for the refresh.
    before = ctl.horizon(m.now)
    assert world.ready and before > 3.0
    for pilot in {n.pilot for n in world.ready_nodes()}:
        world.set_pilot(world.pilots[pilot], walltime_end=m.now + 3.0)
    assert ctl.horizon(m.now) == before
    assert ctl.horizon(m.now + horizon.HORIZON_REFRESH_S) <= 3.0  # read again: bounded by the walltimes


def test_what_the_ready_nodes_are_held_within_has_a_version_that_moves_with_every_change(tmp_path):
    """The controller reads the ready nodes again only when this version moves: a node joining, a ready node leaving
    or gone, a walltime told; not a node changing hands between jobs, nor a node that was not ready going."""
    from pilotfill.controller.world import World
    from pilotfill.journal import Journal

    (tmp_path / "run").mkdir()
    world = World(Journal(tmp_path / "run"))
    pilot = world.add_pilot("p1", "1", 2, 0.0, 1)
    seen = [world.ready_version]

    def moved() -> bool:
        seen.append(world.ready_version)
        return seen[-1] != seen[-2]

    world.node_joins("n0", pilot, 1.0)
    assert moved()
    world.node_joins("n1", pilot, 1.0)
    assert moved()
    world.assign(world.nodes["n0"], "job")
    assert not moved()
    world.set_pilot(pilot, state="running")
    assert not moved()
    world.set_pilot(pilot, walltime_end=100.0)
    assert moved()
    world.set_node_state(world.nodes["n0"], "leaving", 2.0)
    assert moved()
    world.set_node_state(world.nodes["n0"], "gone", 3.0)  # it was not ready any more
    assert not moved()
    world.set_node_state(world.nodes["n1"], "gone", 3.0)
    assert moved() and not world.ready
