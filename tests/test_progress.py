"""Progress is what a job would resume from (issue "Progress is what a job would resume from").

A stop loses the work since the job's last commit: the ranks resume from the
commit and report that work again. The controller's count falls back to the
commit on every stop, keeps committed and counted progress apart in the
journal, never values a job that has not returned at nothing, and never lets a
job that cannot be placed hold one of the ``max_jobs`` places.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from conftest import JOB_HEADER
from test_controller_core import Machine, linear

from pilotfill.replay import Replay
from pilotfill.journal import Journal
from pilotfill.traces import read_jobs, read_trace

pytestmark = pytest.mark.unit

T0 = "2021-02-10T00:00:00Z"


def stamp(seconds: int) -> str:
    return f"2021-02-10T{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}Z"


def machine(write, nodes: dict[str, bool], rows, end: int, jobs: list[str]):
    lines = ["time,node,state"] + [f"{T0},{n},{'idle' if idle else 'busy'}" for n, idle in nodes.items()]
    lines += [f"{stamp(t)},{n},{s}" for t, n, s in rows] + [f"{stamp(end)},,end"]
    trace = read_trace(write("trace.csv", "\n".join(lines) + "\n"))
    return trace, read_jobs(write("jobs.csv", "\n".join([JOB_HEADER, *jobs]) + "\n"))


def test_a_stopped_job_resumes_from_its_last_commit_and_finishes_with_exact_samples(write, tmp_path):
    # One job at 100 samples/s on one node; realistic accounting: a start costs 30 s, a commit every 60 s of training.
    # At 70 s it commits (4,000 samples: 40 s of training after the start's 30 s); at 100 s its node is taken back
    # with 3,000 samples uncommitted; it restarts on the other node from the commit.
    trace, jobs = machine(write, {"n0": True, "n1": False}, [(70, "n1", "idle"), (100, "n0", "busy")], 3000,
                          [f"a,m,{T0},1,1,50000,10,5,0;1,0;100"])  # fmt: skip
    r = Replay(trace, jobs, accounting="realistic", run_dir=tmp_path / "run", keep_timeline=False).run()
    assert r.jobs_completed == 1
    (a,) = r.jobs
    assert a.samples == 50000  # exact: the simulated job's own accounts
    assert r.samples_redone == pytest.approx(3000)
    assert r.jobs_overran == 0
    s = Journal(tmp_path / "run", readonly=True)
    try:
        (job,) = s.jobs()
        stopped = s.events("job.stopped")
        started = s.events("job.started")
    finally:
        s.close()
    assert job.status == "finished" and job.redone == pytest.approx(3000)
    assert [e["data"]["redone"] for e in stopped] == [pytest.approx(3000)]
    assert [e["data"]["progress"] for e in started] == [0, pytest.approx(4000)]  # the restart counts from the commit
    assert job.progress == pytest.approx(50000)  # counted progress: every sample once


def test_progress_falls_back_to_the_commit_on_every_kind_of_stop(tmp_path, write):
    m = Machine(tmp_path, write, 2, [linear("x", 1, 1, 100)])
    x = m.submit("x")
    m.at(0)
    job = m.job("x")
    m.ctl.handle({"type": "job.report", "job_id": x, "host": job.nodes[0], "samples": 500.0, "seconds": 5.0})
    assert m.ctl.handle({"type": "job.commit", "job_id": x})["committed"] == 500.0
    m.ctl.handle({"type": "job.report", "job_id": x, "host": job.nodes[0], "samples": 200.0, "seconds": 2.0})
    assert (job.progress, job.committed) == (700.0, 500.0)
    m.ctl.shutdown()  # the controller stops: the ranks are ended, the job resumes later from its commit
    s = Journal(m.run_dir, readonly=True)
    try:
        row = s.job(x)
    finally:
        s.close()
    assert (row.status, row.progress, row.committed, row.redone) == ("pending", 500.0, 500.0, 200.0)


def test_a_job_past_its_declared_work_keeps_its_nodes_and_finishes(tmp_path, write):
    """A declared total is an estimate: a job whose reports pass it (redone work, noise, a wrong guess) has not
    returned, so it is worth its minimum size at least — never nothing — and is said once to have overrun."""
    # "a" really needs 100 s on its node (10,000 samples) but declares 5,000; "b" waits for a node.
    m = Machine(tmp_path, write, 1, [linear("a", 1, 1, 100), linear("b", 1, 1, 100)])
    m.specs["a"].__dict__["total_samples"] = 10_000.0  # the simulated job's real work
    m.specs["b"].__dict__["total_samples"] = 1_000.0
    a = m.submit("a", total_samples=5_000.0)
    m.at(0)
    m.submit("b", total_samples=1_000.0)
    for t in range(10, 200, 10):
        m.at(t)
    assert m.job("a").status == "finished" and m.job("b").status == "finished"
    assert len(m.events("job.overran")) == 1 and m.events("job.overran")[0]["job"] == a
    assert m.job("a").overran and m.ctl.world.counters["jobs_overran"] == 1
    assert not m.events("job.stopped")  # never stopped for the waiting job: it was worth its node


def test_a_job_nothing_can_place_takes_no_place_among_max_jobs(write, tmp_path):
    # Three nodes, one busy throughout: "big" (3 nodes) fits the machine but never what is idle; with one place,
    # it must not keep "small" waiting for the whole trace.
    trace, jobs = machine(write, {"n0": True, "n1": True, "n2": False}, [], 600,
                          [f"big,m,{T0},3,3,1e9,10,5,0;3,0;300", f"small,m,{T0},1,1,10000,10,5,0;1,0;100"])  # fmt: skip
    r = Replay(trace, jobs, max_jobs=1, keep_timeline=False).run()
    assert {j.name: j.finished is not None for j in r.jobs}["small"]
    assert r.jobs_completed == 1


def test_the_live_view_shows_committed_work_apart_from_work_a_stop_would_lose():
    from pilotfill.tui import JobView, _progress

    job = JobView("j1", "train(1)", "running", 2, 1, 2, 10.0, 50.0, 100.0, 0, committed=30.0)
    bar = _progress(job, 40)
    styles = {str(span.style) for span in bar.spans}
    assert {"green", "yellow"} <= styles
    green = sum(len(bar.plain[s.start : s.end]) for s in bar.spans if str(s.style) == "green")
    yellow = sum(len(bar.plain[s.start : s.end]) for s in bar.spans if str(s.style) == "yellow")
    assert green < green + yellow and green > 0  # 30 % committed, 50 % counted
    plain = _progress(JobView("j2", "t", "running", 1, 1, 1, 1.0, 500.0, None, 0, committed=400.0), 60).plain
    assert "400 committed" in plain


# ------------------------------------------------------------------ what changes cost, measured (JPA)


def test_jpa_charges_what_a_start_really_costs_in_the_simulated_runtime(write, tmp_path):
    """A job whose start takes 20 s is charged 20 s, whatever the job file said; its throughput is measured
    only over training, not over the pause."""
    ticks = [(t + d, "n1", state) for t in (100, 200, 300, 400) for d, state in ((0, "idle"), (1, "busy"))]  # events to report at
    trace, jobs = machine(write, {"n0": True, "n1": False}, ticks, 900, [f"a,m,{T0},1,1,1e9,10,5,0;1,0;100"])
    sim = Replay(trace, jobs, accounting="realistic", profiles="learned", noise=0.0, run_dir=tmp_path / "run", keep_timeline=False)
    sim.runtime.start_cost_s = 20.0
    sim.run()
    s = Journal(tmp_path / "run", readonly=True)
    try:
        costs = [e["data"] for e in s.events("job.cost")]
        estimates = [e["data"]["samples_per_s"] for e in s.events("job.estimate")]
    finally:
        s.close()
    assert costs and costs[0]["change"] == "start" and costs[0]["seconds"] == pytest.approx(20.0)
    assert estimates and estimates[0] == pytest.approx(100.0)  # the rate while training, not samples over the pause
    jpa, (job_id,) = sim.controller.profiler, sim.controller.world.jobs
    assert jpa.cost(job_id, "start", prior=30.0) == pytest.approx(20.0)
    # What a stop costs the allocator: a start plus half the interval between its commits (the simulated job commits
    # after 60 s of training, at the next event: every 100 s here), not the 30 s a job that declares nothing gets.
    assert jpa.cost(job_id, "commit", prior=0.0) == pytest.approx(100.0)
    assert jpa.restart_cost(job_id, prior=30.0) == pytest.approx(20.0 + 100.0 / 2)


@pytest.mark.local
@pytest.mark.parametrize("runtime", ["processes", "torch"])
def test_jpa_charges_what_a_start_really_costs_on_real_ranks(local, runtime, request, monkeypatch):
    """Real ranks that take 20 s before their first step (imports, rendezvous, restoring, a big model): the
    controller measures the pause from the start command to their first report and charges that instead of the
    declared 1 s; and the job's throughput is measured over its training only — the first window is not diluted
    by the 20 s (it would show less than half the rate)."""
    from localrun import synthetic_job

    if runtime == "torch":
        request.getfixturevalue("torch_runtime")
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]))
        monkeypatch.setenv("PROBE_LOG", str(request.getfixturevalue("tmp_path") / "probe.jsonl"))  # tests/torch_probe.py logs there
    run = local(nodes=1, runtime=runtime)
    run.start()
    if runtime == "processes":
        spec = synthetic_job("slow-start", total=1e9, hi=1, startup_s=20.0)
        del spec["curve"]  # learned, as a user who writes none gets
    else:
        spec = {"name": "slow-start", "entry": "torch_probe:train", "kwargs": {"startup_s": 20.0, "epochs": 400, "step_delay_s": 0.05},
                "min_nodes": 1, "max_nodes": 1, "scale_up_cost_s": 1.0, "scale_down_cost_s": 1.0}  # fmt: skip
    spec["restart_cost_s"] = 1.0
    job = run.client.submit(spec)
    run.wait_for(lambda: run.events("job.cost") and run.events("job.estimate"), 240, "the start's cost and the first throughput measured")
    (cost,) = run.events("job.cost")
    assert cost["job"] == job and cost["data"]["change"] == "start"
    assert 20.0 <= cost["data"]["seconds"] <= 60.0
    estimate = run.events("job.estimate")[0]["data"]["samples_per_s"]
    p0, t0 = run.client.job(job)["progress"], time.monotonic()
    time.sleep(10.0)
    steady = (run.client.job(job)["progress"] - p0) / (time.monotonic() - t0)
    assert 0.6 * steady <= estimate <= 1.6 * steady, f"first measurement {estimate:.1f}/s against {steady:.1f}/s while training"
    run.client.cancel(job)


@pytest.mark.local
def test_a_real_job_preempted_past_its_declared_work_while_another_wants_its_node_finishes(local):
    """Real ranks (processes runtime) on one node: "a" declares 100 samples but really trains 2,000, committing every
    2 s; its node is taken back well past its declaration and returned while "b" waits for a node. Before progress
    fell back to commits and estimates stopped being results, "a" was worth nothing after the stop and never got its
    node back: the campaign waited forever. Now both finish, and "a" counts what it resumed from, not twice its work."""
    from localrun import synthetic_job

    run = local(nodes=1, script=[(25.0, "pf-node-0", "busy"), (30.0, "pf-node-0", "idle")])
    run.start()
    a_spec = synthetic_job("a", total=2000, per_rank=40.0, hi=1, commit_s=2.0)
    a_spec["total_samples"] = 100.0  # the declaration: an estimate, wrong
    a = run.client.submit(a_spec)
    b = run.client.submit(synthetic_job("b", total=200, per_rank=40.0, hi=1, commit_s=2.0) | {"total_samples": 200.0})
    run.wait_for(lambda: all(run.client.job(j)["status"] in ("finished", "failed") for j in (a, b)), 240, "both jobs to finish")
    ja, jb = run.client.job(a), run.client.job(b)
    assert (ja["status"], jb["status"]) == ("finished", "finished")
    events = run.events()
    stops = [e for e in events if e["kind"] == "job.stopped" and e["job"] == a]
    overran = [e for e in events if e["kind"] == "job.overran" and e["job"] == a]
    assert overran and stops and overran[0]["time"] <= stops[0]["time"], "the stop must come after the job passed its declaration"
    assert stops[0]["data"]["redone"] >= 0
    starts = [e for e in events if e["kind"] == "job.started" and e["job"] == a]
    assert len(starts) >= 2 and starts[1]["data"]["progress"] > 100.0  # resumed from its last commit, past the declaration
    assert ja["result"]["samples"] >= 2000
    assert ja["progress"] <= 2000 + 40.0 * 0.2 * 2  # every sample counted once (a step of slack), not the redone work again


@pytest.mark.slow
def test_whole_machine_hours_realistic_learned_leave_no_started_job_stranded(shared_data, tmp_path):
    """The shared Summit trace's first eight hours of jobs, all 4,734 nodes, realistic costs, a 30 s queue wait, every job
    learned cold, every job admitted as the machine can start it: every job that started either finishes, runs, or
    waits for nodes at the end — none holds a place with no nodes while nodes sit idle — no open job counts more than
    it committed after a stop, and no node is re-requested within a minute of its release. Hours, not the week: the
    week took 13 minutes here beside other work and past pytest's 30 beside two busy loops (issue 54); the week's
    figures are benchmarks/bench_replay.py's whole-machine cell."""
    jobs = read_jobs(shared_data / "jobs-imagenet-1001.csv")
    first = min(j.submit_time for j in jobs)
    trace = read_trace(shared_data / "summit-2021-02-10-week.csv.gz", start=first, end=first + 8 * 3600.0)
    r = Replay(trace, jobs, accounting="realistic", queue_delay_s=30.0, profiles="learned", noise=0.03, seed=0, run_dir=tmp_path / "run",
               keep_timeline=False).run()  # fmt: skip
    assert r.jobs_started > 0 and r.jobs_completed > 0
    assert r.jobs_stranded_at_end == 0
    # No node given back and asked for again within a minute: here one was, before a release asked whether the jobs
    # would want it back as a new pilot's node (they did: a fresh node's expected hold made the horizon longer).
    assert r.nodes_rerequested_within_60s == 0
    s = Journal(tmp_path / "run", readonly=True)
    try:
        rows = s.jobs()
    finally:
        s.close()
    assert all(row.progress == row.committed for row in rows if row.status == "pending")  # after the final stop too
