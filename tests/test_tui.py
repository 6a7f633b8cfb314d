"""The live view: frames rendered from known states, and `pilotfill top` driven in tmux against a live run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest
from conftest import IN_CI
from localrun import LocalRun, synthetic_job
from rich.console import Console

from pilotfill.tui import describe, render, view_from_snapshot

pytestmark = pytest.mark.unit

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
    grid = text.split("nodes (4)")[1].split("events")[0]
    assert "■" in grid and "pf-node" not in grid  # the grid draws cells, not names
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


def long_named_snapshot() -> dict:
    snap = snapshot()
    names = {"ja": "train(2, 96, 'relu', lr=0.05)", "jb": "train(1, 32, 'tanh', lr=0.1)", "jc": "train(2, 32, 'gelu')"}
    for j in snap["jobs"]:
        j["name"] = names[j["id"]]
    snap["events"].append({"time": NOW - 5, "kind": "job.stopped", "job": "jb", "node": None, "data": {"cause": "pf-node-2 leaving"}})
    return snap


def test_the_events_pane_names_jobs_as_the_jobs_table_does():
    view = view_from_snapshot(long_named_snapshot(), now=NOW)
    events = "\n".join(view.events)
    assert "job.stopped train(1, 32, 'tanh', lr=0.1)" in events and "train(2, 96, 'relu', lr=0.05) 3→2 nodes" in events
    assert "jb" not in events.split() and "allocation dp 0.8 ms: train(2, 96, 'relu', lr=0.05)→2" in events
    text, _ = frame(view, 80, 24)
    assert "job.stopped train(1, 32" in text


@pytest.mark.parametrize("width", [60, 80, 100, 160])
def test_the_legend_never_breaks_an_entry(width):
    view = view_from_snapshot(long_named_snapshot(), now=NOW)
    text, _ = frame(view, width, 40)
    grid = text.split("nodes (4)")[1].split("events")[0]
    joined = " ".join(line.strip(" │╭╮╰╯─") for line in grid.splitlines())
    for name in ("train(2, 96, 'relu', lr=0.05)", "train(1, 32, 'tanh', lr=0.1)"):
        # Whole on one line, or shortened with an ellipsis; never split over two lines.
        assert name in grid or name[:8] in joined and "…" in grid, grid
    for line in grid.splitlines():
        assert not line.rstrip(" │").endswith(("■", "train(2,", "train(1,")), line


def test_progress_is_readable_at_80_columns():
    view = view_from_snapshot(long_named_snapshot(), now=NOW)
    text, _ = frame(view, 80, 24)
    row = next(line for line in text.splitlines() if "train(2, 96" in line)
    assert "50%" in row and "…" not in row.split("50%")[1][:8], row  # the percentage and ETA whole, not cut
    assert "█" in row


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


@pytest.mark.site
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


@pytest.mark.site
def test_replay_tui_shows_the_simulated_machine(tmp_path, tmux):
    session = f"pf-replay-{os.getpid()}"
    tmux.append(session)
    out = tmp_path / "replay.out"
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "100", "-y", "30", f"{sys.executable} -m pilotfill replay --tui --end 2021-02-11T00:00:00Z > /dev/tty 2>&1; {sys.executable} -c 'print(\"DONE\")' > {out}; sleep 120"], check=True)
    seen = wait_screen(session, lambda t: "pilotfill replay 2021-02" in t, 30, poll_s=0.05)
    assert "pilotfill replay 2021-02" in seen and "nodes (" in seen
    deadline = time.time() + 900  # a day of the bundled week is replayed behind the view: minutes on a busy machine
    while time.time() < deadline and not out.exists():
        time.sleep(0.3)
    assert out.exists(), capture(session)
    assert "samples processed" in capture(session)  # the summary after the view


@pytest.mark.site
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


SLOW_CAMPAIGN = """
import pilotfill

@pilotfill.elastic_app(min_nodes=1, max_nodes=1)
def work(i):
    import time
    for _ in range(25):
        time.sleep(0.2)
        pilotfill.report(samples=10)
    return i

