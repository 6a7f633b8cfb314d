"""A pilot's agent ends its session within the grace whatever phase SIGTERM finds it in (issue 58).

On a real OpenPBS, in a preemption storm, PBS re-ran a requeued pilot and preempted it again within the same second:
that run's processes stayed, MOM waited its kill delay ("task 00000001 force exited", ~11 s) and main jobs waited
17–25 s. An agent that has just started asks the batch system for its nodes (``qstat``), and a server busy with the
preemption answers slowly; SIGTERM then killed the agent, not the ``qstat`` it waited on, which stayed in the job's
session. Here the agent runs as a batch job's top process does (a session of its own), with a ``qstat`` that hangs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from waiting import wait_for

from pilotfill import procs
from pilotfill.security import create_secret

pytestmark = pytest.mark.local

GRACE_S = 3.0


def _session_left(sid: int) -> list[int]:
    return [p for p in procs.session_members(sid) if procs.alive(p)]


def _agent(tmp_path: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    if not (run_dir / "secret.key").exists():
        create_secret(run_dir)
    argv = [sys.executable, "-m", "pilotfill.pilots.agent", "--run-dir", str(run_dir), "--pilot", "p1", "--grace-s", str(GRACE_S),
            "--heartbeat-s", "1", *extra]  # fmt: skip
    log = open(tmp_path / "agent.log", "ab")
    return subprocess.Popen(argv, env={**os.environ, **(env or {})}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def test_sigterm_while_its_qstat_hangs_ends_the_session_within_the_grace(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    started = tmp_path / "qstat-started"
    qstat = bin_dir / "qstat"
    qstat.write_text(f"#!/bin/sh\ntouch {started}\nexec sleep 60\n")  # a server busy with the preemption: no answer
    qstat.chmod(0o755)
    agent = _agent(tmp_path, "--scheduler", "pbs", "--bin-dir", str(bin_dir), env={"PBS_JOBID": "7.pfsrv"})
    try:
        wait_for(started.exists, 60, "the agent to ask qstat for its nodes")
        sent = time.monotonic()
        agent.send_signal(signal.SIGTERM)
        agent.wait(GRACE_S + 5)
        took = time.monotonic() - sent
        wait_for(lambda: not _session_left(agent.pid), GRACE_S, "nothing of the agent's session left")
        assert took <= GRACE_S, f"the agent took {took:.1f} s to go"
        assert agent.returncode == 143, (tmp_path / "agent.log").read_text()
    finally:
        procs.kill_group(agent.pid)


def test_sigterm_while_it_registers_with_a_controller_that_does_not_answer(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    create_secret(run_dir)
    (run_dir / "controller.json").write_text(json.dumps({"endpoint": "tcp://127.0.0.1:9", "incarnation": 1, "pid": 1}))
    agent = _agent(tmp_path, "--nodes", "pf-node-0", "--scheduler-id", "local.1")
    try:
        time.sleep(2.0)  # importing, building the agent or asking to register: whichever phase it is in, the same must hold
        sent = time.monotonic()
        agent.send_signal(signal.SIGTERM)
        agent.wait(GRACE_S + 5)
        assert time.monotonic() - sent <= GRACE_S + 1.0
        wait_for(lambda: not _session_left(agent.pid), GRACE_S, "nothing of the agent's session left")
    finally:
        procs.kill_group(agent.pid)


def test_a_rank_signalled_with_its_pilot_is_the_pilots_preemption_not_the_apps_end(tmp_path, monkeypatch):
    """Seen on the real Slurm under load: preempting a pilot, slurmstepd SIGTERMed a rank's step a moment before the
    pilot's agent heard its own SIGTERM; the agent told the rank's end first, the controller counted it as the app's
    own end, and the third such preemption failed the job ("killed by SIGTERM … 3 times in a row"). Here the rank is
    SIGTERMed, then its pilot's agent 1.5 s later (more than a heartbeat): the job runs again, nothing counted."""
    from localrun import LocalRun

    here = Path(__file__).resolve().parent
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(here), os.environ.get("PYTHONPATH", "")]))
    run = LocalRun(tmp_path, nodes=1, runtime="processes")
    run.start(timeout_s=60)
    out = tmp_path / "ranks.jsonl"

    def ranks() -> list[dict]:
        return [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []

    try:
        job = run.client.submit({"name": "held", "entry": "rank_probe:probe", "kwargs": {"out": str(out), "runtime": "processes", "hold_s": 600.0},
                                 "min_nodes": 1, "max_nodes": 1})  # fmt: skip
        run.wait_for(lambda: len(ranks()) == 1, 120, "the rank to start")
        rank = ranks()[0]["pid"]
        agent = int(Path(f"/proc/{rank}/stat").read_text().rsplit(")", 1)[1].split()[1])  # its parent: the pilot's agent
        assert b"pilotfill.pilots.agent" in Path(f"/proc/{agent}/cmdline").read_bytes()
        os.kill(rank, signal.SIGTERM)  # the batch system's signal reaches the rank first ...
        time.sleep(1.5)
        os.kill(agent, signal.SIGTERM)  # ... and the pilot's agent a heartbeat and more later
        run.wait_for(lambda: len(ranks()) >= 2, 180, "the job to run again on a new pilot")
        lost = [e for e in run.events("rank.lost") if e.get("job") == job]
        assert not lost, f"the preemption was counted as the app's own end: {lost}"
    finally:
        run.stop()
