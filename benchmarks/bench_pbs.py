"""What pilots cost the main workload on a REAL OpenPBS, and what rescaling costs a torch job on real hosts.

The real OpenPBS 23.06.06 of the tests (tests/pbs_cluster.py: server host and three MOM hosts, each its own network
and UTS namespace; ``workq`` preempts ``scavenger``, ``preempt_order = R``), measured side by side in one run (the
machine is shared and noisy: compare within a run). Needs root; builds OpenPBS once (scripts/build_openpbs.sh).

Main-job delay: ``qsub`` of a one-vnode ``workq`` job pinned to a vnode (``vnode=V``) -> ``qstat`` shows it ``R``,
as the recordings measured it (turn 4 (e)), with V

* idle;
* held by a bare pilot: a job script whose trap exits at once on SIGTERM (the recordings' baseline), on one vnode,
  and on two hosts (the main job on its sister host's vnode: PBS ends a job spanning hosts more slowly); and by a
  bare executable job (``qsub -- sleep``: its only process dies of the SIGTERM, PBS's own floor — a script's login
  shell dies first too, so MOM sometimes sees even the bare script's session end only at its kill check);
* held by pilotfill's pilot (a processes campaign training on it): a pilot of one vnode; one of several vnodes of
  one host; a pilot's vnode on a sister host (the pilot spans two hosts; its agent runs on the other).

Target: pilotfill's pilot within 1 s of the bare one (the recordings: 8.4–19 s against 1.45–5.55 s).

torch rescaling on real hosts: a torch job (``runtime.kind = "torch"``, ranks across MOM hosts over gloo) grows as
one-vnode pilots arrive and shrinks as main jobs preempt them; each grow and shrink is timed by the controller itself
(``job.cost``: the change -> training resumed, in the journal). Target: a grow no slower than the scale-up cost the
replay charges (the shared data's measured scale-up costs: median 17.97 s; pilotfill's default for an app that sets
none: 10 s).

    sudo .venv/bin/python benchmarks/bench_pbs.py [--repeats 3] [--only all|delay|torch]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import pwd
import re
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))

from pbs_cluster import USER, Campaign, PbsCluster, build, site_config, unavailable  # noqa: E402
from rescale_figures import STEP_LOG, cell, figures, read_steps  # noqa: E402

SHARED = Path(os.environ.get("PILOTFILL_SHARED_DATA", HERE.parent.parent / "shared" / "data"))
HOLD = """
import pilotfill

@pilotfill.elastic_app(min_nodes={nodes}, max_nodes={nodes}, scale_up_cost_s=1.0, scale_down_cost_s=1.0)
def hold(i):
    import time
    import pilotfill
    for _ in range(100000):
        time.sleep(0.5)
        pilotfill.report(samples=10)

print([f.result() for f in [hold(i) for i in range({apps})]])
"""
TORCH = """
import pilotfill, time
import torch
import torch.distributed as dist

