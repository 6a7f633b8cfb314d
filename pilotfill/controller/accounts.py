"""Node-seconds held by pilots and used by jobs: what ``pilotfill top`` and the summary call the machine's use.

Integrated at every pass in memory (a float per kind), journaled in whole seconds once a minute with the world's
other counters (``held_node_s``, ``used_node_s``), so a takeover continues the totals and the journal is not
written each pass for them.
"""

from __future__ import annotations

from .world import World


class NodeSeconds:
    def __init__(self, world: World, since: float):
        self.world = world
        self._at = since
        self._held = self._used = 0.0  # not yet journaled

    def add_until(self, now: float) -> None:
        """Integrate what was held (ready nodes) and used (nodes of running jobs) since the last call."""
        dt = now - self._at
        if dt > 0:
            self._held += len(self.world.ready) * dt
            self._used += sum(len(j.nodes) for j in self.world.running.values()) * dt
        self._at = now

    def journal(self) -> None:
        """The whole seconds so far join the world's counters (the fraction waits for the next time)."""
        whole = int(self._held)
        if whole:
            self.world.count("held_node_s", whole)
            self._held -= whole
        whole = int(self._used)
        if whole:
            self.world.count("used_node_s", whole)
            self._used -= whole

    def totals(self) -> dict[str, float]:
        """Every node-second so far, journaled or not."""
        return {"held": self.world.counters["held_node_s"] + self._held,
                "used": self.world.counters["used_node_s"] + self._used}
