"""The allocator: pure functions over dataclasses — no I/O, no clocks, no processes."""

from .horizon import HoldModel
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
