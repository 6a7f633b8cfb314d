"""The live view (rich): pilots, a node occupancy grid, jobs, events and totals.

Two halves, as everywhere in pilotfill: a pure one — :class:`View` built from
a controller snapshot, the durable state, or a running replay, and
:func:`render` turning it into rich renderables for a given terminal size —
and a thin loop (:func:`top`, :func:`live`) that refreshes a ``rich.live.Live``
a few times a second and leaves on ``q`` or Ctrl-C with the terminal restored.
"""

from __future__ import annotations

import json
import math
import os
import select
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.layout import Layout
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from .lifecycle import LIVE_PILOT_STATES, JobStatus, NodeState, PilotState

PALETTE = [
    "green",
    "cyan",
    "magenta",
    "yellow",
    "blue",
    "bright_red",
    "bright_green",
    "bright_cyan",
    "bright_magenta",
    "orange3",
    "purple",
    "turquoise2",
]
HELD, LEAVING, FREE = "held", "leaving", "free"


@dataclass
class NodeView:
    name: str
    job: str | None  # job id on it
    state: str  # held (idle but ours), leaving, free (not ours)
    node_type: str | None = None  # a machine with several kinds of node


@dataclass
class JobView:
    id: str
    name: str
    status: str
    nodes: int
    min_nodes: int
    max_nodes: int
    rate: float  # samples/s
    progress: float
    total: float | None
    rescales: int
    committed: float = 0.0  # what a stop falls back to: the bar shows it apart from the work not yet committed
    node_type: str | None = None  # the kind of node it runs on (a machine with several)
    why: str = ""  # why it runs there

    @property
    def eta_s(self) -> float | None:
        if self.total is None or self.rate <= 0 or self.progress >= self.total:
            return None
        return (self.total - self.progress) / self.rate


@dataclass
class PilotView:
    id: str
    scheduler_id: str
    state: str
    nodes: int
    walltime_left_s: float | None


@dataclass
class View:
    title: str
    nodes: list[NodeView] = field(default_factory=list)
    jobs: list[JobView] = field(default_factory=list)
    pilots: list[PilotView] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    harvested_node_hours: float = 0.0
    training_node_hours: float = 0.0
    source: str = ""
    # (line, level): why the campaign waits (controller/notices.py)
    notices: list[tuple[str, str]] = field(default_factory=list)

    @property
    def efficiency(self) -> float | None:
        return self.training_node_hours / self.harvested_node_hours if self.harvested_node_hours > 0 else None


# ---------------------------------------------------------------- building views


def view_from_snapshot(
    snap: dict[str, Any],
    previous: View | None = None,
    elapsed_s: float = 0.0,
    title: str = "pilotfill",
    now: float | None = None,
) -> View:
    """A view of a controller snapshot (``state.snapshot`` reply, or the same read from SQLite)."""
    now = time.time() if now is None else now
    prev_progress = {j.id: j.progress for j in previous.jobs} if previous else {}
    prev_rate = {j.id: j.rate for j in previous.jobs} if previous else {}
    jobs = []
    for j in snap["jobs"]:
        spec = j["spec"]
        rate = prev_rate.get(j["id"], 0.0)
        if j["id"] in prev_progress and elapsed_s > 0:
            rate = max(0.0, (j["progress"] - prev_progress[j["id"]]) / elapsed_s)
        if j["status"] != JobStatus.RUNNING:
            rate = 0.0
        jobs.append(
            JobView(
                j["id"],
                j["name"],
                j["status"],
                len(j["nodes"]),
                spec["min_nodes"],
                spec["max_nodes"],
                rate,
                j["progress"],
                spec.get("total_samples"),
                j["rescales"],
                j.get("committed", j["progress"]),
            )
        )
    nodes = [
        NodeView(n["name"], n["job"], LEAVING if n["state"] == NodeState.LEAVING else HELD, n.get("node_type"))
        for n in snap["nodes"]
        if n["state"] != NodeState.GONE
    ]
    placed = placement(snap)
    for j in jobs:
        j.node_type, j.why = placed.get(j.id, (None, ""))
    pilots = [
        PilotView(
            p["id"],
            p["scheduler_id"] or "",
            p["state"],
            len(p["nodes"]),
            (p["walltime_end"] - now) if p.get("walltime_end") else None,
        )
        for p in snap["pilots"]
        if p["state"] in LIVE_PILOT_STATES
    ]
    if "node_seconds" in snap:
        harvested, training = snap["node_seconds"]["held"] / 3600, snap["node_seconds"]["used"] / 3600
    else:
        harvested, training = node_hours(snap["events"])
    names = {j["id"]: j["name"] for j in snap["jobs"]}
    return View(
        title,
        nodes,
        jobs,
        pilots,
        [describe(e, names) for e in snap["events"][-50:]],
        harvested,
        training,
        notices=notice_lines(snap, now),
    )


