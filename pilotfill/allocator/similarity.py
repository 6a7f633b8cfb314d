"""The model-similarity policy: a new job's curve on each node type, predicted from the models most like it.

Before a job has run on a node type nobody knows its rate there, and which
type suits a model varies a lot (a V100 is several times a K80 for one model
and barely faster for another). Thanapol et al. (ACIIDS 2023) place each
model on the GPU type that suits it by its similarity to models already
measured. Here that is a prediction the allocator uses until the job's own
reports replace it (:mod:`.profiler`):

* a :class:`Descriptor` says what a model is: parameters, multiply-accumulates
  per sample (forward pass, torchvision's "GFLOPS" convention), depth, batch
  size and its layer mix (the share of parameters in convolutions, dense
  layers, recurrent cells, attention, embeddings, normalisation). pilotfill
  computes it from the model itself (:mod:`pilotfill.describe`), or the
  decorator declares it where the code cannot be inspected;
* :func:`similarity` compares two descriptors on what both know: a weighted
  distance of logarithms (sizes, depth, batch size) and of the layer mixes,
  turned into a similarity in (0, 1];
* a :class:`Library` of measured models (curves per node type) predicts a
  model's curves: each type's speed relative to the others and the shape of
  its scaling from the nearest models, weighted by similarity, the level from
  their rates (scaled by FLOPs where both are known) — and how sure it is: the
  neighbours' disagreement plus what their distance leaves unknown. A model
  like nothing measured gets wide bounds, and the profiler measures instead of
  trusting.

The library is a JSON file that persists across campaigns; a site can ship one
(the config names them) and pilotfill adds every model it measured.

Pure: descriptors and curves in, predictions out; the library's file is read
and written by :mod:`pilotfill.library_file`, as a document (:meth:`Library.from_document`,
:meth:`Library.to_document`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .problem import ProblemError, ScalingCurve

LAYER_KINDS = ("conv", "linear", "recurrent", "attention", "embedding", "norm", "other")
"""The layer mix's kinds: each a share of the model's parameters (see :mod:`pilotfill.describe`)."""

WEIGHTS = {"parameters": 1.0, "flops_per_sample": 1.0, "layers": 0.5, "batch_size": 0.5, "mix": 2.0}
"""How much each feature counts in the distance (log10 for sizes, log2 for depth and batch size, L1/2 for mixes)."""
SCALE = 1.0
"""Distance at which similarity is 1/e."""
PRIOR_SPREAD = math.log(4.0)
"""What nothing measured leaves open: a type's speed relative to another within a factor of 4 either way (1 σ)."""
NEIGHBOURS = 4
"""Models a prediction is made from (the most similar, and any as similar as the last of them)..."""
NEAR = 0.5
"""...of those at least this similar relative to the most similar; each weighted by its similarity squared."""
FORMAT = 1


class LibraryError(ValueError):
    """A library file or a descriptor that cannot be used; ``str()`` says where."""


def _positive(value: Any, name: str) -> float | None:
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise LibraryError(f"{name} must be a positive number, got {value!r}")
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise LibraryError(f"{name} must be a positive number, got {value!r}") from None
    if not math.isfinite(x) or x <= 0:
        raise LibraryError(f"{name} must be a positive finite number, got {value!r}")
    return x


@dataclass(frozen=True)
class Descriptor:
    """What a model is, as far as known (every field may be missing)."""

    parameters: float | None = None
    flops_per_sample: float | None = None  # multiply-accumulates of one sample's forward pass
    layers: float | None = None
    batch_size: float | None = None  # per rank
    mix: Mapping[str, float] = field(default_factory=dict)  # share of parameters per layer kind (sums to 1)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "model descriptor") -> Descriptor:
        """From a JSON-like mapping (the decorator's ``model=``, a job spec, a library entry); checked."""
        if not isinstance(data, Mapping):
            raise LibraryError(f"{where}: must be a table of parameters, flops_per_sample, layers, batch_size, mix")
        known = {"parameters", "flops_per_sample", "layers", "batch_size", "mix"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise LibraryError(f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})")
        mix_raw = data.get("mix") or {}
        if not isinstance(mix_raw, Mapping):
            raise LibraryError(f"{where}: mix must be a table of layer kind -> share")
        mix = {}
        for kind, share in mix_raw.items():
            if kind not in LAYER_KINDS:
                raise LibraryError(f"{where}: mix: unknown layer kind {kind!r} (known: {', '.join(LAYER_KINDS)})")
            if isinstance(share, bool) or not isinstance(share, (int, float)) or not math.isfinite(share) or share < 0:
                raise LibraryError(f"{where}: mix: {kind} must be a share >= 0, got {share!r}")
            mix[kind] = float(share)
        total = sum(mix.values())
        if mix and total <= 0:
            raise LibraryError(f"{where}: mix has no positive share")
        return cls(
            _positive(data.get("parameters"), f"{where}: parameters"),
            _positive(data.get("flops_per_sample"), f"{where}: flops_per_sample"),
            _positive(data.get("layers"), f"{where}: layers"),
            _positive(data.get("batch_size"), f"{where}: batch_size"),
            {k: v / total for k, v in mix.items()} if mix else {},
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: getattr(self, k) for k in ("parameters", "flops_per_sample", "layers", "batch_size")
                               if getattr(self, k) is not None}
        if self.mix:
            out["mix"] = dict(self.mix)
        return out

    @property
    def empty(self) -> bool:
        return not self.to_dict()


