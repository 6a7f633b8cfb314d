"""Under the torch runtime a rank's function may return before rank 0's (whose result is the job's): its node stays
in the job, and a peer that needs it in a collective re-forms at once, or the job fails saying why.

Turn 4 (a) on a real OpenPBS: a torch job sat 58.6 and 60.6 s at 0 samples/s and lost a node. The campaign's ranks ran
different numbers of batches per epoch, so one rank finished first and returned; its torch elastic agent then waited
in torch's exit barrier for 60 s, gave up and left the job — while the controller still held the node for it.
Real ``pilotfill run`` campaigns on the embedded local cluster, torch runtime, two nodes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_campaign import pilotfill_run

from pilotfill.journal import Journal

pytestmark = pytest.mark.local

CONFIG = """scheduler = "local"
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
kind = "torch"
"""

RANK_0_WORKS_ON = """
import json
import pilotfill


@pilotfill.elastic_app(min_nodes=2, max_nodes=2)
def train():
    import time
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.ones(4)
    for _ in range(20):
        dist.all_reduce(t)
        pilotfill.report(samples=4)
    if dist.get_rank() != 0:
        return "rank 1"
    # Rank 0 evaluates alone, longer than torch's exit barrier waits (60 s): no collective, so the peers may go.
    for _ in range(70):
        time.sleep(1.0)
        pilotfill.report(samples=1)
    return "rank 0 after its evaluation"

print(json.dumps(train().result()))
"""

UNEVEN_STEPS = """
import json
import pilotfill

@pilotfill.elastic_app(min_nodes=2, max_nodes=2)
def train():
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.ones(4)
    for _ in range(10 + (dist.get_rank() == 0)):   # rank 0 runs one step more: its last all_reduce has no partner
        dist.all_reduce(t)
        pilotfill.report(samples=4)
    return dist.get_rank()

f = train()
print(json.dumps({"error": str(f.exception())}))
"""


def _agent_logs(run_dir: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted((run_dir / "logs").glob("j*.log")))


def _run(tmp_path: Path, code: str):
    (tmp_path / "c.toml").write_text(CONFIG)
    campaign = tmp_path / "campaign.py"
    campaign.write_text(code)
    result = pilotfill_run(campaign, "--config", str(tmp_path / "c.toml"), "--run-dir", str(tmp_path / "run"), timeout=900)
    return result, tmp_path / "run"


def test_a_rank_that_returns_first_keeps_its_node_until_rank_0s_result_ends_the_job(tmp_path, torch_runtime):
    result, run_dir = _run(tmp_path, RANK_0_WORKS_ON)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == "rank 0 after its evaluation"
    logs = _agent_logs(run_dir)
    assert "exit barrier" not in logs, logs[-3000:]
    state = Journal(run_dir, readonly=True)
    try:
        started = state.events("job.started")
        stopped = state.events("job.stopped") + state.events("job.resized")
    finally:
        state.close()
    # One start on both nodes, never stopped or resized: no node left the job, rank 0 never restarted.
    assert len(started) == 1 and len(started[0]["data"]["nodes"]) == 2, started
    assert stopped == [], stopped
    assert logs.count("joined round") == 2, logs[-3000:]


def test_ranks_that_run_different_numbers_of_steps_fail_the_job_saying_so(tmp_path, torch_runtime):
    result, run_dir = _run(tmp_path, UNEVEN_STEPS)
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-3000:]
    error = json.loads(result.stdout.strip().splitlines()[-1])["error"]
    assert "different numbers of steps" in error, error[-2000:]
    assert "exit barrier" not in _agent_logs(run_dir)
    # Said on the terminal too, as the failure's last line.
    assert "different numbers of steps" in result.stderr, result.stderr[-3000:]
