"""How fast nodes turn into training and back: pilotfill vs bare Elastic Horovod, and vs bare torchrun.

Measured in one run, as medians over repeats, and printed side by side with
their ratio (the machine is shared and noisy: compare within a run):

Horovod (``runtime.kind = "horovod"``, through the real controller):

* grow:   a node joins (pilotfill: its pilot registers; bare: the host is added
          to the discovery file) -> a rank on it has done a training step
          (the rank writes the time of its first step);
* shrink: a node leaves (pilotfill: the pilot's SIGTERM arrives as
          ``pilot.leaving``; bare: the host is removed from the file) -> no
          process of the rank on that node is left.

Both train the same model (MLP on digits, ``pilotfill.workloads.digits``) with
the same horovodrun options and the same local ssh stand-in. Measured here
before pilotfill existed: bare Elastic Horovod 4.9 s to grow, 1.2 s to shrink.

torch elastic (``runtime.kind = "torch"``): bare ``torchrun`` (c10d rendezvous,
two agents on this host, gloo; ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, without
which a scale-up deadlocks in torch 2.13), then pilotfill's torch runtime through
the real controller and the local cluster's pilot agents, once with every worker
restarted on a change (``PILOTFILL_TORCH_RESIZE=restart``: torch elastic's way)
and once in place (the default: workers outlive the change), side by side in one
run, all training digits with plain torch.distributed:

* grow:   the second node joins (bare: its agent is started; pilotfill: its
          pilot registers, warm) -> the first training step on it;
* pause:  during that grow, how long the rank already training stood still
          (its last step at size 1 -> its first step at size 2);
* shrink: the second node leaves (bare: SIGTERM to its agent's process group;
          pilotfill: its pilot's SIGTERM, a preemption with a 5 s grace, or a
          release: the controller gives the node to a job that earns more on it)
          -> the remaining rank's first step at size 1 (the survivor's pause);
* restarted: surviving workers whose process changed (pids on the first node);
* redone: global batches trained twice (every rank logs each step it trains:
          its epoch and offset), in samples.

pilotfill's Elastic Horovod runtime goes through the same changes, printed as a
third column: its workers stay through a reset (``hvd.elastic.run``), and what a
release or a graceful preemption costs it is read from the same step logs.

    python benchmarks/bench_elastic.py [--repeats 5] [--only all|horovod|torch|pilotfill-torch]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pilotfill import procs
from pilotfill.client import ControllerClient
from pilotfill.journal import Journal

HERE = Path(__file__).resolve().parent
WORKER = """
import os, sys, time, json
sys.argv = ["worker"]
from pilotfill.workloads import digits
first = {}
def step(batch):
    host = os.environ.get("PILOTFILL_HOST", "?")
    if host not in first:
        first[host] = time.time()
        with open(os.environ["BENCH_FIRST_STEPS"], "a") as f:
            f.write(json.dumps({"host": host, "time": first[host], "pid": os.getpid()}) + "\\n")
