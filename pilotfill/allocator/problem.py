"""The allocator's vocabulary: scaling curves, jobs, the node pool, a problem and its answer.

Everything here is an immutable dataclass validated on construction, so that a
bad curve or an impossible job fails where it is made, not deep inside a solve.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

DEFAULT_TYPE = "default"
"""Node type used when a machine has only one kind of node."""


class ProblemError(ValueError):
    """An allocation problem that cannot be posed (bad curve, bounds, or map)."""


@dataclass(frozen=True)
class ScalingCurve:
    """A job's rate (samples/s, or any metric) measured at a few node counts.

    Linear between points, as BFTrainer interpolates; constant past the last
    point. The first point must be at 0 nodes so that "not running" is part of
    the curve rather than a special case.
    """

    nodes: tuple[int, ...]
    values: tuple[float, ...]

    def __post_init__(self) -> None:
        nodes = tuple(int(n) for n in self.nodes)
        values = tuple(float(v) for v in self.values)
        object.__setattr__(self, "nodes", nodes)
        object.__setattr__(self, "values", values)
        if len(nodes) != len(values):
            raise ProblemError(f"curve has {len(nodes)} node counts but {len(values)} values")
        if len(nodes) < 2:
            raise ProblemError("curve needs at least two points (the first at 0 nodes)")
        if nodes[0] != 0:
            raise ProblemError(f"curve must start at 0 nodes, starts at {nodes[0]}")
        if any(b <= a for a, b in zip(nodes, nodes[1:])):
            raise ProblemError(f"curve node counts must increase strictly: {nodes}")
        if any(not math.isfinite(v) or v < 0 for v in values):
            raise ProblemError(f"curve values must be finite and non-negative: {values}")

    def at(self, n: float) -> float:
        """The rate at ``n`` nodes (linear interpolation, clamped past the ends; remembered for whole counts, read
        from the table up to the last point: JPA makes hundreds of curves in one decision, each read at a count or two
        and tabulated whole by the allocator — one interpolation of every count, the same numbers, not one per
        call)."""
        if isinstance(n, int):
            cache = self.__dict__.setdefault("_at", {})
            out = cache.get(n)
            if out is None:
                last = self.nodes[-1]
                tabulate = 0 <= n <= last <= 65_536  # a curve drawn to a million nodes is not tabulated for one read
                out = cache[n] = (float(self.table(last)[n]) if tabulate
                                  else float(np.interp(n, self.nodes, self.values)))
            return out
        return float(np.interp(n, self.nodes, self.values))

    def table(self, upto: int) -> np.ndarray:
        """Rates at 0, 1, …, ``upto`` nodes, as one read-only array (the solvers' input; computed once per size)."""
        cache = self.__dict__.setdefault("_tables", {})
        out = cache.get(upto)
        if out is None:
            dense = self.__dict__.get("_dense")  # a curve through every count (JPA's fits): its rates are the table
            if dense is not None and upto < len(dense):
                out = dense[: upto + 1]
            elif dense is not None:  # constant past the last point
                out = np.concatenate([dense, np.full(upto + 1 - len(dense), dense[-1])])
            else:
                out = np.interp(np.arange(upto + 1), self.nodes, self.values)
            out.flags.writeable = False
            cache[upto] = out
        return out

    def best_per_node(self, upto: int) -> float:
        """The most one node earns at 1 … ``upto`` nodes: max of rate(n)/n (remembered: how a queue of thousands is
        ranked in every decision, while a curve changes only when its job reports)."""
        cache = self.__dict__.setdefault("_per_node", {})
        out = cache.get(upto)
        if out is None:
            out = cache[upto] = float((self.table(upto)[1:] / np.arange(1, upto + 1)).max()) if upto >= 1 else 0.0
        return out

    @classmethod
    def from_table(cls, rates: Iterable[float]) -> ScalingCurve:
        """A curve through the rates at 0, 1, 2, … nodes, keeping only its corners.

        Checked as one array (JPA makes hundreds of curves in one decision): counts from 0 up, rates finite and
        non-negative; a table that is not is checked point by point, for the message."""
        r = np.asarray(rates, dtype=float)
        if r.ndim != 1 or len(r) < 2 or not np.isfinite(r).all() or (r < 0).any():
            values = [float(v) for v in np.ravel(r)]
            return cls(*compress_linear(list(range(len(values))), values))
        keep = _corners(np.arange(len(r), dtype=float), r)
        curve = object.__new__(cls)
        object.__setattr__(curve, "nodes", tuple(np.flatnonzero(keep).tolist()))
        object.__setattr__(curve, "values", tuple(r[keep].tolist()))
        return curve

    @classmethod
    def dense(cls, rates: np.ndarray) -> ScalingCurve:
        """A curve through the rates at 0, 1, 2, … nodes, every count a point: a fitted curve bends at every count, so
        looking for the points that are not corners (:meth:`from_table`) costs more than it saves — and JPA refits
        a hundred curves in one decision at machine scale."""
        r = np.asarray(rates, dtype=float)
        if r.ndim != 1 or len(r) < 2 or not r.min() >= 0 or not math.isfinite(r.sum()):
            return cls.from_table(r)  # checked point by point, for the message
        curve = object.__new__(cls)
        object.__setattr__(curve, "nodes", tuple(range(len(r))))
        object.__setattr__(curve, "values", tuple(r.tolist()))
        dense = r.copy()
        dense.flags.writeable = False
        curve.__dict__["_dense"] = dense  # what table() reads: the rates at every count, no interpolation
        return curve

    @classmethod
    def dense_rows(cls, rates: np.ndarray) -> list[ScalingCurve]:
        """:meth:`dense` for every row of a matrix, checked as one array (JPA fits hundreds of curves at once)."""
        r = np.asarray(rates, dtype=float)
        if r.ndim != 2 or r.shape[1] < 2 or not (r.size == 0 or (r.min() >= 0 and math.isfinite(r.sum()))):
            return [cls.dense(row) for row in r]  # checked row by row, for the message
        nodes = tuple(range(r.shape[1]))
        rows = r.copy()
        rows.flags.writeable = False
        out = []
        for values, row in zip(r.tolist(), rows):
            curve = object.__new__(cls)
            object.__setattr__(curve, "nodes", nodes)
            object.__setattr__(curve, "values", tuple(values))
            curve.__dict__["_dense"] = row  # what table() reads (see dense)
            out.append(curve)
        return out

    def speedup(self) -> ScalingCurve:
        """This curve divided by its rate at the first positive count (BFTrainer's speedup metric)."""
        base = next((v for n, v in zip(self.nodes, self.values) if n > 0 and v > 0), 0.0)
        if base <= 0:
            raise ProblemError("speedup of a curve with no positive rate")
        return ScalingCurve(self.nodes, tuple(v / base for v in self.values))


def compress_linear(xs: list[int], ys: list[float],
                    rel_tol: float = 1e-12) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """Drop interior points that lie on the line through their neighbours (vectorised: JPA makes curves often)."""
    if len(xs) <= 2:
        return tuple(int(x) for x in xs), tuple(float(y) for y in ys)
    y = np.asarray(ys, dtype=float)
    keep = _corners(np.asarray(xs, dtype=float), y, rel_tol)
    return tuple(int(v) for v in np.asarray(xs)[keep]), tuple(float(v) for v in y[keep])


def _corners(x: np.ndarray, y: np.ndarray, rel_tol: float = 1e-12) -> np.ndarray:
    """Which points are corners: the ends, and every interior point off the line through its neighbours."""
    if len(x) <= 2:
        return np.ones(len(x), dtype=bool)
    predicted = y[:-2] + (y[2:] - y[:-2]) * (x[1:-1] - x[:-2]) / (x[2:] - x[:-2])
    scale = np.maximum(np.maximum(1.0, np.abs(y[1:-1])), np.maximum(np.abs(y[:-2]), np.abs(y[2:])))
    return np.concatenate([[True], np.abs(predicted - y[1:-1]) > rel_tol * scale, [True]])


def _per_type(curves: ScalingCurve | Mapping[str, ScalingCurve] | None) -> dict[str, ScalingCurve] | None:
    if curves is None:
        return None
    if isinstance(curves, ScalingCurve):
        return {DEFAULT_TYPE: curves}
    out = dict(curves)
    for t, c in out.items():
        if not isinstance(c, ScalingCurve):
            raise ProblemError(f"curve for node type {t!r} is a {type(c).__name__}, not a ScalingCurve")
    return out


@dataclass(frozen=True)
class Job:
    """A malleable training job as the allocator sees it.

    ``throughput`` is samples/s per node count, one curve per node type the job
    can run on (a plain curve means the default type); a job runs on one type at
    a time. ``objective``, when given, is what the allocator maximises instead
    of throughput (BFTrainer's administrator-defined metric, e.g. speedup);
    progress is still counted in samples. Rescale costs are seconds of progress
    lost at the job's current rate; ``restart_cost_s`` is what stopping a
    running job costs on top of a shrink (work since its last commit, and
    starting it again later), so a job is stopped only when that pays.
    ``explore``, when given, is an optimistic curve (the profiler's upper
    confidence bound): the job may grow along it, but only onto nodes that no
    job values by the confirmed curves — exploring never evicts anyone.
    ``group`` is what the share objective shares the machine among (:mod:`.shares`). A ``due`` job has waited past
    the bound admission by worth gives: it runs first, where it fits (:mod:`.due`).
    """

    id: str
    min_nodes: int
    max_nodes: int
    throughput: Mapping[str, ScalingCurve]
    scale_up_cost_s: float = 0.0
    scale_down_cost_s: float = 0.0
    remaining_samples: float = math.inf
    weight: float = 1.0
    objective: Mapping[str, ScalingCurve] | None = None
    explore: Mapping[str, ScalingCurve] | None = None
    restart_cost_s: float = 0.0
    group: str = ""  # who it shares the machine as (a campaign, a user, a model family): the share objective's unit
    due: bool = False  # waited past the bound: run first, where it fits (the controller says which, the oldest first)

    def __post_init__(self) -> None:
        object.__setattr__(self, "throughput", _per_type(self.throughput))
        object.__setattr__(self, "objective", _per_type(self.objective))
        object.__setattr__(self, "explore", _per_type(self.explore))
        where = f"job {self.id!r}"
        if not self.throughput:
            raise ProblemError(f"{where}: needs a throughput curve for at least one node type")
        if int(self.min_nodes) != self.min_nodes or int(self.max_nodes) != self.max_nodes:
            raise ProblemError(f"{where}: node bounds must be integers")
        if self.min_nodes < 1:
            raise ProblemError(f"{where}: min_nodes must be at least 1, got {self.min_nodes}")
        if self.min_nodes > self.max_nodes:
            raise ProblemError(f"{where}: min_nodes {self.min_nodes} > max_nodes {self.max_nodes}")
        for name in ("scale_up_cost_s", "scale_down_cost_s", "restart_cost_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ProblemError(f"{where}: {name} must be finite and >= 0, got {value}")
        if not (self.remaining_samples >= 0):
            raise ProblemError(f"{where}: remaining_samples must be >= 0, got {self.remaining_samples}")
        if not math.isfinite(self.weight) or self.weight <= 0:
            raise ProblemError(f"{where}: weight must be finite and > 0, got {self.weight}")
        if self.objective is not None and set(self.objective) != set(self.throughput):
            raise ProblemError(f"{where}: objective curves must cover the same node types as throughput")
        if self.explore is not None and not set(self.explore) <= set(self.throughput):
            raise ProblemError(f"{where}: explore curves must be for node types the job can use")

    def with_remaining(self, remaining_samples: float) -> Job:
        """This job with only its work left changed (a running job's, every decision): what was checked is not
        checked again."""
        if not (remaining_samples >= 0):
            raise ProblemError(f"job {self.id!r}: remaining_samples must be >= 0, got {remaining_samples}")
        out = object.__new__(Job)
        out.__dict__.update(self.__dict__)
        object.__setattr__(out, "remaining_samples", remaining_samples)
        return out

    def as_due(self) -> Job:
        """This job, due (:mod:`.due`): a copy, as :meth:`with_remaining` makes one."""
        out = object.__new__(Job)
        out.__dict__.update(self.__dict__)
        object.__setattr__(out, "due", True)
        return out

    @property
    def node_types(self) -> tuple[str, ...]:
        return tuple(self.throughput)

    def metric(self, node_type: str) -> ScalingCurve:
        """The curve the allocator maximises on ``node_type``."""
        return (self.objective or self.throughput)[node_type]


@dataclass(frozen=True)
class NodePool:
    """The nodes available now, in a fixed order, each of one type."""

    nodes: tuple[str, ...]
    types: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))
        if len(set(self.nodes)) != len(self.nodes):
            raise ProblemError("node pool lists a node twice")
        unknown = set(self.types) - set(self.nodes)
        if unknown:
            raise ProblemError(f"types given for nodes not in the pool: {sorted(unknown)[:5]}")

    def type_of(self, node: str) -> str:
        return self.types.get(node, DEFAULT_TYPE)

    @cached_property
    def members(self) -> frozenset[str]:
        """The pool's nodes as a set (made once: every problem checks the nodes its jobs hold against it)."""
        return frozenset(self.nodes)

    def by_type(self) -> dict[str, list[str]]:
        """Nodes grouped by type, each group in pool order (a fresh dict of fresh lists: callers may change them)."""
        return {t: list(ns) for t, ns in self._groups.items()}

    @cached_property
    def _groups(self) -> dict[str, tuple[str, ...]]:
        if not self.types:
            return {DEFAULT_TYPE: self.nodes} if self.nodes else {}
        groups: dict[str, list[str]] = {}
        for n in self.nodes:
            groups.setdefault(self.type_of(n), []).append(n)
        return {t: tuple(ns) for t, ns in groups.items()}


