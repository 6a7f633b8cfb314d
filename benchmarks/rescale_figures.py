"""What a job's resizes cost, read from what its ranks did: each rank logs every step it trains.

Shared by the benchmarks that measure the torch runtime's restart and in-place paths on real batch systems
(``bench_pbs.py``, ``bench_slurm.py``). A step record: ``{"host", "world", "time", "pid", "epoch", "start", "rank",
"size"}`` (the loader's batch: its epoch, offset and size; the rank and world size that trained it).

* grow: a node joined the job at ``t`` -> its first step (the time until a joining node trains), and the pause of the
  ranks already training (the first step of another host at the new size, minus that host's step before it);
* shrink: a node left at ``t`` -> the pause of the ranks that stay (their first step at the smaller size, minus their
  step before it);
* restarted: a host's training process changed while the host stayed in the job (no join or leave of it between);
* redone: samples of global batches trained more than once (rank 0 trains each step once per time it is trained).
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

STEP_LOG = """
def _pilotfill_bench_step(batch, path={path!r}):
    import json, os, time
    with open(path, "a") as f:
        f.write(json.dumps({{"host": os.environ.get("PILOTFILL_HOST", "?"), "world": batch.world, "time": time.time(), "pid": os.getpid(),
                            "epoch": batch.epoch, "start": batch.start, "rank": batch.rank, "size": batch.size}}) + "\\n")
"""
"""A helper a benchmark's campaign defines (``path``: where the steps go, on a filesystem every host sees)."""


def read_steps(path: Path) -> list[dict]:
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return []
    return sorted((json.loads(line) for line in lines if line.endswith("}")), key=lambda r: r["time"])


def figures(rows: list[dict], joins: list[tuple[float, str]], leaves: list[tuple[float, str]]) -> dict[str, list[float]]:
    """grow, grow_pause, shrink, restarted, redone (see the module docstring) from the ranks' steps and the job's
    changes (``(time, host)`` of each node that joined it and each that left it)."""
    out: dict[str, list[float]] = {"grow": [], "grow_pause": [], "shrink": [], "restarted": [], "redone": []}
    for t, host in joins:
        mine = next((r for r in rows if r["host"] == host and r["time"] > t), None)
        if mine is None:
            continue
        out["grow"].append(mine["time"] - t)
        other = next((r for r in rows if r["host"] != host and r["time"] > t and r["world"] == mine["world"]), None)
        out["grow_pause"] += _pause(rows, other)
    for t, host in leaves:
        was = max((r["world"] for r in rows if r["time"] <= t and r["time"] > t - 10), default=None)
        other = next((r for r in rows if r["host"] != host and r["time"] > t and was is not None and r["world"] < was), None)
        out["shrink"] += _pause(rows, other)
    changes = sorted([(t, h) for t, h in joins] + [(t, h) for t, h in leaves])
    restarted = 0
    last: dict[str, dict] = {}
    for r in rows:
        prev = last.get(r["host"])
        if prev is not None and prev["pid"] != r["pid"] and not any(prev["time"] <= t <= r["time"] and h == r["host"] for t, h in changes):
            restarted += 1
        last[r["host"]] = r
    out["restarted"] = [float(restarted)]
    seen: dict[tuple[int, int], list[int]] = {}
    for r in rows:
        if r["rank"] == 0:
            seen.setdefault((r["epoch"], r["start"]), []).append(r["size"])
    out["redone"] = [float(sum(sum(sizes[1:]) for sizes in seen.values()))]
    return out


def _pause(rows: list[dict], step: dict | None) -> list[float]:
    """How long ``step``'s host stood still before it: [] without a step, or with none of its host's before it."""
    pause = step["time"] - _before(rows, step["host"], step["time"]) if step is not None else math.nan
    return [] if math.isnan(pause) else [pause]


def _before(rows: list[dict], host: str, t: float) -> float:
    times = [r["time"] for r in rows if r["host"] == host and r["time"] < t]
    return max(times) if times else float("nan")


def cell(xs: list[float], count: bool = False) -> str:
    """A median with its range, or a count."""
    if not xs:
        return "n/a"
    if count:
        return f"{xs[0]:.0f}"
    return f"{statistics.median(xs):.2f} s ({min(xs):.2f}-{max(xs):.2f}, n={len(xs)})"
