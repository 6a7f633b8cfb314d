"""A real controller process on a temporary run directory, for end-to-end tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from waiting import event_lines, wait_for

from pilotfill.client import ControllerClient
from pilotfill.journal import Journal

SCRIPTED = """
scheduler = "local"
[local]
nodes = {nodes}
workload = "{workload}"
script = [{script}]
[pilots]
heartbeat_s = 0.5
heartbeat_deadline_s = {deadline}
grace_s = {grace}
[controller]
tick_s = 0.1
t_fwd = 10.0
[runtime]
kind = "{runtime}"
{runtime_options}
"""


def synthetic_job(name: str, total: float, per_rank: float = 40.0, lo: int = 1, hi: int = 4, **kwargs: Any) -> dict[str, Any]:
    """A job whose ranks are real processes reporting samples (pilotfill.workloads.synthetic)."""
    return {
        "name": name,
        "entry": "pilotfill.workloads.synthetic:train",
        "kwargs": {"total_samples": total, "samples_per_s": per_rank, **kwargs},
        "min_nodes": lo,
        "max_nodes": hi,
        "curve": {"nodes": list(range(hi + 1)), "samples_per_s": [per_rank * n for n in range(hi + 1)]},
        "scale_up_cost_s": 1.0,
        "scale_down_cost_s": 1.0,
    }


class LocalRun:
    def __init__(self, root: Path, nodes: int = 4, script: list[tuple[float, str, str]] = (), deadline: float = 3.0, grace: float = 3.0, runtime: str = "processes",
                 config: str | None = None, runtime_options: str = ""):  # fmt: skip
        """``config``: the whole config file as a user would write it (the other options are then unused);
        ``runtime_options``: lines added to its ``[runtime]`` table."""
        self.run_dir = root / "run"
        self.config = root / "config.toml"
        items = ", ".join(f'{{ at = {at}, node = "{node}", state = "{state}" }}' for at, node, state in script)
        self.config.write_text(config if config is not None else
                               SCRIPTED.format(nodes=nodes, workload="script" if script else "none", script=items, deadline=deadline, grace=grace, runtime=runtime,
                                               runtime_options=runtime_options))  # fmt: skip
        self.proc: subprocess.Popen | None = None
        self.logs: list[Path] = []

    def start(self, timeout_s: float = 20.0) -> None:
        log = self.run_dir.parent / f"controller-{len(self.logs)}.out"
        self.logs.append(log)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pilotfill.controller", "--run-dir", str(self.run_dir), "--config", str(self.config)],
            stdout=open(log, "wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            try:
                if json.loads((self.run_dir / "controller.json").read_text())["pid"] == self.proc.pid:
                    self.client = ControllerClient(self.run_dir)
                    return
            except (OSError, ValueError, KeyError):
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"controller exited: {log.read_text()[-2000:]}")
            time.sleep(0.1)
        raise TimeoutError("controller did not start")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        """SIGTERM, as an operator would; a controller that does not go within a minute is killed with its group,
        so a failing test leaves nothing running for the next one."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
            raise

    def state(self) -> Journal:
        return Journal(self.run_dir, readonly=True)

    def events(self, kind: str | None = None) -> list[dict[str, Any]]:
        s = self.state()
        try:
            return s.events(kind)
        finally:
            s.close()

    def wait_for(self, predicate, timeout_s: float = 60.0, what: str = "condition"):
        return wait_for(predicate, timeout_s, what, detail=self.story)

    def story(self) -> str:
        """What a timed-out test prints: the controller's output, its events but reports and heartbeats (with seconds
        since the first), and the tail of every job and pilot log — enough to tell a slow machine from a stuck run."""
        parts = ["controller output:\n" + (self.logs[-1].read_text()[-2000:] if self.logs else "")]
        try:
            parts.append("events:\n" + event_lines(self.run_dir))
        except Exception as e:  # noqa: BLE001 — a story is printed on a failure already; never hide it
            parts.append(f"events unreadable: {e!r}")
        for log in sorted((self.run_dir / "logs").glob("*.log")) if (self.run_dir / "logs").is_dir() else []:
            parts.append(f"{log.name}:\n" + log.read_text(errors="replace")[-1500:])
        left = self.leftover_processes()
        if left:
            parts.insert(0, "processes of this run still there:\n" + "\n".join(describe_process(pid) for pid in left))
        return "\n".join(parts)[-12000:]

    def leftover_processes(self) -> list[int]:
        """Processes other than the live controller that belong to this run (by environment or argv)."""
        marker = str(self.run_dir).encode()
        mine = {os.getpid(), self.proc.pid if self.proc and self.proc.poll() is None else -1}
        found = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or int(pid) in mine:
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read()
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = f.read()
                with open(f"/proc/{pid}/stat", "rb") as f:
                    if f.read().split(b") ", 1)[1][:1] == b"Z":
                        continue
            except OSError:
                continue
            if marker in cmd or b"PILOTFILL_RUN_DIR=" + marker in env:
                found.append(int(pid))
        return found


def describe_process(pid: int) -> str:
    """One line: pid, state, parent, process group and session, and the command line — what tells an orphan (its
    parent init or a subreaper) from a process still in its pilot's group."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return f"{pid}: gone"
    state, ppid, pgrp, session = stat[stat.rindex(")") + 2 :].split()[:4]
    return f"{pid} {state} ppid={ppid} pgrp={pgrp} sid={session}: {cmd[:300]}"


def digits_job(name: str, lo: int = 1, hi: int = 2, **kwargs: Any) -> dict[str, Any]:
    """Real elastic training (Horovod, torch) of a small MLP on scikit-learn's digits."""
    return {
        "name": name,
        "entry": "pilotfill.workloads.digits:train",
        "kwargs": {"epochs": 10, "step_delay_s": 0.05, **kwargs},
        "min_nodes": lo,
        "max_nodes": hi,
        "curve": {"nodes": list(range(hi + 1)), "samples_per_s": [300.0 * n for n in range(hi + 1)]},
        "scale_up_cost_s": 5.0,
        "scale_down_cost_s": 3.0,
    }


def committed_step(run_dir: Path, job_id: str) -> tuple[int, int] | None:
    """(epoch, batch) of the job's last durable commit, or None before the first."""
    import torch

    path = run_dir / "checkpoints" / f"{job_id}.pt"
    try:
        extra = torch.load(path, map_location="cpu", weights_only=False)["extra"]
    except (OSError, EOFError, RuntimeError, KeyError):
        return None
    return int(extra["epoch"]), int(extra["batch"])
