"""Runtimes that start, resize and stop the ranks of training jobs on pilot nodes.

For training code (imported lazily: they need torch, and Horovod for ``TorchState``):

* ``from pilotfill.elastic import ElasticLoader`` — global batches of one seeded
  order per epoch, split over the ranks there are now: what is learned does not
  depend on the allocation, and every sample is trained once per epoch;
* ``from pilotfill.elastic import Adaptive`` — opt-in: a global batch that grows
  with the ranks, the learning rate following a rule (this changes what is
  learned; :mod:`pilotfill.elastic.adaptive`);
* ``from pilotfill.elastic import ElasticState`` — plain ``torch.distributed``
  (``runtime.kind = "torch"``): a model, an optimizer and named values that
  survive every change of nodes, committed durably;
* ``from pilotfill.elastic import TorchState`` — Horovod's elastic state with
  every commit also saved durably (``runtime.kind = "horovod"``).
"""

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "TorchState":
        from .horovod_state import TorchState

        return TorchState
    if name == "ElasticLoader":
        from .loader import ElasticLoader

        return ElasticLoader
    if name == "Adaptive":
        from .adaptive import Adaptive

        return Adaptive
    if name == "ElasticState":
        from .state import ElasticState

        return ElasticState
    raise AttributeError(f"module 'pilotfill.elastic' has no attribute {name!r}")
