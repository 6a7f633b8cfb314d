"""What ``pilotfill run`` shows while a campaign runs, and how it reports what failed.

In a terminal: one rich progress line at the bottom — apps done of launched,
jobs training, nodes held, samples per second — under the campaign's own
output. Not in a terminal (piped, in a batch job): a plain line when the
counts change, at most every few seconds. ``--quiet``: nothing but the
campaign's output and the summary. The numbers come from the apps' futures
and from the controller (``state.snapshot``, authenticated, read-only).

A failed app is reported once, with its remote traceback trimmed to the
user's own frames; an app that did not run because one it depended on failed
is one line, and so is an app whose code needs another runtime (the line says
how to run it); pilotfill's and Parsl's frames are never shown. Counts are
said in words ("1 job", "2 jobs"), and nothing is shown before the campaign
has started: a bad config or campaign is its one line alone.
"""

from __future__ import annotations

import sysconfig
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from .lifecycle import JobStatus, NodeState

T = TypeVar("T")
PLAIN_EVERY_S = 10.0
INTERNAL = tuple(
    str(Path(p).resolve())
    for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
)
PILOTFILL = str(Path(__file__).resolve().parent)


@dataclass
class AppCounts:
    """Apps a campaign launched, as their futures resolve (updated from Parsl's threads)."""

    launched: int = 0
    done: int = 0
    failed: int = 0
    # said once each, above the progress line (an app's runtime chosen by its code)
    notes: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def note(self, text: str) -> None:
        with self.lock:
            self.notes.append(text)

    def track(self, future) -> None:
        with self.lock:
            self.launched += 1
        future.add_done_callback(self._resolved)

    def _resolved(self, future) -> None:
        with self.lock:
            if future.exception() is None:
                self.done += 1
            else:
                self.failed += 1


@dataclass
class Machine:
    """What the controller says: jobs training, nodes held, samples per second (from progress between reads)."""

    running: int = 0
    nodes: int = 0
    rate: float = 0.0
    # (line, level): the first of the controller's notices (why the campaign waits)
    notice: tuple[str, str] | None = None
    _last: tuple[float, float] | None = None

    def read(self, run_dir: Path) -> None:
        from .tui import RunUnreadable, notice_lines, read_snapshot

        try:
            snap, _ = read_snapshot(run_dir)
        except (RunUnreadable, OSError):
            return
        lines = notice_lines(snap)
        self.notice = lines[0] if lines else None
        jobs = snap.get("jobs", [])
        self.running = sum(1 for j in jobs if j["status"] == JobStatus.RUNNING)
        self.nodes = sum(1 for n in snap.get("nodes", []) if n["state"] == NodeState.READY)
        total, now = sum(j["progress"] for j in jobs), time.monotonic()
        if self._last is not None and now > self._last[0]:
            self.rate = max(0.0, (total - self._last[1]) / (now - self._last[0]))
        self._last = (now, total)


def plural(n: int, word: str) -> str:
    """``1 job``, ``2 jobs``, ``0 jobs``."""
    return f"{n:,} {word}" if n == 1 else f"{n:,} {word}s"


def training(machine: Machine) -> str:
    return (
        f"{plural(machine.running, 'job')} training on {plural(machine.nodes, 'node')} · {machine.rate:,.0f} samples/s"
    )


def line(apps: AppCounts, machine: Machine) -> str:
    failed = f", {apps.failed} failed" if apps.failed else ""
    notice = f" · {machine.notice[0]}" if machine.notice else ""
    return f"{apps.done} of {plural(apps.launched, 'app')} done{failed} · {training(machine)}{notice}"


