"""``pilotfill run``: a campaign script run as ordinary Parsl code, with elastic apps on harvested nodes.

It starts the controller as its own process on a run directory
(``runs/<id>/`` beside the campaign, or ``--run-dir``), loads Parsl with the
``ElasticExecutor`` beside a thread pool for ordinary apps and a memoizer that
checkpoints every finished app, runs the script, waits for every app it
launched, shuts everything down and leaves no process behind. Re-running a
campaign reuses the checkpoints of earlier runs beside it, so trainings that
finished before a crash are not run again. Campaign scripts do not call
``parsl.load`` themselves.
"""

from __future__ import annotations

import json
import runpy
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import parsl
from parsl.config import Config
from parsl.dataflow.memoization import BasicMemoizer
from parsl.executors import ThreadPoolExecutor
from parsl.utils import get_all_checkpoints

from . import procs
from .config import load_config
from .executors import ElasticExecutor
from .security import private_dir


class CampaignError(RuntimeError):
    """The campaign could not be started (missing script, bad config, no controller)."""


@dataclass
class Outcome:
    """What happened to the apps a campaign launched."""

    run_dir: Path
    done: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)  # (app, reason)
    cached: int = 0

    @property
    def ok(self) -> bool:
        return not self.failed


def default_run_dir(script: Path) -> Path:
    return script.parent / "runs" / f"{datetime.now():%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def start_controller(run_dir: Path, config: str | None, timeout_s: float = 60.0) -> subprocess.Popen:
    """The controller as its own process; it dies with this one (and its ranks with it)."""
    argv = [sys.executable, "-m", "pilotfill.controller", "--run-dir", str(run_dir)]
    if config:
        argv += ["--config", config]
    proc = procs.spawn(argv, log_path=str(run_dir / "controller.out"))
    endpoint = run_dir / "controller.json"
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise CampaignError(f"the controller exited ({proc.returncode}):\n{(run_dir / 'controller.out').read_text()[-3000:]}")
        try:
            if json.loads(endpoint.read_text())["pid"] == proc.pid:
                return proc
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.1)
    procs.kill_group(proc.pid)
    raise CampaignError(f"the controller did not start within {timeout_s:.0f} s")


def stop_controller(proc: subprocess.Popen, run_dir: Path) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            procs.kill_group(proc.pid)
            proc.wait()
    for pid in procs.with_environment(PILOTFILL_RUN_DIR=str(run_dir)):
        procs.kill_pid(pid)


def _record_submissions(dfk) -> list:
    """Keep every AppFuture the campaign creates (the DFK forgets finished tasks)."""
    futures: list = []
    submit = dfk.submit

    def recording_submit(*args, **kwargs):
        future = submit(*args, **kwargs)
        futures.append(future)
        return future

    dfk.submit = recording_submit
    return futures


def run_campaign(script: Path, config: str | None = None, run_dir: Path | None = None) -> Outcome:
    script = Path(script).resolve()
    if not script.is_file():
        raise CampaignError(f"{script}: no such campaign file")
    load_config(config)  # fail here, with the file and key, rather than in the controller
    run_dir = private_dir(Path(run_dir).resolve() if run_dir else default_run_dir(script))
    parsl_dir = run_dir.parent / "parsl"
    controller = start_controller(run_dir, config)
    outcome = Outcome(run_dir)
    dfk = None
    try:
        dfk = parsl.load(
            Config(
                executors=[ElasticExecutor(run_dir), ThreadPoolExecutor(label="local", max_threads=4)],
                run_dir=str(parsl_dir),
                memoizer=BasicMemoizer(checkpoint_mode="task_exit", checkpoint_files=get_all_checkpoints(str(parsl_dir))),
                initialize_logging=True,
            )
        )
        futures = _record_submissions(dfk)
        sys.path.insert(0, str(script.parent))
        runpy.run_path(str(script), run_name="__main__")
        dfk.wait_for_current_tasks()
        for future in futures:
            task = future.task_record
            exc = future.exception()
            if exc is not None:
                outcome.failed.append((task["func_name"], f"{type(exc).__name__}: {exc}"))
            else:
                outcome.done += 1
                outcome.cached += bool(task.get("from_memo"))
    finally:
        if dfk is not None:
            dfk.cleanup()
        parsl.clear()
        stop_controller(controller, run_dir)
    return outcome
