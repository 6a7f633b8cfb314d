"""What a run is doing, once: its jobs, pilots and notices, read from its journal (``pilotfill status RUN_DIR``, and
the remote ``pilotfill status --endpoint`` through Globus Compute)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .lifecycle import JobStatus


def run_dir_status(run_dir: Path) -> dict[str, Any]:
    """The jobs (results decoded), pilots and notices of the run directory's journal: what it committed, whether or
    not a controller runs on it."""
    from .journal import Journal

    out: dict[str, Any] = {"jobs": [], "pilots": [], "notices": []}
    try:
        state = Journal(run_dir, readonly=True)
    except FileNotFoundError:  # no state yet: the run is starting
        return out
    try:
        out["jobs"] = [
            {
                "id": j.id,
                "name": j.name,
                "status": j.status,
                "nodes": len(j.nodes),
                "progress": j.progress,
                "committed": j.committed,
                "redone": j.redone,
                "rescales": j.rescales,
                "result": result_of(j, Path(run_dir)) if j.status == JobStatus.FINISHED else None,
                "error": ((j.error or "").strip().splitlines() or [None])[-1],
            }
            for j in state.jobs()
        ]
        out["pilots"] = [
            {"id": p["id"], "scheduler_id": p["scheduler_id"], "state": p["state"], "nodes": len(p["nodes"])}
            for p in state.pilots()
        ]
        out["notices"] = json.loads(state.get_meta("notices") or "[]")
    finally:
        state.close()
    return out


def result_of(job, run_dir: Path) -> Any:
    """A finished job's result; values shipped back by the Parsl executor are decoded (a large one is read from the run
    directory, :mod:`pilotfill.results`)."""
    from parsl.serialize import deserialize

    from .results import is_packed, unpack

    value = job.result
    if is_packed(value):
        value = deserialize(unpack(run_dir, value))
    return value
