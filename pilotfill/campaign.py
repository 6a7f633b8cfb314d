"""``pilotfill run``: a campaign script run as ordinary Parsl code, with elastic apps on harvested nodes.

It starts the controller as its own process on a run directory
(``runs/<id>/`` beside the campaign, or ``--run-dir``) and keeps it running
(:mod:`pilotfill.supervisor`), loads Parsl with the ``ElasticExecutor`` beside a
thread pool for ordinary apps and a memoizer that checkpoints every finished
app, runs the script, waits for every app it launched, shuts everything down
and leaves no process behind. Campaign scripts do not call ``parsl.load``.

Re-running a campaign loses nothing: apps that finished are taken from
Parsl's checkpoints beside the run directory, and trainings that had not
finished resume from their last durable commit — a training is matched to
its earlier run by its call (function and arguments), and its commits live in
``runs/checkpoints/`` beside the run directories. Everything the campaign
writes is private to the user (created under umask 077), and a checkpoint
that someone else could have written is refused, never loaded.

Anything wrong with the campaign, the config or a path is one line naming the
file (and line) and exit code 2 (:class:`CampaignError`); an exception in the
campaign's own code shows that code's traceback, not pilotfill's.

Ctrl-C (SIGINT), SIGTERM and SIGHUP are a stop (:class:`Interrupt`): the
controller is stopped as ``pilotfill run`` stops it at the end — it ends every
job's ranks, deletes every pilot (``qdel``, ``scancel``, or ends the local
cluster's) and records ``controller.stopped`` — then the apps still waiting
fail with "interrupted", and ``pilotfill run`` exits 130. Trainings resume from
their last commit when the campaign is run again. A second Ctrl-C while that
stop runs only says so; once the stop is done, it leaves at once.
"""

from __future__ import annotations

import logging
import os
import runpy
import secrets
import signal
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from .config import load_config


class CampaignError(RuntimeError):
    """The campaign cannot start or go on: one line, naming the file (and line) or the reason."""


class CampaignScriptError(RuntimeError):
    """The campaign's own code raised; ``str()`` is its traceback, trimmed to the campaign's frames."""


@dataclass
class Outcome:
    """What happened to the apps a campaign launched."""

    run_dir: Path
    done: int = 0
    failed: list[tuple[str, BaseException]] = field(default_factory=list)  # (app call, its exception)
    cached: int = 0
    fatal: str | None = None  # why the campaign could not go on (the controller could not), if it could not
    stopped: str | None = None  # where the campaign's script stopped on a failed app's result, if it did
    # what the user should know that is not a failure (an unsaved result)
    notes: list[str] = field(default_factory=list)
    interrupted: str | None = None  # the signal that stopped it (Ctrl-C: "SIGINT"), if one did

    @property
    def ok(self) -> bool:
        return not self.failed and self.fatal is None and self.stopped is None and self.interrupted is None


