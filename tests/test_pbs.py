"""The PBS adapter against a STAND-IN of the OpenPBS commands, and its parsers on what a real OpenPBS printed.

OpenPBS is not packaged here, so ``tests/pbs_standin/`` holds small executables
(``qsub``, ``qstat``, ``qselect``, ``pbsnodes``, ``pbs_release_nodes``, ``qdel``
and the test-only ``pbs_standin``) that reproduce the recordings of a real
OpenPBS 23.06.06 in ``shared/data/openpbs/real-23.06.06-recheck`` (two MOM
hosts; right where the others differ), ``real-23.06.06`` (a normal user, the
server's defaults) and ``shared/data/openpbs`` — layouts, exit codes,
messages, requeue on preemption, partial-host release, ``pbs_tmrsh``. Where the stand-in and
the recordings differ, the recording is right: the tests at the top check
the stand-in against them, and the parsers are also run on the recorded files
themselves. Every test that runs the adapter runs against the stand-in, once
with job history off (the server's default) and once with it on.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest
from conftest import PBS_STANDIN, PbsStandin

from pilotfill.config import PilotConfig, load_config
from pilotfill.schedulers import pbs as pbs_module
from pilotfill.schedulers.base import NothingIdle, PilotRefused, SchedulerConfigError, agent_argv
from pilotfill.schedulers.commands import SchedulerCommandError
from pilotfill.schedulers.pbs import (
    JobStatus,
    PbsConfig,
    PbsScheduler,
    idle_vnodes,
    is_policy_refusal,
    load_document,
    main_job_demand,
    parse_chunk,
    parse_exec_host,
    parse_exec_vnode,
    parse_job_id,
    parse_jobs,
    parse_pbsnodes,
    parse_qstat_errors,
    parse_queues,
    whole_hosts,
)

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "pbs_standin"))
import _standin  # noqa: E402  (the stand-in's own serializer, checked against the recordings)

pytestmark = pytest.mark.local

VM = ["vm[0]", "vm[1]", "vm[2]", "vm[3]"]
N1 = ["vm-n1[0]", "vm-n1[1]", "vm-n1[2]", "vm-n1[3]"]
VNODES = VM + N1  # real-23.06.06: two MOM hosts of four one-cpu vnodes
# The recorded submissions (real-23.06.06 and the earlier capture).
REAL_QSUB = (
    "-q scavenger -N pilot -r y -l select=8:ncpus=1 -l place=vscatter -l min_walltime=00:05:00,max_walltime=02:00:00"
    " -o /tmp/pbs-check/pilot.out -j oe /tmp/pbs-check/pilot.sh"
)
MANAGER_ONLY = {"schedselect", "euser", "egroup", "hashname", "queue_rank", "queue_type", "run_version", "Port", "pbs_version", "in_multivnode_host"}


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def make(tmp_path, pbs):
    """make(**PbsConfig fields) -> a PbsScheduler on a run directory in tmp_path; fast retries; closed at the end."""
    made: list[PbsScheduler] = []

    def _make(retries: int = 1, backoff_s: float = 0.01, clock=None, sleep=None, **fields) -> PbsScheduler:
        config = PbsConfig(**{"poll_s": 0.001, "command_timeout_s": 10.0, "nodes_per_pilot": 16, **fields})
        extra = {**({"clock": clock} if clock else {}), **({"sleep": sleep} if sleep else {})}
        s = PbsScheduler(config, PilotConfig(), tmp_path / "run", retries=retries, backoff_s=backoff_s, **extra)
        made.append(s)
        return s

    yield _make
    for s in made:
        try:
            s.close()
        except SchedulerCommandError:
            pass


class Ticks:
    """Poll times, each far enough after the last to pass the adapter's poll cache."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 100.0
        return self.now


def job_qstats(pbs: PbsStandin) -> list[list[str]]:
    """The qstat calls about jobs (not ``qstat -Q``, about queues)."""
    return [c for c in pbs.calls("qstat") if "-Q" not in c]


def running(s: PbsScheduler, ticks: Ticks, pilot: str) -> tuple[str, ...]:
    """Poll until ``pilot``'s start is reported; its nodes."""
    for _ in range(5):
        for e in s.poll(ticks()):
            if e.kind == "started" and e.pilot == pilot:
                return e.nodes
    raise AssertionError(f"{pilot} never started")


# ---------------------------------------------------------------- the recordings, parsed directly


def test_parsers_on_recorded_pbsnodes(shared_data):
    chunk = parse_chunk("ncpus=1")
    for name in ("pbsnodes-av-F-json-pilot-running.json", "pbsnodes-av-F-json-idle.json"):
        vnodes = parse_pbsnodes(load_document((shared_data / "openpbs" / name).read_text()))
        assert list(vnodes) == ["vm", *VM]
        assert not vnodes["vm"].usable(chunk), "the natural vnode (ncpus 0) is not a node"
        assert [n for n, v in vnodes.items() if v.usable(chunk)] == VM
        # Both were taken while 0.vm held vm[0..2] ("idle" 3 s after its qdel, before PBS let go of it).
        assert vnodes["vm[0]"].jobs == ("0.vm",) and vnodes["vm[0]"].state == "job-busy"
        assert idle_vnodes(vnodes, chunk) == ["vm[3]"]
        assert idle_vnodes(vnodes, parse_chunk("ncpus=2")) == []
    # A normal user's view, two hosts: no Port, pbs_version, in_multivnode_host — not needed.
    real = parse_pbsnodes(load_document((shared_data / "openpbs" / "real-23.06.06" / "pbsnodes-av-F-json-2hosts-normal-user.json").read_text()))
    assert list(real) == ["vm", "vm-n1", *VNODES]
    assert {n: v.host for n, v in real.items() if v.usable(chunk)} == {**{n: "vm" for n in VM}, **{n: "vm-n1" for n in N1}}
    assert idle_vnodes(real, chunk) == N1


def test_parsers_on_recorded_qstat(shared_data):
    rec = shared_data / "openpbs"
    running_ = parse_jobs(load_document((rec / "qstat-f-F-json-pilot-running.json").read_text()))["0.vm"]
    assert running_.state == "R" and running_.run_count == 1 and running_.running
    assert running_.vnodes == ("vm[0]", "vm[1]", "vm[2]")
    assert running_.chunk_hosts == ("vm", "vm", "vm")  # primary execution host: vm
    requeued = parse_jobs(load_document((rec / "qstat-f-F-json-pilot-requeued.json").read_text()))["0.vm"]
    assert requeued.state == "Q" and requeued.run_count == 1 and requeued.vnodes == () and not requeued.running
    assert requeued.comment == "Not Running: Not enough free nodes available" and requeued.exit_status == -11
    assert requeued.nodect == 3
    # A normal user's view (no schedselect, euser, queue_rank, …): all the parser needs is there.
    real = rec / "real-23.06.06"
    normal = parse_jobs(load_document((real / "qstat-f-F-json-pilot-running-normal-user.json").read_text()))["0.vm"]
    assert normal.vnodes == tuple(VNODES) and normal.chunk_hosts == ("vm",) * 4 + ("vm-n1",) * 4
    assert (normal.substate, normal.name, normal.queue, normal.nodect) == (42, "pilot", "scavenger", 8)
    partial = parse_jobs(load_document((real / "qstat-f-F-json-after-partial-release.json").read_text()))["0.vm"]
    assert partial.vnodes == tuple(n for n in VNODES if n != "vm-n1[2]") and partial.nodect == 7
    assert partial.chunk_hosts == ("vm",) * 4 + ("vm-n1",) * 3


def test_history_off_document_has_no_jobs(shared_data):
    """Recorded: with job history off, ``qstat -x -f -F json`` of a RUNNING job prints no Jobs at all."""
    text = (shared_data / "openpbs" / "real-23.06.06" / "qstat-x-f-F-json-history-off-running-job.json").read_text()
    assert parse_jobs(load_document(text)) == {}


def test_parsers_on_recorded_cli_errors(shared_data):
    text = (shared_data / "openpbs" / "cli-errors.txt").read_text()
    # qstat of an unknown job: the error, then an empty JSON document — no jobs, not a parse failure.
    unknown = text[text.index("qstat: Unknown Job Id 99.vm") :]
    assert parse_jobs(load_document(unknown)) == {}
    assert parse_qstat_errors("qstat: Unknown Job Id 99.vm\n") == ({"99.vm"}, set())
    finished = "qstat: 7.vm Job has finished, use -x or -H to obtain historical job information\n"
    assert parse_qstat_errors(finished) == (set(), {"7.vm"})
    assert parse_qstat_errors("qdel: Job has finished 7.vm\n") == (set(), {"7.vm"})
    assert parse_job_id("4.vm\n") == "4.vm"
    assert parse_job_id("123456.polaris-pbs-01.hsn.cm.polaris.alcf.anl.gov\n").startswith("123456.")
    with pytest.raises(ValueError):
        parse_job_id("qsub: Unknown queue\n")


def test_exec_vnode_and_exec_host_parsing():
    assert parse_exec_vnode("(vm[0]:ncpus=1)+(vm[1]:ncpus=1)") == ["vm[0]", "vm[1]"]
    assert parse_exec_vnode("(a[0]:ncpus=1+a[1]:ncpus=1)+(x3005c0s13b0n0:ncpus=64:ngpus=4)") == ["a[0]", "a[1]", "x3005c0s13b0n0"]
    assert parse_exec_host("vm/0+vm/1+vm/2") == ["vm", "vm", "vm"]
    assert parse_exec_host("x1/0*64+x2/0*64") == ["x1", "x2"]
    assert parse_chunk("ncpus=64:ngpus=4:mem=4gb") == {"ncpus": 64, "ngpus": 4}


