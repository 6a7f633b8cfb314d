"""A controller restarted by ``pilotfill run`` adopts the trainings that run on healthy nodes: their ranks go on.

Issue 54 (5): controller deaths 60 s apart relaunched every running training from its last commit (two 900 s apps
took 1,672 s) and the fourth death ended the campaign. Here the supervisor of ``pilotfill run`` keeps a real
controller on the embedded local cluster; the test SIGKILLs it while a job trains, and the job's ranks — the same
processes, in the same rendezvous round — train on under the new controller and finish.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from localrun import committed_step, digits_job, synthetic_job
from waiting import wait_for

from pilotfill import procs
from pilotfill.campaign import prepare_run_dir
from pilotfill.client import ControllerClient
from pilotfill.journal import Journal
from pilotfill.supervisor import ControllerSupervisor

pytestmark = pytest.mark.local
HERE = Path(__file__).resolve().parent
RANKS_S = 300
"""A limit for what waits on torch ranks (imports, rendezvous, training) on a busy machine."""

CONFIG = """scheduler = "local"
[local]
nodes = 2
{workload}
[pilots]
heartbeat_s = 0.5
heartbeat_deadline_s = 10.0
grace_s = 3.0
[controller]
tick_s = 0.1
t_fwd = 10.0
[runtime]
kind = "{runtime}"
"""


class Campaign:
    """A supervised controller on a run directory (what ``pilotfill run`` keeps) and a client of it."""

    def __init__(self, root: Path, runtime: str, workload: str = 'workload = "none"'):
        config = root / "config.toml"
        config.write_text(CONFIG.format(runtime=runtime, workload=workload))
        self.run_dir = prepare_run_dir(root / "runs" / "r")
        self.sup = ControllerSupervisor(self.run_dir, str(config), root / "runs" / "checkpoints", new_campaign=False, max_restarts=3)

    def __enter__(self) -> Campaign:
        self.sup.start()
        self.client = ControllerClient(self.run_dir, timeout_s=120)
        return self

    def __exit__(self, *exc) -> None:
        self.client.close()
        self.sup.stop()
        wait_for(lambda: not self.leftovers(), 30, "no process of the run left", detail=self.story)

    def kill_controller(self) -> None:
        """SIGKILL the controller; return once the supervisor's next one listens."""
        pid = self.sup.proc.pid
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: self.sup.fatal is not None or (self.sup.proc.pid != pid and self.sup.proc.poll() is None
                                                        and json.loads((self.run_dir / "controller.json").read_text())["pid"] == self.sup.proc.pid),
                 120, "the supervisor's next controller", detail=self.story)  # fmt: skip
        assert self.sup.fatal is None, self.sup.fatal

    def events(self, kind: str | None = None) -> list[dict]:
        state = Journal(self.run_dir, readonly=True)
        try:
            return state.events(kind)
        finally:
            state.close()

    def ranks(self, job: str) -> dict[int, str]:
        """The job's processes on this machine (pid -> host), by their environment."""
        return {pid: env.get("PILOTFILL_HOST", "") for pid, env in procs.environments(PILOTFILL_RUN_DIR=str(self.run_dir), PILOTFILL_JOB_ID=job).items()}

    def leftovers(self) -> list[int]:
        marker = str(self.run_dir).encode()
        found = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or int(pid) == os.getpid():
                continue
            try:
                cmd = open(f"/proc/{pid}/cmdline", "rb").read()
                env = open(f"/proc/{pid}/environ", "rb").read()
            except OSError:
                continue
            if (marker in cmd or b"PILOTFILL_RUN_DIR=" + marker in env) and procs.alive(int(pid)):
                found.append(int(pid))
        return found

    def story(self) -> str:
        parts = []
        for path in [self.run_dir / "controller.out", *sorted((self.run_dir / "logs").glob("*.log"))]:
            try:
                parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-1500:]}")
            except OSError:
                pass
        try:
            events = [e for e in self.events() if e["kind"] not in ("job.report", "node.heartbeat")]
            parts.append("events:\n" + "\n".join(f"{e['time']:.1f} {e['kind']} {e.get('job') or ''} {json.dumps(e['data'])[:160]}" for e in events[-50:]))
        except Exception as exc:  # noqa: BLE001 — printed on a failure already: never hide it
            parts.append(f"events unreadable: {exc!r}")
        return "\n".join(parts)[-12000:]


