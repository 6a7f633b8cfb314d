"""A real Slurm (slurmctld and four slurmd from Debian's packages, started by the `slurm` fixture) with two kinds of
node told apart by their features, as Perlmutter's ``-C gpu&hbm80g``: the adapter counts idle nodes per type, pilots
ask for one type each (``--constraint``), and a campaign's jobs land on the type that suits them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from waiting import wait_for_exit

from pilotfill.config import NodeTypeConfig, PilotConfig
from pilotfill.schedulers.slurm import SlurmConfig, SlurmScheduler
from pilotfill.journal import Journal

pytestmark = pytest.mark.site

FEATURES = {"node1": "gpu,v100", "node2": "gpu,v100", "node3": "gpu,k80", "node4": "gpu,k80"}
TYPES = (NodeTypeConfig("v100", constraint="gpu&v100"), NodeTypeConfig("k80", constraint="gpu&k80"))


@pytest.mark.slurm_conf(features=FEATURES)
def test_idle_nodes_per_type_and_pilots_of_one_type(slurm, tmp_path):
    s = SlurmScheduler(SlurmConfig(partition="scavenger", poll_s=0.2, max_nodes=4), PilotConfig(), tmp_path / "run", node_types=TYPES)
    try:
        assert s.idle_by_type() == {"v100": 2, "k80": 2}
        assert s.capacity() == 2
        job = s.submit_pilot("p1", 2, node_type="k80")
        sbatch = job
        fields = slurm.job(sbatch)
        assert fields["Features"] == "gpu&k80"
        from waiting import wait_for

        wait_for(lambda: slurm.job(sbatch).get("JobState") == "RUNNING", 60, "the pilot to start")
        assert set(subprocess.run(["scontrol", "show", "hostnames", slurm.job(sbatch)["NodeList"]], capture_output=True, text=True,
                                  env={**os.environ, **slurm.env}).stdout.split()) == {"node3", "node4"}  # fmt: skip
        wait_for(lambda: s.idle_by_type() == {"v100": 2, "k80": 0}, 10, "sinfo to say the k80 nodes are busy")  # asked anew after poll_s
    finally:
        s.close()


CONFIG = """scheduler = "slurm"
[slurm]
partition = "scavenger"
min_nodes = 1
max_nodes = 2
time_min = "00:05:00"
time_max = "00:30:00"
poll_s = 0.5
command_timeout_s = 20.0
[node_types.v100]
constraint = "gpu&v100"
[node_types.k80]
constraint = "gpu&k80"
[pilots]
heartbeat_s = 0.5
heartbeat_deadline_s = 15.0
grace_s = 5.0
nodes_per_pilot = 2
[controller]
tick_s = 0.1
t_fwd = 30.0
[runtime]
kind = "processes"
"""

CAMPAIGN = """
import os
import pilotfill

def loop(name):
    import os, time
    import pilotfill
    with open(os.environ["MARKS"], "a") as f:
        f.write(f"{name} {os.environ.get('PILOTFILL_HOST')}\\n")
    for _ in range(16):
        time.sleep(0.5)
        pilotfill.report(samples=10)
    return name

@pilotfill.elastic_app(min_nodes=1, max_nodes=2, curve={"v100": {"nodes": [0, 1, 2], "samples_per_s": [0, 600, 1200]},
                                                       "k80": {"nodes": [0, 1, 2], "samples_per_s": [0, 100, 200]}})
def convnet():
    return loop("convnet")

@pilotfill.elastic_app(min_nodes=1, max_nodes=2, curve={"v100": {"nodes": [0, 1, 2], "samples_per_s": [0, 700, 1400]},
                                                       "k80": {"nodes": [0, 1, 2], "samples_per_s": [0, 1000, 2000]}})
def recommender():
    return loop("recommender")

print("results", sorted([convnet().result(), recommender().result()]))
"""


@pytest.mark.slurm_conf(features=FEATURES)
def test_a_campaign_lands_each_job_on_the_node_type_that_suits_it(slurm, tmp_path):
    config, campaign, marks, run_dir = tmp_path / "slurm.toml", tmp_path / "campaign.py", tmp_path / "marks", tmp_path / "run"
    config.write_text(CONFIG)
    campaign.write_text(CAMPAIGN)
    out = tmp_path / "campaign.out"
    proc = subprocess.Popen([sys.executable, "-m", "pilotfill", "run", str(campaign), "--config", str(config), "--run-dir", str(run_dir)],
                            cwd=tmp_path, env={**os.environ, "MARKS": str(marks)}, stdout=open(out, "wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip
    try:
        wait_for_exit(proc, 600, "the typed campaign to end", out, run_dir)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = out.read_text()
    assert proc.returncode == 0, text[-4000:]
    assert "results ['convnet', 'recommender']" in text
    hosts: dict[str, set[str]] = {}
    for line in marks.read_text().splitlines():
        name, host = line.split()
        hosts.setdefault(name, set()).add(host)
    assert hosts["convnet"] and hosts["convnet"] <= {"node1", "node2"}  # v100
    assert hosts["recommender"] and hosts["recommender"] <= {"node3", "node4"}  # k80
    state = Journal(run_dir, readonly=True)
    try:
        submitted = [e["data"] for e in state.events("pilot.submitted")]
        started = {e["job"]: e["data"] for e in state.events("job.started")}
    finally:
        state.close()
    assert {d["node_type"] for d in submitted} == {"v100", "k80"}
    assert sorted(d["node_type"] for d in started.values()) == ["k80", "v100"]


def test_constraints_and_gres_are_read_as_slurm_writes_them():
    from pilotfill.schedulers.slurm import features_match, gres_match

    assert features_match("gpu&hbm80g", {"gpu", "hbm80g"}) and not features_match("gpu&hbm80g", {"gpu", "hbm40g"})
    assert features_match("[a100|h100]&gpu", {"h100", "gpu"}) and not features_match("[a100|h100]&gpu", {"v100", "gpu"})
    assert gres_match("gpu:a100", "gpu:a100:4(S:0-1)") and not gres_match("gpu:a100", "gpu:v100:4")
    assert gres_match("gpu:a100:4", "gpu:a100:4") and not gres_match("gpu:a100:8", "gpu:a100:4")
    assert gres_match("gpu", "gpu:v100:4") and gres_match("gpu:2", "gpu:4") and not gres_match("gpu", "(null)")