@dataclass(frozen=True)
class Problem:
    """One allocation decision: jobs, the nodes available, who holds what now, and the horizon."""

    jobs: tuple[Job, ...]
    pool: NodePool
    current: Mapping[str, frozenset[str]] = field(default_factory=dict)
    t_fwd: float = 10.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "jobs", tuple(self.jobs))
        ids = [j.id for j in self.jobs]
        known = set(ids)
        if len(known) != len(ids):
            raise ProblemError("two jobs share an id")
        if not math.isfinite(self.t_fwd) or self.t_fwd <= 0:
            raise ProblemError(f"t_fwd must be finite and > 0, got {self.t_fwd}")
        # Checked all at once (a whole-machine decision holds a thousand jobs' nodes); job by job only to say which.
        held = [n for nodes in self.current.values() for n in nodes]
        distinct = set(held)
        if not known.issuperset(self.current) or len(distinct) != len(held) or not distinct <= self.pool.members:
            self._say_what_is_wrong(known)

    def _say_what_is_wrong(self, known: set[str]) -> None:
        """The first fault of the current map, named (:meth:`__post_init__` found one, or a job's list of its nodes
        names one twice: not a fault)."""
        pool = self.pool.members
        seen: set[str] = set()
        for job_id, held in self.current.items():
            if job_id not in known:
                raise ProblemError(f"current map names unknown job {job_id!r}")
            missing = set(held) - pool
            if missing:
                raise ProblemError(f"job {job_id!r} holds nodes not in the pool: {sorted(missing)[:5]}")
            if seen & set(held):
                raise ProblemError(f"a node is held by two jobs: {sorted(seen & set(held))[:5]}")
            seen |= set(held)

    def held_by_type(self, job: Job) -> dict[str, int]:
        """How many nodes of each type ``job`` holds now (counted once per problem: every stage of a decision asks,
        for every job; read-only)."""
        known = self.__dict__.get("_held_by_type")
        if known is None:  # every job's at once
            if not self.pool.types:  # one kind of node: no per-node lookups
                known = {job_id: {DEFAULT_TYPE: len(held)} for job_id, held in self.current.items() if held}
            else:
                known = {}
                for job_id, held in self.current.items():
                    counts: dict[str, int] = {}
                    for n in held:
                        t = self.pool.type_of(n)
                        counts[t] = counts.get(t, 0) + 1
                    if counts:
                        known[job_id] = counts
            self.__dict__["_held_by_type"] = known
        counts = known.get(job.id)
        return counts if counts is not None else {}

    @cached_property
    def held_counts(self) -> list[dict[str, int]]:
        """:meth:`held_by_type` of every job, in job order (read once per stage, not once per job and stage)."""
        return [self.held_by_type(job) for job in self.jobs]