def _after(events: list[dict], seq: int, kind: str, job: str) -> list[dict]:
    return [e for e in events if e["seq"] > seq and e["kind"] == kind and e["job"] == job]


def _confirmed(run: Campaign, job: str, hosts: set[str], after: float) -> float | None:
    """When the agents of ``hosts`` last told the new controller that ``job``'s ranks still run there (None: not yet)."""
    told = [e for e in run.events("ranks.adopted") if e["time"] >= after and any(j == job for _, j in e["data"]["kept"])]
    seen = {h for e in told for h, j in e["data"]["kept"] if j == job}
    assert not [e for e in told if e["data"]["lost"]], told
    return max(e["time"] for e in told) if seen >= hosts else None


def test_a_torch_job_trains_on_through_a_controller_restart(tmp_path, torch_runtime, monkeypatch):
    probe = tmp_path / "probe.jsonl"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))  # torch_probe
    monkeypatch.setenv("PROBE_LOG", str(probe))
    hold = tmp_path / "hold"
    hold.touch()

    def probed(event: str) -> list[dict]:
        try:
            return [r for r in map(json.loads, probe.read_text().splitlines()) if r["event"] == event]
        except (OSError, ValueError):
            return []

    with Campaign(tmp_path, "torch") as run:
        spec = digits_job("adopted", lo=2, hi=2, epochs=2)
        job = run.client.submit({**spec, "entry": "torch_probe:train", "kwargs": {**spec["kwargs"], "hold_file": str(hold)}})
        wait_for(lambda: len(probed("commit")) >= 2 and len(probed("start")) >= 2, RANKS_S, "the job training on two nodes", detail=run.story)
        starts = probed("start")
        workers = {r["pid"] for r in starts}
        rounds = {r["round"] for r in starts}
        ranks = run.ranks(job)
        assert len(rounds) == 1 and len(workers) == 2, starts

        killed_at = time.time()
        run.kill_controller()
        # Both agents tell the new controller the job's ranks run on; it trains on: commits after that, from the same workers.
        told = wait_for(lambda: _confirmed(run, job, set(ranks.values()), killed_at), 120, "the agents to confirm the job's ranks", detail=run.story)
        wait_for(lambda: [c for c in probed("commit") if c["time"] > told], RANKS_S, "a commit after the restart", detail=run.story)
        assert set(run.ranks(job)) >= set(ranks), "a rank of the job was restarted"
        hold.unlink()
        done = run.client.wait([job], timeout_s=RANKS_S)[job]
        assert done["status"] == "finished", done
        assert {r["pid"] for r in probed("start")} == workers, "the workers were started again"
        assert {r["round"] for r in probed("start")} == rounds, "a new rendezvous round was formed"
        events = run.events()
        restart = max(e["seq"] for e in events if e["kind"] == "controller.started")
        recovered = next(e for e in events if e["kind"] == "controller.recovered")["data"]
        assert recovered["adopted_jobs"] == [job] and recovered["requeued"] == [], recovered
        for kind in ("job.stopped", "job.started", "job.resized"):
            assert not _after(events, restart, kind, job), f"{kind} after the restart"
        assert not [e for e in events if e["kind"] == "job.crashed"]


