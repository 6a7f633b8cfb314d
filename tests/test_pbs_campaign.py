"""A whole campaign on the STAND-IN OpenPBS (OpenPBS is not packaged here; tests/pbs_standin reproduces what a real
OpenPBS 23.06.06 printed and did), with its stand-in MOM running the pilot job scripts: real controller, real pilot
agents, real rank processes (``runtime.kind = "processes"``), a main-workload job in the high-priority queue
preempting a pilot mid-run. Runs with job history off (the server's default) and on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from waiting import wait_for

from pilotfill.state import State

APPS = 4

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
[pilots]
heartbeat_s = 0.5
heartbeat_deadline_s = 15.0
grace_s = 3.0
nodes_per_pilot = 2
[controller]
tick_s = 0.1
[runtime]
kind = "processes"
"""

CAMPAIGN = f"""
import os
import pilotfill

@pilotfill.elastic_app(min_nodes=1, max_nodes=2, scale_up_cost_s=1.0, scale_down_cost_s=1.0)
def train(i):
    import os, time
    import pilotfill
    with open(os.environ["MARKS"], "a") as f:
        f.write(f"start {{i}} {{os.environ.get('PILOTFILL_HOST')}} {{time.time()}}\\n")
    for _ in range(int(os.environ.get("STEPS", "40"))):
        time.sleep(0.5)
        pilotfill.report(samples=10)
    return i * 10

print("results", [f.result() for f in [train(i) for i in range({APPS})]])
"""


def events(run_dir: Path, kind: str, pilot: str) -> list[dict]:
    state = State(run_dir, readonly=True)
    try:
        return [e for e in state.events(kind) if e["pilot"] == pilot]
    finally:
        state.close()


def free_vnodes(pbs) -> int:
    nodes = json.loads(pbs("pbsnodes", "-av", "-F", "json").stdout)["nodes"]
    return sum(1 for v in nodes.values() if v["state"] == "free" and v["resources_available"].get("ncpus", 0) > 0)


def test_campaign_with_a_main_job_preempting_a_pilot(pbs, tmp_path):
    pbs("pbs_standin", "exec", "on")
    config, campaign, marks, run_dir = tmp_path / "pbs.toml", tmp_path / "campaign.py", tmp_path / "marks", tmp_path / "run"
    config.write_text(CONFIG)
    campaign.write_text(CAMPAIGN)
    out = tmp_path / "campaign.out"
    env = {**os.environ, "MARKS": str(marks), "STEPS": "40"}
    proc = subprocess.Popen([sys.executable, "-m", "pilotfill", "run", str(campaign), "--config", str(config), "--run-dir", str(run_dir)],
                            cwd=tmp_path, env=env, stdout=open(out, "wb"), stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        # Mid-run: training has started on pilots; then a main job wants more than is free.
        wait_for(lambda: marks.exists() and len(marks.read_text().splitlines()) >= 2, 180, "training to start on pilots")
        time.sleep(3.0)
        need = min(8, free_vnodes(pbs) + 1)
        main = pbs("qsub", "-q", "workq", "-N", "mainjob", "-l", f"select={need}:ncpus=1", "--", "/bin/sleep", "6").stdout.strip()
        wait_for(lambda: pbs.state().get("requeues", 0) >= 1, 60, "a pilot to be preempted")
        wait_for(lambda: main not in pbs.jobs(), 120, "the main job to run and end")
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = out.read_text()
    assert proc.returncode == 0, text[-4000:]
    assert f"results {[i * 10 for i in range(APPS)]}" in text

    preemptions = pbs.state().get("requeues", 0)
    submitted = [argv for argv in pbs.calls("qsub") if "scavenger" in argv]
    assert preemptions >= 1
    assert len(submitted) <= APPS + preemptions + 2, f"{len(submitted)} pilots submitted for {APPS} apps and {preemptions} preemption(s)"
    # Every pilot deleted at the end: the stand-in has none left (with history on, only finished ones, as F).
    assert [j for j, v in pbs.jobs().items() if v["Job_Name"].startswith("pf-")] == []
    if pbs.history:
        history = json.loads(pbs("qstat", "-x", "-f", "-F", "json").stdout).get("Jobs", {})
        assert {v["job_state"] for v in history.values() if v["Job_Name"].startswith("pf-")} == {"F"}
    # No job restarted more than once per preemption.
    state = State(run_dir, readonly=True)
    try:
        starts: dict[str, int] = {}
        for e in state.events("job.started"):
            starts[e["job"]] = starts.get(e["job"], 0) + 1
    finally:
        state.close()
    print(f"pilots submitted {len(submitted)}, preemptions {preemptions}, starts per job {sorted(starts.values())}")
    assert len(starts) == APPS
    assert all(n - 1 <= preemptions for n in starts.values()), f"starts per job {starts}, preemptions {preemptions}"


def test_a_requeued_pilot_rejoins_with_its_vnodes(pbs, tmp_path):
    """real-23.06.06 item 6, end to end: a preempted (requeued) pilot runs again when the main job ends; its agent
    registers again and the controller has its vnodes back."""
    from localrun import synthetic_job

    from pilotfill.client import ControllerClient

    pbs("pbs_standin", "exec", "on")
    config, run_dir = tmp_path / "pbs.toml", tmp_path / "run"
    config.write_text(CONFIG.replace("nodes_per_pilot = 2", "nodes_per_pilot = 4"))
    log = open(tmp_path / "controller.out", "wb")
    ctl = subprocess.Popen([sys.executable, "-m", "pilotfill.controller", "--run-dir", str(run_dir), "--config", str(config)],
                           stdout=log, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        wait_for(lambda: (run_dir / "controller.json").exists() and json.loads((run_dir / "controller.json").read_text()).get("pid") == ctl.pid, 60, "controller")
        client = ControllerClient(run_dir)
        job = client.submit(synthetic_job("train", total=1e9, hi=4))
        victim = wait_for(lambda: next((r for r in pbs.state().get("runs", []) if r["name"].startswith("pf-")), None), 120, "a pilot to run")
        pilot = victim["name"][len("pf-") :]
        wait_for(lambda: len(client.job(job)["nodes"]) >= len(victim["vnodes"]), 120, "training on the pilot")
        wait_for(lambda: events(run_dir, "pilot.started", pilot), 60, "the adapter to report the pilot's start")
        # The main workload wants the whole machine: the pilot is requeued and runs again once the main job is over.
        main = pbs("qsub", "-q", "workq", "-N", "mainjob", "-l", "select=8:ncpus=1", "--", "/bin/sleep", "5").stdout.strip()
        wait_for(lambda: main not in pbs.jobs(), 120, "the main job to run and end")
        rerun = wait_for(lambda: [r for r in pbs.state()["runs"] if r["job"] == victim["job"] and r["run"] == 2], 120, "the pilot to run again")
        assert set(rerun[0]["vnodes"]) == set(victim["vnodes"])

        def rejoined() -> bool:
            ended = [e["seq"] for e in events(run_dir, "pilot.requeued", pilot)]
            joined = {e["node"] for e in events(run_dir, "node.joined", pilot) if ended and e["seq"] > ended[0]}
            return joined >= set(rerun[0]["vnodes"])

        wait_for(rejoined, 60, "the requeued pilot's vnodes to join again")
        client.cancel(job)
    finally:
        ctl.terminate()
        ctl.wait(60)
