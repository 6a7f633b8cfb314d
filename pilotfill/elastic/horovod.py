"""Elastic Horovod (Gloo) behind the runtime interface: one ``horovodrun`` per job.

Each job runs ``horovodrun --min-np MIN --max-np MAX --host-discovery-script
SCRIPT``; the script prints the job's current hosts, which the controller
writes (atomically) to ``discovery/<job>.hosts`` whenever it starts or
resizes the job. Growing and shrinking is changing that file: Horovod polls
it every second, adds ranks on new hosts and notifies the others, which pick
up the committed state (``hvd.elastic.TorchState``) and carry on. A host that
was removed and still has a rank after the shrink deadline has it killed.

On the local virtual cluster the hosts are distinct names (``pf-node-0`` …),
``ssh`` on horovodrun's PATH is :mod:`pilotfill.elastic.local_ssh`, Gloo uses
``lo``. On a cluster the hosts are the pilots' nodes and ssh is the real one.

The discovery file is the truth about which hosts a job has: a rank that died
costs its node through the controller, and a pilot that leaves ends its ranks
at once (Horovod counts that as a failure and blacklists the host). So
Horovod's own blacklist is kept as short as it allows (1-2 s): long enough to
outlast those kills, short enough that a node preempted and handed back does
not wait out a cooldown that doubles with every preemption.
"""

from __future__ import annotations

import glob
import os
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import procs
from .base import OnSpawn, RankExit, Runtime
from .launch import NodeLauncher

if TYPE_CHECKING:
    from ..config import Config

SHRINK_DEADLINE_S = 3.0
"""A removed host's ranks get this long to leave through Horovod before that host's pilot agent ends them."""
JOB_RETRIES = 3
"""horovodrun dying without a reported failure is retried (from the last durable commit) this often."""


