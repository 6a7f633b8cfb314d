"""Readers for the two file formats of ``shared/data``: node-availability traces and job lists.

Trace: ``time,node,state`` rows; the first rows (all at the first time) list
every node of the machine and its state, later rows are transitions (``idle``:
the main scheduler left the node free, ``busy``: taken back), and an optional
last row ``end`` with an empty node closes the trace. A machine with several
kinds of node names each node's type: an optional ``type`` column (on the
first rows, where every node is listed), or a node-type map beside the trace
(``node,type`` rows; ``node,gpu_type`` as the heterogeneous data set writes it).
Jobs: one row per training job with its bounds, work, rescale costs and
measured curve (``nodes`` and ``samples_per_s``, ``;``-separated), optionally
an ``objective`` curve at the same node counts and a ``weight``, and per node
type a curve ``samples_per_s@TYPE`` (on ``nodes``, or on ``nodes@TYPE`` where
given; an empty cell: the job does not run on that type). Without ``@``
columns a job file is what it always was; with them, ``samples_per_s`` stays
the curve a machine with one kind of node (or a type-blind allocator) uses.

Every problem is reported as a :class:`InputError` naming the file and line,
because a site admin feeding in their own log needs to know where to look.
"""

from __future__ import annotations

import csv
import gzip
import io
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

from .allocator import ProblemError, ScalingCurve
from .allocator.similarity import LAYER_KINDS, Descriptor, LibraryError


def shown(text: str, limit: int = 120) -> str:
    """``text`` as quoted in an error: whole if short, its start and length if not (a bad row may be megabytes)."""
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}… ({len(text):,} characters)"


class InputError(ValueError):
    """Bad input, located: ``str()`` reads ``FILE:LINE: what is wrong``."""

    def __init__(self, path: str | Path, line: int | None, message: str):
        self.path, self.line, self.message = str(path), line, message
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {message}")


def parse_time(text: str) -> float:
    """ISO-8601 (``2021-02-10T20:21:15Z``) to POSIX seconds; naive times are UTC."""
    dt = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()


def format_time(t: float) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _open(path: Path) -> io.TextIOBase:
    if not path.exists():
        raise InputError(path, None, "no such file")
    if not path.is_file():
        raise InputError(path, None, "not a file (a directory?)")
    if path.suffix == ".gz":
        return gzip.open(path, "rt", newline="")
    return open(path, newline="")


def _rows(
    path: Path, header: tuple[str, ...], optional: tuple[str, ...] = (), prefixes: tuple[str, ...] = ()
) -> Iterator[tuple[int, dict[str, str]]]:
    """Rows as dicts with their 1-based line numbers, after checking the header (``prefixes``: optional columns
    named ``PREFIX@NAME``, e.g. ``samples_per_s@v100``; NAME must be a node type's name)."""
    with _open(path) as f:
        reader = csv.reader(f)
        try:
            first = next(reader)
        except StopIteration:
            raise InputError(path, 1, "empty file") from None
        except (OSError, EOFError, csv.Error, UnicodeDecodeError) as exc:
            raise InputError(path, 1, f"unreadable: {exc}") from None
        names = tuple(c.strip() for c in first)
        missing = [h for h in header if h not in names]
        extra = [n for n in names if n not in header and n not in optional and not _prefixed(n, prefixes)]
        if missing or extra:
            also = [*optional, *(f"{p}@TYPE" for p in prefixes)]
            raise InputError(
                path,
                1,
                f"header must be {','.join(header)}"
                + (f" (optional: {','.join(also)})" if also else "")
                + f"; got {','.join(names)}",
            )
        if len(set(names)) != len(names):
            raise InputError(path, 1, f"column {next(n for n in names if names.count(n) > 1)!r} named twice")
        try:
            for row in reader:
                line = reader.line_num
                if not row:
                    continue
                if len(row) != len(names):
                    raise InputError(
                        path, line, f"expected {len(names)} fields, got {len(row)}: {shown(','.join(row))}"
                    )
                yield line, dict(zip(names, row))
        except (OSError, EOFError, csv.Error, UnicodeDecodeError) as exc:
            raise InputError(path, reader.line_num, f"unreadable: {exc}") from None


