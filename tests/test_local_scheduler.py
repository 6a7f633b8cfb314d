"""The local virtual cluster's main workload: real Summit nodes, time-compressed."""

from __future__ import annotations

import pytest

from pilotfill.schedulers.local import MIN_PERIOD_S, summit_schedule

pytestmark = pytest.mark.local


def test_trace_schedule_changes_hands_every_few_tens_of_seconds():
    nodes = [f"pf-node-{i}" for i in range(4)]
    changes, period = summit_schedule(nodes, seconds_per_second=120.0)
    assert period == 6 * 3600 / 120.0
    assert {c.node for c in changes} == set(nodes)
    for node in nodes:
        mine = [c for c in changes if c.node == node]
        assert mine[0].at == 0.0  # every node starts with its state at the window's start
        states = [c.state for c in mine]
        assert all(a != b for a, b in zip(states, states[1:])), "consecutive changes must alternate"
        gaps = [b.at - a.at for a, b in zip(mine, mine[1:])]
        assert all(g >= MIN_PERIOD_S for g in gaps)
    later = [c for c in changes if c.at > 0]
    assert len(later) >= 8, "the main workload should take and return nodes several times per period"
    # Mostly idle windows: the cluster is usable most of the time.
    busy_share = []
    for node in nodes:
        mine = [c for c in changes if c.node == node] + []
        t_busy = sum((b.at if b else period) - a.at for a, b in zip(mine, mine[1:] + [None]) if a.state == "busy")
        busy_share.append(t_busy / period)
    assert max(busy_share) < 0.5
