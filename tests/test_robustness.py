"""Nothing a user, a bad value or a full disk does kills or hangs a campaign (the adversarial findings, one by one).

Each test reproduces a failure that was seen and checks the behaviour now: the
value is refused where it enters with a message naming it, the controller
survives, a bad campaign, config or path is one line and exit code 2, and
nothing is lost.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq
from conftest import IN_CI
from localrun import synthetic_job
from test_campaign import FAST
from waiting import wait_for

from pilotfill.config import ConfigError, load_config
from pilotfill.journal import Journal
from pilotfill.transport import RequestRefused

pytestmark = pytest.mark.local

TRAINING = """
import pilotfill

@pilotfill.elastic_app(min_nodes=1, max_nodes=1, total_samples={total})
def train(i):
    from pilotfill.workloads.synthetic import train as loop
    return loop(total_samples={total}, samples_per_s=100.0, step_s=0.2)

print(sorted(int(r["samples"]) for r in [f.result() for f in [train(i) for i in range({apps})]]))
"""


def run(campaign: Path, *args: str, env: dict | None = None, timeout: float = 600, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pilotfill", "run", str(campaign), *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, cwd=cwd or campaign.parent)  # fmt: skip


def one_line_error(result: subprocess.CompletedProcess, code: int = 2) -> str:
    assert result.returncode == code, (result.returncode, result.stdout[-2000:], result.stderr[-3000:])
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    return " ".join(result.stderr.split())


@pytest.fixture
def fast(tmp_path) -> Path:
    path = tmp_path / "fast.toml"
    path.write_text(FAST)
    return path


# ---------------------------------------------------------------- 1. NaN and infinity


@pytest.mark.parametrize("kwargs, name", [({"weight": math.nan}, "weight"), ({"weight": math.inf}, "weight"), ({"scale_up_cost_s": math.inf}, "scale_up_cost_s"),
                                           ({"total_samples": math.nan}, "total_samples"), ({"restart_cost_s": -1.0}, "restart_cost_s")])  # fmt: skip
def test_nan_and_infinite_values_are_refused_at_the_decorator(kwargs, name):
    import pilotfill
    from pilotfill.executors.decorator import ElasticAppError

    with pytest.raises(ElasticAppError, match=name):
        pilotfill.elastic_app(max_nodes=2, **kwargs)


def test_nan_in_a_submitted_spec_is_refused_and_the_controller_lives(local):
    r = local()
    r.start()
    for field in ("weight", "scale_up_cost_s", "scale_down_cost_s", "total_samples"):
        with pytest.raises(RequestRefused, match=field):
            r.client.submit({**synthetic_job("bad", total=100), field: float("nan")})
        with pytest.raises(RequestRefused, match=field):
            r.client.submit({**synthetic_job("bad", total=100), field: float("inf")})
    job = r.client.submit(synthetic_job("good", total=200, hi=1))
    assert r.client.wait([job], timeout_s=120)[job]["status"] == "finished"


@pytest.mark.parametrize("key", ["tick_s", "t_fwd", "solver_time_limit_s"])
def test_nan_and_infinity_in_a_config_are_refused(tmp_path, key):
    for value in ("nan", "inf"):
        path = tmp_path / "c.toml"
        path.write_text(f"[controller]\n{key} = {value}\n")
        with pytest.raises(ConfigError, match=f"controller.{key}: must be a finite number"):
            load_config(path)
    path.write_text("[pilots]\nheartbeat_s = inf\n")
    with pytest.raises(ConfigError, match="pilots.heartbeat_s"):
        load_config(path)


# ---------------------------------------------------------------- 4. configs that validated but broke


@pytest.mark.parametrize("text, where", [
    ('[local]\nnode_prefix = "a/b"', "local.node_prefix"),
    ("local = 5", "local: must be a table"),
    ('local = "ab"', "local: must be a table"),
    ("local = [1, 2]", "local: must be a table"),
    ("scheduler = 5", "scheduler: 5 is not one of"),
])  # fmt: skip
def test_config_values_that_used_to_break_are_refused(tmp_path, text, where):
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=where.replace("[", "\\[")):
        load_config(path)


def test_a_config_that_is_not_utf8_or_is_a_directory_is_one_line(tmp_path, fast):
    campaign = tmp_path / "c.py"
    campaign.write_text("print('never')\n")
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe\x00scheduler")
    assert "not UTF-8" in one_line_error(run(campaign, "--config", str(binary)))
    assert "not a file" in one_line_error(run(campaign, "--config", str(tmp_path)))


def test_an_address_that_cannot_be_bound_is_one_line(tmp_path):
    config = tmp_path / "bind.toml"
    config.write_text(FAST.replace("[controller]\n", '[controller]\nbind = "203.0.113.7"\n'))  # TEST-NET-3: not an address of this machine
    campaign = tmp_path / "c.py"
    campaign.write_text("print('never')\n")
    message = one_line_error(run(campaign, "--config", str(config)))
    assert "cannot listen on '203.0.113.7'" in message and "controller.bind" in message


# ---------------------------------------------------------------- 3. the controller dies: pilotfill run restarts it


def test_a_killed_controller_is_restarted_and_the_campaign_finishes_without_retraining(tmp_path, fast):
    campaign = tmp_path / "train.py"
    campaign.write_text(TRAINING.format(total=400, apps=2))
    proc = subprocess.Popen([sys.executable, "-m", "pilotfill", "run", str(campaign), "--config", str(fast)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    run_dir = _wait_for_run_dir(tmp_path)
    wait_for(lambda: _progress(run_dir) >= 150, 120, "training under way")
    pid = _controller_pid(run_dir)
    os.kill(pid, signal.SIGKILL)
    state = Journal(run_dir, readonly=True)
    running = sorted(j.id for j in state.jobs() if j.status == "running")
    state.close()
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    assert "[400, 400]" in out
    state = Journal(run_dir, readonly=True)
    try:
        events = state.events()
        jobs = state.jobs()
    finally:
        state.close()
    assert sum(e["kind"] == "controller.started" for e in events) == 2  # restarted once, on the same run directory
    second = next(e["seq"] for e in events if e["kind"] == "controller.started" and e["data"]["incarnation"] == 2)
    # The trainings it ran go on under the new controller (issue 54): adopted on their nodes, never started again.
    recovered = next(e["data"] for e in events if e["kind"] == "controller.recovered")
    assert running and sorted(recovered["adopted_jobs"]) == running and recovered["requeued"] == [], recovered
    assert not [e for e in events if e["seq"] > second and e["kind"] in ("job.started", "job.stopped") and e["job"] in running]
    assert len(jobs) == 2 and all(j.status == "finished" for j in jobs)


def test_a_controller_that_keeps_dying_ends_the_campaign_with_a_clear_error(tmp_path, fast):
    campaign = tmp_path / "train.py"
    campaign.write_text(TRAINING.format(total=100_000, apps=1))
    proc = subprocess.Popen([sys.executable, "-m", "pilotfill", "run", str(campaign), "--config", str(fast)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    run_dir = _wait_for_run_dir(tmp_path)
    killed: set[int] = set()
    deadline = time.time() + 300
    while proc.poll() is None and time.time() < deadline:
        pid = _controller_pid(run_dir, wait=False)
        if pid and pid not in killed and _alive(pid):
            time.sleep(1.0)
            os.kill(pid, signal.SIGKILL)
            killed.add(pid)
        time.sleep(0.2)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err[-3000:]
    assert "the campaign could not go on: the controller died 4 times" in " ".join(err.split())
    assert len(killed) == 4
    assert "Traceback" not in err


# ---------------------------------------------------------------- 5. a full disk, a read-only state


@pytest.fixture
def tiny_fs(tmp_path):
    """An 8 MB filesystem of our own (tmpfs). Needs root; CI runs as root."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m,mode=0700", "tmpfs", str(mnt)], capture_output=True, text=True)
    if done.returncode != 0:
        if IN_CI:
            pytest.fail(f"CI needs to mount a small tmpfs (root): {done.stderr}")
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_a_full_disk_stops_the_campaign_cleanly_and_a_rerun_after_freeing_space_finishes(tiny_fs, fast):
    campaign = tiny_fs / "train.py"
    campaign.write_text(TRAINING.format(total=600, apps=2))
    proc = subprocess.Popen([sys.executable, "-m", "pilotfill", "run", str(campaign), "--config", str(fast)], cwd=tiny_fs,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    run_dir = _wait_for_run_dir(tiny_fs)
    wait_for(lambda: _progress(run_dir) >= 100, 120, "training under way")
    filler = tiny_fs / "filler"
    with open(filler, "wb") as f:  # fill the disk to the last byte
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    out, err = proc.communicate(timeout=300)
    message = " ".join(err.split())
    assert proc.returncode != 0
    assert "the run's state cannot be written" in message and ("full" in message or "disk" in message), message
    assert err.count("Traceback") <= 1, err[-3000:]  # no flood of logging tracebacks
    db = sqlite3.connect(run_dir / "state.sqlite")
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    db.close()
    filler.unlink()
    again = run(campaign, "--config", str(fast), "--run-dir", str(run_dir), cwd=tiny_fs)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "[600, 600]" in again.stdout


@pytest.mark.parametrize("left_kb", [0, 64])
def test_a_disk_full_at_the_start_is_one_line(tiny_fs, fast, left_kb):
    """Issue 54, item 6: with nothing left it was a 40-line traceback (lock_runs); with 64 KB left, "the controller
    exited (1); see controller.out" — an empty file, since nothing could be written there either."""
    campaign = tiny_fs / "train.py"
    campaign.write_text(TRAINING.format(total=40, apps=1))
    filler = tiny_fs / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass
    if left_kb:
        os.truncate(filler, filler.stat().st_size - left_kb * 1024)
    message = one_line_error(run(campaign, "--config", str(fast), cwd=tiny_fs))
    assert "cannot use it" in message and ("No space left on device" in message or "its disk is full" in message), message
    assert "controller.out" not in message, message
    filler.unlink()
    again = run(campaign, "--config", str(fast), cwd=tiny_fs)
    assert again.returncode == 0 and "[40]" in again.stdout, again.stderr[-3000:]


def test_a_read_only_state_is_one_line_not_a_hang(tiny_fs, fast):
    """A run directory the controller cannot write (here: a read-only bind mount of a real one)."""
    campaign = tiny_fs / "train.py"
    campaign.write_text(TRAINING.format(total=40, apps=1))
    first = run(campaign, "--config", str(fast), cwd=tiny_fs)
    assert first.returncode == 0, first.stderr[-3000:]
    run_dir = next((tiny_fs / "runs").glob("2*"))
    frozen = tiny_fs.parent / "frozen"
    frozen.mkdir()
    subprocess.run(["mount", "--bind", str(run_dir), str(frozen)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(frozen)], check=True)
        message = one_line_error(run(campaign, "--config", str(fast), "--run-dir", str(frozen), cwd=tiny_fs))
        assert "cannot use it" in message and "read-only" in message.lower(), message
    finally:
        subprocess.run(["umount", "-l", str(frozen)], capture_output=True)


# ---------------------------------------------------------------- 6, 7. checkpoints: damaged, planted, private


def test_a_truncated_parsl_checkpoint_is_salvaged(tmp_path, fast):
    campaign = tmp_path / "quick.py"
    campaign.write_text(TRAINING.format(total=40, apps=3))
    first = run(campaign, "--config", str(fast))
    assert first.returncode == 0, first.stderr[-3000:]
    (tasks,) = (tmp_path / "runs" / "parsl").glob("*/checkpoint/tasks.pkl")
    data = tasks.read_bytes()
    entries = []
    with open(tasks, "rb") as f:
        while True:
            try:
                entries.append(pickle.load(f))
            except EOFError:
                break
    assert len(entries) >= 3
    tasks.write_bytes(data[: len(data) - 5])  # the last entry cut short, as a kill mid-write leaves it
    second = run(campaign, "--config", str(fast))
    assert second.returncode == 0, second.stderr[-3000:]
    assert "[40, 40, 40]" in second.stdout


def test_a_checkpoint_planted_by_another_user_is_refused_never_unpickled(tmp_path, fast):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)  # a sticky, world-writable directory, as /tmp or a shared project folder
    campaign = shared / "c.py"
    campaign.write_text(TRAINING.format(total=40, apps=1))
    marker = tmp_path / "pwned"
    planted = shared / "runs" / "parsl" / "000" / "checkpoint"
    planted.mkdir(parents=True)

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    (planted / "tasks.pkl").write_bytes(pickle.dumps({"hash": "x", "exception": None, "result": Evil()}))
    for p in (shared / "runs", shared / "runs" / "parsl", planted.parent, planted, planted / "tasks.pkl"):
        os.chown(p, 65534, 65534)  # nobody
    message = one_line_error(run(campaign, "--config", str(fast)))
    assert "belongs to uid 65534" in message and "refusing to load" in message
    assert not marker.exists()


