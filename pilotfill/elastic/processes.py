"""The simple runtime: every rank a plain process running the job's function on its host.

It has no collective communication — each rank works and reports on its own —
which is enough to prove the controller, pilots and durable state with real
processes. A job's share of each node (``ranks_per_node`` ranks, one per GPU
on GPU nodes) is started and ended through that node's pilot agent
(:class:`~pilotfill.elastic.launch.NodeLauncher`); the controller never starts
anything on a compute node itself.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .base import OnSpawn, RankExit, Runtime
from .launch import NodeLauncher

if TYPE_CHECKING:
    from ..config import Config


class ProcessRuntime(Runtime):
    @classmethod
    def from_config(cls, config: Config, run_dir: Path, launcher: NodeLauncher, on_spawn: OnSpawn) -> ProcessRuntime:
        return cls(
            run_dir, launcher, ranks_per_node=config.runtime.ranks_per_node, gpus_per_node=config.runtime.gpus_per_node
        )

    def __init__(
        self,
        run_dir: Path,
        launcher: NodeLauncher,
        ranks_per_node: int = 1,
        gpus_per_node: int = 0,
        python: str = sys.executable,
    ):
        self.run_dir = Path(run_dir)
        self.launcher = launcher
        self.ranks_per_node, self.gpus_per_node, self.python = ranks_per_node, gpus_per_node, python
        self._hosts: dict[str, list[str]] = {}
        self._specs: dict[str, dict[str, Any]] = {}
        (self.run_dir / "logs").mkdir(exist_ok=True)

    def start(self, job_id: str, spec: dict[str, Any], hosts: list[str]) -> None:
        if job_id in self._hosts:
            self.stop(job_id)
        self._specs[job_id] = spec
        self._hosts[job_id] = []
        self.resize(job_id, hosts)

    def resize(self, job_id: str, hosts: list[str], lost: Sequence[str] = ()) -> None:
        if job_id not in self._hosts:
            return
        before = self._hosts[job_id]
        self._hosts[job_id] = list(hosts)
        for host in dict.fromkeys([*before, *lost]):
            if host not in hosts:
                self.launcher.terminate(host, job_id)
        for host in hosts:
            if host not in before:
                self.launcher.launch(host, job_id, self._argv(job_id), self._env(job_id, hosts.index(host), len(hosts)))

    def resize_keeps_progress(self, grow_only: bool, job_id: str | None = None) -> bool:
        return True  # ranks are independent processes: the survivors go on, new ones start from the commit

    def adopt(self, job_id: str, spec: dict[str, Any], hosts: list[str]) -> bool:
        """A predecessor's job: its ranks are independent processes that talk only to the controller, so knowing its
        hosts is all it takes (each was told its node rank and size at launch; new ones get theirs)."""
        self._specs[job_id] = spec
        self._hosts[job_id] = list(hosts)
        return True

    def stop(self, job_id: str) -> None:
        for host in self._hosts.pop(job_id, []):
            self.launcher.terminate(host, job_id)
        self._specs.pop(job_id, None)

    def hosts(self, job_id: str) -> list[str]:
        return list(self._hosts.get(job_id, []))

    def poll(self) -> list[RankExit]:
        out = []
        for ended in self.launcher.exits():
            held = ended.host in self._hosts.get(ended.job_id, [])
            if held and not ended.requested:
                # died on its own: the controller takes the host off the job
                self._hosts[ended.job_id].remove(ended.host)
            out.append(RankExit(ended.job_id, ended.host, ended.returncode, requested=ended.requested or not held))
        return out

    def close(self) -> None:
        for job_id in list(self._hosts):
            self.stop(job_id)

    def _ranks(self, job_id: str) -> int:
        return int(self._specs.get(job_id, {}).get("ranks_per_node") or self.ranks_per_node)

    def _argv(self, job_id: str) -> list[str]:
        return [self.python, "-m", "pilotfill.elastic.rank", "--nproc", str(self._ranks(job_id))]

    def _env(self, job_id: str, node_index: int, nodes: int) -> dict[str, str]:
        per = self._ranks(job_id)
        gpus = self._specs.get(job_id, {}).get("gpus_per_node", self.gpus_per_node)
        return {
            "PILOTFILL_RUN_DIR": str(self.run_dir),
            "PILOTFILL_JOB_ID": job_id,
            "PILOTFILL_RUNTIME": "processes",
            "PILOTFILL_NODE_RANK": str(node_index),
            "PILOTFILL_SIZE": str(nodes * per),
            "PILOTFILL_GPUS_PER_NODE": str(int(gpus or 0)),
            "PYTHONUNBUFFERED": "1",
        }
