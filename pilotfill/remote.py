"""Remote submission through Globus Compute: a laptop starts and watches runs on a login node.

The laptop cannot reach the batch system, but a Globus Compute endpoint on the
login node can. Three small functions run there (pilotfill is installed on
the login node): :func:`start_run` writes the campaign and its config into a
durable run directory and starts ``pilotfill run`` detached, returning a run
id at once; :func:`run_status` and :func:`run_results` read that run's durable
state. Everything travels through ``globus_compute_sdk.Executor`` and so
through the SDK's own serializer; the executor is injectable, so tests use a
local one with the same interface and the same serializer.

    run = pilotfill.remote.submit("ENDPOINT-UUID", "nas_campaign.py")
    run.status(); run.results()
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

DEFAULT_BASE = "~/.pilotfill/remote-runs"
TIMEOUT_S = 120.0
LOGIN_HELP = (
    "not logged in to Globus: in a terminal, run\n"
    "    python -c 'from globus_compute_sdk import Client; Client()'\n"
    "and follow the link once (the tokens are stored for later), or set GLOBUS_COMPUTE_CLIENT_ID and "
    "GLOBUS_COMPUTE_CLIENT_SECRET for a client identity"
)


class RemoteError(RuntimeError):
    """A remote operation that failed for a reason the user can act on (printed without a traceback)."""


# ---------------------------------------------------------------- on the endpoint (login node)


def start_run(
    campaign_name: str, campaign_text: str, config_text: str | None = None, base_dir: str | None = None
) -> dict[str, Any]:
    """Create a run directory with the campaign (and config), start ``pilotfill run`` detached, return its id."""
    base = Path(os.path.expanduser(base_dir or DEFAULT_BASE))
    run_id = f"{datetime.now():%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"
    home = base / run_id
    home.mkdir(parents=True, mode=0o700)
    campaign = home / Path(campaign_name).name
    campaign.write_text(campaign_text)
    argv = [sys.executable, "-m", "pilotfill", "run", str(campaign), "--run-dir", str(home / "run")]
    if config_text is not None:
        (home / "config.toml").write_text(config_text)
        (home / "config.toml").chmod(0o600)
        argv += ["--config", str(home / "config.toml")]
    with open(home / "pilotfill-run.out", "wb") as out:
        # Detached (its own session) so it outlives the endpoint worker that started it; the
        # shell around it records the exit code when the campaign ends.
        proc = subprocess.Popen(
            ["/bin/sh", "-c", '"$@"; echo $? > exit_code', "pilotfill-run", *argv],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=home, start_new_session=True,
        )  # fmt: skip
    (home / "pid").write_text(str(proc.pid))
    return {"run_id": run_id, "run_dir": str(home)}


def _home(run_id: str, base_dir: str | None) -> Path | None:
    if not run_id or "/" in run_id or run_id.startswith("."):
        return None
    home = Path(os.path.expanduser(base_dir or DEFAULT_BASE)) / run_id
    return home if home.is_dir() else None


def _phase(home: Path) -> str:
    code = (home / "exit_code").read_text().strip() if (home / "exit_code").exists() else None
    if code is not None:
        return "finished" if code == "0" else f"failed (exit {code})"
    try:
        os.kill(int((home / "pid").read_text()), 0)
        return "running"
    except (OSError, ValueError):
        return "ended"


def run_status(run_id: str, base_dir: str | None = None) -> dict[str, Any]:
    """The run's phase, jobs and pilots, read from its durable state."""
    from .status import run_dir_status

    home = _home(run_id, base_dir)
    if home is None:
        return {"error": "not_found", "run_id": run_id}
    return {"run_id": run_id, "phase": _phase(home), **run_dir_status(home / "run")}


def run_results(run_id: str, base_dir: str | None = None) -> dict[str, Any]:
    """Finished jobs' results (Parsl-serialized values decoded) and the campaign's output (e.g. the leaderboard)."""
    from .lifecycle import JobStatus
    from .journal import Journal
    from .status import result_of

    home = _home(run_id, base_dir)
    if home is None:
        return {"error": "not_found", "run_id": run_id}
    results = []
    try:
        state = Journal(home / "run", readonly=True)
    except FileNotFoundError:  # no state yet: nothing has finished
        state = None
    if state is not None:
        try:
            for j in state.jobs((JobStatus.FINISHED,)):
                results.append({"job": j.id, "name": j.name, "value": result_of(j, home / "run")})
        finally:
            state.close()
    output = (home / "pilotfill-run.out").read_text(errors="replace") if (home / "pilotfill-run.out").exists() else ""
    return {"run_id": run_id, "phase": _phase(home), "results": results, "output": output}


# ---------------------------------------------------------------- on the laptop


