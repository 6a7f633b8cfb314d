"""The trace and job readers: what they keep, and where they say input is wrong."""

from __future__ import annotations

import gzip

import pytest
from conftest import JOB_HEADER

from pilotfill.traces import InputError, parse_time, read_jobs, read_trace

TRACE = """
time,node,state
2021-02-10T00:00:00Z,n0,busy
2021-02-10T00:00:00Z,n1,idle
2021-02-10T00:00:00Z,n2,busy
2021-02-10T00:01:00Z,n0,idle
2021-02-10T00:02:00Z,n2,idle
2021-02-10T00:02:00Z,n1,busy
2021-02-10T00:03:00Z,n2,busy
2021-02-10T00:04:00Z,n0,busy
2021-02-10T00:05:00Z,,end
"""


def test_trace_whole(write):
    tr = read_trace(write("t.csv", TRACE))
    assert tr.nodes == ("n0", "n1", "n2")
    assert tr.initial_idle == {"n1"}
    assert tr.start == parse_time("2021-02-10T00:00:00Z")
    assert tr.end == parse_time("2021-02-10T00:05:00Z")
    assert [(s.time - tr.start, set(s.to_idle), set(s.to_busy)) for s in tr.steps] == [
        (60, {"n0"}, set()),
        (120, {"n2"}, {"n1"}),
        (180, set(), {"n2"}),
        (240, set(), {"n0"}),
    ]
    assert tr.transitions == 5


def test_first_nodes_keep_file_order_and_drop_empty_times(write):
    tr = read_trace(write("t.csv", TRACE), nodes=2)
    assert tr.nodes == ("n0", "n1")
    # 00:03 only changed n2, which is not kept: it is not an event.
    assert [s.time - tr.start for s in tr.steps] == [60, 120, 240]


def test_window_state_at_start_includes_transitions_at_start(write):
    t0 = parse_time("2021-02-10T00:02:00Z")
    tr = read_trace(write("t.csv", TRACE), start=t0, end=parse_time("2021-02-10T00:03:30Z"))
    assert tr.initial_idle == {"n0", "n2"}
    assert [s.time - t0 for s in tr.steps] == [60]


def test_gzip_is_read(tmp_path):
    p = tmp_path / "t.csv.gz"
    with gzip.open(p, "wt") as f:
        f.write(TRACE.lstrip())
    assert read_trace(p).initial_idle == {"n1"}


@pytest.mark.parametrize(
    "bad_line, message",
    [
        ("2021-02-10T00:02:30Z,n1", "expected 3 fields"),
        ("2021-02-10T00:02:30Z,n1,asleep", "unknown state 'asleep'"),
        ("2021-02-10T00:00:30Z,n1,idle", "time goes backwards"),
        ("yesterday,n1,idle", "bad time 'yesterday'"),
        ("2021-02-10T00:02:30Z,n9,idle", "node 'n9' is not in the initial state"),
    ],
)
def test_bad_trace_rows_name_file_and_line(write, bad_line, message):
    lines = TRACE.strip().splitlines()
    lines.insert(6, bad_line)  # becomes line 7 of the file
    path = write("bad.csv", "\n".join(lines) + "\n")
    with pytest.raises(InputError) as err:
        read_trace(path)
    assert err.value.line == 7
    assert str(err.value).startswith(f"{path}:7: ")
    assert message in str(err.value)


def test_bad_header_and_missing_file(write, tmp_path):
    with pytest.raises(InputError, match=r":1: header must be time,node,state"):
        read_trace(write("h.csv", "when,where,what\n"))
    with pytest.raises(InputError, match="no such file"):
        read_trace(tmp_path / "absent.csv")
    with pytest.raises(InputError, match="only 3 nodes"):
        read_trace(write("t.csv", TRACE), nodes=5)


def job_row(name="a", submit="2021-02-10T00:00:00Z", lo=1, hi=4, total=1e6, up=10, down=5, nodes="0;1;2;4", rate="0;100;190;350"):
    return f"{name},m,{submit},{lo},{hi},{total},{up},{down},{nodes},{rate}"


def test_jobs_in_submission_order_with_optional_objective_and_weight(write):
    text = "\n".join(
        [
            JOB_HEADER + ",objective,weight",
            job_row("late", submit="2021-02-10T01:00:00Z") + ",0;1;1.9;3.5,",
            job_row("early") + ",,2.5",
        ]
    )
    jobs = read_jobs(write("j.csv", text))
    assert [j.name for j in jobs] == ["early", "late"]
    assert [j.weight for j in jobs] == [2.5, 1.0]
    assert jobs[0].objective is None
    assert jobs[1].objective.at(3) == pytest.approx(2.7)
    assert jobs[1].throughput.at(3) == pytest.approx(270)


@pytest.mark.parametrize(
    "row, message",
    [
        (job_row(lo=5, hi=4), "min_nodes 5 > max_nodes 4"),
        (job_row(nodes="1;2;4", rate="100;190;350"), "must start at 0 nodes"),
        (job_row(rate="0;100;190"), "has 3 values for 4 node counts"),
        (job_row(total="lots"), "total_samples must be a number"),
        (job_row(nodes="0;2;1;4"), "increase strictly"),
        (job_row(rate="0;100;-1;350"), "non-negative"),
        (job_row(lo=0), "min_nodes must be at least 1"),
    ],
)
def test_bad_jobs_name_file_and_line(write, row, message):
    path = write("j.csv", "\n".join([JOB_HEADER, job_row("ok"), row]) + "\n")
    with pytest.raises(InputError) as err:
        read_jobs(path)
    assert str(err.value).startswith(f"{path}:3: ")
    assert message in str(err.value)


def test_bundled_excerpt_is_the_first_64_nodes_of_the_shared_trace(shared_data):
    from pilotfill.cli import DEFAULT_JOBS, DEFAULT_TRACE

    full = read_trace(shared_data / "summit-2021-02-10-week.csv.gz", nodes=64)
    excerpt = read_trace(DEFAULT_TRACE)
    assert excerpt.nodes == full.nodes
    assert excerpt.initial_idle == full.initial_idle
    assert excerpt.steps == full.steps
    assert excerpt.end == full.end
    assert DEFAULT_JOBS.read_bytes() == (shared_data / "jobs-imagenet-1001.csv").read_bytes()


def test_shared_files_parse_with_their_documented_sizes(shared_data):
    tr = read_trace(shared_data / "summit-2021-02-10-week.csv.gz")
    assert len(tr.nodes) == 4734
    assert tr.transitions == 418_360
    assert len(tr.steps) == 11_467
    assert len(read_jobs(shared_data / "jobs-imagenet-1001.csv")) == 1001
    assert len(read_jobs(shared_data / "jobs-hpo-shufflenet-1000.csv")) == 1000
