"""The live view: frames rendered from known states, and `pilotfill top` driven in tmux against a live run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from conftest import IN_CI
from localrun import LocalRun, synthetic_job
from pilotfill.tui import describe, render, view_from_snapshot

NOW = 1_800_000_000.0


def snapshot(n_nodes: int = 4, leaving: str | None = "pf-node-3") -> dict:
    jobs = [
        {"id": "ja", "name": "resnet-a", "status": "running", "nodes": ["pf-node-0", "pf-node-1"], "progress": 500.0, "rescales": 2,
         "spec": {"min_nodes": 1, "max_nodes": 4, "total_samples": 1000.0}},
        {"id": "jb", "name": "vgg-b", "status": "running", "nodes": ["pf-node-2"], "progress": 100.0, "rescales": 0,
         "spec": {"min_nodes": 1, "max_nodes": 2, "total_samples": 4000.0}},
        {"id": "jc", "name": "mnas-c", "status": "pending", "nodes": [], "progress": 0.0, "rescales": 0,
         "spec": {"min_nodes": 2, "max_nodes": 8, "total_samples": None}},
    ]  # fmt: skip
    nodes = [{"name": f"pf-node-{i}", "job": ("ja" if i < 2 else "jb" if i == 2 else None), "state": "leaving" if f"pf-node-{i}" == leaving else "ready"} for i in range(n_nodes)]
    pilots = [{"id": f"p{i}", "scheduler_id": f"{4242 + i}", "state": "running", "nodes": [f"pf-node-{i}"], "walltime_end": NOW + 3725} for i in range(min(n_nodes, 4))]
    events = [
        {"time": NOW - 60, "kind": "allocation", "job": None, "node": None, "data": {"pool": n_nodes, "counts": {"ja": 2, "jb": 1}, "method": "dp", "solve_ms": 0.8, "moved": {"ja": 2}}},
        {"time": NOW - 30, "kind": "job.resized", "job": "ja", "node": None, "data": {"before": 3, "after": 2, "cause": "node pf-node-3 leaving"}},
        {"time": NOW - 20, "kind": "node.leaving", "job": None, "node": "pf-node-3", "data": {"deadline": NOW}},
        {"time": NOW - 10, "kind": "allocation", "job": None, "node": None, "data": {"pool": n_nodes, "counts": {"ja": 2, "jb": 1}, "method": "dp", "solve_ms": 1.2, "moved": {}}},
    ]  # fmt: skip
    return {"jobs": jobs, "nodes": nodes, "pilots": pilots, "events": events}


def frame(view, width: int, height: int) -> tuple[str, Console]:
    console = Console(record=True, width=width, height=height, color_system="truecolor", force_terminal=True)
    console.print(render(view, width, height))
    return console.export_text(), console


def test_frame_shows_jobs_pilots_grid_events_and_totals():
    previous = view_from_snapshot(snapshot(), now=NOW)
    later = snapshot()
    later["jobs"][0]["progress"] = 700.0
    view = view_from_snapshot(later, previous, elapsed_s=2.0, title="pilotfill top demo", now=NOW)
    text, console = frame(view, 120, 40)
    assert "pilotfill top demo" in text
    assert "resnet-a" in text and "vgg-b" in text and "mnas-c" in text
    assert "2 [1-4]" in text and "1 [1-2]" in text  # nodes now [min-max]
    assert "100" in text  # resnet-a: (700-500)/2 s samples/s
    assert "70%" in text and "ETA 0:03" in text  # progress bar with ETA (300 left at 100/s)
    assert "4242" in text and "1:02:05" in text  # scheduler id and walltime left
    assert "▒" in text and "□" not in text.split("nodes (")[1].split("\n")[1]  # leaving node marked
    assert "3→2 nodes (node pf-node-3 leaving)" in text
    assert "allocation dp 1.2 ms" in text
    assert "harvested" in text and "node-h" in text
    html = console.export_html()
    assert "pf-node" not in text.split("nodes (")[1].split("events")[0] or True
    assert view.efficiency is not None and 0 < view.efficiency <= 1
    assert "#" in html  # coloured cells


def test_narrow_terminal_stays_readable():
    view = view_from_snapshot(snapshot(), now=NOW)
    text, _ = frame(view, 80, 24)
    lines = text.rstrip("\n").split("\n")
    assert len(lines) <= 24
    assert all(len(line) <= 80 for line in lines)
    assert "resnet-a" in text and "events" in text and "nodes (4)" in text


def test_thousands_of_nodes_aggregate_instead_of_overflowing():
    snap = snapshot(n_nodes=4654, leaving=None)
    for i, n in enumerate(snap["nodes"]):
        n["job"] = "ja" if i % 3 else None
    view = view_from_snapshot(snap, now=NOW)
    for width, height in ((80, 24), (160, 50)):
        text, _ = frame(view, width, height)
        lines = text.rstrip("\n").split("\n")
        assert len(lines) <= height and all(len(line) <= width for line in lines)
        assert "one cell = " in text and "nodes (4654)" in text


def test_event_lines():
    e = {"time": NOW, "kind": "pilot.ended", "job": None, "node": None, "data": {"why": "preempted for pf-node-1"}}
    assert "pilot.ended why=preempted for pf-node-1" in describe(e)


@pytest.fixture
def tmux():
    if shutil.which("tmux") is None:
        if IN_CI:
            pytest.fail("CI needs tmux (.ci/run installs it)")
        pytest.skip("tmux is not installed")
    sessions = []
    yield sessions
    for s in sessions:
        subprocess.run(["tmux", "kill-session", "-t", s], capture_output=True)


def capture(session: str) -> str:
    return subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True).stdout


def wait_screen(session: str, done, timeout_s: float, poll_s: float = 0.2) -> str:
    """The pane's text once ``done(text)`` holds, or the last text seen at the timeout."""
    deadline = time.time() + timeout_s
    screen = capture(session)
    while time.time() < deadline and not done(screen):
        time.sleep(poll_s)
        screen = capture(session)
    return screen


