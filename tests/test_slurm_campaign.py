"""A whole campaign on the real Slurm (slurmctld + slurmd from Debian's packages, started by the `slurm` fixture):
real controller, real pilot agents inside Slurm jobs, real rank processes (``runtime.kind = "processes"``), a
main-workload job preempting pilots mid-run. Afterwards no pilot is left in squeue and no pilot's start was lost.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from waiting import wait_for, wait_for_exit

from pilotfill.journal import Journal

pytestmark = pytest.mark.site

APPS = 3

CONFIG = """scheduler = "slurm"
[slurm]
partition = "scavenger"
min_nodes = 1
max_nodes = 2
time_min = "00:05:00"
time_max = "00:30:00"
poll_s = 0.5
command_timeout_s = 20.0
[pilots]
heartbeat_s = 0.5
heartbeat_deadline_s = 15.0
grace_s = 5.0
nodes_per_pilot = 2
[controller]
tick_s = 0.1
[runtime]
kind = "processes"
"""

CAMPAIGN = f"""
import pilotfill


@pilotfill.elastic_app(min_nodes=1, max_nodes=2, scale_up_cost_s=1.0, scale_down_cost_s=1.0)
def train(i):
    import os, time
    import pilotfill
    with open(os.environ["MARKS"], "a") as f:
        f.write(f"start {{i}} {{os.environ.get('PILOTFILL_HOST')}} {{time.time()}}\\n")
    for _ in range(30):
        time.sleep(0.5)
        pilotfill.report(samples=10)
    return i * 10

print("results", [f.result() for f in [train(i) for i in range({APPS})]])
"""


def test_campaign_leaves_no_pilot_and_loses_no_start(slurm, tmp_path):
    config, campaign, marks, run_dir = tmp_path / "slurm.toml", tmp_path / "campaign.py", tmp_path / "marks", tmp_path / "run"
    config.write_text(CONFIG)
    campaign.write_text(CAMPAIGN)
    out = tmp_path / "campaign.out"
    proc = subprocess.Popen([sys.executable, "-m", "pilotfill", "run", str(campaign), "--config", str(config), "--run-dir", str(run_dir)],
                            cwd=tmp_path, env={**os.environ, "MARKS": str(marks)}, stdout=open(out, "wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip
    try:
        wait_for(lambda: marks.exists() and len(marks.read_text().splitlines()) >= 2, 180, "training to start on pilots")
        time.sleep(2.0)
        slurm.command("sbatch", "--parsable", "-p", "main", "-N", "2", "-J", "mainjob", "-o", "/dev/null", "--wrap", "sleep 5")
        wait_for_exit(proc, 600, "the campaign to end after the main job", out, run_dir)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = out.read_text()
    assert proc.returncode == 0, text[-4000:]
    assert f"results {[i * 10 for i in range(APPS)]}" in text
    wait_for(lambda: not slurm.command("squeue", "-h", "-p", "scavenger", "-o", "%i %T").stdout.strip(), 90, "no pilot left in squeue")

    state = Journal(run_dir, readonly=True)
    try:
        submitted = {e["pilot"]: e["data"]["scheduler_id"] for e in state.events("pilot.submitted")}
        started = {e["pilot"]: e["data"]["scheduler_id"] for e in state.events("pilot.started")}
        joined = {e["pilot"] for e in state.events("node.joined")}
        ended = {e["pilot"] for e in state.events("pilot.ended")}
        lost = state.events("pilot.lost")
        pilots = state.pilots()
    finally:
        state.close()
    assert submitted and joined
    assert joined <= set(started), f"pilots whose agents registered but whose start the adapter never reported: {joined - set(started)}"
    assert all(started[p] == submitted[p] for p in started if p in submitted), "the controller knows each pilot's Slurm job id"
    assert all(str(p["scheduler_id"]).isdigit() for p in pilots)
    assert set(started) <= ended | {p["id"] for p in pilots if p["state"] == "ended"}, "every pilot that ran was seen to end"
    assert not lost, f"pilots lost: {lost}"