class Interrupt:
    """Ctrl-C, SIGTERM or SIGHUP to ``pilotfill run``: the campaign stops as it would at its end (see the module
    docstring), never by the controller dying with its parent (which leaves every pilot holding its nodes until its
    agent gives up, 10 minutes later: recheck (b)).

    Install it on the main thread (:meth:`installed`); :func:`run_campaign` attaches the stop. The stop runs on a
    thread of its own, so the main thread goes on showing progress meanwhile. ``say`` prints a line for the user.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self, say: Callable[[str], None] = lambda text: print(text, file=sys.stderr, flush=True)):
        self.say = say
        self.signal: signal.Signals | None = None
        self.done = threading.Event()  # the stop has run: pilots deleted, controller stopped
        self._stop: Callable[[str], None] | None = None
        self._lock = threading.Lock()
        self._started = False

    @property
    def why(self) -> str:
        return f"interrupted ({self.signal.name})" if self.signal is not None else ""

    def installed(self):
        """A context manager: the handlers set on entry (main thread only), the previous ones back on exit."""
        import contextlib

        @contextlib.contextmanager
        def manager():
            previous = {sig: signal.signal(sig, self._on_signal) for sig in self.SIGNALS}
            try:
                yield self
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

        return manager()

    def attach(self, stop: Callable[[str], None]) -> None:
        """What a stop does (set once the controller runs); a signal that came before runs it now."""
        with self._lock:
            self._stop = stop
            pending = self.signal is not None
        if pending:
            self._begin()

    def _on_signal(self, signum, frame) -> None:
        if self.signal is not None:
            if self.done.is_set():
                self.say("pilotfill: stopped; leaving now")
                os._exit(130)
            self.say(
                "pilotfill: still stopping: ending the trainings and deleting the pilots (Ctrl-C again once that is "
                "done leaves at once)"
            )
            return
        self.signal = signal.Signals(signum)
        self.say(
            f"pilotfill: {self.signal.name}: stopping — ending the trainings and deleting the pilots; they resume "
            "from their commits next time"
        )
        self._begin()

    def _begin(self) -> None:
        with self._lock:
            stop = self._stop
            if stop is None or self._started:
                return  # no controller yet: run_campaign attaches the stop, and runs it then
            self._started = True

        def run() -> None:
            try:
                stop(self.why)
            finally:
                self.done.set()

        threading.Thread(target=run, name="pilotfill-interrupt", daemon=True).start()


def default_run_dir(script: Path) -> Path:
    return script.parent / "runs" / f"{datetime.now():%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def _record_submissions(dfk, apps=None) -> list:
    """Keep every AppFuture the campaign creates (the DFK forgets finished tasks), and count them."""
    futures: list = []
    submit = dfk.submit
    lock = threading.Lock()

    def recording_submit(*args, **kwargs):
        future = submit(*args, **kwargs)
        with lock:
            futures.append(future)
        if apps is not None:
            apps.track(future)
        return future

    dfk.submit = recording_submit
    return futures


def check_script(script: Path) -> Path:
    """The campaign file, resolved; one line if it is missing, a directory, unreadable or not Python."""
    script = Path(script).resolve()
    if script.is_dir():
        raise CampaignError(
            f"{script}: is a directory: give the campaign's file (a Python script), e.g. {script / 'campaign.py'}"
        )
    if not script.is_file():
        raise CampaignError(f"{script}: no such campaign file")
    try:
        source = script.read_bytes()
        compile(source, str(script), "exec")
    except OSError as exc:
        raise CampaignError(f"{script}: cannot read it: {exc.strerror or exc}") from None
    except SyntaxError as exc:
        raise CampaignError(f"{script}:{exc.lineno}: {exc.msg}") from None
    except ValueError as exc:  # null bytes
        raise CampaignError(f"{script}: not a Python file: {exc}") from None
    return script


WRITTEN = (
    "",
    "controller.out",
    "controller.log",
    "controller.json",
    "state.sqlite",
    "state.sqlite-wal",
    "state.sqlite-shm",
    "logs",
)
"""What a run writes in its run directory ("": the directory itself)."""


def cannot_use(path: Path, exc: OSError) -> CampaignError:
    """One line naming what stops the run and what to do about it: the innermost existing part of ``path`` is asked why
    it cannot be written (immutable, append-only, read-only, not yours), else the system's words."""
    from .journal import unwritable

    probe = Path(path)
    while not os.path.lexists(probe) and probe != probe.parent:
        probe = probe.parent
    why = unwritable(probe) or f"{exc.filename or path}: {exc.strerror or exc}"
    return CampaignError(f"{path}: cannot use it: {why}")


MIN_FREE_BYTES = 1 << 20
"""A run starts only with this much room on its disk: less cannot hold the controller's journal and first logs, and the
controller would die before it could say why."""


def short_of_space(path: Path) -> str | None:
    """Why the disk holding ``path`` (or its nearest existing parent) is too full to start a run, else None."""
    import shutil

    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        free = shutil.disk_usage(probe).free
    except OSError:
        return None
    if free >= MIN_FREE_BYTES:
        return None
    return (
        f"its disk is full ({free // 1024} KB free; a run needs at least {MIN_FREE_BYTES >> 20} MB for its journal and "
        "logs): free some space"
    )


