"""The controller as a child of ``pilotfill run``: started, watched, restarted, stopped.

The controller recovers from its own death by design (a new one on the same
run directory carries on from the journal and adopts the trainings that still
run), so the campaign that started it also restarts it: a controller killed
mid-campaign costs a few seconds, not the campaign. What ends a campaign is a
crash loop, not deaths spread over a campaign that gets on between them: a
death starts a new row when the controller ran ``healthy_s``, or ran
``settled_s`` and the campaign made progress under it (samples reported or
committed, a job ended: :func:`progress_mark`, read from the journal). Progress
alone does not do: ranks a new controller adopts report within a second of its
start, so a controller that dies at every start would otherwise never be
counted. After ``max_restarts`` deaths in a row the campaign ends with one line. A
controller that stops because its state cannot be written (a full disk, a
read-only file) or because its config cannot work is not restarted — the
campaign ends with that one line instead of hanging.
"""

from __future__ import annotations

import json
import logging
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from . import procs
from .controller.process import EXIT_CONFIG, EXIT_JOURNAL
from .lease import Lease
from .journal import JournalError, Journal

log = logging.getLogger("pilotfill.supervisor")

START_TIMEOUT_S = 120.0
STOP_WAIT_S = 60.0
"""A controller told to stop (SIGTERM) has this long to stop its jobs and pilots before it is killed."""
HEALTHY_S = 120.0
"""A controller that ran this long before it died was well: its death is the first of a new row."""
SETTLED_S = 10.0
"""…and one that listened this long while the campaign got on under it (a crash loop dies at its start)."""

Mark = tuple[float, float, int]
"""What a campaign has done: its jobs' counted samples, their committed samples, the jobs that ended."""


def progress_mark(run_dir: Path) -> Mark | None:
    """What the campaign has done so far, as the journal says (one read of the jobs' table); None where it cannot be
    read. Counted samples fall back to the last commit when a job is requeued, so marks are compared after the new
    controller's take-over, from one start to the next death."""
    try:
        state = Journal(run_dir, readonly=True)
    except (JournalError, OSError):
        return None
    try:
        row = state.db.execute(
            "SELECT COALESCE(SUM(progress), 0), COALESCE(SUM(committed), 0), "
            "COALESCE(SUM(status IN ('finished', 'failed', 'cancelled')), 0) FROM jobs"
        ).fetchone()
        return float(row[0]), float(row[1]), int(row[2])
    except sqlite3.Error:
        return None
    finally:
        state.close()


def made_progress(before: Mark | None, after: Mark | None) -> bool:
    """Whether the campaign got on between two marks: more samples reported or committed, or more jobs ended."""
    return before is not None and after is not None and any(a > b for a, b in zip(after, before))


class ControllerFailed(RuntimeError):
    """The controller cannot run (it says why), or died too often to go on."""


def last_line(path: Path) -> str:
    """The last non-empty line a controller printed (its one-line reason when it stops on purpose)."""
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1].strip() if lines else ""