def test_a_processes_job_trains_on_through_controller_restarts(tmp_path):
    with Campaign(tmp_path, "processes") as run:
        job = run.client.submit(synthetic_job("adopted", total=2400, per_rank=40.0, lo=2, hi=2))
        wait_for(lambda: run.client.job(job)["progress"] > 200 and len(run.ranks(job)) == 2, 120, "the job training on two nodes", detail=run.story)
        ranks = run.ranks(job)
        for _ in range(2):  # two deaths in a row: the second controller adopts what the first adopted
            progress, killed_at = run.client.job(job)["progress"], time.time()
            run.kill_controller()
            wait_for(lambda: _confirmed(run, job, set(ranks.values()), killed_at), 120, "the agents to confirm the job's ranks", detail=run.story)
            wait_for(lambda: run.client.job(job)["progress"] > progress + 200, 120, "progress after the restart", detail=run.story)
            assert run.ranks(job) == ranks, "the job's ranks were restarted"
        done = run.client.wait([job], timeout_s=180)[job]
        assert done["status"] == "finished", done
        assert done["result"]["resumed_from"] < 200  # the rank that returned ran from the start: never relaunched
        events = run.events()
        assert len([e for e in events if e["kind"] == "job.started" and e["job"] == job]) == 1
        assert not [e for e in events if e["kind"] in ("job.stopped", "job.crashed")]
        recovered = [e["data"] for e in events if e["kind"] == "controller.recovered"]
        assert [r["adopted_jobs"] for r in recovered] == [[job], [job]], recovered


def test_a_horovod_job_is_requeued_from_its_commit(tmp_path, horovod, monkeypatch):
    """Not adopted (docs/reliability.md says why): ``horovodrun`` is the controller's child and dies with it. The agents,
    which outlive the controller, end its ranks; the job resumes from its last durable commit."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))  # held_digits
    hold = tmp_path / "hold"
    hold.touch()
    with Campaign(tmp_path, "horovod") as run:
        spec = digits_job("requeued", lo=1, hi=2, epochs=2)
        job = run.client.submit({**spec, "entry": "held_digits:train", "kwargs": {**spec["kwargs"], "hold_file": str(hold)}})
        wait_for(lambda: committed_step(run.run_dir.parent, job), RANKS_S, "a durable commit", detail=run.story)
        ranks = run.ranks(job)
        run.kill_controller()
        wait_for(lambda: not set(ranks) & set(run.ranks(job)), 60, "the old ranks to end", detail=run.story)
        events = run.events()
        recovered = next(e for e in events if e["kind"] == "controller.recovered")["data"]
        assert recovered["requeued"] == [job] and recovered["adopted_jobs"] == [], recovered
        started = wait_for(lambda: _after(run.events(), recovered_seq(run), "job.started", job), RANKS_S, "the job started again", detail=run.story)
        assert started[0]["data"]["progress"] > 0  # from its commit, not from zero
        hold.unlink()
        done = run.client.wait([job], timeout_s=RANKS_S)[job]
        assert done["status"] == "finished", done
        assert done["result"]["restored"] is True


def recovered_seq(run: Campaign) -> int:
    return max(e["seq"] for e in run.events("controller.recovered"))


def test_the_local_clusters_main_workload_keeps_its_clock_across_a_restart(tmp_path):
    """The embedded cluster is a batch system to the controller: its main workload takes pf-node-1 back 25 s after the
    campaign began, whichever controller is listening then (a restarted cluster used to start its trace anew)."""
    workload = 'workload = "script"\nscript = [{ at = 25.0, node = "pf-node-1", state = "busy" }]'
    began = time.time()  # before the cluster's clock starts
    with Campaign(tmp_path, "processes", workload) as run:
        job = run.client.submit(synthetic_job("steady", total=1e9, per_rank=40.0, lo=1, hi=2))
        wait_for(lambda: len(run.ranks(job)) == 2 and time.time() - began > 15.0, 60, "the job on both nodes", detail=run.story)
        run.kill_controller()  # a cluster that started its clock anew would take pf-node-1 40 s after `began` or later
        taken = wait_for(lambda: [e for e in run.events("node.leaving") if e["node"] == "pf-node-1"], 120, "pf-node-1 taken back", detail=run.story)
        assert 25.0 <= taken[0]["time"] - began < 38.0, taken[0]["time"] - began
        assert run.client.job(job)["status"] == "running"
        run.client.cancel(job)


LONG_TORCH_APP = """
import time
import pilotfill


