"""Every way an app can end ends it once, with what it did — under every runtime.

Issue "Nothing an app or a value does relaunches a job for ever": an app that called ``sys.exit(3)``, raised
``KeyboardInterrupt`` or segfaulted (``ctypes.string_at(0)``) gave 57–69 ``job.started``/``rank.lost`` pairs in 100 s
under the processes runtime, the job back to ``pending`` each time and the campaign never ending. A rank's end that
is not a lost node is the app's own: said once (``sys.exit``, ``KeyboardInterrupt``: at once, with the frames that
did it), or after a few relaunches with nothing committed in between (a signal: the process cannot say).
Real ``pilotfill run`` campaigns on the embedded local cluster.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_campaign import pilotfill_run

from pilotfill.journal import Journal

pytestmark = pytest.mark.local

CONFIG = """scheduler = "local"
[local]
nodes = 2
workload = "none"
[pilots]
heartbeat_s = 0.5
heartbeat_deadline_s = 5.0
grace_s = 3.0
[controller]
tick_s = 0.1
[runtime]
kind = "{runtime}"
"""

CAMPAIGN = """
import json
import pilotfill

def helper():
    {ending}

@pilotfill.elastic_app(min_nodes=1, max_nodes=1)
def train():
    import pilotfill
    pilotfill.report(samples=1)
    helper()
    return "returned"

f = train()
exc = f.exception()
print(json.dumps({{"type": type(exc).__name__ if exc else None, "error": str(exc)}}))
"""

ENDINGS = {
    "sys.exit": ("import sys; sys.exit(3)", "the app called sys.exit(3)"),
    "KeyboardInterrupt": ("raise KeyboardInterrupt", "the app raised KeyboardInterrupt"),
    "segfault": ("import ctypes; ctypes.string_at(0)", "killed by SIGSEGV (segmentation fault)"),
    "os._exit": ("import os; os._exit(7)", "exited 7"),
    "os._exit(0)": ("import os; os._exit(0)", "exited 0 without returning a value"),
}


def _run(tmp_path: Path, runtime: str, ending: str):
    (tmp_path / "c.toml").write_text(CONFIG.format(runtime=runtime))
    campaign = tmp_path / "campaign.py"
    campaign.write_text(CAMPAIGN.format(ending=ENDINGS[ending][0]))
    result = pilotfill_run(campaign, "--config", str(tmp_path / "c.toml"), "--run-dir", str(tmp_path / "run"), timeout=600)
    state = Journal(tmp_path / "run", readonly=True)
    try:
        starts = len(state.events("job.started"))
    finally:
        state.close()
    return result, starts


RUNTIME_FIXTURES = {"processes": None, "torch": "torch_runtime", "horovod": "horovod"}


@pytest.mark.parametrize("ending", list(ENDINGS))
@pytest.mark.parametrize("runtime", list(RUNTIME_FIXTURES))
def test_an_app_that_ends_itself_fails_once_saying_how(tmp_path, runtime, ending, request):
    if RUNTIME_FIXTURES[runtime]:
        request.getfixturevalue(RUNTIME_FIXTURES[runtime])
    result, starts = _run(tmp_path, runtime, ending)
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert ENDINGS[ending][1] in found["error"], found
    in_process = ending in ("sys.exit", "KeyboardInterrupt")
    assert found["type"] == ("AppExited" if in_process else found["type"])
    # In-process ends are said at once; a process killed by a signal is relaunched at most JOB_RETRIES times.
    assert starts == 1 if in_process else 1 <= starts <= 3, starts
    assert ENDINGS[ending][1] in result.stderr, result.stderr[-3000:]  # on the terminal too


BIG = """
import json
import pilotfill

@pilotfill.elastic_app(min_nodes=1, max_nodes=1)
def big():
    return b"\\x01" * (300 << 20)

