"""PBS with several kinds of node, on the STAND-IN OpenPBS (OpenPBS is not packaged here; tests/pbs_standin
reproduces what a real OpenPBS 23.06.06 printed and did): a site's custom string resource ``gpu_type`` on each
host's vnodes, pilots asking for one type each through their select, and a whole campaign whose jobs land on the
type that suits them. Custom resources were not recorded: the stand-in matches them as the recorded
``select=1:ncpus=1:vnode=vm[0]`` matched its vnode (a string equal); an unknown resource is refused as recorded
(exit 187)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from waiting import wait_for_exit

from pilotfill.config import NodeTypeConfig, PilotConfig
from pilotfill.schedulers.commands import SchedulerCommandError
from pilotfill.schedulers.pbs import PbsConfig, PbsScheduler
from pilotfill.journal import Journal

pytestmark = pytest.mark.local

TYPES = (NodeTypeConfig("v100", select="gpu_type=v100", ranks_per_node=2), NodeTypeConfig("k80", select="gpu_type=k80"))


@pytest.fixture
def typed_pbs(pbs):
    pbs("pbs_standin", "init", "--hosts", "vm:4,vm-n1:4", "--resources", "vm:gpu_type=v100,vm-n1:gpu_type=k80")
    return pbs


def test_the_standin_shows_and_matches_a_custom_string_resource(typed_pbs):
    pbs = typed_pbs
    assert pbs.vnode("vm[0]")["resources_available"]["gpu_type"] == "v100"
    assert pbs.vnode("vm-n1[2]")["resources_available"]["gpu_type"] == "k80"
    job = pbs("qsub", "-q", "scavenger", "-l", "select=2:ncpus=1:gpu_type=k80", "-l", "place=vscatter", "--", "/bin/true").stdout.strip()
    assert all(v.startswith("vm-n1[") for v in pbs.state()["jobs"][job]["vnodes"])
    bad = pbs("qsub", "-q", "scavenger", "-l", "select=1:ncpus=1:gpu_model=k80", "--", "/bin/true", check=False)
    assert bad.returncode == 187 and "Unknown resource" in bad.stderr
    recorded = pbs("qsub", "-q", "scavenger", "-l", "select=1:ncpus=1", "-l", "nosuchres=1", "--", "/bin/true", check=False)
    assert (recorded.returncode, recorded.stderr.strip()) == (187, "qsub: Unknown resource Resource_List.nosuchres")  # g-bad-resource-qsub-187


def test_idle_vnodes_are_counted_per_type_and_a_pilot_asks_for_one(typed_pbs, tmp_path):
    pbs = typed_pbs
    s = PbsScheduler(PbsConfig(queue="scavenger", poll_s=0.001, nodes_per_pilot=4), PilotConfig(), tmp_path / "run", retries=1, backoff_s=0.01, node_types=TYPES)
    try:
        assert s.idle_by_type() == {"v100": 4, "k80": 4}
        assert s.idle_nodes() == 8
        assert s.capacity() == 4  # a job runs on one type at a time
        job = s.submit_pilot("p1", 3, node_type="k80")
        (argv,) = pbs.calls("qsub")
        assert "select=3:ncpus=1:gpu_type=k80" in argv
        assert all(v.startswith("vm-n1[") for v in pbs.state()["jobs"][job]["vnodes"])
        assert s.idle_by_type() == {"v100": 4, "k80": 1}
        with pytest.raises(SchedulerCommandError, match="no node type 'a100'"):
            s.submit_pilot("p2", 1, node_type="a100")
    finally:
        s.close()


CONFIG = """scheduler = "pbs"
[pbs]
queue = "scavenger"
min_walltime = "00:05:00"
max_walltime = "02:00:00"
nodes_per_pilot = 2
chunk = "ncpus=1"
place = "vscatter"
poll_s = 0.5
command_timeout_s = 30.0
[node_types.v100]
select = "gpu_type=v100"
[node_types.k80]
select = "gpu_type=k80"
[pilots]
heartbeat_s = 0.5
heartbeat_deadline_s = 15.0
grace_s = 3.0
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

# A convolutional model: 6x faster on V100. A recommender: faster on K80 here (as Gavel measured a V100 no faster).
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


def test_a_campaign_on_two_types_of_pbs_vnode(typed_pbs, tmp_path):
    pbs = typed_pbs
    pbs("pbs_standin", "exec", "on")
    config, campaign, marks, run_dir = tmp_path / "pbs.toml", tmp_path / "campaign.py", tmp_path / "marks", tmp_path / "run"
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
    assert hosts["convnet"] and all(h.startswith("vm[") for h in hosts["convnet"])  # gpu_type=v100
    assert hosts["recommender"] and all(h.startswith("vm-n1[") for h in hosts["recommender"])  # gpu_type=k80
    selects = [a[a.index("-l") + 1] for a in pbs.calls("qsub")]
    assert {s.split(":", 1)[1] for s in selects} == {"ncpus=1:gpu_type=v100", "ncpus=1:gpu_type=k80"}
    state = Journal(run_dir, readonly=True)
    try:
        started = {e["job"]: e["data"] for e in state.events("job.started")}
    finally:
        state.close()
    assert sorted(d["node_type"] for d in started.values()) == ["k80", "v100"]
