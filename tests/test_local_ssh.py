"""The local cluster's ssh stand-in for horovodrun (pilotfill.elastic.local_ssh): which rank ends it records."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from waiting import wait_for

pytestmark = pytest.mark.local


def _start(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    (tmp_path / "discovery").mkdir(exist_ok=True)
    (tmp_path / "discovery" / "j1.hosts").write_text("pf-node-9:1\n")
    exits = tmp_path / "discovery" / "j1.abc.exits"
    env = {**os.environ, "PILOTFILL_RUN_DIR": str(tmp_path), "PILOTFILL_JOB_ID": "j1", "PILOTFILL_EXITS_FILE": str(exits)}
    pid_file = tmp_path / "rank.pid"
    ssh = subprocess.Popen([sys.executable, "-m", "pilotfill.elastic.local_ssh", "-o", "StrictHostKeyChecking=no", "pf-node-9",
                            f"echo $$ > {pid_file}; exec sleep 600"], env=env)  # fmt: skip
    wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), 60, "the rank to start")
    return ssh, exits


def test_a_rank_killed_on_its_own_is_recorded_for_its_start(tmp_path):
    ssh, exits = _start(tmp_path)
    os.kill(int((tmp_path / "rank.pid").read_text()), signal.SIGKILL)  # a rank dies by itself (the OOM killer, a crash)
    assert ssh.wait(timeout=60) != 0
    assert exits.read_text().split() == ["pf-node-9", "-9"]


def test_a_rank_horovodrun_ends_is_not_a_crash(tmp_path):
    """horovodrun ends a worker it gives up (a host it blacklisted, its own shutdown) through this process: three such
    ends at once were counted as the app's crashes and failed a job under churn (2026-12-07)."""
    ssh, exits = _start(tmp_path)
    ssh.send_signal(signal.SIGTERM)
    assert ssh.wait(timeout=60) != 0
    assert not exits.exists()
