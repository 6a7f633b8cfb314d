"""Elastic Horovod ranks inside pilots: real horovodrun, real torch training, on the local cluster."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from localrun import LocalRun, committed_step, digits_job

pytestmark = pytest.mark.local
HERE = Path(__file__).parent
RANKS_S = 600
"""A limit for anything that waits on Horovod's ranks (importing torch, forming the group, training): 20 s alone
here, 55 s with two busy loops beside, and past 240 s once on CI's machine running three test workers."""


@pytest.fixture
def local(tmp_path, horovod, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))  # held_digits
    runs: list[LocalRun] = []

    def make(**kw) -> LocalRun:
        runs.append(LocalRun(tmp_path, runtime="horovod", grace=5.0, **kw))
        return runs[-1]

    yield make
    for run in runs:
        run.stop()
        run.wait_for(lambda: not run.leftover_processes(), 20, "no leftover processes")


def events_of(run, kind, job=None):
    return [e for e in run.events(kind) if job is None or e["job"] == job]


def held_job(name: str, hold: Path, **kwargs) -> dict:
    """``digits_job`` that trains on past its epochs while ``hold`` exists (tests/held_digits.py): a test waits for
    what it checks to happen to a training job, not for a race against its end on a busy machine."""
    hold.touch()
    job = digits_job(name, **kwargs)
    return {**job, "entry": "held_digits:train", "kwargs": {**job["kwargs"], "hold_file": str(hold)}}


def trains_at_its_size(run: LocalRun, job: str) -> bool:
    """Whether the job's ranks have reported since its last start or resize (a ``job.cost``): a node taken while the
    new ranks still form the group is a stop and a start, not the shrink a test of training ranks means to see."""
    changes = [e["seq"] for e in run.events() if e.get("job") == job and e["kind"] in ("job.started", "job.resized")]
    costs = [e["seq"] for e in events_of(run, "job.cost", job)]
    return bool(changes and costs and costs[-1] > changes[-1])


def _pilot_of(run: LocalRun, node: str) -> dict:
    return next(p for p in run.client.snapshot()["pilots"] if p["state"] == "running" and node in p["nodes"])


def test_shrink_keeps_training_and_grow_returns(local, tmp_path):
    run = local()
    run.start()
    hold = tmp_path / "hold"
    ids = [run.client.submit(held_job(f"j{i}", hold, epochs=30)) for i in range(2)]
    steps: dict[str, list] = {j: [] for j in ids}

    def record() -> None:
        for j in ids:
            step = committed_step(run.run_dir, j)
            if step is not None:
                steps[j].append(step)

    # The batch system takes a node back (SIGTERM to its pilot, as Slurm and PBS preempt) once both jobs train: how
    # long their ranks take to start on a busy machine does not decide what is tested.
    run.wait_for(lambda: all(committed_step(run.run_dir, j) for j in ids) and all(len(run.client.job(j)["nodes"]) == 2 and trains_at_its_size(run, j) for j in ids),
                 RANKS_S, "both jobs training on two nodes")  # fmt: skip
    victim = ids[0]
    node = run.client.job(victim)["nodes"][-1]
    os.kill(_pilot_of(run, node)["pid"], signal.SIGTERM)

    def grown_back() -> list:
        record()
        shrink = [e for e in run.events("job.resized") if f"{node} leaving" in e["data"].get("cause", "")]
        rejoined = [e for e in run.events("node.joined") if shrink and e["node"] == node and e["seq"] > shrink[0]["seq"]]
        grew = [e for e in run.events("job.resized") if rejoined and e["seq"] > rejoined[0]["seq"] and e["data"]["after"] > e["data"]["before"]]
        return grew and [shrink[0], rejoined[0], grew[0]]

    shrink, rejoined, grew = run.wait_for(grown_back, RANKS_S, f"{node} to leave, be given back and be taken again")
    hold.unlink()

    def done() -> bool:
        record()
        return all(run.client.job(j)["status"] in ("finished", "failed") for j in ids)

    run.wait_for(done, RANKS_S, "both jobs to finish")
    assert shrink["job"] == victim
    assert shrink["data"]["after"] == shrink["data"]["before"] - 1
    assert len(events_of(run, "job.started", victim)) == 1, "the shrunk job started over"
    assert not events_of(run, "job.crashed")
    for j in ids:
        assert steps[j] == sorted(steps[j]), f"committed step of {j} went backwards"
        job = run.client.job(j)
        assert job["status"] == "finished", job["error"]
        assert job["result"]["val_accuracy"] > 0.8


def test_a_node_lost_while_the_ranks_form_the_group_restarts_the_job_on_the_rest(local):
    """Ranks in hvd.init wait for every peer's address: a peer ended there would leave the other waiting out Gloo's
    timeout and failing. Lost before its ranks have trained, the job starts again on the node it keeps."""
    run = local()
    run.start()
    job = run.client.submit(digits_job("forming", epochs=8))
    # on two nodes (a pilot that registered late is taken in a second decision), its ranks still importing torch
    nodes = run.wait_for(lambda: len(run.client.job(job)["nodes"]) == 2 and run.client.job(job)["nodes"], 60, "the job on two nodes")
    assert not events_of(run, "job.cost", job)
    node = nodes[-1]
    os.kill(_pilot_of(run, node)["pid"], signal.SIGTERM)
    stopped = run.wait_for(lambda: events_of(run, "job.stopped", job), 30, "the job to be stopped")
    assert stopped[0]["data"]["cause"] == f"{node} leaving while its ranks were forming the group"
    again = run.wait_for(lambda: events_of(run, "job.started", job)[1:], 60, "the job to start again")  # the next decision's
    assert again[0]["seq"] > stopped[0]["seq"] and node not in again[0]["data"]["nodes"]
    done = run.client.wait([job], timeout_s=RANKS_S)
    assert done[job]["status"] == "finished", done[job]["error"]
    assert not events_of(run, "job.crashed", job) and not events_of(run, "rank.lost", job)


