"""The torch runtime: real torch elastic agents and gloo training on a virtual cluster of named hosts.

A tiny controller in the test (a real authenticated ``transport.Server`` on a
temporary run directory, served on a thread) answers ``job.get``,
``job.report``, ``job.commit``, ``job.result``, ``job.failed`` and the ``rdzv.*`` messages;
the runtime starts one agent per host through a ``LocalLauncher``. Deadlines
are generous (busy CI machines): nothing here depends on timing.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from waiting import wait_for

from pilotfill.elastic.base import RankExit
from pilotfill.elastic.launch import LocalLauncher
from pilotfill.elastic.rendezvous import RendezvousBook, handle
from pilotfill.security import create_secret
from pilotfill.transport import Client, ControllerUnavailable, Server

pytestmark = pytest.mark.local

HERE = Path(__file__).resolve().parent
COMMIT_EVERY = 4  # digits commits every 4 batches and at the end of each epoch


class MiniController:
    """Just enough of a controller for one job: its spec, its reports and outcome, and the rendezvous."""

    def __init__(self, run_dir: Path, **runtime_kw: Any):
        from pilotfill.elastic.torch.runtime import TorchRuntime

        self.run_dir = run_dir
        self.server = Server(run_dir, create_secret(run_dir))
        self.server.publish()
        self.launcher = LocalLauncher(run_dir / "logs")
        self.probe_log = run_dir / "probe.jsonl"
        env = {"PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]), "PROBE_LOG": str(self.probe_log)}
        self.runtime = TorchRuntime(run_dir, self.launcher, agent_env=env, **runtime_kw)
        self.lock = threading.RLock()
        self.jobs: dict[str, dict[str, Any]] = {}
        self.samples: dict[str, float] = {}
        self.exits: list[RankExit] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        self.runtime.wait_for_store()

    # -------------------------------------------------------------- what a test does

    def submit(self, job_id: str, hosts: list[str], lo: int = 1, hi: int = 3, **kwargs: Any) -> str:
        spec = {"name": job_id, "entry": "torch_probe:train", "args": [], "kwargs": {"step_delay_s": 0.02, **kwargs}, "min_nodes": lo, "max_nodes": hi}
        with self.lock:
            self.jobs[job_id] = {"id": job_id, "spec": spec, "status": "running", "result": None, "error": None}
            self.runtime.start(job_id, spec, hosts)
        return job_id

    def resize(self, job_id: str, hosts: list[str]) -> None:
        with self.lock:
            self.runtime.resize(job_id, hosts)

    def status(self, job_id: str) -> str:
        with self.lock:
            return self.jobs[job_id]["status"]

    def probe(self) -> list[dict]:
        """What the ranks logged (tests/torch_probe.py)."""
        try:
            with open(self.probe_log) as f:
                return [json.loads(line) for line in f if line.endswith("\n")]
        except FileNotFoundError:
            return []

    def wait_for(self, predicate, timeout_s: float, what: str):
        return wait_for(predicate, timeout_s, what, detail=self.log_tail)

    def log_tail(self, chars: int = 4000) -> str:
        out = []
        for path in sorted((self.run_dir / "logs").glob("*.log")):
            out.append(f"--- {path.name}\n{path.read_text(errors='replace')[-chars:]}")
        return "\n".join(out)

    def close(self) -> None:
        with self.lock:
            self.runtime.close()
        self._stop.set()
        self._thread.join(10)
        self.launcher.close()
        self.server.close()

    # -------------------------------------------------------------- the controller's side

    def _serve(self) -> None:
        while not self._stop.is_set():
            self.server.serve(self._handle, 20)
            with self.lock:
                for exit_ in self.runtime.poll():
                    self.exits.append(exit_)

    def _handle(self, message: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            kind = message.get("type", "")
            if kind.startswith("rdzv."):
                return handle(self.runtime.rendezvous, message, time.time())
            job = self.jobs.get(message.get("job_id", ""))
            if job is None:
                return {"ok": False, "error": "no such job"}
            if kind == "job.get":
                return {"ok": True, "job": job}
            if kind == "job.report":
                self.samples[job["id"]] = self.samples.get(job["id"], 0.0) + message["samples"]
                return {"ok": True, "progress": self.samples[job["id"]]}
            if kind == "job.commit":  # rank 0 saved durably (ElasticState.commit)
                return {"ok": True, "committed": self.samples.get(job["id"], 0.0)}
            if kind == "job.describe":  # rank 0 described its model (ElasticState, on its first forward pass)
                self.described = {**getattr(self, "described", {}), job["id"]: message["model"]}
                return {"ok": True, "kept": True}
            if kind in ("job.result", "job.failed"):
                if job["status"] == "running":
                    job["status"] = "finished" if kind == "job.result" else "failed"
                    job["result"], job["error"] = message.get("value"), message.get("error")
                    self.runtime.stop(job["id"])
                return {"ok": True}
            return {"ok": False, "error": f"unknown message {kind!r}"}


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


def _processes_of(marker: bytes) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read()
            with open(f"/proc/{pid}/stat", "rb") as f:
                if f.read().split(b") ", 1)[1][:1] == b"Z":
                    continue
        except OSError:
            continue
        if b"PILOTFILL_RUN_DIR=" + marker in env:
            found.append(int(pid))
    return found


def _starts(events: list[dict], world: int | None = None) -> list[dict]:
    return [e for e in events if e["event"] == "start" and (world is None or e["world"] == world)]


def _training_at(ctl: MiniController, world: int, since: float) -> bool:
    """A commit was made by ``world`` ranks after ``since`` (restarted workers, or survivors re-formed in place)."""
    return any(e["event"] == "commit" and e["world"] == world and e["time"] > since for e in ctl.probe())


def _assert_resumed_from_last_commit(events: list[dict]) -> None:
    """Every restart resumed exactly at the last commit before it: the loss is under one commit interval.

    A rank stopped between saving a commit and logging it leaves that commit out of the log; the round that
    restores it proves it was made, so restored positions count as commits too (at most one such gap each)."""
    commits = [e for e in events if e["event"] == "commit"]
    restored = [(s["epoch"], s["batch"]) for s in _starts(events) if s["rank"] == 0 and s.get("restored")]
    positions = sorted({(c["epoch"], c["batch"]) for c in commits} | set(restored))
    logged = [(c["epoch"], c["batch"]) for c in commits]
    assert logged == sorted(logged), f"committed position went backwards: {logged}"
    for (e0, b0), (e1, b1) in zip(positions, positions[1:]):
        assert e1 > e0 or b1 - b0 <= COMMIT_EVERY, f"commits {e0, b0} and {e1, b1} are more than an interval apart"
    for start in _starts(events):
        if start["rank"] != 0:
            continue
        before = [(c["epoch"], c["batch"]) for c in commits if c["time"] < start["time"]]
        if before:
            at, last = (start["epoch"], start["batch"]), before[-1]
            unlogged = at > last and (at[0] > last[0] and at[1] <= COMMIT_EVERY or at[0] == last[0] and at[1] - last[1] <= COMMIT_EVERY)
            assert at == last or unlogged, f"round {start['round']} restored {at}, last commit {last}"


# ------------------------------------------------------------------ real training


@pytest.mark.parametrize("resize", ["restart", "in_place"])
def test_grow_1_2_3_and_shrink_back_keeps_training(cluster, tmp_path, resize):
    ctl = cluster(resize=resize)
    hold = tmp_path / "hold"  # it trains on while this exists: a busy machine's slow re-forms do not outlast its epochs
    hold.touch()
    job = ctl.submit("grow", ["n0"], epochs=30, hold_file=str(hold))
    ctl.wait_for(lambda: _training_at(ctl, 1, 0), 120, "training on one node")
    for hosts in (["n0", "n1"], ["n0", "n1", "n2"], ["n0", "n1"], ["n0"]):
        t = time.time()
        ctl.resize(job, hosts)
        ctl.wait_for(lambda: _training_at(ctl, len(hosts), t), 120, f"training on {hosts}")
        assert ctl.status(job) == "running"
    hold.unlink()
    ctl.wait_for(lambda: ctl.status(job) != "running", 240, "the job to finish")
    assert ctl.status(job) == "finished", ctl.jobs[job]["error"]
    assert ctl.jobs[job]["result"]["val_accuracy"] > 0.8
    events = ctl.probe()
    assert not [e for e in ctl.exits if e.crashed], ctl.exits
    if resize == "restart":
        assert ctl.jobs[job]["result"]["restored"] is True
        _assert_resumed_from_last_commit(events)
        assert {e["world"] for e in _starts(events)} == {1, 2, 3}
        return
    # In place: n0 trained in one process throughout, the joiners took the state from it, nothing was done twice.
    commits = [e for e in events if e["event"] == "commit"]
    assert {e["host"] for e in commits} == {"n0"} and len({e["pid"] for e in commits}) == 1, commits
    assert {e["world"] for e in commits} == {1, 2, 3}
    positions = [(e["epoch"], e["batch"]) for e in commits]
    assert positions == sorted(set(positions)), f"a commit was made again: {positions}"
    joined = [e for e in events if e["event"] == "joined"]
    assert sorted(e["host"] for e in joined) == ["n1", "n2"] and not any(e["from_disk"] for e in joined), joined
    assert not [e for e in _starts(events) if e["restored"]], "a worker restored a commit"


@pytest.mark.parametrize("resize", ["restart", "in_place"])
def test_a_killed_node_costs_the_node_not_the_job(cluster, resize):
    ctl = cluster(resize=resize)
    job = ctl.submit("sturdy", ["n0", "n1"], epochs=14)
    ctl.wait_for(lambda: _training_at(ctl, 2, 0), 120, "training on two nodes")
    time.sleep(0.5)  # mid-step
    pid = ctl.launcher.pid("n1", job)
    assert pid is not None
    killed_at = time.time()
    os.killpg(pid, signal.SIGKILL)
    ctl.wait_for(lambda: any(e.host == "n1" and e.crashed for e in ctl.exits), 60, "the lost node to be reported")
    assert ctl.runtime.hosts(job) == ["n0"]
    ctl.wait_for(lambda: _training_at(ctl, 1, killed_at), 120, "the survivor to train alone")
    ctl.wait_for(lambda: ctl.status(job) != "running", 240, "the job to finish")
    assert ctl.status(job) == "finished", ctl.jobs[job]["error"]
    events = ctl.probe()
    _assert_resumed_from_last_commit(events)
    if resize == "in_place":
        # A hard loss: the survivor went back to its last commit — the one its node held in memory, not the file.
        again = [e for e in _starts(events) if e["time"] > killed_at]
        assert again and all(e["restored"] == "memory" for e in again), again


def test_ranks_per_node_gives_each_rank_its_local_rank(cluster):
    ctl = cluster(ranks_per_node=2)
    job = ctl.submit("wide", ["n0", "n1"], epochs=2)
    ctl.wait_for(lambda: ctl.status(job) != "running", 240, "the job to finish")
    assert ctl.status(job) == "finished", ctl.jobs[job]["error"]
    starts = _starts(ctl.probe())
    first = [e for e in starts if e["round"] == min(s["round"] for s in starts)]
    assert sorted(e["rank"] for e in first) == [0, 1, 2, 3]
    assert {e["world"] for e in first} == {4} and {e["local_world"] for e in first} == {2}
    for host in ("n0", "n1"):
        assert sorted(e["local_rank"] for e in first if e["host"] == host) == [0, 1]


def test_gpus_per_node_binds_each_rank_to_its_own_device(cluster):
    ctl = cluster(ranks_per_node=2, gpus_per_node=2)
    job = ctl.submit("gpus", ["n0"], epochs=1)
    ctl.wait_for(lambda: ctl.status(job) != "running", 240, "the job to finish")
    assert ctl.status(job) == "finished", ctl.jobs[job]["error"]
    starts = _starts(ctl.probe())
    assert {(e["local_rank"], e["cuda"]) for e in starts} == {(0, "0"), (1, "1")}


# ------------------------------------------------------------------ the rendezvous's door


def test_a_join_without_the_secret_is_dropped_and_never_a_member(tmp_path):
    run_dir = tmp_path / "run"
    server = Server(run_dir, create_secret(run_dir))
    server.publish()
    book = RendezvousBook()
    book.set_store("127.0.0.1", 1)
    book.expect("j", ["n0", "n1"], 0.0)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            server.serve(lambda m: handle(book, m, time.time()), 20)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        intruder = Client(run_dir, timeout_s=1.5, key=b"0" * 64)
        with pytest.raises(ControllerUnavailable):
            intruder.request({"type": "rdzv.join", "job_id": "j", "host": "n1", "last_round": -1})
        intruder.close()
        assert server.dropped >= 1
        assert book.round("j").joined == set()
        member = Client(run_dir, timeout_s=10)
        assert member.request({"type": "rdzv.join", "job_id": "j", "host": "n0", "last_round": -1})["state"] == "wait"
        outsider = member.request({"type": "rdzv.join", "job_id": "j", "host": "n9", "last_round": -1})
        assert outsider["state"] == "ended" and "store" not in outsider
        assert book.round("j").joined == {"n0"}
        member.close()
    finally:
        stop.set()
        thread.join(5)
        server.close()


# ------------------------------------------------------------------ the book (pure)


def _book(hosts=("a", "b")) -> RendezvousBook:
    book = RendezvousBook(token=iter(f"p{i}" for i in range(100)).__next__)
    book.set_store("ctl", 4242)
    book.expect("j", list(hosts), 0.0)
    return book


def test_a_round_closes_when_every_allocated_host_has_joined():
    book = _book()
    assert book.join("j", "a", -1, 1.0) == {"state": "wait", "round": 1}
    closed = book.join("j", "b", -1, 1.5)
    assert closed["state"] == "closed" and closed["rank"] == 1 and closed["world_size"] == 2
    assert closed["store"] == {"host": "ctl", "port": 4242, "prefix": "p0"}
    assert book.join("j", "a", -1, 2.0)["rank"] == 0  # asking again is answered again
    assert book.round("j").closed_at == 1.5


def test_no_round_closes_before_the_store_is_known():
    book = RendezvousBook()
    book.expect("j", ["a"], 0.0)
    assert book.join("j", "a", -1, 1.0)["state"] == "wait"
    book.set_store("ctl", 1)
    assert book.join("j", "a", -1, 2.0)["state"] == "closed"


def test_growing_keeps_training_until_the_new_host_is_there():
    book = _book(["a"])
    assert book.join("j", "a", -1, 1.0)["state"] == "closed"
    book.expect("j", ["a", "b"], 2.0)
    assert book.poll("j", "a", 1)["waiting"] == 0  # b's agent is still starting
    assert book.join("j", "b", -1, 3.0)["state"] == "wait"
    assert book.poll("j", "a", 1) == {"waiting": 1, "current": 2, "member": True, "same_hosts": False}
    rejoin = book.join("j", "a", 1, 3.5)
    assert rejoin["state"] == "closed" and rejoin["round"] == 2 and rejoin["rank"] == 0 and rejoin["store"]["prefix"] == "p1"


def test_shrinking_is_noticed_at_once_and_keeps_the_old_order():
    book = _book(["a", "b", "c"])
    for h in "abc":
        book.join("j", h, -1, 1.0)
    book.expect("j", ["c", "a"], 2.0)
    assert book.poll("j", "a", 1)["waiting"] == 1
    assert book.poll("j", "b", 1) == {"waiting": 1, "current": 2, "member": False, "same_hosts": False}
    assert book.join("j", "b", 1, 2.1) == {"state": "ended"}
    book.join("j", "c", 1, 2.2)
    assert book.join("j", "a", 1, 2.3)["hosts"] == ["a", "c"]


def test_failed_workers_re_form_the_same_hosts():
    book = _book()
    book.join("j", "a", -1, 1.0)
    book.join("j", "b", -1, 1.0)
    assert book.poll("j", "b", 1)["waiting"] == 0
    assert book.join("j", "a", 1, 2.0) == {"state": "wait", "round": 2}  # a's workers failed
    assert book.poll("j", "b", 1)["waiting"] == 1
    assert book.poll("j", "b", 1)["same_hosts"] is True  # a re-form after a failure, not the controller's change
    assert book.join("j", "b", 1, 2.5)["round"] == 2


def test_expect_is_idempotent_and_forget_ends_the_agents():
    book = _book()
    book.expect("j", ["b", "a"], 5.0)
    assert book.round("j").number == 1
    book.forget("j")
    assert book.join("j", "a", 1, 6.0) == {"state": "ended"}
    assert book.poll("j", "a", 1)["member"] is False


def test_handle_checks_fields():
    book = _book()
    assert handle(book, {"type": "rdzv.poll", "job_id": "j", "host": "a", "round": 1}, 0.0)["ok"] is True
    with pytest.raises(ValueError):
        handle(book, {"type": "rdzv.join", "job_id": "j", "host": "a", "last_round": "1"}, 0.0)


# ------------------------------------------------------------------ the launcher


def test_local_launcher_terminates_with_a_grace_and_reports_exits(tmp_path):
    launcher = LocalLauncher(tmp_path, grace_s=1.0)
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    launcher.launch("h0", "j", [os.sys.executable, "-c", stubborn], {})
    launcher.launch("h1", "j", [os.sys.executable, "-c", "import os; print(os.environ['PILOTFILL_HOST']); raise SystemExit(3)"], {})
    deadline = time.time() + 30
    while "up" not in (tmp_path / "j.h0.log").read_text() and time.time() < deadline:
        time.sleep(0.05)
    launcher.terminate("h0", "j")
    exits: list = []
    while len(exits) < 2 and time.time() < deadline:
        exits += launcher.exits()
        time.sleep(0.05)
    by_host = {e.host: e for e in exits}
    assert by_host["h0"].requested and by_host["h0"].returncode == -signal.SIGKILL
    assert not by_host["h1"].requested and by_host["h1"].returncode == 3
    assert (tmp_path / "j.h1.log").read_text().strip() == "h1"
    launcher.close()
