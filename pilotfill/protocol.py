"""The messages clients send the controller, and what each reply carries: one dataclass per request type, and one
per reply (each request's ``REPLY``).

Every request is a JSON object with a ``type`` and the fields of its class below; every reply has ``ok`` (and
``error`` when false) and the fields of its :class:`Reply` class: the handlers return those, and ``Controller.handle``
sends ``{"ok": True, **reply.to_dict()}``, so a reply's shape is written once, here. :func:`parse` turns a request
into its class, checked (a required field missing or of the wrong type is a :class:`ProtocolError` naming it;
``Reply.parse`` checks a reply the same way, for its readers); the controller's handlers take the classes, and
whatever sends a request builds it from them (the client, pilot agents, ranks and torch agents; the replay's simulated
site and runtime: ``JobReport(...).to_dict()``), so the replay cannot drift from production. The run's torch store has
its own requests and replies, made the same way (:mod:`pilotfill.elastic.torch.store`: only torch's agents and ranks
load them). The table in ``docs/protocol.md`` is made from the classes (``python -m pilotfill.protocol``; a test
checks it is current). Transport and authentication are in :mod:`pilotfill.transport` and :mod:`pilotfill.security`.
"""

from __future__ import annotations

import difflib
import json
import math
from dataclasses import MISSING, dataclass, field, fields
from typing import Annotated, Any, ClassVar, Required, Self, TypedDict

from .elastic.registry import NAMES as RUNTIMES


class ProtocolError(ValueError):
    """A request (or a reply read back) that is authentic but malformed."""


_NUMBER = (int, float)
_SCHEMAS: dict[type, tuple[tuple[str, Any, bool], ...]] = {}  # message or reply class -> (field, its types, required?)
_SENDS: dict[type, tuple[tuple[str, Any, bool], ...]] = {}  # message or reply class -> (field, its default, always?)


def _field(check: type | tuple[type, ...], doc: str = "", default: Any = MISSING, always: bool = False) -> Any:
    """A message field: the types it must have and what it means (the table above is made from these). ``always``:
    an optional field sent even at its default (a ``job.result`` of None says so)."""
    return field(default=default, metadata={"check": check, "doc": doc, "always": always})


def _checked(cls: type, message: dict[str, Any], kind: str) -> dict[str, Any]:
    """``message``'s values of ``cls``'s fields, checked: every required field present with its type (a bool is not
    a number); an optional field of the wrong type is left out. Keys that are not fields are ignored."""
    values = {}
    schema = _SCHEMAS.get(cls)
    if schema is None:  # read once per class: every request is parsed (thousands of heartbeats a second at scale)
        schema = _SCHEMAS[cls] = tuple((f.name, f.metadata["check"], f.default is MISSING) for f in fields(cls))
    for name, check, required in schema:
        value = message.get(name, MISSING)
        ok = (
            value is not MISSING
            and isinstance(value, check)
            and not (isinstance(value, bool) and check in (int, _NUMBER))
        )
        if required:
            if value is MISSING:
                raise ProtocolError(f"{kind}: missing field {name!r}")
            if not ok:
                raise ProtocolError(f"{kind}: field {name!r} has the wrong type")
            values[name] = value
        elif ok:
            values[name] = value
    return values


def _sent(obj: Any) -> dict[str, Any]:
    """``obj``'s fields as they are sent: optional fields left at their default are not, unless ``always``."""
    cls = type(obj)
    plan = _SENDS.get(cls)
    if plan is None:  # read once per class: every reply is sent (thousands of heartbeats a second at scale)
        plan = _SENDS[cls] = tuple(
            (f.name, f.default, f.default is MISSING or f.metadata["always"]) for f in fields(cls)
        )
    out = {}
    for name, default, always in plan:
        value = getattr(obj, name)
        if always or value != default:
            out[name] = value
    return out


