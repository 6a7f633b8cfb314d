"""What a job's reports teach the controller (pilotfill/controller/training.py), fed report by report on a real
journal: progress and commits counted, what a start or a resize cost, and rates learned only from steady training at
the size the job holds."""

from __future__ import annotations

import pytest

from pilotfill.allocator import Profiler
from pilotfill.config import parse_config
from pilotfill.controller.throughput import METER_WINDOW_S
from pilotfill.controller.job_progress import JobProgress
from pilotfill.controller.node_types import NodeTypes
from pilotfill.controller.world import World
from pilotfill.protocol import JobReport, check_spec
from pilotfill.security import private_dir
from pilotfill.journal import Journal

pytestmark = pytest.mark.unit


class Ranks:
    """The one question JobProgress asks a runtime: does a resize restart every rank (torch) or not (Horovod)?"""

    def __init__(self, restarts: bool):
        self.restarts = restarts

    def resize_restarts_ranks(self, job_id: str | None = None) -> bool:
        return self.restarts


@pytest.fixture
def setup(tmp_path):
    def make(restarts: bool = False, curve: bool = False):
        journal = Journal(private_dir(tmp_path / f"run-{restarts}-{curve}"))
        world, profiler = World(journal), Profiler()
        types = NodeTypes(parse_config({}), tmp_path, profiler)
        commits, changes = [], []
        training = JobProgress(world, profiler, types, Ranks(restarts), at_commit=lambda job, now: commits.append(now), changed=lambda: changes.append(1))
        spec = {"name": "j", "entry": "m:f", "min_nodes": 1, "max_nodes": 4}
        if curve:
            spec["curve"] = {"nodes": [0, 1, 2, 3, 4], "samples_per_s": [0, 10, 20, 30, 40]}
        with journal.transaction():
            job = world.add_job("j1", "j", check_spec(spec), 0.0)
        return world, profiler, training, job, journal, commits, changes

    return make


def start(world, training, job, nodes, now):
    world.update_job(job, status="running", nodes=nodes)
    training.started(job, now)
    training.measure_from(job, len(nodes), now)


def report(training, job, host, samples, seconds, now, first=False, commit=False, pid=1):
    return training.report(job, JobReport(job.id, host, samples, seconds, first=first, commit=commit, pid=pid), now)


def test_the_first_report_after_a_start_measures_what_the_start_cost_and_steady_reports_the_rate(setup):
    world, profiler, training, job, journal, _, changes = setup()
    with journal.transaction():
        start(world, training, job, ["n0", "n1"], 100.0)
        report(training, job, "n0", 10, 1.0, 112.0, first=True, pid=1)  # trained from 111: the start took 11 s
        report(training, job, "n1", 10, 1.0, 112.0, first=True, pid=2)
        t, reported = 112.0, 20
        while t < 112.0 + METER_WINDOW_S + 1:
            t += 0.5
            report(training, job, "n0", 25, 0.5, t, pid=1)
            report(training, job, "n1", 25, 0.5, t, pid=2)
            reported += 50
    costs = [e["data"] for e in journal.events("job.cost")]
    assert costs == [{"change": "start", "seconds": 11.0}]
    assert profiler.measured(job.id)
    estimate = [e["data"] for e in journal.events("job.estimate")]
    assert estimate and estimate[0]["nodes"] == 2 and estimate[0]["samples_per_s"] == pytest.approx(100.0)
    assert changes, "a scale never seen before changes the estimate: the allocation is decided again"
    assert job.progress == reported


@pytest.mark.parametrize("restarts", [True, False], ids=["torch: a resize restarts every rank", "horovod: ranks run through"])
def test_what_old_ranks_report_until_a_resize_is_seen_training_is_metered_only_when_they_run_through(setup, restarts):
    world, profiler, training, job, journal, _, _ = setup(restarts=restarts)
    with journal.transaction():
        start(world, training, job, ["n0"], 0.0)
        report(training, job, "n0", 10, 1.0, 5.0, first=True)  # the start is seen training
        world.update_job(job, nodes=["n0", "n1", "n2", "n3"])  # grown to four: a new round (torch) or a reset (Horovod)
        training.resized(job, True, 10.0)
        training.measure_from(job, 4, 10.0)
        t = 10.0
        for _ in range(12):  # the old rank still reports, at the one-node rate, and nobody new has yet
            t += 0.5
            report(training, job, "n0", 5, 0.5, t)
    at_four = [e for e in journal.events("job.estimate") if e["data"]["nodes"] == 4]
    if restarts:
        assert not at_four, "a torch job's old rank, still at one node's rate, was measured as the four-node rate"
    else:
        assert at_four and at_four[0]["data"]["samples_per_s"] == pytest.approx(10.0)  # a rank that ran through the resize


def test_a_job_forms_its_group_until_it_reports_training_or_commits(setup):
    world, _, training, job, journal, commits, _ = setup()
    with journal.transaction():
        start(world, training, job, ["n0", "n1"], 0.0)
        assert training.forming(job)
        world.update_job(job, nodes=["n0", "n1", "n2"])
        training.resized(job, True, 1.0)  # a pilot that registered late: its ranks join a group still forming
        assert training.forming(job), "grown before it trained: its ranks are still forming the group"
        report(training, job, "n0", 4, 1.0, 3.0, first=True, commit=True)
        assert not training.forming(job), "it committed: its ranks are past forming the group"
        assert commits == [3.0] and job.committed == 4
        training.resized(job, False, 4.0)  # a shrink's survivors report on, never "first" again: not forming
        assert not training.forming(job)


def test_commits_keep_what_was_counted_and_a_known_curve_is_not_learned(setup):
    world, _, training, job, journal, _, _ = setup(curve=True)
    with journal.transaction():
        start(world, training, job, ["n0"], 0.0)
        report(training, job, "n0", 10, 1.0, 2.0, first=True)
        training.commit(job, 10.0)
        report(training, job, "n0", 10, 1.0, 11.0)
        training.commit(job, 40.0)
        report(training, job, "n0", 10, 1.0, 41.0)
    assert job.committed == 20 and job.progress == 30
    assert world.roll_back(job) == 10, "what the last commit did not cover is lost to a stop"
    assert not journal.events("job.estimate"), "a job with a known curve is not learned"


def test_a_job_over_is_forgotten(setup):
    world, _, training, job, journal, _, _ = setup()
    with journal.transaction():
        start(world, training, job, ["n0"], 0.0)
    training.forget(job.id)
    assert not training.forming(job)