def test_what_a_campaign_writes_is_private(tmp_path, fast):
    campaign = tmp_path / "c.py"
    campaign.write_text(TRAINING.format(total=40, apps=1))
    result = run(campaign, "--config", str(fast))
    assert result.returncode == 0, result.stderr[-3000:]
    runs = tmp_path / "runs"
    for path in [runs / "parsl", *runs.glob("parsl/*"), *runs.glob("parsl/*/checkpoint/tasks.pkl"), *runs.glob("parsl/*/parsl.log"), *runs.glob("checkpoints/*")]:
        mode = path.stat().st_mode & 0o777
        assert mode & 0o077 == 0, f"{path} is {mode:o}"


# ---------------------------------------------------------------- 8, 9. messages: other incarnations, size, floods, max_nodes


def test_a_signed_submission_replayed_to_the_next_controller_is_dropped(local):
    r = local()
    r.start()
    from pilotfill.security import seal, session_key
    from pilotfill.transport import dealer

    info = json.loads((r.run_dir / "controller.json").read_text())
    secret = (r.run_dir / "secret.key").read_bytes().strip()
    key = session_key(secret, info["incarnation"])
    message = seal(key, json.dumps({"type": "job.submit", "spec": synthetic_job("once", total=10)}).encode())
    r.kill()
    r.start()  # a new incarnation, at once
    sock = dealer(secret, json.loads((r.run_dir / "controller.json").read_text())["endpoint"])
    sock.send_multipart(message)
    assert not sock.poll(3000), "the replayed submission was answered"
    sock.close(0)
    assert r.client.snapshot()["jobs"] == []


