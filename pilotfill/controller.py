"""The controller: one event loop, its own process, the only place that decides.

Every event — a node joins, a node is leaving or lost, a job arrives, ends or
fails, a rank dies, a new throughput estimate — is one pass: update the
durable state, ask the allocator, apply the difference through the runtime,
and give back what no job needs. Clients (pilot agents, ranks, the executor,
``top``) talk to it only through authenticated messages.

    python -m pilotfill.controller --run-dir RUN [--config FILE]

A controller started on a run directory that a dead one left behind kills
what its predecessor started, requeues the jobs that were running (their
committed progress kept), keeps finished results, and carries on.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import secrets
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from . import procs
from .allocator import Job, NodePool, Problem, Profiler, ScalingCurve, allocate
from .config import Config, load_config
from .elastic.base import RankExit, Runtime
from .elastic.processes import ProcessRuntime
from .pilots.manager import PilotManager
from .protocol import READ_ONLY, ProtocolError, check, check_spec
from .schedulers.base import BatchScheduler, PilotEvent
from .schedulers.local import LocalScheduler
from .security import create_secret, private_dir
from .state import TERMINAL, State
from .transport import Server

log = logging.getLogger("pilotfill.controller")

JOB_RETRIES = 3
"""A job whose launcher dies without a result or a reported failure is retried this often, then failed."""


class Controller:
    def __init__(self, run_dir: Path, config: Config, scheduler: BatchScheduler | None = None, runtime: Runtime | None = None):
        self.run_dir = private_dir(Path(run_dir))
        self.config = config
        self.key = create_secret(self.run_dir)
        self.state = State(self.run_dir)
        self.started = time.time()
        with self.state.transaction():
            self.incarnation = self.state.next_incarnation()
        self._recover()
        self.server = Server(self.run_dir, self.key, host=config.controller.bind, not_before=self.started)
        self.scheduler = scheduler or self._make_scheduler()
        self.runtime = runtime or self._make_runtime()
        self.pilots = PilotManager(self.scheduler, self.state, config.pilots)
        self.profiler = Profiler()
        self.dirty = True
        self.stopping = False
        self._heartbeats: dict[str, float] = {}
        self._scheduler_backoff: dict[str, tuple[float, float]] = {}  # call -> (not before, last delay)
        self._contributing: dict[str, set[str]] = {}  # job -> hosts whose ranks have reported since they joined
        with self.state.transaction():
            self.state.log("controller.started", incarnation=self.incarnation, pid=os.getpid(), endpoint=self.server.endpoint)
        self.server.publish(incarnation=self.incarnation)
        log.info("controller %d on %s at %s", self.incarnation, self.run_dir, self.server.endpoint)

    def _make_runtime(self) -> Runtime:
        def record(p: subprocess.Popen, job: str, host: str) -> None:
            self._record_process(p, "rank", job, host)

        if self.config.runtime.kind == "horovod":
            from .elastic.horovod import HorovodRuntime

            local = self.config.scheduler == "local" or self.config.runtime.local_hosts
            return HorovodRuntime(self.run_dir, local=local, network_interface=self.config.runtime.network_interface, on_spawn=record)
        return ProcessRuntime(self.run_dir, on_spawn=record)

    def _make_scheduler(self) -> BatchScheduler:
        if self.config.scheduler == "local":
            return LocalScheduler(self.config.local, self.config.pilots, self.run_dir, on_spawn=lambda p, kind, host: self._record_process(p, kind, None, host))
        if self.config.scheduler == "slurm":
            from .schedulers.slurm import SlurmScheduler

            return SlurmScheduler(self.config.slurm, self.config.pilots, self.run_dir)
        if self.config.scheduler == "pbs":
            from .schedulers.pbs import PbsScheduler

            return PbsScheduler(self.config.pbs, self.config.pilots, self.run_dir)
        raise ValueError(f"unknown scheduler {self.config.scheduler!r}")

    # ------------------------------------------------------------ recovery

    def _recover(self) -> None:
        """Take over from a predecessor: nothing it started survives; running jobs are requeued."""
        leftovers = self.state.processes()
        for p in leftovers:
            procs.kill_group(p["pid"], p["start_ticks"])
        # Grandchildren (ranks under horovodrun) are found by the run directory in their environment.
        for pid in procs.with_environment(PILOTFILL_RUN_DIR=str(self.run_dir)):
            procs.kill_pid(pid)
        now = time.time()
        with self.state.transaction():
            self.state.db.execute("DELETE FROM processes")
            for pilot in self.state.pilots(("queued", "running", "leaving")):
                self.state.upsert_pilot(pilot["id"], state="lost", ended=now)
            for node in self.state.nodes():
                if node["state"] != "gone":
                    self.state.set_node(node["name"], state="gone", job=None, pilot=None, since=now)
            requeued = []
            for job in self.state.jobs(("running",)):
                self.state.set_job(job.id, status="pending", nodes=[])
                requeued.append(job.id)
            if leftovers or requeued or self.incarnation > 1:
                self.state.log("controller.recovered", incarnation=self.incarnation, killed=len(leftovers), requeued=requeued)

    def _record_process(self, proc: subprocess.Popen, kind: str, job: str | None, host: str | None) -> None:
        ticks = procs.start_ticks(proc.pid)
        if ticks is not None:
            with self.state.transaction():
                self.state.add_process(proc.pid, ticks, kind, self.incarnation, job, host)

    # ------------------------------------------------------------ the loop

    def run(self) -> None:
        tick_ms = int(self.config.controller.tick_s * 1000)
        while not self.stopping:
            self.server.serve(self.handle, tick_ms)
            self.step(time.time())
        self.shutdown()

    def step(self, now: float) -> None:
        """One pass over everything that is polled rather than messaged."""
        with self.state.transaction():
            for event in self._scheduler_call("poll", self.scheduler.poll, now) or []:
                self._on_pilot_event(event, now)
            for exit_ in self.runtime.poll():
                self._on_rank_exit(exit_, now)
            self._check_heartbeats(now)
            if self.dirty and not self.pilots.settling(now):
                self.reallocate(now)
            self._scheduler_call("fill", self.pilots.fill, self._problem, now)
            self._forget_dead_processes()

    def _scheduler_call(self, what: str, fn, *args):
        """Call into the batch system; a failing or hanging command is logged, never fatal.

        After a failure that kind of call is skipped for a while (doubling up
        to five minutes), so a batch system that hangs costs one timeout per
        backoff period rather than one per tick. Messages that arrive during a
        slow command wait in the socket and are handled right after it.
        """
        now = time.time()
        if now < self._scheduler_backoff.get(what, (0.0, 0.0))[0]:
            return None
        try:
            result = fn(*args)
        except Exception as exc:
            _, delay = self._scheduler_backoff.get(what, (0.0, 0.0))
            delay = min(300.0, max(1.0, delay * 2))
            self._scheduler_backoff[what] = (time.time() + delay, delay)
            log.error("scheduler %s failed (next try in %.0f s): %s", what, delay, exc)
            self.state.log("scheduler.error", during=what, error=str(exc)[-1000:], retry_in_s=delay)
            return None
        self._scheduler_backoff.pop(what, None)
        return result

    def handle(self, message: dict[str, Any]) -> dict[str, Any]:
        """Apply one authenticated request; commit before replying."""
        try:
            kind = check(message)
            if kind in READ_ONLY:
                return {"ok": True, **self._read(kind, message)}
            now = time.time()
            with self.state.transaction():
                reply = getattr(self, "_on_" + kind.replace(".", "_"))(message, now)
                if self.dirty and kind in ("pilot.leaving", "job.failed", "job.result"):
                    self.reallocate(now)  # ranks leave inside the grace period, freed nodes move at once
            return {"ok": True, **reply}
        except ProtocolError as exc:
            return {"ok": False, "error": str(exc)}
        except Exception as exc:  # a bug must not take the controller down
            log.error("error handling %s: %s", message.get("type"), traceback.format_exc())
            return {"ok": False, "error": f"internal error: {exc!r}"}

    def shutdown(self) -> None:
        log.info("shutting down")
        self.runtime.close()
        self._scheduler_call("close", self.scheduler.close)
        with self.state.transaction():
            for job in self.state.jobs(("running",)):
                self.state.set_job(job.id, status="pending", nodes=[])
            for pilot in self.state.pilots(("queued", "running", "leaving")):
                self.state.upsert_pilot(pilot["id"], state="ended", ended=time.time())
            for node in self.state.nodes():
                if node["state"] != "gone":
                    self.state.set_node(node["name"], state="gone", job=None, pilot=None, since=time.time())
            self.state.db.execute("DELETE FROM processes")
            self.state.log("controller.stopped", incarnation=self.incarnation)
        self.server.close()
        self.state.close()

    # ------------------------------------------------------------ messages

    def _read(self, kind: str, message: dict[str, Any]) -> dict[str, Any]:
        if kind == "job.get":
            job = self.state.job(message["job_id"])
            if job is None:
                raise ProtocolError(f"no job {message['job_id']!r}")
            return {"job": job.__dict__}
        return {
            "jobs": [j.__dict__ for j in self.state.jobs()],
            "pilots": self.state.pilots(),
            "nodes": self.state.nodes(),
            "events": self.state.events(limit=50),
            "incarnation": self.incarnation,
        }

    def _on_job_submit(self, message: dict[str, Any], now: float) -> dict[str, Any]:
        spec = check_spec(message["spec"])
        job_id = f"j{secrets.token_hex(4)}"
        self.state.add_job(job_id, spec["name"], spec, now)
        self.state.log("job.arrived", job=job_id, name=spec["name"], min_nodes=spec["min_nodes"], max_nodes=spec["max_nodes"])
        self.dirty = True
        return {"job_id": job_id}

    def _on_job_cancel(self, message: dict[str, Any], now: float) -> dict[str, Any]:
        self._end_job(self._known_job(message["job_id"]), now, "cancelled", {})
        return {}

    def _on_job_report(self, message: dict[str, Any], now: float) -> dict[str, Any]:
        job = self._known_job(message["job_id"])
        if job.status in TERMINAL:
            return {"progress": job.progress}
        progress = self.state.add_progress(job.id, message["samples"])
        n = len(job.nodes)
        if message["samples"] > 0 and message["host"] in job.nodes and message["host"] not in self._contributing.setdefault(job.id, set()):
            self._contributing[job.id].add(message["host"])
            self.state.log("rank.contributing", job=job.id, node=message["host"])
        if message["samples"] > 0 and n > 0 and message["host"] in job.nodes:
            seen_before = n in self.profiler.scales(job.id)
            self.profiler.observe(job.id, n, n * message["samples"] / message["seconds"], weight=message["seconds"])
            if not seen_before and job.spec.get("curve") is None:
                self.state.log("job.estimate", job=job.id, nodes=n, samples_per_s=round(n * message["samples"] / message["seconds"], 3))
                self.dirty = True  # the curve estimate changed: a new scale was measured
        return {"progress": progress}

    def _on_job_result(self, message: dict[str, Any], now: float) -> dict[str, Any]:
        job = self._known_job(message["job_id"])
        self._end_job(job, now, "finished", {"result": message.get("value")}, progress=job.progress)
        return {}

    def _on_job_failed(self, message: dict[str, Any], now: float) -> dict[str, Any]:
        job = self._known_job(message["job_id"])
        error = message["error"]
        self._end_job(job, now, "failed", {"error": error, "result": message.get("value")}, error=(error.strip().splitlines() or [""])[-1][:200])
        return {}

    def _end_job(self, job, now: float, status: str, fields: dict[str, Any], **logged: Any) -> None:
        """A job is over (the first outcome wins): stop its ranks, free its nodes, record why."""
        if job.status in TERMINAL:
            return
        self.runtime.stop(job.id)
        self._release_job_nodes(job.id)
        self.state.set_job(job.id, status=status, ended=now, nodes=[], **fields)
        self.state.log(f"job.{status}", job=job.id, **logged)
        self.profiler.forget(job.id)
        self.dirty = True

    def _on_pilot_register(self, message: dict[str, Any], now: float) -> dict[str, Any]:
        pilot = message["pilot"]
        self.state.upsert_pilot(pilot, scheduler_id=message["scheduler_id"], state="running", nodes=message["nodes"], pid=message["pid"], last_heartbeat=now, submitted=now, controller=self.incarnation)
        self._heartbeats[pilot] = now
        for node in message["nodes"]:
            self.state.set_node(node, pilot=pilot, state="ready", job=None, since=now, deadline=None)
            self.state.log("node.joined", pilot=pilot, node=node)
        self.dirty = True
        return {}

    def _on_pilot_heartbeat(self, message: dict[str, Any], now: float) -> dict[str, Any]:
        pilot = message["pilot"]
        known = {p["id"]: p for p in self.state.pilots()}
        if pilot not in known or known[pilot]["state"] in ("ended", "lost"):
            return {"register": pilot not in known, "stop": pilot in known}
        self._heartbeats[pilot] = now
        self.state.upsert_pilot(pilot, last_heartbeat=now)
        return {"release": self.pilots.released(pilot), "stop": False}

    def _on_pilot_leaving(self, message: dict[str, Any], now: float) -> dict[str, Any]:
        pilot = message["pilot"]
        self.state.upsert_pilot(pilot, state="leaving") if any(p["id"] == pilot for p in self.state.pilots()) else None
        for node in message["nodes"]:
            row = next((n for n in self.state.nodes() if n["name"] == node), None)
            if row is None or row["state"] == "gone":
                continue
            self._drop_node(node, "leaving", now, deadline=message["deadline"])
            self.state.log("node.leaving", pilot=pilot, node=node, deadline=message["deadline"])
        self.dirty = True
        return {}

    # ------------------------------------------------------------ polled events

    def _on_pilot_event(self, event: PilotEvent, now: float) -> None:
        if event.kind == "started":
            self.state.log("pilot.started", pilot=event.pilot, scheduler_id=event.scheduler_id, nodes=list(event.nodes))
            self.state.upsert_pilot(event.pilot, scheduler_id=event.scheduler_id, **({"walltime_end": event.deadline} if event.deadline else {}))
        elif event.kind == "preempted":
            self.state.log("pilot.preempted", pilot=event.pilot, nodes=list(event.nodes), deadline=event.deadline)
        elif event.kind == "ended":
            self.state.upsert_pilot(event.pilot, state="ended", ended=now)
            self.state.log("pilot.ended", pilot=event.pilot, why=event.detail)
            for node in self.state.nodes():
                if node["pilot"] == event.pilot and node["state"] != "gone":
                    self._drop_node(node["name"], "gone", now)
                    self.state.log("node.gone", pilot=event.pilot, node=node["name"])
            self._heartbeats.pop(event.pilot, None)
            self.dirty = True

    def _on_rank_exit(self, exit_: RankExit, now: float) -> None:
        job = self.state.job(exit_.job_id)
        if job is None or job.status in TERMINAL or exit_.requested:
            return
        if not exit_.host:
            # The whole job's launcher ended without the job reporting a result or a failure.
            self._release_job_nodes(job.id)
            crashes = 1 + sum(1 for e in self.state.events("job.crashed") if e["job"] == job.id)
            self.state.log("job.crashed", job=job.id, returncode=exit_.returncode, crashes=crashes)
            if crashes >= JOB_RETRIES:
                log_tail = self._log_tail(job.id)
                self.state.set_job(job.id, status="failed", nodes=[], ended=now, error=f"the job's launcher exited {exit_.returncode} {crashes} times; last output:\n{log_tail}")
                self.state.log("job.failed", job=job.id, error=f"launcher exited {exit_.returncode}")
            else:
                self.state.set_job(job.id, status="pending", nodes=[])
            self.dirty = True
            return
        if exit_.crashed:
            # A rank died on its own: the job loses that node, not its life.
            self.state.log("rank.lost", job=job.id, node=exit_.host, returncode=exit_.returncode)
            nodes = [n for n in job.nodes if n != exit_.host]
            self.state.set_node(exit_.host, job=None)
            self.state.set_job(job.id, nodes=nodes, status="running" if nodes else "pending")
            if not nodes:
                self.runtime.stop(job.id)
            self.dirty = True

    def _check_heartbeats(self, now: float) -> None:
        deadline = self.config.pilots.heartbeat_deadline_s
        for pilot in self.state.pilots(("running", "leaving")):
            last = self._heartbeats.setdefault(pilot["id"], now)
            if now - last > deadline:
                self.state.upsert_pilot(pilot["id"], state="lost", ended=now)
                self.state.log("pilot.lost", pilot=pilot["id"], silent_s=round(now - last, 1))
                for node in self.state.nodes():
                    if node["pilot"] == pilot["id"] and node["state"] != "gone":
                        self._drop_node(node["name"], "gone", now)
                        self.state.log("node.lost", pilot=pilot["id"], node=node["name"])
                self._scheduler_call("cancel", self.scheduler.cancel, pilot["id"])
                self.dirty = True

    # ------------------------------------------------------------ allocation

    def _active_jobs(self):
        jobs = self.state.jobs(("pending", "running"))
        return jobs[: self.config.controller.max_jobs]

    def _problem(self, extra_nodes: int = 0) -> Problem:
        """The allocation problem now; ``extra_nodes`` adds hypothetical idle nodes (pilot sizing)."""
        jobs, current = [], {}
        ready = [n["name"] for n in self.state.nodes() if n["state"] == "ready"]
        for row in self._active_jobs():
            spec = row.spec
            if spec.get("curve"):
                curve = ScalingCurve(tuple(spec["curve"]["nodes"]), tuple(spec["curve"]["samples_per_s"]))
            else:
                curve = self.profiler.curve(row.id, spec["min_nodes"], spec["max_nodes"])
            total = spec.get("total_samples")
            remaining = max(total - row.progress, 0.0) if total else math.inf
            jobs.append(Job(row.id, spec["min_nodes"], spec["max_nodes"], curve, spec["scale_up_cost_s"], spec["scale_down_cost_s"], remaining, spec["weight"]))
            held = [n for n in row.nodes if n in ready]
            if held:
                current[row.id] = frozenset(held)
        pool = ready + [f"+idle-{i}" for i in range(extra_nodes)]
        return Problem(tuple(jobs), NodePool(tuple(pool)), current, self.config.controller.t_fwd)

    def reallocate(self, now: float) -> None:
        self.dirty = False
        problem = self._problem()
        began = time.perf_counter()
        answer = allocate(problem, time_limit_s=self.config.controller.solver_time_limit_s)
        solve_ms = (time.perf_counter() - began) * 1000
        rows = {r.id: r for r in self._active_jobs()}
        moved = {}
        for job_id, row in rows.items():
            old = sorted(problem.current.get(job_id, ()))
            new = sorted(answer.assignment.get(job_id, ()))
            if old == new and (row.status == "running") == bool(new):
                continue
            for n in old:
                if n not in new:
                    self.state.set_node(n, job=None)
            for n in new:
                self.state.set_node(n, job=job_id)
            if new and row.status != "running":
                self.runtime.start(job_id, row.spec, new)
                self.state.set_job(job_id, status="running", nodes=new, started=row.started or now, launches=row.launches + 1)
                self.state.log("job.started", job=job_id, nodes=new, progress=row.progress)
            elif not new:
                self.runtime.stop(job_id)
                self.state.set_job(job_id, status="pending", nodes=[])
                self.state.log("job.stopped", job=job_id, nodes_before=old)
            else:
                self.runtime.resize(job_id, new)
                self.state.set_job(job_id, nodes=new, rescales=row.rescales + 1)
                self.state.log("job.resized", job=job_id, before=len(old), after=len(new), nodes=new)
            self._contributing[job_id] = self._contributing.get(job_id, set()) & set(new)
            moved[job_id] = len(new)
        self.state.log("allocation", solve_ms=round(solve_ms, 3), method=answer.method, counts=dict(answer.counts), moved=moved, pool=len(problem.pool.nodes))
        self.pilots.give_back_unused(now)

    # ------------------------------------------------------------ helpers

    def _known_job(self, job_id: str):
        job = self.state.job(job_id)
        if job is None:
            raise ProtocolError(f"no job {job_id!r}")
        return job

    def _drop_node(self, node: str, new_state: str, now: float, deadline: float | None = None) -> None:
        """Take a node out of the pool; the job on it shrinks at the next allocation."""
        row = next((n for n in self.state.nodes() if n["name"] == node), None)
        if row and row["job"]:
            job = self.state.job(row["job"])
            if job is not None and node in job.nodes:
                nodes = [n for n in job.nodes if n != node]
                self._contributing.get(job.id, set()).discard(node)
                self.runtime.resize(job.id, nodes) if nodes else self.runtime.stop(job.id)
                self.state.set_job(job.id, nodes=nodes, status="running" if nodes else "pending", rescales=job.rescales + 1)
                self.state.log("job.resized" if nodes else "job.stopped", job=job.id, before=len(job.nodes), after=len(nodes), nodes=nodes, cause=f"node {node} {new_state}")
        self.state.set_node(node, state=new_state, job=None, since=now, deadline=deadline)

    def _release_job_nodes(self, job_id: str) -> None:
        for node in self.state.nodes():
            if node["job"] == job_id:
                self.state.set_node(node["name"], job=None)

    def _log_tail(self, job_id: str, chars: int = 3000) -> str:
        for name in (f"{job_id}.horovodrun.log",):
            path = self.run_dir / "logs" / name
            if path.exists():
                return path.read_text(errors="replace")[-chars:]
        return ""

    def _forget_dead_processes(self) -> None:
        for p in self.state.processes():
            if not procs.alive(p["pid"], p["start_ticks"]):
                self.state.drop_process(p["pid"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pilotfill-controller", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", required=True, type=Path)
    ap.add_argument("--config", default=None, help="config file or name (default: the embedded local cluster)")
    args = ap.parse_args(argv)
    private_dir(args.run_dir)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        handlers=[logging.FileHandler(args.run_dir / "controller.log"), logging.StreamHandler()],
    )
    controller = Controller(args.run_dir, load_config(args.config))

    def stop(signum, frame) -> None:
        controller.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    controller.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
