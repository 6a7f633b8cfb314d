"""The controller as a process: a ZeroMQ server on the wall clock, stopped by SIGTERM.

    python -m pilotfill.controller --run-dir RUN [--config FILE]

Each tick serves a bounded batch of requests, committed together, then steps
the controller, so a flood of messages can never starve heartbeat checks or the
allocation. A controller started on a run directory that a dead one left behind adopts
the pilots and trainings that still run, requeues the other running jobs (their
committed progress kept), kills what its predecessor ran that nobody adopted,
keeps finished results, and carries on (:mod:`pilotfill.controller.recovery`). When the journal
cannot be written (a full disk, a read-only file) it stops everything it
started and exits with :data:`EXIT_JOURNAL` and one line saying why: nothing
it answered is lost, and a controller started after space is freed carries on.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time
from pathlib import Path

from ..config import ConfigError, load_config
from ..schedulers.base import SchedulerConfigError
from ..security import private_dir
from ..journal import JournalError, unwritable
from ..transport import Server
from .collection import collecting_rarely
from .core import MAX_BATCH, Controller

log = logging.getLogger("pilotfill.controller")

EXIT_CONFIG = 2
EXIT_JOURNAL = 3


def one_pass(controller: Controller, server: Server) -> int:
    """One pass of the loop: the requests that arrive within a tick (none while the controller is busy; at most
    :data:`MAX_BATCH`; none at all when the pass solves the whole machine), then one step. Returns the requests
    handled."""
    tick_ms = max(1, int(controller.config.controller.tick_s * 1000))
    reads = 0 if controller.solves_next else MAX_BATCH  # a pass is the replies to a batch or one solve, never both
    handled = server.serve(controller.handle, 0 if controller.busy else tick_ms, max_batch=reads,
                           together=controller.together)
    controller.step(more=handled >= MAX_BATCH)
    return handled


def serve(controller: Controller, server: Server) -> None:
    """The loop: a bounded batch of requests, then one step, until asked to stop; then the same loop while the
    ranks leave at their commits (their agents must still be heard: they carry the stop and its outcome)."""
    while not controller.stopping:
        one_pass(controller, server)
    began = time.monotonic()
    deadline = controller.begin_stop()
    while not controller.ranks_gone() and time.monotonic() < deadline:
        one_pass(controller, server)
    log.info("stopping: ranks %s after %.1f s",
             "gone" if controller.ranks_gone() else "still running (their pilots end them)", time.monotonic() - began)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pilotfill-controller", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", required=True, type=Path)
    ap.add_argument("--config", default=None, help="config file or name (default: the embedded local cluster)")
    ap.add_argument("--new-campaign", action="store_true",
                    help="a campaign starts anew here: jobs left open wait to be claimed by its calls")
    ap.add_argument("--checkpoint-dir", type=Path, default=None,
                    help="where trainings commit, by call (default: RUN_DIR/checkpoints)")
    args = ap.parse_args(argv)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"pilotfill controller: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        private_dir(args.run_dir)
        logging.basicConfig(
            level=logging.INFO,
            format="%(asctime)s %(name)s %(levelname)s %(message)s",
            handlers=[logging.FileHandler(args.run_dir / "controller.log"), logging.StreamHandler()],
        )
    except OSError as exc:
        print(f"pilotfill controller: stopping, the run's state cannot be written: {_why_not(args.run_dir, exc)}",
              file=sys.stderr, flush=True)
        return EXIT_JOURNAL
    controller = None
    try:
        controller = Controller(args.run_dir, config, new_campaign=args.new_campaign,
                                checkpoint_dir=args.checkpoint_dir)
        try:
            server = Server(args.run_dir, controller.key, host=config.controller.bind,
                            incarnation=controller.incarnation, not_before=controller.started)
        except Exception as exc:  # an address that cannot be bound: one line, not a traceback (and the last line)
            controller.shutdown()
            print(f"pilotfill controller: cannot listen on {config.controller.bind!r} "
                  f"({config.source}: controller.bind): {exc}", file=sys.stderr, flush=True)
            return EXIT_CONFIG

        def stop(signum, frame) -> None:
            controller.stopping = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        controller.wake = server.wake  # long polls: a pilot's waiting heartbeat is answered when it has news
        try:
            controller.scheduler.check()  # a config no pilot could ever run with: one line now, not a silent wait
            server.publish(incarnation=controller.incarnation)
            log.info("controller %d on %s at %s", controller.incarnation, args.run_dir, server.endpoint)
            try:
                with collecting_rarely():
                    serve(controller, server)
            finally:
                server.close()
        except SchedulerConfigError as exc:
            log.error("stopping: %s", exc)
            controller.shutdown()
            print(f"pilotfill controller: {exc}", file=sys.stderr, flush=True)
            return EXIT_CONFIG
        controller.shutdown()
        return 0
    except (JournalError, OSError) as exc:
        why = str(exc) if isinstance(exc, JournalError) else _why_not(args.run_dir, exc)
        log.error("stopping: %s", why)
        if controller is not None:
            _stop_without_journal(controller)
        # The last line the controller prints: what `pilotfill run` shows.
        print(f"pilotfill controller: stopping, the run's state cannot be written: {why}", file=sys.stderr, flush=True)
        return EXIT_JOURNAL


def _why_not(run_dir: Path, exc: OSError) -> str:
    """What is wrong with the file an OSError names (immutable, read-only, …), else the error itself, with its
    file."""
    where = Path(exc.filename) if exc.filename else Path(run_dir)
    return unwritable(where) or unwritable(where.parent) or f"{where}: {exc.strerror or exc}"


def _stop_without_journal(controller: Controller) -> None:
    """Stop ranks and pilots; nothing can be recorded (what was committed stands)."""
    for close in (controller.runtime.close, controller.scheduler.close):
        try:
            close()
        except Exception as exc:  # best effort: the process is ending
            log.error("while stopping: %s", exc)


if __name__ == "__main__":
    sys.exit(main())
