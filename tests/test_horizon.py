"""A free node is a used node: the allocator's horizon is how long nodes really stay (issue "A free node is a used node").

BFTrainer's constant look-ahead (10 s) against a 10 s scale-up cost cancels
every growth of a running job; the horizon learned from the machine — each
node's expected hold within its pilot's walltime — lets a measured job grow
where nodes stay, and keeps it from growing where they come and go.
"""

from __future__ import annotations

import pytest
from conftest import JOB_HEADER

from pilotfill.allocator.hold_model import MIN_SAMPLES, PRIOR_S, HoldModel
from pilotfill.replay import Replay
from pilotfill.traces import read_jobs, read_trace

pytestmark = pytest.mark.unit

T0 = "2021-02-10T00:00:00Z"
NEW_USER = """
scheduler = "local"
[local]
nodes = 8
workload = "none"
[runtime]
kind = "processes"
"""


def stamp(seconds: float) -> str:
    s = int(seconds)
    return f"2021-02-10T{s // 3600:02d}:{s // 60 % 60:02d}:{s % 60:02d}Z"


def test_the_hold_model_keeps_exactly_the_newest_holds_sorted_however_often_it_is_read():
    """Holds observed and forgotten (beyond ``keep``) are merged into the sorted array when it is read, equal holds
    counted each: whatever the pattern of reads, it is the newest ``keep`` holds, sorted."""
    import random

    from pilotfill.allocator import hold_model as horizon

    rng = random.Random(7)
    for keep, read_every in [(5, 1), (50, 7), (50, 1000), (300, 3)]:
        m = HoldModel(keep=keep)
        seen: list[float] = []
        for i in range(2000):
            value = float(rng.choice([1, 2, 2, 3, 10, 60])) if rng.random() < 0.5 else rng.uniform(0, 100)
            m.observe(value)
            seen.append(value)
            if i % read_every == 0:
                assert list(m.holds()) == sorted(seen[-keep:])
        m.observe(float("nan"))  # not a hold
        m.observe(-1.0)
        assert list(m.holds()) == sorted(seen[-keep:]) and m.samples == keep
    m = HoldModel()
    for i in range(horizon.MERGE_EVERY + 1):  # never read: what waits to be merged stays bounded
        m.observe(float(i))
    assert m.unmerged <= horizon.MERGE_EVERY


def test_the_hold_model_learns_median_residual_holds_and_falls_back_to_lindy():
    m = HoldModel()
    assert m.horizon([]) == PRIOR_S
    assert list(m.expected([0.0, 500.0])) == [PRIOR_S, 500.0]  # nothing seen: at least the prior, else as long again
    for _ in range(MIN_SAMPLES):
        m.observe(100.0)
    for _ in range(MIN_SAMPLES):
        m.observe(300.0)
    # median residual: at age 0, the (lower) median of 100s and 300s = 100; at 150, only the 300 s holds are longer: 150 more.
    assert list(m.expected([0.0, 150.0])) == pytest.approx([100.0, 150.0])
    assert list(m.expected([0.0], bounds=[42.0])) == [42.0]  # a walltime ending sooner bounds it
    assert m.expected([1000.0])[0] == 1000.0  # older than anything seen: Lindy
    small = HoldModel(keep=5)
    for d in range(10):
        small.observe(float(d))
    assert small.samples == 5  # the newest only: bounded memory
    assert small.expected([0.0])[0] == PRIOR_S  # fewer than MIN_SAMPLES: the prior


def test_the_horizon_of_a_replay_is_learned_only_from_the_past(write, tmp_path):
    """Two traces equal up to 10 min and different after: every decision up to then sees the same horizon."""
    base = [f"{T0},n{i},idle" for i in range(4)]
    past = [f"{stamp(30 * k + 10)},n{k % 4},busy\n{stamp(30 * k + 20)},n{k % 4},idle" for k in range(20)]
    future_a = [f"{stamp(700 + 5 * k)},n{k % 4},busy\n{stamp(702 + 5 * k)},n{k % 4},idle" for k in range(40)]
    future_b = [f"{stamp(700 + 200 * k)},n{k % 4},busy\n{stamp(800 + 200 * k)},n{k % 4},idle" for k in range(4)]
    jobs = read_jobs(write("jobs.csv", f"{JOB_HEADER}\na,m,{T0},1,4,1e9,10,5,0;1;4,0;100;400\n"))
    horizons = []
    for name, future in (("a", future_a), ("b", future_b)):
        trace = read_trace(write(f"trace-{name}.csv", "\n".join(["time,node,state", *base, *past, *future, f"{stamp(1700)},,end"]) + "\n"))
        Replay(trace, jobs, run_dir=tmp_path / name, keep_timeline=False).run()
        from pilotfill.journal import Journal

        s = Journal(tmp_path / name, readonly=True)
        horizons.append([(e["time"], e["data"]["horizon_s"]) for e in s.events("allocation") if e["time"] < trace.start + 700])
        s.close()
    assert horizons[0] == horizons[1] and len(horizons[0]) > 10