@dataclass(frozen=True)
class Allocation:
    """The allocator's answer: a node count per job and the concrete nodes.

    ``assignment`` is realised without migration: a job that shrinks keeps a
    subset of its nodes, a job that grows keeps all of its nodes and adds free
    ones. ``objective`` is the model's value (T_fwd·metric minus rescale loss).
    """

    counts: Mapping[str, int]
    node_type: Mapping[str, str | None]
    assignment: Mapping[str, tuple[str, ...]]
    objective: float
    method: str
    optimal: bool
    note: str = ""

    def joined(self, other: Allocation) -> Allocation:
        """This answer and ``other`` — other jobs, on nodes this one leaves free — as one (the objectives add
        up)."""
        assignment = dict(self.assignment)
        assignment.update(other.assignment)
        return Allocation(counts={**self.counts, **other.counts}, node_type={**self.node_type, **other.node_type},
                          assignment=assignment, objective=self.objective + other.objective, method=self.method,
                          optimal=self.optimal and other.optimal, note=self.note or other.note)

    def added(self, current: Mapping[str, frozenset[str]]) -> dict[str, tuple[str, ...]]:
        """Nodes each job gains relative to ``current``."""
        return {
            j: tuple(n for n in nodes if n not in current.get(j, frozenset()))
            for j, nodes in self.assignment.items()
            if any(n not in current.get(j, frozenset()) for n in nodes)
        }

    def removed(self, current: Mapping[str, frozenset[str]]) -> dict[str, tuple[str, ...]]:
        """Nodes each job gives up relative to ``current``."""
        out = {}
        for j, held in current.items():
            keep = set(self.assignment.get(j, ()))
            gone = tuple(sorted(n for n in held if n not in keep))
            if gone:
                out[j] = gone
        return out