def prepare_run_dir(run_dir: Path) -> Path:
    """The run directory, created private; one line if it cannot be, or if anything the run writes there cannot be
    written (an immutable or append-only file, a read-only filesystem, a full disk): said now, naming the file."""
    from .security import private_dir
    from .journal import unwritable

    run_dir = Path(run_dir).resolve()
    if run_dir.exists() and not run_dir.is_dir():
        raise CampaignError(f"--run-dir {run_dir}: is a file, not a directory")
    full = short_of_space(run_dir)
    if full is not None:
        raise CampaignError(f"{run_dir}: cannot use it: {full}")
    for name in WRITTEN if run_dir.exists() else ():
        why = unwritable(run_dir / name)
        if why is not None:
            raise CampaignError(f"--run-dir {run_dir}: cannot use it: {why}")
    try:
        return private_dir(run_dir)
    except OSError as exc:
        raise cannot_use(run_dir, exc) from None


def reuse_notes(
    reused: list[tuple[str, tuple, dict]],
    changed: list[tuple[str, tuple, dict]],
    call_name: Callable[[str, tuple, dict], str],
) -> list[str]:
    """What the summary says of results taken from earlier calls, and of apps whose code changed since a run."""
    def calls(items: list[tuple[str, tuple, dict]]) -> str:
        names = [call_name(*item) for item in items]
        return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")

    notes = []
    if reused:
        notes.append(
            f"{calls(reused)}: {'its result was' if len(reused) == 1 else 'their results were'} taken from an earlier "
            "call with the same "
            f"code and arguments (cached apps; edit the app, or give it cache=False, to run it again)"
        )
    for function in dict.fromkeys(name for name, _, _ in changed):
        count = sum(name == function for name, _, _ in changed)
        notes.append(
            f"{function}: its code changed since an earlier run: {count} call{'s' if count != 1 else ''} ran anew "
            f"instead of taking {'its' if count == 1 else 'their'} earlier result"
        )
    return notes


class LoadedByPilotfill:
    """What a campaign's own ``parsl.load(config)`` returns under ``pilotfill run``: Parsl is already loaded (the
    elastic executor, a thread pool, the checkpoints), so the campaign's config is not loaded again — its ``retries``
    and ``retry_handler`` are taken, the rest is said to be pilotfill's — and leaving ``with parsl.load(...)`` waits
    for the apps instead of shutting Parsl down under ``pilotfill run``."""

    ADOPTED = ("retries", "retry_handler")

    def __init__(self, dfk, note: Callable[[str], None]):
        self._dfk, self._note = dfk, note

    def load(self, config=None):
        if config is not None:
            taken = []
            for name in self.ADOPTED:
                value = getattr(config, name, None)
                if value not in (None, 0) and value != getattr(self._dfk.config, name, None):
                    setattr(self._dfk.config, name, value)
                    taken.append(f"{name}={value!r}")
            self._note(
                "parsl.load(): pilotfill run has loaded Parsl with its own executors (elastic apps on harvested nodes, "
                "python_apps in a local thread pool); "
                + (
                    f"took {', '.join(taken)} from the campaign's config"
                    if taken
                    else "the campaign's config is not used"
                )
            )
        return self

    def __enter__(self):
        return self._dfk

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self._dfk.wait_for_current_tasks()

    def __getattr__(self, name):
        return getattr(self._dfk, name)


@contextmanager
def campaigns_parsl(dfk, note: Callable[[str], None]) -> Iterator[None]:
    """While the campaign's script runs, its ``parsl.load(...)`` is :class:`LoadedByPilotfill`, not Parsl's "Config has
    already been loaded"."""
    import parsl
    from parsl.dataflow.dflow import DataFlowKernelLoader

    loaded = LoadedByPilotfill(dfk, note)
    saved = parsl.load, DataFlowKernelLoader.__dict__["load"]
    parsl.load = loaded.load
    DataFlowKernelLoader.load = staticmethod(loaded.load)
    try:
        yield
    finally:
        parsl.load = saved[0]
        DataFlowKernelLoader.load = saved[1]


