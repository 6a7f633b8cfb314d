"""The trace and job readers: what they keep, and where they say input is wrong."""

from __future__ import annotations

import gzip

import pytest
from conftest import JOB_HEADER

from pilotfill.traces import InputError, parse_time, read_jobs, read_trace

pytestmark = pytest.mark.unit

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


def test_a_trace_beside_another_is_one_machine_of_both(write):
    """Twice a machine (the next-generation cell of the replay benchmark): the other's nodes renamed, every event of
    both at its time, one step per instant."""
    a = read_trace(write("t.csv", TRACE))
    b = read_trace(write("t.csv", TRACE), start=parse_time("2021-02-10T00:01:00Z"))
    both = a.beside(b, "b/")
    assert both.nodes == ("n0", "n1", "n2", "b/n0", "b/n1", "b/n2")
    assert both.initial_idle == {"n1", "b/n0", "b/n1"}
    assert (both.start, both.end) == (a.start, a.end)
    assert [(s.time - a.start, set(s.to_idle), set(s.to_busy)) for s in both.steps] == [
        (60, {"n0"}, set()),
        (120, {"n2", "b/n2"}, {"n1", "b/n1"}),
        (180, set(), {"n2", "b/n2"}),
        (240, set(), {"n0", "b/n0"}),
    ]
    assert both.transitions == a.transitions + b.transitions
    with pytest.raises(ValueError, match="prefix 'n'"):
        a.beside(b, "n")


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


# --------------------------------------------------------------------------- machines with several kinds of node

TYPED = """
time,node,state,type
2021-02-10T00:00:00Z,a0,idle,v100
2021-02-10T00:00:00Z,a1,busy,v100
2021-02-10T00:00:00Z,b0,idle,k80
2021-02-10T00:00:00Z,b1,idle,k80
2021-02-10T00:01:00Z,b1,busy,
2021-02-10T00:02:00Z,a1,idle,v100
2021-02-10T00:03:00Z,,end,
"""


def test_a_trace_names_its_nodes_types_in_a_column_or_a_map(write):
    tr = read_trace(write("t.csv", TYPED))
    assert tr.types == {"a0": "v100", "a1": "v100", "b0": "k80", "b1": "k80"}
    assert tr.type_counts() == {"v100": 2, "k80": 2}
    plain = read_trace(write("p.csv", TRACE))
    assert plain.types == {} and plain.type_counts() == {}  # a trace without types is what it always was
    types = write("types.csv", "node,gpu_type\nn0,p100\nn1,k80\nn2,k80\n")  # the data set's header
    assert read_trace(write("p.csv", TRACE), types=types).types == {"n0": "p100", "n1": "k80", "n2": "k80"}


def test_nodes_per_type_keeps_the_first_nodes_of_each_type(write):
    tr = read_trace(write("t.csv", TYPED), nodes_per_type=1)
    assert tr.nodes == ("a0", "b0")  # --nodes 2 would have kept a0, a1: both v100
    assert tr.types == {"a0": "v100", "b0": "k80"}
    assert [s.time - tr.start for s in tr.steps] == []  # b1 and a1 are not kept: nothing changes
    assert read_trace(write("t.csv", TYPED), nodes=2).nodes == ("a0", "a1")


@pytest.mark.parametrize(
    "text, types, kwargs, message",
    [
        (TRACE, "node,type\nn0,v100\nn1,k80\n", {}, r"types.csv: node 'n2' of the trace .* has no type"),
        (TRACE, "node,type\nn0,v100\nn0,k80\nn1,k80\nn2,k80\n", {}, r"types.csv:3: node 'n0' listed twice"),
        (TRACE, "node,type\nn0,v 100\n", {}, r"types.csv:2: bad node type 'v 100'"),
        (TRACE, "node,kind\nn0,v100\n", {}, r"types.csv:1: header must be node"),
        (TYPED, "node,type\na0,k80\na1,v100\nb0,k80\nb1,k80\n", {}, r"node 'a0' is of type 'k80' here but 'v100' in the trace"),
        (TRACE, None, {"nodes_per_type": 1}, r"--nodes-per-type needs every node's type; 3 have none"),
        (TRACE, None, {"nodes_per_type": 1, "nodes": 2}, r"cannot be used together"),
        (TYPED.replace("00:01:00Z,b1,busy,", "00:01:00Z,b1,busy,v100"), None, {}, r"t.csv:6: node 'b1' is of type 'k80' \(its first row\), not 'v100'"),
    ],
)
def test_bad_node_types_are_refused_with_the_place(write, text, types, kwargs, message):
    with pytest.raises(InputError, match=message):
        read_trace(write("t.csv", text), types=write("types.csv", types) if types else None, **kwargs)


