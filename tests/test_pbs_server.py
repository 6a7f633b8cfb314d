"""pilotfill on a REAL OpenPBS 23.06.06: server, scheduler, comm and PostgreSQL datastore on one host, MOMs on three
others, each host its own network and UTS namespace (tests/pbs_cluster.py, tests/vhosts.py); pilotfill runs as one
normal user, the main workload as another, ``workq`` (priority 150) preempts ``scavenger`` (priority 10) with
``preempt_order = R``.

What the recordings in ``shared/data/openpbs/real-23.06.06-turn4`` found wrong is each a test here, on the real
server: a main job waiting behind a preempted pilot, a torch job stalling on a grow, pilots outliving a SIGKILLed
``pilotfill run``, a bad ``extra_args`` that is not one line, pilots deleted twice. The campaign tests read PBS's own
logs (MOM, server) for what PBS did, the journal for what pilotfill did.
"""

from __future__ import annotations

import json
import re
import signal
import time

import pytest
from pbs_cluster import MAIN_USER, USER, Campaign, site_config
from waiting import wait_for

pytestmark = pytest.mark.site

STEPS_CAMPAIGN = """
import pilotfill

@pilotfill.elastic_app(min_nodes=1, max_nodes={max_nodes}, scale_up_cost_s=1.0, scale_down_cost_s=1.0)
def train(i):
    import time
    import pilotfill
    for _ in range({steps}):
        time.sleep(0.5)
        pilotfill.report(samples=10)
    return i * 10

print("results", [f.result() for f in [train(i) for i in range({apps})]])
"""


def steps_campaign(apps: int = 4, steps: int = 40, max_nodes: int = 1) -> str:
    return STEPS_CAMPAIGN.format(apps=apps, steps=steps, max_nodes=max_nodes)


def running_pilots(campaign: Campaign) -> dict[str, dict]:
    """The campaign's pilots PBS runs now (R, substate 42: not exiting), by job id."""
    return {j: v for j, v in campaign.live_pilots().items() if v.get("job_state") == "R" and v.get("substate") == 42}


def vnodes_of(job: dict) -> list[str]:
    return [part.split(":")[0] for part in re.findall(r"\(([^)]*)\)", job.get("exec_vnode", ""))]


def job_lines(log: str, job_id: str) -> list[str]:
    """PBS log lines about ``job_id`` (``…;Job;ID;message``), messages only."""
    return [line.split(f";Job;{job_id};", 1)[1] for line in log.splitlines() if f";Job;{job_id};" in line]


def deletes(cluster, job_id: str) -> int:
    """How many times the server received a qdel of ``job_id``."""
    return sum(1 for m in job_lines(cluster.server_log(), job_id) if m == "delete job request received")


# ---------------------------------------------------------------- the cluster itself


def test_each_mom_is_a_host_of_its_own(real_pbs):
    """A job on each MOM host sees that host's name (the recordings' two MOMs on one kernel both said ``vm``)."""
    seen = {}
    for host in real_pbs.moms:
        vnode = real_pbs.vnodes_of(host)[0]
        job = real_pbs.qsub("-l", f"select=1:ncpus=1:vnode={vnode}", "-o", "/dev/null", "-j", "oe", "--", "/bin/sh", "-c", "hostname > $HOME/host.$PBS_JOBID")
        seen[host] = job
    homes = real_pbs.homes[MAIN_USER]
    wait_for(lambda: all((homes / f"host.{j}").exists() for j in seen.values()), 60, "the jobs to write their hostnames")
    assert {h: (homes / f"host.{j}").read_text().strip() for h, j in seen.items()} == {h: h for h in real_pbs.moms}


# ---------------------------------------------------------------- 1: the main workload never waits for a pilot


