"""Waiting for a condition in a test, with a generous limit (CI's machine may be busy) and a message naming what."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str, poll_s: float = 0.1, detail: Callable[[], str] | None = None) -> Any:
    """Return the first true value of ``predicate()``; after ``timeout_s``, raise naming ``what`` (and ``detail()``, a log tail)."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll_s)
    more = detail() if detail is not None else ""
    raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}" + (f"\n{more}" if more else ""))


def wait_for_exit(proc: subprocess.Popen, timeout_s: float, what: str, out: Path | None = None, run_dir: Path | None = None) -> int:
    """``proc``'s exit status; after ``timeout_s``, raise naming ``what`` with what a reader needs to see why it did not
    end: the tail of its output, of the controller's log and the journal's last events."""
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}\n{run_tails(out, run_dir)}") from None


def run_tails(out: Path | None, run_dir: Path | None, chars: int = 3000) -> str:
    """The last of a run's output, its controller.log and its journal, for a failure message."""
    parts = []
    for name, path in (("output", out), ("controller.log", run_dir / "controller.log" if run_dir else None)):
        if path is not None and path.exists():
            parts.append(f"--- {name} (last {chars} chars)\n{path.read_text(errors='replace')[-chars:]}")
    if run_dir is not None and (run_dir / "state.sqlite").exists():
        parts.append("--- events:\n" + event_lines(run_dir))
    return "\n".join(parts)


def event_lines(run_dir: Path, last: int = 60) -> str:
    """A run's last events but reports and heartbeats, one a line, with seconds since the first shown."""
    import json

    from pilotfill.journal import Journal

    state = Journal(run_dir, readonly=True)
    try:
        events = [e for e in state.events() if e["kind"] not in ("job.report", "node.heartbeat")]
    finally:
        state.close()
    t0 = events[0]["time"] if events else 0.0
    return "\n".join(f"{e['time'] - t0:8.1f} {e['kind']:<20} {e.get('job') or ''} {e.get('node') or ''} "
                     f"{json.dumps(e['data'])[:160]}" for e in events[-last:])  # fmt: skip