def test_oversized_messages_and_floods_do_not_take_the_controller_down(local):
    r = local()
    r.start()
    endpoint = json.loads((r.run_dir / "controller.json").read_text())["endpoint"]
    ctx = zmq.Context.instance()
    noisy = ctx.socket(zmq.DEALER)
    noisy.setsockopt(zmq.LINGER, 0)
    noisy.connect(endpoint)
    for _ in range(3000):  # never connected (its handshake is refused): what it queues stays on its side
        try:
            noisy.send_multipart([b"x"], zmq.NOBLOCK)
        except zmq.Again:
            break
    job = r.client.submit(synthetic_job("after the flood", total=100, hi=1))
    assert r.client.wait([job], timeout_s=120)[job]["status"] == "finished"
    noisy.close(0)
    warnings = r.logs[-1].read_text().count("failed authentication")
    assert 1 <= warnings <= 20, warnings  # rate limited: not one line per dropped message


def test_a_server_disconnects_a_sender_of_oversized_messages(tmp_path):
    from pilotfill.security import create_secret, seal
    from pilotfill.transport import Server, dealer

    run_dir = tmp_path / "run"
    key = create_secret(run_dir)
    server = Server(run_dir, key, max_message_bytes=64 * 1024)
    sock = dealer(key, server.endpoint)
    sock.send_multipart(seal(key, json.dumps({"type": "x", "blob": "a" * 1_000_000}).encode()))
    sock.send_multipart(seal(key, json.dumps({"type": "x"}).encode()))
    handled: list = []
    deadline = time.time() + 5
    while time.time() < deadline:
        server.serve(lambda m: handled.append(m) or {"ok": True}, 100)
    assert all("blob" not in m for m in handled)  # the big one was dropped by ZeroMQ before it was buffered in full
    handled.clear()
    other = dealer(key, server.endpoint)
    other.send_multipart(seal(key, json.dumps({"type": "x", "n": 1}).encode()))
    deadline = time.time() + 10
    while time.time() < deadline and not handled:
        server.serve(lambda m: handled.append(m) or {"ok": True}, 100)
    assert [m.get("n") for m in handled] == [1]
    sock.close(0)
    other.close(0)
    server.close()


