"""``@pilotfill.elastic_app``: a Parsl app whose calls become elastic training jobs.

    @pilotfill.elastic_app(min_nodes=1, max_nodes=8)                     # the config's runtime ([runtime] kind)
    def train(lr, depth): ...            # plain torch.distributed + pilotfill.elastic.ElasticState

    @pilotfill.elastic_app(min_nodes=1, max_nodes=8, runtime="horovod")  # whatever the config says
    def train(lr, depth): ...            # hvd.init(), hvd.DistributedOptimizer, hvd.elastic.run

The runtime follows the code: an app that names one runs under it whatever
the site config's ``[runtime] kind`` is; one that names none runs under the
runtime its code is written for (Horovod code under Horovod, torch.distributed
code under torch: :mod:`pilotfill.executors.detect`, said once on the progress
line when it is not the config's), else under the config's. Code that calls
Horovod under a runtime that did not launch it still fails at once, saying
how to run it (:mod:`pilotfill.elastic.guard`).

Arguments are checked when the decorator is applied, so a bad bound fails at
import time with a clear message. The resource specification rides in Parsl's
``parsl_resource_specification`` keyword (ignored for caching, so changing
``max_nodes`` does not invalidate finished trainings) and is stripped before
the function runs.
"""

from __future__ import annotations

import functools
import inspect
import math
import os
from typing import Any, Callable

from parsl import python_app

from ..allocator import ProblemError, ScalingCurve
from ..config import RUNTIMES
from ..elastic.adaptive import Adaptive
from .detect import detect_runtime

RESOURCE_KEY = "parsl_resource_specification"
GLOBAL_BATCH_ENV = "PILOTFILL_GLOBAL_BATCH"
"""Where a rank finds its app's ``global_batch`` (``pilotfill.elastic.loader`` reads it; torch is not imported here)."""
MAX_NODES = 1_000_000
"""No job asks for more nodes than this; the controller further caps a job at the machine it runs on."""


def elastic_app(
    function: Callable | None = None,
    *,
    min_nodes: int = 1,
    max_nodes: int = 1,
    curve: dict[str, list[float]] | None = None,
    total_samples: float | None = None,
    weight: float = 1.0,
    scale_up_cost_s: float = 10.0,
    scale_down_cost_s: float = 5.0,
    restart_cost_s: float = 30.0,
    cache: bool = True,
    executor: str = "elastic",
    runtime: str | None = None,
    model: dict[str, Any] | None = None,
    group: str | None = None,
    global_batch: int | Adaptive | None = None,
    min_per_rank: int = 1,
    model_name: str | None = None,
) -> Callable:
    """Decorate a training function as an elastic Parsl app (see module docstring).

    ``restart_cost_s``: seconds of training a stop and restart costs (the work
    since the last commit, and starting again); the allocator stops a running
    job only when that is worth paying. ``runtime``: ``"torch"``, ``"horovod"`` or
    ``"processes"``, the runtime the function is written for (default: the config's).
    ``curve``: one curve, or one per node type (``{"a100": {"nodes": …,
    "samples_per_s": …}, …}``) on a machine with several kinds of node.
    ``model``: the model's descriptor (``parameters``, ``flops_per_sample``,
    ``layers``, ``batch_size``, ``mix``) for the similarity policy, where
    pilotfill cannot describe it from the model itself (``ElasticState`` does).
    ``group``: who its jobs share the machine as (a campaign, a user, a model
    family) when the controller's objective is ``"share"``. ``cache``: a call
    with the same code and arguments as one that finished takes its result
    (:mod:`pilotfill.executors.identity`); ``cache=False`` runs every call.
    ``global_batch``: the samples each optimizer step takes whatever the world
    size (the smallest, where calls differ); the job is never given more ranks
    than it feeds, ``min_per_rank`` samples each, and its ``ElasticLoader``
    takes it when it names none. ``global_batch=Adaptive(base_batch, …)``
    (:mod:`pilotfill.elastic.adaptive`): the batch grows with the ranks and the
    learning rate follows a rule — what is learned then depends on the
    allocation; the allocator values the job's nodes by samples per second times
    the batch's statistical efficiency. ``model_name``: calls that train the same
    model alike (same architecture and batch) say the same name; before one
    reports, it is valued by what the others of its name measured (a sweep's
    seeds; leave it out where calls scale differently).
    """
    spec = _check(
        min_nodes, max_nodes, curve, total_samples, weight, scale_up_cost_s, scale_down_cost_s, restart_cost_s
    )
    if isinstance(global_batch, Adaptive):
        spec["adaptive"] = global_batch.to_spec()
        if global_batch.max_batch is not None:  # the largest batch feeds at most this many ranks
            spec.update(_check_batch(global_batch.max_batch, min_per_rank, min_nodes))
    elif global_batch is not None:
        spec.update(_check_batch(global_batch, min_per_rank, min_nodes))
    if runtime is not None and runtime not in RUNTIMES:
        raise ElasticAppError(
            f"elastic_app: runtime must be one of {', '.join(RUNTIMES)} (or left out: the config's), got {runtime!r}"
        )
    spec["runtime"] = runtime
    if not cache:
        spec["fresh"] = True  # every call trains anew: no result and no finished training is taken from an earlier call
    if group is not None:
        if not isinstance(group, str):
            raise ElasticAppError(
                f"elastic_app: group must be a string (a campaign, a user, a model family), got {group!r}"
            )
        spec["group"] = group
    if model_name is not None:
        if not isinstance(model_name, str) or not model_name:
            raise ElasticAppError(f"elastic_app: model_name must be a non-empty string, got {model_name!r}")
        spec["model_name"] = model_name
    if model is not None:
        from ..allocator.similarity import Descriptor, LibraryError

        try:
            spec["model"] = Descriptor.from_dict(model, "elastic_app: model").to_dict()
        except LibraryError as exc:
            raise ElasticAppError(str(exc)) from None

    def decorate(func: Callable) -> Callable:
        if not callable(func):
            raise TypeError(f"elastic_app decorates a function, not {type(func).__name__}")

        @functools.wraps(func)
        def task(*args: Any, **kwargs: Any) -> Any:
            declared = (kwargs.pop(RESOURCE_KEY, None) or {}).get("global_batch")
            if declared:
                # this rank's ElasticLoader: the batch the allocator sized the job for
                os.environ[GLOBAL_BATCH_ENV] = str(declared)
            return func(*args, **kwargs)

        # No runtime named: the one the code is written for (executors/detect.py), else the config's.
        own = {**spec, "name": func.__name__}
        if runtime is None:
            found = detect_runtime(func)
            if found is not None:
                own["runtime"], own["runtime_detected"] = found
        # Parsl reads the resource specification from the signature's default.
        params = list(inspect.signature(func).parameters.values())
        extra = inspect.Parameter(RESOURCE_KEY, inspect.Parameter.KEYWORD_ONLY, default=own)
        plain = [p for p in params if p.kind is not inspect.Parameter.VAR_KEYWORD]
        var_kw = [p for p in params if p.kind is inspect.Parameter.VAR_KEYWORD]
        params = plain + [extra] + var_kw
        task.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        return python_app(task, executors=[executor], cache=cache, ignore_for_cache=[RESOURCE_KEY])

    return decorate(function) if function is not None else decorate


