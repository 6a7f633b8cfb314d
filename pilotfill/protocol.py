"""The messages clients send the controller, and what each reply carries.

Every request is a JSON object with a ``type`` and the fields below; every
reply has ``ok`` (and ``error`` when false). Transport and authentication are
in :mod:`pilotfill.transport` and :mod:`pilotfill.security`.

=================  ==========================================  ===========================================
type               fields                                      reply
=================  ==========================================  ===========================================
pilot.register     pilot, nodes [str], scheduler_id, pid       ok
pilot.heartbeat    pilot[, wait_s, exits [{host, job, code,     release [str]: nodes to give back; commands
                   requested}]] — a long poll of up to wait_s  [{op: start|stop, job, host, argv, env}];
                                                               stop; register; incarnation
pilot.leaving      pilot, nodes [str], deadline (POSIX s)      ok — ranks on those nodes are removed now
job.submit         spec {name, entry, min_nodes, max_nodes,    job_id — the same for a retry (the request id
                   …} (see :func:`check_spec`)                 is journaled with the job: across restarts too)
job.report         job_id, host, samples, seconds[, pid,       progress: the job's counted total (since a stop,
                   first, commit] — pid: the reporting rank's  it falls back to the last commit)
                   process; commit: it committed after this
                   work
job.commit         job_id — rank 0 saved the job's state       committed: progress a stop now falls back to
job.describe       job_id, model {parameters, flops_per_sample, kept: false when the job had a descriptor
                   layers, batch_size, mix} — a rank measured  already (declared, or an earlier rank's)
                   its model (the similarity policy)
job.result         job_id, value (JSON)                        ok — rank 0's return value
job.failed         job_id, error (traceback text)[, value]     ok — value: the serialized remote exception
job.get            job_id                                      job {id, status, progress, result, error, …}, checkpoint
job.status         job_ids [str]                               jobs {id: {status, progress, committed, result, error}}
job.cancel         job_id                                      ok
state.snapshot     —                                           jobs, pilots, nodes, events (latest 50)
rdzv.join          job_id, host, last_round                    state wait|closed|ended[, round, rank, world_size,
                                                               hosts, store {host, port, prefix}] (torch runtime)
rdzv.poll          job_id, host, round                         waiting, current, member, same_hosts (torch runtime)
=================  ==========================================  ===========================================
"""

from __future__ import annotations

import math
from typing import Any

FIELDS: dict[str, dict[str, type | tuple[type, ...]]] = {
    "pilot.register": {"pilot": str, "nodes": list, "scheduler_id": str, "pid": int},
    "pilot.heartbeat": {"pilot": str},
    "pilot.leaving": {"pilot": str, "nodes": list, "deadline": (int, float)},
    "job.submit": {"spec": dict},
    "job.report": {"job_id": str, "host": str, "samples": (int, float), "seconds": (int, float)},
    "job.commit": {"job_id": str},
    "job.describe": {"job_id": str, "model": dict},
    "job.result": {"job_id": str},
    "job.failed": {"job_id": str, "error": str},
    "job.get": {"job_id": str},
    "job.status": {"job_ids": list},
    "job.cancel": {"job_id": str},
    "state.snapshot": {},
    "rdzv.join": {"job_id": str, "host": str, "last_round": int},
    "rdzv.poll": {"job_id": str, "host": str, "round": int},
}

READ_ONLY = {"job.get", "job.status", "state.snapshot", "rdzv.join", "rdzv.poll"}  # nothing journaled


class ProtocolError(ValueError):
    """A request that is authentic but malformed."""


def check(message: dict[str, Any]) -> str:
    """The message's type, after checking its fields."""
    kind = message.get("type")
    if kind not in FIELDS:
        raise ProtocolError(f"unknown message type {kind!r}")
    for name, typ in FIELDS[kind].items():
        if name not in message:
            raise ProtocolError(f"{kind}: missing field {name!r}")
        if not isinstance(message[name], typ) or isinstance(message[name], bool):
            raise ProtocolError(f"{kind}: field {name!r} has the wrong type")
    if kind == "job.report":
        if not (math.isfinite(message["samples"]) and message["samples"] >= 0):
            raise ProtocolError("job.report: samples must be finite and >= 0")
        if not (math.isfinite(message["seconds"]) and message["seconds"] > 0):
            raise ProtocolError("job.report: seconds must be finite and > 0")
    if kind in ("pilot.register", "pilot.leaving") and not all(isinstance(n, str) and n for n in message["nodes"]):
        raise ProtocolError(f"{kind}: nodes must be non-empty strings")
    return kind