def _features(d: Descriptor) -> dict[str, float]:
    out = {}
    if d.parameters:
        out["parameters"] = math.log10(d.parameters)
    if d.flops_per_sample:
        out["flops_per_sample"] = math.log10(d.flops_per_sample)
    if d.layers:
        out["layers"] = math.log2(d.layers)
    if d.batch_size:
        out["batch_size"] = math.log2(d.batch_size)
    return out


def distance(a: Descriptor, b: Descriptor) -> float | None:
    """Weighted RMS distance over what both descriptors know (None: nothing in common)."""
    fa, fb = _features(a), _features(b)
    total = weight = 0.0
    for key in fa.keys() & fb.keys():
        total += WEIGHTS[key] * (fa[key] - fb[key]) ** 2
        weight += WEIGHTS[key]
    if a.mix and b.mix:
        l1 = sum(abs(a.mix.get(k, 0.0) - b.mix.get(k, 0.0)) for k in LAYER_KINDS) / 2  # 0: same mix, 1: disjoint
        total += WEIGHTS["mix"] * (2.0 * l1) ** 2
        weight += WEIGHTS["mix"]
    if weight == 0:
        return None
    return math.sqrt(total / weight)


def similarity(a: Descriptor, b: Descriptor) -> float:
    """In (0, 1]: 1 for the same descriptor; small for models with nothing in common or far apart."""
    d = distance(a, b)
    if d is None:
        return math.exp(-3.0)  # nothing to compare: as unlike as models get
    # Few features in common say less: shrink toward "unlike" by how much of the descriptor was compared.
    shared = len(_features(a).keys() & _features(b).keys()) + (1 if a.mix and b.mix else 0)
    return math.exp(-d / SCALE) * min(1.0, 0.4 + 0.2 * shared)


@dataclass(frozen=True)
class Measured:
    """A library entry: a model's descriptor and its measured curve on each node type."""

    model: str
    descriptor: Descriptor
    curves: Mapping[str, ScalingCurve]
    family: str = ""  # models of one family share this (leave-one-family-out evaluations)

    def rate_at_one(self, node_type: str) -> float | None:
        c = self.curves.get(node_type)
        if c is None:
            return None
        r = c.at(1)
        return r if r > 0 else None


