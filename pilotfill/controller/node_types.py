"""A machine with several kinds of node: the controller's view of node types, and why each job runs where it does.

The config names the kinds (``[node_types.NAME]``: how the batch system
selects each, its ranks and GPUs per node); a pilot asks for one type and its
nodes are of that type. Here, for the controller:

* the node pool with each ready node's type, and hypothetical nodes per type
  (what pilots of each type could bring);
* each job's curves per type — given (``curves`` per type, or one ``curve``
  for every type) or learned: JPA per type (:meth:`Profiler.typed_curves`),
  where the job has not run predicted by the similarity policy from its model
  descriptor and the library of measured models (:mod:`pilotfill.allocator.similarity`);
* where a job runs and why, for users (``top``, ``status``) and the journal;
* the library: site libraries (read only) and the user's own, beside the run
  directory by default, to which every model measured here is added when its
  job ends — so the next campaign starts from what this one measured.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..allocator import Allocation, Profiler, ScalingCurve
from ..allocator.similarity import Descriptor, Library, LibraryError, Measured, Prediction, uninformed
from ..config import Config
from ..library_file import read_library, write_library
from ..lifecycle import JobStatus
from ..protocol import JobSpec, ProtocolError

log = logging.getLogger("pilotfill.controller")

LIBRARY_FILE = "models.json"
"""The user's library, beside the run directory (``runs/models.json``): it outlives the run, as checkpoints do."""