def test_queues_parsed_from_the_recording(shared_data):
    queues = parse_queues(load_document((shared_data / "openpbs" / "qstat-Q-f-F-json.json").read_text()))
    assert {q.name: (q.priority, q.queued) for q in queues.values()} == {"main": (150, 0), "scavenger": (10, 1)}


def test_whole_hosts_only():
    hosts = {**{n: "vm" for n in VM}, **{n: "vm-n1" for n in N1}}
    assert whole_hosts(["vm-n1[2]"], VNODES, hosts) == []
    assert whole_hosts(N1 + ["vm[0]"], VNODES, hosts) == N1
    assert whole_hosts(["vm-n1[2]", "vm-n1[3]"], VM + ["vm-n1[2]", "vm-n1[3]"], hosts) == ["vm-n1[2]", "vm-n1[3]"]


def test_main_job_demand():
    job = lambda n: JobStatus(f"{n}.vm", "Q", 0, (), (), nodect=n)  # noqa: E731
    assert main_job_demand([job(2)], free=3, promised=0, preemptible=0) == 2
    assert main_job_demand([job(4)], free=1, promised=3, preemptible=0) == 1, "promised vnodes first, then free ones"
    assert main_job_demand([job(4)], free=1, promised=0, preemptible=3) == 1, "it will preempt our pilot and take the free one too"
    assert main_job_demand([job(100)], free=3, promised=0, preemptible=4) == 0, "waits for a drain: the holes are ours"
    assert main_job_demand([job(2), job(2)], free=3, promised=0, preemptible=0) == 2, "the second does not fit now"
    assert main_job_demand([job(2), job(1)], free=3, promised=0, preemptible=0) == 3


def test_policy_refusals_are_recognised():
    """OpenPBS's own messages for queue limits (its test suite), exit code PBSE_ENTLIMCT % 256."""
    for message in (
        "qsub: would exceed queue generic's per-user limit of jobs in 'Q' state",
        "qsub: would exceed queue generic's per-user limit",
        "qsub: Maximum number of jobs already in queue scavenger",
        "qsub: Maximum number of jobs for user pbsuser already in queue scavenger",
    ):
        assert is_policy_refusal(1, message), message
    assert is_policy_refusal(38, "")
    assert not is_policy_refusal(170, "qsub: Unknown queue")
    assert not is_policy_refusal(59, 'qsub: "min_walltime" can not be greater than "max_walltime"')


def test_walltime_left_from_the_recorded_qstat(shared_data):
    """The recorded pilot: walltime 02:00:00 granted (shrink-to-fit), 00:00:10 used."""
    doc = json.loads((shared_data / "openpbs" / "qstat-f-F-json-pilot-running.json").read_text())
    assert parse_jobs(doc)["0.vm"].walltime_left_s == 2 * 3600 - 10


# ---------------------------------------------------------------- the stand-in against the recordings

VOLATILE = {
    "timestamp", "ctime", "mtime", "qtime", "etime", "stime", "obittime", "session_id", "jobdir", "Job_Owner", "Error_Path", "Output_Path",
    "comment", "last_state_change_time", "last_used_time", "Variable_List", "resources_used", "Submit_arguments",
}  # fmt: skip


def same_shape(ours, recorded, path="", skip=frozenset()) -> None:
    """Same keys in the same order, same value types, same values except where they depend on time, user or place."""
    if isinstance(recorded, dict) and path:  # below the document's top level
        recorded = {k: v for k, v in recorded.items() if k not in skip}
    assert type(ours) is type(recorded), f"{path}: {type(ours).__name__} vs {type(recorded).__name__}"
    if isinstance(recorded, dict):
        assert list(ours) == list(recorded), f"{path}: keys {list(ours)} vs {list(recorded)}"
        for k in recorded:
            if k not in VOLATILE:
                same_shape(ours[k], recorded[k], f"{path}.{k}", skip)
    else:
        assert ours == recorded, f"{path}: {ours!r} vs {recorded!r}"


def test_standin_layout_is_the_recorded_layout(shared_data):
    """The stand-in's JSON writer reproduces each file the real 23.06.06 printed byte for byte (4 spaces, "key":value)."""
    for f in sorted((shared_data / "openpbs" / "real-23.06.06").glob("*.json")):
        text = f.read_text()
        assert _standin.dumps(json.loads(text)) == text.rstrip("\n"), f.name


def test_standin_replays_the_real_session(shared_data, pbs, tmp_path):
    """real-23.06.06, as a normal user: a 4-vnode job, then the 8-vnode pilot, a partial release of a sister host."""
    real = shared_data / "openpbs" / "real-23.06.06"
    script = tmp_path / "pilot.sh"
    script.write_text("#!/bin/sh\nsleep 1000\n")
    pbs("pbs_standin", "delay", "join", "0")  # the documents were taken after the job's first seconds (substate 41)
    pbs("qsub", "-q", "scavenger", "-N", "pilot", "-l", "select=4:ncpus=1", "-l", "place=vscatter", "--", "/bin/true")
    same_shape(json.loads(pbs("pbsnodes", "-av", "-F", "json").stdout), json.loads((real / "pbsnodes-av-F-json-2hosts-normal-user.json").read_text()))
    pbs("pbs_standin", "init")
    assert pbs("qsub", *REAL_QSUB.replace("/tmp/pbs-check/pilot.sh", str(script)).split()).stdout == "0.vm\n"
    same_shape(json.loads(pbs("qstat", "-f", "-F", "json", "0.vm").stdout), json.loads((real / "qstat-f-F-json-pilot-running-normal-user.json").read_text()))
    pbs("pbs_release_nodes", "-j", "0.vm", "vm-n1[2]")
    same_shape(json.loads(pbs("qstat", "-f", "-F", "json", "0.vm").stdout), json.loads((real / "qstat-f-F-json-after-partial-release.json").read_text()))
    # Recorded: the released vnode stays job-busy with the job, and no other job can have it ...
    assert (pbs.vnode("vm-n1[2]")["state"], pbs.vnode("vm-n1[2]")["jobs"]) == ("job-busy", ["0.vm"])
    other = pbs("qsub", "-q", "scavenger", "-l", "select=1:ncpus=1", "--", "/bin/true").stdout.strip()
    assert pbs.job(other)["job_state"] == "Q"
    # ... until every vnode of that host is released.
    pbs("pbs_release_nodes", "-j", "0.vm", "vm-n1[0]", "vm-n1[1]", "vm-n1[3]")
    assert pbs.job(other)["job_state"] == "R" and pbs.job(other)["exec_vnode"] == "(vm-n1[0]:ncpus=1)"
    assert pbs.vnode("vm-n1[2]")["state"] == "free"


def test_standin_replays_the_earlier_session(shared_data, pbs, tmp_path):
    """The earlier capture (one host, manager view): layouts less the manager-only attributes, cli-errors.txt, requeue."""
    rec = shared_data / "openpbs"
    pbs("pbs_standin", "init", "--hosts", "vm:4")
    pbs("pbs_standin", "delay", "join", "0")  # the documents were taken after the job's first seconds (substate 41)
    script = tmp_path / "pilot.sh"
    script.write_text("#!/bin/sh\nsleep 1000\n")
    recorded = "-q scavenger -N pilot -r y -l select=3:ncpus=1 -l place=vscatter -l min_walltime=00:05:00,max_walltime=02:00:00"
    assert pbs("qsub", *recorded.split(), "-o", str(tmp_path / "pilot.out"), "-j", "oe", str(script)).stdout == "0.vm\n"
    running_job = json.loads(pbs("qstat", "-f", "-F", "json", "0.vm").stdout)
    same_shape(running_job, json.loads((rec / "qstat-f-F-json-pilot-running.json").read_text()), skip=MANAGER_ONLY)
    nodes = json.loads(pbs("pbsnodes", "-av", "-F", "json").stdout)
    same_shape(nodes, json.loads((rec / "pbsnodes-av-F-json-pilot-running.json").read_text()), skip=MANAGER_ONLY | {"last_used_time"})
    errors = (rec / "cli-errors.txt").read_text()
    refused = pbs("pbs_release_nodes", "-j", "0.vm", "vm[2]", check=False)
    assert (refused.returncode, refused.stderr.strip()) == (162, "pbs_release_nodes: Can't free 'vm[2]' since it's on a primary execution host")
    assert refused.stderr.strip() in errors
    # A main job arrives: the pilot is requeued (same id, Q, run_count 1) and the main job runs on its vnodes.
    assert pbs("qsub", "-q", "workq", "-N", "mainjob", "-l", "select=3:ncpus=1", "--", "/bin/true").stdout == "1.vm\n"
    requeued = json.loads(pbs("qstat", "-f", "-F", "json", "0.vm").stdout)
    same_shape(requeued, json.loads((rec / "qstat-f-F-json-pilot-requeued.json").read_text()), skip=MANAGER_ONLY)
    assert requeued["Jobs"]["0.vm"]["comment"] == "Not Running: Not enough free nodes available"
    assert pbs.job("1.vm")["exec_vnode"] == "(vm[0]:ncpus=1)+(vm[1]:ncpus=1)+(vm[2]:ncpus=1)"
    # The main job ends: the pilot runs again on the same vnodes.
    pbs("pbs_standin", "finish", "1.vm")
    again = pbs.job("0.vm")
    assert (again["job_state"], again["run_count"], again["exec_vnode"]) == ("R", 2, "(vm[0]:ncpus=1)+(vm[1]:ncpus=1)+(vm[2]:ncpus=1)")
    for argv, code, message in [
        (
            "qsub -q scavenger -l select=3:ncpus=1 -l min_walltime=00:05:00,max_walltime=00:01:00 -- /bin/true",
            59,
            'qsub: "min_walltime" can not be greater than "max_walltime"',
        ),
        ("qsub -q nosuchq -l select=1:ncpus=1 -- /bin/true", 170, "qsub: Unknown queue"),
        ("qstat -f -F json 99.vm", 153, "qstat: Unknown Job Id 99.vm"),
    ]:
        proc = pbs(*argv.split(), check=False)
        assert (proc.returncode, proc.stderr.strip()) == (code, message), argv
        assert message in errors
    unknown = pbs("qstat", "-f", "-F", "json", "99.vm", check=False).stdout
    assert list(json.loads(unknown)) == ["timestamp", "pbs_version", "pbs_server"]
    # More vnodes than exist: accepted, and never run.
    big = pbs("qsub", "-q", "scavenger", "-l", "select=9:ncpus=1", "-l", "place=vscatter", "--", "/bin/true").stdout.strip()
    pbs("pbs_standin", "run")
    assert pbs.job(big)["job_state"] == "Q"