@pilotfill.elastic_app(min_nodes=2, max_nodes=2)
def train():
    for _ in range(3000):
        time.sleep(0.1)
        pilotfill.report(samples=1)
    return "done"

print(train().result())
"""


def test_nothing_outlives_a_sigkilled_pilotfill_run(tmp_path, torch_runtime):
    """What outlives a restarted controller — the local cluster's agents, the torch store — must not outlive the
    campaign: with ``pilotfill run`` SIGKILLed, its lease goes unrenewed and they end within the heartbeat deadline."""
    config = tmp_path / "config.toml"
    config.write_text(CONFIG.format(runtime="torch", workload='workload = "none"').replace("heartbeat_deadline_s = 10.0", "heartbeat_deadline_s = 3.0"))
    campaign = tmp_path / "long.py"
    campaign.write_text(LONG_TORCH_APP)
    run_dir = tmp_path / "runs" / "r"
    proc = subprocess.Popen([sys.executable, "-m", "pilotfill", "run", str(campaign), "--config", str(config), "--run-dir", str(run_dir)], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        def training() -> bool:
            try:
                state = Journal(run_dir, readonly=True)
            except Exception:  # noqa: BLE001 — not there yet
                return False
            try:
                return any(j.progress > 0 for j in state.jobs())
            finally:
                state.close()

        wait_for(training, RANKS_S, "the app training")
        outliving = [pid for pid, env in procs.environments(PILOTFILL_ROLE="torch-store").items() if env.get("PILOTFILL_RUN_DIR") == str(run_dir)]
        assert outliving, "no torch store"
        proc.send_signal(signal.SIGKILL)  # pilotfill run alone: the controller dies with it, its agents and store do not at once
        proc.wait()
        marker = str(run_dir).encode()

        def left() -> list[int]:
            found = []
            for pid in os.listdir("/proc"):
                try:
                    cmd, env = open(f"/proc/{pid}/cmdline", "rb").read(), open(f"/proc/{pid}/environ", "rb").read()
                except OSError:
                    continue
                if (marker in cmd or b"PILOTFILL_RUN_DIR=" + marker in env) and procs.alive(int(pid)):
                    found.append(int(pid))
            return found

        wait_for(lambda: not left(), 90, "every process of the campaign to end")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_a_job_that_lost_a_node_while_no_controller_listened_is_adopted_on_the_rest(tmp_path):
    with Campaign(tmp_path, "processes") as run:
        job = run.client.submit(synthetic_job("halved", total=1e9, per_rank=40.0, lo=1, hi=2))
        wait_for(lambda: len(run.ranks(job)) == 2, 60, "the job on both nodes", detail=run.story)
        pilots = {p["nodes"][0]: p for p in run.client.snapshot()["pilots"] if p["state"] == "running"}
        survivor = {pid for pid, host in run.ranks(job).items() if host == "pf-node-0"}
        os.kill(pilots["pf-node-1"]["pid"], signal.SIGKILL)  # its node goes with it, and the controller right after
        run.kill_controller()
        events = wait_for(lambda: [e for e in run.events() if e["kind"] == "job.resized" and "pf-node-1" in e["data"].get("cause", "")], 60,
                          "the job shrunk to the node it kept", detail=run.story)  # fmt: skip
        recovered = next(e for e in run.events() if e["kind"] == "controller.recovered")["data"]
        assert recovered["adopted"] == [pilots["pf-node-0"]["id"]] and recovered["adopted_jobs"] == [job], recovered
        assert events[0]["data"]["after"] == 1
        progress = run.client.job(job)["progress"]
        wait_for(lambda: run.client.job(job)["progress"] > progress + 40, 60, "progress on the node it kept", detail=run.story)
        assert survivor <= set(run.ranks(job)), "the rank on the node it kept was restarted"
        restart = recovered_seq(run)
        assert not [e for e in run.events() if e["kind"] in ("job.stopped", "job.started") and e["seq"] > restart and e["job"] == job]
        run.client.cancel(job)