def _script_frames(exc: BaseException, script: Path) -> str:
    """The traceback of ``exc`` from the campaign's first frame on (pilotfill's and runpy's frames dropped)."""
    frames = traceback.extract_tb(exc.__traceback__)
    first = next((i for i, f in enumerate(frames) if Path(f.filename) == script), 0)
    lines = [
        "Traceback (most recent call last):\n",
        *traceback.format_list(frames[first:]),
        *traceback.format_exception_only(type(exc), exc),
    ]
    return "".join(lines).rstrip()


def _line_in(exc: BaseException, script: Path) -> int | None:
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if Path(frame.filename) == script:
            return frame.lineno
    return None


def run_campaign(script: Path, config: str | None = None, run_dir: Path | None = None, apps=None, on_run_dir=None,
                 interrupt: Interrupt | None = None) -> Outcome:  # fmt: skip
    """Run ``script`` as a campaign (see the module docstring). ``apps``: a :class:`pilotfill.progress.AppCounts`
    to count the apps in as they go; ``on_run_dir``: told the run directory as soon as it exists; ``interrupt``:
    an installed :class:`Interrupt`, whose signal stops the campaign."""
    os.umask(0o077)  # the run's files (logs, checkpoints, state) are the user's alone
    logging.raiseExceptions = False  # a full disk must not turn every log line into a printed traceback
    script = check_script(script)
    site = load_config(config)  # fail here, with the file and key, rather than in the controller
    run_dir = Path(run_dir if run_dir else default_run_dir(script)).resolve()
    lock = lock_runs(run_dir)  # before anything is written: a second run of this campaign here refuses
    try:
        return _run_locked(script, config, run_dir, apps, on_run_dir, interrupt, site.runtime.kind)
    finally:
        lock.close()


class _Lock:
    def __init__(self, fd: int):
        self.fd = fd

    def close(self) -> None:
        os.close(self.fd)  # the kernel drops the lock (also when the process dies, however it dies)


LOCK_FILE = ".lock"
"""In ``runs/checkpoints/``: held by the ``pilotfill run`` that uses ``runs/``."""


def lock_runs(run_dir: Path) -> _Lock:
    """Hold the ``runs/`` of ``run_dir`` (the Parsl checkpoints and the trainings' commits, shared by every run of the
    campaigns there) for this run alone; another ``pilotfill run`` holding it is one line naming it. An ``flock``:
    it goes with the process, so a killed run never leaves it held."""
    import fcntl

    from .security import private_dir

    runs = run_dir.parent
    try:
        folder = private_dir(runs / "checkpoints")
        fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise cannot_use(runs / "checkpoints" / LOCK_FILE, exc) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, 4096, 0).decode(errors="replace").strip()
        os.close(fd)
        raise CampaignError(
            f"{runs}: another pilotfill run is using it ({holder or 'pid unknown'}); a second one would train the "
            "same calls again: wait for it to end, or run this campaign from another directory"
        ) from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}, run directory {run_dir}".encode(), 0)
    except OSError as exc:  # a full disk: one line naming the file, not a traceback
        os.close(fd)
        raise cannot_use(runs / "checkpoints" / LOCK_FILE, exc) from None
    return _Lock(fd)