NODE_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,62}")
"""A node type's name: what configs, job-file columns (``samples_per_s@NAME``) and node-type maps write."""


def _prefixed(name: str, prefixes: tuple[str, ...]) -> bool:
    base, at, kind = name.partition("@")
    return bool(at) and base in prefixes and bool(NODE_TYPE.fullmatch(kind))


# ---------------------------------------------------------------- traces


@dataclass(frozen=True)
class TraceStep:
    """All transitions at one time: the nodes that became idle and those taken back."""

    time: float
    to_idle: tuple[str, ...]
    to_busy: tuple[str, ...]


@dataclass(frozen=True)
class Trace:
    """A node-availability trace restricted to a node subset and a window."""

    path: str
    nodes: tuple[str, ...]
    start: float
    end: float
    initial_idle: frozenset[str]
    steps: tuple[TraceStep, ...]
    types: Mapping[str, str] = field(default_factory=dict)  # node -> its type (empty: one kind of node)

    @property
    def transitions(self) -> int:
        return sum(len(s.to_idle) + len(s.to_busy) for s in self.steps)

    def only(self, nodes: Iterable[str]) -> Trace:
        """This trace on ``nodes`` alone (those of its own; the order kept): a slice of the machine, as the share
        objective's isolated share is judged on (``benchmarks/bench_hetero.py``)."""
        keep = set(nodes)
        steps = []
        for s in self.steps:
            idle, busy = tuple(n for n in s.to_idle if n in keep), tuple(n for n in s.to_busy if n in keep)
            if idle or busy:
                steps.append(TraceStep(s.time, idle, busy))
        return Trace(
            self.path,
            tuple(n for n in self.nodes if n in keep),
            self.start,
            self.end,
            self.initial_idle & keep,
            tuple(steps),
            {n: t for n, t in self.types.items() if n in keep},
        )

    def beside(self, other: Trace, prefix: str) -> Trace:
        """This machine and ``other`` as one, ``other``'s nodes named with ``prefix`` (a machine twice the size:
        ``benchmarks/bench_replay.py``'s next-generation cell puts a week beside itself). Both traces' events keep
        their times; the window is the union of both."""
        if any(n.startswith(prefix) for n in self.nodes):
            raise ValueError(f"prefix {prefix!r} would name some of this trace's own nodes")
        renamed = lambda names: tuple(prefix + n for n in names)  # noqa: E731
        at: dict[float, tuple[list[str], list[str]]] = {}
        for s, names in ((s, (list(s.to_idle), list(s.to_busy))) for s in self.steps):
            idle, busy = at.setdefault(s.time, ([], []))
            idle += names[0]
            busy += names[1]
        for s in other.steps:
            idle, busy = at.setdefault(s.time, ([], []))
            idle += renamed(s.to_idle)
            busy += renamed(s.to_busy)
        steps = tuple(TraceStep(t, tuple(idle), tuple(busy)) for t, (idle, busy) in sorted(at.items()))
        types = {**self.types, **{prefix + n: t for n, t in other.types.items()}}
        return Trace(
            f"{self.path} + {other.path}",
            self.nodes + renamed(other.nodes),
            min(self.start, other.start),
            max(self.end, other.end),
            self.initial_idle | frozenset(renamed(other.initial_idle)),
            steps,
            types,
        )

    def type_counts(self) -> dict[str, int]:
        """Nodes of each type (the machine's shape; empty for a machine with one kind of node)."""
        out: dict[str, int] = {}
        for n in self.nodes:
            if n in self.types:
                out[self.types[n]] = out.get(self.types[n], 0) + 1
        return out


STATES = {"idle": True, "busy": False}