def notice_lines(snap: dict[str, Any], now: float | None = None) -> list[tuple[str, str]]:
    """(line, level) of each notice in a snapshot: why the campaign waits, failing ones first."""
    from .controller.notices import notice_line

    out = []
    for notice in snap.get("notices") or []:
        line = notice_line(notice, now) if isinstance(notice, dict) else None
        if line:
            out.append((line, str(notice.get("level", "failing"))))
    return out


def placement(snap: dict[str, Any]) -> dict[str, tuple[str | None, str]]:
    """Each running job's node type and why it runs there: the controller's word, else its nodes' type and the reason
    its start was journaled with."""
    live = snap.get("placement") or {}
    types = {n["name"]: n.get("node_type") for n in snap["nodes"]}
    started = {
        e["job"]: e["data"].get("why", "")
        for e in snap.get("events", [])
        if e["kind"] == "job.started" and e["data"].get("node_type")
    }
    out = {}
    for j in snap["jobs"]:
        if j["status"] != JobStatus.RUNNING:
            continue
        kinds = {types.get(n) for n in j["nodes"]} - {None}
        if j["id"] in live:
            out[j["id"]] = (live[j["id"]]["node_type"], live[j["id"]].get("why", ""))
        elif len(kinds) == 1:
            out[j["id"]] = (kinds.pop(), started.get(j["id"], ""))
    return out


def node_hours(events: list[dict[str, Any]]) -> tuple[float, float]:
    """Node-hours held by pilots and used by training, integrated between allocation events."""
    held = used = 0.0
    last: tuple[float, int, int] | None = None
    for e in events:
        if e["kind"] != "allocation":
            continue
        if last is not None:
            dt = (e["time"] - last[0]) / 3600
            held += last[1] * dt
            used += last[2] * dt
        last = (e["time"], e["data"].get("pool", 0), sum(e["data"].get("counts", {}).values()))
    if last is not None:
        dt = max(0.0, time.time() - last[0]) / 3600
        held += last[1] * dt
        used += last[2] * dt
    return held, used


def describe(e: dict[str, Any], names: dict[str, str] | None = None) -> str:
    """One line per event, for the log pane; jobs by the names the jobs table shows (their calls)."""
    names = names or {}
    d, when = e["data"], time.strftime("%H:%M:%S", time.localtime(e["time"]))
    kind, node = e["kind"], e.get("node") or ""
    job = names.get(e.get("job") or "", e.get("job") or "")
    if kind == "allocation":
        moved = ", ".join(f"{names.get(j, j)}→{n}" for j, n in d.get("moved", {}).items())
        return f"{when} allocation {d.get('method', '')} {d.get('solve_ms', 0):.1f} ms" + (
            f": {moved}" if moved else ""
        )
    if kind == "job.resized":
        return f"{when} {job} {d.get('before')}→{d.get('after')} nodes" + (
            f" ({d['cause']})" if d.get("cause") else ""
        )
    if kind == "job.started" and d.get("node_type"):
        n = len(d.get("nodes", []))
        return f"{when} {job} started on {n} {d['node_type']} node{'s' if n != 1 else ''}" + (
            f": {d['why']}" if d.get("why") else ""
        )
    detail = node or ", ".join(
        f"{k}={v}" for k, v in d.items() if k in ("nodes", "why", "error", "scheduler_id", "cause")
    )
    return f"{when} {kind} {job} {detail}".replace("  ", " ").strip()