def test_standin_job_history_as_recorded(shared_data, pbs):
    """History off (default): -x shows nothing even of a running job; a finished job is unknown. On: 35 without -x."""
    job = pbs("qsub", "-q", "scavenger", "-l", "select=1:ncpus=1", "--", "/bin/true").stdout.strip()
    x = pbs("qstat", "-x", "-f", "-F", "json", job, check=False)
    if pbs.history:
        assert x.returncode == 0 and json.loads(x.stdout)["Jobs"][job]["job_state"] == "R"
    else:
        recorded = json.loads((shared_data / "openpbs" / "real-23.06.06" / "qstat-x-f-F-json-history-off-running-job.json").read_text())
        assert (x.returncode, list(json.loads(x.stdout))) == (0, list(recorded))
        assert x.stderr.strip() == f"qstat: PBS is not configured to maintain job history {job}"
    pbs("pbs_standin", "finish", job, "3")
    plain = pbs("qstat", "-f", "-F", "json", job, check=False)
    deleted = pbs("qdel", job, check=False)
    if pbs.history:
        assert (plain.returncode, plain.stderr.strip()) == (35, f"qstat: {job} Job has finished, use -x or -H to obtain historical job information")
        assert (deleted.returncode, deleted.stderr.strip()) == (35, f"qdel: Job has finished {job}")
        assert json.loads(pbs("qstat", "-x", "-f", "-F", "json", job).stdout)["Jobs"][job]["Exit_status"] == 3
    else:
        assert (plain.returncode, plain.stderr.strip()) == (153, f"qstat: Unknown Job Id {job}")
        assert (deleted.returncode, deleted.stderr.strip()) == (153, f"qdel: Unknown Job Id {job}")


def test_standin_release_errors_as_recorded(pbs):
    """162 is PBSE_SYSTEM (primary host, a vnode not in the job, a mixed list: nothing released); 168 just after start."""
    pbs("pbs_standin", "delay", "join", "30")
    job = pbs("qsub", "-q", "scavenger", "-l", "select=8:ncpus=1", "-l", "place=vscatter", "--", "/bin/true").stdout.strip()
    joining = pbs("pbs_release_nodes", "-j", job, "vm-n1[0]", check=False)
    assert (joining.returncode, joining.stderr.strip()) == (168, "pbs_release_nodes: Request invalid for state of job")
    pbs("pbs_standin", "delay", "join", "0")
    mixed = pbs("pbs_release_nodes", "-j", job, "vm-n1[0]", "vm[1]", check=False)
    assert (mixed.returncode, mixed.stderr.strip()) == (162, "pbs_release_nodes: Can't free 'vm[1]' since it's on a primary execution host")
    assert "vm-n1[0]" in pbs.job(job)["exec_vnode"], "nothing at all is released"
    pbs("pbs_release_nodes", "-j", job, *N1)
    again = pbs("pbs_release_nodes", "-j", job, *N1, check=False)  # a retry whose first try worked
    assert (again.returncode, again.stderr.strip()) == (162, "pbs_release_nodes: Server returned error 15010 for job")


def test_standin_requeue_restores_the_original_select_and_shows_the_exit(pbs):
    """Recorded: a requeued pilot gets its original select back; while it exits (R, substate 60) its vnodes stay
    job-busy with it (recheck (d), d-A-1vnode-pilot-19.vm-5-preemptions-every-0.5s.csv, d-A3-…csv)."""
    pbs("pbs_standin", "delay", "join", "0")
    pbs("pbs_standin", "delay", "exit", "30")
    job = pbs("qsub", "-q", "scavenger", "-l", "select=8:ncpus=1", "-l", "place=vscatter", "--", "/bin/true").stdout.strip()
    pbs("pbs_release_nodes", "-j", job, *N1)
    main = pbs("qsub", "-q", "workq", "-l", "select=8:ncpus=1", "--", "/bin/true").stdout.strip()
    exiting = pbs.job(job)
    assert (exiting["job_state"], exiting["substate"]) == ("R", 60)
    assert pbs.job(main)["job_state"] == "Q"
    held = [n for n in VNODES if n not in N1]  # the released sister host's vnodes are free; the rest are the exiting pilot's
    assert all((pbs.vnode(n)["state"], pbs.vnode(n).get("jobs")) == ("job-busy", [job]) for n in held), "job-busy with the exiting pilot"
    other = pbs("qsub", "-q", "scavenger", "-l", "select=1:ncpus=1", "--", "/bin/true").stdout.strip()
    assert pbs.job(other)["job_state"] == "Q", "nothing else may start on the promised vnodes"
    pbs("pbs_standin", "delay", "exit", "0")
    pbs("pbs_standin", "run")
    requeued = pbs.job(job)
    assert (requeued["job_state"], requeued["Resource_List"]["select"], requeued["Resource_List"]["nodect"]) == ("Q", "8:ncpus=1", 8)
    assert requeued["Exit_status"] == -11 and requeued["comment"] == "Not Running: Not enough free nodes available"
    assert pbs.job(main)["job_state"] == "R"
    pbs("qdel", other)
    pbs("pbs_standin", "finish", main)
    rerun = pbs.job(job)
    assert (rerun["job_state"], rerun["run_count"]) == ("R", 2)
    assert parse_exec_vnode(rerun["exec_vnode"]) == VNODES, "the vnodes it had released come back"


def test_standin_refuses_by_queue_limit(pbs):
    """OpenPBS's own words and code (PBSE_ENTLIMCT 15142 % 256 = 38) for max_queued / queued_jobs_threshold."""
    pbs("pbs_standin", "limit", "scavenger", "max_queued", "1")
    pbs("qsub", "-q", "scavenger", "-l", "select=1:ncpus=1", "--", "/bin/true")
    refused = pbs("qsub", "-q", "scavenger", "-l", "select=1:ncpus=1", "--", "/bin/true", check=False)
    assert (refused.returncode, refused.stderr.strip()) == (38, "qsub: would exceed queue generic's per-user limit")
    pbs("pbs_standin", "limit", "scavenger", "max_queued", "0")
    pbs("pbs_standin", "limit", "scavenger", "queued_jobs_threshold", "1")
    pbs("qsub", "-q", "scavenger", "-l", "select=9:ncpus=1", "--", "/bin/true")  # never runs: stays Q
    refused = pbs("qsub", "-q", "scavenger", "-l", "select=1:ncpus=1", "--", "/bin/true", check=False)
    assert (refused.returncode, refused.stderr.strip()) == (38, "qsub: would exceed queue generic's per-user limit of jobs in 'Q' state")


# ---------------------------------------------------------------- the stand-in against the recheck (real-23.06.06-recheck)


def recheck(shared_data) -> Path:
    return shared_data / "openpbs" / "real-23.06.06-recheck"


def test_standin_release_with_a_released_vnode_as_recorded(shared_data, pbs):
    """Recheck (e): e-pbs_release_nodes-already-released-plus-held.txt, e-pbs_release_nodes-other-orders.txt."""
    text = (recheck(shared_data) / "e-pbs_release_nodes-other-orders.txt").read_text()
    pbs("pbs_standin", "delay", "join", "0")
    for order in (["vm-n1[0]", "vm-n1[1]"], ["vm-n1[1]", "vm-n1[0]"]):
        pbs("pbs_standin", "init")
        job = pbs("qsub", "-q", "scavenger", "-l", "select=1:ncpus=1:host=vm+3:ncpus=1:host=vm-n1", "--", "/bin/true").stdout.strip()
        assert pbs.job(job)["exec_vnode"] == "(vm[0]:ncpus=1)+(vm-n1[0]:ncpus=1)+(vm-n1[1]:ncpus=1)+(vm-n1[2]:ncpus=1)"
        pbs("pbs_release_nodes", "-j", job, "vm-n1[0]")
        both = pbs("pbs_release_nodes", "-j", job, *order, check=False)
        assert (both.returncode, both.stdout, both.stderr) == (0, "", ""), "the held one is released, the released one skipped"
        assert pbs.job(job)["exec_vnode"] == "(vm[0]:ncpus=1)+(vm-n1[2]:ncpus=1)"
        assert pbs.job(job)["exec_host"] == "vm/0+vm-n1/2"
    alone = pbs("pbs_release_nodes", "-j", job, "vm-n1[0]", check=False)
    assert (alone.returncode, alone.stderr) == (162, "pbs_release_nodes: Server returned error 15010 for job \n")
    foreign = pbs("pbs_release_nodes", "-j", job, "vm-n1[2]", "nosuch[9]", check=False)
    assert (foreign.returncode, foreign.stderr) == (162, "pbs_release_nodes: node(s) requested to be released not part of the job: nosuch[9] \n")
    assert pbs.job(job)["exec_vnode"] == "(vm[0]:ncpus=1)+(vm-n1[2]:ncpus=1)", "nothing released"
    for stderr in (alone.stderr, foreign.stderr):
        assert f"stderr: {stderr.rstrip(chr(10))}" in text