def make_executor(endpoint: str):
    """A ``globus_compute_sdk.Executor`` for ``endpoint``, refusing to prompt for a login without a terminal."""
    from globus_compute_sdk import Executor
    from globus_compute_sdk.sdk.auth.globus_app import get_globus_app

    app = get_globus_app()
    if app.login_required() and not sys.stdin.isatty():
        raise RemoteError(LOGIN_HELP)
    return Executor(endpoint_id=endpoint)


@dataclass
class RemoteRun:
    """A handle on a run started through an endpoint (for notebooks)."""

    endpoint: str
    run_id: str
    executor: Any
    base_dir: str | None = None

    def status(self) -> dict[str, Any]:
        return _call(self.executor, self.endpoint, run_status, self.run_id, self.base_dir)

    def results(self) -> dict[str, Any]:
        return _call(self.executor, self.endpoint, run_results, self.run_id, self.base_dir)


def submit(
    endpoint: str,
    campaign: str | Path,
    config: str | Path | None = None,
    executor: Any = None,
    base_dir: str | None = None,
) -> RemoteRun:
    """Ship ``campaign`` (and ``config``) to the endpoint and start it there; returns at once."""
    campaign = Path(campaign)
    if not campaign.is_file():
        raise RemoteError(f"{campaign}: no such campaign file")
    config_text = None
    if config is not None:
        from .config import ConfigError, load_config

        try:
            path = Path(config)
            load_config(path if path.exists() else str(config))
        except ConfigError as exc:
            raise RemoteError(str(exc)) from None
        config_text = path.read_text() if path.exists() else None
    executor = executor or make_executor(endpoint)
    started = _call(executor, endpoint, start_run, campaign.name, campaign.read_text(), config_text, base_dir)
    return RemoteRun(endpoint, started["run_id"], executor, base_dir)


def status(endpoint: str, run_id: str, executor: Any = None, base_dir: str | None = None) -> dict[str, Any]:
    return RemoteRun(endpoint, run_id, executor or make_executor(endpoint), base_dir).status()


def results(endpoint: str, run_id: str, executor: Any = None, base_dir: str | None = None) -> dict[str, Any]:
    return RemoteRun(endpoint, run_id, executor or make_executor(endpoint), base_dir).results()


def _call(executor: Any, endpoint: str, fn, *args: Any) -> dict[str, Any]:
    """Run ``fn`` on the endpoint and turn the SDK's failures into messages a user can act on."""
    import globus_sdk
    from globus_compute_sdk.errors import TaskExecutionFailed

    _check_online(executor, endpoint)
    try:
        value = executor.submit(fn, *args).result(timeout=TIMEOUT_S)
    except globus_sdk.GlobusAPIError as exc:
        if exc.http_status in (400, 403, 404) and "endpoint" in (exc.message or "").lower():
            raise RemoteError(f"unknown endpoint {endpoint}: {exc.message}") from None
        if exc.http_status == 401:
            raise RemoteError(LOGIN_HELP) from None
        raise RemoteError(f"Globus Compute refused the request ({exc.http_status}): {exc.message}") from None
    except globus_sdk.GlobusError as exc:  # a login flow that could not complete
        raise RemoteError(f"{LOGIN_HELP}\n({exc})") from None
    except TaskExecutionFailed as exc:
        raise RemoteError(
            "the endpoint failed to run pilotfill's "
            f"{fn.__name__}:\n{exc.remote_data if hasattr(exc, 'remote_data') else exc}"
        ) from None
    except TimeoutError:
        raise RemoteError(f"no answer from endpoint {endpoint} within {TIMEOUT_S:.0f} s (is it running?)") from None
    if isinstance(value, dict) and value.get("error") == "not_found":
        raise RemoteError(f"run {value['run_id']} not found on endpoint {endpoint}")
    return value


def _check_online(executor: Any, endpoint: str) -> None:
    """Refuse early when the endpoint is known to be offline (tasks would wait for it forever)."""
    client = getattr(executor, "client", None)
    if client is None or not hasattr(client, "get_endpoint_status"):
        return
    import globus_sdk

    try:
        info = client.get_endpoint_status(endpoint)
    except globus_sdk.GlobusAPIError as exc:
        if exc.http_status in (400, 403, 404):
            raise RemoteError(f"unknown endpoint {endpoint}: {exc.message}") from None
        raise RemoteError(f"Globus Compute refused the request ({exc.http_status}): {exc.message}") from None
    if str(info.get("status", "online")).lower() != "online":
        raise RemoteError(
            f"endpoint {endpoint} is {info.get('status')}: start it on the login node (globus-compute-endpoint start "
            "NAME)"
        )


def as_json(value: dict[str, Any]) -> str:
    return json.dumps(value, indent=2, default=str)
