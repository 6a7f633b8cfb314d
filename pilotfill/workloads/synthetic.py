"""A stand-in training loop: each rank "processes" samples at a fixed rate and reports them.

It behaves like data-parallel training as the controller sees it — progress
that grows with the number of ranks, reported every step, resumed after any
restart — without needing a model. Used by the controller's tests and as the
simplest example of ``pilotfill.report``.

It resumes from the larger of the job's progress as the controller counts it
and its own durable commit (``PILOTFILL_CHECKPOINT``, written atomically every
``commit_s`` seconds, every step by default, and then announced with
:func:`pilotfill.report.committed`), so a training interrupted by a stop or a
crash of the whole campaign picks up where it committed.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from ..report import committed, report


def train(
    total_samples: float,
    samples_per_s: float = 100.0,
    step_s: float = 0.2,
    fail_after: float | None = None,
    commit_s: float = 0.0,
    startup_s: float = 0.0,
) -> dict:
    """Work until the job's progress (over all ranks) reaches ``total_samples``; return a summary.

    ``startup_s``: what a real rank spends before its first step (imports, rendezvous, restoring a commit)."""
    time.sleep(startup_s)
    progress = max(report(0.0) or 0.0, _committed())
    resumed_from = progress
    steps = 0
    last_commit = time.monotonic()
    while progress < total_samples:
        time.sleep(step_s)
        steps += 1
        progress = max(
            report(samples_per_s * step_s) or progress + samples_per_s * step_s, progress + samples_per_s * step_s
        )
        if time.monotonic() - last_commit >= commit_s or progress >= total_samples:
            _commit(progress)
            last_commit = time.monotonic()
        if fail_after is not None and progress >= fail_after:
            raise RuntimeError(f"synthetic failure at {progress:.0f} samples")
    return {"samples": progress, "steps_on_this_rank": steps, "resumed_from": resumed_from}


def _checkpoint() -> Path | None:
    path = os.environ.get("PILOTFILL_CHECKPOINT")
    return Path(path).with_suffix(".json") if path else None


def _committed() -> float:
    path = _checkpoint()
    try:
        return float(json.loads(path.read_text())["samples"]) if path else 0.0
    except (OSError, ValueError, KeyError, TypeError):
        return 0.0


def _commit(progress: float) -> None:
    path = _checkpoint()
    if path is None:
        return
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"samples": progress}))
    os.replace(tmp, path)
    committed()