TYPED_JOBS = (
    JOB_HEADER + ",samples_per_s@v100,samples_per_s@k80,nodes@k80\n"
    "a,m,2021-02-10T00:00:00Z,1,4,1e6,10,5,0;1;4,0;100;400,0;100;400,0;10;20;30,0;1;2;4\n"
    "b,m,2021-02-10T00:01:00Z,1,4,1e6,10,5,0;1;4,0;100;400,0;100;400,,\n"
)


def test_a_job_file_gives_a_curve_per_node_type(write):
    a, b = read_jobs(write("j.csv", TYPED_JOBS))
    assert set(a.curves) == {"v100", "k80"}
    assert a.curve_on("k80").nodes == (0, 1, 2, 4) and a.curve_on("k80").at(4) == 30  # on its own nodes@k80 grid
    assert a.curve_on("v100").at(4) == 400 and a.curve_on(None).at(4) == 400  # the base curve: untyped machines
    assert set(b.curves) == {"v100"} and b.curve_on("k80") is None  # an empty cell: b does not run on k80
    plain = read_jobs(write("p.csv", JOB_HEADER + "\nc,m,2021-02-10T00:00:00Z,1,2,10,1,1,0;1,0;5\n"))[0]
    assert plain.curves == {} and plain.curve_on("k80").at(1) == 5  # an untyped job: its curve on every type


@pytest.mark.parametrize(
    "header, row, message",
    [
        (",samples_per_s@v 100", ",0;1", r"j.csv:1: header must be .*samples_per_s@TYPE"),
        (",samples_per_s@v100,samples_per_s@v100", ",0;1,0;1", r"j.csv:1: column 'samples_per_s@v100' named twice"),
        (",nodes@k80", ",0;1", r"j.csv:1: nodes@k80 without samples_per_s@k80"),
        (",samples_per_s@k80", ",0;1;2", r"j.csv:2: samples_per_s@k80 has 3 values for 2 node counts"),
        (",samples_per_s@k80", ",", r"j.csv:2: no samples_per_s@TYPE curve: the job runs on no node type"),
        (",samples_per_s@k80,nodes@k80", ",0;1,1;2", r"j.csv:2: samples_per_s@k80: curve must start at 0 nodes"),
    ],
)
def test_bad_per_type_columns_are_refused_with_the_place(write, header, row, message):
    text = JOB_HEADER + header + "\nc,m,2021-02-10T00:00:00Z,1,1,10,1,1,0;1,0;5" + row + "\n"
    with pytest.raises(InputError, match=message):
        read_jobs(write("j.csv", text))


def test_the_heterogeneous_data_set_reads_as_it_is(shared_data):
    from pilotfill.traces import descriptor_of, read_models

    folder = shared_data / "heterogeneous"
    jobs = read_jobs(folder / "jobs-hetero-train.csv")
    assert len(jobs) == 1000 and all(set(j.curves) == {"k80", "p100", "v100"} for j in jobs)
    assert all(j.curve_on("v100") == j.throughput for j in jobs)  # the base curve is the V100 copy
    tr = read_trace(shared_data / "summit-2021-02-10-week.csv.gz", types=folder / "node-types-summit.csv", nodes_per_type=64)
    assert tr.type_counts() == {"v100": 64, "p100": 64, "k80": 64}
    models = read_models(folder / "models.csv")
    assert descriptor_of("ResNet-50-bs32", models).batch_size == 32 and descriptor_of("ResNet-50-bs32", models).parameters == 25557032
    assert descriptor_of("A3C", models).parameters == 3249639 and descriptor_of("A3C", models).batch_size is None
    assert descriptor_of("Nope-bs8", models) is None