@dataclass(slots=True, kw_only=True)
class Reply:
    """What a request's handler answers: these fields, to which ``Controller.handle`` adds ``ok`` (an error is
    ``{ok: false, error}``, no class). Each request class names its own (``REPLY``), so the handlers, the readers and
    the table in ``docs/protocol.md`` share one shape. Keyword-only: a reply's optional fields come in the order they
    are sent, between required ones."""

    @classmethod
    def parse(cls, reply: dict[str, Any]) -> Self:
        """A reply as its class, checked like a request (:class:`ProtocolError` naming the field; a refusal's
        ``error`` when ``ok`` is false). ``ok`` and keys that are not fields are ignored."""
        if reply.get("ok", True) is False:
            raise ProtocolError(f"{cls.__name__}: refused: {reply.get('error')}")
        return cls(**_checked(cls, reply, cls.__name__))

    def to_dict(self) -> dict[str, Any]:
        """The reply's fields as they are sent (optional fields left at their default are not, unless ``always``)."""
        return _sent(self)


@dataclass(slots=True)
class Message:
    """A request, checked: every required field present with its type (a bool is not a number); an optional field
    of the wrong type is left out (as an older agent or client might send it), never an error."""

    TYPE: ClassVar[str] = ""
    READ_ONLY: ClassVar[bool] = False  # nothing journaled: answered outside a transaction
    REPLY: ClassVar[type[Reply]] = Reply  # what its handler answers

    @classmethod
    def parse(cls, message: dict[str, Any]) -> Message:
        out = cls(**_checked(cls, message, cls.TYPE))
        out.validate()
        return out

    def validate(self) -> None:
        """Checks beyond the fields' types."""

    def to_dict(self) -> dict[str, Any]:
        """The message as it is sent (optional fields left at their default are not, unless ``always``)."""
        return {"type": self.TYPE, **_sent(self)}


def _names_nodes(kind: str, nodes: list) -> None:
    if not all(isinstance(n, str) and n for n in nodes):
        raise ProtocolError(f"{kind}: nodes must be non-empty strings")


@dataclass(slots=True, kw_only=True)
class PilotRegisterReply(Reply):
    stop: bool = _field(bool, "the pilot has ended: its agent stops", False)


@dataclass(slots=True)
class PilotRegister(Message):
    TYPE: ClassVar[str] = "pilot.register"
    REPLY: ClassVar[type[Reply]] = PilotRegisterReply
    pilot: str = _field(str, "the pilot's id")
    nodes: list = _field(list, "its nodes [str]")
    scheduler_id: str = _field(str, "the batch system's job id")
    pid: int = _field(int, "the agent's process")

    def validate(self) -> None:
        _names_nodes(self.TYPE, self.nodes)


@dataclass(slots=True, kw_only=True)
class PilotHeartbeatReply(Reply):
    """The hot path (thousands a second at scale): :meth:`to_dict` is written out, not walked field by field. A
    pilot the controller does not run (unknown, queued, ended) gets ``register``, ``stop`` and ``incarnation``
    only, in that order."""

    release: list | None = _field(list, "nodes to give back [str] (absent: the pilot is not running here)", None)
    commands: list | None = _field(
        list, "for its nodes [{op: start|stop, job, host, argv, env}] (absent: the pilot is not running here)", None
    )
    stop: bool = _field(bool, "the pilot has ended: its agent stops")
    register: bool = _field(bool, "the controller does not know the pilot (a new one): register again")
    incarnation: int = _field(int, "the controller's incarnation: a new one may have adopted its processes")
    keep: list | None = _field(
        list, "a new controller adopted these jobs' processes [[host, job]] (the others end)", None
    )

    def to_dict(self) -> dict[str, Any]:
        if self.release is None:  # a pilot not running here: told to register or to stop
            return {"register": self.register, "stop": self.stop, "incarnation": self.incarnation}
        out = {
            "release": self.release,
            "commands": self.commands,
            "stop": self.stop,
            "register": self.register,
            "incarnation": self.incarnation,
        }
        if self.keep is not None:
            out["keep"] = self.keep
        return out


@dataclass(slots=True)
class PilotHeartbeat(Message):
    TYPE: ClassVar[str] = "pilot.heartbeat"
    REPLY: ClassVar[type[Reply]] = PilotHeartbeatReply
    pilot: str = _field(str, "the pilot's id")
    wait_s: float | None = _field(
        _NUMBER, "a long poll: answered at once when there is news, else after this long", None
    )
    exits: list | None = _field(list, "processes that ended on its nodes [{host, job, code, requested}]", None)
    running: list | None = _field(
        list, "after a reply with keep: the jobs' processes running on its nodes [[host, job]]", None
    )


@dataclass(slots=True, kw_only=True)
class PilotLeavingReply(Reply):
    """ok: ranks on those nodes are removed now."""


