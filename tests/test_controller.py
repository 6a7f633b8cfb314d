"""The controller end to end: real controller, pilot agent and rank processes on the local cluster."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
import zmq
from localrun import LocalRun, synthetic_job

from pilotfill import procs
from pilotfill.security import seal, session_key
from pilotfill.transport import dealer

pytestmark = pytest.mark.local


def progress_watch(run: LocalRun, job_ids: list[str]):
    """Sample each job's committed progress; returns the list of samples per job."""
    seen: dict[str, list[float]] = {j: [] for j in job_ids}

    def sample() -> bool:
        for j in job_ids:
            seen[j].append(run.client.job(j)["progress"])
        return all(run.client.job(j)["status"] in ("finished", "failed") for j in job_ids)

    return seen, sample


def test_jobs_shrink_grow_and_finish_as_the_main_workload_moves(local):
    run = local(script=[(8.0, "pf-node-1", "busy"), (16.0, "pf-node-1", "idle")])
    run.start()
    # Enough work that a job still runs when the node comes back at 16 s (the two run one after the other on all
    # four nodes: about 50 s of work), however early the first one started.
    ids = [run.client.submit(synthetic_job(f"job{i}", total=4000)) for i in range(2)]
    seen, sample = progress_watch(run, ids)
    run.wait_for(sample, 180, "both jobs to finish")
    for j in ids:
        assert seen[j] == sorted(seen[j]), "progress went backwards"
        job = run.client.job(j)
        assert job["status"] == "finished"
        assert job["result"]["samples"] >= 4000
        assert job["progress"] >= 4000
    events = run.events()
    kinds = [(e["kind"], e["job"], e["node"], e["data"]) for e in events]
    assert {j for k, j, _, _ in kinds if k == "job.started"} == set(ids)
    leave = next(i for i, (k, _, n, _) in enumerate(kinds) if k == "node.leaving" and n == "pf-node-1")
    shrink = [d for k, _, _, d in kinds if k == "job.resized" and "pf-node-1" in d.get("cause", "")]
    assert shrink and shrink[0]["after"] < shrink[0]["before"]
    rejoin = next(i for i, (k, _, n, _) in enumerate(kinds) if i > leave and k == "node.joined" and n == "pf-node-1")
    assert any(k == "job.resized" and d["after"] > d["before"] for k, _, _, d in kinds[rejoin:])
    assert {j for k, j, _, _ in kinds if k == "job.finished"} == set(ids)
    # After both finish, every node is given back.
    run.wait_for(lambda: all(n["state"] == "gone" for n in run.client.snapshot()["nodes"]), 15, "nodes given back")


def test_controller_killed_and_restarted_carries_on(local):
    run = local()
    run.start()
    short = run.client.submit(synthetic_job("short", total=300, hi=2))
    long = run.client.submit(synthetic_job("long", total=2400, hi=2))
    run.wait_for(lambda: run.client.job(short)["status"] == "finished" and run.client.job(long)["progress"] > 600, 60, "short done, long under way")
    s = run.state()
    before = s.job(long).committed  # what a stop (here: the controller killed) falls back to
    launches_short = s.job(short).launches
    children = [(p["pid"], p["start_ticks"], p["kind"]) for p in s.processes()]
    s.close()
    assert any(kind == "pilot" for *_, kind in children)  # the local cluster's agents; ranks run under them, on their nodes
    assert _rank_on(run, "pf-node-0") or _rank_on(run, "pf-node-1") or _rank_on(run, "pf-node-2") or _rank_on(run, "pf-node-3")

    run.kill(signal.SIGKILL)
    # Nothing the dead controller started survives it.
    run.wait_for(lambda: not run.leftover_processes(), 10, "children of the dead controller to die")
    for pid, ticks, _ in children:
        assert not procs.alive(pid, ticks)  # (a recycled pid is someone else: compared by start time)

    run.start()
    done = run.client.wait([short, long], timeout_s=90)
    assert done[long]["status"] == "finished"
    assert done[long]["progress"] >= 2400
    s = run.state()
    assert s.job(short).launches == launches_short  # a finished job is not rerun
    events = s.events()
    s.close()
    restart = max(e["seq"] for e in events if e["kind"] == "controller.started")
    recovered = next(e for e in events if e["kind"] == "controller.recovered")
    assert recovered["data"]["requeued"] == [long]
    assert all(e["job"] != short for e in events if e["seq"] > restart and e["kind"] in ("job.started", "job.finished"))
    # The restarted job resumed from the progress committed before the kill, not from zero.
    restarted = [e for e in events if e["seq"] > restart and e["kind"] == "job.started" and e["job"] == long]
    assert restarted and restarted[0]["data"]["progress"] >= before