def test_standin_168_and_substate_41_last_as_long_as_recorded(shared_data, pbs):
    """Recheck (f), f-release-168-window.csv: 168 for 2.15-2.21 s after R; (d) the first ~2 s of R show substate 41."""
    rows = (recheck(shared_data) / "f-release-168-window.csv").read_text().splitlines()[1:]
    window = [float(r.split(",")[5]) for r in rows]
    assert min(window) - 0.1 <= pbs.state()["delays"]["join"] <= max(window) + 0.1
    pbs("pbs_standin", "delay", "join", "30")
    job = pbs("qsub", "-q", "scavenger", "-l", "select=1:ncpus=1:host=vm+1:ncpus=1:host=vm-n1", "--", "/bin/true").stdout.strip()
    assert (pbs.job(job)["job_state"], pbs.job(job)["substate"]) == ("R", 41)
    assert pbs("pbs_release_nodes", "-j", job, "vm-n1[0]", check=False).returncode == 168
    pbs("pbs_standin", "delay", "join", "0")
    assert pbs.job(job)["substate"] == 42
    assert pbs("pbs_release_nodes", "-j", job, "vm-n1[0]", check=False).returncode == 0


def test_standin_requeues_only_the_pilot_on_the_wanted_vnode(pbs):
    """Recheck (a) (a-server-log-2.vm-3.vm-7.vm.txt: 7.vm ``vnode=vm[0]`` requeued only 2.vm) and the e2e run
    (e2e-server-log-pilots-38-43-main-44.txt: 44.vm ``select=2`` requeued only 43.vm, the newest, on 2 vnodes).
    The stand-in used to requeue every pilot, newest first, until the main job fitted (issue 25, item 9)."""
    pbs("pbs_standin", "init", "--hosts", "vm:3")  # no vnode left free: a requeued pilot waits
    pilots = [pbs("qsub", "-q", "scavenger", "-l", "select=1:ncpus=1", "--", "/bin/true").stdout.strip() for _ in range(3)]
    assert [pbs.job(j)["exec_vnode"] for j in pilots] == ["(vm[0]:ncpus=1)", "(vm[1]:ncpus=1)", "(vm[2]:ncpus=1)"]
    pbs("pbs_standin", "preempt", pilots[0])
    assert [pbs.job(j)["job_state"] for j in pilots] == ["Q", "R", "R"]
    pbs("pbs_standin", "init", "--hosts", "vm:4,vm-n1:4")
    sizes = [1, 2, 1, 1, 1, 2]  # 38.vm..43.vm of the e2e run
    pilots = [pbs("qsub", "-q", "scavenger", "-l", f"select={n}:ncpus=1", "--", "/bin/true").stdout.strip() for n in sizes]
    main = pbs("qsub", "-q", "workq", "-l", "select=2:ncpus=1", "--", "/bin/true").stdout.strip()
    assert [pbs.job(j)["job_state"] for j in pilots] == ["R"] * 5 + ["Q"]
    assert pbs.job(main)["job_state"] == "R"
    pinned = pbs("qsub", "-q", "workq", "-l", "select=1:ncpus=1:vnode=vm[1]", "--", "/bin/sleep", "60").stdout.strip()
    assert [pbs.job(j)["job_state"] for j in pilots] == ["R", "Q", "R", "R", "R", "Q"], "only the pilot on vm[1]"
    assert pbs.job(pinned)["exec_vnode"] == "(vm[1]:ncpus=1)"


def test_standin_pbs_tmrsh_forwards_no_signal(shared_data, pbs, tmp_path):
    """Recheck (c), c-local-job-log.txt, c-remote-probe-log.txt, c-mom-logs-27.vm.txt: SIGTERM to the local pbs_tmrsh
    ends it at once with exit 0; the remote task (a session of its own, not pbs_tmrsh's child) gets no signal and
    runs on; the job's end kills what is left of it (the sister MOM's kill_job)."""
    assert "local pbs_tmrsh ended, exit status 0" in (recheck(shared_data) / "c-local-job-log.txt").read_text()
    pbs("pbs_standin", "exec", "on")
    probe = tmp_path / "probe.sh"
    probe.write_text(f"""#!/bin/sh
for s in TERM INT HUP; do trap "echo got $s >> {tmp_path}/remote.log" $s; done
echo "start $$ $PPID" >> {tmp_path}/remote.log
while [ ! -e "$1" ]; do sleep 0.05; done
echo "normal end" >> {tmp_path}/remote.log
exit 7
""")
    probe.chmod(0o755)
    script = tmp_path / "job.sh"
    script.write_text(f"""#!/bin/sh
pbs_tmrsh vm-n1 {probe} {tmp_path}/done1 &
echo $! > {tmp_path}/tmrsh.pid
wait $!; echo "tmrsh $?" >> {tmp_path}/local.log
pbs_tmrsh vm-n1 {probe} {tmp_path}/done1; echo "tmrsh $?" >> {tmp_path}/local.log
pbs_tmrsh vm-n1 {probe} {tmp_path}/never &
sleep 1000
""")
    script.chmod(0o755)
    job = pbs("qsub", "-q", "scavenger", "-l", "select=1:ncpus=1:host=vm+1:ncpus=1:host=vm-n1", str(script)).stdout.strip()
    remote = wait_for_text(tmp_path / "remote.log", "start")
    tmrsh = int(wait_for_text(tmp_path / "tmrsh.pid", "").split()[0])
    task, parent = (int(x) for x in remote.split()[1:3])
    assert parent != tmrsh and os.getsid(task) != os.getsid(tmrsh), "not pbs_tmrsh's child, in a session of its own"
    os.kill(tmrsh, signal.SIGTERM)
    assert wait_for_text(tmp_path / "local.log", "tmrsh").strip() == "tmrsh 0"
    assert "got" not in (tmp_path / "remote.log").read_text() and os.path.exists(f"/proc/{task}"), "no signal reached it"
    (tmp_path / "done1").touch()
    wait_for_text(tmp_path / "local.log", "tmrsh 7")  # the second one waited for its task and gave its status
    third = int(wait_for_text(tmp_path / "remote.log", "start", count=3).splitlines()[-1].split()[1])
    assert "got" not in (tmp_path / "remote.log").read_text()
    pbs("pbs_standin", "delay", "kill", "0")
    pbs("qdel", job)
    pbs("pbs_standin", "run")
    wait_until(lambda: not os.path.exists(f"/proc/{third}") or open(f"/proc/{third}/stat").read().rsplit(")", 1)[1].split()[0] == "Z",
               "the job's end to kill its remaining task")  # fmt: skip
    assert [c["argv"][1] for c in pbs.state()["calls"] if c["cmd"] == "pbs_tmrsh"] == ["vm-n1", "vm-n1", "vm-n1"]


def test_standin_rerun_of_a_script_whose_shell_dies_first_ends_at_moms_kill_check(pbs, tmp_path):
    """The real server (turn 4 (e), tests/test_pbs_server.py): a script runs under the user's login shell, which the
    preemption's SIGTERM ends first; MOM then no longer sees the script's processes go, finds the session empty only at
    its kill check and SIGKILLs what is left there ("task … force exited": a child ignoring SIGTERM, 21 s). Recheck
    (d) B took the same for "nothing SIGKILLs it": its child ended by itself 20 s later, before the check."""
    pbs("pbs_standin", "init", "--hosts", "vm:1")  # one vnode: the requeued pilot waits for it
    pbs("pbs_standin", "exec", "on")
    # MOM's kill check comes when the test says: with a delay of seconds, a busy machine passed it between two commands
    # (the main job, 1.vm, already held the vnode the test expected the pilot, 0.vm, to hold).
    pbs("pbs_standin", "delay", "kill", "600")
    done = tmp_path / "done"
    child = tmp_path / "child.py"
    child.write_text(f"""import os, signal, sys, time
os.setpgid(0, 0)  # another process group, the same session
signal.signal(signal.SIGTERM, lambda s, f: open(sys.argv[1], "a").write("child got TERM\\n"))
open(sys.argv[1], "a").write(f"child {{os.getpid()}}\\n")
while not os.path.exists({str(done)!r}):
    time.sleep(0.05)
open(sys.argv[1], "a").write("child done\\n")
""")
    log = tmp_path / "pilot.log"
    script = tmp_path / "pilot.sh"
    script.write_text(f"""#!/bin/sh
trap 'echo "TERM received" >> {log}; exit 0' TERM
{sys.executable} {child} {log} &
while true; do sleep 0.1; done
""")
    script.chmod(0o755)
    pilot = pbs("qsub", "-q", "scavenger", "-l", "select=1:ncpus=1", str(script)).stdout.strip()
    try:
        wait_for_text(log, "child ")
        main = pbs("pbs_standin", "preempt", pilot, "30").stdout.strip()
        wait_for_text(log, "child got TERM")  # the whole session got it, not only the script's group
        pbs("pbs_standin", "run")
        assert (pbs.job(pilot)["job_state"], pbs.job(pilot)["substate"]) == ("R", 60)
        assert pbs.job(main)["job_state"] == "Q"
        assert (pbs.vnode("vm[0]")["state"], pbs.vnode("vm[0]")["jobs"]) == ("job-busy", [pilot])
        pbs("pbs_standin", "delay", "kill", "0")  # the kill check is due now
        wait_until(lambda: pbs("pbs_standin", "run") and pbs.job(main)["job_state"] == "R", "the main job to start at the kill check")
        assert pbs.job(pilot)["job_state"] == "Q"
        assert "child done" not in log.read_text()  # SIGKILLed at the check
    finally:
        done.touch()  # the child goes, whatever happened