@dataclass(slots=True)
class PilotLeaving(Message):
    TYPE: ClassVar[str] = "pilot.leaving"
    REPLY: ClassVar[type[Reply]] = PilotLeavingReply
    pilot: str = _field(str, "the pilot's id")
    nodes: list = _field(list, "the nodes that go [str]")
    deadline: float = _field(_NUMBER, "when they are gone (POSIX s)")

    def validate(self) -> None:
        _names_nodes(self.TYPE, self.nodes)


@dataclass(slots=True, kw_only=True)
class JobSubmitReply(Reply):
    job_id: str = _field(
        str, "the job: the same for a retry (the request id is journaled with the job: across restarts too)"
    )
    reused: bool = _field(bool, "an earlier submission's job (a retry, or the same call again: its key)", False)


@dataclass(slots=True)
class JobSubmit(Message):
    TYPE: ClassVar[str] = "job.submit"
    REPLY: ClassVar[type[Reply]] = JobSubmitReply
    spec: dict = _field(dict, "{name, entry, min_nodes, max_nodes, …}: the job spec (its table below)")
    rid: str | None = _field(str, "the request's id: a retry of it is answered, not applied again", None)


@dataclass(slots=True, kw_only=True)
class JobReportReply(Reply):
    progress: float = _field(_NUMBER, "the job's counted total (after a stop it falls back to the last commit)")


@dataclass(slots=True)
class JobReport(Message):
    TYPE: ClassVar[str] = "job.report"
    REPLY: ClassVar[type[Reply]] = JobReportReply
    job_id: str = _field(str, "the job")
    host: str = _field(str, "the reporting rank's node")
    samples: float = _field(_NUMBER, "samples processed since its last report")
    seconds: float = _field(_NUMBER, "over how long")
    pid: Any = _field(object, "the reporting rank's process (ranks are measured apart)", None)
    first: bool = _field(bool, "its first report since it started: covers the start, not training", False)
    commit: bool = _field(bool, "it committed right after this work", False)
    position: float | None = _field(
        _NUMBER,
        "where its loader is after this work: global samples since the job began (rank 0 of an ElasticLoader)",
        None,
    )
    noise_scale: float | None = _field(
        _NUMBER, "an adaptive batch's measured gradient noise scale, in samples (rank 0)", None
    )

    def validate(self) -> None:
        if not (math.isfinite(self.samples) and self.samples >= 0):
            raise ProtocolError("job.report: samples must be finite and >= 0")
        if self.position is not None and not (math.isfinite(self.position) and self.position >= self.samples):
            raise ProtocolError("job.report: position must be finite and at least the samples reported")
        if not (math.isfinite(self.seconds) and self.seconds > 0):
            raise ProtocolError("job.report: seconds must be finite and > 0")
        if self.noise_scale is not None and not (math.isfinite(self.noise_scale) and self.noise_scale >= 0):
            raise ProtocolError("job.report: noise_scale must be finite and >= 0")


@dataclass(slots=True, kw_only=True)
class JobCommitReply(Reply):
    committed: float = _field(_NUMBER, "the progress a stop now falls back to")


@dataclass(slots=True)
class JobCommit(Message):
    TYPE: ClassVar[str] = "job.commit"
    REPLY: ClassVar[type[Reply]] = JobCommitReply
    job_id: str = _field(str, "the job: rank 0 saved its state")


@dataclass(slots=True, kw_only=True)
class JobDescribeReply(Reply):
    kept: bool = _field(bool, "false when the job had a descriptor already (declared, or an earlier rank's)")


@dataclass(slots=True)
class JobDescribe(Message):
    TYPE: ClassVar[str] = "job.describe"
    REPLY: ClassVar[type[Reply]] = JobDescribeReply
    job_id: str = _field(str, "the job")
    model: dict = _field(dict, "{parameters, flops_per_sample, layers, batch_size, mix}: a rank measured its model")


@dataclass(slots=True, kw_only=True)
class JobResultReply(Reply):
    """ok: the job has ended with rank 0's return value."""


@dataclass(slots=True)
class JobResult(Message):
    TYPE: ClassVar[str] = "job.result"
    REPLY: ClassVar[type[Reply]] = JobResultReply
    job_id: str = _field(str, "the job")
    value: Any = _field(object, "the value (JSON)", None, always=True)