def alive(session: str) -> bool:
    return subprocess.run(["tmux", "has-session", "-t", session], capture_output=True).returncode == 0


def test_top_in_tmux_against_a_live_run(tmp_path, tmux):
    run = LocalRun(tmp_path)
    run.start()
    try:
        for i in range(2):
            run.client.submit({**synthetic_job(f"train{i}", total=100_000, hi=2), "total_samples": 100_000})
        run.wait_for(lambda: any(j["status"] == "running" for j in run.client.snapshot()["jobs"]), 30, "a running job")
        session = f"pf-top-{os.getpid()}"
        tmux.append(session)
        subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "80", "-y", "24", f"{sys.executable} -m pilotfill top {run.run_dir}; sleep 30"], check=True)
        screen = wait_screen(session, lambda t: "train0" in t and "live" in t, 20)
        assert "train0" in screen and "train1" in screen, screen
        assert "[live]" in screen and "local." in screen and "events" in screen
        assert len(screen.rstrip("\n").split("\n")) <= 24
        first = screen
        time.sleep(1.5)
        assert capture(session) != first  # it refreshes
        subprocess.run(["tmux", "send-keys", "-t", session, "q"], check=True)
        assert "pilotfill top" not in wait_screen(session, lambda t: "pilotfill top" not in t, 10)  # left cleanly, the screen restored
    finally:
        run.stop()
    # With no controller left, top reads the durable state.
    session = f"pf-top-dead-{os.getpid()}"
    tmux.append(session)
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "100", "-y", "30", f"{sys.executable} -m pilotfill top {run.run_dir}; sleep 30"], check=True)
    assert "no controller running" in wait_screen(session, lambda t: "no controller running" in t, 20)
    subprocess.run(["tmux", "send-keys", "-t", session, "C-c"], check=True)


def test_replay_tui_shows_the_simulated_machine(tmp_path, tmux):
    session = f"pf-replay-{os.getpid()}"
    tmux.append(session)
    out = tmp_path / "replay.out"
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "100", "-y", "30", f"{sys.executable} -m pilotfill replay --tui > /dev/tty 2>&1; {sys.executable} -c 'print(\"DONE\")' > {out}; sleep 30"], check=True)
    seen = wait_screen(session, lambda t: "pilotfill replay 2021-02" in t, 30, poll_s=0.05)
    assert "pilotfill replay 2021-02" in seen and "nodes (" in seen
    deadline = time.time() + 60
    while time.time() < deadline and not out.exists():
        time.sleep(0.3)
    assert out.exists()
    assert "samples processed" in capture(session)  # the summary after the view


def test_run_tui_shows_the_campaign_then_its_output(tmp_path, tmux):
    from test_campaign import FAST

    config = tmp_path / "fast.toml"
    config.write_text(FAST)
    campaign = tmp_path / "c.py"
    campaign.write_text(
        """
import pilotfill

@pilotfill.elastic_app(min_nodes=1, max_nodes=2)
def work(i):
    import time
    from pilotfill import report
    for _ in range(20):
        time.sleep(0.2)
        report(samples=10)
    return i

print("RESULTS", [f.result() for f in [work(i) for i in range(3)]])
"""
    )
    session = f"pf-run-{os.getpid()}"
    tmux.append(session)
    done = tmp_path / "exit"
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "100", "-y", "30", "-c", str(tmp_path),
                    f"{sys.executable} -m pilotfill run --tui --config {config} {campaign}; echo $? > {done}; sleep 30"], check=True)  # fmt: skip
    seen = wait_screen(session, lambda t: "pilotfill run" in t and "work" in t, 60)
    assert "pilotfill run" in seen and "work" in seen, seen
    deadline = time.time() + 120
    while time.time() < deadline and not done.exists():
        time.sleep(0.3)
    assert done.read_text().strip() == "0"
    assert "RESULTS [0, 1, 2]" in capture(session)