digits.train(epochs=10_000, step_delay_s=0.05, durable=False, on_step=step)
"""


def rank_alive(host: str, marker: str) -> bool:
    return bool(procs.with_environment(PILOTFILL_HOST=host, BENCH_MARKER=marker))


def wait_until(pred, timeout_s: float, poll_s: float = 0.02) -> float:
    end = time.time() + timeout_s
    while time.time() < end:
        if pred():
            return time.time()
        time.sleep(poll_s)
    raise TimeoutError


def bare(repeats: int, root: Path) -> tuple[list[float], list[float]]:
    """Elastic Horovod alone: grow and shrink by editing the discovery file."""
    work = root / "bare"
    (work / "bin").mkdir(parents=True)
    ssh = work / "bin" / "ssh"
    ssh.write_text(f'#!/bin/sh\nexec {sys.executable} -m pilotfill.elastic.local_ssh "$@"\n')
    ssh.chmod(0o700)
    hosts = work / "hosts"
    hosts.write_text("pf-node-0:1\n")
    script = work / "discover.sh"
    script.write_text(f"#!/bin/sh\nexec cat {hosts}\n")
    script.chmod(0o700)
    (work / "worker.py").write_text(WORKER)
    steps = work / "first-steps.jsonl"
    steps.touch()
    marker = f"bare-{os.getpid()}"
    env = {**os.environ, "PATH": f"{work / 'bin'}{os.pathsep}{os.environ['PATH']}", "BENCH_FIRST_STEPS": str(steps), "BENCH_MARKER": marker}
    horovodrun = shutil.which("horovodrun", path=os.path.dirname(sys.executable))
    argv = [horovodrun, "-np", "1", "--min-np", "1", "--max-np", "2", "--host-discovery-script", str(script), "--gloo",
            "--network-interfaces", "lo", "--blacklist-cooldown-range", "5", "15", "--elastic-timeout", "600",
            sys.executable, str(work / "worker.py")]  # fmt: skip
    proc = procs.spawn(argv, env=env, log_path=str(work / "horovodrun.log"), cwd=str(work))
    grow, shrink = [], []
    try:
        wait_until(lambda: "pf-node-0" in steps.read_text(), 120)
        for _ in range(repeats):
            seen = steps.read_text().count("pf-node-1")
            t0 = time.time()
            hosts.write_text("pf-node-0:1\npf-node-1:1\n")
            t1 = wait_until(lambda: steps.read_text().count("pf-node-1") > seen, 120)
            grow.append(t1 - t0)
            time.sleep(3)
            t2 = time.time()
            hosts.write_text("pf-node-0:1\n")
            t3 = wait_until(lambda: not rank_alive("pf-node-1", marker), 60)
            shrink.append(t3 - t2)
            time.sleep(3)
    finally:
        procs.kill_group(proc.pid, grace_s=2)
        for pid in procs.with_environment(BENCH_MARKER=marker):
            procs.kill_pid(pid)
    return grow, shrink


# A job entry that logs every training step of its rank (host, world size, time) to $BENCH_STEPS.
STEP_WORKER = """
import json, os, time
from pilotfill.workloads import digits
def step(batch):
    with open(os.environ["BENCH_STEPS"], "a") as f:
        f.write(json.dumps({"host": os.environ.get("PILOTFILL_HOST", "?"), "world": batch.world, "time": time.time(), "pid": os.getpid(), "start": batch.start, "epoch": batch.epoch, "rank": batch.rank, "size": batch.size, "job": os.environ.get("PILOTFILL_JOB_ID")}) + "\\n")
def train(**kwargs):
    return digits.train(on_step=step, **kwargs)
if __name__ == "__main__":
    train(epochs=10_000, step_delay_s=0.05, durable=False)