def test_max_nodes_is_bounded_and_an_impossible_job_is_refused(local):
    r = local()
    r.start()
    job = r.client.submit({**synthetic_job("huge", total=100), "max_nodes": 10**8})
    assert r.client.job(job)["spec"]["max_nodes"] == 4  # the machine's size
    with pytest.raises(RequestRefused, match="min_nodes 5 is more than this machine could ever give"):
        r.client.submit({**synthetic_job("never", total=100), "min_nodes": 5, "max_nodes": 8})
    r.client.cancel(job)


# ---------------------------------------------------------------- 11. re-running resumes, never twice


def test_a_rerun_resumes_unfinished_trainings_from_their_commits_and_never_runs_one_twice(tmp_path, fast):
    campaign = tmp_path / "train.py"
    campaign.write_text(TRAINING.format(total=1000, apps=2).replace("print(sorted(int(r[\"samples\"])", "print(sorted(int(r[\"resumed_from\"] > 0)"))
    first = subprocess.Popen([sys.executable, "-m", "pilotfill", "run", str(campaign), "--config", str(fast)], cwd=tmp_path,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    run_dir = _wait_for_run_dir(tmp_path)
    wait_for(lambda: _progress(run_dir) >= 400, 120, "both trainings under way")
    os.killpg(first.pid, signal.SIGKILL)  # the whole campaign dies at once
    first.wait()
    time.sleep(1.0)
    second = run(campaign, "--config", str(fast), "--run-dir", str(run_dir))
    assert second.returncode == 0, second.stderr[-3000:]
    assert "[1, 1]" in second.stdout  # both resumed from their commits
    state = Journal(run_dir, readonly=True)
    try:
        jobs = state.jobs()
        claimed = state.events("job.claimed")
    finally:
        state.close()
    assert len(jobs) == 2 and all(j.status == "finished" for j in jobs)  # the same two jobs, not four
    assert len(claimed) == 2
    # A third run in a fresh run directory trains nothing: both are Parsl's finished apps.
    third = run(campaign, "--config", str(fast))
    assert third.returncode == 0 and "reused results" in third.stderr


# ---------------------------------------------------------------- 12. tracebacks that became one line


def test_a_campaign_with_a_syntax_error_is_one_line(tmp_path, fast):
    campaign = tmp_path / "broken.py"
    campaign.write_text("import pilotfill\n\ndef oops(:\n    pass\n")
    assert f"{campaign}:3:" in one_line_error(run(campaign, "--config", str(fast)))


def test_elastic_app_argument_errors_name_the_campaign_line(tmp_path, fast):
    campaign = tmp_path / "bad.py"
    campaign.write_text("import pilotfill\n\n@pilotfill.elastic_app(min_nodes=4, max_nodes=2)\ndef train():\n    pass\n")
    message = one_line_error(run(campaign, "--config", str(fast)))
    assert f"{campaign}:3:" in message and "max_nodes must be an integer >= min_nodes" in message


def test_run_dir_that_is_a_file_or_impossible_is_one_line(tmp_path, fast):
    campaign = tmp_path / "c.py"
    campaign.write_text("print('never')\n")
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert "is a file" in one_line_error(run(campaign, "--config", str(fast), "--run-dir", str(a_file)))
    assert "cannot use it" in one_line_error(run(campaign, "--config", str(fast), "--run-dir", "/proc/self/nope/run"))


def test_an_exception_in_the_campaign_shows_its_own_frames_only(tmp_path, fast):
    campaign = tmp_path / "raises.py"
    campaign.write_text("def helper():\n    raise KeyError('no such trial')\n\nhelper()\n")
    result = run(campaign, "--config", str(fast))
    assert result.returncode == 1
    assert "KeyError: 'no such trial'" in result.stderr and f'File "{campaign}", line 2' in result.stderr
    assert "pilotfill/campaign.py" not in result.stderr and "runpy" not in result.stderr


def test_replay_of_a_directory_and_a_huge_bad_row_are_short_errors(tmp_path, write):
    from conftest import JOB_HEADER

    out = subprocess.run([sys.executable, "-m", "pilotfill", "replay", str(tmp_path), str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "not a file" in out.stderr and "Traceback" not in out.stderr
    jobs = write("j.csv", JOB_HEADER + "\na,m,2021-02-10T00:00:00Z,1,1,10,1,1,0;1,0;1\n")
    for bad, said in (("x" * 100_000, "unknown state"), ("x," * 5_000_000, "expected 3 fields"), ("x" * 10_000_000, "field larger than field limit")):
        trace = write("t.csv", "time,node,state\n2021-02-10T00:00:00Z,n0,idle\n2021-02-10T00:00:01Z,n0," + bad + "\n")
        out = subprocess.run([sys.executable, "-m", "pilotfill", "replay", str(trace), str(jobs)], capture_output=True, text=True, timeout=120)
        assert out.returncode == 2 and said in out.stderr and "t.csv:3" in out.stderr and "Traceback" not in out.stderr
        assert len(out.stderr) < 2000, len(out.stderr)


@pytest.mark.parametrize("damage", ["empty", "garbage", "endpoint"])
def test_top_on_a_damaged_run_directory_is_one_line(tmp_path, damage):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    if damage == "empty":
        (run_dir / "state.sqlite").write_bytes(b"")
    elif damage == "garbage":
        (run_dir / "state.sqlite").write_bytes(b"this is not a database" * 100)
    else:
        Journal(run_dir).close()
        (run_dir / "controller.json").write_text("{}")
    out = subprocess.run([sys.executable, "-m", "pilotfill", "top", str(run_dir)], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    if damage == "endpoint":  # nothing wrong with the state itself: it is shown (no terminal here, so it draws once and ends)
        assert "Traceback" not in out.stderr
        return
    assert out.returncode == 2 and "cannot read the run's state" in out.stderr and "Traceback" not in out.stderr


# ---------------------------------------------------------------- degraded: our own stall, a job no pilot can hold


def test_a_controller_paused_past_the_heartbeat_deadline_loses_no_healthy_pilot(local):
    r = local(deadline=3.0)
    r.start()
    job = r.client.submit(synthetic_job("steady", total=100_000, hi=4))
    r.wait_for(lambda: len(r.client.job(job)["nodes"]) == 4, 60, "job on four nodes")
    os.kill(r.proc.pid, signal.SIGSTOP)
    time.sleep(8.0)
    os.kill(r.proc.pid, signal.SIGCONT)
    time.sleep(3.0)
    assert r.events("pilot.lost") == []
    assert len(r.client.job(job)["nodes"]) == 4
    r.client.cancel(job)


# ---------------------------------------------------------------- helpers


def _wait_for_run_dir(root: Path) -> Path:
    return wait_for(lambda: next((p for p in (root / "runs").glob("2*") if (p / "controller.json").exists()), None), 120, "a run directory")


def _controller_pid(run_dir: Path, wait: bool = True) -> int | None:
    def pid():
        try:
            return json.loads((run_dir / "controller.json").read_text())["pid"]
        except (OSError, ValueError, KeyError):
            return None

    return wait_for(pid, 60, "the controller") if wait else pid()


def _alive(pid: int) -> bool:
    from pilotfill import procs

    return procs.alive(pid)


def _progress(run_dir: Path) -> float:
    try:
        state = Journal(run_dir, readonly=True)
    except Exception:
        return 0.0
    try:
        return sum(j.progress for j in state.jobs())
    except sqlite3.Error:
        return 0.0
    finally:
        state.close()


def test_an_agent_with_no_controller_for_long_ends_its_pilot(tmp_path, monkeypatch):
    """A campaign whose controller is gone for good leaves no pilot holding nodes: the agents end them."""
    from pilotfill.pilots import agent as agent_module
    from pilotfill.security import create_secret

    monkeypatch.setattr(agent_module, "ORPHAN_AFTER_S", 1.0)
    run_dir = tmp_path / "run"
    create_secret(run_dir)  # a run directory whose controller never answers
    began = time.monotonic()
    code = agent_module.Agent(str(run_dir), "p-orphan", ["n0"], "1", heartbeat_s=0.1, grace_s=1.0).run()
    assert code == 4 and time.monotonic() - began < 60


def test_requests_read_together_are_committed_together_and_a_wait_woken_within_the_group_is_answered_at_once(tmp_path):
    """One pass of the loop handles the requests it read in one transaction and replies only after it: a heartbeat
    parked (a long poll) by that group, whose news came from a later request of the same group, must not wait out
    its poll — the wake came before the park was registered."""
    import threading
    from contextlib import contextmanager

    from pilotfill.security import create_secret
    from pilotfill.transport import Client, Park, Server

    run_dir = tmp_path / "run"
    key = create_secret(run_dir)
    server = Server(run_dir, key)
    server.publish()
    log: list[str] = []

    @contextmanager
    def together():
        log.append("begin")
        yield
        log.append("commit")

    def handle(message):
        log.append(message["type"])
        if message["type"] == "wait":
            return Park("a", 20.0, lambda: {"woken": True})
        if message["type"] == "news":
            server.wake("a")  # news for the waiting one
        return {"ok": True}

    clients = {kind: Client(run_dir, timeout_s=60) for kind in ("wait", "news")}
    took: dict[str, float] = {}

    def ask(kind: str) -> None:
        clients[kind].request({"type": "hello"}, attempt_s=60)  # connected (its handshake answered) before the test
        ready.wait(30)
        began = time.monotonic()
        clients[kind].request({"type": kind}, attempt_s=60)
        took[kind] = time.monotonic() - began

    ready = threading.Event()
    threads = [threading.Thread(target=ask, args=(kind,)) for kind in ("wait", "news")]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while log.count("hello") < 2 and time.monotonic() < deadline:
        server.serve(handle, 100)
    log.clear()
    ready.set()
    time.sleep(1.0)  # both requests are queued at the server: one group
    handled = server.serve(handle, 1000, together=together)
    deadline = time.monotonic() + 30
    while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
        server.serve(handle, 200, together=together)
    for t in threads:
        t.join(1)
    server.close()
    assert handled == 2 and sorted(log[1:3]) == ["news", "wait"] and log[0] == "begin" and log[3] == "commit", log
    assert took["wait"] < 10, took  # answered with the group, not after its 20 s poll
