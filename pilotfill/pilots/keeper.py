"""The top process of what a pilot runs on another host of its batch job: ``python -m pilotfill.pilots.keeper``.

A pilot that spans hosts starts a job's processes on its sister hosts through
the batch system (``pbs_tmrsh HOST …``): each becomes a task of that host's
MOM, which counts the task's session and tells the job has ended only when the
session is empty. MOM sees its task's top process exit at once (it is MOM's
child), but nothing else of the session: when the top process goes first —
a torch elastic agent before its forkserver, a rank before the children it
started — MOM notices the rest is gone only when its ``kill_delay`` timer fires,
and a main job waiting for the pilot's nodes waits that long. The keeper is
that top process: it runs the command as its child in the same session (so
MOM's own kill reaches it), takes every orphan below it as a child subreaper,
and exits only once the whole session is gone, with the command's status.

It also writes the command's output to ``--log`` (the run directory, on the
file system every node shares; capped and rotated as every rank's log is,
:data:`pilotfill.procs.LOG_LIMIT_BYTES`): a task's output through ``pbs_tmrsh``
reaches no file of the run otherwise.

    python -m pilotfill.pilots.keeper [--log FILE] [--settle-s S] -- ARGV…

SIGTERM, SIGINT and SIGHUP do not end the keeper: MOM's kill reaches the
command too, and the pilot's agent ends a job's processes by their own
environment (which the keeper's lacks) — so the command hears each signal
once, and the keeper waits for it.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import threading

from .. import procs

SETTLE_S = 10.0
"""After the command exits, what is left of the session gets this long to go before SIGKILL."""


def keep(argv: list[str], log: str | None = None, settle_s: float = SETTLE_S) -> int:
    procs.become_subreaper()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    try:
        child = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if log else None,
            stderr=subprocess.STDOUT if log else None,
            preexec_fn=_child_setup,
        )
    except OSError as exc:
        print(f"pilotfill keeper: cannot run {argv[0]!r}: {exc}", file=sys.stderr, flush=True)
        return 127
    pump = threading.Thread(target=procs.pump_log, args=(child.stdout, log), daemon=True) if log else None
    if pump is not None:
        pump.start()
    code = child.wait()
    if pump is not None:
        pump.join(timeout=5)
    procs.settle_session(settle_s)
    return 128 - code if code < 0 else code


def _child_setup() -> None:
    """In the child: signals back to their defaults (the keeper ignores them), dying with the keeper."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    procs.die_with_parent()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pilotfill.pilots.keeper", description=__doc__.split("\n\n")[0])
    ap.add_argument("--log", default=None, help="append the command's output here")
    ap.add_argument("--settle-s", type=float, default=SETTLE_S)
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- ARGV…")
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("a command is required after --")
    return keep(command, args.log, args.settle_s)


if __name__ == "__main__":
    sys.exit(main())