def test_a_main_job_gets_a_preempted_pilots_vnode_when_the_agent_has_ended_not_at_moms_kill_delay(real_pbs):
    """Turn 4 (e): a ``workq`` job pinned to a pilot's vnode waited 8.4–19 s. The job script ran under the user's login
    shell, which the preemption's SIGTERM ended first; the agent, orphaned, was no longer MOM's child, so MOM saw the
    session empty only when its kill_delay timer fired ("task … force exited", then the obit). The agent is now the
    job's top process and leaves nothing behind: MOM sends the obit when it exits, with no forced exit."""
    campaign = Campaign(real_pbs, "preempt", steps_campaign(apps=3, steps=400), site_config("processes", nodes_per_pilot=1))
    with campaign:
        campaign.start()
        wait_for(lambda: len(running_pilots(campaign)) >= 2, 180, "two pilots running")
        wait_for(lambda: len(campaign.events("job.started")) >= 2, 120, "training on them")
        preempted = []
        for _ in range(2):
            # A pilot whose node trains a job: not one the controller is ending meanwhile (it has more pilots than
            # jobs once a preempted pilot comes back), whose agent may have left just before MOM's kill, its session
            # empty ("task … force exited" at the first kill_job, at no cost to the main job).
            job_id, job = wait_for(lambda: sorted((j, v) for j, v in running_pilots(campaign).items() if set(vnodes_of(v)) & campaign.training_nodes()),
                                   120, "a pilot whose node trains a job")[0]  # fmt: skip
            vnode = vnodes_of(job)[0]
            main = real_pbs.qsub("-l", f"select=1:ncpus=1:vnode={vnode}", "-o", "/dev/null", "-j", "oe", "--", "/bin/sleep", "3")
            wait_for(lambda: (real_pbs.job(main) or {}).get("job_state") in ("R", "E", "F"), 120, f"main job {main} to run on {vnode}")
            preempted.append((job_id, vnode))
            wait_for(lambda: (real_pbs.job(main) or {}).get("job_state", "F") == "F" or main not in real_pbs.jobs(), 60, "the main job to end")
        campaign.proc.send_signal(signal.SIGINT)
        assert campaign.wait(120) == 130, campaign.text()[-3000:]
    for job_id, vnode in preempted:
        lines = job_lines(real_pbs.mom_log(vnode.split("[")[0]), job_id)
        rerun = next(i for i, m in enumerate(lines) if m == "signal job with Rerun")
        after = lines[rerun:]
        assert any(m == "Obit sent" for m in after), after
        assert not any("force exited" in m for m in after), f"MOM ended pilot {job_id}'s session by its kill_delay timer: {after}"
    assert campaign.live_pilots() == {} or wait_for(lambda: campaign.live_pilots() == {}, 60, "no pilot left")


# ---------------------------------------------------------------- 5: every pilot deleted once


@pytest.mark.parametrize("history", [False, True], ids=["history-off", "history-on"])
def test_a_campaign_ends_deleting_each_held_pilot_once(real_pbs, history):
    """Turn 4 (g): at a normal end every held pilot was qdel'd twice, ~1 s apart (the pilot manager's cancel, then
    the adapter's close deleting it again). A site admin sees each qdel. With job history off and on."""
    real_pbs.history(history)
    campaign = Campaign(real_pbs, f"once-{history}", steps_campaign(apps=3, steps=16), site_config("processes", nodes_per_pilot=1))
    with campaign:
        campaign.start()
        assert campaign.wait(300) == 0, campaign.text()[-3000:]
    assert "results [0, 10, 20]" in campaign.stdout()
    pilots = campaign.pilot_jobs()
    assert pilots
    wait_for(lambda: campaign.live_pilots() == {}, 60, "no pilot left")
    assert {j: deletes(real_pbs, j) for j in pilots if deletes(real_pbs, j) > 1} == {}
    if history:  # each pilot is kept as F, none queued again
        assert {v["job_state"] for j, v in real_pbs.jobs(history=True).items() if j in pilots} == {"F"}


# ---------------------------------------------------------------- 3: nothing outlives a SIGKILLed `pilotfill run`