"""


def pilotfill_run(repeats: int, root: Path) -> tuple[list[float], list[float]]:
    """The same through pilotfill: the main workload frees and takes back pf-node-1."""
    period = 22.0
    (root / "bench_worker.py").write_text(STEP_WORKER)
    steps = Steps(root / "horovod-steps.jsonl")
    run_dir, ctl = start_controller(root, steps, kind="horovod", repeats=repeats, first_s=12.0, period=period, heartbeat_s=0.5, deadline_s=3.0)
    try:
        client = ControllerClient(run_dir)
        job = client.submit(bench_job(durable=False))
        gone: list[float] = []

        def watch_leaves() -> None:
            # Record, for each leaving of pf-node-1, when its rank's last process exited.
            state = Journal(run_dir, readonly=True)
            leaving = [e for e in state.events("node.leaving") if e["node"] == "pf-node-1"]
            state.close()
            if len(leaving) > len(gone):
                t = wait_until(lambda: not procs.with_environment(PILOTFILL_HOST="pf-node-1", PILOTFILL_JOB_ID=job), 30)
                gone.append(t - leaving[len(gone)]["time"])

        end = time.time() + 12.0 + repeats * period + 10
        while time.time() < end:
            watch_leaves()
            time.sleep(0.02)
        client.cancel(job)
        state = Journal(run_dir, readonly=True)
        joins = [e for e in state.events("node.joined") if e["node"] == "pf-node-1"]
        state.close()
        grow = []
        for j in joins:
            first = steps.first("pf-node-1", None, j["time"])
            if first is not None:
                grow.append(first["time"] - j["time"])
        return grow, gone
    finally:
        ctl.send_signal(signal.SIGTERM)
        ctl.wait(30)


class Steps:
    """Every training step of every rank, read incrementally from the JSON lines the ranks append."""

    def __init__(self, path: Path):
        self.path = path
        self.path.touch()
        self.rows: list[dict] = []
        self._offset = 0

    def read(self) -> list[dict]:
        with open(self.path) as f:
            f.seek(self._offset)
            chunk = f.read()
        complete = chunk[: chunk.rfind("\n") + 1]
        self._offset += len(complete)
        self.rows += [json.loads(line) for line in complete.splitlines() if line]
        return self.rows

    def first(self, host: str, world: int | None, after: float) -> dict | None:
        """The first step of ``host`` after ``after`` (at size ``world``, unless None)."""
        return next((r for r in self.read() if r["host"] == host and world in (None, r["world"]) and r["time"] > after), None)

    def wait_first(self, host: str, world: int, after: float, timeout_s: float) -> float:
        end = time.time() + timeout_s
        while time.time() < end:
            row = self.first(host, world, after)
            if row is not None:
                return row["time"]
            time.sleep(0.02)
        raise TimeoutError(f"no step of {host} at size {world} within {timeout_s:.0f} s")

    def last_before(self, host: str, world: int, before: float) -> float:
        times = [r["time"] for r in self.read() if r["host"] == host and r["world"] == world and r["time"] < before]
        return max(times) if times else float("nan")



def start_controller(work: Path, steps: "Steps", kind: str, repeats: int, first_s: float, period: float, heartbeat_s: float,
                     deadline_s: float, idle_at_end: bool = False) -> tuple[Path, subprocess.Popen]:  # fmt: skip
    """A real controller on a 2-node local cluster whose main workload frees pf-node-1 at ``first_s`` and then
    every ``period`` (taking it back half a period later), ``repeats`` times (``idle_at_end``: and frees it once more,
    for good); returns its run dir once it serves."""
    script = [(0.0, "pf-node-1", "busy")]
    for i in range(repeats):
        script += [(first_s + i * period, "pf-node-1", "idle"), (first_s + i * period + period / 2, "pf-node-1", "busy")]
    if idle_at_end:
        script.append((first_s + repeats * period, "pf-node-1", "idle"))
    items = ", ".join(f'{{ at = {at}, node = "{node}", state = "{state}" }}' for at, node, state in script)
    config = work / "pilotfill.toml"
    config.write_text(
        f"""scheduler = "local"
