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

import pytest
from waiting import wait_for, wait_for_exit

from pilotfill.journal import Journal
from pilotfill.reasons import NodeWhy, StopCause

pytestmark = pytest.mark.local

APPS = 4
MAX_NODES = 2

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


@pilotfill.elastic_app(min_nodes=1, max_nodes={MAX_NODES}, scale_up_cost_s=1.0, scale_down_cost_s=1.0)
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
    state = Journal(run_dir, readonly=True)
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
        wait_for_exit(proc, 600, "the campaign to end after the preemption", out, run_dir)
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
    # Pilots ask for the nodes the jobs can use (nodes_per_pilot is an upper bound: a job that grows by one node gets a
    # one-node pilot), and a preempted pilot may have to be replaced: no more qsubs than that.
    assert len(submitted) <= APPS * MAX_NODES + preemptions, f"{len(submitted)} pilots submitted for {APPS} apps of up to {MAX_NODES} nodes and {preemptions} preemption(s)"
    # Every pilot deleted at the end: the stand-in has none left once their agents have ended what ran on their nodes
    # (within the grace period after the qdel), with history on only finished ones, as F.
    wait_for(lambda: [j for j, v in pbs.jobs().items() if v["Job_Name"].startswith("pf-")] == [], 60, "no pilot left in qstat")
    if pbs.history:
        history = json.loads(pbs("qstat", "-x", "-f", "-F", "json").stdout).get("Jobs", {})
        assert {v["job_state"] for v in history.values() if v["Job_Name"].startswith("pf-")} == {"F"}
    # Restarts: each one follows a stop, by lost nodes (at most once per preemption) or by the allocator.
    state = Journal(run_dir, readonly=True)
    try:
        starts: dict[str, int] = {}
        for e in state.events("job.started"):
            starts[e["job"]] = starts.get(e["job"], 0) + 1
        stops = state.events("job.stopped")
        released = [e["time"] for e in state.events("node.released") if NodeWhy.of(e["data"].get("why", "")) == NodeWhy.RELEASED]
        resubmitted = [e for e in state.events("pilot.submitted") if released and e["time"] > min(released)]
    finally:
        state.close()
    print(f"pilots submitted {len(submitted)}, preemptions {preemptions}, starts per job {sorted(starts.values())}")
    assert len(starts) == APPS
    # A node released because no job needed it is never followed by a pilot asking for another one.
    assert resubmitted == [], f"pilots submitted after a release: {resubmitted}"
    # A preemption stops a job at most once (its nodes leaving); beyond that, a job may be stopped by the allocator
    # to give its node to another when the objective gains — at most once here, and never without that objective.
    by_choice = [e for e in stops if e["data"].get("cause") == StopCause.ALLOCATION]
    by_loss = [e for e in stops if e not in by_choice]  # "vm[3] leaving", "vm[3] gone": its nodes were taken
    for job in starts:
        lost = sum(1 for e in by_loss if e["job"] == job)
        chosen = [e for e in by_choice if e["job"] == job]
        assert lost <= preemptions and len(chosen) <= 1, f"job {job}: {lost} stops by lost nodes, {len(chosen)} by the allocator; preemptions {preemptions}"
        assert all("objective" in e["data"] for e in chosen), chosen
        assert starts[job] - 1 <= lost + len(chosen), f"job {job}: {starts[job]} starts, {lost + len(chosen)} stops (a restart without a stop: a crash)"


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


# ---------------------------------------------------------------- Ctrl-C (recheck (b))


