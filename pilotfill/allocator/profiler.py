"""JPA, the job profiling advisor (MalleTrain): scalability curves learned from a job's own reports.

Users should not have to measure scalability curves. The profiler keeps, per
job, the throughput it reported at each node count it ran on, and fits
Amdahl's law in the form

    n / T(n) = a + b·n        (a, b ≥ 0;  T(1) = 1/(a+b), serial fraction b/(a+b))

by non-negative least squares, which is linear in (a, b) and so cheap and
stable under a few percent of noise. It starts every job cold, unless the
caller declares the job's model by name (:meth:`Profiler.declare`): a job never
measured is then valued by what its model's other jobs reported, pooled (the
same fit, as if they were one job), until its own reports arrive — a sweep's
copies are not each measured from nothing, and the waiting ones of a fast model
rank above a slow one's. It gives the allocator two curves per job:

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

On a machine with several kinds of node every curve is per node type: the
reports a job makes on one type say nothing certain of another. Until a job
has run on a type its curve there is a prediction (:mod:`.similarity`): the
job's own level where it has run, times the speed of that type relative to
the other predicted from the models most like it, on their scaling shape —
with bounds as wide as the prediction is unsure (:meth:`Profiler.typed_curves`):
the allocator moves a job by the lower bound (a move is a stop and a start, so
only a sure gain pays for it) and tries a type by the upper bound, on free
nodes only, as it explores sizes. A job's own reports on a type replace the
prediction there the moment they arrive. With no similar model measured (or
no descriptor) every type is alike and wide open: per-type learning from nothing.
A model whose nearest measured model is far (the caller says: ``far``) is measured
once on every type, at its minimum size, before its bounds decide: a weak
neighbour's guess is not worth trusting even as a bound.

A job's curves are refitted only when what it reported moves: a new scale,
or a scale's mean rate moving more than ``REFIT_TOLERANCE`` from the mean the
curves were fitted to. Hundreds of running jobs report on every event; their
curves would change by far less than their own noise, and refitting them all
was most of a decision's time at machine scale. Costs likewise: a job is
charged anew only when a kind's mean moves by more than ``REFIT_TOLERANCE``
of itself and ``COST_TOLERANCE_S`` (each commit measures the interval again).

Pure: observations in, curves out; the caller decides when reports arrive.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from .problem import ScalingCurve
from .similarity import Prediction

CONFIDENCE = 1.0
"""A prediction's bounds on a type not measured: its point estimate times exp(∓ CONFIDENCE · σ)."""
EXPLORE_RATE = 1e12
"""Optimistic rate of a job never measured: on nodes nobody holds, measuring it comes first."""
REFIT_TOLERANCE = 0.01
"""A scale's mean rate must move by more than this share of the rate its curves were fitted to before they are
fitted anew."""
COST_TOLERANCE_S = 0.1
"""…and a measured cost must move by more than this many seconds (and ``REFIT_TOLERANCE`` of itself) before the job's
curves and costs are given anew: a job commits every minute or so, and each interval measured again (a few
milliseconds apart) would otherwise remake every running job's view in every decision."""
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
    # job -> node type -> nodes -> rate
    _seen: dict[str, dict[str | None, dict[int, _Scale]]] = field(default_factory=dict)
    _cache: dict[str, dict[tuple, ScalingCurve]] = field(default_factory=dict)  # per job: O(1) to invalidate
    _costs: dict[str, dict[str, _Scale]] = field(default_factory=dict)  # per job, per kind of change: seconds
    # per job: bumped when its curves or costs change (callers cache on it)
    _versions: dict[str, int] = field(default_factory=dict)
    # per job and type: the means its curves rest on
    _fitted: dict[str, dict[str | None, dict[int, float]]] = field(default_factory=dict)
    # per job and kind of change: the mean cost callers are given
    _charged: dict[str, dict[str, float]] = field(default_factory=dict)
    # moves with every job's version (and when a job is forgotten): thousands of jobs checked in one comparison
    changes: int = 0
    _touched: set[str] = field(default_factory=set)  # jobs whose version moved since the caller last took them
    # job -> its model's name, where declared (untyped curves only)
    _model_of: dict[str, str] = field(default_factory=dict)
    # model -> its declared jobs (bumped when the model's reports move)
    _members: dict[str, set[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._versions_view = MappingProxyType(self._versions)

    def observe(self, job_id: str, nodes: int, samples_per_s: float, weight: float = 1.0,
                node_type: str | None = None) -> None:
        """Record that ``job_id`` ran at ``samples_per_s`` on ``nodes`` (of ``node_type``; weight: e.g. seconds
        measured)."""
        if (nodes <= 0 or not math.isfinite(samples_per_s) or samples_per_s < 0
                or not (math.isfinite(weight) and weight > 0)):
            return
        model = self._model_of.get(job_id) if node_type is None else None
        if model is not None and self._record(_pooled(model), nodes, samples_per_s, weight, None):
            for member in self._members[model]:  # those valued by the model's reports: their curves moved
                if member != job_id and not self.measured(member):
                    self._moved(member)
        self._record(job_id, nodes, samples_per_s, weight, node_type)

    def _record(self, job_id: str, nodes: int, samples_per_s: float, weight: float, node_type: str | None) -> bool:
        """One report joins ``job_id``'s scales; whether its curves moved (see ``REFIT_TOLERANCE``)."""
        scale = self._seen.setdefault(job_id, {}).setdefault(node_type, {}).setdefault(int(nodes), _Scale())
        scale.total += samples_per_s * weight
        scale.weight += weight
        fitted = self._fitted.setdefault(job_id, {}).setdefault(node_type, {})
        before = fitted.get(int(nodes))
        if before is not None and abs(scale.mean - before) <= REFIT_TOLERANCE * abs(before):
            return False  # the curves fitted to ``before`` stand: the rate moved by less than the tolerance
        fitted[int(nodes)] = scale.mean
        self._moved(job_id)
        return True

    def _moved(self, job_id: str) -> None:
        self._cache.pop(job_id, None)
        self._versions[job_id] = self._versions.get(job_id, 0) + 1
        self._touched.add(job_id)
        self.changes += 1

    def declare(self, job_id: str, model: str | None) -> None:
        """``job_id`` runs ``model`` (a name; None or empty: nothing said): until it reports itself, its curves (one
        node type) are its model's, fitted to every report of the model's declared jobs, ended ones included; a model
        none of whose jobs reported yet leaves it cold (measured first, on free nodes)."""
        if not model or self._model_of.get(job_id) == model:
            return
        old = self._model_of.get(job_id)
        if old is not None:
            self._members[old].discard(job_id)
        self._model_of[job_id] = model
        self._members.setdefault(model, set()).add(job_id)
        if not self.measured(job_id):
            self._moved(job_id)

    def _prior(self, job_id: str, node_type: str | None) -> str | None:
        """Whose reports value ``job_id`` on one node type: its model's pooled ones where it never reported itself
        and its model did (see :meth:`declare`), else None (its own)."""
        model = self._model_of.get(job_id) if node_type is None else None
        if model is None or self.measured(job_id):
            return None
        pooled = _pooled(model)
        return pooled if self.measured(pooled) else None

    def version(self, job_id: str) -> int:
        """Bumped whenever the job's curves or costs change: callers may keep what they made from them until it
        moves."""
        return self._versions.get(job_id, 0)

    @property
    def versions(self) -> Mapping[str, int]:
        """Every job's :meth:`version` (0 where absent), read-only: for callers that check thousands of jobs at once."""
        return self._versions_view

    def take_touched(self) -> set[str]:
        """The jobs whose :meth:`version` moved since this was last asked (what a caller keeping something made from
        thousands of jobs' curves makes again, and nothing else)."""
        touched, self._touched = self._touched, set()
        return touched

    def forget(self, job_id: str) -> None:
        self.changes += 1
        self._touched.discard(job_id)
        self._versions.pop(job_id, None)
        self._fitted.pop(job_id, None)
        self._seen.pop(job_id, None)
        self._cache.pop(job_id, None)
        self._costs.pop(job_id, None)
        self._charged.pop(job_id, None)
        model = self._model_of.pop(job_id, None)
        if model is not None:
            self._members[model].discard(job_id)  # what it reported stays with its model

    def observe_cost(self, job_id: str, kind: str, seconds: float) -> None:
        """A change of ``kind`` (``start``, ``up``, ``down``, ``commit``: the interval between commits) took
        ``seconds``."""
        if not (math.isfinite(seconds) and seconds >= 0):
            return
        scale = self._costs.setdefault(job_id, {}).setdefault(kind, _Scale())
        scale.total += seconds
        scale.weight += 1.0
        charged = self._charged.setdefault(job_id, {})
        before = charged.get(kind)
        if before is not None and abs(scale.mean - before) <= max(REFIT_TOLERANCE * abs(before), COST_TOLERANCE_S):
            # what the job is charged stands: a steady commit interval measured again, every minute, changes nothing
            return
        charged[kind] = scale.mean
        self._versions[job_id] = self._versions.get(job_id, 0) + 1
        self._touched.add(job_id)
        self.changes += 1

    def cost(self, job_id: str, kind: str, prior: float) -> float:
        """The mean measured cost of ``kind`` for the job (as of the last time it moved by more than the
        tolerances: what the caller's views were made from), or ``prior`` before one was measured."""
        return self._charged.get(job_id, {}).get(kind, prior)

    def restart_cost(self, job_id: str, prior: float) -> float:
        """What stopping the job costs: a start, plus the work since its last commit (half an interval on average)."""
        costs = self._charged.get(job_id, {})
        if "start" not in costs and "commit" not in costs:
            return prior
        return self.cost(job_id, "start", 0.0) + self.cost(job_id, "commit", 0.0) / 2

    def scales(self, job_id: str, node_type: str | None = None) -> dict[int, float]:
        """Mean reported throughput per node count (on ``node_type``), as of the job's last refit (see
        ``REFIT_TOLERANCE``)."""
        return dict(sorted(self._fitted.get(job_id, {}).get(node_type, {}).items()))

    def measured(self, job_id: str, node_type: str | None = None) -> bool:
        return bool(self._seen.get(job_id, {}).get(node_type))

    def measured_types(self, job_id: str) -> list[str]:
        """The node types the job has reported on, the most measured first."""
        seen = self._seen.get(job_id, {})
        weight = {t: sum(s.weight for s in scales.values()) for t, scales in seen.items() if t is not None and scales}
        return sorted(weight, key=lambda t: -weight[t])

    def curve(self, job_id: str, min_nodes: int, max_nodes: int, node_type: str | None = None) -> ScalingCurve:
        """The optimistic estimate of ``job_id``'s throughput at 0…max_nodes nodes (see the module docstring)."""
        prior = self._prior(job_id, node_type)
        if prior is not None:
            return self.curve(prior, min_nodes, max_nodes)
        return self._cached(job_id, (max_nodes, "optimistic", node_type),
                            lambda: self._estimate(job_id, min_nodes, max_nodes, node_type))

    def confirmed(self, job_id: str, min_nodes: int, max_nodes: int, node_type: str | None = None,
                  trying: int = 0) -> ScalingCurve:
        """What the reports support, with no optimism (see the module docstring).

        ``trying``: the count the job runs at now. Past every count it has reported at, it grew there to be
        measured, and it is valued there as exploring expected (the optimistic curve up to ``trying``, flat
        beyond) until it reports: it keeps those nodes until it is measured, as a job never measured keeps its
        first ones. Judged by its confirmed curve instead, the next decision would take them back before the
        measurement the growth was paid for arrives, and the one after would grow it again."""
        prior = self._prior(job_id, node_type)
        if prior is not None:
            return self.confirmed(prior, min_nodes, max_nodes)
        seen = self._seen.get(job_id, {}).get(node_type)
        if seen and trying > max(seen):
            return self._cached(job_id, (max_nodes, "trying", node_type, trying),
                                lambda: self._trying(job_id, min_nodes, max_nodes, node_type, trying))
        return self._cached(job_id, (max_nodes, "confirmed", node_type),
                            lambda: self._confirmed(job_id, min_nodes, max_nodes, node_type))

    def prepare(self, jobs: Iterable[tuple[str, int]]) -> None:
        """Fit, in one array operation per width, the curves of every job in ``jobs`` (``(job_id, max_nodes)``, one
        node type) that has two scales or more and none made since it last moved: :meth:`curve` and :meth:`confirmed`
        then give them from the cache, the very numbers each would have made alone. After a decision that resized
        hundreds of jobs, each reports at a new scale and is fitted again; one by one, each fit and its two tables
        would pay numpy's per-call overhead on arrays of a few dozen counts, hundreds of times in the next decision."""
        groups: dict[int, list[tuple[str, dict[int, float], float, float]]] = {}
        for job_id, max_nodes in jobs:
            cache = self._cache.get(job_id)
            if (cache is not None and (max_nodes, "optimistic", None) in cache
                    and (max_nodes, "confirmed", None) in cache):
                continue
            seen = self.scales(job_id)
            if len(seen) < 2 or any(t <= 0 for t in seen.values()):
                continue  # no fit (a token or linear curve: cheap), or a fit with a point left out: made one by one
            xs = [float(x) for x in seen]
            y = [x / t for x, t in zip(xs, seen.values())]
            a, b = _nnls2([1.0 / yi for yi in y], [x / yi for x, yi in zip(xs, y)])
            # the usual case; the others (a + b ≤ 0, a = 0) are made one by one, as :func:`_amdahl` makes them
            if a > 0:
                groups.setdefault(max_nodes, []).append((job_id, seen, a, b))
        for max_nodes, members in groups.items():
            if len(members) < 2:
                continue
            at = np.arange(max_nodes + 1, dtype=float)
            a = np.array([m[2] for m in members])
            b = np.array([m[3] for m in members])
            fitted = at[None, :] / (a[:, None] + b[:, None] * at[None, :])
            fitted.flags.writeable = False
            top = np.array([max(m[1]) for m in members])
            rate = np.array([m[1][max(m[1])] for m in members])
            share = np.array([self.optimism / (len(m[1]) - 1) for m in members])
            beyond = at[None, :] > top[:, None]
            with np.errstate(divide="ignore", invalid="ignore"):
                linear = rate[:, None] * at[None, :] / top[:, None]
            est = np.where(beyond, fitted + share[:, None] * np.maximum(linear - fitted, 0.0), fitted)
            confirmed = ScalingCurve.dense_rows(fitted)
            optimistic = ScalingCurve.dense_rows(est)
            for (job_id, _, _, _), fit, low, high in zip(members, fitted, confirmed, optimistic):
                cache = self._cache.setdefault(job_id, {})
                cache[(max_nodes, "fit", None)] = fit
                cache[(max_nodes, "confirmed", None)] = low
                cache[(max_nodes, "optimistic", None)] = high

    def ready(self, job_id: str, max_nodes: int) -> bool:
        """Whether a job's optimistic curve up to ``max_nodes`` (one node type) is made already: :meth:`curve` gives
        it without fitting (:meth:`prepare` fitted it with others, or an earlier call made it)."""
        return (max_nodes, "optimistic", None) in self._cache.get(job_id, {})

    def typed_curves(self, job_id: str, min_nodes: int, max_nodes: int, node_types: list[str], prediction: Prediction,
                     running_on: str | None = None, trying: tuple[str, int] | None = None,
                     far: bool = False) -> tuple[dict[str, ScalingCurve], dict[str, ScalingCurve]]:  # fmt: skip
        """Confirmed and optimistic curves per node type (see the module docstring): the job's own where it has
        reported, else the prediction anchored on its own level elsewhere, bounded by how sure it is; before any
        report anywhere, a token rate (confirmed) and measuring first on the type predicted best (optimistic).
        ``running_on``: the type it runs on now, not yet measured there (it keeps its nodes until it is).
        ``trying``: the type and count it runs at now, where it has reported (see :meth:`confirmed`).
        ``far``: the model is like nothing measured (:attr:`.similarity.Prediction.nearest` below the site's
        threshold): its predicted speed on a type is not worth trusting, so while it has not grown past its minimum
        size each type it has not run on is worth measuring first, as before any report — a short run there at
        its minimum size (Sia's bootstrap) — and once every type is measured its own rates decide."""
        key = (max_nodes, "typed", tuple(node_types), id(prediction), running_on, trying, far)
        cache = self._cache.setdefault(job_id, {})
        if key not in cache:
            cache[key] = self._typed(job_id, min_nodes, max_nodes, node_types, prediction, running_on, trying, far)
        return cache[key]

    def _typed(self, job_id: str, lo: int, hi: int, types: list[str], prediction: Prediction, running_on: str | None,
               trying: tuple[str, int] | None = None, far: bool = False):  # fmt: skip
        confirmed: dict[str, ScalingCurve] = {}
        optimistic: dict[str, ScalingCurve] = {}
        measured = [t for t in self.measured_types(job_id) if t in types]
        n = np.arange(hi + 1, dtype=float)
        if not measured:
            # Measure first, where it is predicted best (an upper bound: a type it may well suit is tried before one
            # it surely does not).
            ucb = {t: prediction.log_speed.get(t, 0.0) + CONFIDENCE * prediction.spread.get(t, 0.0) for t in types}
            top = max(ucb.values(), default=0.0)
            for t in types:
                optimistic[t] = _probe(lo, hi, EXPLORE_RATE * math.exp(min(0.0, ucb[t] - top)))
                confirmed[t] = optimistic[t] if t == running_on else _probe(lo, hi)
            return confirmed, optimistic
        anchor = measured[0]
        level = self._level(job_id, lo, hi, anchor, prediction)
        probing = far and (trying is None or trying[1] <= lo)  # cheap: at its minimum size, before it grows
        bounds = {}
        for t in types:
            if t in measured:
                confirmed[t] = self.confirmed(job_id, lo, hi, t, trying=trying[1] if trying and trying[0] == t else 0)
                optimistic[t] = self._estimate(job_id, lo, hi, t)
                continue
            if t == running_on:  # started here to be measured: keeps its nodes until it is
                optimistic[t] = confirmed[t] = _probe(lo, hi, EXPLORE_RATE)
                continue
            mean, sigma = (prediction.relative(t, anchor)
                           if t in prediction.log_speed and anchor in prediction.log_speed
                           else (0.0, prediction.unknown))
            point = (level * math.exp(mean) * prediction.shape(t, n) if t in prediction.curves
                     else level * math.exp(mean) * n)
            point[0] = 0.0
            confirmed[t] = ScalingCurve.from_table(point * math.exp(-CONFIDENCE * sigma))
            optimistic[t] = ScalingCurve.from_table(point * math.exp(CONFIDENCE * sigma))
            bounds[t] = mean + CONFIDENCE * sigma
        if probing and bounds:  # measure the type whose upper bound is highest first
            top = max(bounds.values())
            for t, ucb in bounds.items():
                optimistic[t] = _probe(lo, hi, EXPLORE_RATE * math.exp(min(0.0, ucb - top)))
        return confirmed, optimistic

    def _level(self, job_id: str, lo: int, hi: int, node_type: str, prediction: Prediction) -> float:
        """The job's own rate at one node on ``node_type``: its reports there, through the predicted shape where it
        ran on more nodes only (a curve that scales sublinearly must not make one node look faster than it is)."""
        seen = self.scales(job_id, node_type)
        n0 = min(seen)
        rate = seen[n0]
        if n0 == 1:
            return rate
        shape = (float(prediction.shape(node_type, np.array([float(n0)]))[0]) if node_type in prediction.curves
                 else float(n0))
        return rate / shape if shape > 0 else rate / n0

    def _fit(self, job_id: str, max_nodes: int, node_type: str | None, seen: dict[int, float]) -> np.ndarray:
        """Amdahl's law fitted to the job's scales, at 0…max_nodes (one fit for its confirmed and optimistic
        curves)."""
        def fit() -> np.ndarray:
            out = _amdahl([float(x) for x in seen], list(seen.values()), np.arange(max_nodes + 1, dtype=float))
            out.flags.writeable = False
            return out

        return self._cached(job_id, (max_nodes, "fit", node_type), fit)

    def _cached(self, job_id: str, key: tuple, make) -> ScalingCurve:
        cache = self._cache.setdefault(job_id, {})
        if key not in cache:
            cache[key] = make()
        return cache[key]

    def _confirmed(self, job_id: str, min_nodes: int, max_nodes: int, node_type: str | None = None) -> ScalingCurve:
        seen = self.scales(job_id, node_type)
        if not seen:
            return _probe(min_nodes, max_nodes)
        if len(seen) == 1:
            (n0, t0), = seen.items()
            return _linear(t0, n0, max_nodes, flat=True)
        return ScalingCurve.dense(self._fit(job_id, max_nodes, node_type, seen))

    def _trying(self, job_id: str, min_nodes: int, max_nodes: int, node_type: str | None, trying: int) -> ScalingCurve:
        optimistic = self.curve(job_id, min_nodes, max_nodes, node_type).table(max_nodes)
        return ScalingCurve.dense(np.minimum(optimistic, optimistic[min(trying, max_nodes)]))

    def _estimate(self, job_id: str, min_nodes: int, max_nodes: int, node_type: str | None = None) -> ScalingCurve:
        seen = self.scales(job_id, node_type)
        if not seen:
            return _probe(min_nodes, max_nodes, EXPLORE_RATE)
        if len(seen) == 1:
            (n0, t0), = seen.items()
            return _linear(t0, n0, max_nodes, flat=False)
        fitted = self._fit(job_id, max_nodes, node_type, seen)
        # Upper-confidence: linear scaling from the largest scale seen, trusted less as scales accumulate.
        top = max(seen)
        est = fitted.copy()
        if top < max_nodes:
            beyond = fitted[top + 1 :]
            linear = seen[top] * np.arange(top + 1, max_nodes + 1, dtype=float) / top
            est[top + 1 :] = beyond + self.optimism / (len(seen) - 1) * np.maximum(linear - beyond, 0.0)
        return ScalingCurve.dense(est)


def _pooled(model: str) -> str:
    """The id under which a model's declared jobs' reports are pooled (no job id starts with a NUL)."""
    return "\0model:" + model


def _linear(t0: float, n0: int, max_nodes: int, flat: bool) -> ScalingCurve:
    """One scale seen, ``t0`` at ``n0`` nodes: linear scaling through it up to ``max_nodes`` (``flat``: only up to it,
    flat beyond), as its corners — the values ``t0 · n / n0`` gives at those counts, without tabulating every
    count."""
    if n0 >= max_nodes or not flat:
        return ScalingCurve((0, max_nodes), (0.0, t0 * max_nodes / n0))
    return ScalingCurve((0, n0, max_nodes), (0.0, t0 * n0 / n0, t0 * n0 / n0))


def _probe(min_nodes: int, max_nodes: int, rate: float = None) -> ScalingCurve:
    rate = PROBE_RATE if rate is None else rate
    return ScalingCurve((0, min_nodes, max(max_nodes, min_nodes + 1)), (0.0, rate, rate))


def _amdahl(xs: list[float], ts: list[float], at: np.ndarray) -> np.ndarray:
    """Fit n/T = a + b·n (a, b ≥ 0) to the points (a job's few scales, in plain floats: numpy's per-call cost is
    most of a fit this small) and evaluate T at ``at``."""
    points = [(x, t) for x, t in zip(xs, ts) if t > 0]
    if not points:
        return np.zeros_like(at)
    y = [x / t for x, t in points]
    # Relative errors matter, not absolute ones: weight each row by 1/y.
    a, b = _nnls2([1.0 / yi for yi in y], [x / yi for (x, _), yi in zip(points, y)])
    if a + b <= 0:
        return sum(t for _, t in points) / sum(x for x, _ in points) * at
    if a > 0:
        return at / (a + b * at)
    return np.divide(at, b * at, out=np.zeros_like(at), where=at > 0)  # T(0) = 0, not 0/0


def _nnls2(u: list[float], v: list[float]) -> tuple[float, float]:
    """min ‖a·u + b·v − 1‖² over a, b ≥ 0, exactly: the unconstrained least squares where both are positive,
    else the better of the two one-variable fits (with two unknowns the optimum is inside or on one axis). Five
    sums instead of a general solver: JPA fits every job whose rates moved, a hundred in one decision."""
    uu, vv, uv = math.fsum(x * x for x in u), math.fsum(x * x for x in v), math.fsum(x * y for x, y in zip(u, v))
    u1, v1 = math.fsum(u), math.fsum(v)
    det = uu * vv - uv * uv
    if det > 1e-12 * uu * vv:
        a, b = (vv * u1 - uv * v1) / det, (uu * v1 - uv * u1) / det
        if a >= 0 and b >= 0:
            return a, b
    only_a = (max(u1 / uu, 0.0), 0.0) if uu > 0 else (0.0, 0.0)
    only_b = (0.0, max(v1 / vv, 0.0)) if vv > 0 else (0.0, 0.0)

    def residual(ab: tuple[float, float]) -> float:
        return math.fsum((ab[0] * x + ab[1] * y - 1.0) ** 2 for x, y in zip(u, v))

    return min(only_a, only_b, key=residual)