def _run_locked(
    script: Path, config: str | None, run_dir: Path, apps, on_run_dir, interrupt: Interrupt | None, runtime: str
) -> Outcome:
    import parsl
    from parsl.config import Config
    from parsl.executors import ThreadPoolExecutor

    from .checkpoints import CampaignMemoizer, UnsafeCheckpoint, parsl_checkpoints
    from .executors import ElasticExecutor
    from .executors.decorator import ElasticAppError
    from .executors.elastic import CampaignHalted, call_name
    from .progress import is_app_failure
    from .supervisor import ControllerFailed, ControllerSupervisor

    run_dir = prepare_run_dir(run_dir)
    if on_run_dir is not None:
        on_run_dir(run_dir)
    runs = run_dir.parent
    parsl_dir, checkpoint_dir = runs / "parsl", runs / "checkpoints"
    try:
        os.makedirs(parsl_dir, exist_ok=True)
        # Parsl makes runs/parsl/NNN here: fail now in one line, not later in its long traceback
        os.rmdir(tempfile.mkdtemp(dir=parsl_dir))
    except OSError as exc:
        raise cannot_use(parsl_dir, exc) from None
    try:
        checkpoints = parsl_checkpoints(parsl_dir, runs)
    except UnsafeCheckpoint as exc:
        raise CampaignError(str(exc)) from None
    outcome = Outcome(run_dir)
    executor = ElasticExecutor(
        run_dir, default_runtime=runtime, on_note=apps.note if apps is not None else lambda text: None
    )

    def fatal(why: str) -> None:
        outcome.fatal = why
        executor.fail_all(f"the campaign cannot go on: {why}")

    supervisor = ControllerSupervisor(
        run_dir, config, checkpoint_dir, new_campaign=(run_dir / "state.sqlite").exists(), on_fatal=fatal
    )

    def stop(why: str) -> None:
        # an interrupt: as at the end — the controller ends the jobs, deletes the pilots, records it
        outcome.interrupted = why
        supervisor.stop()
        executor.fail_all(f"the campaign was {why}")

    try:
        supervisor.start()
    except ControllerFailed as exc:
        raise CampaignError(str(exc)) from None
    if interrupt is not None:
        interrupt.attach(stop)
    dfk = None
    memoizer = CampaignMemoizer(checkpoint_files=checkpoints)
    try:
        dfk = parsl.load(
            Config(
                executors=[executor, ThreadPoolExecutor(label="local", max_threads=4)],
                run_dir=str(parsl_dir),
                memoizer=memoizer,
                initialize_logging=True,
            )
        )
        futures = _record_submissions(dfk, apps)
        sys.path.insert(0, str(script.parent))
        stopped = None
        try:
            with campaigns_parsl(dfk, apps.note if apps is not None else outcome.notes.append):
                runpy.run_path(str(script), run_name="__main__")
        except ElasticAppError as exc:
            raise CampaignError(f"{script}:{_line_in(exc, script) or '?'}: {exc}") from None
        except Exception as exc:
            stopped = exc
        if supervisor.fatal_config:  # the site config can never work: that one line, not a list of apps it stopped
            raise CampaignError(outcome.fatal or supervisor.fatal or "the controller stopped")
        if outcome.interrupted is None:  # interrupted: the apps still running on this machine are not waited for
            dfk.wait_for_current_tasks()
        for future in list(futures):
            task = future.task_record
            if not future.done():  # interrupted while it ran on this machine: not waited for
                outcome.failed.append(
                    (
                        call_name(task["func_name"], tuple(task.get("args") or ()), dict(task.get("kwargs") or {})),
                        CampaignHalted(f"the campaign was {outcome.interrupted}"),
                    )
                )
                continue
            exc = future.exception()
            if exc is not None:
                outcome.failed.append(
                    (call_name(task["func_name"], tuple(task.get("args") or ()), dict(task.get("kwargs") or {})), exc)
                )
            else:
                outcome.done += 1
                outcome.cached += bool(task.get("from_memo"))
        if stopped is not None and outcome.fatal is None and outcome.interrupted is None:
            if not is_app_failure(stopped, [e for _, e in outcome.failed]):
                raise CampaignScriptError(_script_frames(stopped, script))
            outcome.stopped = (
                f"{script}:{_line_in(stopped, script) or '?'}: the campaign stopped on a failed app's result"
            )
        outcome.notes += reuse_notes(memoizer.reused, memoizer.changed, call_name)
        for name, args, kwargs, why in memoizer.unsaved:
            outcome.notes.append(
                f"{call_name(name, args, kwargs)}: its result is kept for this run but cannot be checkpointed ({why}); "
                "a re-run runs it again"
            )
    finally:
        if dfk is not None:
            dfk.cleanup()
        parsl.clear()
        supervisor.stop()
    if outcome.fatal is None and supervisor.fatal is not None:
        outcome.fatal = supervisor.fatal
    return outcome