class RunUnreadable(RuntimeError):
    """A run directory whose state cannot be read (empty, damaged, not pilotfill's, not yours); ``str()`` says which."""


def unreadable(path: Path) -> str | None:
    """Why ``path`` (a run directory or a file in it) cannot be read by this user, in words naming it and its owner and
    what to do; None when it can (or does not exist: the caller says so)."""
    import pwd

    path = Path(path).absolute()
    for part in [*reversed(path.parents), path]:
        try:
            os.stat(part)
        except FileNotFoundError:
            return None
        except NotADirectoryError:
            return f"{part.parent}: is a file, not a directory"
        except PermissionError:
            return f"{part}: cannot be reached (a directory above it is not yours to enter)"
    if os.access(path, os.R_OK | (os.X_OK if path.is_dir() else 0)):
        return None
    st = path.stat()
    try:
        owner = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        owner = str(st.st_uid)
    me = pwd.getpwuid(os.getuid()).pw_name if os.getuid() != st.st_uid else owner
    return (
        f"{path}: not readable by {me} (it is {owner}'s, mode {st.st_mode & 0o777:04o}): a run is private to the user "
        f"who started it; run pilotfill top as {owner}"
    )


def read_snapshot(run_dir: Path) -> tuple[dict[str, Any], str]:
    """The live controller's snapshot (authenticated), or the durable state if none answers."""
    import sqlite3

    from .protocol import StateSnapshot
    from .journal import JournalError, Journal
    from .transport import Client, ControllerUnavailable

    try:
        client = Client(run_dir, timeout_s=1.0)
        try:
            return client.request(StateSnapshot(), timeout_s=1.0, attempt_s=1.0), "live"
        finally:
            client.close()
    except (ControllerUnavailable, FileNotFoundError, PermissionError, OSError, ValueError):
        pass
    try:
        state = Journal(run_dir, readonly=True)
        try:
            counters = state.counters()
            return {
                "jobs": [j.__dict__ for j in state.jobs()],
                "notices": json.loads(state.get_meta("notices") or "[]"),
                "pilots": state.pilots(LIVE_PILOT_STATES),
                "nodes": state.nodes(),
                "events": state.events(limit=50),
                "node_seconds": {"held": counters.get("held_node_s", 0), "used": counters.get("used_node_s", 0)},
            }, "state (no controller running)"
        finally:
            state.close()
    except (JournalError, FileNotFoundError, sqlite3.Error, ValueError, KeyError) as exc:
        raise RunUnreadable(f"{run_dir}: cannot read the run's state ({exc})") from None


# ---------------------------------------------------------------- rendering


def job_colours(view: View) -> dict[str, str]:
    return {j.id: PALETTE[i % len(PALETTE)] for i, j in enumerate(view.jobs)}