def test_ctrl_c_records_the_stop_deletes_every_pilot_and_leaves_nothing(pbs, tmp_path):
    """Recheck (b), b-after-sigint-every-0.5s.csv, b-second-run-strace-controller-killed.txt: SIGINT to `pilotfill run`
    (what Ctrl-C sends its process group) SIGKILLed the controller 0.26 s later; no "shutting down", no
    ``controller.stopped``, no qdel; the pilots stayed R and their agents ran for 607-609 s. Now: the stop is recorded,
    every pilot is deleted, and nothing of the run is left in qstat or on the machine."""
    from interrupting import ctrl_c, journal, start_run, wait_until_nothing_left

    pbs("pbs_standin", "exec", "on")
    config, campaign, marks, run_dir = tmp_path / "pbs.toml", tmp_path / "campaign.py", tmp_path / "marks", tmp_path / "run"
    config.write_text(CONFIG)
    campaign.write_text(CAMPAIGN)
    proc = start_run(campaign, config, run_dir, tmp_path / "campaign.out", env={"MARKS": str(marks), "STEPS": "100000"})
    wait_for(lambda: marks.exists() and len(marks.read_text().splitlines()) >= 2, 180, "training to start on pilots")
    pilots = [argv for argv in pbs.calls("qsub") if "scavenger" in argv]
    code = ctrl_c(proc)
    text = (tmp_path / "campaign.out").read_text()
    assert journal(run_dir, "controller.stopped"), "the stop is in the journal"
    submitted = {e["data"]["scheduler_id"] for e in journal(run_dir, "pilot.submitted")}
    deleted = {j for argv in pbs.calls("qdel") for j in argv[1:]}
    assert len(submitted) == len(pilots) and submitted <= deleted, f"qdel of every pilot: submitted {submitted}, deleted {deleted}"
    assert code == 130 and "interrupted (SIGINT)" in text, text[-3000:]
    wait_for(lambda: not [j for j, v in pbs.jobs().items() if v["Job_Name"].startswith("pf-")], 60, "no pilot left in qstat")
    wait_until_nothing_left(run_dir, grace_s=3.0)


# ---------------------------------------------------------------- refused submits (recheck (g))


def test_a_queue_limit_refusal_is_shown_and_retried_when_the_log_says(pbs, tmp_path):
    """Recheck (g), g-queue-limit-qsub-38.txt: exit 38 was only a WARNING in controller.log; the terminal showed the
    progress line alone. Now the progress line and `pilotfill top` say PBS's words, and the submission is asked again
    when due."""
    from interrupting import ctrl_c, journal, start_run

    pbs("pbs_standin", "exec", "on")
    pbs("pbs_standin", "limit", "scavenger", "max_queued", "1")
    blocker = pbs("qsub", "-q", "scavenger", "-N", "mine", "-l", "select=9:ncpus=1", "--", "/bin/true").stdout.strip()  # never runs
    config, campaign, marks, run_dir = tmp_path / "pbs.toml", tmp_path / "campaign.py", tmp_path / "marks", tmp_path / "run"
    config.write_text(CONFIG)
    campaign.write_text(CAMPAIGN)
    out = tmp_path / "campaign.out"
    proc = start_run(campaign, config, run_dir, out, env={"MARKS": str(marks), "STEPS": "4"})
    try:
        wait_for(lambda: "pilot refused: qsub: would exceed queue generic's per-user limit (exit 38)" in out.read_text(), 120,
                 "the refusal on the progress line", detail=lambda: out.read_text()[-2000:])  # fmt: skip
        top = subprocess.run([sys.executable, "-m", "pilotfill", "top", str(run_dir)], capture_output=True, text=True, timeout=60)  # one frame
        assert "pilot refused: qsub: would exceed queue generic's per-user limit (exit 38)" in top.stdout, top.stdout
        wait_for(lambda: len(journal(run_dir, "pilot.submit_refused")) >= 2, 120, "a second try when the first back-off is over")
        pbs("qdel", blocker)  # the limit no longer bites: the next try goes through and the campaign runs
        wait_for_exit(proc, 600, "the campaign to end once the limit no longer bites", out, run_dir)
    finally:
        if proc.poll() is None:
            ctrl_c(proc)
    text = out.read_text()
    assert proc.returncode == 0, text[-3000:]
    assert f"results {[i * 10 for i in range(APPS)]}" in text


def run_to_its_end(tmp_path: Path, config_text: str) -> tuple[int, str, Path]:
    """``pilotfill run`` of the test campaign with ``config_text``, left to end by itself: exit code, output, run dir."""
    from interrupting import start_run

    config, campaign, run_dir = tmp_path / "pbs.toml", tmp_path / "campaign.py", tmp_path / "run"
    config.write_text(config_text)
    campaign.write_text(CAMPAIGN)
    out = tmp_path / "campaign.out"
    proc = start_run(campaign, config, run_dir, out, env={"MARKS": str(tmp_path / "marks")})
    try:
        code = wait_for_exit(proc, 180, "the campaign to end by itself", out, run_dir)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return code, out.read_text(), run_dir