def test_standin_rerun_of_a_command_that_exits_last_ends_when_it_exits(pbs, tmp_path):
    """``qsub … -- COMMAND`` (as pilots are submitted): the command is the job's top process; when it exits with
    nothing of its session left, MOM sends the obit at once — no kill check to wait for."""
    pbs("pbs_standin", "init", "--hosts", "vm:1")
    pbs("pbs_standin", "exec", "on")
    pbs("pbs_standin", "delay", "kill", "600")  # waiting for the check would fail the test
    log = tmp_path / "top.log"
    top = tmp_path / "top.py"
    top.write_text(f"""import signal, sys, time
def term(s, f):
    open({str(log)!r}, "a").write("TERM\\n")
    time.sleep(0.5)  # ends what it started, then goes
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
open({str(log)!r}, "a").write("up\\n")
while True:
    time.sleep(0.1)
""")
    pilot = pbs("qsub", "-q", "scavenger", "-l", "select=1:ncpus=1", "--", sys.executable, str(top)).stdout.strip()
    wait_for_text(log, "up")
    main = pbs("pbs_standin", "preempt", pilot, "30").stdout.strip()
    wait_for_text(log, "TERM")
    wait_until(lambda: pbs("pbs_standin", "run") and pbs.job(main)["job_state"] == "R", "the main job to start once the command has exited")
    assert pbs.job(pilot)["job_state"] == "Q"


def test_standin_qdel_during_a_requeue_is_lost(shared_data, pbs):
    """Recheck (x), x-qdel-of-pilot-45.vm-during-rerun-every-0.5s.csv, x-server-log-qdel-during-rerun-45.vm.txt: qdel
    while the pilot is R substate 60 exits 0 ("deleting instead of rerunning"), the job shows R substate 42 until it
    has exited, then Q, and runs again when the main job ends."""
    assert "deleting instead of rerunning" in (recheck(shared_data) / "x-server-log-qdel-during-rerun-45.vm.txt").read_text()
    pbs("pbs_standin", "init", "--hosts", "vm:1")  # as there: the pilot's one vnode is the main job's
    pbs("pbs_standin", "delay", "exit", "60")
    pilot = pbs("qsub", "-q", "scavenger", "-l", "select=1:ncpus=1", "--", "/bin/true").stdout.strip()
    main = pbs("pbs_standin", "preempt", pilot).stdout.strip()
    assert (pbs.job(pilot)["job_state"], pbs.job(pilot)["substate"]) == ("R", 60)
    deleted = pbs("qdel", pilot, check=False)
    assert (deleted.returncode, deleted.stderr) == (0, "")
    assert (pbs.job(pilot)["job_state"], pbs.job(pilot)["substate"]) == ("R", 42)
    pbs("pbs_standin", "delay", "exit", "0")
    pbs("pbs_standin", "run")
    assert pbs.job(pilot)["job_state"] == "Q" and pbs.job(main)["job_state"] == "R"
    pbs("pbs_standin", "finish", main)
    assert (pbs.job(pilot)["job_state"], pbs.job(pilot)["run_count"]) == ("R", 2), "it runs again"


def test_standin_refuses_an_unknown_resource_with_187(shared_data, pbs):
    """Recheck (g), g-bad-resource-qsub-187-with-config.txt."""
    refused = pbs("qsub", "-q", "scavenger", "-l", "select=1:ncpus=1", "-l", "nosuchres=1", "--", "/bin/true", check=False)
    assert (refused.returncode, refused.stderr.strip()) == (187, "qsub: Unknown resource Resource_List.nosuchres")
    assert refused.stderr.strip() in (recheck(shared_data) / "g-bad-resource-qsub-187-with-config.txt").read_text()
    assert pbs("qsub", "-q", "scavenger", "-l", "select=1:ncpus=1", "-l", "filesystems=home", "--", "/bin/true").returncode == 0


def wait_for_text(path: Path, text: str, count: int = 1, timeout_s: float = 240) -> str:
    """The file's content once it holds ``text`` (``count`` times)."""
    return wait_until(lambda: path.exists() and path.read_text().count(text) >= count and path.read_text(), f"{text!r} in {path.name}", timeout_s)


def wait_until(predicate, what: str, timeout_s: float = 240):
    from waiting import wait_for

    return wait_for(predicate, timeout_s, what, poll_s=0.05)


# ---------------------------------------------------------------- the adapter on the stand-in: the basics


def test_idle_nodes_counts_free_vnodes_with_cpus(make, pbs):
    clock = Clock()
    s = make(clock=clock, poll_s=5.0)
    assert s.idle_nodes() == 8  # vm[0..3], vm-n1[0..3]; the natural vnodes have no cpus
    pbs("qsub", "-q", "workq", "-l", "select=3:ncpus=1", "--", "/bin/true")
    assert s.idle_nodes() == 8, "pbsnodes is asked at most every poll_s"
    assert len(pbs.calls("pbsnodes")) == 1
    clock.t += 5.0
    assert s.idle_nodes() == 5
    assert pbs.calls("pbsnodes")[-1] == ["pbsnodes", "-av", "-F", "json"]


def test_submit_runs_the_agent_with_shrink_to_fit_walltime(make, pbs, tmp_path):
    """The pilot is an executable job whose command is the agent itself (``qsub … -- python -m pilotfill.pilots.agent``):
    under a job script the user's login shell is the top process, the preemption's SIGTERM ends it first, and the real
    MOM then sees the session end only at its kill_delay check (tests/test_pbs_server.py)."""
    s = make(queue="scavenger", account="MYPROJECT", min_walltime="00:05:00", max_walltime="02:00:00", place="vscatter", extra_args=("-l", "filesystems=home"))
    assert s.submit_pilot("p1", 3) == "0.vm"
    run_dir = (tmp_path / "run").resolve()
    agent = agent_argv(run_dir, "p1", "pbs", PilotConfig(), python=sys.executable, bin_dir=str(Path(shutil.which("qsub")).parent))
    assert pbs.calls("qsub") == [[
        "qsub", "-q", "scavenger", "-N", "pf-p1", "-r", "y", "-l", "select=3:ncpus=1", "-l", "place=vscatter",
        "-l", "min_walltime=00:05:00,max_walltime=02:00:00", "-A", "MYPROJECT", "-l", "filesystems=home",
        "-o", str(run_dir / "logs" / "pilot-p1.out"), "-j", "oe", "--", *agent,
    ]]  # fmt: skip
    assert agent[1:3] == ["-m", "pilotfill.pilots.agent"] and agent[agent.index("--bin-dir") + 1] == str(PBS_STANDIN)
    job = pbs.job("0.vm")
    assert job["Rerunable"] == "True" and job["queue"] == "scavenger" and job["Job_Name"] == "pf-p1"
    assert job["Resource_List"]["select"] == "3:ncpus=1" and job["Resource_List"]["walltime"] == "02:00:00"


def test_submit_uses_the_configured_python(make, pbs, tmp_path):
    s = make(python="/opt/site/python3")
    s.submit_pilot("p1", 1)
    argv = pbs.calls("qsub")[-1]
    assert argv[argv.index("--") + 1 :][:3] == ["/opt/site/python3", "-m", "pilotfill.pilots.agent"]


def test_never_more_nodes_than_exist_or_are_idle(make, pbs):
    s = make(nodes_per_pilot=16)
    s.submit_pilot("big", 12)  # 12 would be accepted by PBS and queued forever (cli-errors.txt)
    assert "select=8:ncpus=1" in pbs.calls("qsub")[-1]
    assert pbs.job("0.vm")["job_state"] == "R"
    s.cancel("big")
    pbs("qsub", "-q", "workq", "-l", "select=7:ncpus=1", "--", "/bin/true")  # 1.vm: the main workload takes 7
    s.submit_pilot("small", 4)
    assert "select=1:ncpus=1" in pbs.calls("qsub")[-1]
    with pytest.raises(NothingIdle, match="0 idle of 8 usable"):
        s.submit_pilot("none", 2)
    assert len(pbs.calls("qsub")) == 3  # nothing submitted when nothing is idle


