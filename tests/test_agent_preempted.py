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
