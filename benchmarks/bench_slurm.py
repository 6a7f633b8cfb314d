"""On a REAL Slurm whose every daemon is a host of its own: what rescaling costs a torch job, restarting its workers
and in place, and what a pilot training torch ranks costs the main workload, side by side in one run (issue 58).

The Slurm of the tests (tests/slurm_cluster.py with ``hosts=True``: slurmctld on ``pfctl``, slurmd on ``node1``…
``node4``, each a network and UTS namespace of its own; partition ``main`` preempts ``scavenger``, PreemptMode=CANCEL
with a GraceTime): pilots in ``scavenger``, main jobs in ``main`` pinned to a node (``-w``).

* resizes: a torch job of the README's shape (ElasticLoader, ElasticState, DDP; its ranks log every step) grows as
  one-node pilots start and shrinks as main jobs preempt them, once with ``PILOTFILL_TORCH_RESIZE=restart`` (every
  worker restarted on a change, torch elastic's way) and once in place (the default): the time until a joining node
  trains, the survivors' pause on a grow and on a shrink, surviving workers restarted, samples redone
  (:mod:`rescale_figures`);
* main-job delay: ``sbatch -p main -w NODE`` -> ``squeue`` shows it running, NODE held by a bare pilot (a script whose
  trap exits at once) and by a pilot whose torch ranks train; the median and the worst trial of each.

    sudo .venv/bin/python benchmarks/bench_slurm.py [--repeats 5] [--only all|resize|delay]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))

from bench_pbs import TORCH_STEPS  # noqa: E402
from rescale_figures import STEP_LOG, cell, figures, read_steps  # noqa: E402
from waiting import wait_for as wait  # noqa: E402

GRACE_S = 5
CONFIG = """scheduler = "slurm"
[slurm]
partition = "scavenger"
min_nodes = 1
max_nodes = 1
time_min = "00:05:00"
time_max = "00:30:00"
poll_s = 0.5
command_timeout_s = 20.0
[pilots]
heartbeat_s = 1.0
heartbeat_deadline_s = 15.0
grace_s = {grace}
nodes_per_pilot = 1
max_queued_pilots = 4
[controller]
tick_s = 0.2
bind = "0.0.0.0"
[runtime]
kind = "torch"
network_interface = "eth0"
"""


class Run:
    """``pilotfill run`` of a campaign on the login node ``pfctl``."""

    def __init__(self, cluster, root: Path, name: str, code: str, **env: str):
        self.cluster, self.dir = cluster, root / name
        self.dir.mkdir(parents=True)
        (self.dir / "site.toml").write_text(CONFIG.format(grace=float(GRACE_S)))
        (self.dir / "campaign.py").write_text(code)
        self.run_dir = self.dir / "run"
        with open(self.dir / "out", "wb") as out, open(self.dir / "err", "wb") as err:
            self.proc = cluster.popen([sys.executable, "-m", "pilotfill", "run", "campaign.py", "--config", "site.toml", "--run-dir", str(self.run_dir)],
                                      cwd=str(self.dir), stdout=out, stderr=err, start_new_session=True, env=env)  # fmt: skip

    def events(self, kind: str | None = None) -> list[dict]:
        from pilotfill.journal import Journal

        if not (self.run_dir / "state.sqlite").exists():
            return []
        state = Journal(self.run_dir, readonly=True)
        try:
            return state.events(kind)
        finally:
            state.close()

    def pilots(self) -> dict[str, str]:
        """Running pilots' Slurm job ids -> their node."""
        mine = {e["data"]["scheduler_id"] for e in self.events("pilot.submitted")}
        out = self.cluster.command("squeue", "-h", "-p", "scavenger", "-t", "R", "-o", "%i %N", check=False).stdout.split("\n")
        return {jid: node for jid, node in (line.split() for line in out if line.strip()) if jid in mine}

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 2)
            try:
                self.proc.wait(120)
            except Exception:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
        wait(lambda: not self.cluster.command("squeue", "-h", "-o", "%i", check=False).stdout.split(), 120, "every job gone")


def main_job_delay(cluster, node: str) -> float:
    """sbatch of a main job pinned to ``node`` -> squeue shows it R (polled every 0.1 s); waits for it to end."""
    start = time.monotonic()
    jid = cluster.command("sbatch", "--parsable", "-p", "main", "-w", node, "-o", "/dev/null", "--wrap", "sleep 2").stdout.strip().split(";")[0]
    while cluster.command("squeue", "-h", "-j", jid, "-o", "%t", check=False).stdout.strip() not in ("R", "CG", ""):
        time.sleep(0.1)
    took = time.monotonic() - start
    wait(lambda: not cluster.command("squeue", "-h", "-j", jid, "-o", "%t", check=False).stdout.strip(), 60, f"main job {jid} to end")
    return took


def bare(cluster, root: Path, repeats: int) -> list[float]:
    script = root / "bare-pilot.sh"
    script.write_text("#!/bin/sh\ntrap 'exit 0' TERM\nwhile true; do sleep 0.2; done\n")
    script.chmod(0o755)
    out = []
    for _ in range(repeats):
        jid = cluster.command("sbatch", "--parsable", "-p", "scavenger", "-w", "node4", "-o", "/dev/null", str(script)).stdout.strip().split(";")[0]
        wait(lambda: cluster.command("squeue", "-h", "-j", jid, "-o", "%t", check=False).stdout.strip() == "R", 120, "the bare pilot to run")
        time.sleep(3)
        out.append(main_job_delay(cluster, "node4"))
        wait(lambda: not cluster.command("squeue", "-h", "-j", jid, check=False).stdout.strip(), 60, "the bare pilot to go")
    return out