[local]
nodes = 2
workload = "script"
script = [{items}]
[pilots]
heartbeat_s = {heartbeat_s}
heartbeat_deadline_s = {deadline_s}
grace_s = 5.0
[controller]
tick_s = 0.05
[runtime]
kind = "{kind}"
"""
    )
    run_dir = work / "run"
    env = {**os.environ, "BENCH_STEPS": str(steps.path), "PYTHONPATH": os.pathsep.join([str(work), os.environ.get("PYTHONPATH", "")])}
    ctl = subprocess.Popen([sys.executable, "-m", "pilotfill.controller", "--run-dir", str(run_dir), "--config", str(config)], env=env,
                           stdout=open(work / "controller.out", "wb"), stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        wait_until(lambda: (run_dir / "controller.json").exists() and json.loads((run_dir / "controller.json").read_text())["pid"] == ctl.pid, 30, 0.1)
    except BaseException:
        ctl.kill()
        raise
    return run_dir, ctl


def bench_job(durable: bool) -> dict:
    """The job both pilotfill measurements train: digits on 1 or 2 nodes, stepping every 50 ms."""
    return {
        "name": "bench", "entry": "bench_worker:train", "kwargs": {"epochs": 10_000, "step_delay_s": 0.05, "durable": durable},
        "min_nodes": 1, "max_nodes": 2, "curve": {"nodes": [0, 1, 2], "samples_per_s": [0, 300, 600]},
        "scale_up_cost_s": 2.0, "scale_down_cost_s": 1.0,
    }  # fmt: skip

def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_bare(repeats: int, root: Path) -> dict[str, list[float]]:
    """torchrun alone: two agents (c10d, gloo) on this host; the second one comes and goes."""
    work = root / "torchrun"
    work.mkdir()
    (work / "bench_worker.py").write_text(STEP_WORKER)
    steps = Steps(work / "steps.jsonl")
    marker = f"bench-torchrun-{os.getpid()}"
    port = free_port()
    env = {**os.environ, "BENCH_STEPS": str(steps.path), "BENCH_MARKER": marker, "PILOTFILL_RUNTIME": "torch",
           "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "PYTHONUNBUFFERED": "1"}  # fmt: skip
    for key in ("PILOTFILL_JOB_ID", "PILOTFILL_RUN_DIR"):
        env.pop(key, None)
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1:2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "bench", "--max-restarts", "1000", str(work / "bench_worker.py")]  # fmt: skip

    def agent(host: str):
        return procs.spawn(argv, env={**env, "PILOTFILL_HOST": host}, log_path=str(work / f"{host}.log"), cwd=str(work))

    out: dict[str, list[float]] = {"grow": [], "pause": [], "shrink": []}
    a = agent("pf-node-0")
    b = None
    try:
        steps.wait_first("pf-node-0", 1, 0, 180)  # the first round waits out last_call_timeout (30 s)
        for _ in range(repeats):
            t0 = time.time()
            b = agent("pf-node-1")
            t1 = steps.wait_first("pf-node-1", 2, t0, 300)
            out["grow"].append(t1 - t0)
            resumed = steps.wait_first("pf-node-0", 2, t0, 300)
            out["pause"].append(resumed - steps.last_before("pf-node-0", 1, resumed))
            time.sleep(3)
            t2 = time.time()
            procs.kill_group(b.pid, grace_s=5)
            b.wait()
            b = None
            t3 = steps.wait_first("pf-node-0", 1, t2, 300)
            out["shrink"].append(t3 - t2)
            time.sleep(3)
    except TimeoutError as exc:
        print(f"bare torchrun: {exc}; see {work}", file=sys.stderr)
    finally:
        for p in (a, b):
            if p is not None:
                procs.kill_group(p.pid, grace_s=3)
                p.wait()
        for pid in procs.with_environment(BENCH_MARKER=marker):
            procs.kill_pid(pid)
    return out


RELEASED = {"name": "greedy", "entry": "bench_worker:train", "kwargs": {"epochs": 10_000, "step_delay_s": 0.05, "durable": False},
            "min_nodes": 1, "max_nodes": 1, "curve": {"nodes": [0, 1], "samples_per_s": [0, 5000]}, "scale_up_cost_s": 1.0,
            "scale_down_cost_s": 1.0, "costs_known": True}  # fmt: skip
"""A job that earns far more on a node than the bench job: the controller releases one of the bench job's nodes to it."""


