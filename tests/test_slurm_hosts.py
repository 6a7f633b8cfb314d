"""pilotfill on a real Slurm whose every daemon runs on a host of its own (slurmctld on ``pfctl``, slurmd on
``node1``…``node4``: network and UTS namespaces, tests/vhosts.py), so a job's ranks really cross hosts: the torch
rendezvous, the run's store and gloo all go over the hosts' links, not over one loopback.
"""

from __future__ import annotations

import json
import sys

import pytest
from waiting import wait_for

pytestmark = pytest.mark.site

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
bind = "0.0.0.0"
[runtime]
kind = "torch"
network_interface = "eth0"
"""

CAMPAIGN = """
import json
import socket

import pilotfill


@pilotfill.elastic_app(min_nodes=2, max_nodes=2)
def where():
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.ones(8)
    for _ in range(20):
        dist.all_reduce(t)       # over the hosts' links
        pilotfill.report(samples=8)
    hosts = [None] * dist.get_world_size()
    dist.all_gather_object(hosts, socket.gethostname())
    return {"hosts": hosts, "sum": float(t[0])}


print(json.dumps([f.result() for f in [where(), where()]]))
"""


def test_each_slurmd_is_a_host_of_its_own(slurm_hosts):
    out = slurm_hosts.command("srun", "-p", "main", "-N", "4", "--ntasks-per-node=1", "hostname", timeout=120).stdout.split()
    assert sorted(out) == slurm_hosts.names


def test_a_torch_job_s_ranks_cross_slurm_hosts(slurm_hosts, tmp_path, torch_runtime):
    (tmp_path / "slurm.toml").write_text(CONFIG)
    (tmp_path / "campaign.py").write_text(CAMPAIGN)
    out, err = tmp_path / "campaign.out", tmp_path / "campaign.err"
    with open(out, "wb") as o, open(err, "wb") as e:
        proc = slurm_hosts.popen([sys.executable, "-m", "pilotfill", "run", "campaign.py", "--config", "slurm.toml", "--run-dir", str(tmp_path / "run")],
                                 cwd=str(tmp_path), stdout=o, stderr=e, start_new_session=True)  # fmt: skip
    try:
        assert proc.wait(timeout=600) == 0, err.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    results = json.loads(out.read_text().strip().splitlines()[-1])
    for r in results:
        assert len(set(r["hosts"])) == 2 and set(r["hosts"]) <= set(slurm_hosts.names), r
        assert r["sum"] == 2.0**20  # every all_reduce of the two ranks added up
    wait_for(lambda: slurm_hosts.command("squeue", "-h", "-o", "%i", check=False).stdout.split() == [], 60, "no pilot left in squeue")