def torch_delay(cluster, root: Path, repeats: int) -> list[float]:
    out = []
    for i in range(repeats):
        steps = root / f"delay-steps-{i}.jsonl"
        run = Run(cluster, root, f"delay-{i}", TORCH_STEPS.format(step_log=STEP_LOG.format(path=str(steps)), nodes=1, apps=2))
        try:
            def training() -> str | None:
                recent = {r["host"] for r in read_steps(steps) if r["time"] > time.time() - 1.0}
                return next((n for n in run.pilots().values() if n in recent), None)

            node = wait(training, 300, "a pilot's torch ranks training")
            time.sleep(3)
            out.append(main_job_delay(cluster, node))
        finally:
            run.stop()
    return out


def resizes(cluster, root: Path, preemptions: int, resize: str) -> dict[str, list[float]]:
    steps = root / f"steps-{resize}.jsonl"
    run = Run(cluster, root, f"resize-{resize}", TORCH_STEPS.format(step_log=STEP_LOG.format(path=str(steps)), nodes=4, apps=1),
              PILOTFILL_TORCH_RESIZE=resize)  # fmt: skip

    def costs(change: str) -> list[float]:
        return [e["data"]["seconds"] for e in run.events("job.cost") if e["data"]["change"] == change]

    missed_growbacks = 0
    try:
        wait(lambda: costs("up"), 400, "the job to grow")
        for _ in range(preemptions):
            pilots = run.pilots()
            if len(pilots) < 2:
                time.sleep(5)
                continue
            downs, ups = len(costs("down")), len(costs("up"))
            node = sorted(pilots.values())[-1]
            cluster.command("sbatch", "-p", "main", "-w", node, "-o", "/dev/null", "--wrap", "sleep 15")
            wait(lambda: len(costs("down")) > downs, 240, "the job to shrink")
            try:
                wait(lambda: len(costs("up")) > ups, 90, "the job to grow back")
            except TimeoutError:
                missed_growbacks += 1  # printed: a node given back that the job did not take again is a finding
            time.sleep(8)
        changes = [e for e in run.events() if e["kind"] in ("job.started", "job.resized")]
    finally:
        run.stop()
    joins, leaves, held = [], [], set()
    for e in changes:
        nodes = set(e["data"].get("nodes") or [])
        joins += [(e["time"], n) for n in sorted(nodes - held)] if e["kind"] == "job.resized" else []
        leaves += [(e["time"], n) for n in sorted(held - nodes)]
        held = nodes
    out = figures(read_steps(steps), joins, leaves)
    out["cost_up"], out["cost_down"] = costs("up"), costs("down")
    out["missed_growbacks"] = [missed_growbacks]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--only", choices=("all", "resize", "delay"), default="all")
    args = ap.parse_args()
    from slurm_cluster import SlurmCluster, available
    from vhosts import missing

    why = None if available() else "Slurm is not installed (apt-get install slurm-wlm)"
    why = why or missing()
    if why:
        print(f"bench_slurm: cannot run a real Slurm here: {why}", file=sys.stderr)
        return 2
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    root = Path(tempfile.mkdtemp(prefix="pf-bench-slurm-"))
    cluster = SlurmCluster(root / "slurm", grace_s=GRACE_S, min_job_age=5, hosts=True)
    cluster.start(timeout_s=60)
    try:
        if args.only in ("all", "delay"):
            bare_runs, torch_runs = bare(cluster, root, args.repeats), torch_delay(cluster, root, args.repeats)
            print(f"main job sbatch -> R behind a pilot in scavenger (GraceTime {GRACE_S} s), one run")
            for name, xs in (("bare pilot (trap exits at once)", bare_runs), ("pilotfill pilot training torch ranks", torch_runs)):
                print(f"  {name:40s} {statistics.median(xs):6.2f} s (n={len(xs)}: {', '.join(f'{x:.2f}' for x in xs)})  worst {max(xs):.2f} s")
            extra, worst = statistics.median(torch_runs) - statistics.median(bare_runs), max(torch_runs) - max(bare_runs)
            print(f"  torch ranks - bare pilot: median {extra:+.2f} s, worst {worst:+.2f} s   target <= +1.00 s: {'met' if max(extra, worst) <= 1.0 else 'NOT met'}")
        if args.only in ("all", "resize"):
            got = {resize: resizes(cluster, root, args.repeats, resize) for resize in ("restart", "in_place")}
            print(f"a torch job's resizes on Slurm hosts (one-node pilots, preempted by main jobs {args.repeats} times), one run")
            print(f"  {'':46}{'restart':>30}{'in place':>30}")
            for label, key, count in (("grow: a node joins -> it trains (<= 2 s)", "grow", False), ("grow: survivors' pause (<= 0.5 s)", "grow_pause", False),
                                      ("shrink (preempted): survivors' pause (<= 0.5 s)", "shrink", False),
                                      ("surviving workers restarted (0)", "restarted", True), ("samples redone (0)", "redone", True),
                                      ("controller's job.cost, grow", "cost_up", False), ("controller's job.cost, shrink", "cost_down", False),
                                      ("node given back, not taken again within 90 s", "missed_growbacks", True)):  # fmt: skip
                print(f"  {label:46}{cell(got['restart'][key], count):>30}{cell(got['in_place'][key], count):>30}")
        print(json.dumps({"machine": os.uname().nodename, "cpus": os.cpu_count(), "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}))
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