@dataclass(slots=True, kw_only=True)
class JobFailedReply(Reply):
    """ok: the job has failed."""


@dataclass(slots=True)
class JobFailed(Message):
    TYPE: ClassVar[str] = "job.failed"
    REPLY: ClassVar[type[Reply]] = JobFailedReply
    job_id: str = _field(str, "the job")
    error: str = _field(str, "traceback text")
    value: Any = _field(object, "the serialized remote exception", None)


@dataclass(slots=True, kw_only=True)
class JobGetReply(Reply):
    job: dict = _field(dict, "{id, status, progress, result, error, spec, …}: the job's record")
    checkpoint: str = _field(str, "where its ranks commit (a path)")


@dataclass(slots=True)
class JobGet(Message):
    TYPE: ClassVar[str] = "job.get"
    READ_ONLY: ClassVar[bool] = True
    REPLY: ClassVar[type[Reply]] = JobGetReply
    job_id: str = _field(str, "the job")


@dataclass(slots=True, kw_only=True)
class JobStatusReply(Reply):
    jobs: dict = _field(
        dict, "{id: {id, status, progress, committed, result, error[, node_type, why]}}: the known jobs among those"
    )


@dataclass(slots=True)
class JobStatusQuery(Message):
    TYPE: ClassVar[str] = "job.status"
    READ_ONLY: ClassVar[bool] = True
    REPLY: ClassVar[type[Reply]] = JobStatusReply
    job_ids: list = _field(list, "the jobs [str]")


@dataclass(slots=True, kw_only=True)
class JobCancelReply(Reply):
    """ok: the job is cancelled."""


@dataclass(slots=True)
class JobCancel(Message):
    TYPE: ClassVar[str] = "job.cancel"
    REPLY: ClassVar[type[Reply]] = JobCancelReply
    job_id: str = _field(str, "the job")


@dataclass(slots=True, kw_only=True)
class StateSnapshotReply(Reply):
    jobs: list = _field(list, "every job's record, without the code it ships [{id, status, spec, …}]")
    pilots: list = _field(
        list, "the pilots [{id, scheduler_id, state, nodes, requested, submitted, walltime_end, pid, node_type}]"
    )
    nodes: list = _field(list, "the nodes not gone [{name, state, pilot, job, …}]")
    counters: dict = _field(dict, "{name: count}: what the controller has counted")
    events: list = _field(list, "the latest 50 events of the journal")
    incarnation: int = _field(int, "the controller's incarnation")
    placement: dict = _field(dict, "{job: {node_type, why, …}}: where the typed machine's policy placed each job")
    notices: list = _field(list, "what the user is told (once each)")
    node_seconds: dict = _field(dict, "node-seconds so far, by what they were spent on")


@dataclass(slots=True)
class StateSnapshot(Message):
    TYPE: ClassVar[str] = "state.snapshot"
    READ_ONLY: ClassVar[bool] = True
    REPLY: ClassVar[type[Reply]] = StateSnapshotReply


@dataclass(slots=True, kw_only=True)
class RdzvJoinReply(Reply):
    """The torch runtime's (:meth:`pilotfill.elastic.rendezvous.RendezvousBook.join`)."""

    state: str = _field(
        str, "wait (ask again shortly), closed (the round is formed) or ended (no part in the job: exit)"
    )
    round: int | None = _field(int, "the round (closed; wait, when it is known)", None)
    rank: int | None = _field(int, "its node rank (closed)", None)
    world_size: int | None = _field(int, "the round's nodes (closed)", None)
    hosts: list | None = _field(list, "the round's hosts by rank [str] (closed)", None)
    store: dict | None = _field(
        dict, "{host, port, prefix}: the run's torch store and the round's namespace (closed)", None
    )
    in_place: bool = _field(bool, "the job's ranks re-form in place: its rounds are staged", False)


@dataclass(slots=True)
class RdzvJoin(Message):
    TYPE: ClassVar[str] = "rdzv.join"
    READ_ONLY: ClassVar[bool] = True
    REPLY: ClassVar[type[Reply]] = RdzvJoinReply
    job_id: str = _field(str, "the job")
    host: str = _field(str, "the joining agent's node")
    last_round: int = _field(int, "the last round it was in")
    in_place: bool = _field(
        bool, "its workers re-form in place (they reached a loader boundary): the job's rounds are staged", False
    )


