"""Runtimes that start, resize and stop the ranks of training jobs on pilot nodes.

``from pilotfill.elastic import TorchState``: Horovod's elastic state with
every commit also saved durably (imported lazily: it needs Horovod and torch).
"""

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "TorchState":
        from .torch_state import TorchState

        return TorchState
    raise AttributeError(f"module 'pilotfill.elastic' has no attribute {name!r}")
