"""The agent that runs inside every pilot job: the controller's hands on the pilot's nodes.

It registers the pilot's nodes with the controller, then keeps one heartbeat
waiting at the controller (a long poll): the reply comes at once when there is
something to do — start or end a job's processes on one of its nodes, give a
node back, stop — and otherwise after ``heartbeat_s``, which is how the
controller knows the pilot is alive. Processes that ended are reported with
the next heartbeat.

Every process of a job on the pilot's nodes goes through here, and here it
ends: on a ``stop`` command, when its node is given back, when the controller
that started it is replaced (its jobs were requeued), and on SIGTERM — the
batch system's preemption notice, or a cancel — which the agent first turns
into an immediate ``pilot.leaving`` (the controller reallocates at once), then
ends what runs on its nodes within the grace period. Processes it did not
start itself (ranks that Horovod started over ssh) are found on the node by
their environment.

    python -m pilotfill.pilots.agent --run-dir RUN --pilot ID [--nodes a,b] [--scheduler local|slurm|pbs]
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from .. import procs
from ..elastic.launch import LocalLauncher
from ..transport import Client, ControllerUnavailable, Interrupted, RequestRefused

log = logging.getLogger("pilotfill.agent")

ORPHAN_AFTER_S = 600.0
"""An agent that has heard from no controller for this long (or 60 heartbeats) ends its pilot: a campaign
whose controller is gone for good leaves no pilot behind holding nodes."""


class Agent:
    def __init__(self, run_dir: str, pilot: str, nodes: list[str], scheduler_id: str, heartbeat_s: float, grace_s: float, scheduler: str = "local"):
        self.run_dir = str(Path(run_dir).resolve())
        self.pilot, self.nodes, self.scheduler_id = pilot, list(nodes), scheduler_id
        self.heartbeat_s, self.grace_s, self.scheduler = heartbeat_s, grace_s, scheduler
        self.client = Client(run_dir, timeout_s=max(heartbeat_s * 2, 10.0))
        self.launcher = LocalLauncher(log_dir=Path(run_dir) / "logs", grace_s=grace_s)  # a job's processes get the pilot's grace to go
        self.leaving_at: float | None = None
        self.incarnation: int | None = None
        self.orphan_after_s = max(ORPHAN_AFTER_S, 60 * heartbeat_s)
        self._heard_at = time.monotonic()
        self._exits: list[dict] = []
        self._here = socket.gethostname().split(".")[0]
        signal.signal(signal.SIGTERM, self._on_term)

    def _on_term(self, signum, frame) -> None:
        if self.leaving_at is None:
            self.leaving_at = time.time()

    # ------------------------------------------------------------ the loop

    def run(self) -> int:
        registered = False
        while True:
            if self.leaving_at is not None:
                return self._leave()
            try:
                if not registered:
                    reply = self.client.request({"type": "pilot.register", "pilot": self.pilot, "nodes": self.nodes, "scheduler_id": self.scheduler_id,
                                                 "pid": os.getpid()}, interrupt=self._leaving)  # fmt: skip
                    if reply.get("stop"):
                        return self._end(0, "the controller does not want this pilot")
                    registered = True
                    log.info("registered %s", self.nodes)
                reply = self._heartbeat()
                self._heard_at = time.monotonic()
                self._follow_controller(reply.get("incarnation"))
                if reply.get("register"):
                    registered = False  # a new controller does not know us yet
                    continue
                for command in reply.get("commands", []):  # before releases: a job's processes end on a node it leaves
                    self._do(command)
                for node in reply.get("release", []):
                    self._end_on(node)
                    if node in self.nodes:
                        self.nodes.remove(node)
                        log.info("released %s", node)
                if reply.get("stop") or not self.nodes:
                    return self._end(0, "stopped by the controller" if reply.get("stop") else "no node left")
            except Interrupted:
                continue
            except ControllerUnavailable:
                if time.monotonic() - self._heard_at > self.orphan_after_s:
                    # No controller for this long: none will come back for us. End the pilot rather than hold nodes idle.
                    return self._end(4, f"no controller for {self.orphan_after_s:.0f} s")
                log.warning("controller unavailable; retrying")
                self._sleep(min(1.0, self.heartbeat_s))
            except RequestRefused as exc:
                log.error("controller refused: %s", exc)
                return self._end(3, f"refused: {exc}")

    def _heartbeat(self) -> dict:
        """One long poll: returns when the controller has something for us, or after ``heartbeat_s``."""
        self._exits += [{"host": e.host, "job": e.job_id, "code": e.returncode, "requested": e.requested} for e in self.launcher.exits()]
        exits, self._exits = self._exits, []
        try:
            return self.client.request({"type": "pilot.heartbeat", "pilot": self.pilot, "wait_s": self.heartbeat_s, "exits": exits},
                                       timeout_s=self.heartbeat_s + 30.0, attempt_s=self.heartbeat_s + 10.0, interrupt=self._leaving)  # fmt: skip
        except BaseException:
            self._exits = exits + self._exits  # told next time
            raise

    def _leaving(self) -> bool:
        return self.leaving_at is not None

    def _follow_controller(self, incarnation) -> None:
        """A new controller requeued every job the old one ran: what the old one started here must end."""
        if isinstance(incarnation, int):
            if self.incarnation is not None and incarnation != self.incarnation:
                log.info("controller %s replaced %s: ending its jobs' processes", incarnation, self.incarnation)
                for node in self.nodes:
                    self._end_on(node)
            self.incarnation = incarnation

    # ------------------------------------------------------------ commands

    def _do(self, command: dict) -> None:
        op, job, host = command.get("op"), command.get("job"), command.get("host")
        if host not in self.nodes or not isinstance(job, str):
            if op != "stop":  # a stop for a node already given back has nothing left to do
                log.warning("ignored a command for %s, not a node of this pilot: %s", host, command)
            return
        if op == "start":
            argv, env = command.get("argv"), command.get("env") or {}
            if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
                log.error("ignored a start without a command line: %s", command)
                return
            env = {str(k): str(v) for k, v in env.items()}
            try:
                self.launcher.launch(host, job, self._on_node(host, argv, env), env)
            except OSError as exc:  # the command cannot be run here: the job loses this node, the agent goes on
                log.error("could not start %s on %s: %s", job, host, exc)
                self._exits.append({"host": host, "job": job, "code": 127, "requested": False})
                return
            log.info("started %s on %s", job, host)
        elif op == "stop":
            self._end_job(host, job)
            log.info("ended %s on %s", job, host)

    def _on_node(self, host: str, argv: list[str], env: dict[str, str]) -> list[str]:
        """``argv`` as run on ``host``: here, or through the batch system onto another node of this pilot."""
        if self.scheduler == "local" or host.split(".")[0].split("[")[0] == self._here:
            return argv
        with_env = ["env", *(f"{k}={v}" for k, v in {**env, "PILOTFILL_HOST": host}.items()), *argv]
        if self.scheduler == "slurm":
            return ["srun", "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={host}", "--kill-on-bad-exit=1", *with_env]
        if self.scheduler == "pbs":
            return ["pbs_tmrsh", host.split("[")[0], *with_env]
        return argv

    def _end_job(self, host: str, job: str) -> None:
        """End a job's processes on a node: those we started, and any it started itself (found by environment)."""
        self.launcher.terminate(host, job)
        self._terminate_later(list(self._found_on(host, PILOTFILL_JOB_ID=job)))

    def _end_on(self, node: str) -> None:
        """End every job's processes on ``node`` (it is given back, its pilot is leaving, or its controller is gone)."""
        jobs = set()
        for host, job in self.launcher.running():
            if host == node:
                self.launcher.terminate(host, job)
                jobs.add(job)
        found = self._found_on(node)
        self._terminate_later(list(found))
        for job in sorted(jobs | {j for j in found.values() if j}):
            log.info("ended %s on %s", job, node)

    def _found_on(self, node: str, **wanted: str) -> dict[int, str]:
        """This run's processes on ``node`` (pid -> job), by their environment: the node each says it is on (ours, or
        Horovod's ``HOROVOD_HOSTNAME``), else this machine (a node where nothing says: a compute node of its own)."""
        found = {}
        for pid, env in procs.environments(PILOTFILL_RUN_DIR=self.run_dir, **wanted).items():
            on = env.get("PILOTFILL_HOST") or env.get("HOROVOD_HOSTNAME")
            if on == node or (on is None and self.scheduler != "local" and node.split(".")[0].split("[")[0] == self._here):
                found[pid] = env.get("PILOTFILL_JOB_ID", "")
        return found

    def _terminate_later(self, pids: list[int]) -> None:
        """SIGTERM now, SIGKILL after the grace (without blocking the loop)."""
        pids = [p for p in pids if p != os.getpid()]
        if not pids:
            return
        ticks = {p: procs.start_ticks(p) for p in pids}
        for pid in pids:
            procs.signal_pid(pid, signal.SIGTERM)

        def kill() -> None:
            for pid, t in ticks.items():
                if procs.alive(pid, t):
                    procs.kill_pid(pid)

        timer = threading.Timer(self.launcher.grace_s, kill)
        timer.daemon = True
        timer.start()

    # ------------------------------------------------------------ leaving

    def _leave(self) -> int:
        """SIGTERM: tell the controller first (it moves the jobs at once), then end everything here within the grace."""
        deadline = self.leaving_at + self.grace_s
        log.info("SIGTERM: leaving by %.1f", deadline)
        code = 0
        try:
            self.client.request({"type": "pilot.leaving", "pilot": self.pilot, "nodes": self.nodes, "deadline": deadline},
                                timeout_s=max(0.5, self.grace_s * 0.5))  # fmt: skip
        except (ControllerUnavailable, RequestRefused) as exc:
            log.error("could not tell the controller: %s", exc)
            code = 1
        self.launcher.grace_s = max(0.5, deadline - time.time())  # what is left of the grace: SIGKILL before the batch system's
        self._end(code, "leaving")
        return code

    def _end(self, code: int, why: str) -> int:
        """End every process on our nodes (SIGTERM, SIGKILL after the grace), wait for them, and go."""
        log.info("ending (%s)", why)
        for node in self.nodes:
            self._end_on(node)
        end = time.monotonic() + self.launcher.grace_s + 1.0
        while self.launcher.running() and time.monotonic() < end:
            self.launcher.exits()
            time.sleep(0.05)
        self.launcher.close()
        return code

    def _sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while self.leaving_at is None and time.monotonic() < end:
            time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pilotfill-agent", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--pilot", required=True)
    ap.add_argument("--nodes", default=None, help="comma-separated node names this pilot holds (default: ask the batch system)")
    ap.add_argument("--scheduler", default="local", help="local, slurm or pbs: where to find this job's id and nodes, and how to reach them")
    ap.add_argument("--scheduler-id", default=None)
    ap.add_argument("--heartbeat-s", type=float, default=1.0)
    ap.add_argument("--grace-s", type=float, default=5.0)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s agent {args.pilot} %(levelname)s %(message)s")
    if args.nodes is not None:
        nodes, scheduler_id = [n for n in args.nodes.split(",") if n], args.scheduler_id or ""
    else:
        import importlib

        adapter = importlib.import_module(f"pilotfill.schedulers.{args.scheduler}")
        nodes, scheduler_id = adapter.nodes_of_this_job(), args.scheduler_id or adapter.id_of_this_job()
    return Agent(args.run_dir, args.pilot, nodes, scheduler_id, args.heartbeat_s, args.grace_s, scheduler=args.scheduler).run()


if __name__ == "__main__":
    sys.exit(main())