def render(view: View, width: int = 80, height: int = 24) -> RenderableType:
    """The whole screen for a terminal of ``width`` × ``height``."""
    colours = job_colours(view)
    layout = Layout()
    events_rows = max(3, height // 4)
    layout.split_column(
        Layout(_header(view), name="header", size=1),
        Layout(name="body"),
        Layout(_events(view, events_rows - 2), name="events", size=events_rows),
    )
    left, right = Layout(name="left", ratio=2), Layout(name="right", ratio=1)
    if width >= 100:
        layout["body"].split_row(left, right)
        grid_width = max(10, width // 3 - 4)
    else:
        layout["body"].split_column(
            Layout(name="left"), Layout(name="right", size=max(4, (height - events_rows - 1) // 3))
        )
        left, right = layout["body"]["left"], layout["body"]["right"]
        grid_width = width - 4
    body_rows = height - events_rows - 1
    grid_rows = max(1, (max(4, body_rows // 3) if width < 100 else body_rows) - 3)
    pane = width if width < 100 else 2 * width // 3
    left.update(Group(_jobs(view, colours, pane), _pilots(view, pane)))
    kinds = sorted({n.node_type for n in view.nodes if n.node_type})
    if kinds:
        grid_rows = max(1, grid_rows - len(kinds))  # a line per type: its occupancy
    per = max(1, math.ceil(len(view.nodes) / max(1, grid_width * grid_rows)))
    title = f"nodes ({len(view.nodes)})" + (f", one cell = {per} nodes" if per > 1 else "")
    right.update(Panel(_grid(view, colours, grid_width, per), title=title, border_style="dim"))
    return layout


def _header(view: View) -> Text:
    eff = f"{100 * view.efficiency:.0f}%" if view.efficiency is not None else "—"
    text = Text.assemble(
        (f" {view.title} ", "bold reverse"),
        (f" [{view.source}]" if view.source else "", "dim"),
        f"  harvested {view.harvested_node_hours:.2f} node-h, training {view.training_node_hours:.2f} ({eff})",
        ("  q quits", "dim"),
    )
    text.no_wrap = True
    text.overflow = "ellipsis"
    return text


def _jobs(view: View, colours: dict[str, str], width: int) -> RenderableType:
    table = Table(title="jobs", title_justify="left", expand=True, box=None, padding=(0, 1), header_style="bold")
    name_width = 24 if width >= 100 else 18
    table.add_column("job", no_wrap=True, max_width=name_width, overflow="ellipsis")
    table.add_column("nodes", justify="right", no_wrap=True)
    table.add_column("samples/s", justify="right", no_wrap=True)
    table.add_column("progress", ratio=1, no_wrap=True, min_width=8)
    typed = any(j.node_type for j in view.jobs)
    if typed:
        table.add_column("on", no_wrap=True)
    table.add_column("resc", justify="right", no_wrap=True)
    table.add_column("state", no_wrap=True)
    active = [j for j in view.jobs if j.status in (JobStatus.RUNNING, JobStatus.PENDING)] + [
        j for j in view.jobs if j.status not in (JobStatus.RUNNING, JobStatus.PENDING)
    ]
    longest = max((len(j.name) for j in active[:12]), default=4)
    room = width - min(name_width, longest) - 44  # what the other columns (about 32) and the padding (12) leave it
    if typed:
        room -= max(len(j.node_type or "") for j in view.jobs) + 1
    for j in active[:12]:
        cells = [
            Text(j.name, style=colours.get(j.id, "")),
            f"{j.nodes} [{j.min_nodes}-{j.max_nodes}]",
            f"{j.rate:,.0f}",
            _progress(j, room),
            *([Text(j.node_type or "", style="bold")] if typed else []),
            str(j.rescales),
            Text(
                j.status,
                style={JobStatus.RUNNING: "green", JobStatus.FAILED: "red", JobStatus.FINISHED: "dim"}.get(
                    j.status, "yellow"
                ),
            ),
        ]
        table.add_row(*cells)
    if len(view.jobs) > 12:
        table.add_row(f"… {len(view.jobs) - 12} more", *([""] * (6 if typed else 5)))
    placed = [j for j in active[:12] if j.node_type and j.why]
    if not placed:
        return table
    why = Text(no_wrap=True, overflow="ellipsis")  # why each runs where it does, one line each
    for j in placed[:4]:
        why.append(f"\n {j.name}", colours.get(j.id, ""))
        why.append(f" on {j.node_type}: {j.why}", "dim")
    return Group(table, why)


def _progress(j: JobView, room: int) -> Text:
    """Progress that fits ``room`` columns: a bar, the percentage and the ETA while there is space, then fewer."""
    if not j.total:
        text = f"{j.progress:,.0f}" + (" samples" if room >= 16 else "")
        if room >= len(text) + 16 and j.committed < j.progress:
            text += f" ({j.committed:,.0f} committed)"
        return Text(text, style="dim")
    frac = min(1.0, j.progress / j.total)
    safe = min(frac, j.committed / j.total)
    pct, eta = f"{100 * frac:.0f}%", _eta(j)
    if room >= 22:
        bar = max(4, min(20, room - 14))
        return Text.assemble(*_bar(frac, bar, safe), f" {pct:>4} ", (eta, "dim"))
    if room >= 14:
        return Text.assemble(*_bar(frac, room - 10, safe), f" {pct:>4} ", (eta.removeprefix("ETA "), "dim"))
    return Text.assemble(f"{pct} ", (eta.removeprefix("ETA "), "dim"))


def _bar(frac: float, width: int, committed: float | None = None) -> tuple[tuple[str, str], ...]:
    """Committed work in green, work a stop would lose in yellow, the rest dim."""
    full = int(frac * width)
    safe = full if committed is None else min(full, int(committed * width))
    return ("█" * safe, "green"), ("█" * (full - safe), "yellow"), ("░" * (width - full), "dim")


def _eta(j: JobView) -> str:
    eta = j.eta_s
    if j.status == JobStatus.FINISHED:
        return "done"
    if eta is None:
        return "ETA —"
    return f"ETA {int(eta // 60)}:{int(eta % 60):02d}"


def _pilots(view: View, width: int) -> Table:
    table = Table(title="pilots", title_justify="left", expand=True, box=None, padding=(0, 1), header_style="bold")
    table.add_column("scheduler id", no_wrap=True)
    table.add_column("state", no_wrap=True)
    table.add_column("nodes", justify="right")
    table.add_column("walltime left", justify="right")
    for p in view.pilots[:6]:
        left = (
            "—"
            if p.walltime_left_s is None
            else f"{int(p.walltime_left_s // 3600)}:{int(p.walltime_left_s % 3600 // 60):02d}:"
            f"{int(p.walltime_left_s % 60):02d}"
        )
        table.add_row(
            p.scheduler_id or p.id,
            Text(p.state, style="red" if p.state == PilotState.LEAVING else ""),
            str(p.nodes),
            left,
        )
    if len(view.pilots) > 6:
        table.add_row(f"… {len(view.pilots) - 6} more", "", "", "")
    if view.notices:
        table.caption = Text(
            "\n".join(line for line, _ in view.notices),
            style="bold red" if view.notices[0][1] == "failing" else "yellow",
        )
        table.caption_justify = "left"
    return table


def _grid(view: View, colours: dict[str, str], width: int, per: int) -> RenderableType:
    """One cell per node, or per ``per`` nodes (shade: share in use; colour: the main job there)."""
    nodes = view.nodes
    legend = _legend(view, colours, width)
    if not nodes:
        return Group(Text("no nodes held", style="dim"), legend)
    kinds = sorted({n.node_type for n in nodes if n.node_type})
    if kinds:  # occupancy by type, and the grid ordered by type
        lines = Text(no_wrap=True, overflow="ellipsis")
        for k in kinds:
            mine = [n for n in nodes if n.node_type == k]
            used = sum(1 for n in mine if n.job)
            lines.append(f"{k} ", "bold")
            lines.append(f"{used}/{len(mine)} in use\n")
        nodes = sorted(nodes, key=lambda n: (n.node_type or "", n.name))
        return Group(lines, _cells(nodes, colours, width, per), legend)
    return Group(_cells(nodes, colours, width, per), legend)


def _cells(nodes: list[NodeView], colours: dict[str, str], width: int, per: int) -> Text:
    text = Text()
    for i in range(0, len(nodes), per):
        group = nodes[i : i + per]
        if i and (i // per) % width == 0:
            text.append("\n")
        if per == 1:
            n = group[0]
            if n.state == LEAVING:
                text.append("▒", "red")
            elif n.job:
                text.append("■", colours.get(n.job, "white"))
            else:
                text.append("□", "dim")
        else:
            busy = [n.job for n in group if n.job]
            glyph = " ░▒▓█"[min(4, math.ceil(len(busy) / len(group) * 4))]
            top = max(set(busy), key=busy.count) if busy else None
            text.append(glyph, colours.get(top, "dim") if top else "dim")
    return text


def _legend(view: View, colours: dict[str, str], width: int) -> Text:
    """One entry per running job (and idle, leaving), each kept whole: lines break between entries, never
    inside one; a name longer than a line is shortened with an ellipsis."""
    limit = max(6, width - 2)
    entries = []
    for j in [j for j in view.jobs if j.status == JobStatus.RUNNING][:8]:
        entry = f"■ {j.name}"
        entries.append((entry if len(entry) <= limit else entry[: limit - 1] + "…", colours[j.id]))
    entries += [("□ idle", "dim"), ("▒ leaving", "red")]
    text, used = Text(no_wrap=True, overflow="ellipsis"), 0
    for entry, style in entries:
        if used and used + 1 + len(entry) > limit:
            text.append("\n")
            used = 0
        elif used:
            text.append(" ")
            used += 1
        text.append(entry, style)
        used += len(entry)
    return text


def _events(view: View, rows: int) -> Panel:
    lines = view.events[-max(1, rows):]
    return Panel(
        Text("\n".join(lines) or "no events yet", no_wrap=True, overflow="ellipsis"), title="events", border_style="dim"
    )


# ---------------------------------------------------------------- the loops


@contextmanager
def keys() -> Iterator[Callable[[float], str | None]]:
    """Single key presses from the terminal (cbreak), restored on exit; no-op without a terminal."""
    if not sys.stdin.isatty():
        yield lambda timeout: (time.sleep(timeout), None)[1]
        return
    import termios
    import tty

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)
    try:

        def read(timeout: float) -> str | None:
            ready, _, _ = select.select([fd], [], [], timeout)
            return os.read(fd, 1).decode(errors="ignore") if ready else None

        yield read
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def live(
    make_view: Callable[[], View],
    refresh_s: float = 0.25,
    console: Console | None = None,
    until: Callable[[], bool] = lambda: False,
) -> None:
    """Show ``make_view()`` until ``q``, Ctrl-C or ``until()``."""
    from rich.live import Live

    console = console or Console()
    try:
        with (
            keys() as read,
            Live(
                console=console,
                screen=True,
                auto_refresh=False,
                transient=True,
                redirect_stdout=False,
                redirect_stderr=False,
            ) as screen,
        ):
            while not until():
                size = console.size
                screen.update(render(make_view(), size.width, size.height), refresh=True)
                key = read(refresh_s)
                if key in ("q", "Q"):
                    return
    except KeyboardInterrupt:
        return


def top(run_dir: Path, refresh_s: float = 0.25) -> None:
    """``pilotfill top``: attach read-only to a run (live controller, or its durable state)."""
    top_until(run_dir, lambda: False, refresh_s, title="pilotfill top")


def view_from_replay(sim, title: str = "pilotfill replay") -> View:
    """The simulated machine of a running :class:`~pilotfill.replay.Replay`: its real controller's state."""
    from .traces import format_time

    ctl = sim.controller
    if ctl is None:
        return View(title)
    snap = ctl.world.snapshot()
    snap["jobs"] = [j.summary() for j in ctl.world.open.values()]
    snap["events"] = ctl.journal.events(limit=50)
    view = view_from_snapshot(snap, title=f"{title} {format_time(sim.now)}", now=sim.now)
    for j in view.jobs:
        job = sim.runtime.jobs.get(j.id)
        j.rate = job.rate() if job is not None and job.hosts else 0.0
    view.harvested_node_hours, view.training_node_hours = sim.result.held_node_hours, sim.runtime.used_node_s / 3600
    return view


def run_with_view(work: Callable[[], Any], run_dir: Path, refresh_s: float = 0.25) -> Any:
    """Run ``work`` (a campaign) on a thread while the main thread shows the run; its stdout goes
    to ``campaign.out`` in the run directory and is printed when the view closes."""
    import contextlib
    import threading

    result: dict[str, Any] = {}
    out_path = Path(run_dir) / "campaign.out"
    Path(run_dir).mkdir(parents=True, exist_ok=True)

    def target() -> None:
        with open(out_path, "w") as out, contextlib.redirect_stdout(out):
            try:
                result["value"] = work()
            except BaseException as exc:  # re-raised on the main thread
                result["error"] = exc

    # redirect_stdout is process-wide: bind the view to the terminal before the campaign starts.
    console = Console(file=sys.stdout)
    thread = threading.Thread(target=target, name="pilotfill-campaign", daemon=True)
    thread.start()
    while not (Path(run_dir) / "state.sqlite").exists() and thread.is_alive():
        time.sleep(0.1)
    if thread.is_alive():
        top_until(Path(run_dir), lambda: not thread.is_alive(), refresh_s, console=console)
    thread.join()
    sys.stdout.write(out_path.read_text() if out_path.exists() else "")
    if "error" in result:
        raise result["error"]
    return result["value"]


def top_until(
    run_dir: Path,
    until: Callable[[], bool],
    refresh_s: float = 0.25,
    title: str = "pilotfill run",
    console: Console | None = None,
) -> None:
    """Show the run in ``run_dir`` until ``until()``, ``q`` or Ctrl-C."""
    previous: View | None = None
    last = time.monotonic()

    def make() -> View:
        nonlocal previous, last
        try:
            snap, source = read_snapshot(run_dir)
        except RunUnreadable as exc:  # written right now (a full disk?): show what was last seen, and why
            view = previous or View(f"{title} {run_dir.name}")
            view.source = str(exc)
            return view
        now = time.monotonic()
        view = view_from_snapshot(snap, previous, now - last, title=f"{title} {run_dir.name}")
        view.source = source
        previous, last = view, now
        return view

    live(make, refresh_s, console=console, until=until)


def replay_with_view(sim, refresh_s: float = 0.1, speed: float | None = None):
    """Run a replay with the simulated machine on screen; ``speed``: trace seconds per second (None: as fast
    as it goes). ``q`` hides the view; the replay goes on."""
    from rich.live import Live

    console = Console()
    state = {"shown": True, "last": 0.0}
    began, t0 = time.monotonic(), sim.trace.start
    with keys() as read, Live(console=console, screen=True, auto_refresh=False, transient=True) as screen:

        def draw() -> None:
            state["last"] = time.monotonic()
            size = console.size
            screen.update(render(view_from_replay(sim), size.width, size.height), refresh=True)
            if read(0) in ("q", "Q"):
                state["shown"] = False

        def tick(t: float, _sim) -> None:
            if speed:  # keep to the wall clock: the trace moves ``speed`` seconds per second
                while state["shown"] and (wait := began + (t - t0) / speed - time.monotonic()) > 0:
                    time.sleep(min(wait, refresh_s))
                    if time.monotonic() - state["last"] >= refresh_s:
                        draw()
            if state["shown"] and time.monotonic() - state["last"] >= refresh_s:
                draw()

        try:
            return sim.run(tick)
        except KeyboardInterrupt:
            state["shown"] = False
            raise