def _number(value: Any) -> bool:
    """A real, finite number (not a bool, not NaN, not infinite)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_curve(spec: dict[str, Any], key: str, values: str) -> None:
    """``spec[key]``, when given, must be ``{nodes: [...], <values>: [...]}`` making a valid curve."""
    curve = spec.get(key)
    if curve is None:
        return
    if not isinstance(curve, dict) or not isinstance(curve.get("nodes"), list) or not isinstance(curve.get(values), list):
        raise ProtocolError(f"job spec: {key} must be {{nodes: [...], {values}: [...]}}")
    from .allocator import ProblemError, ScalingCurve

    try:
        ScalingCurve(tuple(curve["nodes"]), tuple(curve[values]))
    except (ProblemError, TypeError, ValueError) as exc:
        raise ProtocolError(f"job spec: {key}: {exc}") from None


def check_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """Validate a job spec; return it with defaults filled in.

    name (str), entry ("module:function" run by every rank) or payload (a
    function and its arguments packed by Parsl's serializer, base64), args (list),
    kwargs (dict), min_nodes, max_nodes (ints, 1 <= min <= max),
    total_samples (work, optional), curve ({nodes, samples_per_s}, optional:
    learned by the profiler when absent), objective ({nodes, values}, optional:
    a metric the allocator maximises instead of throughput, e.g. speedup),
    scale_up_cost_s, scale_down_cost_s, restart_cost_s (priors: the controller
    measures each job's own, unless costs_known is true), weight, key (the app
    call, optional: a re-run's submission of the same call resumes its job),
    runtime (optional: torch, horovod or processes, the one the job's code is
    written for; default: the config's), curves (optional: {TYPE: {nodes,
    samples_per_s}}, the job's curve on each node type of a machine with
    several kinds), model (optional: the model's descriptor, for the
    similarity policy: {parameters, flops_per_sample, layers, batch_size, mix}).
    """
    out = {
        "args": [],
        "kwargs": {},
        "total_samples": None,
        "curve": None,
        "scale_up_cost_s": 10.0,
        "scale_down_cost_s": 5.0,
        "restart_cost_s": 30.0,
        "weight": 1.0,
        **spec,
    }
    if not isinstance(out.get("name"), str) or not out["name"]:
        raise ProtocolError("job spec: name must be a non-empty string")
    if isinstance(out.get("payload"), str) and out["payload"]:
        out.setdefault("entry", "")
    elif not isinstance(out.get("entry"), str) or ":" not in out["entry"]:
        raise ProtocolError("job spec: needs entry ('module:function') or payload (a Parsl-serialized call)")
    lo, hi = out.get("min_nodes"), out.get("max_nodes")
    if not (isinstance(lo, int) and isinstance(hi, int)) or lo < 1 or lo > hi:
        raise ProtocolError(f"job spec: need integers 1 <= min_nodes <= max_nodes, got {lo!r}, {hi!r}")
    if not isinstance(out["args"], list) or not isinstance(out["kwargs"], dict):
        raise ProtocolError("job spec: args must be a list and kwargs an object")
    if out["total_samples"] is not None and not (_number(out["total_samples"]) and out["total_samples"] > 0):
        raise ProtocolError(f"job spec: total_samples must be a positive finite number, got {out['total_samples']!r}")
    for name in ("scale_up_cost_s", "scale_down_cost_s", "restart_cost_s", "weight"):
        if not _number(out[name]) or out[name] < 0 or (name == "weight" and out[name] <= 0):
            raise ProtocolError(f"job spec: {name} must be a {'positive' if name == 'weight' else 'non-negative'} finite number, got {out[name]!r}")
    if not isinstance(out.get("costs_known", False), bool):
        raise ProtocolError("job spec: costs_known must be true or false")
    if out.get("runtime") is not None and out["runtime"] not in ("torch", "horovod", "processes"):
        raise ProtocolError(f"job spec: runtime must be torch, horovod or processes, got {out['runtime']!r}")
    if out.get("key") is not None and not isinstance(out["key"], str):
        raise ProtocolError("job spec: key must be a string")
    _check_curve(out, "curve", "samples_per_s")
    _check_curve(out, "objective", "values")
    curves = out.get("curves")
    if curves is not None:
        if not isinstance(curves, dict) or not curves or not all(isinstance(t, str) and t for t in curves):
            raise ProtocolError("job spec: curves must be {TYPE: {nodes: [...], samples_per_s: [...]}} for at least one node type")
        for t, curve in curves.items():
            _check_curve({"c": curve}, "c", "samples_per_s")
    if out.get("model") is not None:
        from .allocator.similarity import Descriptor, LibraryError

        try:
            out["model"] = Descriptor.from_dict(out["model"], "job spec: model").to_dict()
        except LibraryError as exc:
            raise ProtocolError(str(exc)) from None
    return out