@pilotfill.elastic_app(min_nodes=1, max_nodes=4)
def train():
    from pilotfill.elastic import ElasticState
    dist.init_process_group("gloo")
    model = torch.nn.Linear(64, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    state = ElasticState(model, opt, step=0)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    while state.step < 100000:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
        pilotfill.report(samples=32)
        time.sleep(0.02)
        state.step += 1
        if state.step % 20 == 0:
            state.commit()

print(train().result())
"""


TORCH_STEPS = """
import pilotfill, time
{step_log}

@pilotfill.elastic_app(min_nodes=1, max_nodes={nodes}, global_batch=32)
def train(i):
    import torch
    import torch.distributed as dist
    from pilotfill.elastic import ElasticLoader, ElasticState
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(0)
    loader = ElasticLoader((torch.randn(4096, 64, generator=g), torch.randint(0, 10, (4096,), generator=g)), seed=0)
    state = ElasticState(model, opt, loader=loader)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    while loader.epoch < 100000:
        for batch in loader:
            opt.zero_grad()
            batch.backward(lambda x, y: torch.nn.functional.cross_entropy(ddp(x), y), ddp)
            opt.step()
            time.sleep(0.05 * len(batch.indices) / batch.size)  # a step of a bigger model: 50 ms on one rank
            _pilotfill_bench_step(batch)
            if batch.step % 20 == 19:
                state.commit()
        state.commit()

print([f.result() for f in [train(i) for i in range({apps})]])
"""
"""A torch campaign of the README's shape (ElasticLoader, ElasticState, DDP) whose ranks log every step they train."""


def vnodes_of(job: dict) -> list[str]:
    return [part.split(":")[0] for part in re.findall(r"\(([^)]*)\)", job.get("exec_vnode", ""))]


def wait(predicate, timeout_s: float, what: str):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def main_job_delay(cluster: PbsCluster, vnode: str) -> float:
    """qsub of a main job pinned to ``vnode`` -> qstat shows it R (polled every 0.1 s); waits for it to end."""
    start = time.monotonic()
    job = cluster.qsub("-l", f"select=1:ncpus=1:vnode={vnode}", "-o", "/dev/null", "-j", "oe", "--", "/bin/sleep", "2")
    while (cluster.jobs().get(job) or {}).get("job_state") not in ("R", "E", None):
        time.sleep(0.1)
    took = time.monotonic() - start
    wait(lambda: job not in cluster.jobs(), 60, f"main job {job} to end")
    return took


def idle(cluster: PbsCluster, repeats: int) -> list[float]:
    return [main_job_delay(cluster, "pfn3") for _ in range(repeats)]


def bare(cluster: PbsCluster, repeats: int, chunks: int = 1, executable: bool = False) -> list[float]:
    """A bare pilot: a script that exits at once on SIGTERM (``executable``: ``qsub -- sleep``, a job whose only
    process dies of the SIGTERM: PBS's own floor), requeued and started again between tries. One chunk: on pfn3; two:
    one per host (``place=scatter``), the main job pinned to its sister host's vnode."""
    home = cluster.homes[USER]
    script = home / "bare-pilot.sh"
    script.write_text("#!/bin/sh\ntrap 'exit 0' TERM\nwhile true; do sleep 0.2; done\n")
    pw = pwd.getpwnam(USER)
    os.chown(script, pw.pw_uid, pw.pw_gid)
    script.chmod(0o755)
    select = ["-l", "select=1:ncpus=1:vnode=pfn3"] if chunks == 1 else ["-l", f"select={chunks}:ncpus=1", "-l", "place=scatter"]
    command = ["--", "/bin/sleep", "100000"] if executable else [str(script)]
    job = cluster.run(["qsub", "-q", "scavenger", "-r", "y", *select, "-o", "/dev/null", "-j", "oe", *command], user=USER).stdout.strip()
    out = []
    for _ in range(repeats):
        wait(lambda: (cluster.jobs().get(job) or {}).get("substate") == 42, 120, "the bare pilot to run")
        time.sleep(3)
        out.append(main_job_delay(cluster, vnodes_of(cluster.jobs()[job])[-1]))
    cluster.run(["qdel", "-W", "force", job], check=False)
    wait(lambda: job not in cluster.jobs(), 60, "the bare pilot to go")
    wait(lambda: cluster.free() == set(cluster.vnodes), 120, "every vnode free")
    return out


def ours(cluster: PbsCluster, repeats: int, name: str, place: str, nodes: int, pick) -> list[float]:
    """pilotfill's pilots of ``nodes`` vnodes placed by ``place`` (a processes campaign of jobs of that size that train
    until stopped), a fresh campaign per repeat (a preempted pilot comes back elsewhere); ``pick(job)``: the vnode of a
    running pilot to pin the main job to, or None."""
    out = []
    for i in range(repeats):
        config = site_config("processes", nodes_per_pilot=nodes, pbs={"place": place})
        campaign = Campaign(cluster, f"bench-{name}-{i}", HOLD.format(apps=3 if nodes == 1 else 1, nodes=nodes), config)
        with campaign:
            campaign.start()

            def target():
                mine = set(campaign.pilot_jobs())
                pilots = {j: v for j, v in cluster.jobs().items() if j in mine and v.get("substate") == 42}
                if not campaign.events("job.started"):
                    return None
                return next((v for _, job in sorted(pilots.items()) if (v := pick(job))), None)

            vnode = wait(target, 240, f"a pilot for the {name} case")
            time.sleep(5)  # training on it
            out.append(main_job_delay(cluster, vnode))
            campaign.proc.send_signal(2)
            campaign.wait(120)
        wait(lambda: not set(campaign.pilot_jobs()) & set(cluster.jobs()), 120, "the campaign's pilots to go")
        wait(lambda: cluster.free() == set(cluster.vnodes), 120, "every vnode free")
    return out


def ours_torch(cluster: PbsCluster, repeats: int) -> list[float]:
    """A main job for a vnode whose one-vnode pilot is training torch ranks (in place, the default): qsub -> R."""
    out = []
    for i in range(repeats):
        campaign = Campaign(cluster, f"bench-torch-delay-{i}", "", site_config("torch", nodes_per_pilot=1))
        steps = campaign.dir / "steps.jsonl"
        (campaign.dir / "campaign.py").write_text(TORCH_STEPS.format(step_log=STEP_LOG.format(path=str(steps)), nodes=1, apps=3))
        with campaign:
            campaign.start()

            def training_vnode() -> str | None:
                recent = {r["host"] for r in read_steps(steps) if r["time"] > time.time() - 1.0}
                mine = set(campaign.pilot_jobs())
                pilots = {j: v for j, v in cluster.jobs().items() if j in mine and v.get("substate") == 42}
                return next((v for _, job in sorted(pilots.items()) for v in vnodes_of(job) if v in recent), None)

            vnode = wait(training_vnode, 300, "a pilot's torch ranks training")
            time.sleep(3)  # training on it
            out.append(main_job_delay(cluster, vnode))
            campaign.proc.send_signal(2)
            campaign.wait(120)
        wait(lambda: not set(campaign.pilot_jobs()) & set(cluster.jobs()), 120, "the campaign's pilots to go")
        wait(lambda: cluster.free() == set(cluster.vnodes), 120, "every vnode free")
    return out


def torch_resizes(cluster: PbsCluster, preemptions: int, resize: str) -> dict[str, list[float]]:
    """A torch job (the README's shape) on one-vnode pilots across the MOM hosts, grown as pilots arrive and shrunk as
    main jobs preempt them, ``resize`` ``restart`` or ``in_place``: what its ranks' steps show (:mod:`rescale_figures`)
    and what the controller measured (``job.cost``)."""
    campaign = Campaign(cluster, f"bench-resize-{resize}", "", site_config("torch", nodes_per_pilot=1))
    steps = campaign.dir / "steps.jsonl"
    (campaign.dir / "campaign.py").write_text(TORCH_STEPS.format(step_log=STEP_LOG.format(path=str(steps)), nodes=4, apps=1))

    def costs(change: str) -> list[float]:
        return [e["data"]["seconds"] for e in campaign.events("job.cost") if e["data"]["change"] == change]

    with campaign:
        campaign.start(PILOTFILL_TORCH_RESIZE=resize)
        _rescale(campaign, cluster, preemptions, costs)
        changes = [e for e in campaign.events() if e["kind"] in ("job.started", "job.resized")]
    joins, leaves, held = [], [], set()
    for e in changes:
        nodes = set(e["data"].get("nodes") or [])
        joins += [(e["time"], n) for n in sorted(nodes - held)] if e["kind"] == "job.resized" else []
        leaves += [(e["time"], n) for n in sorted(held - nodes)]
        held = nodes
    out = figures(read_steps(steps), joins, leaves)
    out["cost_up"], out["cost_down"] = costs("up"), costs("down")
    return out


def torch_rescaling(cluster: PbsCluster, preemptions: int) -> tuple[list[float], list[float]]:
    """A torch job growing onto one-vnode pilots and preempted ``preemptions`` times (it grows back once a pilot runs
    again: the requeued one after the main job's 20 s, or another); the controller's own measure of each grow and
    shrink (``job.cost``)."""
    campaign = Campaign(cluster, "bench-torch", TORCH, site_config("torch", nodes_per_pilot=1))

    def costs(change: str) -> list[float]:
        return [e["data"]["seconds"] for e in campaign.events("job.cost") if e["data"]["change"] == change]

    with campaign:
        campaign.start()
        try:
            return _rescale(campaign, cluster, preemptions, costs)
        except TimeoutError:
            said = campaign.events()  # what the controller saw and did, to say why it waited
            print("\n".join(f"{e['time']:.1f} {e['kind']} {json.dumps(e['data'])[:300]}" for e in said[-80:]), file=sys.stderr)
            print(campaign.text()[-3000:], file=sys.stderr)
            raise


def _rescale(campaign: Campaign, cluster: PbsCluster, preemptions: int, costs) -> tuple[list[float], list[float]]:
    """The grows and shrinks of :func:`torch_rescaling`, once its campaign runs."""
    wait(lambda: costs("up"), 400, "the job to grow")
    for _ in range(preemptions):
        mine = set(campaign.pilot_jobs())
        running = {j: v for j, v in cluster.jobs().items() if j in mine and v.get("substate") == 42}
        if len(running) < 2:
            break
        downs, ups = len(costs("down")), len(costs("up"))
        job_id, job = sorted(running.items())[-1]
        cluster.qsub("-l", f"select=1:ncpus=1:vnode={vnodes_of(job)[0]}", "-o", "/dev/null", "-j", "oe", "--", "/bin/sleep", "20")
        wait(lambda: len(costs("down")) > downs, 240, "the job to shrink")
        # It may grow back once a pilot runs again (the requeued one when the main job is done, or another that took a
        # free vnode meanwhile) — or not: a grow that costs more than the nodes' expected stay would earn is not made,
        # and the requeued pilot is then deleted ("no job needs it any more"). Either way, the next preemption.
        try:
            wait(lambda: len(costs("up")) > ups, 90, "the job to grow back")
        except TimeoutError:
            print(f"  (not grown back within 90 s: {', '.join(e['data'].get('why', '') for e in campaign.events('pilot.cancelled')) or 'no pilot cancelled'})",
                  file=sys.stderr)  # fmt: skip
        time.sleep(10)  # training at its size before the next preemption
    campaign.proc.send_signal(2)
    campaign.wait(120)
    return costs("up"), costs("down")


def med(xs: list[float]) -> str:
    return f"{statistics.median(xs):6.2f} s (n={len(xs)}: {', '.join(f'{x:.2f}' for x in xs)})" if xs else "   n/a"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", choices=("all", "delay", "torch", "resize", "torch-delay"), default="all",
                    help="delay: main jobs behind pilots; torch-delay: behind a pilot training torch ranks, beside the bare pilot; "
                         "resize: a torch job's resizes, restarting its workers and in place, side by side; torch: the controller's job.cost")
    args = ap.parse_args()
    why = unavailable()
    if why:
        print(f"bench_pbs: cannot run a real OpenPBS here: {why}", file=sys.stderr)
        return 2
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stopped: the cluster is still taken down (finally)
    cluster = PbsCluster(build())
    cluster.start()
    try:
        if args.only in ("all", "delay"):
            rows = {
                "idle vnode": idle(cluster, args.repeats),
                "bare pilot (trap exits at once)": bare(cluster, args.repeats),
                "bare executable job (qsub -- sleep)": bare(cluster, args.repeats, executable=True),
                "bare pilot on two hosts, its sister host's vnode": bare(cluster, args.repeats, chunks=2),
                "pilotfill pilot, one vnode": ours(cluster, args.repeats, "one", "vscatter", 1, lambda j: vnodes_of(j)[0]),
                "pilotfill pilot, several vnodes of a host": ours(cluster, args.repeats, "several", "pack", 2,
                                                                  lambda j: vnodes_of(j)[-1] if len(vnodes_of(j)) > 1 else None),
                "pilotfill pilot, a sister host's vnode": ours(cluster, args.repeats, "sister", "scatter", 2,
                                                               lambda j: vnodes_of(j)[-1] if len({v.split('[')[0] for v in vnodes_of(j)}) > 1 else None),
            }  # fmt: skip
            print("main job qsub -> R, median over repeats")
            for name, xs in rows.items():
                print(f"  {name:44s} {med(xs)}")
            for name in [k for k in rows if k.startswith("pilotfill")]:
                bare_name = "bare pilot on two hosts, its sister host's vnode" if "sister" in name else "bare pilot (trap exits at once)"
                extra = statistics.median(rows[name]) - statistics.median(rows[bare_name])
                floor = statistics.median(rows[name]) - statistics.median(rows["bare executable job (qsub -- sleep)"])
                print(f"  {name:44s} - {bare_name.split(',')[0].replace(' (trap exits at once)', '')} = {extra:+.2f} s   target <= +1.00 s: "
                      f"{'met' if extra <= 1.0 else 'NOT met'};  - the bare executable job = {floor:+.2f} s")  # fmt: skip
        if args.only in ("all", "torch-delay"):
            bare_runs = bare(cluster, args.repeats)
            torch_runs = ours_torch(cluster, args.repeats)
            print("main job qsub -> R behind a pilot, the same vnode kind, one run")
            for name, xs in (("bare pilot (trap exits at once)", bare_runs), ("pilotfill pilot training torch ranks", torch_runs)):
                print(f"  {name:44s} {med(xs)}  worst {max(xs):.2f} s")
            extra, worst = statistics.median(torch_runs) - statistics.median(bare_runs), max(torch_runs) - max(bare_runs)
            print(f"  torch ranks - bare pilot: median {extra:+.2f} s, worst {worst:+.2f} s   target <= +1.00 s: "
                  f"{'met' if max(extra, worst) <= 1.0 else 'NOT met'}")
        if args.only in ("all", "resize"):
            got = {resize: torch_resizes(cluster, args.repeats, resize) for resize in ("restart", "in_place")}
            print(f"a torch job's resizes on real hosts (one-vnode pilots, preempted by main jobs {args.repeats} times), one run")
            print(f"  {'':46}{'restart':>30}{'in place':>30}")
            for label, key, count in (("grow: a node joins -> it trains (<= 2 s)", "grow", False), ("grow: survivors' pause (<= 0.5 s)", "grow_pause", False),
                                      ("shrink (preempted): survivors' pause (<= 0.5 s)", "shrink", False),
                                      ("surviving workers restarted (0)", "restarted", True), ("samples redone (0)", "redone", True),
                                      ("controller's job.cost, grow", "cost_up", False), ("controller's job.cost, shrink", "cost_down", False)):  # fmt: skip
                print(f"  {label:46}{cell(got['restart'][key], count):>30}{cell(got['in_place'][key], count):>30}")
        if args.only in ("all", "torch"):
            ups, downs = torch_rescaling(cluster, preemptions=args.repeats)
            replay = [float(r["scale_up_cost_s"]) for r in csv.DictReader(open(SHARED / "jobs-imagenet-1001.csv"))] if (SHARED / "jobs-imagenet-1001.csv").exists() else []
            charged = statistics.median(replay) if replay else 10.0
            print("torch job on real hosts (the controller's job.cost: change -> training resumed)")
            print(f"  grow   {med(ups)}")
            print(f"  shrink {med(downs)}")
            if ups:
                print(f"  grow / the replay's scale-up cost ({charged:.2f} s, the shared data's median) = {statistics.median(ups) / charged:.2f}"
                      f"   target <= 1: {'met' if statistics.median(ups) <= charged else 'NOT met'}")
                print(f"  grow / pilotfill's default scale_up_cost_s (10 s) = {statistics.median(ups) / 10.0:.2f}")
        print(json.dumps({"machine": os.uname().nodename, "cpus": os.cpu_count(), "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}))
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
