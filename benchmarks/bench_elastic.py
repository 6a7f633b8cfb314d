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
which a scale-up deadlocks in torch 2.13) against pilotfill's torch runtime
through the real controller and the local cluster's pilot agents (the main
workload frees and takes back a node), both training digits with plain
torch.distributed:

* grow:   the second node joins (bare: its agent is started; pilotfill: its
          pilot registers) -> the first training step on it;
* pause:  during that grow, how long the rank already training stood still
          (its last step at size 1 -> its first step at size 2);
* shrink: the second node leaves (bare: SIGTERM to its agent's process group;
          pilotfill: its pilot's SIGTERM, as a preemption) -> the remaining
          rank's first step at size 1.

    python benchmarks/bench_elastic.py [--repeats 5] [--only all|horovod|torch]
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
from pilotfill.state import State

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
        f.write(json.dumps({"host": os.environ.get("PILOTFILL_HOST", "?"), "world": batch.world, "time": time.time(), "pid": os.getpid(), "start": batch.start, "epoch": batch.epoch}) + "\\n")
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
            state = State(run_dir, readonly=True)
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
        state = State(run_dir, readonly=True)
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
                     deadline_s: float) -> tuple[Path, subprocess.Popen]:  # fmt: skip
    """A real controller on a 2-node local cluster whose main workload frees pf-node-1 at ``first_s`` and then
    every ``period`` (taking it back half a period later), ``repeats`` times; returns its run dir once it serves."""
    script = [(0.0, "pf-node-1", "busy")]
    for i in range(repeats):
        script += [(first_s + i * period, "pf-node-1", "idle"), (first_s + i * period + period / 2, "pf-node-1", "busy")]
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


def torch_pilotfill(repeats: int, root: Path) -> dict[str, list[float]]:
    """The same through pilotfill, the path that runs: the real controller, the local cluster's pilot agents
    starting torch elastic agents, the controller's rendezvous. The main workload frees and takes back pf-node-1."""
    work = root / "pilotfill-torch"
    work.mkdir()
    (work / "bench_worker.py").write_text(STEP_WORKER)
    steps = Steps(work / "steps.jsonl")
    period = 24.0
    run_dir, ctl = start_controller(work, steps, kind="torch", repeats=repeats, first_s=15.0, period=period, heartbeat_s=1.0, deadline_s=10.0)
    out: dict[str, list[float]] = {"grow": [], "pause": [], "shrink": []}
    try:
        client = ControllerClient(run_dir)
        job = client.submit(bench_job(durable=True))
        time.sleep(15.0 + repeats * period + 10)
        client.cancel(job)
        state = State(run_dir, readonly=True)
        joins = [e["time"] for e in state.events("node.joined") if e["node"] == "pf-node-1"]
        leaves = [e["time"] for e in state.events("node.leaving") if e["node"] == "pf-node-1"]
        state.close()
        for t in joins:
            first = steps.first("pf-node-1", 2, t)
            survivor = steps.first("pf-node-0", 2, t)
            if first is not None:
                out["grow"].append(first["time"] - t)
            if survivor is not None:
                out["pause"].append(survivor["time"] - steps.last_before("pf-node-0", 1, survivor["time"]))
        for t in leaves:
            first = steps.first("pf-node-0", 1, t)
            if first is not None:
                out["shrink"].append(first["time"] - t)
    finally:
        ctl.send_signal(signal.SIGTERM)
        ctl.wait(60)
    return out


def _row(label: str, base: list[float], ours: list[float]) -> str:
    med = statistics.median
    b = f"{med(base):>20.2f} s" if base else f"{'-':>22}"
    o = f"{med(ours):>10.2f} s" if ours else f"{'-':>12}"
    ratio = f"{med(ours) / med(base):>8.2f}" if base and ours else f"{'-':>8}"
    return f"{label:44}{b}{o}{ratio}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--only", choices=("all", "horovod", "torch"), default="all")
    args = ap.parse_args()
    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="pf-bench-") as tmp:
        root = Path(tmp)
        if args.only in ("all", "horovod"):
            results["horovod"] = (bare(args.repeats, root), pilotfill_run(args.repeats, root))
        if args.only in ("all", "torch"):
            results["torch"] = (torchrun_bare(args.repeats, root), torch_pilotfill(args.repeats, root))
    r = lambda xs: [round(x, 2) for x in xs]  # noqa: E731
    if "horovod" in results:
        (b_grow, b_shrink), (p_grow, p_shrink) = results["horovod"]
        print(f"{'':44}{'bare Elastic Horovod':>22}{'pilotfill':>12}{'ratio':>8}")
        print(_row("grow: join -> new rank contributing", b_grow, p_grow))
        print(_row("shrink: leave -> rank gone", b_shrink, p_shrink))
        print(f"samples: bare grow {r(b_grow)}, shrink {r(b_shrink)}")
        print(f"         pilotfill grow {r(p_grow)}, shrink {r(p_shrink)}")
    if "torch" in results:
        bare_t, ours = results["torch"]
        print(f"{'':44}{'bare torchrun (c10d)':>22}{'pilotfill':>12}{'ratio':>8}")
        print(_row("grow: node added -> its first step", bare_t["grow"], ours["grow"]))
        print(_row("grow: pause of the rank already training", bare_t["pause"], ours["pause"]))
        print(_row("shrink: node leaves -> training at new size", bare_t["shrink"], ours["shrink"]))
        print(f"samples: torchrun {({k: r(v) for k, v in bare_t.items()})}")
        print(f"         pilotfill {({k: r(v) for k, v in ours.items()})}")


if __name__ == "__main__":
    main()