def pilotfill_changes(repeats: int, root: Path, kind: str, resize: str | None = None) -> dict[str, list[float]]:
    """pilotfill's runtime ``kind`` (``torch``, with ``resize`` ``restart`` or ``in_place``; or ``horovod``), the path
    that runs: the real controller, the local cluster's pilot agents starting the ranks. The main workload frees and
    takes back pf-node-1 ``repeats`` times (a preemption with a grace), then the controller releases it ``repeats``
    times to a job that earns more, and gives it back when that one is cancelled."""
    work = root / f"pilotfill-{kind}-{resize or 'elastic'}"
    work.mkdir()
    (work / "bench_worker.py").write_text(STEP_WORKER)
    steps = Steps(work / "steps.jsonl")
    period = 24.0
    if resize:
        os.environ["PILOTFILL_TORCH_RESIZE"] = resize  # the controller's runtime: every agent it starts resizes this way
    try:
        run_dir, ctl = start_controller(work, steps, kind=kind, repeats=repeats, first_s=15.0, period=period, heartbeat_s=1.0, deadline_s=10.0,
                                        idle_at_end=True)  # fmt: skip
    finally:
        os.environ.pop("PILOTFILL_TORCH_RESIZE", None)
    out: dict[str, list[float]] = {k: [] for k in ("grow", "pause", "shrink", "release", "regrow", "regrow_pause", "restarted", "redone", "redone_preempt",
                                                    "redone_release")}  # fmt: skip
    try:
        client = ControllerClient(run_dir)
        job = client.submit(bench_job(durable=True))
        time.sleep(15.0 + repeats * period + 6)
        preempted_until = time.time()
        releases: list[tuple[float, float]] = []  # (released, given back) times
        for _ in range(repeats):
            wait_until(lambda: _nodes_of(client, job) == 2, 120, 0.2)
            since = time.time()
            wait_until(lambda: steps.first("pf-node-0", 2, since) is not None, 120, 0.1)  # trains at two (a grow back is done)
            time.sleep(3)
            greedy = client.submit(RELEASED)
            t0 = time.time()
            wait_until(lambda: _nodes_of(client, job) == 1, 120, 0.1)
            wait_until(lambda: steps.first("pf-node-1", 1, t0) is not None, 120, 0.1)  # the greedy job trains there
            time.sleep(3)
            t1 = time.time()
            client.cancel(greedy)
            wait_until(lambda: _nodes_of(client, job) == 2, 120, 0.1)
            releases.append((t0, t1))
        time.sleep(5)
        client.cancel(job)
        state = Journal(run_dir, readonly=True)
        joins = [e["time"] for e in state.events("node.joined") if e["node"] == "pf-node-1"]
        leaves = [e["time"] for e in state.events("node.leaving") if e["node"] == "pf-node-1"]
        resized = [e for e in state.events("job.resized") if e["job"] == job]
        state.close()
        mine = [r for r in steps.read() if r.get("job") == job]
        for t in joins:
            _grow(steps, mine, t, out["grow"], out["pause"])
        for t in leaves:
            first = _first(mine, "pf-node-0", 1, t)
            if first is not None:
                out["shrink"].append(first["time"] - _last_before(mine, "pf-node-0", 2, first["time"]))
        for released, back in releases:
            down = next((e["time"] for e in resized if e["time"] >= released and e["data"]["after"] == 1), None)
            up = next((e["time"] for e in resized if e["time"] >= back and e["data"]["after"] == 2), None)
            first = _first(mine, "pf-node-0", 1, down) if down is not None else None
            if first is not None:
                out["release"].append(first["time"] - _last_before(mine, "pf-node-0", None, first["time"]))
            if up is not None:
                _grow(steps, mine, up, out["regrow"], out["regrow_pause"])
        out["restarted"] = [len({r["pid"] for r in mine if r["host"] == "pf-node-0"}) - 1]
        out["redone"] = [_redone(mine)]
        out["redone_preempt"] = [_redone([r for r in mine if r["time"] <= preempted_until])]
        out["redone_release"] = [out["redone"][0] - out["redone_preempt"][0]]
    finally:
        ctl.send_signal(signal.SIGTERM)
        ctl.wait(60)
    return out


def _nodes_of(client: ControllerClient, job: str) -> int:
    return len(client.job(job).get("nodes") or [])


def _first(rows: list[dict], host: str, world: int, after: float) -> dict | None:
    return next((r for r in rows if r["host"] == host and r["world"] == world and r["time"] > after), None)


def _last_before(rows: list[dict], host: str, world: int | None, before: float) -> float:
    """When ``host`` last stepped before ``before`` (at size ``world``; None: at any size)."""
    times = [r["time"] for r in rows if r["host"] == host and world in (None, r["world"]) and r["time"] < before]
    return max(times) if times else float("nan")


def _grow(steps: Steps, rows: list[dict], joined: float, grow: list[float], pause: list[float]) -> None:
    """A node joined the job at ``joined``: when it trained, and how long the survivor stood still meanwhile."""
    first = _first(rows, "pf-node-1", 2, joined)
    survivor = _first(rows, "pf-node-0", 2, joined)
    if first is not None:
        grow.append(first["time"] - joined)
    if survivor is not None:
        pause.append(survivor["time"] - _last_before(rows, "pf-node-0", 1, survivor["time"]))


def _redone(rows: list[dict]) -> float:
    """Samples of global batches trained more than once (rank 0 logs each step once each time it trains it)."""
    seen: dict[tuple[int, int], list[int]] = {}
    for r in rows:
        if r["rank"] == 0:
            seen.setdefault((r["epoch"], r["start"]), []).append(r["size"])
    return float(sum(sum(sizes[1:]) for sizes in seen.values()))


