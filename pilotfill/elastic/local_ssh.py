"""A local stand-in for ``ssh``, put on horovodrun's PATH on the local virtual cluster.

Horovod starts a rank on a host that does not resolve to a local address with
``ssh [-o …] HOST [-p PORT] [-i KEY] 'cd …; env … python …'``. On the local
cluster every "host" is this machine, so this runs the command here, with
``PILOTFILL_HOST=HOST`` in its environment so the rank knows where it "is".
It dies with its parent (the Horovod driver's worker thread) and forwards
SIGTERM/SIGINT. When the command dies on its own on a host the job still owns
(not a shrink, not ended through this process by horovodrun), it leaves an
exit record for the runtime: a rank that was killed costs its job that host,
not the job.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from ..procs import die_with_parent

OPTIONS_WITH_VALUE = {
    "-o",
    "-p",
    "-i",
    "-l",
    "-F",
    "-J",
    "-b",
    "-c",
    "-E",
    "-e",
    "-m",
    "-O",
    "-Q",
    "-S",
    "-W",
    "-w",
    "-D",
    "-L",
    "-R",
}


def parse(argv: list[str]) -> tuple[str, str]:
    """(host, command) from ssh's argument list; options may come before or right after the host."""
    host, i = None, 0
    while i < len(argv):
        arg = argv[i]
        if arg in OPTIONS_WITH_VALUE:
            i += 2
        elif arg.startswith("-"):
            i += 1
        elif host is None:
            host, i = arg, i + 1
        else:
            break
    if host is None:
        raise SystemExit("local ssh stand-in: no host given")
    return host.split("@")[-1], " ".join(argv[i:])


def main(argv: list[str] | None = None) -> int:
    host, command = parse(list(sys.argv[1:] if argv is None else argv))
    die_with_parent()
    env = {**os.environ, "PILOTFILL_HOST": host}
    told: list[int] = []
    started: list[subprocess.Popen] = []

    def forward(signum: int, frame: object) -> None:
        told.append(signum)
        for child in started:
            child.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)  # before the command starts: an end asked for at any time is seen as asked
    child = subprocess.Popen(["bash", "-c", command or "true"], env=env, preexec_fn=die_with_parent)
    started.append(child)
    if told:
        child.send_signal(told[0])
    code = child.wait()
    if code != 0 and not told:  # ended by horovodrun (a host it gave up, its shutdown): its decision, not a crash
        _record_exit(host, code)
    return code if code >= 0 else 128 - code


def _record_exit(host: str, code: int) -> None:
    run_dir, job, exits = (
        os.environ.get("PILOTFILL_RUN_DIR"),
        os.environ.get("PILOTFILL_JOB_ID"),
        os.environ.get("PILOTFILL_EXITS_FILE"),
    )
    if not run_dir or not job or not exits:
        return
    hosts_file = Path(run_dir) / "discovery" / f"{job}.hosts"
    try:
        still_mine = host in {line.split(":")[0] for line in hosts_file.read_text().split()}
    except OSError:
        return
    if still_mine:
        with open(exits, "a") as f:  # this start's own file: an end after the job started again is not the new start's
            f.write(f"{host} {code}\n")


if __name__ == "__main__":
    sys.exit(main())