def test_killed_pilot_is_lost_after_heartbeat_deadline_and_terminated_pilot_leaves_in_grace(local):
    run = local(deadline=3.0, grace=4.0)
    run.start()
    job = run.client.submit(synthetic_job("wide", total=100_000))
    run.wait_for(lambda: len(run.client.job(job)["nodes"]) == 4, 30, "job on all four nodes")
    pilots = {p["nodes"][0]: p for p in run.client.snapshot()["pilots"] if p["state"] == "running"}

    # SIGKILL: no goodbye; the missed heartbeats tell.
    victim = pilots["pf-node-3"]
    killed_at = time.time()
    os.kill(victim["pid"], signal.SIGKILL)
    lost = run.wait_for(lambda: [e for e in run.events("node.lost") if e["node"] == "pf-node-3"], 20, "node lost")
    assert lost[0]["time"] - killed_at >= 3.0 - 0.6  # not before the deadline (heartbeat period 0.5 s)
    shrunk = [e for e in run.events("job.resized") if "pf-node-3 gone" in e["data"].get("cause", "")]
    assert shrunk and shrunk[0]["data"]["after"] == 3 and shrunk[0]["seq"] > lost[0]["seq"] - 3

    # SIGTERM (preemption): the node leaves and its rank is gone inside the grace period.
    victim = pilots["pf-node-2"]
    termed_at = time.time()
    os.kill(victim["pid"], signal.SIGTERM)
    leaving = run.wait_for(lambda: [e for e in run.events("node.leaving") if e["node"] == "pf-node-2"], 5, "node leaving")
    assert leaving[0]["time"] - termed_at < 2.0
    run.wait_for(lambda: not _rank_on(run, "pf-node-2"), 4.0, "rank on pf-node-2 to exit")
    assert time.time() - termed_at < 4.0
    shrunk = [e for e in run.events("job.resized") if "pf-node-2 leaving" in e["data"].get("cause", "")]
    assert shrunk and shrunk[0]["data"]["after"] < shrunk[0]["data"]["before"]
    assert run.client.job(job)["status"] == "running"
    run.client.cancel(job)


def _rank_on(run: LocalRun, host: str) -> bool:
    needle = f"PILOTFILL_HOST={host}".encode()
    for pid in run.leftover_processes():
        try:
            if needle in open(f"/proc/{pid}/environ", "rb").read().split(b"\0"):
                return True
        except OSError:
            pass
    return False


def test_bad_messages_are_dropped_and_the_run_goes_on(local):
    run = local()
    run.start()
    info = json.loads((run.run_dir / "controller.json").read_text())
    endpoint = info["endpoint"]
    secret = (run.run_dir / "secret.key").read_bytes().strip()
    key = session_key(secret, info["incarnation"])
    sock = dealer(secret, endpoint)
    submit = json.dumps({"type": "job.submit", "spec": synthetic_job("evil", total=10)}).encode()
    sock.send_multipart([b"\x00garbage", b"\xff" * 7])
    sock.send_multipart(seal(b"0" * 64, submit))  # the wrong key
    valid = seal(key, json.dumps({"type": "job.submit", "spec": synthetic_job("once", total=200, hi=1)}).encode())
    sock.send_multipart(valid)
    assert sock.poll(5000), "no reply to the valid message"
    sock.recv_multipart()
    sock.send_multipart(valid)  # a replayed copy
    assert not sock.poll(1500), "the replay was answered"
    sock.close(0)
    jobs = run.client.snapshot()["jobs"]
    assert [j["name"] for j in jobs] == ["once"]
    run.client.wait([jobs[0]["id"]], timeout_s=60)
    assert "failed authentication" in run.logs[-1].read_text()
    assert oct((run.run_dir / "secret.key").stat().st_mode & 0o777) == "0o600"


def test_a_job_without_a_curve_is_probed_then_grown_from_its_own_reports(local):
    from pilotfill.transport import RequestRefused

    run = local()
    run.start()
    spec = synthetic_job("cold", total=1200, hi=4)
    del spec["curve"]
    with pytest.raises(RequestRefused, match="min_nodes"):
        run.client.submit({**spec, "min_nodes": 5})  # impossible: refused, named, nothing queued
    job = run.client.submit(spec)
    done = run.client.wait([job], timeout_s=60)
    assert done[job]["status"] == "finished"
    started = run.events("job.started")
    assert len(started[0]["data"]["nodes"]) == 1  # unknown curve: start small and measure
    estimates = [e for e in run.events("job.estimate") if e["job"] == job]
    assert estimates and estimates[0]["data"]["nodes"] == 1
    assert estimates[0]["data"]["samples_per_s"] == pytest.approx(40, rel=0.3)
    grown = [e for e in run.events("job.resized") if e["job"] == job and e["data"]["after"] > e["data"]["before"]]
    assert grown, "the measured job was never grown"
    assert [j["name"] for j in run.client.snapshot()["jobs"]] == ["cold"]
