"""How fast nodes turn into training and back: pilotfill on the local cluster vs bare Elastic Horovod.

Measured in one run, as medians over repeats, and printed side by side with
their ratio (the machine is shared and noisy: compare within a run):

* grow:   a node joins (pilotfill: its pilot registers; bare: the host is added
          to the discovery file) -> a rank on it has done a training step
          (pilotfill: its first ``report`` reaches the controller; bare: the
          rank writes the time of its first step);
* shrink: a node leaves (pilotfill: the pilot's SIGTERM arrives as
          ``pilot.leaving``; bare: the host is removed from the file) -> no
          process of the rank on that node is left.

Both train the same model (MLP on digits, ``pilotfill.workloads.digits``) with
the same horovodrun options and the same local ssh stand-in. Measured here
before pilotfill existed: bare Elastic Horovod 4.9 s to grow, 1.2 s to shrink.

    python benchmarks/bench_elastic.py [--repeats 5]
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
import pilotfill.workloads.digits as d
real = d.report
def report(samples):
    host = os.environ.get("PILOTFILL_HOST", "?")
    if host not in first:
        first[host] = time.time()
        with open(os.environ["BENCH_FIRST_STEPS"], "a") as f:
            f.write(json.dumps({"host": host, "time": first[host], "pid": os.getpid()}) + "\\n")
d.report = report
digits.train(epochs=10_000, step_delay_s=0.05, durable=False)
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


def pilotfill_run(repeats: int, root: Path) -> tuple[list[float], list[float]]:
    """The same through pilotfill: the main workload frees and takes back pf-node-1."""
    period = 22.0
    script = []
    for i in range(repeats):
        script.append((12.0 + i * period, "pf-node-1", "idle"))
        script.append((12.0 + i * period + period / 2, "pf-node-1", "busy"))
    items = ", ".join(f'{{ at = {at}, node = "{node}", state = "{state}" }}' for at, node, state in [(0.0, "pf-node-1", "busy"), *script])
    config = root / "pilotfill.toml"
    config.write_text(
        f"""scheduler = "local"
[local]
nodes = 2
workload = "script"
script = [{items}]
[pilots]
heartbeat_s = 0.5
heartbeat_deadline_s = 3.0
grace_s = 5.0
[controller]
tick_s = 0.05
[runtime]
kind = "horovod"
"""
    )
    run_dir = root / "run"
    ctl = subprocess.Popen([sys.executable, "-m", "pilotfill.controller", "--run-dir", str(run_dir), "--config", str(config)],
                           stdout=open(root / "controller.out", "wb"), stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        wait_until(lambda: (run_dir / "controller.json").exists() and json.loads((run_dir / "controller.json").read_text())["pid"] == ctl.pid, 30, 0.1)
        client = ControllerClient(run_dir)
        spec = {
            "name": "bench", "entry": "pilotfill.workloads.digits:train", "kwargs": {"epochs": 10_000, "step_delay_s": 0.05, "durable": False},
            "min_nodes": 1, "max_nodes": 2, "curve": {"nodes": [0, 1, 2], "samples_per_s": [0, 300, 600]},
            "scale_up_cost_s": 2.0, "scale_down_cost_s": 1.0,
        }  # fmt: skip
        job = client.submit(spec)
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
        contributing = [e for e in state.events("rank.contributing") if e["node"] == "pf-node-1"]
        state.close()
        grow = []
        for j in joins:
            nxt = [c["time"] for c in contributing if c["time"] >= j["time"]]
            if nxt:
                grow.append(nxt[0] - j["time"])
        return grow, gone
    finally:
        ctl.send_signal(signal.SIGTERM)
        ctl.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="pf-bench-") as tmp:
        root = Path(tmp)
        b_grow, b_shrink = bare(args.repeats, root)
        p_grow, p_shrink = pilotfill_run(args.repeats, root)
    med = statistics.median
    print(f"{'':34}{'bare Elastic Horovod':>22}{'pilotfill':>12}{'ratio':>8}")
    print(f"{'grow: join -> new rank contributing':34}{med(b_grow):>20.2f} s{med(p_grow):>10.2f} s{med(p_grow) / med(b_grow):>8.2f}")
    print(f"{'shrink: leave -> rank gone':34}{med(b_shrink):>20.2f} s{med(p_shrink):>10.2f} s{med(p_shrink) / med(b_shrink):>8.2f}")
    print(f"samples: bare grow {[round(x, 2) for x in b_grow]}, shrink {[round(x, 2) for x in b_shrink]}")
    print(f"         pilotfill grow {[round(x, 2) for x in p_grow]}, shrink {[round(x, 2) for x in p_shrink]}")


if __name__ == "__main__":
    main()
