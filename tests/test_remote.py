"""Remote submission through Globus Compute, with a local endpoint that uses the SDK's serializer both ways."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from globus_compute_sdk.errors import TaskExecutionFailed
from local_endpoint import LocalEndpointExecutor, api_error
from test_campaign import FAST

from pilotfill import remote

pytestmark = pytest.mark.local

ENDPOINT = "2f1e4a5c-6b7d-4e8f-9a0b-1c2d3e4f5a6b"

CAMPAIGN = """
import pilotfill

@pilotfill.elastic_app(min_nodes=1, max_nodes=2)
def score(width):
    import time
    from pilotfill import report
    for _ in range(5):
        time.sleep(0.1)
        report(samples=width)
    return {"width": width, "val_accuracy": 0.5 + width / 1000}

board = sorted((f.result() for f in [score(w) for w in (32, 64, 128)]), key=lambda r: -r["val_accuracy"])
for i, r in enumerate(board, 1):
    print(f"{i}  width {r['width']:>4}  val accuracy {r['val_accuracy']:.3f}")
"""


@pytest.fixture
def campaign(tmp_path):
    (tmp_path / "nas.py").write_text(CAMPAIGN)
    (tmp_path / "fast.toml").write_text(FAST)
    return tmp_path / "nas.py", tmp_path / "fast.toml"


def test_submit_status_results_through_the_sdk_serializer(tmp_path, campaign):
    script, config = campaign
    executor = LocalEndpointExecutor(ENDPOINT)
    base = str(tmp_path / "login-node")
    began = time.time()
    run = remote.submit(ENDPOINT, script, config, executor=executor, base_dir=base)
    assert time.time() - began < 30  # returns at once, the run goes on detached
    assert run.run_id and executor.submitted == ["start_run"]
    deadline = time.time() + 180
    info = run.status()
    while time.time() < deadline and info["phase"] == "running":
        time.sleep(1)
        info = run.status()
    assert info["phase"] == "finished", info
    assert sorted(j["status"] for j in info["jobs"]) == ["finished"] * 3
    assert sorted(j["result"]["width"] for j in info["jobs"]) == [32, 64, 128]
    assert info["pilots"] and all(p["state"] in ("ended", "lost") for p in info["pilots"])
    res = run.results()
    assert sorted(r["value"]["width"] for r in res["results"]) == [32, 64, 128]
    assert "1  width  128  val accuracy 0.628" in res["output"]
    # The same through the module functions, as the CLI uses them.
    assert remote.status(ENDPOINT, run.run_id, executor=executor, base_dir=base)["phase"] == "finished"


@pytest.mark.parametrize(
    "executor, message",
    [
        (LocalEndpointExecutor(ENDPOINT, status=api_error(404, "Endpoint not found")), "unknown endpoint"),
        (LocalEndpointExecutor(ENDPOINT, status="offline"), "is offline"),
    ],
)
def test_unknown_and_offline_endpoints(campaign, tmp_path, executor, message):
    with pytest.raises(remote.RemoteError, match=message):
        remote.submit(ENDPOINT, campaign[0], executor=executor, base_dir=str(tmp_path / "b"))
    assert executor.submitted == []  # nothing was sent


def test_run_not_found_and_campaign_missing(tmp_path, campaign):
    executor = LocalEndpointExecutor(ENDPOINT)
    with pytest.raises(remote.RemoteError, match="run 20990101-000000-abcdef not found"):
        remote.status(ENDPOINT, "20990101-000000-abcdef", executor=executor, base_dir=str(tmp_path / "b"))
    with pytest.raises(remote.RemoteError, match="no such campaign file"):
        remote.submit(ENDPOINT, tmp_path / "absent.py", executor=executor)
    assert executor.submitted == ["run_status"]


def test_a_task_failing_on_the_endpoint_is_reported(tmp_path, campaign):
    class Failing(LocalEndpointExecutor):
        def submit(self, fn, *args, **kwargs):
            from concurrent.futures import Future

            f: Future = Future()
            f.set_exception(TaskExecutionFailed("Traceback …\nModuleNotFoundError: No module named 'pilotfill'"))
            return f

    with pytest.raises(remote.RemoteError, match="No module named 'pilotfill'"):
        remote.submit(ENDPOINT, campaign[0], executor=Failing(ENDPOINT))


def test_cli_without_credentials_or_terminal_says_how_to_log_in(tmp_path, campaign):
    env = {**os.environ, "HOME": str(tmp_path / "empty-home")}
    env.pop("GLOBUS_COMPUTE_CLIENT_ID", None)
    env.pop("GLOBUS_COMPUTE_CLIENT_SECRET", None)
    for argv in (["submit", "--endpoint", ENDPOINT, str(campaign[0])], ["status", "--endpoint", ENDPOINT, "some-run"], ["results", "--endpoint", ENDPOINT, "x"]):
        began = time.time()
        out = subprocess.run([sys.executable, "-m", "pilotfill", *argv], env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
        assert out.returncode == 1
        assert "not logged in to Globus" in out.stderr and "Client()" in out.stderr
        assert "Traceback" not in out.stderr + out.stdout
        assert "Please authenticate" not in out.stdout + out.stderr  # no prompt
        assert time.time() - began < 30


def test_cli_missing_campaign_is_a_clear_error(tmp_path):
    out = subprocess.run([sys.executable, "-m", "pilotfill", "submit", "--endpoint", ENDPOINT, str(tmp_path / "nope.py")],
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60, env={**os.environ, "HOME": str(tmp_path)})  # fmt: skip
    assert out.returncode == 1 and "no such campaign file" in out.stderr and "Traceback" not in out.stderr
