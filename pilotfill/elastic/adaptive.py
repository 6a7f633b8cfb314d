"""Adaptive global batches (opt-in): the batch grows with the allocation, and the learning rate follows a named rule.

``ElasticLoader(data, global_batch=Adaptive(64, rule="adascale"))`` — unlike a
fixed global batch, this **changes what is learned**: a job on more ranks takes
bigger steps, so its model depends on the allocation (as with AdaptDL's
``AdaptiveDataLoader``). It trades that for speed where larger batches still
pay. The batch at ``world`` ranks is ``base_batch × world`` (at most
``max_batch``); the learning rate the app set (tuned at ``base_batch``) is scaled
by the rule's factor for the batch:

* ``"linear"`` — ``B / base_batch`` (Goyal et al., 2017);
* ``"sqrt"`` — ``√(B / base_batch)`` (Krizhevsky, 2014);
* ``"adascale"`` — AdaScale's gain (Johnson et al., 2020): ``r = (σ²/B₀ + |μ|²) /
  (σ²/B + |μ|²)``, between 1 and ``B / B₀``, from the gradient's per-sample
  variance ``σ²`` and squared mean ``|μ|²`` measured while training
  (:class:`GradientNoise`); 1 until measured.

A bigger batch is worth less per sample: its **statistical efficiency** is
``E(B) = (φ + B₀) / (φ + B)`` with ``φ = σ² / |μ|²`` the gradient noise scale
(McCandlish et al., 2018; Pollux, OSDI'21). Rank 0 reports ``φ`` with its
progress, and the allocator values the job's nodes by samples per second times
``E`` (``spec["adaptive"]``, :func:`efficiency`): it does not over-value growth.
Until ``φ`` is measured it is taken as ``B₀`` (the batch the learning rate was
tuned at is taken to be near the critical batch).

Everything here is pure arithmetic over numbers (no torch): the loader measures,
this module estimates and scales.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

RULES = ("linear", "sqrt", "adascale")


@dataclass(frozen=True)
class Adaptive:
    """A global batch of ``base_batch`` samples per rank, at most ``max_batch``,
    the learning rate scaled by ``rule``."""

    base_batch: int
    max_batch: int | None = None
    rule: str = "adascale"

    def __post_init__(self) -> None:
        if not isinstance(self.base_batch, int) or isinstance(self.base_batch, bool) or self.base_batch < 1:
            raise ValueError(f"Adaptive: base_batch must be an integer >= 1, got {self.base_batch!r}")
        if self.max_batch is not None and (
            not isinstance(self.max_batch, int) or isinstance(self.max_batch, bool) or self.max_batch < self.base_batch
        ):
            raise ValueError(
                f"Adaptive: max_batch must be an integer >= base_batch ({self.base_batch}), got {self.max_batch!r}"
            )
        if self.rule not in RULES:
            raise ValueError(f"Adaptive: rule must be one of {', '.join(RULES)}, got {self.rule!r}")

    def batch(self, world: int) -> int:
        """The global batch at ``world`` ranks."""
        size = self.base_batch * max(1, world)
        return size if self.max_batch is None else min(size, self.max_batch)

    def lr_factor(self, batch: int, noise: GradientNoise | None = None) -> float:
        """What the learning rate tuned at ``base_batch`` is multiplied by at ``batch``."""
        scale = batch / self.base_batch
        if self.rule == "linear":
            return scale
        if self.rule == "sqrt":
            return math.sqrt(scale)
        return noise.gain(self.base_batch, batch) if noise is not None else 1.0

    def to_spec(self) -> dict[str, Any]:
        """As a job spec carries it (``spec["adaptive"]``): what the allocator values the job's sizes by."""
        return {"base_batch": self.base_batch, "max_batch": self.max_batch, "rule": self.rule}

    @classmethod
    def from_spec(cls, declared: dict[str, Any]) -> Adaptive:
        """From ``spec["adaptive"]``."""
        top = declared.get("max_batch")
        return cls(
            int(declared["base_batch"]), None if top is None else int(top), str(declared.get("rule", "adascale"))
        )


def efficiency(batch: float, base_batch: float, noise_scale: float | None) -> float:
    """Progress per sample at ``batch`` relative to ``base_batch``: ``(φ + B₀) / (φ + B)`` (``φ`` unknown:
    ``B₀``)."""
    phi = base_batch if noise_scale is None or not math.isfinite(noise_scale) or noise_scale < 0 else noise_scale
    return (phi + base_batch) / (phi + batch)


@dataclass
class GradientNoise:
    """Running estimates of the per-sample gradient variance (its trace, ``var``) and the squared norm of the mean
    gradient (``sq``), from steps on two or more ranks.

    Each rank's share of ``s`` samples has ``E|g_s|² = sq + var/s``; the global batch of ``B``, ``E|g_B|² = sq +
    var/B``: the mean of the ranks' squared norms and the global one give both (Pollux's estimator). One step's
    estimate is noisy (``sq`` may come out negative); the two are smoothed apart, as AdaptDL does."""

    smoothing: float = 0.95
    var: float = 0.0
    sq: float = 0.0
    weight: float = 0.0  # how much of the running means is data (bias correction of an average started at zero)
    steps: int = field(default=0)

    def update(self, local_sq_mean: float, inverse_share_mean: float, global_sq: float, batch: int) -> None:
        """One step: ``local_sq_mean``, the ranks' mean of their share gradients' squared norms; ``inverse_share_mean``,
        the mean of 1/share; ``global_sq``, the squared norm of the step's gradient (the mean over ``batch``)."""
        spread = inverse_share_mean - 1.0 / batch
        if spread <= 0 or not all(math.isfinite(v) for v in (local_sq_mean, global_sq)):
            return  # one rank (or every sample on each): nothing tells the variance apart
        var = max(0.0, (local_sq_mean - global_sq) / spread)
        sq = global_sq - var / batch
        a = self.smoothing
        self.var, self.sq, self.weight = (
            a * self.var + (1 - a) * var,
            a * self.sq + (1 - a) * sq,
            a * self.weight + (1 - a),
        )
        self.steps += 1

    @property
    def known(self) -> bool:
        return self.steps > 0 and self.sq > 0

    @property
    def noise_scale(self) -> float | None:
        """``φ = var / sq``, in samples: the batch beyond which a bigger one pays less than linearly (None:
        unknown)."""
        return self.var / self.sq if self.known else None

    def gain(self, base_batch: int, batch: int) -> float:
        """AdaScale's gain of ``batch`` over ``base_batch``: how many steps at ``base_batch`` one step at ``batch`` is
        worth (1 until known; at most ``batch / base_batch``)."""
        if not self.known:
            return 1.0
        scale = batch / base_batch
        phi = self.var / self.sq
        return min(scale, max(1.0, (phi / base_batch + 1.0) / (phi / batch + 1.0)))

    def state_dict(self) -> dict[str, float]:
        return {"var": self.var, "sq": self.sq, "weight": self.weight, "steps": self.steps}

    def load_state_dict(self, saved: dict[str, float]) -> None:
        self.var, self.sq, self.weight, self.steps = (
            float(saved["var"]),
            float(saved["sq"]),
            float(saved["weight"]),
            int(saved["steps"]),
        )


__all__ = ["RULES", "Adaptive", "GradientNoise", "efficiency"]