def read_trace(
    path: str | Path,
    nodes: int | None = None,
    start: float | None = None,
    end: float | None = None,
    types: str | Path | Mapping[str, str] | None = None,
    nodes_per_type: int | None = None,
) -> Trace:
    """Read a trace; keep the first ``nodes`` nodes (file order) and the window [start, end].

    The state at ``start`` is every transition up to and including it; steps
    are the later distinct times that change at least one kept node.
    ``types``: a node-type map (a file, see :func:`read_node_types`, or a
    mapping) for a trace that does not name its nodes' types itself.
    ``nodes_per_type``: keep the first that many nodes of each type instead
    (a typed machine's blocks may be contiguous in file order: the first N
    nodes may all be of one type).
    """
    path = Path(path)
    if nodes is not None and nodes < 1:
        raise InputError(path, None, f"--nodes must be at least 1, got {nodes}")
    if nodes_per_type is not None and nodes_per_type < 1:
        raise InputError(path, None, f"--nodes-per-type must be at least 1, got {nodes_per_type}")
    if nodes is not None and nodes_per_type is not None:
        raise InputError(path, None, "--nodes and --nodes-per-type cannot be used together")
    given: dict[str, str] = {}
    if types is not None:
        given = dict(types) if isinstance(types, Mapping) else read_node_types(types)
    named: dict[str, str] = {}  # from the trace's own type column
    times: dict[str, float] = {}
    order: list[str] = []
    state: dict[str, bool] = {}
    keep: set[str] | None = None
    first_time: float | None = None
    last_time = -math.inf
    trace_end: float | None = None
    steps: list[TraceStep] = []
    pending_t: float | None = None
    pending: dict[str, bool] = {}

    def flush() -> None:
        nonlocal pending
        if pending_t is None or not pending:
            return
        if start is not None and pending_t <= start:
            state.update(pending)
        else:
            to_idle = tuple(n for n, idle in pending.items() if idle and not state[n])
            to_busy = tuple(n for n, idle in pending.items() if not idle and state[n])
            state.update(pending)
            if to_idle or to_busy:
                steps.append(TraceStep(pending_t, to_idle, to_busy))
        pending = {}

    def kept_nodes() -> list[str]:
        if nodes_per_type is None:
            return order[:nodes] if nodes is not None else order
        typed = {**given, **named}
        untyped = [n for n in order if n not in typed]
        if untyped:
            raise InputError(
                path, None, f"--nodes-per-type needs every node's type; {len(untyped)} have none (e.g. {untyped[0]!r})"
            )
        seen: dict[str, int] = {}
        out = []
        for n in order:
            k = seen.get(typed[n], 0)
            if k < nodes_per_type:
                seen[typed[n]] = k + 1
                out.append(n)
        return out

    for line, row in _rows(path, ("time", "node", "state"), optional=("type",)):
        stamp = row["time"]
        t = times.get(stamp)
        if t is None:
            try:
                t = times[stamp] = parse_time(stamp)
            except ValueError:
                raise InputError(
                    path, line, f"bad time {shown(stamp)} (want ISO-8601, e.g. 2021-02-10T20:21:15Z)"
                ) from None
        if t < last_time:
            raise InputError(path, line, f"time goes backwards: {stamp} after {format_time(last_time)}")
        if trace_end is not None:
            raise InputError(path, line, "rows after the 'end' row")
        name, st = row["node"].strip(), row["state"].strip()
        if st == "end":
            if name:
                raise InputError(path, line, f"the 'end' row must have an empty node, got {name!r}")
            trace_end = t
            last_time = t
            continue
        if st not in STATES:
            raise InputError(path, line, f"unknown state {shown(st)} (want idle, busy or end)")
        if not name:
            raise InputError(path, line, "empty node name")
        kind = row.get("type", "").strip()
        if kind and not NODE_TYPE.fullmatch(kind):
            raise InputError(path, line, f"bad node type {shown(kind)} (letters, digits, '.', '_', '+', '-')")
        if first_time is None:
            first_time = t
        if keep is None:
            if t == first_time:  # the initial block lists the machine
                if name in state:
                    raise InputError(path, line, f"node {name!r} listed twice in the initial state")
                order.append(name)
                state[name] = STATES[st]
                if kind:
                    named[name] = kind
                last_time = t
                continue
            keep = set(kept_nodes())
        if kind and named.get(name, kind) != kind:
            raise InputError(path, line, f"node {name!r} is of type {named[name]!r} (its first row), not {kind!r}")
        if name not in state:
            raise InputError(
                path, line, f"node {shown(name)} is not in the initial state (the first rows must list every node)"
            )
        last_time = t
        if name not in keep:
            continue
        if t != pending_t:
            flush()
            pending_t = t
        pending[name] = STATES[st]
    flush()

    if first_time is None:
        raise InputError(path, None, "trace has no node rows")
    kept = tuple(kept_nodes())
    if nodes is not None and nodes > len(order):
        raise InputError(path, None, f"--nodes {nodes} but the trace has only {len(order)} nodes")
    node_types = _trace_types(path, kept, named, given, types)
    begin = first_time if start is None else start
    stop = end if end is not None else (trace_end if trace_end is not None else last_time)
    if stop <= begin:
        raise InputError(
            path, None, f"window is empty: end {format_time(stop)} is not after start {format_time(begin)}"
        )
    steps_in = tuple(s for s in steps if s.time <= stop)
    # state[] is now the final state; undo every recorded step to get the state at `begin`.
    now = dict(state)
    for s in reversed(steps):
        for n in s.to_idle:
            now[n] = False
        for n in s.to_busy:
            now[n] = True
    return Trace(
        path=str(path),
        nodes=kept,
        start=begin,
        end=stop,
        initial_idle=frozenset(n for n in kept if now[n]),
        steps=steps_in,
        types=node_types,
    )


