"""Every runtime through the real controller and the pilot agents on the local cluster.

Ranks are started on a node by that node's pilot agent (never by the
controller), ``ranks_per_node`` of them, each with its own ``LOCAL_RANK`` and,
where the node has GPUs, its own device (checked by the environment each rank
sees: there is no GPU here). The torch runtime also trains for real while the
main workload takes a node and gives it back.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from localrun import LocalRun, digits_job

pytestmark = pytest.mark.local

HERE = Path(__file__).resolve().parent

CONFIG = """scheduler = "local"
[local]
nodes = 4
workload = "{workload}"
script = [{script}]
[pilots]
heartbeat_s = 0.5
heartbeat_deadline_s = 5.0
grace_s = 4.0
[controller]
tick_s = 0.1
[runtime]
kind = "{kind}"
ranks_per_node = {ranks}
gpus_per_node = {gpus}
"""


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    """make(kind, ranks, gpus, script) -> a started LocalRun; the test's modules importable by its ranks."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    runs: list[LocalRun] = []

    def make(kind: str, ranks: int = 1, gpus: int = 0, script: list[tuple[float, str, str]] = ()) -> LocalRun:
        root = tmp_path / f"run{len(runs)}"
        root.mkdir()
        run = LocalRun(root)
        items = ", ".join(f'{{ at = {at}, node = "{node}", state = "{state}" }}' for at, node, state in script)
        run.config.parent.mkdir(parents=True, exist_ok=True)
        run.config.write_text(CONFIG.format(workload="script" if script else "none", script=items, kind=kind, ranks=ranks, gpus=gpus))
        run.start(timeout_s=120)
        runs.append(run)
        return run

    yield make
    for run in runs:
        run.stop()
        run.wait_for(lambda: not run.leftover_processes(), 30, "no leftover processes")
        assert run.leftover_processes() == []


def probe_job(out: Path, kind: str, nodes: int = 2) -> dict:
    return {"name": "probe", "entry": "rank_probe:probe", "kwargs": {"out": str(out), "runtime": kind}, "min_nodes": nodes, "max_nodes": nodes}


def runtime_needs(kind: str, request) -> None:
    if kind == "horovod":
        request.getfixturevalue("horovod")
    if kind == "torch":
        request.getfixturevalue("torch_runtime")


@pytest.mark.parametrize("kind", ["processes", "horovod", "torch"])
def test_ranks_per_node_each_with_its_local_rank_and_own_gpu(cluster, tmp_path, kind, request):
    runtime_needs(kind, request)
    run = cluster(kind, ranks=2, gpus=2)
    out = tmp_path / f"{kind}.jsonl"
    job = run.client.submit(probe_job(out, kind))
    assert run.client.wait([job], timeout_s=300)[job]["status"] == "finished", run.logs[-1].read_text()[-3000:]
    seen = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(seen) == 4, seen
    assert sorted(r["rank"] for r in seen) == [0, 1, 2, 3] and {r["size"] for r in seen} == {4}
    by_host: dict[str, list] = {}
    for r in seen:
        by_host.setdefault(r["host"], []).append(r)
    assert len(by_host) == 2 and all(sorted(r["local_rank"] for r in rs) == [0, 1] for rs in by_host.values())
    assert all(r["local_size"] == 2 and r["cuda"] == str(r["local_rank"]) for r in seen)  # each rank sees only its own GPU
    # The pilot agents started the ranks on their nodes (Horovod's driver starts its own, over ssh), and ended them:
    # by the job's stop command, or — when the pilot was cancelled before its agent collected that command — by
    # ending everything on its nodes as it left. Nothing of the job outlives it either way (checked at teardown).
    # The job is finished once the controller has its result; each agent collects the stop at its next heartbeat,
    # which on a busy machine can come after the client hears the result.
    def agents() -> str:
        return "".join(p.read_text() for p in (run.run_dir / "logs").glob("pilot-*.log"))

    run.wait_for(lambda: "ended j" in agents() or "ending (leaving)" in agents(), 60, "the agents to end the job's ranks")
    assert ("started" in agents()) == (kind != "horovod")


def test_a_torch_job_through_the_pilots_shrinks_and_grows_as_the_main_workload_moves(cluster, request):
    request.getfixturevalue("torch_runtime")
    run = cluster("torch", script=[(20.0, "pf-node-1", "busy"), (32.0, "pf-node-1", "idle")])
    job = run.client.submit({**digits_job("digits", lo=1, hi=4, epochs=100, step_delay_s=0.05), "scale_up_cost_s": 1.0})
    done = run.client.wait([job], timeout_s=600)[job]
    assert done["status"] == "finished", done.get("error")
    assert done["result"]["val_accuracy"] >= 0.8
    resized = [e["data"] for e in run.events("job.resized") if e["job"] == job]
    assert any(d["after"] < d["before"] and "pf-node-1" in d.get("cause", "") for d in resized), resized
    assert any(d["after"] > d["before"] for d in resized[1:]), resized
    assert not [e for e in run.events("job.stopped") if e["job"] == job]  # the node left; the job went on