class ControllerSupervisor:
    """Runs ``python -m pilotfill.controller`` on ``run_dir`` and keeps it running for the campaign."""

    def __init__(
        self,
        run_dir: Path,
        config: str | None,
        checkpoint_dir: Path,
        new_campaign: bool = True,
        max_restarts: int = 3,
        on_fatal: Callable[[str], None] = lambda why: None,
        healthy_s: float = HEALTHY_S,
        settled_s: float = SETTLED_S,
    ):
        self.run_dir, self.config, self.checkpoint_dir = Path(run_dir), config, Path(checkpoint_dir)
        self.new_campaign = new_campaign
        self.max_restarts = max_restarts
        self.on_fatal = on_fatal
        self.restarts = 0  # deaths in a row (a crash loop: each soon after its start, with no progress in between)
        self.healthy_s, self.settled_s = healthy_s, settled_s
        self._started_at = self._listening_at = time.monotonic()
        self._mark: Mark | None = None  # what the campaign had done when the running controller started
        self.fatal: str | None = None
        self.fatal_config = False  # the controller stopped because the site config can never work (one line, exit 2)
        self.proc: subprocess.Popen | None = None
        self._signalled: subprocess.Popen | None = None  # the controller stop() told to stop
        self._stopping = threading.Event()
        self._stop_lock = threading.Lock()
        self._watcher: threading.Thread | None = None
        self.lease = Lease(self.run_dir)

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Renew the run's lease (pilots wait for a restarted controller while it lives: :mod:`pilotfill.lease`),
        start the controller and wait until it listens; then watch it on a thread."""
        self.lease.start()
        try:
            self.proc = self._spawn(self.new_campaign)
        except BaseException:
            self.lease.end()
            raise
        self._watcher = threading.Thread(target=self._watch, name="pilotfill-controller-watch", daemon=True)
        self._watcher.start()

    def stop(self) -> None:
        """SIGTERM (the controller stops its jobs and pilots), SIGKILL after a minute; nothing of the run survives.
        Safe to call from several threads (the campaign's end and an interrupt): the second waits for the first."""
        with self._stop_lock:
            self._stop()

    def _stop(self) -> None:
        self._stopping.set()
        proc = self.proc
        if proc is not None and proc.poll() is None:
            self._signalled = proc
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                procs.kill_group(proc.pid)
                proc.wait()
        if self._watcher is not None:
            self._watcher.join(timeout=STOP_WAIT_S + 10)  # a controller it was restarting meanwhile is stopped there
        for pid in procs.with_environment(PILOTFILL_RUN_DIR=str(self.run_dir)):
            procs.kill_pid(pid)
        self.lease.end()  # nothing will restart a controller: agents still waiting for one end their pilots

    # ------------------------------------------------------------ helpers

    def _spawn(self, new_campaign: bool) -> subprocess.Popen:
        argv = [
            sys.executable,
            "-m",
            "pilotfill.controller",
            "--run-dir",
            str(self.run_dir),
            "--checkpoint-dir",
            str(self.checkpoint_dir),
        ]
        if self.config:
            argv += ["--config", self.config]
        if new_campaign:
            argv.append("--new-campaign")
        out = self.run_dir / "controller.out"
        proc = procs.spawn(argv, log_path=str(out))
        self._started_at = time.monotonic()
        endpoint = self.run_dir / "controller.json"
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise ControllerFailed(self._why(proc.returncode))
            try:
                if json.loads(endpoint.read_text())["pid"] == proc.pid:
                    # after its take-over: a requeued job's samples fell back already
                    self._mark = progress_mark(self.run_dir)
                    self._listening_at = time.monotonic()
                    return proc
            except (OSError, ValueError, KeyError, TypeError):
                pass
            time.sleep(0.1)
        procs.kill_group(proc.pid)
        raise ControllerFailed(f"the controller did not start within {START_TIMEOUT_S:.0f} s (see {out})")

    def _why(self, code: int) -> str:
        line = last_line(self.run_dir / "controller.out")
        if code in (EXIT_CONFIG, EXIT_JOURNAL) and line:
            return line.removeprefix("pilotfill controller: ")
        if not line:  # it could not even say why: a full disk is the usual reason
            from .campaign import short_of_space

            full = short_of_space(self.run_dir)
            if full is not None:
                return f"the controller could not run on {self.run_dir}: {full}"
        if code < 0:
            return f"the controller was killed ({signal.Signals(-code).name}); see {self.run_dir / 'controller.out'}"
        return f"the controller exited ({code}); see {self.run_dir / 'controller.out'}"

    def _watch(self) -> None:
        try:
            self._watch_until_stopped()
        finally:
            # A controller this thread restarted dies with it (PR_SET_PDEATHSIG follows the thread that started it):
            # the thread lasts until that controller has stopped, so that it stops cleanly, not SIGKILLed mid-stop.
            proc = self.proc
            if proc is not None and proc.poll() is None and self._stopping.is_set():
                if proc is not self._signalled:
                    proc.send_signal(signal.SIGTERM)  # restarted while the campaign was stopping: stopped here
                try:
                    proc.wait(timeout=STOP_WAIT_S)
                except subprocess.TimeoutExpired:
                    procs.kill_group(proc.pid)
                    proc.wait()

    def _watch_until_stopped(self) -> None:
        while not self._stopping.wait(0.5):
            proc = self.proc
            if proc is None or proc.poll() is None:
                continue
            code = proc.returncode
            if self._stopping.is_set():
                return
            if time.monotonic() - self._started_at >= self.healthy_s or self._got_on():
                self.restarts = 0  # it ran well, or the campaign got on under it: this death starts a new row
            if code in (EXIT_CONFIG, EXIT_JOURNAL) or self.restarts >= self.max_restarts:
                why = self._why(code)
                self.fatal_config = code == EXIT_CONFIG
                if code not in (EXIT_CONFIG, EXIT_JOURNAL):
                    why = (
                        f"the controller died {self.restarts + 1} times in a row, each within {self.healthy_s:.0f} s "
                        "of its start "
                        f"without the campaign getting on under it for {self.settled_s:.0f} s (a crash loop); {why}"
                    )
                self._give_up(why)
                return
            self.restarts += 1
            log.warning(
                "the controller exited (%s); restarting it on %s (%d of %d)",
                code,
                self.run_dir,
                self.restarts,
                self.max_restarts,
            )
            try:
                self.proc = self._spawn(new_campaign=False)  # it recovers: running jobs resume from their commits
            except ControllerFailed as exc:
                self._give_up(str(exc))
                return

    def _got_on(self) -> bool:
        """Whether the controller that just died listened ``settled_s`` while the campaign made progress."""
        return time.monotonic() - self._listening_at >= self.settled_s and made_progress(
            self._mark, progress_mark(self.run_dir)
        )

    def _give_up(self, why: str) -> None:
        self.fatal = why
        log.info("giving up on the controller: %s", why)
        self.lease.end()
        self.on_fatal(why)
