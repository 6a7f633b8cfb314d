"""Running a batch system's commands: timeouts, retries with backoff, and errors that say what happened.

A scheduler command can fail (the server is restarting), hang (a dead
network filesystem) or print something unexpected. Every call goes through
:func:`run`: it times out, retries transient failures with exponential
backoff, logs the command and its output, and raises a
:class:`SchedulerCommandError` naming both; callers decide what is fatal. The
controller treats none of it as fatal: it logs, keeps its state and tries
again on a later tick.
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

log = logging.getLogger("pilotfill.schedulers")


class SchedulerCommandError(RuntimeError):
    """A batch-system command failed, hung, or printed what we cannot parse."""

    def __init__(self, argv: Sequence[str], message: str, returncode: int | None = None, output: str = ""):
        self.argv, self.returncode, self.output = list(argv), returncode, output
        shown = output.strip()[-500:]
        super().__init__(f"`{' '.join(argv)}` {message}" + (f": {shown}" if shown else ""))


@dataclass(frozen=True)
class Result:
    returncode: int
    stdout: str
    stderr: str


def run(
    argv: Sequence[str],
    timeout_s: float = 30.0,
    retries: int = 2,
    backoff_s: float = 1.0,
    ok_codes: Sequence[int] = (0,),
    final_codes: Sequence[int] = (),
    env: Mapping[str, str] | None = None,
) -> Result:
    """Run ``argv``; retry on timeouts and on exit codes outside ``ok_codes`` and ``final_codes``.

    ``final_codes`` are answers, not failures (e.g. "unknown job"): returned at
    once without retrying, like ``ok_codes``.
    """
    attempt = 0
    while True:
        attempt += 1
        try:
            proc = subprocess.run(
                list(argv),
                capture_output=True,
                text=True,
                timeout=timeout_s,
                env={**os.environ, **(env or {})},
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired as exc:
            error = SchedulerCommandError(
                argv, f"timed out after {timeout_s:g} s", None, _text(exc.stdout) + _text(exc.stderr)
            )
        except OSError as exc:
            raise SchedulerCommandError(argv, f"could not be run: {exc}") from None
        else:
            if proc.returncode in ok_codes or proc.returncode in final_codes:
                return Result(proc.returncode, proc.stdout, proc.stderr)
            error = SchedulerCommandError(argv, f"exited {proc.returncode}", proc.returncode, proc.stdout + proc.stderr)
        log.warning("%s (attempt %d of %d)", error, attempt, retries + 1)
        if attempt > retries:
            raise error
        time.sleep(backoff_s * 2 ** (attempt - 1))


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def reason_of(exc: BaseException) -> str:
    """The batch system's own words for a failed submission, short enough for a progress line."""
    reason = getattr(exc, "reason", "")
    if reason:
        return str(reason)
    if isinstance(exc, SchedulerCommandError):
        said = exc.output.strip().splitlines()
        if exc.returncode is None:  # timed out, could not be run, not run: what it says after the command line
            text = str(exc)
            return (
                f"{exc.argv[0] if exc.argv else 'command'}: "
                f"{text.split('` ', 1)[1] if text.startswith('`') and '` ' in text else text}"
            )[:200]
        return f"{said[-1] if said else 'no message'} (exit {exc.returncode})"
    return str(exc).splitlines()[0][-200:] if str(exc) else type(exc).__name__
