"""The PBS adapter against a STAND-IN of the OpenPBS commands, and its parsers on what a real OpenPBS printed.

OpenPBS is not packaged here, so ``tests/pbs_standin/`` holds small executables
(``qsub``, ``qstat``, ``pbsnodes``, ``pbs_release_nodes``, ``qdel`` and the
test-only ``pbs_standin``) that reproduce the recordings of a real OpenPBS
23.06 in ``shared/data/openpbs`` — layouts, exit codes, messages, requeue on
preemption. Where the stand-in and the recordings differ, the recording is
right: the tests at the top check the stand-in against them, and the parsers
are also run on the recorded files themselves.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pilotfill.config import PbsConfig, PilotConfig, load_config
from pilotfill.schedulers import pbs as pbs_module
from pilotfill.schedulers.base import agent_command
from pilotfill.schedulers.commands import SchedulerCommandError
from pilotfill.schedulers.pbs import (
    PbsScheduler,
    idle_vnodes,
    load_document,
    parse_chunk,
    parse_exec_host,
    parse_exec_vnode,
    parse_job_id,
    parse_jobs,
    parse_pbsnodes,
)

HERE = Path(__file__).resolve().parent
STANDIN = HERE / "pbs_standin"
sys.path.insert(0, str(STANDIN))
import _standin  # noqa: E402  (the stand-in's own serializer, checked against the recordings)

VNODES = ["vm[0]", "vm[1]", "vm[2]", "vm[3]"]
# The recorded submission (README step 1).
RECORDED_QSUB = (
    "-q scavenger -N pilot -r y -l select=3:ncpus=1 -l place=vscatter -l min_walltime=00:05:00,max_walltime=02:00:00"
    " -o /home/pfuser/pilots/pilot.out -j oe /home/pfuser/pilots/pilot.sh"
)


class Standin:
    """The stand-in PBS of one test: run its commands, read its state (what each command received)."""

    def __init__(self, state: Path):
        self.path = state

    def __call__(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
        if check and proc.returncode != 0:
            raise AssertionError(f"{argv} exited {proc.returncode}: {proc.stderr}")
        return proc

    def state(self) -> dict:
        return json.loads(self.path.read_text())

    def calls(self, cmd: str) -> list[list[str]]:
        return [c["argv"] for c in self.state()["calls"] if c["cmd"] == cmd]

    def job(self, jid: str) -> dict:
        return json.loads(self("qstat", "-f", "-F", "json", jid).stdout)["Jobs"][jid]


@pytest.fixture
def pbs(tmp_path, monkeypatch) -> Standin:
    """The stand-in PBS first on PATH (with this interpreter as its ``python3``), its state in tmp_path."""
    monkeypatch.setenv("PATH", os.pathsep.join([str(STANDIN), str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    monkeypatch.setenv("PBS_STANDIN_STATE", str(tmp_path / "pbs-state.json"))
    monkeypatch.delenv("PBS_JOBID", raising=False)
    return Standin(tmp_path / "pbs-state.json")


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def make(tmp_path, pbs):
    """make(**PbsConfig fields) -> a PbsScheduler on a run directory in tmp_path; fast retries; closed at the end."""
    made: list[PbsScheduler] = []

    def _make(retries: int = 1, backoff_s: float = 0.01, clock=None, **fields) -> PbsScheduler:
        config = PbsConfig(**{"poll_s": 0.001, "command_timeout_s": 10.0, "nodes_per_pilot": 16, **fields})
        s = PbsScheduler(config, PilotConfig(), tmp_path / "run", retries=retries, backoff_s=backoff_s, **({"clock": clock} if clock else {}))
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


# ---------------------------------------------------------------- the recordings, parsed directly


def test_parsers_on_recorded_pbsnodes(shared_data):
    for name in ("pbsnodes-av-F-json-pilot-running.json", "pbsnodes-av-F-json-idle.json"):
        vnodes = parse_pbsnodes(load_document((shared_data / "openpbs" / name).read_text()))
        assert list(vnodes) == ["vm", *VNODES]
        assert {v.host for v in vnodes.values()} == {"vm"}
        chunk = parse_chunk("ncpus=1")
        assert not vnodes["vm"].usable(chunk), "the natural vnode (ncpus 0) is not a node"
        assert [n for n, v in vnodes.items() if v.usable(chunk)] == VNODES
        # Both were taken while 0.vm held vm[0..2] ("idle" 3 s after its qdel, before PBS let go of it).
        assert vnodes["vm[0]"].jobs == ("0.vm",) and vnodes["vm[0]"].state == "job-busy"
        assert idle_vnodes(vnodes, chunk) == ["vm[3]"]
        assert idle_vnodes(vnodes, parse_chunk("ncpus=2")) == []


def test_parsers_on_recorded_qstat(shared_data):
    running = parse_jobs(load_document((shared_data / "openpbs" / "qstat-f-F-json-pilot-running.json").read_text()))["0.vm"]
    assert running.state == "R" and running.run_count == 1
    assert running.vnodes == ("vm[0]", "vm[1]", "vm[2]")
    assert running.chunk_hosts == ("vm", "vm", "vm")  # primary execution host: vm
    requeued = parse_jobs(load_document((shared_data / "openpbs" / "qstat-f-F-json-pilot-requeued.json").read_text()))["0.vm"]
    assert requeued.state == "Q" and requeued.run_count == 1 and requeued.vnodes == ()
    assert requeued.comment == "Not Running: Not enough free nodes available" and requeued.exit_status == -11


def test_parsers_on_recorded_cli_errors(shared_data):
    text = (shared_data / "openpbs" / "cli-errors.txt").read_text()
    # qstat of an unknown job: the error, then an empty JSON document — no jobs, not a parse failure.
    unknown = text[text.index("qstat: Unknown Job Id 99.vm") :]
    assert parse_jobs(load_document(unknown)) == {}
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


# ---------------------------------------------------------------- the stand-in against the recordings

VOLATILE = {
    "timestamp", "ctime", "mtime", "qtime", "etime", "stime", "obittime", "queue_rank", "session_id", "jobdir", "Job_Owner",
    "euser", "egroup", "Error_Path", "comment", "last_state_change_time", "last_used_time", "Variable_List", "resources_used",
}  # fmt: skip


def same_shape(ours, recorded, path="") -> None:
    """Same keys in the same order, same value types, same values except where they depend on time, user or place."""
    assert type(ours) is type(recorded), f"{path}: {type(ours).__name__} vs {type(recorded).__name__}"
    if isinstance(recorded, dict):
        assert list(ours) == list(recorded), f"{path}: keys {list(ours)} vs {list(recorded)}"
        for k in recorded:
            if k not in VOLATILE:
                same_shape(ours[k], recorded[k], f"{path}.{k}")
    else:
        assert ours == recorded, f"{path}: {ours!r} vs {recorded!r}"


def test_standin_layout_is_the_recorded_layout(shared_data):
    """The stand-in's JSON writer reproduces each recorded file byte for byte."""
    for f in sorted((shared_data / "openpbs").glob("*.json")):
        text = f.read_text()
        assert _standin.dumps(json.loads(text)) + "\n" == text, f.name