def test_a_chunk_no_vnode_can_hold_stops_the_campaign_with_one_line(pbs, tmp_path):
    """Recheck (g): ``chunk = "ncpus=1:nosuchres=1"``: no qsub at all, no warning, "0 jobs training on 0 nodes" for
    good. Now the campaign stops at start with the key and why."""
    code, text, _ = run_to_its_end(tmp_path, CONFIG.replace('chunk = "ncpus=1"', 'chunk = "ncpus=1:nosuchres=1"'))
    assert code == 2, text[-3000:]
    assert "pbs.chunk 'ncpus=1:nosuchres=1': no vnode of the 8 PBS lists can hold it: nosuchres=1 (no vnode has it)" in text
    assert [argv for argv in pbs.calls("qsub")] == []


def test_an_unknown_resource_in_extra_args_stops_the_campaign_instead_of_waiting(pbs, tmp_path):
    """Recheck (g), g-bad-resource-qsub-187-with-config.txt: exit 187, "next try in 10 s" — and no second try in
    40 s, "0 jobs training on 0 nodes" for good. Asking again gets the same answer: the campaign stops, naming
    pbs.extra_args and PBS's words — one line and exit 2, as a bad chunk (turn 4 (d3): four "not finished" lines, a
    summary and the error 31.6 s after the controller had stopped, exit 1)."""
    from interrupting import journal

    code, text, run_dir = run_to_its_end(tmp_path, CONFIG.replace('place = "vscatter"', 'place = "vscatter"\nextra_args = ["-l", "nosuchres=1"]'))
    assert code == 2, text[-3000:]
    assert "error: pbs.extra_args: PBS refuses every pilot:" in text
    assert "not finished" not in text and "apps finished" not in text
    assert "qsub: Unknown resource Resource_List.nosuchres" in text
    assert len(pbs.calls("qsub")) == 1, "asked once: the same request would get the same answer"
    assert [e["data"]["reason"] for e in journal(run_dir, "pilot.submit_refused")] == ["qsub: Unknown resource Resource_List.nosuchres (exit 187)"]
    assert journal(run_dir, "controller.stopped")


# ---------------------------------------------------------------- signals that arrive (recheck (c), (d), (h))

HOLD = """
import os
import pilotfill

@pilotfill.elastic_app(min_nodes=NODES, max_nodes=NODES)
def hold(i):
    import os, signal, subprocess, sys, time
    import pilotfill
    marks, host = os.environ["MARKS"], os.environ.get("PILOTFILL_HOST")

    def term(signum, frame):
        with open(marks, "a") as f:
            f.write(f"TERM {host}\\n")
        os._exit(0)

    signal.signal(signal.SIGTERM, term)
    orphan = ""
    if os.environ.get("ORPHAN"):  # a process of its own session that ignores SIGTERM: out of reach of PBS and of groups
        code = "import signal, time\\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\\nwhile True: time.sleep(0.1)"
        orphan = str(subprocess.Popen([sys.executable, "-c", code], start_new_session=True).pid)
    with open(marks, "a") as f:
        f.write(f"start {host} {orphan}\\n")
    while True:
        time.sleep(0.2)
        pilotfill.report(samples=1)

print([f.result() for f in [hold(0)]])
"""


def hold_campaign(tmp_path: Path, nodes: int, place: str = "vscatter", env: dict | None = None):
    from interrupting import start_run

    config, campaign, marks, run_dir = tmp_path / "pbs.toml", tmp_path / "campaign.py", tmp_path / "marks", tmp_path / "run"
    text = CONFIG.replace("nodes_per_pilot = 2", f"nodes_per_pilot = {nodes}").replace('place = "vscatter"', f'place = "{place}"')
    config.write_text(text)
    campaign.write_text(HOLD.replace("NODES", str(nodes)))
    proc = start_run(campaign, config, run_dir, tmp_path / "campaign.out", env={"MARKS": str(marks), **(env or {})})
    return proc, marks, run_dir


