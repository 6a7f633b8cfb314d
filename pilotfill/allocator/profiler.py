"""JPA, the job profiling advisor (MalleTrain): scalability curves learned from a job's own reports.

Users should not have to measure scalability curves. The profiler keeps, per
job, the throughput it reported at each node count it ran on, and fits
Amdahl's law in the form

    n / T(n) = a + b·n        (a, b ≥ 0;  T(1) = 1/(a+b), serial fraction b/(a+b))

by non-negative least squares, which is linear in (a, b) and so cheap and
stable under a few percent of noise. It starts every job cold — nothing is
looked up by model name or borrowed from other jobs — and gives the allocator
two curves per job:

* ``confirmed``: what the reports support, conservative about any change. No
  report yet: a token rate at the job's minimum size, never enough to take a
  node a measured job uses. One scale seen: linear up to it (a shrink loses
  its share), flat beyond (nothing is known past it). Two or more: the fit.
* ``curve`` (optimistic, an upper-confidence rule): no report yet, a huge rate
  at the minimum size (measure it first); one scale seen, perfect linear
  scaling from it (the upper bound when scaling is not super-linear); two or
  more, the fit with its gap to linear scaling beyond the largest scale seen
  narrowed as more distinct scales are seen.

JPA also learns what changes cost each job, from the same reports: the
seconds from a start or a resize command to the moment its ranks train again
(their first report after it), per kind of change, and how often the job
commits (a stop loses half an interval on average). Until a kind has been
measured the caller's prior stands (the decorator's or the job file's).

The allocator decides by the confirmed curves, then hands the nodes no job
holds by the optimistic ones (:func:`pilotfill.allocator.allocate`): new jobs
are measured and measured jobs explore on free nodes, and no measured job is
ever shrunk or stopped so that another can explore.

Pure: observations in, curves out; the caller decides when reports arrive.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import nnls

from .problem import ScalingCurve

EXPLORE_RATE = 1e12
"""Optimistic rate of a job never measured: on nodes nobody holds, measuring it comes first."""
PROBE_RATE = 1e-3
"""Rate assumed for a job never measured: more than nothing (so it starts on a free node and is
measured), far less than any real job (so it never takes a node a measured job uses)."""


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
    _cache: dict[str, dict[tuple[int, str], ScalingCurve]] = field(default_factory=dict)  # per job: O(1) to invalidate
    _costs: dict[str, dict[str, _Scale]] = field(default_factory=dict)  # per job, per kind of change: seconds
    _versions: dict[str, int] = field(default_factory=dict)  # per job: bumped by every observation (callers cache on it)

    def observe(self, job_id: str, nodes: int, samples_per_s: float, weight: float = 1.0) -> None:
        """Record that ``job_id`` ran at ``samples_per_s`` on ``nodes`` (weight: e.g. seconds measured)."""
        if nodes <= 0 or not math.isfinite(samples_per_s) or samples_per_s < 0 or not (math.isfinite(weight) and weight > 0):
            return
        scale = self._seen.setdefault(job_id, {}).setdefault(int(nodes), _Scale())
        scale.total += samples_per_s * weight
        scale.weight += weight
        self._cache.pop(job_id, None)
        self._versions[job_id] = self._versions.get(job_id, 0) + 1

    def version(self, job_id: str) -> int:
        """How many observations of the job have been made: what it knows of the job changes only with this."""
        return self._versions.get(job_id, 0)

    def forget(self, job_id: str) -> None:
        self._versions.pop(job_id, None)
        self._seen.pop(job_id, None)
        self._cache.pop(job_id, None)
        self._costs.pop(job_id, None)

    def observe_cost(self, job_id: str, kind: str, seconds: float) -> None:
        """A change of ``kind`` (``start``, ``up``, ``down``, ``commit``: the interval between commits) took ``seconds``."""
        if not (math.isfinite(seconds) and seconds >= 0):
            return
        scale = self._costs.setdefault(job_id, {}).setdefault(kind, _Scale())
        scale.total += seconds
        scale.weight += 1.0
        self._versions[job_id] = self._versions.get(job_id, 0) + 1

    def cost(self, job_id: str, kind: str, prior: float) -> float:
        """The mean measured cost of ``kind`` for the job, or ``prior`` before one was measured."""
        scale = self._costs.get(job_id, {}).get(kind)
        return scale.mean if scale is not None and scale.weight > 0 else prior

    def restart_cost(self, job_id: str, prior: float) -> float:
        """What stopping the job costs: a start, plus the work since its last commit (half an interval on average)."""
        costs = self._costs.get(job_id, {})
        if "start" not in costs and "commit" not in costs:
            return prior
        return self.cost(job_id, "start", 0.0) + self.cost(job_id, "commit", 0.0) / 2

    def scales(self, job_id: str) -> dict[int, float]:
        """Mean reported throughput per node count."""
        return {n: s.mean for n, s in sorted(self._seen.get(job_id, {}).items())}

    def measured(self, job_id: str) -> bool:
        return bool(self._seen.get(job_id))

    def curve(self, job_id: str, min_nodes: int, max_nodes: int) -> ScalingCurve:
        """The optimistic estimate of ``job_id``'s throughput at 0…max_nodes nodes (see the module docstring)."""
        return self._cached(job_id, max_nodes, "optimistic", lambda: self._estimate(job_id, min_nodes, max_nodes))

    def confirmed(self, job_id: str, min_nodes: int, max_nodes: int) -> ScalingCurve:
        """What the reports support, with no optimism (see the module docstring)."""
        return self._cached(job_id, max_nodes, "confirmed", lambda: self._confirmed(job_id, min_nodes, max_nodes))

    def _cached(self, job_id: str, max_nodes: int, kind: str, make) -> ScalingCurve:
        cache = self._cache.setdefault(job_id, {})
        key = (max_nodes, kind)
        if key not in cache:
            cache[key] = make()
        return cache[key]

    def _confirmed(self, job_id: str, min_nodes: int, max_nodes: int) -> ScalingCurve:
        seen = self.scales(job_id)
        if not seen:
            return _probe(min_nodes, max_nodes)
        n = np.arange(max_nodes + 1, dtype=float)
        if len(seen) == 1:
            (n0, t0), = seen.items()
            return ScalingCurve.from_table(t0 * np.minimum(n, n0) / n0)
        xs = np.array(list(seen), dtype=float)
        return ScalingCurve.from_table(_amdahl(xs, np.array(list(seen.values()), dtype=float), n))

    def _estimate(self, job_id: str, min_nodes: int, max_nodes: int) -> ScalingCurve:
        seen = self.scales(job_id)
        if not seen:
            return _probe(min_nodes, max_nodes, EXPLORE_RATE)
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


def _probe(min_nodes: int, max_nodes: int, rate: float = None) -> ScalingCurve:
    rate = PROBE_RATE if rate is None else rate
    return ScalingCurve((0, min_nodes, max(max_nodes, min_nodes + 1)), (0.0, rate, rate))


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