def _trace_types(
    path: Path, kept: tuple[str, ...], named: dict[str, str], given: dict[str, str], source
) -> dict[str, str]:
    """The kept nodes' types: from the trace's column and the map, which must agree and cover every kept node."""
    if not named and not given:
        return {}
    where = source if isinstance(source, (str, Path)) else path
    out = {}
    for n in kept:
        a, b = named.get(n), given.get(n)
        if a is not None and b is not None and a != b:
            raise InputError(where, None, f"node {n!r} is of type {b!r} here but {a!r} in the trace {path}")
        kind = a or b
        if kind is None:
            raise InputError(
                where, None, f"node {n!r} of the trace {path} has no type (a typed machine names every node's type)"
            )
        out[n] = kind
    return out


def read_node_types(path: str | Path) -> dict[str, str]:
    """A node-type map: ``node,type`` rows (``node,gpu_type`` is read the same), one per node."""
    path = Path(path)
    out: dict[str, str] = {}
    column = None
    for line, row in _rows(path, ("node",), optional=("type", "gpu_type")):
        if column is None:
            present = [c for c in ("type", "gpu_type") if c in row]
            if len(present) != 1:
                raise InputError(path, 1, "header must be node,type (or node,gpu_type)")
            column = present[0]
        name, kind = row["node"].strip(), row[column].strip()
        if not name:
            raise InputError(path, line, "empty node name")
        if not NODE_TYPE.fullmatch(kind):
            raise InputError(
                path, line, f"bad node type {shown(kind)} (letters, digits, '.', '_', '+', '-'; at most 63)"
            )
        if name in out:
            raise InputError(path, line, f"node {name!r} listed twice")
        out[name] = kind
    if not out:
        raise InputError(path, None, "no nodes")
    return out


# ---------------------------------------------------------------- jobs