value = big().result()
print(json.dumps({"bytes": len(value), "ones": value.count(b"\\x01")}))
"""


def test_a_result_of_300_mb_arrives(tmp_path):
    """A result over the message cap (256 MB) hung for ever: the rank took the cut-off for a lost controller and the
    job ran again. It arrives now, through the run directory, once."""
    (tmp_path / "c.toml").write_text(CONFIG.format(runtime="processes"))
    campaign = tmp_path / "campaign.py"
    campaign.write_text(BIG)
    result = pilotfill_run(campaign, "--config", str(tmp_path / "c.toml"), "--run-dir", str(tmp_path / "run"), timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"bytes": 300 << 20, "ones": 300 << 20}
    state = Journal(tmp_path / "run", readonly=True)
    try:
        assert len(state.events("job.started")) == 1
    finally:
        state.close()


def test_a_result_that_cannot_be_written_fails_the_app_saying_why(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "results").write_text("not a folder")  # where large results go cannot hold one
    (tmp_path / "c.toml").write_text(CONFIG.format(runtime="processes"))
    campaign = tmp_path / "campaign.py"
    campaign.write_text(BIG.split("value = big()")[0] + "print(json.dumps({'error': str(big().exception())}))\n")
    result = pilotfill_run(campaign, "--config", str(tmp_path / "c.toml"), "--run-dir", str(run), timeout=600)
    error = json.loads(result.stdout.strip().splitlines()[-1])["error"]
    assert "cannot deliver" in error and str(run / "results") in error, error


HELPER_RAISES = """
import pilotfill

def helper(x):
    return x / 0          # the line the terminal must show

@pilotfill.elastic_app(min_nodes=1, max_nodes=1)
def train():
    return helper(1)

train().result()
"""


@pytest.mark.parametrize("runtime", list(RUNTIME_FIXTURES))
def test_the_terminal_shows_the_apps_own_raising_lines(tmp_path, runtime, request):
    """The README promises "your frames only": the helper's line that raised, not just the campaign's call site."""
    if RUNTIME_FIXTURES[runtime]:
        request.getfixturevalue(RUNTIME_FIXTURES[runtime])
    (tmp_path / "c.toml").write_text(CONFIG.format(runtime=runtime))
    campaign = tmp_path / "campaign.py"
    campaign.write_text(HELPER_RAISES)
    result = pilotfill_run(campaign, "--config", str(tmp_path / "c.toml"), "--run-dir", str(tmp_path / "run"), timeout=600)
    assert result.returncode == 1
    assert "return x / 0" in result.stderr and "in helper" in result.stderr, result.stderr[-3000:]
    assert "ZeroDivisionError" in result.stderr


BYTES_AND_NOISE = """
import json
import pilotfill

@pilotfill.elastic_app(min_nodes=1, max_nodes=1)
def train(blob, noise_mb):
    import sys
    line = "x" * 1023 + "\\n"
    for _ in range(noise_mb * 1024):
        sys.stdout.write(line)
    sys.stdout.flush()
    return len(blob)

print(json.dumps(train(b"\\x00\\x01" * 10, {noise_mb}).result()))
"""


def test_an_app_taking_bytes_runs(tmp_path):
    """A ``bytes`` argument was refused ("unknown type for memoization"): Parsl's memoizer has no rule for it."""
    (tmp_path / "c.toml").write_text(CONFIG.format(runtime="processes"))
    campaign = tmp_path / "campaign.py"
    campaign.write_text(BYTES_AND_NOISE.format(noise_mb=0))
    result = pilotfill_run(campaign, "--config", str(tmp_path / "c.toml"), "--run-dir", str(tmp_path / "run"), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == 20


def test_a_rank_that_prints_hundreds_of_megabytes_fills_no_disk(tmp_path):
    """A rank's output log was not capped (1 GB of output was 1.1 GB under runs/): it keeps the latest part, rotated."""
    from pilotfill.procs import LOG_LIMIT_BYTES

    (tmp_path / "c.toml").write_text(CONFIG.format(runtime="processes"))
    campaign = tmp_path / "campaign.py"
    campaign.write_text(BYTES_AND_NOISE.format(noise_mb=200))
    result = pilotfill_run(campaign, "--config", str(tmp_path / "c.toml"), "--run-dir", str(tmp_path / "run"), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    logs = sorted((tmp_path / "run" / "logs").glob("j1.*.log*"))
    assert logs and sum(p.stat().st_size for p in logs) <= 2 * LOG_LIMIT_BYTES + (1 << 16), [(p.name, p.stat().st_size) for p in logs]
    assert any(p.name.endswith(".log.1") for p in logs)  # rotated: the latest output kept