def test_sigkill_of_pilotfill_run_ends_every_pilot_within_grace_and_heartbeat_deadline(real_pbs):
    """Turn 4 (b): SIGKILL of ``pilotfill run`` took the controller with it and left every pilot R for 608 s (the
    agents waited 600 s for a controller). With no ``pilotfill run`` left to restart a controller, the agents end
    their pilots within the heartbeat deadline plus the grace period."""
    deadline_s, grace_s = 15.0, 5.0
    campaign = Campaign(real_pbs, "sigkill", steps_campaign(apps=3, steps=400), site_config("processes", nodes_per_pilot=1, grace_s=grace_s))
    with campaign:
        campaign.start()
        wait_for(lambda: len(running_pilots(campaign)) >= 2, 180, "pilots running")
        wait_for(lambda: len(campaign.events("job.started")) >= 2, 120, "training on them")
        campaign.proc.send_signal(signal.SIGKILL)
        campaign.proc.wait()
        killed = time.monotonic()
        # Generous for a busy machine, and far below the 600 s it took: the agents notice within the deadline.
        wait_for(lambda: campaign.live_pilots() == {}, 4 * (deadline_s + grace_s) + 30, "every pilot to end after the SIGKILL")
        took = time.monotonic() - killed
    print(f"pilots ended {took:.1f} s after the SIGKILL")
    assert took < 300, f"pilots outlived the campaign by {took:.0f} s"


def test_a_controller_its_supervisor_restarts_keeps_every_pilot(real_pbs):
    """The other side of the SIGKILL test: a controller that dies while ``pilotfill run`` lives is restarted, and its
    pilots wait for it (the same PBS jobs run throughout) — the campaign finishes on them."""
    campaign = Campaign(real_pbs, "restart", steps_campaign(apps=3, steps=60), site_config("processes", nodes_per_pilot=1))
    with campaign:
        campaign.start()
        wait_for(lambda: len(running_pilots(campaign)) >= 2, 180, "pilots running")
        wait_for(lambda: len(campaign.events("job.started")) >= 2, 120, "training on them")
        before = set(running_pilots(campaign))
        pid = json.loads((campaign.run_dir / "controller.json").read_text())["pid"]
        real_pbs.hosts.run("pfsrv", ["kill", "-KILL", str(pid)])
        wait_for(lambda: len(campaign.events("controller.started")) >= 2, 120, "the supervisor to restart the controller")
        time.sleep(20)  # longer than the heartbeat deadline: an agent that took the restart for the end would be gone
        still = set(running_pilots(campaign))
        assert campaign.wait(600) == 0, campaign.text()[-3000:]
    assert "results [0, 10, 20]" in campaign.stdout()
    assert before <= still, f"pilots {sorted(before - still)} ended while the controller was restarted"
    assert campaign.events("pilot.lost") == []


# ---------------------------------------------------------------- 4: a bad extra_args is one line


def test_an_unknown_resource_in_extra_args_is_one_line_and_exit_2(real_pbs):
    """Turn 4 (d3): qsub exit 187 stopped the controller in 6 s, but the terminal then showed four "not finished"
    lines and a summary, and the error 31.6 s later, exit 1. Now: that one line, exit 2, as for a bad ``chunk``."""
    campaign = Campaign(real_pbs, "badextra", steps_campaign(apps=4, steps=10), site_config("processes", pbs={"extra_args": ["-l", "nosuchres=1"]}))
    with campaign:
        campaign.start()
        code = campaign.wait(120)
    text = campaign.text()
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("pilotfill:")]
    assert code == 2, text[-3000:]
    assert "pbs.extra_args" in text and "Unknown resource" in text, text[-3000:]
    assert "not finished" not in text and "apps finished" not in text, text[-3000:]
    assert len(lines) == 1, lines


def test_an_unknown_resource_in_chunk_is_one_line_and_exit_2(real_pbs):
    campaign = Campaign(real_pbs, "badchunk", steps_campaign(apps=2, steps=10), site_config("processes", pbs={"chunk": "ncpus=1:nosuchres=1"}))
    with campaign:
        campaign.start()
        code = campaign.wait(120)
    text = campaign.text()
    assert code == 2, text[-3000:]
    assert "pbs.chunk" in text and "nosuchres" in text, text[-3000:]
    assert [line for line in text.splitlines() if line.strip() and not line.startswith("pilotfill:")] == [line for line in text.splitlines() if "pbs.chunk" in line]
    assert real_pbs.run(["qselect", "-u", USER], check=False).stdout.split() == []