@dataclass(slots=True, kw_only=True)
class RdzvPollReply(Reply):
    """The torch runtime's (:meth:`pilotfill.elastic.rendezvous.RendezvousBook.poll`)."""

    waiting: int = _field(int, "nodes that joined a newer round or left since its round (0: keep training)")
    current: int = _field(int, "the latest round")
    member: bool = _field(bool, "the host is in the latest round")
    same_hosts: bool | None = _field(
        bool, "the latest round has its round's hosts: a re-form after a failure (absent: the job is unknown)", None
    )
    in_place: bool = _field(bool, "the job's ranks re-form in place", False)


@dataclass(slots=True)
class RdzvPoll(Message):
    TYPE: ClassVar[str] = "rdzv.poll"
    READ_ONLY: ClassVar[bool] = True
    REPLY: ClassVar[type[Reply]] = RdzvPollReply
    job_id: str = _field(str, "the job")
    host: str = _field(str, "the asking agent's node")
    round: int = _field(int, "its round")
    in_place: bool = _field(bool, "its workers re-form in place (as rdzv.join's)", False)


BY_TYPE: dict[str, type[Message]] = {m.TYPE: m for m in Message.__subclasses__()}
"""Every request type: the controller's handler table is keyed by these. (The run's torch store's requests are
:class:`Message` too, made after these in :mod:`pilotfill.elastic.torch.store`: not the controller's, not here.)"""
FIELDS: dict[str, dict[str, type | tuple[type, ...]]] = {
    t: {f.name: f.metadata["check"] for f in fields(m) if f.default is MISSING} for t, m in BY_TYPE.items()
}
"""Each type's required fields and their types (made from the message classes)."""
READ_ONLY = {t for t, m in BY_TYPE.items() if m.READ_ONLY}  # nothing journaled


def parse(message: dict[str, Any]) -> Message:
    """The request as its message class, checked (:class:`ProtocolError` naming the type and field otherwise)."""
    cls = BY_TYPE.get(message.get("type"))  # type: ignore[arg-type]
    if cls is None:
        raise ProtocolError(f"unknown message type {message.get('type')!r}")
    return cls.parse(message)


def check(message: dict[str, Any]) -> str:
    """The message's type, after checking its fields."""
    return parse(message).TYPE


def _fields_text(cls: type) -> str:
    """A message's or a reply's fields for the table: each with what it means, optional ones in brackets."""
    parts = []
    for f in fields(cls):
        text = f"`{f.name}`" + (f": {f.metadata['doc']}" if f.metadata["doc"] else "").replace("|", "\\|")
        parts.append(text if f.default is MISSING else f"[{text}]")
    return "; ".join(parts)


def table(by_type: dict[str, type[Message]] | None = None) -> str:
    """The protocol as a Markdown table, made from the message and reply classes (``docs/protocol.md``): the
    controller's requests, or those of ``by_type`` (``torch.store.STORE_BY_TYPE``: the run's torch store's). A reply
    with no fields but ``ok`` is shown by its docstring."""
    rows = ["| type | fields | reply |", "| --- | --- | --- |"]
    for t, m in (BY_TYPE if by_type is None else by_type).items():
        reply = _fields_text(m.REPLY) or " ".join((m.REPLY.__doc__ or "ok").split()).rstrip(".").replace("|", "\\|")
        rows.append(f"| `{t}` | {_fields_text(m) or '—'} | {reply} |")
    return "\n".join(rows) + "\n"


