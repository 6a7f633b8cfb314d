"""pilotfill: pilot jobs that harvest a supercomputer's idle nodes for elastic neural-network training.

Public API: ``elastic_app`` (decorate a training function as an elastic Parsl
app), ``report`` (the one line a training loop adds) and ``load_config``.
"""

from typing import Any

from .config import load_config
from .report import report

__version__ = "0.1.0"
__all__ = ["elastic_app", "load_config", "report"]


def __getattr__(name: str) -> Any:
    # Parsl is imported only by code that uses it (ranks import pilotfill.report on every start).
    if name == "elastic_app":
        from .executors import elastic_app

        return elastic_app
    raise AttributeError(f"module 'pilotfill' has no attribute {name!r}")
