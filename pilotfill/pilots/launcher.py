"""Processes on compute nodes, through the pilot agent of each node (the controller's side).

A runtime asks to start or end a job's processes on a host; this turns that
into a command for the agent of the pilot holding the host, delivered with
the reply to that agent's waiting heartbeat (a long poll: it is woken at
once), and turns the exits agents report back into what the runtime polls.
The controller never starts anything on a compute node, nor looks for what
runs there: the agent does both, on its node.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..elastic.launch import NodeLauncher, ProcessExit

if TYPE_CHECKING:
    from ..controller.world import World


class NoPilot(RuntimeError):
    """The host is held by no live pilot: nothing can be started there."""


class AgentLauncher(NodeLauncher):
    def __init__(self, world: World, wake: Callable[[str], Any] = lambda pilot: None):
        self.world = world
        self.wake = wake  # answer the pilot's waiting heartbeat now (set by the process that serves messages)
        self._commands: dict[str, list[dict[str, Any]]] = {}
        self._exits: list[ProcessExit] = []

    # ------------------------------------------------------------ NodeLauncher

    def launch(self, host: str, job_id: str, argv: list[str], env: dict[str, str]) -> None:
        self._send(host, {"op": "start", "job": job_id, "host": host, "argv": list(argv), "env": dict(env)}, must=True)

    def terminate(self, host: str, job_id: str) -> None:
        self._send(host, {"op": "stop", "job": job_id, "host": host}, must=False)

    def exits(self) -> list[ProcessExit]:
        out, self._exits = self._exits, []
        return out

    # ------------------------------------------------------------ what the controller calls

    def commands_for(self, pilot: str) -> list[dict[str, Any]]:
        """The commands waiting for ``pilot``'s agent (drained: each is sent once)."""
        return self._commands.pop(pilot, [])

    def pending(self, pilot: str) -> bool:
        return bool(self._commands.get(pilot))

    def reported(self, exits: list[Any]) -> None:
        """Exits an agent reported with its heartbeat (malformed entries are ignored)."""
        for e in exits:
            if (
                isinstance(e, dict)
                and isinstance(e.get("host"), str)
                and isinstance(e.get("job"), str)
                and isinstance(e.get("code"), int)
            ):
                self._exits.append(ProcessExit(e["host"], e["job"], e["code"], bool(e.get("requested"))))

    def forget(self, pilot: str) -> None:
        """The pilot is gone: its agent ends what ran there itself; commands for it are moot."""
        self._commands.pop(pilot, None)

    def _send(self, host: str, command: dict[str, Any], must: bool) -> None:
        node = self.world.nodes.get(host)
        pilot = node.pilot if node is not None else None
        if pilot is None or pilot not in self.world.pilots:
            if must:
                raise NoPilot(f"no live pilot holds {host}")
            return  # its pilot is gone: nothing of it runs any more
        self._commands.setdefault(pilot, []).append(command)
        self.wake(pilot)