def test_scatter_counts_hosts_not_vnodes(make, pbs):
    """place=scatter puts each chunk on its own host: on the recorded two-host machine that is two chunks, not eight."""
    s = make(place="scatter")
    assert s.idle_nodes() == 2
    s.submit_pilot("p", 3)
    assert "select=2:ncpus=1" in pbs.calls("qsub")[-1]
    assert pbs.job("0.vm")["job_state"] == "R"


def test_nodes_per_pilot_caps_the_select(make, pbs):
    s = make(nodes_per_pilot=2)
    s.submit_pilot("p", 4)
    assert "select=2:ncpus=1" in pbs.calls("qsub")[-1]


def test_queued_pilot_is_not_counted_idle_twice(make, pbs):
    """On a real PBS a new pilot waits a scheduling cycle while its vnodes still show free."""
    pbs("pbs_standin", "auto", "off")
    s = make()
    s.submit_pilot("p", 3)
    assert pbs.job("0.vm")["job_state"] == "Q"
    assert s.idle_nodes() == 5
    pbs("pbs_standin", "run")
    assert s.idle_nodes() == 5  # now job-busy


def test_started_then_ended_events(make, pbs):
    s, t = make(), Ticks()
    s.submit_pilot("p", 3)
    [started] = s.poll(t())
    assert (started.kind, started.pilot, started.scheduler_id, started.nodes) == ("started", "p", "0.vm", tuple(VM[:3]))
    assert s.poll(t()) == []  # once per run
    pbs("pbs_standin", "finish", "0.vm", "3")
    if not pbs.history:
        assert s.poll(t()) == [], "unknown once: asked about once more"
    [ended] = s.poll(t())
    assert (ended.kind, ended.pilot, ended.nodes) == ("ended", "p", tuple(VM[:3]))
    # History on: 35 without -x is definite, and -x (history is on) gives the exit status.
    assert ended.detail == ("finished, Exit_status 3" if pbs.history else "gone")
    assert s.poll(t()) == []


def test_poll_asks_qstat_at_most_every_poll_s_and_never_with_x_for_live_jobs(make, pbs):
    s = make(poll_s=5.0)
    s.submit_pilot("p", 1)
    assert [e.kind for e in s.poll(100.0)] == ["started"]
    assert s.poll(101.0) == [] and s.poll(104.9) == []
    assert len(job_qstats(pbs)) == 1
    s.poll(105.0)
    assert len(job_qstats(pbs)) == 2
    assert job_qstats(pbs)[-1] == ["qstat", "-f", "-F", "json", "0.vm"]
    assert all("-x" not in argv for argv in pbs.calls("qstat")), "with job history off -x shows no live job at all"


# ---------------------------------------------------------------- item 1: job history on and off


def test_live_pilot_is_never_dropped_whatever_the_history_setting(make, pbs):
    """real-23.06.06 item 1: an adapter that asked with -x declared every pilot gone at its first poll (history off)."""
    s, t = make(), Ticks()
    s.submit_pilot("a", 2)
    pbs("pbs_standin", "auto", "off")
    s.submit_pilot("b", 1)  # stays queued: no scheduler pass
    events = [e for _ in range(3) for e in s.poll(t())]
    assert [(e.kind, e.pilot) for e in events] == [("started", "a")]
    assert s.following() == {"a", "b"}


def test_a_vanished_job_is_asked_about_once_more_before_it_is_ended(make, pbs):
    s, t = make(), Ticks()
    s.submit_pilot("p", 1)
    s.poll(t())
    pbs("pbs_standin", "fail", "qstat", "153", "1")  # one answer that does not know the job (a server hiccup)
    assert s.poll(t()) == [], "not ended on one unknown answer"
    assert s.poll(t()) == [], "it is still there"
    pbs("qdel", "0.vm")  # someone else deleted it
    first = s.poll(t())
    if pbs.history:
        assert [(e.kind, e.detail) for e in first] == [("ended", "finished, Exit_status 271")]  # 35 is definite
    else:
        assert first == [], "asked about once more before it is declared ended"
        assert [(e.kind, e.detail) for e in s.poll(t())] == [("ended", "gone")]


def test_close_deletes_every_pilot_it_submitted_tracked_or_not(make, pbs):
    """Even one the adapter took for gone (two answers that did not know it, from a confused server) is deleted."""
    s, t = make(), Ticks()
    s.submit_pilot("a", 2)
    running(s, t, "a")
    pbs("pbs_standin", "auto", "off")
    s.submit_pilot("b", 1)  # queued
    pbs("pbs_standin", "fail", "qstat", "153", "2")
    assert s.poll(t()) == []
    assert sorted((e.kind, e.pilot) for e in s.poll(t())) == [("ended", "a"), ("ended", "b")]
    assert not s.following(), "taken for gone"
    assert set(pbs.jobs()) == {"0.vm", "1.vm"}, "but PBS still has both"
    s.close()
    assert pbs.jobs() == {}
    assert sorted(j for argv in pbs.calls("qdel") for j in argv[1:]) == ["0.vm", "1.vm"]


def test_close_deletes_queued_and_running_pilots_and_leaves_none(make, pbs):
    s = make()
    s.submit_pilot("a", 1)
    s.submit_pilot("b", 9)
    s.close()
    assert pbs.calls("qdel")[0] == ["qdel", "0.vm", "1.vm"]
    assert pbs.jobs() == {}


# ---------------------------------------------------------------- item 2: releasing whole sister hosts


def test_release_is_per_whole_sister_host(make, pbs):
    """A vnode is given back only with the rest of its host (PBS cannot use it before), never on the primary host."""
    pbs("pbs_standin", "delay", "join", "0")
    s, t = make(), Ticks()
    s.submit_pilot("p", 8)
    assert running(s, t, "p") == tuple(VNODES)
    assert s.idle_nodes() == 0
    assert s.release("p", ["vm-n1[2]"]) == [], "the rest of vm-n1 is still held"
    assert s.release("p", ["vm[1]", "vm-n1[2]", "vm-n1[3]"]) == [], "vm is the primary host; vm-n1 is not wholly wanted"
    assert pbs.calls("pbs_release_nodes") == []
    assert s.release("p", ["vm[3]", *N1]) == N1
    assert pbs.calls("pbs_release_nodes") == [["pbs_release_nodes", "-j", "0.vm", *N1]]
    assert s.idle_nodes() == 4, "all four are usable by PBS now"
    assert parse_exec_vnode(pbs.job("0.vm")["exec_vnode"]) == VM


def test_capacity_counts_only_what_pbs_can_use(make, pbs):
    """A vnode released alone (by hand here) leaves exec_vnode but stays job-busy: it is not idle."""
    pbs("pbs_standin", "delay", "join", "0")
    s, t = make(), Ticks()
    s.submit_pilot("p", 8)
    running(s, t, "p")
    pbs("pbs_release_nodes", "-j", "0.vm", "vm-n1[2]")
    assert s.idle_nodes() == 0
    assert s.release("p", ["vm-n1[0]", "vm-n1[1]", "vm-n1[3]"]) == [], "vm-n1[2] is still the pilot's as far as we know"
    assert s.idle_nodes() == 0
    assert s.release("p", N1) == N1, "162 for vm-n1[2] (no longer in the job): the others released, the host is whole"
    assert s.idle_nodes() == 4


def test_release_sister_hosts_on_single_vnode_hosts(make, pbs):
    """Polaris style: each host one vnode, place=scatter. Every host but the first can be given back."""
    pbs("pbs_standin", "init", "--hosts", "x1:0,x2:0,x3:0,x4:0", "--ncpus", "64", "--ngpus", "4")
    pbs("pbs_standin", "delay", "join", "0")
    s, t = make(chunk="ncpus=64:ngpus=4", place="scatter"), Ticks()
    assert s.idle_nodes() == 4
    s.submit_pilot("p", 3)
    assert running(s, t, "p") == ("x1", "x2", "x3")
    assert pbs.job("0.vm")["exec_host"] == "x1/0*64+x2/0*64+x3/0*64"
    assert s.release("p", ["x1", "x3"]) == ["x3"]  # x1 is the primary execution host
    assert pbs.calls("pbs_release_nodes") == [["pbs_release_nodes", "-j", "0.vm", "x3"]]
    assert pbs.job("0.vm")["exec_vnode"] == "(x1:ncpus=64:ngpus=4)+(x2:ncpus=64:ngpus=4)"
    assert s.idle_nodes() == 2
    assert s.release("p", ["x1", "x2"]) == ["x1", "x2"]  # what is left is everything: qdel
    assert pbs.calls("qdel") == [["qdel", "0.vm"]]
    [ended] = s.poll(t())
    assert ended.kind == "ended" and ended.nodes == ("x1", "x2")


def test_release_of_every_vnode_deletes_the_pilot(make, pbs):
    s, t = make(), Ticks()
    s.submit_pilot("p", 3)
    running(s, t, "p")
    assert s.release("p", ["vm[2]", "vm[0]", "vm[1]"]) == ["vm[2]", "vm[0]", "vm[1]"]
    assert pbs.calls("qdel") == [["qdel", "0.vm"]] and pbs.calls("pbs_release_nodes") == []
    assert [e.kind for e in s.poll(t())] == ["ended"]
    assert s.idle_nodes() == 8


def test_release_before_the_start_was_polled(make, pbs):
    """The agent can register before the adapter's next poll: release asks qstat rather than guess."""
    pbs("pbs_standin", "init", "--hosts", "a:1,b:1")
    pbs("pbs_standin", "delay", "join", "0")
    s, t = make(place="scatter"), Ticks()
    s.submit_pilot("p", 2)
    assert s.release("p", ["b[0]"]) == ["b[0]"]
    assert [(e.kind, e.nodes) for e in s.poll(t())] == [("started", ("a[0]", "b[0]"))]


