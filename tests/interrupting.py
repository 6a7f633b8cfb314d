"""Ctrl-C for the campaign tests: ``pilotfill run`` in a session of its own (as in a terminal), SIGINT to its
process group (what the terminal sends on Ctrl-C), and what a run leaves behind on this machine."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from waiting import wait_for

from pilotfill.journal import Journal


def start_run(campaign: Path, config: Path, run_dir: Path, out: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """``pilotfill run CAMPAIGN`` as a terminal runs it: the leader of its own process group."""
    return subprocess.Popen([sys.executable, "-m", "pilotfill", "run", str(campaign), "--config", str(config), "--run-dir", str(run_dir)],
                            cwd=campaign.parent, env={**os.environ, **(env or {})}, stdout=open(out, "wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip


def ctrl_c(proc: subprocess.Popen, timeout_s: float = 300) -> int:
    """SIGINT to the run's process group, as Ctrl-C in its terminal; its exit status."""
    os.killpg(proc.pid, signal.SIGINT)
    try:
        return proc.wait(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def run_processes(run_dir: Path) -> list[str]:
    """Processes of this run still on this machine: with the run directory in their environment (ranks, the store,
    workers) or on their command line (the controller, pilot agents). Their command lines."""
    needle_env, needle_cmd = f"PILOTFILL_RUN_DIR={run_dir}".encode(), str(run_dir).encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read().split(b"\0")
            with open(f"/proc/{entry}/stat", "rb") as f:
                zombie = f.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
        except OSError:
            continue
        if not zombie and (needle_env in environ or needle_cmd in cmdline):
            shown = cmdline.replace(b"\0", b" ").decode(errors="replace")[:200]
            found.append(f"{entry}: {shown}")
    return found


def wait_until_nothing_left(run_dir: Path, grace_s: float, timeout_s: float = 90) -> None:
    """Every process of the run gone, counted from the call (``pilotfill run`` has exited): its agents, told to go, end within their
    grace period — asserted with 20 s of room for a busy machine; before the fix they lived on until "no controller
    for 600 s"."""
    exited = time.monotonic()
    wait_for(lambda: not run_processes(run_dir), timeout_s, "every process of the run to end", detail=lambda: "\n".join(run_processes(run_dir)))
    late = time.monotonic() - exited
    assert late <= grace_s + 20.0, f"the run's processes outlived pilotfill run by {late:.0f} s (grace {grace_s:g} s)"


def journal(run_dir: Path, kind: str) -> list[dict]:
    state = Journal(run_dir, readonly=True)
    try:
        return state.events(kind)
    finally:
        state.close()
