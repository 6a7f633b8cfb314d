"""`pilotfill replay` as a user runs it: a real subprocess, its exit code, stdout and stderr."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import JOB_HEADER

pytestmark = pytest.mark.local

JSON_KEYS = {"events", "idle_node_hours", "used_node_hours", "samples", "ideal_samples", "efficiency", "jobs_completed", "solve_ms_p50", "solve_ms_p99", "solve_ms_max"}

TRACE = """time,node,state
2021-02-10T00:00:00Z,n0,idle
2021-02-10T00:00:00Z,n1,idle
2021-02-10T00:00:00Z,n2,busy
2021-02-10T00:10:00Z,n2,idle
2021-02-10T00:20:00Z,n0,busy
2021-02-10T01:00:00Z,,end
"""
JOBS = JOB_HEADER + "\na,m,2021-02-10T00:00:00Z,1,3,1e5,10,5,0;1;2;3,0;100;190;270\nb,m,2021-02-10T00:05:00Z,1,2,1e9,10,5,0;1;2,0;50;100\n"


def pilotfill(*args: str) -> subprocess.CompletedProcess:
    """The command as a user runs it. The limit guards against a hang, not a slow machine: the bundled week's replay
    takes minutes beside the rest of the suite."""
    return subprocess.run([sys.executable, "-m", "pilotfill", *args], capture_output=True, text=True, timeout=1200)


def test_json_has_the_documented_keys(write):
    out = pilotfill("replay", str(write("t.csv", TRACE)), str(write("j.csv", JOBS)), "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert JSON_KEYS <= set(result)
    assert result["jobs_completed"] == 1
    assert result["idle_node_hours"] == pytest.approx((2 * 600 + 3 * 600 + 2 * 2400) / 3600)


def test_window_nodes_formulations_and_plot(write, tmp_path):
    png = tmp_path / "out" / "replay.png"
    for formulation in ("aggregated", "node-level", "greedy"):
        out = pilotfill(
            "replay", str(write("t.csv", TRACE)), str(write("j.csv", JOBS)),
            "--start", "2021-02-10T00:05:00Z", "--end", "2021-02-10T00:50:00Z", "--nodes", "2",
            "--formulation", formulation, "--max-jobs", "1", "--tfwd", "30", "--json", "--plot", str(png),
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        result = json.loads(out.stdout)
        assert result["nodes"] == 2
        assert result["idle_node_hours"] == pytest.approx((2 * 900 + 1 * 1800) / 3600)
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_summary_table_by_default(write):
    out = pilotfill("replay", str(write("t.csv", TRACE)), str(write("j.csv", JOBS)))
    assert out.returncode == 0, out.stderr
    assert "samples processed" in out.stdout and "efficiency" in out.stdout


def test_learned_profiles_run(write):
    out = pilotfill("replay", str(write("t.csv", TRACE)), str(write("j.csv", JOBS)), "--profiles", "learned", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["samples"] > 0


@pytest.mark.parametrize(
    "trace, jobs, where",
    [
        (TRACE.replace("n2,idle", "n2,gone"), JOBS, "t.csv:5: unknown state 'gone'"),
        (TRACE.replace("00:20:00Z,n0", "00:01:00Z,n0"), JOBS, "t.csv:6: time goes backwards"),
        (TRACE.replace("00:10:00Z,n2,idle", "00:10:00Z,n2"), JOBS, "t.csv:5: expected 3 fields"),
        (TRACE, JOBS.replace("1e5,10,5,0;1;2;3", "1e5,10,5,1;2;3;4"), "j.csv:2: the curve must start at 0 nodes"),
        (TRACE, JOBS.replace("m,2021-02-10T00:05:00Z,1,2", "m,2021-02-10T00:05:00Z,3,2"), "j.csv:3: min_nodes 3 > max_nodes 2"),
    ],
)
def test_bad_input_exits_2_naming_file_and_line_without_traceback(write, trace, jobs, where):
    out = pilotfill("replay", str(write("t.csv", trace)), str(write("j.csv", jobs)))
    assert out.returncode == 2
    assert where in " ".join(out.stderr.split())
    assert "Traceback" not in out.stderr + out.stdout


def test_bad_options_exit_2(write):
    out = pilotfill("replay", str(write("t.csv", TRACE)), str(write("j.csv", JOBS)), "--start", "noon")
    assert out.returncode == 2 and "ISO-8601" in out.stderr and "Traceback" not in out.stderr
    out = pilotfill("replay", str(write("t.csv", TRACE)), str(write("j.csv", JOBS)), "--nodes", "0")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    out = pilotfill("replay", "/nonexistent/trace.csv", str(write("j.csv", JOBS)))
    assert out.returncode == 2 and "no such file" in out.stderr
    out = pilotfill("replay", str(write("t.csv", TRACE)), str(write("j.csv", JOBS)), "--far", "1.5")
    assert out.returncode == 2 and "--far" in out.stderr and "Traceback" not in out.stderr


def test_default_replays_the_bundled_summit_excerpt():
    out = pilotfill("replay", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["nodes"] == 64
    assert result["samples"] > 6.11e9  # BFTrainer's figure on this setup