@dataclass(frozen=True)
class JobSpec:
    """One training job of a job file."""

    name: str
    model: str
    submit_time: float
    min_nodes: int
    max_nodes: int
    total_samples: float
    scale_up_cost_s: float
    scale_down_cost_s: float
    throughput: ScalingCurve
    objective: ScalingCurve | None = None
    weight: float = 1.0
    line: int = 0
    # per node type (``samples_per_s@TYPE``); empty: untyped
    curves: Mapping[str, ScalingCurve] = field(default_factory=dict)
    descriptor: Descriptor | None = None  # the model's descriptor (:mod:`pilotfill.allocator.similarity`), when known
    group: str = ""  # who it shares the machine as (optional ``group`` column): the share objective's unit

    def curve_on(self, node_type: str | None) -> ScalingCurve | None:
        """The job's rate on ``node_type``: its curve there; the base curve for an untyped job (or an untyped
        machine); None where the job file says it does not run on that type."""
        if node_type is None or not self.curves:
            return self.throughput
        return self.curves.get(node_type)


JOB_COLUMNS = (
    "name",
    "model",
    "submit_time",
    "min_nodes",
    "max_nodes",
    "total_samples",
    "scale_up_cost_s",
    "scale_down_cost_s",
    "nodes",
    "samples_per_s",
)


def read_jobs(path: str | Path) -> list[JobSpec]:
    """Read a job file; jobs come back in submission order (file order among equal times)."""
    path = Path(path)
    jobs: list[JobSpec] = []
    names: set[str] = set()
    for line, row in _rows(
        path, JOB_COLUMNS, optional=("objective", "weight", "group"), prefixes=("samples_per_s", "nodes")
    ):
        jobs.append(_job(path, line, row))
        if jobs[-1].name in names:
            raise InputError(path, line, f"job name {jobs[-1].name!r} used twice")
        names.add(jobs[-1].name)
    if not jobs:
        raise InputError(path, None, "no jobs")
    return sorted(jobs, key=lambda j: (j.submit_time, j.line))


def _job(path: Path, line: int, row: dict[str, str]) -> JobSpec:
    def number(col: str, kind=float):
        text = row[col].strip()
        try:
            value = kind(text)
        except ValueError:
            raise InputError(
                path, line, f"{col} must be {'an integer' if kind is int else 'a number'}, got {shown(text)}"
            ) from None
        if isinstance(value, float) and not math.isfinite(value):
            raise InputError(path, line, f"{col} must be finite, got {text!r}")
        return value

    def curve(col: str, counts: list[int]) -> ScalingCurve:
        try:
            values = [float(v) for v in row[col].split(";")]
        except ValueError:
            raise InputError(path, line, f"{col} must be ';'-separated numbers, got {shown(row[col])}") from None
        if len(values) != len(counts):
            raise InputError(path, line, f"{col} has {len(values)} values for {len(counts)} node counts")
        try:
            return ScalingCurve(tuple(counts), tuple(values))
        except ProblemError as exc:
            raise InputError(path, line, f"{col}: {exc}") from None

    name = row["name"].strip()
    if not name:
        raise InputError(path, line, "empty job name")
    try:
        submit = parse_time(row["submit_time"])
    except ValueError:
        raise InputError(path, line, f"bad submit_time {shown(row['submit_time'])}") from None
    lo, hi = number("min_nodes", int), number("max_nodes", int)
    if lo < 1:
        raise InputError(path, line, f"min_nodes must be at least 1, got {lo}")
    if lo > hi:
        raise InputError(path, line, f"min_nodes {lo} > max_nodes {hi}")
    total = number("total_samples")
    if total <= 0:
        raise InputError(path, line, f"total_samples must be positive, got {total}")
    up, down = number("scale_up_cost_s"), number("scale_down_cost_s")
    if up < 0 or down < 0:
        raise InputError(path, line, "rescale costs must be >= 0")
    try:
        counts = [int(n) for n in row["nodes"].split(";")]
    except ValueError:
        raise InputError(path, line, f"nodes must be ';'-separated integers, got {shown(row['nodes'])}") from None
    if counts[0] != 0:
        raise InputError(path, line, f"the curve must start at 0 nodes, starts at {counts[0]}")
    thr = curve("samples_per_s", counts)
    obj = curve("objective", counts) if row.get("objective", "").strip() else None
    weight = number("weight") if row.get("weight", "").strip() else 1.0
    if weight <= 0:
        raise InputError(path, line, f"weight must be positive, got {weight}")
    curves: dict[str, ScalingCurve] = {}
    for col in row:
        if not col.startswith("nodes@"):
            continue
        kind = col.partition("@")[2]
        if f"samples_per_s@{kind}" not in row:
            raise InputError(path, 1, f"{col} without samples_per_s@{kind}")
    for col in row:
        if not col.startswith("samples_per_s@") or not row[col].strip():
            continue  # an empty cell: the job does not run on that type
        kind = col.partition("@")[2]
        grid = counts
        if row.get(f"nodes@{kind}", "").strip():
            try:
                grid = [int(n) for n in row[f"nodes@{kind}"].split(";")]
            except ValueError:
                raise InputError(
                    path, line, f"nodes@{kind} must be ';'-separated integers, got {shown(row[f'nodes@{kind}'])}"
                ) from None
        curves[kind] = curve(col, grid)
    if any(col.startswith("samples_per_s@") for col in row) and not curves:
        raise InputError(path, line, "no samples_per_s@TYPE curve: the job runs on no node type")
    return JobSpec(
        name,
        row["model"].strip(),
        submit,
        lo,
        hi,
        total,
        up,
        down,
        thr,
        obj,
        weight,
        line,
        curves,
        group=row.get("group", "").strip(),
    )