# ---------------------------------------------------------------- item 3: 162, 168, 35, a release after a timeout


def test_162_is_read_not_taken_for_primary_host(make, pbs, caplog):
    pbs("pbs_standin", "delay", "join", "0")
    s, t = make(), Ticks()
    s.submit_pilot("p", 8)
    running(s, t, "p")
    # Our view of the hosts is stale: PBS says which vnode is on the primary host; nothing given back, nothing lost.
    assert s.primary_host("p") == "vm"
    s._pilots["p"].primary = "elsewhere"  # no command makes the adapter's view stale: set here, as after a missed requeue
    with caplog.at_level(logging.WARNING, "pilotfill.schedulers.pbs"):
        assert s.release("p", VM) == []
    assert "Can't free 'vm[0]' since it's on a primary execution host" in caplog.text
    assert s.primary_host("p") == "vm", "learnt from the message"
    # 162 for vnodes the job no longer holds (released behind our back): what the job holds decides.
    pbs("pbs_release_nodes", "-j", "0.vm", *N1)
    assert s.release("p", N1) == N1
    assert pbs.calls("pbs_release_nodes")[-1] == ["pbs_release_nodes", "-j", "0.vm", *N1]
    assert s.poll(t()) == []


def test_a_release_that_timed_out_after_working_is_checked_before_it_is_reported(make, pbs):
    pbs("pbs_standin", "init", "--hosts", "a:2,b:2,c:2")
    pbs("pbs_standin", "delay", "join", "0")
    s, t = make(command_timeout_s=1.0), Ticks()
    s.submit_pilot("p", 6)
    assert running(s, t, "p") == ("a[0]", "a[1]", "b[0]", "b[1]", "c[0]", "c[1]")
    pbs("pbs_standin", "slow", "pbs_release_nodes", "10")  # does the work, then hangs
    assert s.release("p", ["b[0]", "b[1]"]) == ["b[0]", "b[1]"], "timed out, but the job no longer holds them"
    assert parse_exec_vnode(pbs.job("0.vm")["exec_vnode"]) == ["a[0]", "a[1]", "c[0]", "c[1]"]
    pbs("pbs_standin", "hang", "pbs_release_nodes", "10")  # hangs without doing anything
    with pytest.raises(SchedulerCommandError, match="timed out"):
        s.release("p", ["c[0]", "c[1]"])
    assert parse_exec_vnode(pbs.job("0.vm")["exec_vnode"]) == ["a[0]", "a[1]", "c[0]", "c[1]"]
    assert s.release("p", ["c[0]", "c[1]"]) == ["c[0]", "c[1]"], "kept, and given back when asked again"


def test_168_right_after_a_start_is_retried_briefly(make, pbs):
    """real-23.06.06 item 4: 168 for about 2 s after a multi-host job turns R (sister MOMs joining). The MOMs join
    while the adapter waits, not after a time: on a busy machine the first try may come later than 2 s."""
    pbs("pbs_standin", "delay", "join", "600")
    waited: list[float] = []

    def wait(seconds: float) -> None:
        waited.append(seconds)
        pbs("pbs_standin", "delay", "join", "0")  # the sister MOMs have joined

    s, t = make(sleep=wait), Ticks()
    s.submit_pilot("p", 8)
    running(s, t, "p")
    assert s.release("p", N1) == N1
    assert len(waited) == 1 and len(pbs.calls("pbs_release_nodes")) == 2, "refused with 168 first, then retried"
    # A job that stays in a bad state is not waited on for long: an error, the nodes kept.
    s.close()
    pbs("pbs_standin", "init")
    pbs("pbs_standin", "delay", "join", "600")
    naps: list[float] = []
    s2 = make(sleep=naps.append)
    s2.submit_pilot("q", 8)
    running(s2, t, "q")
    with pytest.raises(SchedulerCommandError, match="exited 168.*Request invalid for state of job"):
        s2.release("q", N1)
    assert 0 < sum(naps) <= 5.0


def test_35_on_qdel_and_qstat_means_finished(make, pbs):
    s, t = make(), Ticks()
    s.submit_pilot("p", 1)
    running(s, t, "p")
    pbs("pbs_standin", "finish", "0.vm", "0")
    s.cancel("p")  # 35 (history on) or 153 (off): already over is fine
    [ended] = s.poll(t())
    assert ended.kind == "ended" and ended.detail == ("finished, Exit_status 0" if pbs.history else "gone")
    s.close()  # qdel of the finished job: fine too


# ---------------------------------------------------------------- item 6: a requeued pilot's vnodes come back


def test_requeued_pilot_reports_its_full_vnode_set_when_it_runs_again(make, pbs, monkeypatch):
    pbs("pbs_standin", "delay", "join", "0")
    s, t = make(), Ticks()
    s.submit_pilot("p", 8)
    running(s, t, "p")
    assert s.release("p", N1) == N1
    main = pbs("pbs_standin", "preempt", "0.vm").stdout.strip()  # a main job wants exactly what the pilot holds
    [ended] = s.poll(t())
    assert (ended.kind, ended.nodes, ended.detail) == ("ended", tuple(VM), "requeued (preempted)")
    pbs("pbs_standin", "finish", main)
    [started] = s.poll(t())
    assert (started.kind, started.nodes, started.detail) == ("started", tuple(VNODES), "run 2")
    monkeypatch.setenv("PBS_JOBID", "0.vm")
    assert pbs_module.PbsNodes().nodes_of_this_job() == VNODES, "the agent of the new run registers all of them"
    assert s.release("p", N1) == N1, "and they can be given back again"


def test_requeue_and_rerun_between_two_polls(make, pbs):
    s, t = make(), Ticks()
    s.submit_pilot("p", 2)
    s.poll(t())
    main = pbs("pbs_standin", "preempt", "0.vm").stdout.strip()
    pbs("pbs_standin", "finish", main)
    assert [(e.kind, e.detail) for e in s.poll(t())] == [("ended", "requeued (preempted)"), ("started", "run 2")]


# ---------------------------------------------------------------- item 7: vnodes the main workload is about to take


def test_a_preempted_pilots_vnodes_are_not_idle_while_it_exits(make, pbs):
    """While a main job waits for a preempted pilot to exit, the pilot's vnodes are the main job's: job-busy with the
    pilot (recheck (d), d-A-…every-0.5s.csv; not ``free`` as real-23.06.06 item 7 said), and never counted idle."""
    pbs("pbs_standin", "delay", "exit", "60")
    s, t = make(), Ticks()
    s.submit_pilot("p", 4)
    assert running(s, t, "p") == tuple(VM)
    assert s.idle_nodes() == 4
    main = pbs("qsub", "-q", "workq", "-l", "select=6:ncpus=1", "--", "/bin/true").stdout.strip()
    assert pbs.job(main)["job_state"] == "Q" and pbs.job("0.vm")["substate"] == 60
    assert all((pbs.vnode(n)["state"], pbs.vnode(n)["jobs"]) == ("job-busy", ["0.vm"]) for n in VM), "job-busy with the exiting pilot"
    [ended] = s.poll(t())
    assert (ended.kind, ended.detail) == ("ended", "requeued (preempted)")
    assert s.idle_nodes() == 0, "six are the main job's, the rest the requeued pilot's"
    with pytest.raises(NothingIdle, match="0 idle"):
        s.submit_pilot("q", 4)
    pbs("pbs_standin", "delay", "exit", "0")
    pbs("pbs_standin", "run")
    assert pbs.job(main)["job_state"] == "R"
    assert s.idle_nodes() == 0, "the two free vnodes are for the requeued pilot first"


def test_a_cancel_during_a_requeue_sticks_and_is_never_a_start(make, pbs):
    """Recheck (x): a qdel while PBS requeues the pilot is lost (x-qdel-of-pilot-45.vm-during-rerun-every-0.5s.csv):
    the job shows R 42, then Q, then runs again; pilotfill's own cancels hit it twice and it logged ``pilot.started``
    for a pilot it had just cancelled (a-journal-dump-state.sqlite.txt, e2e-journal-events.txt). Now a cancelled
    pilot is never reported started, and is deleted again once PBS has put it back in the queue."""
    pbs("pbs_standin", "init", "--hosts", "vm:1")
    pbs("pbs_standin", "delay", "exit", "60")
    s, t = make(), Ticks()
    s.submit_pilot("p", 1)
    running(s, t, "p")
    main = pbs("pbs_standin", "preempt", "0.vm").stdout.strip()
    assert [(e.kind, e.detail) for e in s.poll(t())] == [("ended", "requeued (preempted)")]
    s.cancel("p")  # no job needs it any more — while it exits
    assert (pbs.job("0.vm")["job_state"], pbs.job("0.vm")["substate"]) == ("R", 42), "the qdel was lost"
    after = s.poll(t())
    pbs("pbs_standin", "delay", "exit", "0")
    pbs("pbs_standin", "run")
    assert pbs.job("0.vm")["job_state"] == "Q", "back in the queue"
    after += s.poll(t())
    assert [c for c in pbs.calls("qdel") if "0.vm" in c] == [["qdel", "0.vm"]] * 2, "deleted again"
    pbs("pbs_standin", "finish", main)
    after += s.poll(t()) + s.poll(t())
    assert "started" not in [e.kind for e in after], after
    assert [r["run"] for r in pbs.state().get("runs", []) if r["job"] == "0.vm"] == [1], "it never ran again"
    assert "0.vm" not in pbs.jobs() or pbs.jobs()["0.vm"]["job_state"] == "F"


