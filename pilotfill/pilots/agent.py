"""The agent that runs inside every pilot job.

It registers the pilot's nodes with the controller, heartbeats, and turns
SIGTERM — the batch system's preemption notice, or a cancel — into an
immediate ``pilot.leaving`` so the controller removes ranks from those nodes
inside the grace period. A controller that stops answering is retried (a new
one on the same run directory picks the pilot up); a missed heartbeat
deadline is how the controller learns that an agent died.

    python -m pilotfill.pilots.agent --run-dir RUN --pilot ID --nodes a,b --scheduler-id 123
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time

from ..transport import Client, ControllerUnavailable, RequestRefused

log = logging.getLogger("pilotfill.agent")


class Agent:
    def __init__(self, run_dir: str, pilot: str, nodes: list[str], scheduler_id: str, heartbeat_s: float, grace_s: float):
        self.pilot, self.nodes, self.scheduler_id = pilot, list(nodes), scheduler_id
        self.heartbeat_s, self.grace_s = heartbeat_s, grace_s
        self.client = Client(run_dir, timeout_s=heartbeat_s)
        self.leaving_at: float | None = None
        signal.signal(signal.SIGTERM, self._on_term)

    def _on_term(self, signum, frame) -> None:
        if self.leaving_at is None:
            self.leaving_at = time.time()

    def run(self) -> int:
        registered = False
        while True:
            if self.leaving_at is not None:
                return self._leave()
            try:
                if not registered:
                    self.client.request({"type": "pilot.register", "pilot": self.pilot, "nodes": self.nodes, "scheduler_id": self.scheduler_id, "pid": os.getpid()})
                    registered = True
                    log.info("registered %s", self.nodes)
                reply = self.client.request({"type": "pilot.heartbeat", "pilot": self.pilot})
                if reply.get("register"):
                    registered = False  # a new controller does not know us yet
                    continue
                released = set(reply.get("release", []))
                if released:
                    self.nodes = [n for n in self.nodes if n not in released]
                    log.info("released %s", sorted(released))
                if reply.get("stop") or not self.nodes:
                    return 0
            except ControllerUnavailable:
                log.warning("controller unavailable; retrying")
            except RequestRefused as exc:
                log.error("controller refused: %s", exc)
                return 3
            self._sleep(self.heartbeat_s)

    def _leave(self) -> int:
        deadline = self.leaving_at + self.grace_s
        log.info("SIGTERM: leaving by %.1f", deadline)
        try:
            self.client.request({"type": "pilot.leaving", "pilot": self.pilot, "nodes": self.nodes, "deadline": deadline}, timeout_s=max(0.5, self.grace_s * 0.8))
        except (ControllerUnavailable, RequestRefused) as exc:
            log.error("could not tell the controller: %s", exc)
            return 1
        return 0

    def _sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while self.leaving_at is None and time.monotonic() < end:
            time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pilotfill-agent", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--pilot", required=True)
    ap.add_argument("--nodes", default=None, help="comma-separated node names this pilot holds (default: ask the batch system)")
    ap.add_argument("--scheduler", default="local", help="local, slurm or pbs: where to find this job's id and nodes")
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
    return Agent(args.run_dir, args.pilot, nodes, scheduler_id, args.heartbeat_s, args.grace_s).run()


if __name__ == "__main__":
    sys.exit(main())
