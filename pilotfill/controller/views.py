"""The allocator's views of the controller's jobs, made anew only when what they rest on changed.

A decision at machine scale weighs a thousand running jobs and thousands of waiting ones; making each one's view
(its curves, given or learned by JPA, bounds, work left and costs) in every decision was most of its time. Here each
view is kept with what it was made from (:meth:`AllocatorViews.inputs`) and made again only when that moved; a
running job's work left, which changes at every report, is copied in. Waiting jobs the allocator cannot tell apart
share a *kind* (a small number), so that a sweep's thousand copies are weighed a few at a time
(:class:`.waiting.WaitingJobs` asks :meth:`~AllocatorViews.waiting_kind`, ``waiting_worth``, ``waiting_traits`` and
``waiting_version``).
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Hashable
from typing import Any

from ..allocator import Job as AllocJob
from ..allocator import ProblemError, Profiler, ScalingCurve
from ..allocator.values import worth_per_node
from ..elastic.adaptive import Adaptive, efficiency
from ..lifecycle import JobStatus
from .node_types import NodeTypes
from .waiting import HOLDS_NODES, LIKE_NO_OTHER
from .world import Job, World


class AllocatorViews:
    """The allocator's view of each job, cached per job; forgotten when the job ends (:meth:`forget`)."""

    def __init__(self, world: World, profiler: Profiler, types: NodeTypes, priors: bool = False,
                 ranks_per_node: int = 1):
        """``priors``: a job that declares its model by name (``model_name``) is valued, before it reports, by what
        its model's other jobs reported (:meth:`.Profiler.declare`), and waiting jobs of different models are not
        alike; admission by worth uses it (ranking the never-run jobs by their models), arrival admission does not."""
        self.world = world
        self._ranks_per_node = ranks_per_node  # the runtime's, where a job's spec names none (an adaptive batch's size)
        self.profiler = profiler
        self.types = types
        self.priors = priors and not types.typed  # on a typed machine the similarity policy predicts from descriptors
        self._made: dict[str, tuple[tuple, AllocJob]] = {}  # job -> (what its view was made from, the allocator's view)
        self._curves: dict[str, ScalingCurve] = {}  # job (and job/objective) -> its given curve, parsed once
        # job -> (its spec, the number of what in it tells the job apart from other waiting jobs)
        self._kinds: dict[str, tuple[dict, int]] = {}
        self._chains: dict[str, tuple[dict, int]] = {}  # job -> (its spec, the number of its chain: see chain)
        # what tells waiting jobs apart -> its number (a small key: hashed many times per decision)
        self.kind_ids: dict[Hashable, int] = {}
        # the same less work and costs (see chain) -> its number, from the same count
        self.chain_ids: dict[Hashable, int] = {}
        self._kind_numbers = itertools.count()

    def ranks_per_node(self, spec: dict[str, Any]) -> int:
        return int(spec.get("ranks_per_node") or self._ranks_per_node)

    def forget(self, job_id: str) -> None:
        """The job ended: nothing of it is kept."""
        self._curves.pop(job_id, None)
        self._curves.pop(job_id + "/objective", None)
        self._made.pop(job_id, None)
        self._kinds.pop(job_id, None)
        self._chains.pop(job_id, None)

    def declare(self, job: Job) -> None:
        """JPA is told the job's model (with ``priors``, for a job whose curve is learned)."""
        if self.priors and not job.spec.get("curve"):
            self.profiler.declare(job.id, job.spec.get("model_name"))

    def waiting_kind(self, job: Job) -> int:
        """A waiting job's kind (:class:`.WaitingJobs`): :meth:`kind`, or what sets it apart from every other."""
        self.declare(job)
        kind = self.kind(job)
        if kind is None:
            kind = HOLDS_NODES if job.nodes else LIKE_NO_OTHER
        return kind

    def waiting_worth(self, job: Job) -> tuple[float, float]:
        """What a node would earn a waiting job (:func:`..allocator.values.worth_per_node`): how a long queue is
        ranked."""
        try:
            return worth_per_node(self.view(job))
        except (ProblemError, KeyError, TypeError, ValueError):  # weighed first: the problem fails it with the reason
            return (math.inf, math.inf)

    def waiting_traits(self, job: Job) -> tuple[bool, float] | None:
        """What the pilots' question asks of a waiting job (:meth:`.WaitingJobs.traits`): would it gain from one node
        alone, and its rescale cost in seconds (None: the allocator cannot use it)."""
        try:
            view = self.view(job)
            return (bool(view.metric(next(iter(view.throughput))).at(1) > 0),
                    view.scale_up_cost_s + view.scale_down_cost_s)
        except (ProblemError, KeyError, TypeError, ValueError):
            return None

    def waiting_version(self, job: Job) -> object:
        """What a waiting job's description rests on beyond the job itself: JPA's version of it (and, on a machine
        with several kinds of node, what the types say of it)."""
        if self.types.typed:
            return (self.profiler.versions.get(job.id, 0), self.types.version(self.world, job))
        return self.profiler.versions.get(job.id, 0)

    def kind(self, job: Job) -> int | None:
        """A key equal for waiting jobs the allocator cannot tell apart, or None for a job like no other (running,
        holding nodes, with progress, or measured by JPA)."""
        spec = job.spec
        if (job.status == JobStatus.RUNNING or job.nodes or job.progress > 0
                or (not spec.get("curve") and self.profiler.measured(job.id))):
            return None
        # made once per spec (thousands wait on a saturated machine, weighed every decision)
        known = self._kinds.get(job.id)
        if known is None or known[0] is not spec:
            kind = self.spec_kind(spec, self.priors)
            number = self.kind_ids.get(kind)
            if number is None:
                number = self.kind_ids[kind] = next(self._kind_numbers)
            known = self._kinds[job.id] = (spec, number)
        return known[1]

    def chain(self, job: Job) -> int | None:
        """A number equal for the waiting jobs the allocator tells apart only by their work left (None where
        :meth:`kind` is None): one that holds no nodes is worth the same on every count but that its work may end
        sooner — its costs charge nothing until it runs — so of two such jobs the one with more work left is worth
        as much or more on every count (admission by worth weighs a chain's jobs a few at a time, the most work
        first)."""
        if self.kind(job) is None:
            return None
        spec = job.spec
        known = self._chains.get(job.id)
        if known is None or known[0] is not spec:
            key = self.spec_kind({**spec, "total_samples": None, "scale_up_cost_s": 0.0, "scale_down_cost_s": 0.0,
                                  "restart_cost_s": 0.0}, self.priors)
            number = self.chain_ids.get(key)
            if number is None:
                number = self.chain_ids[key] = next(self._kind_numbers)
            known = self._chains[job.id] = (spec, number)
        return known[1]

    def forget_kinds(self) -> set[int] | None:
        """Kinds (and chains) no waiting job has any more are forgotten; returns the kinds still in use when some were
        (the solver forgets what it remembered of the others), else None."""
        used = {number for _, number in self._kinds.values()} | {number for _, number in self._chains.values()}
        if len(used) < len(self.kind_ids) + len(self.chain_ids):
            self.kind_ids = {kind: number for kind, number in self.kind_ids.items() if number in used}
            self.chain_ids = {key: number for key, number in self.chain_ids.items() if number in used}
            return used
        return None

    @staticmethod
    def spec_kind(spec: dict[str, Any], priors: bool = False) -> Hashable:
        """Everything in a spec the allocator's view of a waiting job is made from: its curve (or one per node type),
        objective, model (what the similarity policy predicts from on a machine of several kinds of node), bounds,
        work, weight, costs and group (the share objective's unit); with ``priors``, its model's name too."""
        curve = (tuple(spec["curve"]["nodes"]), tuple(spec["curve"]["samples_per_s"])) if spec.get("curve") else None
        curves = (tuple(sorted((t, tuple(c["nodes"]), tuple(c["samples_per_s"])) for t, c in spec["curves"].items()))
                  if spec.get("curves") else None)
        objective = ((tuple(spec["objective"]["nodes"]), tuple(spec["objective"]["values"]))
                     if spec.get("objective") else None)
        model = json.dumps(spec["model"], sort_keys=True) if spec.get("model") else None
        adaptive = json.dumps(spec["adaptive"], sort_keys=True) if spec.get("adaptive") else None
        return (curve, curves, objective, model, spec["min_nodes"], spec["max_nodes"], spec.get("total_samples"),
                spec["weight"], spec["scale_up_cost_s"], spec["scale_down_cost_s"], spec.get("restart_cost_s", 0.0),
                bool(spec.get("costs_known")), spec.get("group", ""), adaptive,
                *((spec.get("model_name"),) if priors else ()))

    def prepare(self, jobs: list[Job], made_of: list[tuple] | None = None) -> None:
        """Have JPA fit, all at once, the curves of the jobs whose views are to be made anew
        (:meth:`.Profiler.prepare`): after a decision that resized hundreds of jobs, each has reported at a new scale.
        ``made_of``: each job's :meth:`inputs`, where the caller has them."""
        if self.types.typed:
            return  # per node type, with predictions: made one by one (:mod:`.types`)
        if made_of is None:
            made_of = [self.inputs(job) for job in jobs]
        cached = self._made.get
        stale = []
        for job, inputs in zip(jobs, made_of):
            if not job.spec.get("curve"):
                view = cached(job.id)
                if view is None or view[0] != inputs:
                    stale.append((job.id, job.spec["max_nodes"]))
        if len(stale) > 1:
            self.profiler.prepare(stale)

    def inputs(self, job: Job) -> tuple:
        """What a job's view is made from, besides its work left: it is made anew when this changes."""
        return (job.status, len(job.nodes), self.profiler.versions.get(job.id, 0),
                self.types.version(self.world, job) if self.types.typed else (), _noise_bucket(job.noise_scale))

    def view(self, job: Job, inputs: tuple | None = None) -> AllocJob:
        """The allocator's view of a job: its curves (given, or JPA's), bounds, work left and costs (given or
        measured). Made anew only when its curves or costs changed (``inputs``: its :meth:`inputs`, where the
        caller has them); a running job's work left changes every report and is only copied in."""
        spec = job.spec
        total = spec.get("total_samples")
        remaining = max(total - job.progress, 0.0) if total else math.inf
        # Asked of every open job in every decision (thousands on a saturated machine): the check is kept cheap.
        if inputs is None:
            inputs = self.inputs(job)
        cached = self._made.get(job.id)
        if cached is not None and cached[0] == inputs:
            made = cached[1]
            if made.remaining_samples != remaining:
                made = made.with_remaining(remaining)
                self._made[job.id] = (inputs, made)
            return made
        lo, hi = spec["min_nodes"], spec["max_nodes"]
        explore = None
        self.declare(job)  # declared when it first waited; again here for a job restored running
        if self.types.typed:
            curve, explore = self.types.curves(self.world, job)
        elif spec.get("curve"):
            curve = self._curves.get(job.id)
            if curve is None:
                curve = self._curves[job.id] = ScalingCurve(tuple(spec["curve"]["nodes"]),
                                                            tuple(spec["curve"]["samples_per_s"]))
        else:
            explore = self.profiler.curve(job.id, lo, hi)
            curve = self.profiler.confirmed(job.id, lo, hi,
                                            trying=len(job.nodes) if job.status == JobStatus.RUNNING else 0)
            if job.status == JobStatus.RUNNING and not self.profiler.measured(job.id):
                # started to be measured: it keeps its nodes until it is (a flat curve: it does not grow)
                curve = explore
        objective = None
        if spec.get("adaptive") and not self.types.typed:
            objective = adaptive_objective(curve, Adaptive.from_spec(spec["adaptive"]), self.ranks_per_node(spec),
                                           job.noise_scale)
        if spec.get("objective"):
            objective = self._curves.get(job.id + "/objective")
            if objective is None:
                objective = self._curves[job.id + "/objective"] = ScalingCurve(tuple(spec["objective"]["nodes"]),
                                                                               tuple(spec["objective"]["values"]))
            if self.types.typed:
                objective = {t: objective for t in curve}
        up, down, restart = spec["scale_up_cost_s"], spec["scale_down_cost_s"], spec.get("restart_cost_s", 0.0)
        # measured from the job's own starts, resizes and commits; the spec's until measured
        if not spec.get("costs_known"):
            jpa = self.profiler
            up, down, restart = (jpa.cost(job.id, "up", up), jpa.cost(job.id, "down", down),
                                 jpa.restart_cost(job.id, restart))
        made = AllocJob(job.id, lo, hi, curve, up, down, remaining, spec["weight"], objective=objective,
                        explore=explore, restart_cost_s=restart, group=spec.get("group", ""))
        self._made[job.id] = (inputs, made)
        return made


def _noise_bucket(noise_scale: float | None) -> int | None:
    """A noise scale to within a tenth of a factor of two: what a job's view is made anew for (it moves every step)."""
    return None if noise_scale is None or noise_scale <= 0 else round(10 * math.log2(noise_scale))


def adaptive_objective(curve: ScalingCurve, adaptive: Adaptive, ranks_per_node: int,
                       noise_scale: float | None) -> ScalingCurve:
    """An adaptive batch's value per node count: samples/s times the statistical efficiency of the batch it takes there
    (:func:`..elastic.adaptive.efficiency`): a bigger batch is worth less per sample."""
    values = [curve.at(n) * efficiency(adaptive.batch(n * ranks_per_node), adaptive.base_batch, noise_scale)
              if n else 0.0 for n in curve.nodes]
    return ScalingCurve(curve.nodes, tuple(values))


__all__ = ["AllocatorViews", "adaptive_objective"]
