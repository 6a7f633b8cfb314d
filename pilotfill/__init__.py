"""pilotfill: pilot jobs that harvest a supercomputer's idle nodes for elastic neural-network training.

Public API: ``report`` (the one line a training loop adds) and ``load_config``.
The allocator is ``pilotfill.allocator``; the controller ``pilotfill.controller``.
"""

from .config import load_config
from .report import report

__version__ = "0.1.0"
__all__ = ["load_config", "report"]