def _number(value: Any) -> bool:
    """A real, finite number (not a bool, not NaN, not infinite)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_curve(spec: dict[str, Any], key: str, values: str) -> None:
    """``spec[key]``, when given, must be ``{nodes: [...], <values>: [...]}`` making a valid curve."""
    curve = spec.get(key)
    if curve is None:
        return
    if (
        not isinstance(curve, dict)
        or not isinstance(curve.get("nodes"), list)
        or not isinstance(curve.get(values), list)
    ):
        raise ProtocolError(f"job spec: {key} must be {{nodes: [...], {values}: [...]}}")
    from .allocator import ProblemError, ScalingCurve

    try:
        ScalingCurve(tuple(curve["nodes"]), tuple(curve[values]))
    except (ProblemError, TypeError, ValueError) as exc:
        raise ProtocolError(f"job spec: {key}: {exc}") from None


class JobSpec(TypedDict, total=False):
    """A job as ``job.submit`` carries it and the journal keeps it, after :func:`check_spec` (which fills in
    :data:`SPEC_DEFAULTS`). Each key's type and meaning is here once:
    a type checker checks the controller's reads against it,
    and the job spec's table in ``docs/protocol.md`` is made from it (:func:`spec_table`)."""

    name: Annotated[Required[str], "the job's name"]
    entry: Annotated[str, "'module:function' every rank runs (or `payload`)"]
    payload: Annotated[str, "a function and its arguments packed by Parsl's serializer, base64 (or `entry`)"]
    args: Annotated[list, "its positional arguments"]
    kwargs: Annotated[dict, "its keyword arguments"]
    min_nodes: Annotated[Required[int], "the fewest nodes it runs on (1 <= min_nodes <= max_nodes)"]
    max_nodes: Annotated[
        Required[int], "the most it can use (more than the machine could ever give: the machine's size)"
    ]
    total_samples: Annotated[float | None, "its work in samples, when known (it ends when its function returns)"]
    curve: Annotated[dict | None, "{nodes, samples_per_s}: its throughput per node count (absent: learned online, JPA)"]
    curves: Annotated[dict, "{TYPE: {nodes, samples_per_s}}: its curve on each node type of a typed machine"]
    objective: Annotated[dict, "{nodes, values}: a metric the allocator maximises instead of throughput (e.g. speedup)"]
    scale_up_cost_s: Annotated[
        float, "what growing costs it (a prior: measured from its own resizes unless costs_known)"
    ]
    scale_down_cost_s: Annotated[float, "what shrinking costs it (likewise)"]
    restart_cost_s: Annotated[float, "what a stop and a start cost it (likewise)"]
    costs_known: Annotated[bool, "the three costs are measured already: not learned again"]
    weight: Annotated[float, "its share of the objective (positive)"]
    group: Annotated[
        str,
        "who it shares the machine as (a campaign, a user, a model family): "
        'with objective = "share" each group gets its share first',
    ]
    key: Annotated[str, "the app call: a re-run's submission of the same call resumes its job"]
    fresh: Annotated[
        bool,
        "elastic_app(cache=False): a call never answered by a finished job of the same key, "
        "nor resumed from its commits",
    ]
    runtime: Annotated[str, "the runtime its code is written for: " + ", ".join(RUNTIMES) + " (default: the config's)"]
    model: Annotated[
        dict, "{parameters, flops_per_sample, layers, batch_size, mix}: its model, for the similarity policy"
    ]
    model_name: Annotated[
        str,
        "its model's name: under admission by worth, "
        "before it reports it is valued by what its model's other jobs reported",
    ]
    runtime_detected: Annotated[
        str, "set by elastic_app: what in the app's code chose its runtime (said to the user once)"
    ]
    global_batch: Annotated[
        int,
        "samples per optimizer step whatever the world size (ElasticLoader): it is given at most the ranks that feeds",
    ]
    min_per_rank: Annotated[int, "with global_batch: the fewest samples of a step a rank takes (absent: 1)"]
    adaptive: Annotated[
        dict,
        "{base_batch, max_batch, rule}: its batch grows with its ranks (elastic_app(global_batch=Adaptive(...))): "
        "a node is valued by samples/s times the batch's statistical efficiency",
    ]
    ranks_per_node: Annotated[int, "set by the controller at a start on a typed machine: the type's ranks per node"]
    gpus_per_node: Annotated[int, "likewise: the type's GPUs per node"]


SPEC_DEFAULTS: JobSpec = {
    "args": [],
    "kwargs": {},
    "total_samples": None,
    "curve": None,
    "scale_up_cost_s": 10.0,
    "scale_down_cost_s": 5.0,
    "restart_cost_s": 30.0,
    "weight": 1.0,
}
"""What :func:`check_spec` fills in for a key a submission leaves out."""


