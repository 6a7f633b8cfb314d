"""What a waiting campaign says (issue 54, items 4, 7 and 9): every end is seen, and a wait is not a failure.

A campaign that trains nothing says why on its progress line (``controller/notices.py``): the batch system does
not answer, there is no idle node, or a job keeps losing its work to its pilots' walltime — and a job that can never
fit between two commits in a pilot's life fails, saying so, instead of being restarted for ever. Real ``pilotfill
run`` campaigns on the embedded local cluster (and Slurm's commands replaced by ones that fail).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from waiting import wait_for

from pilotfill.journal import Journal

pytestmark = pytest.mark.local


class Campaign:
    """``pilotfill run`` in the background, its terminal output read as it comes (not a terminal: plain lines)."""

    def __init__(self, campaign: Path, *args: str, env: dict | None = None):
        self.out = campaign.parent / "campaign.err"
        self.proc = subprocess.Popen([sys.executable, "-m", "pilotfill", "run", str(campaign), *args], cwd=campaign.parent, stdout=subprocess.PIPE,
                                     stderr=open(self.out, "w"), text=True, env={**os.environ, **(env or {})}, start_new_session=True)  # fmt: skip

    def said(self) -> str:
        return " ".join(self.out.read_text().split())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=300)


def test_a_job_that_outlives_every_pilot_without_committing_fails_saying_why(tmp_path):
    (tmp_path / "c.toml").write_text(
        """scheduler = "local"
[local]
nodes = 1
workload = "none"
pilot_walltime_s = 30
[pilots]
heartbeat_s = 0.5
heartbeat_deadline_s = 10.0
grace_s = 2.0
[controller]
tick_s = 0.1
[runtime]
kind = "processes"
"""
    )
    campaign = tmp_path / "long.py"
    campaign.write_text(
        """
import pilotfill

@pilotfill.elastic_app(min_nodes=1, max_nodes=1)
def work():
    import time
    time.sleep(120)   # longer than any pilot lives, and never a commit
    return 1

print(work().result())
"""
    )
    run = Campaign(campaign, "--config", str(tmp_path / "c.toml"), "--run-dir", str(tmp_path / "run"))
    try:
        wait_for(lambda: "lost its work to its pilots' walltime 1 time with nothing committed" in run.said(), 240, "the first lost run said",
                 detail=run.said)  # fmt: skip
        run.proc.wait(timeout=400)  # it ends: the third such run fails the job
    finally:
        run.stop()
    said = run.said()
    assert run.proc.returncode == 1, said[-3000:]
    assert "the job lost its work to its pilots' walltime 3 times in a row with nothing committed in between" in said, said[-3000:]
    state = Journal(tmp_path / "run", readonly=True)
    try:
        assert [e["data"]["runs"] for e in state.events("job.outlived")] == [1, 2, 3]
        assert len(state.events("job.started")) == 3
    finally:
        state.close()


def test_an_unreachable_batch_system_is_said_on_the_progress_line(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    for command in ("sinfo", "sbatch", "squeue", "scontrol", "scancel", "sacct"):
        path = fake / command
        path.write_text(f'#!/bin/sh\necho "{command}: error: Unable to contact slurm controller (connect failure)" >&2\nexit 1\n')
        path.chmod(0o755)
    campaign = tmp_path / "c.py"
    campaign.write_text(
        """
import pilotfill

@pilotfill.elastic_app(min_nodes=1, max_nodes=1, runtime="processes")
def work():
    return 1

print(work().result())
"""
    )
    run = Campaign(campaign, "--config", "perlmutter", env={"PATH": f"{fake}:{os.environ['PATH']}"})
    try:
        wait_for(lambda: "Slurm did not answer" in run.said(), 240, "the batch system's silence said", detail=run.said)
    finally:
        run.stop()
    said = run.said()
    assert "Unable to contact slurm controller (connect failure)" in said, said[-3000:]


def test_a_machine_the_main_workload_holds_whole_reads_as_waiting_not_failing(tmp_path):
    (tmp_path / "c.toml").write_text(
        """scheduler = "local"
[local]
nodes = 2
workload = "script"
script = [
  { at = 0.0, node = "pf-node-0", state = "busy" },
  { at = 0.0, node = "pf-node-1", state = "busy" },
  { at = 40.0, node = "pf-node-1", state = "idle" },
]
[pilots]
heartbeat_s = 0.5
heartbeat_deadline_s = 5.0
grace_s = 2.0
[controller]
tick_s = 0.1
[runtime]
kind = "processes"
"""
    )
    campaign = tmp_path / "c.py"
    campaign.write_text(
        """
import pilotfill

@pilotfill.elastic_app(min_nodes=1, max_nodes=1)
def work():
    return 42

print("result", work().result())
"""
    )
    run = Campaign(campaign, "--config", str(tmp_path / "c.toml"))
    started = time.monotonic()
    try:
        wait_for(lambda: "waiting for an idle node" in run.said(), 120, "the wait said", detail=run.said)
        out, _ = run.proc.communicate(timeout=300)  # the node comes back at 40 s: it trains then
    finally:
        run.stop()
    said = run.said()
    assert run.proc.returncode == 0 and "result 42" in out, said[-3000:]
    assert "failed" not in said.split("campaign c.py")[0], said  # nothing failed before the summary
    assert time.monotonic() - started >= 35
