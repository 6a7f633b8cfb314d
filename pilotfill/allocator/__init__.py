"""The allocator: pure functions over dataclasses — no I/O, no clocks, no processes. Files are read and written by
the shell (:mod:`pilotfill.library_file`); a time limit is read on the caller's clock (``allocate(..., clock=…)``,
the controller's :func:`time.thread_time`), without which a search is bounded by its limit of states alone. (The
MILP solvers, HiGHS and CBC, keep their own time limits.)"""

from .hold_model import HoldModel
from .problem import DEFAULT_TYPE, Allocation, Job, NodePool, Problem, ProblemError, ScalingCurve
from .profiler import Profiler
from .solve import Formulation, Objective, allocate, objective_of

__all__ = [
    "DEFAULT_TYPE",
    "Allocation",
    "Formulation",
    "HoldModel",
    "Job",
    "NodePool",
    "Objective",
    "Problem",
    "ProblemError",
    "Profiler",
    "ScalingCurve",
    "allocate",
    "objective_of",
]
