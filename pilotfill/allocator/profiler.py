"""JPA, the job profiling advisor (MalleTrain): scalability curves learned from a job's own reports.

Users should not have to measure scalability curves. The profiler keeps, per
job, the throughput it reported at each node count it ran on, and fits
Amdahl's law in the form

    n / T(n) = a + b·n        (a, b ≥ 0;  T(1) = 1/(a+b), serial fraction b/(a+b))

by non-negative least squares, which is linear in (a, b) and so cheap and
stable under a few percent of noise. It starts every job cold — nothing is
looked up by model name or borrowed from other jobs — and explores by
optimism, as an upper-confidence rule would:

* no report yet: the job is worth a great deal at its minimum size and
  nothing more, so it is started small and measured;
* one scale seen: perfect linear scaling from it (the upper bound when
  scaling is not super-linear), so a promising job is tried larger;
* two or more scales: the fitted curve, with the gap to linear scaling
  narrowed as more distinct scales are seen.

Pure: observations in, curves out; the caller decides when reports arrive.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import nnls

from .problem import ScalingCurve

PROBE_RATE = 1e12
"""Rate assumed for a job never measured: enough that it is always given its minimum to be measured."""


@dataclass
class _Scale:
    total: float = 0.0
    weight: float = 0.0

    @property
    def mean(self) -> float:
        return self.total / self.weight


@dataclass
class Profiler:
    """Learns one curve per job from ``observe`` calls; ``curve`` returns the current estimate."""

    optimism: float = 0.5
    _seen: dict[str, dict[int, _Scale]] = field(default_factory=dict)
    _cache: dict[tuple[str, int], ScalingCurve] = field(default_factory=dict)

    def observe(self, job_id: str, nodes: int, samples_per_s: float, weight: float = 1.0) -> None:
        """Record that ``job_id`` ran at ``samples_per_s`` on ``nodes`` (weight: e.g. seconds measured)."""
        if nodes <= 0 or not math.isfinite(samples_per_s) or samples_per_s < 0 or weight <= 0:
            return
        scale = self._seen.setdefault(job_id, {}).setdefault(int(nodes), _Scale())
        scale.total += samples_per_s * weight
        scale.weight += weight
        self._cache = {k: v for k, v in self._cache.items() if k[0] != job_id}

    def forget(self, job_id: str) -> None:
        self._seen.pop(job_id, None)
        self._cache = {k: v for k, v in self._cache.items() if k[0] != job_id}

    def scales(self, job_id: str) -> dict[int, float]:
        """Mean reported throughput per node count."""
        return {n: s.mean for n, s in sorted(self._seen.get(job_id, {}).items())}

    def curve(self, job_id: str, min_nodes: int, max_nodes: int) -> ScalingCurve:
        """The current estimate of ``job_id``'s throughput at 0…max_nodes nodes."""
        key = (job_id, max_nodes)
        if key not in self._cache:
            self._cache[key] = self._estimate(job_id, min_nodes, max_nodes)
        return self._cache[key]

    def _estimate(self, job_id: str, min_nodes: int, max_nodes: int) -> ScalingCurve:
        seen = self.scales(job_id)
        if not seen:
            return ScalingCurve((0, min_nodes, max(max_nodes, min_nodes + 1)), (0.0, PROBE_RATE, PROBE_RATE))
        n = np.arange(max_nodes + 1, dtype=float)
        if len(seen) == 1:
            (n0, t0), = seen.items()
            return ScalingCurve.from_table(t0 * n / n0)
        xs = np.array(list(seen), dtype=float)
        ts = np.array(list(seen.values()), dtype=float)
        fitted = _amdahl(xs, ts, n)
        # Upper-confidence: linear scaling from the largest scale seen, trusted less as scales accumulate.
        top = xs.argmax()
        linear = ts[top] * n / xs[top]
        bonus = self.optimism / (len(seen) - 1)
        beyond = n > xs[top]
        est = fitted.copy()
        est[beyond] = fitted[beyond] + bonus * np.maximum(linear[beyond] - fitted[beyond], 0.0)
        return ScalingCurve.from_table(est)


def _amdahl(xs: np.ndarray, ts: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Fit n/T = a + b·n (a, b ≥ 0) to the points and evaluate T at ``at``."""
    positive = ts > 0
    if not positive.any():
        return np.zeros_like(at)
    xs, ts = xs[positive], ts[positive]
    y = xs / ts
    # Relative errors matter, not absolute ones: weight each row by 1/y.
    A = np.stack([np.ones_like(xs), xs], axis=1) / y[:, None]
    (a, b), _ = nnls(A, np.ones_like(xs))
    if a + b <= 0:
        return ts.mean() / xs.mean() * at
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(at > 0, at / (a + b * at), 0.0)
    return out