# ---------------------------------------------------------------- 2: torch on real hosts, preempted and released

TORCH_CAMPAIGN = """
import time

import pilotfill
import torch
import torch.distributed as dist
from pilotfill.elastic import ElasticState
from sklearn.datasets import load_digits
from torch.nn.parallel import DistributedDataParallel

EPOCHS = 30


@pilotfill.elastic_app(min_nodes=1, max_nodes=4)
def train(width, lr):
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    x, y = load_digits(return_X_y=True)
    x, y = torch.tensor(x / 16, dtype=torch.float32), torch.tensor(y)
    model = torch.nn.Sequential(torch.nn.Linear(64, width), torch.nn.ReLU(), torch.nn.Linear(width, 10))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    state = ElasticState(model, opt, epoch=0)
    ddp = DistributedDataParallel(model)
    while state.epoch < EPOCHS:
        world, rank = dist.get_world_size(), dist.get_rank()
        steps = len(x) // (32 * world)  # the same number of batches on every rank
        for s in range(steps):
            i = (s * world + rank) * 32
            opt.zero_grad()
            torch.nn.functional.cross_entropy(ddp(x[i : i + 32]), y[i : i + 32]).backward()
            opt.step()
            pilotfill.report(samples=32)
        time.sleep(0.5)
        state.epoch += 1
        state.commit()
    return float((model(x).argmax(1) == y).float().mean())


print(sorted([f.result() for f in [train(w, lr) for w, lr in ((32, 0.1), (64, 0.2), (96, 0.5))]], reverse=True))
"""


def progress_stalls(campaign: Campaign, until, on_tick=lambda elapsed: None, every_s: float = 1.0) -> dict[str, float]:
    """Sample every running job's journaled progress until ``until()`` (calling ``on_tick(seconds since the start)``
    each time); the longest stretch each job ran with no progress."""
    from pilotfill.journal import Journal

    still: dict[str, tuple[float, float]] = {}
    longest: dict[str, float] = {}
    start = time.monotonic()
    while not until():
        time.sleep(every_s)
        on_tick(time.monotonic() - start)
        try:
            state = Journal(campaign.run_dir, readonly=True)
            jobs = state.jobs()
            state.close()
        except Exception:  # noqa: BLE001 - not written yet
            continue
        now = time.monotonic()
        for job in jobs:
            if job.status != "running":
                still.pop(job.id, None)
                continue
            seen = still.get(job.id)
            if seen is None or job.progress > seen[0]:
                still[job.id] = (job.progress, now)
            else:
                longest[job.id] = max(longest.get(job.id, 0.0), now - seen[1])
    return longest


def test_a_torch_campaign_across_hosts_survives_preemption_and_releases(real_pbs):
    """Turn 4 (a) on real hosts: three torch jobs grow onto pilots spanning MOM hosts (ranks cross hosts over gloo,
    started on sister hosts through pbs_tmrsh), a main job preempts a pilot mid-run, nodes are released at the end.
    Every job finishes, the run's torch store is started once, no agent waits out torch's exit barrier, and no job
    sits at 0 samples/s as long as that barrier's 60 s."""
    campaign = Campaign(real_pbs, "torch", TORCH_CAMPAIGN, site_config("torch", nodes_per_pilot=4))
    with campaign:
        campaign.start()
        wait_for(lambda: len(campaign.events("job.started")) >= 3 and len(running_pilots(campaign)) >= 2, 240, "three jobs training")

        mains: list[str] = []

        def preempt_once(elapsed: float) -> None:
            pilots = running_pilots(campaign)
            if mains or elapsed < 15 or not pilots:
                return
            vnode = vnodes_of(sorted(pilots.items())[0][1])[0]
            mains.append(real_pbs.qsub("-l", f"select=1:ncpus=1:vnode={vnode}", "-o", "/dev/null", "-j", "oe", "--", "/bin/sleep", "30"))

        stalls = progress_stalls(campaign, lambda: campaign.proc.poll() is not None, preempt_once)
        code = campaign.wait(900)
    assert code == 0, campaign.text()[-4000:]
    assert len(json.loads(campaign.stdout().strip().splitlines()[-1])) == 3
    logs = "".join(p.read_text(errors="replace") for p in sorted((campaign.run_dir / "logs").glob("j*.log")))
    assert "exit barrier" not in logs, logs[-3000:]
    assert (campaign.run_dir / "logs" / "torch_store.log").read_text().count("torch store listening") == 1
    assert campaign.events("pilot.requeued"), "no pilot was preempted"
    assert campaign.events("node.released"), "no node was released"
    assert max(stalls.values(), default=0.0) < 60.0, stalls