def test_standin_replays_the_recorded_session(shared_data, pbs):
    rec = shared_data / "openpbs"
    assert pbs("qsub", *RECORDED_QSUB.split()).stdout == "0.vm\n"
    same_shape(json.loads(pbs("qstat", "-f", "-F", "json", "0.vm").stdout), json.loads((rec / "qstat-f-F-json-pilot-running.json").read_text()))
    same_shape(json.loads(pbs("pbsnodes", "-av", "-F", "json").stdout), json.loads((rec / "pbsnodes-av-F-json-pilot-running.json").read_text()))
    errors = (rec / "cli-errors.txt").read_text()
    refused = pbs("pbs_release_nodes", "-j", "0.vm", "vm[2]", check=False)
    assert (refused.returncode, refused.stderr.strip()) == (162, "pbs_release_nodes: Can't free 'vm[2]' since it's on a primary execution host")
    assert refused.stderr.strip() in errors
    # A main job arrives: the pilot is requeued (same id, Q, run_count 1) and the main job runs on its vnodes.
    assert pbs("qsub", "-q", "main", "-N", "mainjob", "-l", "select=3:ncpus=1", "--", "/bin/true").stdout == "1.vm\n"
    requeued = json.loads(pbs("qstat", "-f", "-F", "json", "0.vm").stdout)
    same_shape(requeued, json.loads((rec / "qstat-f-F-json-pilot-requeued.json").read_text()))
    assert requeued["Jobs"]["0.vm"]["comment"] == "Not Running: Not enough free nodes available"
    assert pbs.job("1.vm")["exec_vnode"] == "(vm[0]:ncpus=1)+(vm[1]:ncpus=1)+(vm[2]:ncpus=1)"
    # The main job ends: the pilot runs again on the same vnodes.
    pbs("pbs_standin", "finish", "1.vm")
    again = pbs.job("0.vm")
    assert (again["job_state"], again["run_count"], again["exec_vnode"]) == ("R", 2, "(vm[0]:ncpus=1)+(vm[1]:ncpus=1)+(vm[2]:ncpus=1)")
    # cli-errors.txt, command by command: exit code and message.
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
    same_shape(json.loads(pbs("qstat", "-Q", "-f", "-F", "json").stdout), json.loads((rec / "qstat-Q-f-F-json.json").read_text()))


