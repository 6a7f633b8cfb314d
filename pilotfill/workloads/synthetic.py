"""A stand-in training loop: each rank "processes" samples at a fixed rate and reports them.

It behaves like data-parallel training as the controller sees it — progress
that grows with the number of ranks, reported every step, resumed from the
committed total after any restart — without needing a model. Used by the
controller's tests and as the simplest example of ``pilotfill.report``.
"""

from __future__ import annotations

import time

from ..report import report


def train(total_samples: float, samples_per_s: float = 100.0, step_s: float = 0.2, fail_after: float | None = None) -> dict:
    """Work until the job's progress (over all ranks) reaches ``total_samples``; return a summary."""
    progress = report(0.0) or 0.0
    steps = 0
    while progress < total_samples:
        time.sleep(step_s)
        steps += 1
        progress = report(samples_per_s * step_s) or progress + samples_per_s * step_s
        if fail_after is not None and progress >= fail_after:
            raise RuntimeError(f"synthetic failure at {progress:.0f} samples")
    return {"samples": progress, "steps_on_this_rank": steps}