class NodeTypes:
    """Node types for one controller (inert on a machine with one kind of node: ``typed`` is False)."""

    def __init__(self, config: Config, run_dir: Path, profiler: Profiler):
        self.config = config
        self.profiler = profiler
        self.names: list[str] = [t.name for t in config.node_types]
        self.typed = bool(self.names)
        self.last_idle: dict[str, int] | None = None
        self._predictions: dict[str, tuple[Any, Prediction]] = {}  # job -> (its descriptor, the prediction)
        self._curves: dict[str, dict[str, ScalingCurve]] = {}  # job -> given curves per type
        self._placed: dict[str, dict[str, Any]] = {}  # job -> {node_type, why, since}
        sim = config.similarity
        self.library_path = Path(sim.library).expanduser() if sim.library else Path(run_dir).parent / LIBRARY_FILE
        self.library = Library()
        self._own = Library()
        if self.typed and sim.enabled:
            for path in sim.libraries:
                self._load(Path(path).expanduser())
            self._own = self._load(self.library_path)

    def _load(self, path: Path) -> Library:
        try:
            lib = read_library(path)
        except LibraryError as exc:  # a bad library must not stop the run: its models are not used
            log.error("similarity library not used: %s", exc)
            return Library()
        for entry in lib.entries:
            self.library.add(entry)
        return lib

    # ------------------------------------------------------------ the pool

    def of_nodes(self, world, names: Iterable[str]) -> str | None:
        """The type of a job's nodes (None: untyped, or nodes of several types)."""
        kinds = {world.nodes[n].node_type for n in names if n in world.nodes}
        return kinds.pop() if len(kinds) == 1 else None

    def pool(self, world, ready: tuple[str, ...], extra: Mapping[str, int]) -> tuple[tuple[str, ...], dict[str, str]]:
        """Ready nodes with their types, plus hypothetical nodes of each type (``+TYPE:i``)."""
        types = {}
        nodes = []
        for n in ready:
            t = world.nodes[n].node_type
            if t is not None:
                nodes.append(n)
                types[n] = t
        for t, k in extra.items():
            for i in range(max(0, k)):
                name = f"+{t}:{i}"
                nodes.append(name)
                types[name] = t
        return tuple(nodes), types

    @staticmethod
    def counts_by_type(answer: Allocation) -> dict[str, int]:
        out: dict[str, int] = {}
        for job, n in answer.counts.items():
            t = answer.node_type.get(job)
            if n and t is not None:
                out[t] = out.get(t, 0) + n
        return out

    # ------------------------------------------------------------ curves

    def version(self, world, job) -> tuple:
        """What a job's curves depend on beyond the profiler's observations (the allocator's view is remade when it
        changes)."""
        if not self.typed:
            return ()
        return (self.of_nodes(world, job.nodes), id(self._prediction(job)) if not self._given(job) else 0)

    def _given(self, job) -> dict[str, ScalingCurve] | None:
        spec = job.spec
        if not (spec.get("curves") or spec.get("curve")):
            return None
        cached = self._curves.get(job.id)
        if cached is None:
            if spec.get("curves"):
                cached = {t: ScalingCurve(tuple(c["nodes"]), tuple(c["samples_per_s"]))
                          for t, c in spec["curves"].items() if t in self.names}
            else:
                c = ScalingCurve(tuple(spec["curve"]["nodes"]), tuple(spec["curve"]["samples_per_s"]))
                cached = {t: c for t in self.names}
            self._curves[job.id] = cached
        return cached

    def _prediction(self, job) -> Prediction:
        """The similarity policy's prediction for the job's model (uninformed without a descriptor or a library)."""
        model = job.spec.get("model")
        cached = self._predictions.get(job.id)
        if cached is not None and cached[0] == model:
            return cached[1]
        hi = job.spec["max_nodes"]
        if model and self.config.similarity.enabled:
            try:
                prediction = self.library.predict(Descriptor.from_dict(model), self.names, hi)
            except LibraryError:
                prediction = uninformed(self.names, hi)
        else:
            prediction = uninformed(self.names, hi)
        self._predictions[job.id] = (model, prediction)
        return prediction

    def curves(self, world, job) -> tuple[dict[str, ScalingCurve], dict[str, ScalingCurve] | None]:
        """Confirmed and optimistic curves per type for the allocator (no optimistic curve when they are given)."""
        given = self._given(job)
        if given is not None:
            if not given:
                raise ValueError(f"job {job.id}: its curves are for node types this machine does not have "
                                 f"({sorted(job.spec['curves'])})")
            return given, None
        lo, hi = job.spec["min_nodes"], job.spec["max_nodes"]
        on = self.of_nodes(world, job.nodes) if job.status == JobStatus.RUNNING else None
        running = on if job.status == JobStatus.RUNNING and not self.profiler.measured(job.id, on) else None
        trying = (on, len(job.nodes)) if on is not None and running is None else None
        prediction = self._prediction(job)
        far = prediction.nearest < self.config.similarity.far
        return self.profiler.typed_curves(job.id, lo, hi, self.names, prediction, running, trying, far)

    @staticmethod
    def check_descriptor(model: Any) -> dict[str, Any]:
        try:
            return Descriptor.from_dict(model, "job.describe: model").to_dict()
        except LibraryError as exc:
            raise ProtocolError(str(exc)) from None

    # ------------------------------------------------------------ where jobs run, and why

    def start_spec(self, world, job, nodes: list[str]) -> JobSpec:
        """The spec the runtime starts the job with: the type's ranks and GPUs per node where the config sets them."""
        if not self.typed:
            return job.spec
        kind = self.config.node_type(self.of_nodes(world, nodes))
        if kind is None:
            return job.spec
        spec: JobSpec = {**job.spec}
        if kind.ranks_per_node > 0:
            spec["ranks_per_node"] = kind.ranks_per_node
        if kind.gpus_per_node >= 0:
            spec["gpus_per_node"] = kind.gpus_per_node
        return spec

    def placed(self, world, job, nodes: list[str], now: float) -> dict[str, Any]:
        """Record (and return, for the journal's event) the type a job was started on and why."""
        t = self.of_nodes(world, nodes) if self.typed else None
        if t is None:
            return {}
        why = self.why(world, job, t)
        self._placed[job.id] = {"node_type": t, "why": why, "since": now}
        return {"node_type": t, "why": why}

    def why(self, world, job, node_type: str) -> str:
        """Why ``job`` runs on ``node_type``, in one line."""
        given = self._given(job)
        rates = {}
        if given is not None:
            rates = {t: c.at(1) for t, c in given.items()}
            source = "its curves"
        else:
            measured = self.profiler.measured_types(job.id)
            if node_type in measured:
                scales = self.profiler.scales(job.id, node_type)
                n, r = max(scales.items())
                return f"measured here: {r:,.0f} samples/s on {n} node{'s' if n != 1 else ''}" + (
                    f" (also measured on {', '.join(t for t in measured if t != node_type)})"
                    if len(measured) > 1 else "")
            prediction = self._prediction(job)
            if not prediction.neighbours:
                return "no similar model measured: trying this type (free nodes)"
            rates = {t: math.exp(v) for t, v in prediction.log_speed.items()}
            source = prediction.why(node_type)
            return f"predicted: {source}"
        best = max(rates, key=rates.get) if rates else node_type
        if best == node_type:
            return f"{source}: fastest here"
        return f"{source}: {rates.get(node_type, 0) / rates[best]:.2f} of {best} here ({best} has no room)"

    def placement(self) -> dict[str, dict[str, Any]]:
        return {j: dict(p) for j, p in self._placed.items()}

    def placement_of(self, job_id: str) -> dict[str, Any]:
        p = self._placed.get(job_id)
        return {"node_type": p["node_type"], "why": p["why"]} if p else {}

    # ------------------------------------------------------------ the library

    def freeze(self) -> None:
        """Learn nothing more into the library (an evaluation on models held out from it)."""
        self._frozen = True

    def learned(self, job, status: str) -> None:
        """A job is over: if its model is described and it was measured on a type, the library learns it."""
        self._placed.pop(job.id, None)
        self._curves.pop(job.id, None)
        self._predictions.pop(job.id, None)
        if (not self.typed or not job.spec.get("model") or not self.config.similarity.enabled
                or getattr(self, "_frozen", False)):
            return
        lo, hi = job.spec["min_nodes"], job.spec["max_nodes"]
        curves = {}
        for t in self.profiler.measured_types(job.id):
            scales = self.profiler.scales(job.id, t)
            top = max(scales)
            c = self.profiler.confirmed(job.id, lo, max(hi, top), t)
            curves[t] = ScalingCurve.from_table([c.at(n) for n in range(top + 1)]) if top >= 1 else c
        if not curves:
            return
        entry = Measured(job.name, Descriptor.from_dict(job.spec["model"]), curves)
        self.library.add(entry)
        self._own.add(entry)
        try:
            write_library(self._own, self.library_path)
        except OSError as exc:
            log.error("similarity library %s not saved: %s", self.library_path, exc)