# ---------------------------------------------------------------- the adapter call by call (tests/pbs_probe.py)


def probe(cluster, scenario: str, *args: str, on_wait=None, timeout_s: float = 300) -> dict:
    """Run a scenario of tests/pbs_probe.py on the login node as pilotfill's user; what it found."""
    import subprocess
    import sys
    from pathlib import Path

    run_dir = cluster.homes[USER] / f"probe-{scenario}-{time.monotonic_ns()}"
    argv = [sys.executable, str(Path(__file__).parent / "pbs_probe.py"), scenario, str(run_dir), *args]
    proc = cluster.hosts.popen("pfsrv", argv, user=USER, env=cluster.env(), cwd=str(cluster.homes[USER]), stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    found = None
    try:
        for line in proc.stdout:
            if line.startswith("WAIT "):
                on_wait(line.split()[1:])
                proc.stdin.write("go\n")
                proc.stdin.flush()
            elif line.startswith("{"):
                found = json.loads(line)
        proc.wait(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and found is not None, proc.stderr.read()[-4000:]
    return found


@pytest.mark.parametrize("history", [False, True], ids=["history-off", "history-on"])
def test_pbs_release_nodes_gives_back_a_sister_hosts_vnode_and_never_the_primarys(real_pbs, history):
    real_pbs.history(history)
    found = probe(real_pbs, "release")
    assert len({n.split("[")[0] for n in found["nodes"]}) == 3, found  # place=scatter: a host per chunk
    assert found["released"] == [found["sister"]] and found["sister"] not in found["held_after"], found
    assert found["released_primary"] == [] and found["primary_vnode"] in found["held_after"], found
    assert found["ended"][-1] == "ended", found


@pytest.mark.parametrize("history", [False, True], ids=["history-off", "history-on"])
def test_a_pilot_deleted_while_pbs_requeues_it_never_runs_again(real_pbs, history):
    """Turn 4 (c): a qdel while PBS requeues a preempted pilot is lost (the job goes back to Q); the adapter deletes
    it again, and it never runs a second time nor is its second run reported as a start."""
    real_pbs.history(history)
    mains = []

    def preempt(what: list[str]) -> None:
        mains.append(real_pbs.qsub("-l", "select=1:ncpus=1:vnode=pfn3", "-o", "/dev/null", "-j", "oe", "--", "/bin/sleep", "5"))

    found = probe(real_pbs, "requeue-delete", "ncpus=1:vnode=pfn3", on_wait=preempt)
    kinds = [kind for kind, _ in found["events"]]
    assert kinds.count("started") == 1, found
    assert found["final"] is None or (found["final"]["state"] == "F" and found["final"]["run_count"] == 1), found
    wait_for(lambda: (real_pbs.job(mains[0]) or {"job_state": "F"})["job_state"] in ("R", "E", "F"), 60, "the main job to run")


# ---------------------------------------------------------------- Ctrl-C, and a refused qsub


def test_ctrl_c_stops_the_campaign_deleting_each_pilot_once(real_pbs):
    """Turn 4 (b): SIGINT to the process group: exit 130, the stop journaled, every pilot gone, none deleted twice."""
    campaign = Campaign(real_pbs, "sigint", steps_campaign(apps=3, steps=400), site_config("processes", nodes_per_pilot=1))
    with campaign:
        campaign.start()
        wait_for(lambda: len(running_pilots(campaign)) >= 2 and len(campaign.events("job.started")) >= 2, 180, "training on pilots")
        import os

        os.killpg(campaign.proc.pid, signal.SIGINT)
        assert campaign.wait(120) == 130, campaign.text()[-3000:]
    assert "interrupted (SIGINT)" in campaign.text()
    stopped = campaign.events("controller.stopped")
    assert stopped and stopped[-1]["data"]["ranks_not_gone"] == 0, stopped
    wait_for(lambda: campaign.live_pilots() == {}, 60, "no pilot left")
    pilots = campaign.pilot_jobs()
    assert {j: deletes(real_pbs, j) for j in pilots if deletes(real_pbs, j) > 1} == {}  # a pilot whose agent ended first needs none


def test_a_qsub_refused_by_a_queue_limit_backs_off_and_the_campaign_finishes_on_what_it_has(real_pbs):
    """Turn 4 (d1): ``max_queued = [u:PBS_GENERIC=2]`` on the pilot queue: two pilots, then refusals, each said on the
    progress line with PBS's words and a growing back-off; the campaign finishes on the two."""
    real_pbs.qmgr("set queue scavenger max_queued = [u:PBS_GENERIC=2]")
    campaign = Campaign(real_pbs, "limit", steps_campaign(apps=4, steps=20), site_config("processes", nodes_per_pilot=1))
    with campaign:
        campaign.start()
        assert campaign.wait(600) == 0, campaign.text()[-3000:]
    assert "results [0, 10, 20, 30]" in campaign.stdout()
    refused = campaign.events("pilot.submit_refused")
    assert refused and all("would exceed" in e["data"]["reason"] for e in refused), refused
    assert "pilot refused: qsub: would exceed" in campaign.text()
    assert len(campaign.pilot_jobs()) >= 2


# ---------------------------------------------------------------- the stand-in agrees with the real server


PILOT_QSUB = ["-q", "scavenger", "-N", "pilot", "-r", "y", "-l", "select=2:ncpus=1", "-l", "place=vscatter",
              "-l", "min_walltime=00:05:00,max_walltime=02:00:00", "--", "/bin/sleep", "60"]  # fmt: skip


def shape(value):
    """What a parser relies on in a PBS JSON document: its keys and value types, not its values."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, str):
        return re.sub(r"[A-Za-z0-9_.-]+", "w", value) if re.fullmatch(r"[\w.\[\]:/()+=,-]*", value) else "text"
    return type(value).__name__


def test_the_standin_prints_what_the_real_server_prints(real_pbs, pbs):
    """tests/pbs_standin stands in for OpenPBS in the fast tests: for a running two-chunk pilot, ``qstat -f -F json``
    and ``pbsnodes -av -F json`` have the real server's keys and value shapes wherever the adapter reads them."""
    job = real_pbs.run(["qsub", *PILOT_QSUB], user=USER).stdout.strip()
    wait_for(lambda: (real_pbs.jobs().get(job) or {}).get("substate") == 42, 60, "the pilot to run")
    real = real_pbs.jobs()[job]
    pbs("pbs_standin", "delay", "join", "0")
    stand_id = pbs("qsub", *PILOT_QSUB).stdout.strip()
    stand = pbs.job(stand_id)
    read = ("job_state", "substate", "run_count", "exec_vnode", "exec_host", "Job_Name", "queue", "comment", "Rerunable")
    assert {k: shape(real.get(k)) for k in read} == {k: shape(stand.get(k)) for k in read}
    assert shape(real["Resource_List"]) == shape(stand["Resource_List"])
    assert set(real["resources_used"]) >= {"walltime"} and set(stand["resources_used"]) >= {"walltime"}
    real_vnode = real_pbs.nodes()[vnodes_of(real)[0]]
    stand_vnode = pbs.vnode(vnodes_of(stand)[0])
    for key in ("state", "jobs", "resources_available"):
        assert shape(real_vnode[key]) == shape(stand_vnode[key]) or key == "resources_available", (key, real_vnode[key], stand_vnode[key])
    assert {"host", "ncpus", "vnode"} <= set(real_vnode["resources_available"]) & set(stand_vnode["resources_available"])