def test_ranks_on_a_sister_host_get_their_sigterm_through_pbs_tmrsh(pbs, tmp_path):
    """Recheck (c) (c-local-job-log.txt, c-remote-probe-log.txt): pbs_tmrsh forwards no signal — a rank on a sister
    host ran on. When a job ends on a sister host while its pilot goes on (the job is cancelled, stopped or moved), the
    agent delivers SIGTERM there itself, through ``pbs_tmrsh HOST python -m pilotfill.pilots.agent --end-on NODE``.
    (Every host of the stand-in is this machine, where the agent's own look at /proc also finds the rank; on a cluster
    it cannot: so the pbs_tmrsh call is checked too.) When the whole pilot ends (preempted, deleted), the agent asks
    no sister MOM for one more task: MOM ends what it ran there itself (the real server's test_pbs_server)."""
    from interrupting import ctrl_c

    from pilotfill.client import ControllerClient

    pbs("pbs_standin", "exec", "on")
    proc, marks, run_dir = hold_campaign(tmp_path, nodes=2, place="scatter")
    try:
        wait_for(lambda: marks.exists() and {"vm[0]", "vm-n1[0]"} <= {line.split()[1] for line in marks.read_text().splitlines()}, 180,
                 "the job's ranks on both hosts of the pilot")  # fmt: skip
        [pilot] = [r for r in pbs.state()["runs"] if r["name"].startswith("pf-")]
        assert sorted(pbs.job(pilot["job"])["exec_host"].split("+")) == ["vm-n1/0", "vm/0"], "a primary and a sister host"
        state = Journal(run_dir, readonly=True)
        try:
            [job] = [j.id for j in state.jobs() if j.status == "running"]
        finally:
            state.close()
        ControllerClient(run_dir).cancel(job)  # the job ends; its pilot stays
        wait_for(lambda: "TERM vm-n1[0]" in marks.read_text(), 60, "SIGTERM on the sister host")

        def delivered() -> bool:
            ends = [c["argv"] for c in pbs.state()["calls"] if c["cmd"] == "pbs_tmrsh" and "--end-on" in c["argv"]]
            return any(argv[1] == "vm-n1" and argv[argv.index("--end-on") + 1] == "vm-n1[0]" and job in argv for argv in ends)

        wait_for(delivered, 60, "the agent to deliver it on vm-n1 through pbs_tmrsh")
    finally:
        ctrl_c(proc)


def test_a_preempted_pilots_whole_process_tree_is_gone_before_the_main_job_starts(pbs, tmp_path):
    """Recheck (d) B and (h) (d-B-1vnode-pilot-25.vm-child-outlives-trap-every-0.5s.csv, h-main-job-submit-to-R.csv):
    a child left behind by a pilot delayed the main job 21 s, or (in a session of its own, out of PBS's sight) would
    run on beside it. A rank's child that ignores SIGTERM in a session of its own was left running by the agent (its
    SIGKILL timer died with it). Now the agent SIGKILLs the whole tree within the grace period and only then exits:
    when the main job starts, nothing of the pilot is left."""
    from interrupting import ctrl_c

    pbs("pbs_standin", "exec", "on")
    proc, marks, run_dir = hold_campaign(tmp_path, nodes=1, env={"ORPHAN": "1"})
    orphan, ticks = 0, ""
    try:
        line = wait_for(lambda: marks.exists() and next((x for x in marks.read_text().splitlines() if x.startswith("start")), None), 180, "the rank")
        orphan = int(line.split()[2])
        ticks = open(f"/proc/{orphan}/stat").read().rsplit(")", 1)[1].split()[19]
        [pilot] = [r for r in pbs.state()["runs"] if r["name"].startswith("pf-")]
        main = pbs("pbs_standin", "preempt", pilot["job"], "30").stdout.strip()
        wait_for(lambda: pbs.jobs().get(main, {}).get("job_state") == "R", 60, "the main job to start", poll_s=0.05)
        alive = os.path.exists(f"/proc/{orphan}") and open(f"/proc/{orphan}/stat").read().rsplit(")", 1)[1].split()[0] not in "ZX"
        assert not alive, "a process of the preempted pilot still runs beside the main job"
    finally:
        ctrl_c(proc)
        if orphan and os.path.exists(f"/proc/{orphan}") and open(f"/proc/{orphan}/stat").read().rsplit(")", 1)[1].split()[19] == ticks:
            os.kill(orphan, 9)  # the test leaves nothing behind, even when it fails


# ---------------------------------------------------------------- the torch store (recheck (a))