def _row(label: str, base: list[float], ours: list[float]) -> str:
    med = statistics.median
    b = f"{med(base):>20.2f} s" if base else f"{'-':>22}"
    o = f"{med(ours):>10.2f} s" if ours else f"{'-':>12}"
    ratio = f"{med(ours) / med(base):>8.2f}" if base and ours else f"{'-':>8}"
    return f"{label:44}{b}{o}{ratio}"


def _cell(xs: list[float], unit: str = "s") -> str:
    if not xs:
        return f"{'-':>14}"
    if unit == "s":
        return f"{statistics.median(xs):>6.2f} s (n={len(xs)})"
    return f"{xs[0]:>14.0f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--only", choices=("all", "horovod", "torch", "pilotfill-torch"), default="all",
                    help="horovod: bare Elastic Horovod against pilotfill's, and pilotfill's Horovod through every change; "
                         "pilotfill-torch: pilotfill's torch runtime, restarting and in place, beside its Horovod")
    args = ap.parse_args()
    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="pf-bench-") as tmp:
        root = Path(tmp)
        if args.only in ("all", "horovod"):
            results["horovod"] = (bare(args.repeats, root), pilotfill_run(args.repeats, root))
        if args.only in ("all", "torch"):
            results["torchrun"] = torchrun_bare(args.repeats, root)
        if args.only in ("all", "torch", "pilotfill-torch"):
            results["torch"] = {resize: pilotfill_changes(args.repeats, root, "torch", resize) for resize in ("restart", "in_place")}
        if args.only in ("all", "horovod", "pilotfill-torch"):
            results["changes_horovod"] = pilotfill_changes(args.repeats, root, "horovod")
    r = lambda xs: [round(x, 2) for x in xs]  # noqa: E731
    if "horovod" in results:
        (b_grow, b_shrink), (p_grow, p_shrink) = results["horovod"]
        print(f"{'':44}{'bare Elastic Horovod':>22}{'pilotfill':>12}{'ratio':>8}")
        print(_row("grow: join -> new rank contributing", b_grow, p_grow))
        print(_row("shrink: leave -> rank gone", b_shrink, p_shrink))
        print(f"samples: bare grow {r(b_grow)}, shrink {r(b_shrink)}")
        print(f"         pilotfill grow {r(p_grow)}, shrink {r(p_shrink)}")
    if "torchrun" in results:
        bare_t = results["torchrun"]
        print(f"bare torchrun (c10d): grow {_cell(bare_t['grow'])}, pause {_cell(bare_t['pause'])}, shrink {_cell(bare_t['shrink'])}")
        print(f"  samples {({k: r(v) for k, v in bare_t.items()})}")
    if "torch" in results or "changes_horovod" in results:
        ours = results.get("torch") or {}
        rows = [
            ("grow: a node joins -> it trains (target <= 2 s)", "grow", "s"),
            ("grow: survivor's pause (target <= 0.5 s)", "pause", "s"),
            ("shrink, preempted (grace 5 s): survivor's pause", "shrink", "s"),
            ("shrink, released: survivor's pause", "release", "s"),
            ("grow back onto a held node -> it trains", "regrow", "s"),
            ("grow back: survivor's pause", "regrow_pause", "s"),
            ("surviving workers restarted (target 0)", "restarted", "n"),
            ("samples redone, preemptions (target 0)", "redone_preempt", "n"),
            ("samples redone, releases (target 0)", "redone_release", "n"),
        ]
        columns = {f"torch, {resize.replace('_', ' ')}": got for resize, got in ours.items()}
        if "changes_horovod" in results:
            columns["Elastic Horovod"] = results["changes_horovod"]
        print(f"pilotfill's runtimes through the local cluster, {args.repeats} of each change (medians)")
        print(f"{'':50}" + "".join(f"{name:>18}" for name in columns))
        for label, key, unit in rows:
            print(f"{label:50}" + "".join(f"{_cell(got[key], unit):>18}" for got in columns.values()))
        for name, got in columns.items():
            print(f"  {name}: {({k: r(v) for k, v in got.items()})}")


if __name__ == "__main__":
    main()