class ElasticAppError(ValueError):
    """An ``elastic_app`` argument that cannot work; ``pilotfill run`` shows it as one line with the campaign's line."""


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_batch(global_batch: Any, min_per_rank: Any, min_nodes: int) -> dict[str, int]:
    """``global_batch`` and ``min_per_rank`` as a job spec carries them; a job that could never feed its ``min_nodes``
    fails here, at import, not when the controller refuses it."""
    for name, value in (("global_batch", global_batch), ("min_per_rank", min_per_rank)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ElasticAppError(f"elastic_app: {name} must be an integer >= 1, got {value!r}")
    if global_batch // min_per_rank < min_nodes:
        raise ElasticAppError(
            f"elastic_app: global_batch={global_batch} feeds {global_batch // min_per_rank} rank(s) of "
            f"min_per_rank={min_per_rank} samples, fewer than min_nodes={min_nodes}"
        )
    return {"global_batch": global_batch, "min_per_rank": min_per_rank}


def _check(min_nodes, max_nodes, curve, total_samples, weight, up, down, restart) -> dict[str, Any]:
    def fail(message: str) -> None:
        raise ElasticAppError(f"elastic_app: {message}")

    if not isinstance(min_nodes, int) or isinstance(min_nodes, bool) or min_nodes < 1:
        fail(f"min_nodes must be an integer >= 1, got {min_nodes!r}")
    if not isinstance(max_nodes, int) or isinstance(max_nodes, bool) or max_nodes < min_nodes:
        fail(f"max_nodes must be an integer >= min_nodes ({min_nodes}), got {max_nodes!r}")
    if max_nodes > MAX_NODES:
        fail(f"max_nodes must be at most {MAX_NODES:,} (no machine is larger), got {max_nodes!r}")
    curves = None
    if curve is not None:
        typed = (
            isinstance(curve, dict)
            and "nodes" not in curve
            and curve
            and all(isinstance(v, dict) for v in curve.values())
        )
        for kind, one in (curve.items() if typed else [(None, curve)]):
            try:
                ScalingCurve(tuple(one["nodes"]), tuple(one["samples_per_s"]))
            except (KeyError, TypeError, ProblemError) as exc:
                where = f"curve[{kind!r}]" if kind is not None else "curve"
                fail(
                    f"{where} must be {{'nodes': [0, …], 'samples_per_s': [0, …]}} starting at 0 nodes (or one "
                    f"such per node type): {exc}"
                )
        if typed:
            curves, curve = dict(curve), None
    if total_samples is not None and not (_finite(total_samples) and total_samples > 0):
        fail(f"total_samples must be a positive number, got {total_samples!r}")
    for name, value in (
        ("weight", weight),
        ("scale_up_cost_s", up),
        ("scale_down_cost_s", down),
        ("restart_cost_s", restart),
    ):
        if not _finite(value) or value < 0 or (name == "weight" and value == 0):
            fail(f"{name} must be a {'positive' if name == 'weight' else 'non-negative'} finite number, got {value!r}")
    return {
        "min_nodes": min_nodes,
        "max_nodes": max_nodes,
        "curve": curve,
        **({"curves": curves} if curves else {}),
        "total_samples": total_samples,
        "weight": float(weight),
        "scale_up_cost_s": float(up),
        "scale_down_cost_s": float(down),
        "restart_cost_s": float(restart),
    }
