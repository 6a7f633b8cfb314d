"""Ctrl-C is a stop, on the local cluster and on a real Slurm (the PBS case is in test_pbs_campaign.py).

Recheck (b) of shared/data/openpbs/real-23.06.06-recheck (b-after-sigint-every-0.5s.csv,
b-second-run-strace-controller-killed.txt): SIGINT to `pilotfill run` SIGKILLed the controller 0.26 s later
(``PR_SET_PDEATHSIG``), so nothing recorded the stop and no pilot was deleted; the pilots and their agents ran on
for ten minutes. The same code ran every batch system. Now SIGINT does what the end of a campaign does: the
controller tells every rank to leave (SIGTERM, a commit) while their agents are still heard, then deletes every
pilot (``scancel`` here) and records ``controller.stopped``; `pilotfill run` exits 130 and nothing of the run is left.
"""

from __future__ import annotations

import pytest
from interrupting import ctrl_c, journal, start_run, wait_until_nothing_left
from waiting import wait_for

pytestmark = pytest.mark.local

CAMPAIGN = """
import pilotfill


@pilotfill.elastic_app(min_nodes=1, max_nodes=2, scale_up_cost_s=1.0, scale_down_cost_s=1.0)
def train(i):
    import os, time
    import pilotfill
    with open(os.environ["MARKS"], "a") as f:
        f.write(f"start {i} {os.environ.get('PILOTFILL_HOST')}\\n")
    while True:
        time.sleep(0.5)
        pilotfill.report(samples=10)

print("results", [f.result() for f in [train(i) for i in range(2)]])
"""

LOCAL = """scheduler = "local"
[local]
nodes = 2
workload = "none"
[pilots]
heartbeat_s = 0.5
heartbeat_deadline_s = 5.0
grace_s = 3.0
[controller]
tick_s = 0.1
[runtime]
kind = "processes"
"""

SLURM = """scheduler = "slurm"
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


def interrupted_campaign(tmp_path, config_text: str):
    """A campaign that trains until stopped: Ctrl-C once two ranks run. Its run directory and output."""
    config, campaign, marks, run_dir, out = tmp_path / "site.toml", tmp_path / "campaign.py", tmp_path / "marks", tmp_path / "run", tmp_path / "out"
    config.write_text(config_text)
    campaign.write_text(CAMPAIGN)
    proc = start_run(campaign, config, run_dir, out, env={"MARKS": str(marks)})
    try:
        wait_for(lambda: marks.exists() and len(marks.read_text().splitlines()) >= 2, 180, "training on the pilots", detail=lambda: out.read_text()[-2000:])
    except BaseException:
        ctrl_c(proc)
        raise
    code = ctrl_c(proc)
    text = out.read_text()
    assert journal(run_dir, "controller.stopped"), "the stop is recorded"
    assert code == 130 and "interrupted (SIGINT)" in text, text[-3000:]
    # The ranks were told to leave (SIGTERM: a commit) while their agents were still heard, and had gone before the
    # controller ended the pilots — not killed with them, nor waited for by a controller nobody answered.
    stopping, stopped = journal(run_dir, "controller.stopping"), journal(run_dir, "controller.stopped")
    assert stopping and stopping[-1]["data"]["ranks"] >= 2, stopping
    assert stopped[-1]["data"]["ranks_not_gone"] == 0, stopped[-1]
    return run_dir, text


def test_ctrl_c_on_the_local_cluster_records_the_stop_and_leaves_nothing(tmp_path):
    run_dir, _ = interrupted_campaign(tmp_path, LOCAL)
    wait_until_nothing_left(run_dir, grace_s=3.0)


@pytest.mark.site
def test_ctrl_c_on_slurm_cancels_every_pilot_and_leaves_nothing(slurm, tmp_path):
    run_dir, _ = interrupted_campaign(tmp_path, SLURM)
    assert journal(run_dir, "pilot.submitted")
    # Before, the pilots stayed in squeue until their agents gave up on the controller, 600 s later.
    wait_for(lambda: not slurm.command("squeue", "-h", "-p", "scavenger", "-o", "%i %T").stdout.strip(), 90, "no pilot left in squeue")
    wait_until_nothing_left(run_dir, grace_s=5.0)