def test_controller_crash_resumes_from_durable_commit(local):
    run = local()
    run.start()
    a = run.client.submit(digits_job("durable", epochs=14))
    b = run.client.submit(digits_job("other", epochs=8))
    run.wait_for(lambda: (committed_step(run.run_dir, a) or (0, 0))[0] >= 3, RANKS_S, "three epochs committed")
    before = committed_step(run.run_dir, a)
    run.kill(signal.SIGKILL)
    run.wait_for(lambda: not run.leftover_processes(), 15, "no rank or horovodrun of the dead controller")
    run.start()
    seen = []

    def watch() -> bool:
        step = committed_step(run.run_dir, a)
        if step is not None:
            seen.append(step)
        return run.client.job(a)["status"] in ("finished", "failed") and run.client.job(b)["status"] in ("finished", "failed")

    run.wait_for(watch, RANKS_S, "both jobs to finish after the restart")
    assert min(seen) >= before, f"resumed at {min(seen)}, before the crash it had committed {before}"
    job = run.client.job(a)
    assert job["status"] == "finished", job["error"]
    assert job["result"]["restored"] is True
    assert run.client.job(b)["status"] == "finished"


def test_a_raising_function_fails_its_job_only(local, tmp_path):
    run = local()
    run.start()
    hold = tmp_path / "hold"
    bad = run.client.submit(digits_job("bad", fail_at_epoch=2))
    good = run.client.submit(held_job("good", hold, hi=4, epochs=14))

    def grew_after_the_failure() -> list:
        failed = events_of(run, "job.failed", bad)
        return failed and [e for e in events_of(run, "job.resized", good) if e["seq"] > failed[0]["seq"] and e["data"]["after"] > e["data"]["before"]]

    run.wait_for(grew_after_the_failure, RANKS_S, "the failed job's nodes to go to the other job")
    hold.unlink()
    done = run.client.wait([bad, good], timeout_s=RANKS_S)
    assert done[bad]["status"] == "failed"
    assert "training diverged at epoch 2" in done[bad]["error"]
    assert "Traceback" in done[bad]["error"] and "digits.py" in done[bad]["error"]
    assert done[good]["status"] == "finished", done[good]["error"]


def test_a_killed_rank_costs_one_node_not_the_job(local, tmp_path):
    run = local()
    run.start()
    hold = tmp_path / "hold"
    job = run.client.submit(held_job("sturdy", hold, hi=3, epochs=30))
    def three_training() -> bool:
        state = run.client.job(job)
        assert state["status"] not in ("finished", "failed", "cancelled"), f"the held job ended before its ranks were killed: {state}"
        return (committed_step(run.run_dir, job) or (0, 0))[0] >= 1 and len(state["nodes"]) == 3

    run.wait_for(three_training, RANKS_S, "three ranks training")
    host = run.client.job(job)["nodes"][1]
    victim = _rank_pid(run, job, host)
    os.kill(victim, signal.SIGKILL)
    run.wait_for(lambda: events_of(run, "rank.lost", job), 60, "the lost rank to be noticed")
    after = committed_step(run.run_dir, job)
    run.wait_for(lambda: (committed_step(run.run_dir, job) or (0, 0)) > after, RANKS_S, "the job to commit again after the loss")
    hold.unlink()
    done = run.client.wait([job], timeout_s=RANKS_S)
    assert done[job]["status"] == "finished", done[job]["error"]
    assert not events_of(run, "job.crashed", job)
    assert len(events_of(run, "job.started", job)) == 1


def _rank_pid(run: LocalRun, job: str, host: str) -> int:
    for pid in run.leftover_processes():
        try:
            env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
            cmd = open(f"/proc/{pid}/cmdline", "rb").read()
        except OSError:
            continue
        if f"PILOTFILL_HOST={host}".encode() in env and f"PILOTFILL_JOB_ID={job}".encode() in env and b"pilotfill.elastic.rank" in cmd and b"bash" not in cmd:
            return pid
    raise AssertionError(f"no rank of {job} on {host}")


def test_the_ends_of_ranks_a_silent_restart_stopped_are_not_the_new_starts_crashes(local, tmp_path):
    """A stuck job is stopped and started again on the same nodes: its old ranks end (SIGTERM) after the new start lists
    those hosts. Counted as the new start's crashes, three of them failed the job (CI, 2026-12-07)."""
    run = local(runtime_options="silent_s = 15.0")
    run.start()
    stall = tmp_path / "stall"
    job = run.client.submit(held_job("stuck", tmp_path / "hold", hi=2, epochs=6, stall_file=str(stall)))
    run.wait_for(lambda: (committed_step(run.run_dir, job) or (0, 0))[0] >= 1 and len(run.client.job(job)["nodes"]) == 2, RANKS_S,
                 "two ranks training")  # fmt: skip
    stall.touch()
    stopped = run.wait_for(lambda: events_of(run, "job.stopped", job), RANKS_S, "the silent job to be stopped")
    assert stopped[0]["data"]["cause"] == "its ranks were silent for 15 s"
    run.wait_for(lambda: len(events_of(run, "job.started", job)) == 2, 60, "the job to start again")
    stall.unlink()
    (tmp_path / "hold").unlink()
    done = run.client.wait([job], timeout_s=RANKS_S)
    assert done[job]["status"] == "finished", done[job]["error"]
    assert not events_of(run, "rank.lost", job) and not events_of(run, "node.dropped")