def test_where_nodes_come_and_go_every_few_seconds_nothing_grows_and_nothing_is_rerequested(write, tmp_path):
    """Six of eight nodes are taken back every 6 s (held 2 s after a 3 s queue wait): once the machine has shown
    that, a measured job stays on what stays — no growth onto nodes that leave before a scale-up pays, no thrash."""
    changes = sorted((6 * k + i - 1 + dt, i, state) for k in range(100) for i in range(2, 8) for dt, state in ((0, "busy"), (1, "idle")))
    rows = [f"{T0},n{i},idle" for i in range(8)] + [f"{stamp(t)},n{i},{state}" for t, i, state in changes]
    trace = read_trace(write("trace.csv", "\n".join(["time,node,state", *rows, f"{stamp(620)},,end"]) + "\n"))
    jobs = read_jobs(write("jobs.csv", f"{JOB_HEADER}\na,m,{T0},1,8,1e12,10,5,0;1;8,0;100;800\n"))
    r = Replay(trace, jobs, profiles="learned", queue_delay_s=3.0, keep_timeline=False, run_dir=tmp_path / "run").run()
    from pilotfill.journal import Journal

    s = Journal(tmp_path / "run", readonly=True)
    try:
        grown = [e for e in s.events("job.resized") if e["data"]["after"] > e["data"]["before"] - ("cause" in e["data"])]
        late_pilots = [e for e in s.events("pilot.submitted") if e["time"] > trace.start + 120]
    finally:
        s.close()
    assert len(late_pilots) <= 5, f"{len(late_pilots)} pilots for nodes that leave within seconds"
    assert not [e for e in grown if e["time"] > trace.start + 120], "grew onto nodes that leave within seconds"
    assert r.nodes_rerequested_within_60s == 0
    assert r.pilots_submitted <= r.idle_transitions


@pytest.mark.local
def test_a_new_users_jobs_grow_onto_idle_nodes(local):
    """The issue's case: 8 local nodes, no main workload, three trainings with no curve and no costs (the README's
    way), max 2 nodes each: within 30 s of the first throughput report they train on 6 nodes."""
    run = local(config=NEW_USER)
    run.start()
    spec = {"entry": "pilotfill.workloads.synthetic:train", "min_nodes": 1, "max_nodes": 2}
    ids = [run.client.submit({**spec, "name": f"train({i})", "kwargs": {"total_samples": 1e9, "samples_per_s": 20.0, "step_s": 0.5}}) for i in range(3)]
    run.wait_for(lambda: run.events("job.estimate"), 60, "a first throughput measurement")
    run.wait_for(lambda: sum(len(run.client.job(j)["nodes"]) for j in ids) >= 6, 90, "the jobs on six nodes")  # waits allow a busy CI machine
    events = run.events()
    t_first = next(e["time"] for e in events if e["kind"] == "job.estimate")
    grown = [e for e in events if e["kind"] == "job.resized" and e["data"]["after"] > e["data"]["before"]]
    assert len({e["job"] for e in grown}) == 3 and max(e["time"] for e in grown) - t_first <= 30


PBS_NEW_USER = """scheduler = "pbs"
[pbs]
queue = "scavenger"
min_walltime = "00:05:00"
max_walltime = "02:00:00"
nodes_per_pilot = 1
chunk = "ncpus=1"
poll_s = 0.5
[pilots]
nodes_per_pilot = 1
[runtime]
kind = "processes"
"""

NEW_USER_CAMPAIGN = """
import pilotfill

@pilotfill.elastic_app(min_nodes=1, max_nodes=2)
def train(i):
    import time
    import pilotfill
    for _ in range(120):
        time.sleep(0.5)
        pilotfill.report(samples=10)
    return i

print("results", [f.result() for f in [train(i) for i in range(3)]])
"""


def nodes_in_use(events: list[dict]) -> list[tuple[float, int]]:
    """(time, nodes held by jobs) after every start, resize or stop in a journal's events."""
    held: dict[str, int] = {}
    out = []
    for e in events:
        if e["kind"] == "job.started":
            held[e["job"]] = len(e["data"]["nodes"])
        elif e["kind"] == "job.resized":
            held[e["job"]] = e["data"]["after"]
        elif e["kind"] in ("job.stopped", "job.finished", "job.failed", "job.cancelled"):
            held[e["job"]] = 0
        else:
            continue
        out.append((e["time"], sum(held.values())))
    return out


@pytest.mark.local
def test_a_new_users_jobs_grow_onto_idle_vnodes_on_pbs_with_one_vnode_pilots(pbs, tmp_path):
    """The issue's case on the STAND-IN OpenPBS (OpenPBS is not packaged here; tests/pbs_standin reproduces what a real
    OpenPBS 23.06.06 did): eight free vnodes, one-vnode pilots, the README's way of writing trainings (no curve, no
    costs): within 30 s of the first throughput report they train on six vnodes (before: three, the rest idle)."""
    import os
    import subprocess
    import sys

    from waiting import wait_for_exit

    from pilotfill.journal import Journal

    pbs("pbs_standin", "exec", "on")
    config, campaign, run_dir = tmp_path / "pbs.toml", tmp_path / "campaign.py", tmp_path / "run"
    config.write_text(PBS_NEW_USER)
    campaign.write_text(NEW_USER_CAMPAIGN)
    out = tmp_path / "campaign.out"
    proc = subprocess.Popen([sys.executable, "-m", "pilotfill", "run", str(campaign), "--config", str(config), "--run-dir", str(run_dir), "--quiet"],
                            cwd=tmp_path, env=dict(os.environ), stdout=open(out, "wb"), stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        wait_for_exit(proc, 600, "the new user's campaign to end", out, run_dir)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out.read_text()[-4000:]
    assert "results [0, 1, 2]" in out.read_text()
    state = Journal(run_dir, readonly=True)
    try:
        events = state.events()
    finally:
        state.close()
    t_first = next(e["time"] for e in events if e["kind"] == "job.estimate")
    used = nodes_in_use(events)
    reached = [t for t, n in used if n >= 6]
    assert reached, f"never trained on six vnodes: {used}"
    assert reached[0] - t_first <= 30, f"six vnodes only {reached[0] - t_first:.0f} s after the first measurement"