def test_a_main_job_queued_ahead_takes_free_vnodes_first(make, pbs):
    """A main job the scheduler has placed but not started yet (here: waiting for a pilot to exit) takes the free
    vnodes it needs as well as the pilot's: not idle either."""
    pbs("pbs_standin", "delay", "exit", "60")
    s, t = make(), Ticks()
    s.submit_pilot("p", 2)
    running(s, t, "p")
    assert s.idle_nodes() == 6
    main = pbs("qsub", "-q", "workq", "-l", "select=7:ncpus=1", "--", "/bin/true").stdout.strip()
    assert pbs.job(main)["job_state"] == "Q"
    s.poll(t())
    assert s.idle_nodes() == 0, "5 of the 6 free vnodes are the main job's, and the requeued pilot wants 2"
    assert ["qselect", "-q", "workq", "-s", "Q"] in pbs.calls("qselect")


def test_a_main_job_that_cannot_run_yet_leaves_the_holes_to_pilots(make, pbs):
    s = make()
    pbs("qsub", "-q", "workq", "-l", "select=3:ncpus=1", "--", "/bin/true")
    pbs("qsub", "-q", "workq", "-l", "select=64:ncpus=1", "--", "/bin/true")  # waits for a drain that never comes
    assert s.idle_nodes() == 5
    s.submit_pilot("p", 5)
    assert "select=5:ncpus=1" in pbs.calls("qsub")[-1]


# ---------------------------------------------------------------- site discipline, recovery


def test_a_queue_limit_refusal_is_pilot_refused_with_the_command_and_message(make, pbs):
    pbs("pbs_standin", "limit", "scavenger", "max_queued", "1")
    s = make()
    s.submit_pilot("a", 1)
    with pytest.raises(PilotRefused) as info:
        s.submit_pilot("b", 1)
    assert "qsub -q scavenger -N pf-b" in str(info.value)
    assert "qsub: would exceed queue generic's per-user limit" in str(info.value)
    assert isinstance(info.value, RuntimeError)
    assert len(pbs.calls("qsub")) == 2, "not retried"


def test_a_new_adapter_adopts_the_pilots_of_its_predecessor(make, pbs):
    old, t = make(), Ticks()
    old.submit_pilot("run", 2)
    running(old, t, "run")
    pbs("pbs_standin", "auto", "off")
    old.submit_pilot("wait", 4)  # queued
    old.submit_pilot("gone", 1)
    pbs("qdel", "2.vm")
    pbs("qsub", "-q", "scavenger", "-N", "someone-else", "-l", "select=1:ncpus=1", "--", "/bin/true")  # 3.vm
    new = make()
    adopted = new.adopt([("run", "0.vm"), ("wait", "1.vm"), ("gone", "2.vm"), ("other", "3.vm"), ("never", "99.vm")])
    assert sorted(adopted) == ["run", "wait"]
    assert [(e.kind, e.pilot, e.nodes) for e in new.poll(t())] == [("started", "run", ("vm[0]", "vm[1]"))]
    assert new.idle_nodes() == 6 - 4, "the adopted queued pilot's request is counted"
    new.close()
    assert set(pbs.jobs()) == {"3.vm"}, "ours deleted, the other job left alone"


# ---------------------------------------------------------------- failures


def test_unknown_queue_and_bad_walltime_name_the_config_key_the_command_and_pbs_message(make, pbs):
    """Refusals that no retry changes stop the campaign with one line: the config key, the command, PBS's words."""
    s = make(queue="nosuchq")
    with pytest.raises(SchedulerConfigError) as info:
        s.submit_pilot("p", 1)
    assert str(info.value).startswith("pbs.queue: ") and "qsub -q nosuchq" in str(info.value) and "qsub: Unknown queue" in str(info.value)
    assert info.value.reason == "qsub: Unknown queue (exit 170)"
    s = make(min_walltime="02:00:00", max_walltime="00:05:00")  # load_config refuses this; PBS does too
    with pytest.raises(SchedulerConfigError) as info:
        s.submit_pilot("p", 1)
    assert str(info.value).startswith("pbs.min_walltime / pbs.max_walltime: ") and "min_walltime=02:00:00,max_walltime=00:05:00" in str(info.value)
    assert 'qsub: "min_walltime" can not be greater than "max_walltime"' in str(info.value)
    assert len(pbs.calls("qsub")) == 2, "a definite refusal is not retried"


def test_an_unknown_resource_in_extra_args_is_a_config_error_naming_it(make, pbs):
    """Recheck (g), g-bad-resource-qsub-187-with-config.txt: exit 187 "qsub: Unknown resource Resource_List.nosuchres"."""
    s = make(extra_args=("-l", "nosuchres=1"))
    with pytest.raises(SchedulerConfigError) as info:
        s.submit_pilot("p", 1)
    assert str(info.value).startswith("pbs.extra_args: PBS refuses every pilot: `qsub ")
    assert info.value.reason == "qsub: Unknown resource Resource_List.nosuchres (exit 187)"


def test_a_chunk_no_vnode_can_hold_is_a_config_error_at_start(make, pbs):
    """Recheck (g): ``chunk = "ncpus=1:nosuchres=1"`` made pilotfill wait forever without a word (no vnode has it,
    so none counted as idle, and no qsub ran). Now ``check()`` says so at start, naming pbs.chunk."""
    make(chunk="ncpus=1").check()  # fine
    with pytest.raises(SchedulerConfigError) as info:
        make(chunk="ncpus=1:nosuchres=1").check()
    assert str(info.value) == "pbs.chunk 'ncpus=1:nosuchres=1': no vnode of the 8 PBS lists can hold it: nosuchres=1 (no vnode has it)"
    with pytest.raises(SchedulerConfigError, match=r"ncpus=4 \(at most 1 on a vnode\)"):
        make(chunk="ncpus=4").check()
    assert pbs.calls("qsub") == []


def test_a_hanging_command_times_out_fast(make, pbs):
    pbs("pbs_standin", "hang", "qsub", "60")
    s = make(command_timeout_s=3.0, retries=2)
    start = time.monotonic()
    with pytest.raises(SchedulerCommandError, match="`qsub .*` timed out after 3 s"):
        s.submit_pilot("p", 1)
    assert time.monotonic() - start < 30.0
    assert len(pbs.calls("qsub")) == 1, "a qsub that timed out may have queued the job: never sent twice"
    pbs("pbs_standin", "hang", "pbsnodes", "30", "5")
    before = len(pbs.calls("pbsnodes"))
    with pytest.raises(SchedulerCommandError, match="`pbsnodes -av -F json` timed out"):
        make(command_timeout_s=2.0, retries=1).idle_nodes()
    assert len(pbs.calls("pbsnodes")) == before + 2


def test_a_failing_command_is_retried_with_backoff_then_raised(make, pbs):
    pbs("pbs_standin", "fail", "pbsnodes", "1", "1")
    assert make(retries=2, backoff_s=0.01).idle_nodes() == 8  # a passing failure is retried away
    pbs("pbs_standin", "fail", "pbsnodes", "1", "5")
    s = make(retries=2, backoff_s=0.2)
    start = time.monotonic()
    with pytest.raises(SchedulerCommandError, match="exited 1.*cannot connect to server") as info:
        s.idle_nodes()
    assert time.monotonic() - start >= 0.2 + 0.4  # 0.2 s, then 0.4 s
    assert info.value.argv == ["pbsnodes", "-av", "-F", "json"]
    assert len(pbs.calls("pbsnodes")) == 2 + 3


def test_a_failing_qstat_never_ends_a_pilot(make, pbs):
    s, t = make(retries=0), Ticks()
    s.submit_pilot("p", 1)
    running(s, t, "p")
    pbs("pbs_standin", "fail", "qstat", "1", "3")
    for _ in range(3):
        with pytest.raises(SchedulerCommandError):
            s.poll(t())
    assert s.poll(t()) == [] and "p" in s.following()


def test_nodes_of_this_job_inside_a_pilot(make, pbs, monkeypatch):
    make().submit_pilot("p", 3)
    with pytest.raises(RuntimeError, match="PBS_JOBID"):
        pbs_module.PbsNodes().id_of_this_job()
    monkeypatch.setenv("PBS_JOBID", "0.vm")
    assert pbs_module.PbsNodes().id_of_this_job() == "0.vm"
    assert pbs_module.PbsNodes().nodes_of_this_job() == VM[:3]
    monkeypatch.setenv("PBS_JOBID", "99.vm")
    with pytest.raises(SchedulerCommandError, match="Unknown Job Id 99.vm"):
        pbs_module.PbsNodes().nodes_of_this_job(timeout_s=5.0)


def test_polaris_config_loads():
    config = load_config(HERE.parent / "configs" / "polaris.toml")
    assert config.scheduler == "pbs"
    assert (config.pbs.queue, config.pbs.account, config.pbs.chunk, config.pbs.place) == ("preemptable", "MYPROJECT", "ncpus=64:ngpus=4", "scatter")
    assert config.pbs.nodes_per_pilot == config.pilots.nodes_per_pilot
    assert (config.runtime.kind, config.runtime.ranks_per_node, config.runtime.network_interface) == ("torch", 4, "hsn0")