# ---------------------------------------------------------------- the adapter on the stand-in


def test_idle_nodes_counts_free_vnodes_with_cpus(make, pbs):
    clock = Clock()
    s = make(clock=clock, poll_s=5.0)
    assert s.idle_nodes() == 4  # vm[0..3]; the natural vnode "vm" has no cpus
    pbs("qsub", "-q", "main", "-l", "select=3:ncpus=1", "--", "/bin/true")
    assert s.idle_nodes() == 4, "pbsnodes is asked at most every poll_s"
    assert len(pbs.calls("pbsnodes")) == 1
    clock.t += 5.0
    assert s.idle_nodes() == 1
    assert pbs.calls("pbsnodes")[-1] == ["pbsnodes", "-av", "-F", "json"]


def test_submit_runs_the_agent_with_shrink_to_fit_walltime(make, pbs, tmp_path):
    s = make(queue="scavenger", account="MYPROJECT", min_walltime="00:05:00", max_walltime="02:00:00", place="vscatter", extra_args=("-l", "filesystems=home"))
    assert s.submit_pilot("p1", 3) == "0.vm"
    run_dir = (tmp_path / "run").resolve()
    script = run_dir / "pilots" / "p1.sh"
    assert pbs.calls("qsub") == [[
        "qsub", "-q", "scavenger", "-N", "pf-p1", "-r", "y", "-l", "select=3:ncpus=1", "-l", "place=vscatter",
        "-l", "min_walltime=00:05:00,max_walltime=02:00:00", "-A", "MYPROJECT", "-l", "filesystems=home",
        "-o", str(run_dir / "logs" / "pilot-p1.out"), "-j", "oe", str(script),
    ]]  # fmt: skip
    assert stat.S_IMODE(script.stat().st_mode) == 0o700
    agent = agent_command(run_dir, "p1", "pbs", PilotConfig().heartbeat_s, PilotConfig().grace_s, python=sys.executable)
    assert agent in script.read_text().splitlines()
    job = pbs.job("0.vm")
    assert job["Rerunable"] == "True" and job["queue"] == "scavenger" and job["Job_Name"] == "pf-p1"
    assert job["Resource_List"]["select"] == "3:ncpus=1" and job["Resource_List"]["walltime"] == "02:00:00"


def test_submit_uses_the_configured_python(make, pbs, tmp_path):
    s = make(python="/opt/site/python3")
    s.submit_pilot("p1", 1)
    assert (tmp_path / "run" / "pilots" / "p1.sh").read_text().splitlines()[-1].startswith("exec /opt/site/python3 -m pilotfill.pilots.agent")


def test_never_more_nodes_than_exist_or_are_idle(make, pbs):
    s = make(nodes_per_pilot=16)
    s.submit_pilot("big", 9)  # 9 would be accepted by PBS and queued forever (cli-errors.txt)
    assert "select=4:ncpus=1" in pbs.calls("qsub")[-1]
    assert pbs.job("0.vm")["job_state"] == "R"
    s.cancel("big")
    pbs("qsub", "-q", "main", "-l", "select=3:ncpus=1", "--", "/bin/true")  # 1.vm: the main workload takes 3
    s.submit_pilot("small", 4)
    assert "select=1:ncpus=1" in pbs.calls("qsub")[-1]
    with pytest.raises(SchedulerCommandError, match="0 idle of 4 usable"):
        s.submit_pilot("none", 2)
    assert len(pbs.calls("qsub")) == 3  # nothing submitted when nothing is idle