@dataclass(frozen=True)
class Prediction:
    """A model's predicted curves per node type, how sure each is, and from which models."""

    curves: Mapping[str, ScalingCurve]  # absolute, samples/s
    log_speed: Mapping[str, float]  # log of the rate at one node relative to the model's geometric mean over types
    spread: Mapping[str, float]  # uncertainty of log_speed (σ)
    neighbours: tuple[tuple[str, float], ...]  # (model, similarity), most similar first
    # per neighbour: (similarity, log rate at one node per type)
    samples: tuple[tuple[float, Mapping[str, float]], ...] = ()
    unknown: float = PRIOR_SPREAD  # what the neighbours' distance leaves open (σ)

    @property
    def nearest(self) -> float:
        """How similar the most similar measured model is (0: none was)."""
        return self.neighbours[0][1] if self.neighbours else 0.0

    def relative(self, node_type: str, other: str) -> tuple[float, float]:
        """log(rate on ``node_type`` / rate on ``other``) at one node, and its uncertainty (σ): from the neighbours
        measured on both (their disagreement, plus what their distance leaves open); the prior without any."""
        pts = [(s, x[node_type] - x[other]) for s, x in self.samples if node_type in x and other in x]
        if not pts:
            return self.log_speed.get(node_type, 0.0) - self.log_speed.get(other, 0.0), PRIOR_SPREAD
        w = sum(s for s, _ in pts)
        mean = sum(s * d for s, d in pts) / w
        var = sum(s * (d - mean) ** 2 for s, d in pts) / w
        return mean, math.sqrt(var + self.unknown**2)

    def shape(self, node_type: str, n: np.ndarray) -> np.ndarray:
        """The predicted curve on ``node_type`` divided by its rate at one node."""
        c = self.curves[node_type]
        base = c.at(1) or 1.0
        return np.interp(n, c.nodes, c.values) / base

    def why(self, node_type: str | None = None) -> str:
        """One line for users: which models it was judged by."""
        if not self.neighbours:
            return "no similar model measured"
        near = ", ".join(f"{m} ({s:.2f})" for m, s in self.neighbours[:3])
        if node_type is None or not self.log_speed:
            return f"like {near}"
        best = max(self.log_speed, key=self.log_speed.get)
        ratio = math.exp(self.log_speed[node_type] - self.log_speed[best])
        return (f"like {near}: {node_type} predicted at {ratio:.2f} of {best}" if node_type != best
                else f"like {near}: {best} predicted fastest")


def _scaling(measured: list[tuple[float, ScalingCurve]], counts: np.ndarray) -> np.ndarray:
    """The rate at ``counts`` nodes over the rate at one: at each count, the weighted geometric mean of the curves
    measured that far (a model measured on one node says nothing of how another scales on eight); past the most
    nodes any was measured on, linear from there, as with nothing measured."""
    logs = np.zeros((len(measured), len(counts)))
    weights = np.zeros_like(logs)
    for i, (w, c) in enumerate(measured):
        inside = counts <= c.nodes[-1]
        logs[i, inside] = np.log(np.maximum(np.interp(counts[inside], c.nodes, c.values) / c.at(1), 1e-9))
        weights[i, inside] = w
    total = weights.sum(axis=0)
    known = total > 0
    mean = (logs * weights).sum(axis=0) / np.where(known, total, 1.0)
    last = int(np.flatnonzero(known)[-1]) if known.any() else -1
    base, at = (mean[last], counts[last]) if last >= 0 else (0.0, 1.0)
    mean[last + 1 :] = base + np.log(counts[last + 1 :] / at)
    return np.exp(mean)


def uninformed(node_types: Iterable[str], max_nodes: int) -> Prediction:
    """What is known of a model like nothing measured (or with no descriptor): every type alike, wide open."""
    types = list(node_types)
    n = max(1, max_nodes)
    flat = ScalingCurve((0, n), (0.0, float(n)))  # linear, at 1 sample/s per node: the level comes from reports
    return Prediction({t: flat for t in types}, {t: 0.0 for t in types}, {t: PRIOR_SPREAD for t in types}, ())


