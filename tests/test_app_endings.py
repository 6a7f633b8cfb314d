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

from pilotfill.state import State

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
}


def _run(tmp_path: Path, runtime: str, ending: str):
    (tmp_path / "c.toml").write_text(CONFIG.format(runtime=runtime))
    campaign = tmp_path / "campaign.py"
    campaign.write_text(CAMPAIGN.format(ending=ENDINGS[ending][0]))
    result = pilotfill_run(campaign, "--config", str(tmp_path / "c.toml"), "--run-dir", str(tmp_path / "run"), timeout=600)
    state = State(tmp_path / "run", readonly=True)
    try:
        starts = len(state.events("job.started"))
    finally:
        state.close()
    return result, starts


@pytest.mark.parametrize("ending", list(ENDINGS))
@pytest.mark.parametrize("runtime", ["processes", "torch"])
def test_an_app_that_ends_itself_fails_once_saying_how(tmp_path, runtime, ending, request):
    if runtime == "torch":
        request.getfixturevalue("torch_runtime")
    result, starts = _run(tmp_path, runtime, ending)
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert ENDINGS[ending][1] in found["error"], found
    in_process = ending in ("sys.exit", "KeyboardInterrupt")
    assert found["type"] == ("AppExited" if in_process else found["type"])
    # In-process ends are said at once; a process killed by a signal is relaunched at most JOB_RETRIES times.
    assert starts == 1 if in_process else 1 <= starts <= 3, starts
    assert ENDINGS[ending][1] in result.stderr, result.stderr[-3000:]  # on the terminal too