print("RESULTS", [f.result() for f in [work(i) for i in range(4)]])
"""


@pytest.mark.site
def test_run_in_a_terminal_shows_a_progress_line_that_moves(tmp_path, tmux):
    from test_campaign import FAST

    config = tmp_path / "fast.toml"
    config.write_text(FAST)
    campaign = tmp_path / "c.py"
    campaign.write_text(SLOW_CAMPAIGN)
    session = f"pf-progress-{os.getpid()}"
    tmux.append(session)
    done = tmp_path / "exit"
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "120", "-y", "30", "-c", str(tmp_path),
                    f"{sys.executable} -m pilotfill run --config {config} {campaign}; echo $? > {done}; sleep 30"], check=True)  # fmt: skip
    first = wait_screen(session, lambda t: "pilotfill run" in t and "jobs training" in t, 120)
    assert "pilotfill run" in first and "jobs training on" in first and "samples/s" in first, first
    progress = lambda t: next((line for line in t.splitlines() if "pilotfill run" in line), "")  # noqa: E731
    changed = wait_screen(session, lambda t: progress(t) and progress(t) != progress(first), 60)
    assert progress(changed) != progress(first)  # it moves while apps run
    deadline = time.time() + 180
    while time.time() < deadline and not done.exists():
        time.sleep(0.3)
    assert done.read_text().strip() == "0"
    assert "RESULTS [0, 1, 2, 3]" in capture(session)


@pytest.mark.local
def test_run_piped_prints_plain_lines(tmp_path):
    from test_campaign import FAST, pilotfill_run

    config = tmp_path / "fast.toml"
    config.write_text(FAST)
    campaign = tmp_path / "c.py"
    campaign.write_text(SLOW_CAMPAIGN)
    result = pilotfill_run(campaign, "--config", str(config))
    assert result.returncode == 0, result.stderr[-3000:]
    plain = [line for line in result.stderr.splitlines() if line.startswith("pilotfill: ")]
    assert plain and all("apps done" in line and "samples/s" in line for line in plain), result.stderr
    assert "\x1b[" not in result.stderr  # no terminal codes when not a terminal
    quiet = pilotfill_run(campaign, "--config", str(config), "--quiet")
    assert quiet.returncode == 0 and not [line for line in quiet.stderr.splitlines() if line.startswith("pilotfill: ")]


@pytest.mark.site
def test_live_view_at_80x24_names_jobs_in_the_events_pane(tmp_path, tmux):
    run = LocalRun(tmp_path)
    run.start()
    try:
        job = run.client.submit({**synthetic_job("train(2, 96, 'relu')", total=100_000, hi=2), "total_samples": 100_000})
        run.wait_for(lambda: run.client.job(job)["status"] == "running", 60, "a running job")
        session = f"pf-top80-{os.getpid()}"
        tmux.append(session)
        subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "80", "-y", "24", f"{sys.executable} -m pilotfill top {run.run_dir}; sleep 30"], check=True)
        # by the time the view draws, the pane's few lines may have moved past job.started (a late pilot's node
        # joined, the job grew): whichever events it shows of the job name it
        screen = wait_screen(session, lambda t: "train(2, 96, 'relu')" in t.split("events")[-1], 60)
        events = screen.split("events")[-1]
        assert "train(2, 96, 'relu')" in events, screen
        assert job not in events.split()  # by name, not by id
        assert len(screen.rstrip("\n").split("\n")) <= 24
        subprocess.run(["tmux", "send-keys", "-t", session, "q"], check=True)
    finally:
        run.stop()


@pytest.mark.site
def test_replay_tui_at_a_chosen_speed_is_still_drawing_after_5_s(tmp_path, tmux, shared_data):
    session = f"pf-speed-{os.getpid()}"
    tmux.append(session)
    trace, jobs = shared_data / "summit-2021-02-10-week.csv.gz", shared_data / "jobs-imagenet-1001.csv"
    command = (f"{sys.executable} -m pilotfill replay {trace} {jobs} --start 2021-02-10T20:21:15Z --end 2021-02-11T20:21:15Z "
               f"--nodes 256 --tui --speed 3600")  # fmt: skip
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "120", "-y", "36", f"{command}; sleep 60"], check=True)
    first = wait_screen(session, lambda t: "pilotfill replay 2021-02" in t, 60)
    assert "pilotfill replay 2021-02-10" in first, first
    clock = lambda t: next((w for w in t.split() if w.startswith("2021-02-")), "")  # noqa: E731
    time.sleep(5.0)
    later = capture(session)
    assert "pilotfill replay" in later and "samples processed" not in later  # still drawing: a day at an hour a second
    assert clock(later) > clock(first)  # and the simulated clock moves
    subprocess.run(["tmux", "send-keys", "-t", session, "C-c"], check=True)


def test_a_typed_machine_shows_occupancy_by_type_and_where_each_job_runs_and_why():
    snap = snapshot()
    for n in snap["nodes"]:
        n["node_type"] = "v100" if n["name"] in ("pf-node-0", "pf-node-1") else "k80"
    snap["placement"] = {"ja": {"node_type": "v100", "why": "its curves: fastest here"}}
    text, _ = frame(view_from_snapshot(snap, title="typed", now=NOW), 120, 40)
    assert "v100 2/2 in use" in text and "k80 1/2 in use" in text  # occupancy by type
    assert "resnet-a on v100: its curves: fastest here" in text  # where and why
    row = next(line for line in text.splitlines() if "vgg-b" in line and "[1-2]" in line)
    assert " k80 " in row  # its nodes' type, when the controller did not say
    plain, _ = frame(view_from_snapshot(snapshot(), title="plain", now=NOW), 120, 40)
    assert "in use" not in plain and " on " not in plain.split("events")[0]  # one kind of node: as before


def test_a_start_on_a_type_reads_as_a_line():
    e = {"time": NOW, "kind": "job.started", "job": "ja", "node": None, "data": {"nodes": ["a", "b"], "node_type": "v100", "why": "measured here"}}
    assert describe(e, {"ja": "train(1)"}).endswith("train(1) started on 2 v100 nodes: measured here")