def spec_table() -> str:
    """The job spec's keys as a Markdown table, made from :class:`JobSpec` (``docs/protocol.md``)."""
    import typing

    rows = ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    for name, hint in typing.get_type_hints(JobSpec, include_extras=True).items():
        kind, doc = typing.get_args(hint)[0], hint.__metadata__[0]
        required = typing.get_origin(kind) is Required
        if required:
            kind = typing.get_args(kind)[0]
        text = (
            getattr(kind, "__name__", None)
            if not typing.get_args(kind)
            else " \\| ".join(getattr(a, "__name__", str(a)) for a in typing.get_args(kind))
        )
        default = "required" if required else json.dumps(SPEC_DEFAULTS[name]) if name in SPEC_DEFAULTS else "—"
        rows.append(
            f"| `{name}` | {text.replace('NoneType', 'null')} | {default} | {doc.replace('|', chr(92) + '|')} |"
        )
    return "\n".join(rows) + "\n"


def check_spec(spec: dict[str, Any]) -> JobSpec:
    """Validate a job spec (:class:`JobSpec`); return it with :data:`SPEC_DEFAULTS` filled in.
    An error names the key."""
    unknown = sorted(set(spec) - set(JobSpec.__annotations__))
    if unknown:  # a typo of an optional key would otherwise be ignored without a word
        close = difflib.get_close_matches(unknown[0], sorted(JobSpec.__annotations__), n=1, cutoff=0.6)
        raise ProtocolError(f"job spec: unknown key {unknown[0]!r}" + (f"; did you mean {close[0]}?" if close else ""))
    # its own list and dict
    out: JobSpec = {**SPEC_DEFAULTS, "args": [], "kwargs": {}, **spec}  # type: ignore[typeddict-item]
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
            raise ProtocolError(
                f"job spec: {name} must be a {'positive' if name == 'weight' else 'non-negative'} finite number, "
                f"got {out[name]!r}"
            )
    if not isinstance(out.get("costs_known", False), bool):
        raise ProtocolError("job spec: costs_known must be true or false")
    if out.get("runtime") is not None and out["runtime"] not in RUNTIMES:
        raise ProtocolError(f"job spec: runtime must be one of {', '.join(RUNTIMES)}, got {out['runtime']!r}")
    if out.get("key") is not None and not isinstance(out["key"], str):
        raise ProtocolError("job spec: key must be a string")
    if not isinstance(out.get("fresh", False), bool):
        raise ProtocolError("job spec: fresh must be true or false")
    if out.get("group") is not None and not isinstance(out["group"], str):
        raise ProtocolError(
            f"job spec: group must be a string (a campaign, a user, a model family), got {out['group']!r}"
        )
    if out.get("model_name") is not None and not isinstance(out["model_name"], str):
        raise ProtocolError(f"job spec: model_name must be a string, got {out['model_name']!r}")
    for name in ("global_batch", "min_per_rank"):
        value = out.get(name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ProtocolError(f"job spec: {name} must be an integer >= 1, got {value!r}")
    if out.get("min_per_rank") is not None and out.get("global_batch") is None:
        raise ProtocolError("job spec: min_per_rank needs global_batch")
    if out.get("adaptive") is not None:
        from .elastic.adaptive import Adaptive

        try:
            Adaptive.from_spec(out["adaptive"])
        except (TypeError, KeyError, ValueError) as exc:
            raise ProtocolError(f"job spec: adaptive must be {{base_batch, max_batch, rule}}: {exc}") from None
        if out.get("objective") is not None:
            raise ProtocolError(
                "job spec: adaptive values the job by its batch's efficiency; it takes no objective as well"
            )
    _check_curve(out, "curve", "samples_per_s")
    _check_curve(out, "objective", "values")
    curves = out.get("curves")
    if curves is not None:
        if not isinstance(curves, dict) or not curves or not all(isinstance(t, str) and t for t in curves):
            raise ProtocolError(
                "job spec: curves must be {TYPE: {nodes: [...], samples_per_s: [...]}} for at least one node type"
            )
        for t, curve in curves.items():
            _check_curve({"c": curve}, "c", "samples_per_s")
    if out.get("model") is not None:
        from .allocator.similarity import Descriptor, LibraryError

        try:
            out["model"] = Descriptor.from_dict(out["model"], "job spec: model").to_dict()
        except LibraryError as exc:
            raise ProtocolError(str(exc)) from None
    return out


if __name__ == "__main__":  # the tables of docs/protocol.md
    print(table(), end="")
    print()
    print(spec_table(), end="")
    print()
    from .elastic.torch.store import STORE_BY_TYPE

    print(table(STORE_BY_TYPE), end="")