TORCH_CAMPAIGN = """
import pilotfill

HOLD = "HOLD_FILE"

@pilotfill.elastic_app(min_nodes=1, max_nodes=2)
def train(epochs, width, hold=False):
    import os
    from pilotfill.workloads import digits

    class Held(int):  # not reached while HOLD exists: the test preempts a pilot of this training, then lets it end
        def __gt__(self, epoch):
            return os.path.exists(HOLD) or int(self) > epoch

    return {"val_accuracy": digits.train(epochs=Held(epochs) if hold else epochs, width=width, step_delay_s=0.02)["val_accuracy"]}

short, long = train(SHORT, 16), train(LONG, 32, hold=True)
print("results", [r["val_accuracy"] > 0.5 for r in (short.result(), long.result())])
"""


def test_a_torch_campaign_survives_preemption_and_releases_with_one_store(pbs, tmp_path, torch_runtime):
    """Recheck (a): a-torch-store-pids-ports-and-strace-signals.txt (4 stores in 80 s, each SIGTERMed by a leaving,
    stopping or releasing agent: si_pid = the agent), a-torch-agent-logs-j1-vm0-preempted-j3-vm2-stuck.txt and
    a-strace-stuck-worker-j3-vm2-connect-old-port.txt (j3 stuck on the first store's port). The controller shares
    its host with every pilot's vnodes here, as there; a pilot of the long training is preempted and the short
    training's pilots are given back. Every training finishes, and the store is the same one throughout."""
    import socket

    from interrupting import ctrl_c, journal, start_run

    from pilotfill.client import ControllerClient

    here = socket.gethostname().split(".")[0]
    pbs("pbs_standin", "init", "--hosts", f"{here}:4")  # the controller's host is every pilot's host
    pbs("pbs_standin", "exec", "on")
    config, campaign, run_dir, out = tmp_path / "pbs.toml", tmp_path / "campaign.py", tmp_path / "run", tmp_path / "campaign.out"
    config.write_text(CONFIG.replace("nodes_per_pilot = 2", "nodes_per_pilot = 1").replace('kind = "processes"', 'kind = "torch"'))
    hold = tmp_path / "hold"
    hold.touch()  # the long training goes on until a pilot of it was preempted (it once finished first on a quiet machine)
    campaign.write_text(TORCH_CAMPAIGN.replace("SHORT", "3").replace("LONG", "10").replace("HOLD_FILE", str(hold)))
    proc = start_run(campaign, config, run_dir, out)
    try:
        wait_for(lambda: (run_dir / "controller.json").exists(), 120, "the controller")
        client = ControllerClient(run_dir)

        def long_job_running_after_the_short_one():
            snap = client.snapshot()
            short = next((j for j in snap["jobs"] if j["name"].startswith("train(3, 16")), None)
            long = next((j for j in snap["jobs"] if j["name"].startswith("train(10, 32")), None)
            if short is None or long is None or short["status"] != "finished" or long["status"] != "running" or not long["nodes"]:
                return None
            return next((p for p in snap["pilots"] if p["state"] == "running" and set(p["nodes"]) & set(long["nodes"])), None)

        wait_for(long_job_running_after_the_short_one, 600, "the short training to finish while the long one trains",
                 detail=lambda: out.read_text()[-2000:])  # fmt: skip
        # Given back: a node released, or a pilot not yet registered cancelled (the short training ended first).
        wait_for(lambda: journal(run_dir, "node.released") or journal(run_dir, "pilot.cancelled"), 120, "the short training's nodes to be given back")

        def preempted() -> bool:  # a pilot of the long training now (the one seen before may have gone meanwhile)
            pilot = long_job_running_after_the_short_one()
            return pilot is not None and pbs("pbs_standin", "preempt", pilot["scheduler_id"], "20", check=False).returncode == 0

        wait_for(preempted, 120, "a pilot of the long training to preempt", detail=lambda: out.read_text()[-2000:])
        wait_for(lambda: journal(run_dir, "pilot.requeued") or journal(run_dir, "node.leaving"), 120, "the preemption to be seen")
        hold.unlink()
        wait_for_exit(proc, 900, "the campaign to end after the preemption", out, run_dir)
    finally:
        if proc.poll() is None:
            ctrl_c(proc)
    text = out.read_text()
    assert proc.returncode == 0, text[-4000:]
    assert "results [True, True]" in text
    assert journal(run_dir, "pilot.requeued") or journal(run_dir, "node.leaving"), "a pilot was preempted"
    stores = (run_dir / "logs" / "torch_store.log").read_text().count("torch store listening")
    assert stores == 1, f"the torch store was started {stores} times"