# ---------------------------------------------------------------- model descriptors


def read_models(path: str | Path) -> dict[str, Descriptor]:
    """A table of model descriptors: ``model`` and any of ``parameters,flops_per_sample,layers,batch_size`` and the
    layer mix's shares (``conv,linear,recurrent,attention,embedding,norm,other``); ``task`` and ``source`` are notes,
    kept out of the descriptor (the heterogeneous data set's ``models.csv`` reads as it is). Empty cells: unknown."""
    path = Path(path)
    fields = ("parameters", "flops_per_sample", "layers", "batch_size")
    out: dict[str, Descriptor] = {}
    for line, row in _rows(path, ("model",), optional=(*fields, *LAYER_KINDS, "task", "source")):
        name = row["model"].strip()
        if not name:
            raise InputError(path, line, "empty model name")
        if name in out:
            raise InputError(path, line, f"model {name!r} listed twice")
        data: dict[str, object] = {k: row[k].strip() for k in fields if row.get(k, "").strip()}
        mix = {k: row[k].strip() for k in LAYER_KINDS if row.get(k, "").strip()}
        try:
            if mix:
                data["mix"] = {k: float(v) for k, v in mix.items()}
            out[name] = Descriptor.from_dict(data, name)
        except (LibraryError, ValueError) as exc:
            raise InputError(path, line, str(exc)) from None
    if not out:
        raise InputError(path, None, "no models")
    return out


BATCH_SUFFIX = re.compile(r"^(?P<family>.+)-bs(?P<batch>\d+)$")


def descriptor_of(model: str, table: Mapping[str, Descriptor]) -> Descriptor | None:
    """``model``'s descriptor from ``table``: its own row, or (for ``FAMILY-bsN``, the data set's naming) its
    family's row with batch size N; None when the table has neither."""
    if model in table:
        return table[model]
    m = BATCH_SUFFIX.match(model)
    if m and m.group("family") in table:
        return replace(table[m.group("family")], batch_size=float(m.group("batch")))
    return None


def with_models(jobs: list[JobSpec], table: Mapping[str, Descriptor]) -> list[JobSpec]:
    """The jobs, each with its model's descriptor where ``table`` has it (what the decorator would declare)."""
    return [
        replace(j, descriptor=descriptor_of(j.model, table)) if descriptor_of(j.model, table) is not None else j
        for j in jobs
    ]