def test_scatter_counts_hosts_not_vnodes(make, pbs):
    """place=scatter puts each chunk on its own host: on the recorded one-host machine that is one chunk, not four."""
    s = make(place="scatter")
    assert s.idle_nodes() == 1
    s.submit_pilot("p", 3)
    assert "select=1:ncpus=1" in pbs.calls("qsub")[-1]
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
    assert s.idle_nodes() == 1
    pbs("pbs_standin", "run")
    assert s.idle_nodes() == 1  # now job-busy


def test_started_then_ended_events(make, pbs):
    s, t = make(), Ticks()
    s.submit_pilot("p", 3)
    [started] = s.poll(t())
    assert (started.kind, started.pilot, started.scheduler_id, started.nodes) == ("started", "p", "0.vm", tuple(VNODES[:3]))
    assert s.poll(t()) == []  # once per run
    pbs("pbs_standin", "finish", "0.vm")
    [ended] = s.poll(t())
    assert (ended.kind, ended.pilot, ended.nodes) == ("ended", "p", tuple(VNODES[:3]))
    assert s.poll(t()) == []
    assert len(pbs.calls("qstat")) == 3  # nothing left to ask about


def test_finished_job_under_job_history_is_ended(make, pbs):
    pbs("pbs_standin", "history", "on")
    s, t = make(), Ticks()
    s.submit_pilot("p", 1)
    assert [e.kind for e in s.poll(t())] == ["started"]
    pbs("pbs_standin", "finish", "0.vm", "3")
    [ended] = s.poll(t())
    assert ended.kind == "ended" and "Exit_status 3" in ended.detail


def test_poll_asks_qstat_at_most_every_poll_s(make, pbs):
    s = make(poll_s=5.0)
    s.submit_pilot("p", 1)
    assert [e.kind for e in s.poll(100.0)] == ["started"]
    assert s.poll(101.0) == [] and s.poll(104.9) == []
    assert len(pbs.calls("qstat")) == 1
    s.poll(105.0)
    assert len(pbs.calls("qstat")) == 2
    assert pbs.calls("qstat")[-1] == ["qstat", "-x", "-f", "-F", "json", "0.vm"]


def test_requeue_is_an_end_then_a_new_start(make, pbs):
    """preempt_order R: same id back to Q with the recorded comment, then R again with run_count 2."""
    s, t = make(), Ticks()
    s.submit_pilot("p", 3)
    assert [e.kind for e in s.poll(t())] == ["started"]
    main = pbs("qsub", "-q", "main", "-N", "mainjob", "-l", "select=3:ncpus=1", "--", "/bin/true").stdout.strip()
    [ended] = s.poll(t())
    assert (ended.kind, ended.nodes, ended.detail) == ("ended", tuple(VNODES[:3]), "requeued (preempted)")
    job = pbs.job("0.vm")
    assert (job["job_state"], job["run_count"], job["comment"]) == ("Q", 1, "Not Running: Not enough free nodes available")
    assert s.poll(t()) == []
    assert s.idle_nodes() == 0, "the free vm[3] is for the requeued pilot (3 vnodes) first"
    pbs("pbs_standin", "finish", main)
    [started] = s.poll(t())
    assert (started.kind, started.scheduler_id, started.nodes, started.detail) == ("started", "0.vm", tuple(VNODES[:3]), "run 2")


def test_requeue_and_rerun_between_two_polls(make, pbs):
    s, t = make(), Ticks()
    s.submit_pilot("p", 2)
    s.poll(t())
    main = pbs("pbs_standin", "preempt", "0.vm").stdout.strip()
    pbs("pbs_standin", "finish", main)
    assert [(e.kind, e.detail) for e in s.poll(t())] == [("ended", "requeued (preempted)"), ("started", "run 2")]


