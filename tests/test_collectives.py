"""GPU-safe collectives and the worker grace (issue "What users bring": GPUs and grace periods).

There is no GPU here, so what a GPU rank would get is checked on CPU, through
real torch elastic agents and workers: the NCCL variables each rank starts
with (asynchronous error handling, the watchdog monitor), the timeout of every
process group it creates (gloo's, a ``new_group``'s, and the one an NCCL group
would get), and — gloo, behaviour — that a survivor's collective fails within
the timeout instead of hanging for torch's 30 minutes when its peer stops
answering. The grace between SIGTERM and SIGKILL for workers is the pilot's,
from the site config: a worker taking 5 s to save on SIGTERM saves.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from localrun import LocalRun
from test_torch_runtime import MiniController, _processes_of

pytestmark = pytest.mark.local

HERE = Path(__file__).resolve().parent


@pytest.fixture
def cluster(tmp_path, torch_runtime):
    made: list[MiniController] = []

    def make(**kw: Any) -> MiniController:
        made.append(MiniController(tmp_path / f"run{len(made)}", **kw))
        return made[-1]

    yield make
    for ctl in made:
        ctl.close()
        marker = str(ctl.run_dir).encode()
        ctl.wait_for(lambda: not _processes_of(marker), 30, "no process of the run left")


def _job(ctl: MiniController, job_id: str, entry: str, hosts: list[str], **kwargs: Any) -> str:
    spec = {"name": job_id, "entry": f"collectives_probe:{entry}", "args": [], "kwargs": kwargs, "min_nodes": 1, "max_nodes": len(hosts)}
    with ctl.lock:
        ctl.jobs[job_id] = {"id": job_id, "spec": spec, "status": "running", "result": None, "error": None}
        ctl.runtime.start(job_id, spec, hosts)
    return job_id


def _lines(path: Path) -> list[dict]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        return []


def test_every_rank_gets_nccl_error_handling_and_the_collective_timeout(cluster, tmp_path):
    ctl = cluster(collective_timeout_s=42.0)
    out = tmp_path / "settings.jsonl"
    job = _job(ctl, "settings", "settings", ["n0", "n1"], out=str(out))
    ctl.wait_for(lambda: ctl.status(job) != "running", 240, "the job to finish")
    assert ctl.status(job) == "finished", ctl.jobs[job]["error"]
    seen = _lines(out)
    assert sorted(r["rank"] for r in seen) == [0, 1]
    for r in seen:
        assert r["env"] == {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3", "TORCH_NCCL_ENABLE_MONITORING": "1", "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "42"}
        assert r["world_timeout_s"] == r["new_group_timeout_s"] == r["nccl_timeout_s"] == 42.0


def test_a_survivor_is_not_left_hanging_in_a_collective(cluster, tmp_path):
    """Rank 1 stops answering (alive, outside the collective); rank 0's all-reduce fails after the collective
    timeout instead of waiting 30 min (gloo's default). What the worker then makes of the failure (a lost peer or
    its own error) is judged by evidence from its peers and the controller (``elastic/torch/worker.py``: ``Peers``), tested in
    test_adversarial.py."""
    ctl = cluster(collective_timeout_s=4.0)
    out = tmp_path / "survivor.jsonl"
    job = _job(ctl, "survivor", "survivor", ["n0", "n1"], out=str(out))
    ctl.wait_for(lambda: ctl.status(job) != "running", 180, "rank 0's collective to fail rather than hang")
    assert ctl.status(job) == "finished", ctl.jobs[job]["error"]
    (record,) = _lines(out)
    assert record["rank"] == 0 and record["raised"] == "RuntimeError" and "Timed out waiting" in record["message"]


GRACE_CONFIG = """scheduler = "local"
[local]
nodes = 1
workload = "none"
[pilots]
heartbeat_s = 0.5
heartbeat_deadline_s = 10.0
grace_s = 12.0
[controller]
tick_s = 0.1
[runtime]
kind = "torch"
"""


def test_workers_get_the_pilots_grace_to_save_on_sigterm(tmp_path, monkeypatch, torch_runtime):
    """Through the real pilot agent and torch elastic agent: the site's pilots.grace_s is 12 s and a worker takes 5 s
    to save on SIGTERM (the job is cancelled); it saves (with a fixed 3 s it was killed mid-save)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    run = LocalRun(tmp_path, config=GRACE_CONFIG)
    run.start(timeout_s=60)
    out = tmp_path / "grace.jsonl"
    try:
        job = run.client.submit({"name": "saver", "entry": "collectives_probe:commits_on_sigterm", "kwargs": {"out": str(out), "save_s": 5.0},
                                 "min_nodes": 1, "max_nodes": 1})  # fmt: skip
        run.wait_for(lambda: any(r.get("event") == "up" for r in _lines(out)), 120, "the worker to start")
        run.client.cancel(job)
        run.wait_for(lambda: any(r.get("event") == "term" for r in _lines(out)), 60, "SIGTERM to reach the worker")
        term = next(r for r in _lines(out) if r.get("event") == "term")
        time.sleep(12.0)  # the whole grace: by now the worker has saved or was killed
        events = [r.get("event") for r in _lines(out)]
        assert "saved" in events, f"killed before its save finished: {events}"
        saved = next(r for r in _lines(out) if r.get("event") == "saved")
        assert saved["pid"] == term["pid"]
    finally:
        run.stop()
        run.wait_for(lambda: not run.leftover_processes(), 30, "no leftover processes")