def show(
    work: Callable[[], T], apps: AppCounts, run_dir: Callable[[], Path | None], console: Console, quiet: bool = False
) -> T:
    """Run ``work`` on a thread while showing its progress on ``console`` (stderr); return its result."""
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = work()
        except BaseException as exc:  # re-raised here, on the main thread
            result["error"] = exc

    thread = threading.Thread(target=target, name="pilotfill-campaign", daemon=True)
    thread.start()
    machine = Machine()
    if quiet:
        thread.join()
    elif console.is_terminal:
        columns = (
            TextColumn("[bold]pilotfill run[/]"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
        )
        while thread.is_alive() and run_dir() is None:  # nothing has started (a bad config is said alone)
            thread.join(0.1)
        if not thread.is_alive():
            thread.join()
        else:
            with Progress(
                *columns, console=console, transient=True, redirect_stdout=True, redirect_stderr=False
            ) as bar:
                task = bar.add_task("apps", total=None, status="starting the controller")
                told = 0
                while thread.is_alive():
                    thread.join(0.5)
                    new = apps.notes[told:]
                    told += len(new)
                    for note in new:
                        bar.console.print(Text(f"pilotfill: {note}"), highlight=False)
                    if run_dir() is not None:
                        machine.read(run_dir())
                    failed = f"{apps.failed} failed · " if apps.failed else ""
                    notice = ""
                    if machine.notice:
                        notice = (
                            f" · [{'bold red' if machine.notice[1] == 'failing' else 'yellow'}]"
                            f"{escape(machine.notice[0])}[/]"
                        )
                    bar.update(
                        task,
                        total=max(apps.launched, 1),
                        completed=apps.done + apps.failed,
                        status=failed + training(machine) + notice,
                    )
    else:
        said, said_at, told = "", 0.0, 0
        while thread.is_alive():
            thread.join(1.0)
            new = apps.notes[told:]
            told += len(new)
            for note in new:
                console.print(f"pilotfill: {note}", highlight=False, markup=False)
            if run_dir() is not None:
                machine.read(run_dir())
            if not apps.launched:
                continue  # no line before the campaign has launched anything
            now = line(apps, machine)
            if now != said and time.monotonic() - said_at >= PLAIN_EVERY_S:
                console.print(f"pilotfill: {now}", highlight=False, markup=False)
                said, said_at = now, time.monotonic()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


# ---------------------------------------------------------------- failures, as a user reads them


def user_traceback(exc: BaseException) -> str:
    """``exc``'s traceback with only the user's frames (not pilotfill's, Parsl's or Python's own) — the app's own
    raising lines included: code shipped to the ranks comes back named ``<dynamic-code>`` (cloudpickle drops file
    names), and its frames are given back the file they came from (their globals' ``__file__``)."""
    frames = [f for f in _frames(exc.__traceback__) if not _internal(f.filename)]
    text = "".join(traceback.format_list(frames)) + "".join(traceback.format_exception_only(type(exc), exc))
    return ("Traceback (most recent call last):\n" + text if frames else text).rstrip()


def _frames(tb) -> list[traceback.FrameSummary]:
    import linecache

    out = []
    while tb is not None:
        frame = tb.tb_frame
        filename = frame.f_code.co_filename
        if filename.startswith("<"):
            filename = (getattr(frame, "f_globals", None) or {}).get("__file__") or filename
        line = linecache.getline(filename, tb.tb_lineno).strip() if not filename.startswith("<") else None
        out.append(traceback.FrameSummary(filename, tb.tb_lineno, frame.f_code.co_name, line=line))
        tb = tb.tb_next
    return out


def _internal(filename: str) -> bool:
    path = str(Path(filename).resolve()) if not filename.startswith("<") else filename
    return path.startswith(PILOTFILL) or path.startswith(INTERNAL) or filename.startswith("<")


def print_failures(failed: list[tuple[str, BaseException]], console: Console) -> None:
    """Each failed app once: its own traceback; apps that did not run because of it, one line each."""
    from parsl.dataflow.errors import DependencyError

    from .elastic.guard import RuntimeMismatch
    from .executors.elastic import CampaignHalted

    for name, exc in failed:
        if isinstance(exc, DependencyError):
            console.print("[yellow]not run[/]", Text(f"{name}: an app it depends on failed"), highlight=False)
            continue
        if isinstance(exc, CampaignHalted):
            console.print("[yellow]not finished[/]", Text(f"{name}: the campaign could not go on"), highlight=False)
            continue
        console.print("[red]failed[/]", Text(f"{name}: {type(exc).__name__}: {exc}"), highlight=False)
        if not isinstance(exc, RuntimeMismatch):
            # code for another runtime: the line says how to run it, the traceback adds nothing
            console.print(Text(_indent(user_traceback(exc))), highlight=False)


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())


def is_app_failure(exc: BaseException, failures: list[BaseException]) -> bool:
    """Whether the campaign's script stopped because an app failed (it waited on a failed app's result)."""
    from parsl.dataflow.errors import DependencyError

    from .executors.elastic import CampaignHalted

    return isinstance(exc, (DependencyError, CampaignHalted)) or any(exc is f for f in failures)


__all__ = ["AppCounts", "Machine", "is_app_failure", "line", "plural", "print_failures", "show", "user_traceback"]