def test_release_on_the_primary_host_is_refused_and_nothing_is_lost(make, pbs, caplog):
    s, t = make(), Ticks()
    s.submit_pilot("p", 3)
    s.poll(t())
    # Every vnode is on host vm, the primary execution host: the adapter does not even ask.
    assert s.release("p", ["vm[2]"]) == []
    assert pbs.calls("pbs_release_nodes") == []
    # If PBS refuses anyway (exit 162, recorded), that is an answer: nothing given back, nothing crashes.
    s._pilots["p"].primary = "elsewhere"  # as if our view of the hosts were stale
    with caplog.at_level(logging.WARNING, "pilotfill.schedulers.pbs"):
        assert s.release("p", ["vm[2]"]) == []
    assert pbs.calls("pbs_release_nodes") == [["pbs_release_nodes", "-j", "0.vm", "vm[2]"]]
    assert "Can't free 'vm[2]' since it's on a primary execution host" in caplog.text
    assert pbs.job("0.vm")["exec_vnode"] == "(vm[0]:ncpus=1)+(vm[1]:ncpus=1)+(vm[2]:ncpus=1)"
    assert s.poll(t()) == []


def test_release_of_every_vnode_deletes_the_pilot(make, pbs):
    s, t = make(), Ticks()
    s.submit_pilot("p", 3)
    s.poll(t())
    assert s.release("p", ["vm[2]", "vm[0]", "vm[1]"]) == ["vm[2]", "vm[0]", "vm[1]"]
    assert pbs.calls("qdel") == [["qdel", "0.vm"]] and pbs.calls("pbs_release_nodes") == []
    assert [e.kind for e in s.poll(t())] == ["ended"]
    assert s.idle_nodes() == 4


def test_release_sister_hosts_on_single_vnode_hosts(make, pbs):
    """Polaris style: each host one vnode, place=scatter. Every host but the first can be given back."""
    pbs("pbs_standin", "init", "--hosts", "x1:0,x2:0,x3:0,x4:0", "--ncpus", "64", "--ngpus", "4")
    s, t = make(chunk="ncpus=64:ngpus=4", place="scatter"), Ticks()
    assert s.idle_nodes() == 4
    s.submit_pilot("p", 3)
    [started] = s.poll(t())
    assert started.nodes == ("x1", "x2", "x3")
    assert pbs.job("0.vm")["exec_host"] == "x1/0*64+x2/0*64+x3/0*64"
    assert s.release("p", ["x1", "x3"]) == ["x3"]  # x1 is the primary execution host
    assert pbs.calls("pbs_release_nodes") == [["pbs_release_nodes", "-j", "0.vm", "x3"]]
    assert pbs.job("0.vm")["exec_vnode"] == "(x1:ncpus=64:ngpus=4)+(x2:ncpus=64:ngpus=4)"
    assert s.idle_nodes() == 2
    assert s.release("p", ["x1", "x2"]) == ["x1", "x2"]  # what is left is everything: qdel
    assert pbs.calls("qdel") == [["qdel", "0.vm"]]
    [ended] = s.poll(t())
    assert ended.kind == "ended" and ended.nodes == ("x1", "x2")


def test_release_before_the_start_was_polled(make, pbs):
    """The agent can register before the adapter's next poll: release asks qstat rather than guess."""
    pbs("pbs_standin", "init", "--hosts", "a:1,b:1")
    s, t = make(place="scatter"), Ticks()
    s.submit_pilot("p", 2)
    assert s.release("p", ["b[0]"]) == ["b[0]"]
    assert [(e.kind, e.nodes) for e in s.poll(t())] == [("started", ("a[0]", "b[0]"))]


def test_unknown_job_is_ended_and_cancel_of_it_is_fine(make, pbs):
    s, t = make(), Ticks()
    s.submit_pilot("p", 1)
    s.poll(t())
    pbs("qdel", "0.vm")  # someone else deleted it
    [ended] = s.poll(t())
    assert (ended.kind, ended.detail) == ("ended", "gone")
    s.submit_pilot("q", 1)
    pbs("qdel", "1.vm")
    s.cancel("q")  # qdel exits 153: already gone is fine
    assert pbs.calls("qdel")[-1] == ["qdel", "1.vm"]
    assert [(e.kind, e.pilot, e.detail) for e in s.poll(t())] == [("ended", "q", "gone before it ran")]