@dataclass
class Library:
    """Measured models; predicts the curves of models like them."""

    entries: list[Measured] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.entries)

    def types(self) -> set[str]:
        return {t for e in self.entries for t in e.curves}

    def without(self, family: str) -> Library:
        """The library less one family (leave-one-family-out)."""
        return Library([e for e in self.entries if e.family != family])

    def add(self, entry: Measured) -> None:
        """Add a measured model; an entry of the same model and descriptor is replaced, per type."""
        for i, e in enumerate(self.entries):
            if e.model == entry.model and e.descriptor == entry.descriptor:
                self.entries[i] = Measured(e.model, e.descriptor, {**e.curves, **entry.curves},
                                           entry.family or e.family)
                return
        self.entries.append(entry)

    def predict(self, descriptor: Descriptor, node_types: Iterable[str], max_nodes: int,
                exclude_family: str | None = None) -> Prediction:
        """The model's curves on ``node_types`` at 0 … ``max_nodes`` nodes, from its nearest measured models."""
        types = list(node_types)
        pool = [e for e in self.entries if e.family != exclude_family or not exclude_family]
        pool = [e for e in pool if any(e.rate_at_one(t) for t in types)]
        if descriptor.empty or not pool:
            return uninformed(types, max_nodes)
        ranked = sorted(((similarity(descriptor, e.descriptor), e) for e in pool), key=lambda se: -se[0])
        top = ranked[0][0]
        cut = ranked[min(NEIGHBOURS, len(ranked)) - 1][0]
        # The nearest, not the rest of the library; models as similar as the last one kept are all kept (which of
        # equally similar models counts must not depend on the order of the library).
        scored = [(s, e) for s, e in ranked if s >= max(NEAR * top, cut - 1e-12)]
        n = np.arange(max(1, max_nodes) + 1, dtype=float)
        log_speed, spread, curves = {}, {}, {}
        level_logs, level_w = [], []
        per_entry = []
        for s, e in scored:
            rates = {t: e.rate_at_one(t) for t in types}
            known = {t: math.log(r) for t, r in rates.items() if r}
            centre = sum(known.values()) / len(known)
            per_entry.append((s, e, known, centre))
            level = centre
            if descriptor.flops_per_sample and e.descriptor.flops_per_sample:
                level += math.log(e.descriptor.flops_per_sample / descriptor.flops_per_sample)  # samples/s ∝ 1/FLOPs
            level_logs.append(level)
            level_w.append(s * s)
        w_total = sum(level_w)
        level = sum(w * x for w, x in zip(level_w, level_logs)) / w_total
        # What the neighbours' distance leaves unknown: nothing for an identical model, the prior for one like nothing.
        unknown = PRIOR_SPREAD * (1.0 - top)
        for t in types:
            pts = [(s * s, known[t] - centre) for s, e, known, centre in per_entry if t in known]
            if not pts:
                log_speed[t], spread[t] = 0.0, PRIOR_SPREAD
            else:
                w = sum(s for s, _ in pts)
                mean = sum(s * x for s, x in pts) / w
                var = sum(s * (x - mean) ** 2 for s, x in pts) / w
                log_speed[t] = mean
                spread[t] = math.sqrt(var + unknown**2)
            shape = _scaling([(s * s, e.curves[t]) for s, e, _, _ in per_entry if e.rate_at_one(t)], n[1:])
            rate1 = math.exp(level + log_speed[t])
            curves[t] = ScalingCurve.from_table(np.concatenate([[0.0], rate1 * shape]))
        samples = tuple((s * s, dict(known)) for s, _, known, _ in per_entry)
        return Prediction(curves, log_speed, spread, tuple((e.model, round(s, 4)) for s, e in scored), samples, unknown)

    # ---------------------------------------------------------------- the document

    @classmethod
    def from_document(cls, doc: Any, where: str = "library") -> Library:
        if not isinstance(doc, dict) or not isinstance(doc.get("models"), list):
            raise LibraryError(f"{where}: must be {{\"format\": {FORMAT}, \"models\": [...]}}")
        if doc.get("format", FORMAT) != FORMAT:
            raise LibraryError(f"{where}: format {doc.get('format')!r} is not {FORMAT}")
        out = cls()
        for i, item in enumerate(doc["models"]):
            here = f"{where}: models[{i}]"
            if not isinstance(item, dict) or not isinstance(item.get("model"), str) or not item["model"]:
                raise LibraryError(f"{here}: needs a model name")
            curves_raw = item.get("curves")
            if not isinstance(curves_raw, dict) or not curves_raw:
                raise LibraryError(f"{here}: needs curves {{TYPE: {{nodes: [...], samples_per_s: [...]}}}}")
            curves = {}
            for t, c in curves_raw.items():
                try:
                    curves[t] = ScalingCurve(tuple(c["nodes"]), tuple(c["samples_per_s"]))
                except (KeyError, TypeError, ProblemError) as exc:
                    raise LibraryError(f"{here}: curve for {t!r}: {exc}") from None
            family = item.get("family", "")
            if not isinstance(family, str):
                raise LibraryError(f"{here}: family must be a string")
            out.add(Measured(item["model"], Descriptor.from_dict(item.get("descriptor") or {}, f"{here}: descriptor"),
                             curves, family))
        return out

    def to_document(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "models": [
                {"model": e.model, **({"family": e.family} if e.family else {}), "descriptor": e.descriptor.to_dict(),
                 "curves": {t: {"nodes": list(c.nodes), "samples_per_s": list(c.values)}
                            for t, c in sorted(e.curves.items())}}
                for e in self.entries
            ],
        }


__all__ = ["Descriptor", "Library", "LibraryError", "Measured", "Prediction", "distance", "similarity", "uninformed"]