class HorovodRuntime(Runtime):
    @classmethod
    def from_config(cls, config: Config, run_dir: Path, launcher: NodeLauncher, on_spawn: OnSpawn) -> HorovodRuntime:
        rt = config.runtime

        def record(p: subprocess.Popen, job: str, host: str) -> None:
            # the horovodrun driver runs here, with the controller
            on_spawn(p, "driver", job, host)

        return cls(
            run_dir,
            launcher=launcher,
            local=config.scheduler == "local" or rt.local_hosts,
            network_interface=rt.network_interface,
            on_spawn=record,
            ranks_per_node=rt.ranks_per_node,
            gpus_per_node=rt.gpus_per_node,
            collective_timeout_s=rt.collective_timeout_s,
        )

    def __init__(
        self,
        run_dir: Path,
        launcher: NodeLauncher | None = None,
        local: bool = True,
        network_interface: str | None = "lo",
        on_spawn: Callable[[subprocess.Popen, str, str], None] | None = None,
        cooldown_s: tuple[int, int] = (1, 2),
        ranks_per_node: int = 1,
        gpus_per_node: int = 0,
        collective_timeout_s: float = 120.0,
    ):
        self.run_dir = Path(run_dir)
        self.collective_timeout_s = collective_timeout_s
        self.launcher = launcher
        self.ranks_per_node, self.gpus_per_node = ranks_per_node, gpus_per_node
        self.local = local
        self.network_interface = network_interface
        self.cooldown_s = cooldown_s
        self._on_spawn = on_spawn or (lambda p, job, host: None)
        self.discovery = self.run_dir / "discovery"
        self.discovery.mkdir(mode=0o700, exist_ok=True)
        (self.run_dir / "logs").mkdir(exist_ok=True)
        self._drivers: dict[str, subprocess.Popen] = {}
        self._slots: dict[str, int] = {}
        self._hosts: dict[str, list[str]] = {}
        self._stopping: dict[str, subprocess.Popen] = {}
        self._removed: list[tuple[str, str, float]] = []  # job, host, kill-after
        self._exits: dict[str, Path] = {}
        self._exits_read: dict[str, int] = {}
        self._bin = self.run_dir / "bin"
        if local:
            self._bin.mkdir(mode=0o700, exist_ok=True)
            ssh = self._bin / "ssh"
            ssh.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m pilotfill.elastic.local_ssh "$@"\n')
            ssh.chmod(0o700)

    # ------------------------------------------------------------ Runtime

    def start(self, job_id: str, spec: dict[str, Any], hosts: list[str]) -> None:
        if job_id in self._drivers:
            self.stop(job_id)
        self._slots[job_id] = slots = int(spec.get("ranks_per_node") or self.ranks_per_node)
        self._write_hosts(job_id, hosts)
        script = self.discovery / f"{job_id}.sh"
        # paths may hold spaces
        script.write_text(f"#!/bin/sh\nexec cat {shlex.quote(str(self.discovery / f'{job_id}.hosts'))}\n")
        script.chmod(0o700)
        for old in self.discovery.glob(f"{glob.escape(job_id)}.*.exits"):
            old.unlink(missing_ok=True)
        # Each start has its own exits file: the ranks of a start just stopped end after this one lists the same hosts,
        # and their ends are that start's, not this one's crashes.
        self._exits[job_id] = self.discovery / f"{job_id}.{uuid.uuid4().hex[:12]}.exits"
        self._exits_read[job_id] = 0
        horovodrun = shutil.which(
            "horovodrun", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
        )
        if horovodrun is None:
            raise RuntimeError("horovodrun not found: install Horovod (scripts/build_horovod.sh)")
        argv = [
            horovodrun,
            "-np",
            str(len(hosts) * slots),
            "--min-np",
            str(spec["min_nodes"] * slots),
            "--max-np",
            str(spec["max_nodes"] * slots),
            # Horovod runs it in a shell
            "--host-discovery-script",
            shlex.quote(str(script)),
            "--gloo",
            "--elastic-timeout",
            "600",
            "--blacklist-cooldown-range",
            str(self.cooldown_s[0]),
            str(self.cooldown_s[1]),
            # Gloo's rendezvous and collectives wait this long (Horovod's default, 30 s, is shorter than a rank's start
            # on a busy node).
            "--gloo-timeout-seconds",
            str(max(1, round(self.collective_timeout_s))),
        ]
        if self.network_interface:
            argv += ["--network-interfaces", self.network_interface]
        argv += [sys.executable, "-m", "pilotfill.elastic.rank"]
        env = {
            **os.environ,
            "PILOTFILL_RUN_DIR": str(self.run_dir),
            "PILOTFILL_JOB_ID": job_id,
            "PILOTFILL_RUNTIME": "horovod",
            "PILOTFILL_EXITS_FILE": str(self._exits[job_id]),
            "PILOTFILL_GPUS_PER_NODE": str(int(spec.get("gpus_per_node", self.gpus_per_node) or 0)),
            "PYTHONUNBUFFERED": "1",
        }
        if self.local:
            env["PATH"] = f"{self._bin}{os.pathsep}{env.get('PATH', '')}"
        log = self.run_dir / "logs" / f"{job_id}.horovodrun.log"
        proc = procs.spawn(argv, env=env, log_path=str(log), cwd=str(self.run_dir))
        self._drivers[job_id] = proc
        self._on_spawn(proc, job_id, ",".join(hosts))

    def resize(self, job_id: str, hosts: list[str], lost: Sequence[str] = ()) -> None:
        before = self._hosts.get(job_id, [])
        self._write_hosts(job_id, hosts)
        deadline = time.monotonic() + SHRINK_DEADLINE_S
        self._removed += [(job_id, h, deadline) for h in before if h not in hosts]

    def resize_keeps_progress(self, grow_only: bool, job_id: str | None = None) -> bool:
        return grow_only  # Horovod grows at a commit; a shrink ends ranks and the survivors restore the last commit

    def shrinks_while_forming(self, job_id: str | None = None) -> bool:
        # Ranks in hvd.init wait in Gloo's rendezvous for every peer's address: one ended there leaves the others
        # waiting out the Gloo timeout, then failing. Restarting on the nodes kept costs nothing a Horovod shrink would
        # keep (it resumes from the last commit too).
        return False

    def stop(self, job_id: str) -> None:
        proc = self._drivers.pop(job_id, None)
        hosts = self._hosts.get(job_id, [])
        self._write_hosts(job_id, [])
        if proc is not None:
            procs.kill_group(proc.pid)
            self._stopping[job_id] = proc
        for host in hosts:  # what Horovod started on them over ssh ends there, by their agents' hands
            self._end_on(host, job_id)

    def hosts(self, job_id: str) -> list[str]:
        return list(self._hosts.get(job_id, [])) if job_id in self._drivers else []

    def silent_s(self, job_id: str, now: float) -> float | None:
        """Seconds since the job's ``horovodrun`` (its driver and every rank's output) last printed."""
        if job_id not in self._drivers:
            return None
        try:
            return max(0.0, now - (self.run_dir / "logs" / f"{job_id}.horovodrun.log").stat().st_mtime)
        except OSError:
            return None

    def poll(self) -> list[RankExit]:
        out: list[RankExit] = []
        for job_id, proc in list(self._drivers.items()):
            out += self._new_exits(job_id)
            if proc.poll() is not None:
                del self._drivers[job_id]
                out.append(RankExit(job_id, "", proc.returncode, requested=False, output=self._tail(job_id)))
        for job_id, proc in list(self._stopping.items()):
            if proc.poll() is not None:
                del self._stopping[job_id]
        now = time.monotonic()
        keep = []
        for job_id, host, deadline in self._removed:
            if host in self._hosts.get(job_id, []):
                continue  # given back to the job meanwhile
            if now >= deadline:
                self._end_on(host, job_id)  # Horovod has had its chance to remove it
            else:
                keep.append((job_id, host, deadline))
        self._removed = keep
        return out

    def close(self) -> None:
        for job_id in list(self._drivers):
            self.stop(job_id)
        for proc in self._stopping.values():
            proc.wait()
        self._stopping.clear()

    # ------------------------------------------------------------ helpers

    def _write_hosts(self, job_id: str, hosts: list[str]) -> None:
        self._hosts[job_id] = list(hosts)
        path = self.discovery / f"{job_id}.hosts"
        tmp = path.with_suffix(".tmp")
        slots = self._slots.get(job_id, self.ranks_per_node)
        tmp.write_text("".join(f"{h}:{slots}\n" for h in hosts))
        os.replace(tmp, path)

    def _tail(self, job_id: str, chars: int = 3000) -> str:
        """The last of what the job's ``horovodrun`` printed (its ranks' output and its own)."""
        try:
            return (self.run_dir / "logs" / f"{job_id}.horovodrun.log").read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def _new_exits(self, job_id: str) -> list[RankExit]:
        path = self._exits.get(job_id)
        try:
            lines = path.read_text().splitlines() if path is not None else []
        except OSError:
            return []
        seen = self._exits_read.get(job_id, 0)
        self._exits_read[job_id] = len(lines)
        out = []
        for line in lines[seen:]:
            host, _, code = line.partition(" ")
            if host in self._hosts.get(job_id, []):
                out.append(RankExit(job_id, host, int(code), requested=False))
        return out

    def _end_on(self, host: str, job_id: str) -> None:
        """End the job's processes on ``host`` through its pilot agent (which finds them by their environment)."""
        if self.launcher is not None:
            self.launcher.terminate(host, job_id)