def test_unknown_queue_and_bad_walltime_name_the_command_and_pbs_message(make, pbs):
    s = make(queue="nosuchq")
    with pytest.raises(SchedulerCommandError) as info:
        s.submit_pilot("p", 1)
    assert info.value.returncode == 170 and "qsub -q nosuchq" in str(info.value) and "qsub: Unknown queue" in str(info.value)
    s = make(min_walltime="02:00:00", max_walltime="00:05:00")  # load_config refuses this; PBS does too
    with pytest.raises(SchedulerCommandError) as info:
        s.submit_pilot("p", 1)
    assert info.value.returncode == 59 and "min_walltime=02:00:00,max_walltime=00:05:00" in str(info.value)
    assert 'qsub: "min_walltime" can not be greater than "max_walltime"' in str(info.value)
    assert len(pbs.calls("qsub")) == 2, "a definite refusal is not retried"


def test_a_hanging_command_times_out_fast(make, pbs):
    pbs("pbs_standin", "hang", "qsub", "30")
    s = make(command_timeout_s=0.5, retries=2)
    start = time.monotonic()
    with pytest.raises(SchedulerCommandError, match="timed out after 0.5 s"):
        s.submit_pilot("p", 1)
    assert time.monotonic() - start < 3.0
    assert len(pbs.calls("qsub")) == 1, "a qsub that timed out may have queued the job: never sent twice"
    pbs("pbs_standin", "hang", "pbsnodes", "30", "5")
    before = len(pbs.calls("pbsnodes"))
    with pytest.raises(SchedulerCommandError, match="`pbsnodes -av -F json` timed out"):
        make(command_timeout_s=0.3, retries=1).idle_nodes()
    assert len(pbs.calls("pbsnodes")) == before + 2


def test_a_failing_command_is_retried_with_backoff_then_raised(make, pbs):
    pbs("pbs_standin", "fail", "pbsnodes", "1", "1")
    assert make(retries=2, backoff_s=0.01).idle_nodes() == 4  # a passing failure is retried away
    pbs("pbs_standin", "fail", "pbsnodes", "1", "5")
    s = make(retries=2, backoff_s=0.2)
    start = time.monotonic()
    with pytest.raises(SchedulerCommandError, match="exited 1.*cannot connect to server") as info:
        s.idle_nodes()
    assert time.monotonic() - start >= 0.2 + 0.4  # 0.2 s, then 0.4 s
    assert info.value.argv == ["pbsnodes", "-av", "-F", "json"]
    assert len(pbs.calls("pbsnodes")) == 2 + 3


def test_nodes_of_this_job_inside_a_pilot(make, pbs, monkeypatch):
    make().submit_pilot("p", 3)
    with pytest.raises(RuntimeError, match="PBS_JOBID"):
        pbs_module.id_of_this_job()
    monkeypatch.setenv("PBS_JOBID", "0.vm")
    assert pbs_module.id_of_this_job() == "0.vm"
    assert pbs_module.nodes_of_this_job() == VNODES[:3]
    monkeypatch.setenv("PBS_JOBID", "99.vm")
    with pytest.raises(SchedulerCommandError, match="Unknown Job Id 99.vm"):
        pbs_module.nodes_of_this_job(timeout_s=5.0)


def test_close_deletes_every_pilot(make, pbs):
    s = make()
    s.submit_pilot("a", 1)
    s.submit_pilot("b", 1)
    s.close()
    assert pbs.calls("qdel") == [["qdel", "0.vm", "1.vm"]]
    assert json.loads(pbs("qstat", "-f", "-F", "json").stdout).get("Jobs") is None


def test_polaris_config_loads():
    config = load_config(HERE.parent / "configs" / "polaris.toml")
    assert config.scheduler == "pbs"
    assert (config.pbs.queue, config.pbs.account, config.pbs.chunk, config.pbs.place) == ("preemptable", "MYPROJECT", "ncpus=64:ngpus=4", "scatter")
    assert config.pbs.nodes_per_pilot == config.pilots.nodes_per_pilot
    assert (config.runtime.kind, config.runtime.network_interface) == ("horovod", "hsn0")


def test_walltime_left_from_the_recorded_qstat(shared_data):
    """The recorded pilot: walltime 02:00:00 granted (shrink-to-fit), 00:00:10 used."""
    import json

    from pilotfill.schedulers.pbs import parse_jobs

    doc = json.loads((shared_data / "openpbs" / "qstat-f-F-json-pilot-running.json").read_text())
    assert parse_jobs(doc)["0.vm"].walltime_left_s == 2 * 3600 - 10
