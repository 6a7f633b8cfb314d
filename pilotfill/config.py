"""Site configuration: TOML files -> typed, validated objects.

A config names the batch system and its options, the pilot policy and the
controller's timing. Each batch system's own section belongs to its adapter
(``BatchScheduler.config_class`` and ``parse_section``): this module parses the
sections of whatever :mod:`pilotfill.schedulers.registry` names. Every key is checked:
an unknown key, a wrong type or an impossible value is a :class:`ConfigError` naming the file and the key, so a
typo never silently falls back to a default. ``load_config()`` with no
argument returns the embedded default: a local virtual cluster of four nodes
whose main workload replays a time-compressed excerpt of Summit's trace.
"""

from __future__ import annotations

import difflib
import math
import re
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from .elastic.registry import NAMES as RUNTIME_NAMES
from .schedulers.registry import NAMES as BATCH_SYSTEM_NAMES
from .schedulers.registry import adapter_class

PACKAGE_CONFIGS = Path(__file__).parent / "configs"


class ConfigError(ValueError):
    """An invalid config; ``str()`` names the file and the key."""


@dataclass(frozen=True)
class PilotConfig:
    heartbeat_s: float = 1.0
    heartbeat_deadline_s: float = 5.0
    grace_s: float = 5.0
    nodes_per_pilot: int = 1
    max_queued_pilots: int = 10  # pilots of ours waiting in the batch queue at once (sites cap queued jobs per user)
    max_submits_per_minute: int = 12  # submissions in any 60 s; a refused one also backs off (10 s doubling to 5 min)
    release_after_s: float = 30.0  # a node no job uses is kept this long while a running job could still grow onto it


@dataclass(frozen=True)
class ControllerConfig:
    tick_s: float = 0.2
    bind: str = "127.0.0.1"
    # 0: the nodes' expected hold, learned (allocator/horizon.py); > 0: a fixed look-ahead (BFTrainer's 10 s)
    t_fwd: float = 0.0
    # at most this many jobs considered at once (BFTrainer's setup: 10); 0: as many as the machine can start
    max_jobs: int = 0
    # waiting jobs a decision weighs per queue, most promising first (as Slurm's bf_max_job_test); 0: all
    weigh_waiting: int = 128
    solver_time_limit_s: float = 0.5
    formulation: str = "aggregated"  # exact (DP where it applies, MILP otherwise); "milp" or "greedy" to compare
    # the most samples in all (BFTrainer's); "share": each group its share of the machine first (allocator/shares.py)
    objective: str = "samples"
    # objective "share": the most of a decision's samples optimum the shares may cost (1: whole shares at any cost)
    share_cost: float = 0.03
    # which waiting jobs a decision weighs: "worth" (what starting each would add) or "arrival" (BFTrainer's FCFS)
    admission: str = "worth"
    # no job is sized beyond this (or beyond the machine, when the batch system says how big it is)
    max_job_nodes: int = 100_000


@dataclass(frozen=True)
class RuntimeConfig:
    # "torch": torch.distributed.elastic; "horovod": Elastic Horovod (Gloo); "processes": plain rank processes
    kind: str = "processes"
    ranks_per_node: int = 1  # ranks a job runs on each node (one per GPU on GPU nodes)
    gpus_per_node: int = 0  # GPUs each node has: rank i of a node sees only GPU i (CUDA_VISIBLE_DEVICES); 0: no binding
    # hosts are names for this machine (test clusters): ranks start through the local ssh stand-in
    local_hosts: bool = False
    network_interface: str = "lo"  # what Gloo uses between ranks (e.g. "hsn0" on a Slingshot machine)
    # a collective or rendezvous (NCCL, gloo; torch, Horovod) waiting this long for a peer fails; its rank restarts
    collective_timeout_s: float = 120.0
    # a job whose ranks neither report nor print this long is stuck (Horovod): formed again from its last commit
    silent_s: float = 300.0


@dataclass(frozen=True)
class NodeTypeConfig:
    """One kind of node of a machine with several, and how its batch system selects it.

    Slurm: ``partition`` (instead of ``[slurm] partition``), ``constraint``
    (``--constraint``, node features: ``"gpu&hbm80g"``) and/or ``gres``
    (``--gres``, e.g. ``"gpu:a100:4"``). PBS: ``select`` (resources added to
    each select chunk, e.g. ``"gpu_type=a100"`` or ``"ngpus=4:gpu_type=a100"``)
    and/or ``queue``. The local cluster: ``nodes`` (how many of its virtual
    nodes are of this type). ``ranks_per_node``/``gpus_per_node``: the type's,
    where it differs from ``[runtime]``'s (0/-1: the runtime's).
    """

    name: str
    partition: str = ""
    constraint: str = ""
    gres: str = ""
    select: str = ""
    queue: str = ""
    nodes: int = 0
    ranks_per_node: int = 0
    gpus_per_node: int = -1


@dataclass(frozen=True)
class SimilarityConfig:
    """The model-similarity policy's library of measured models (:mod:`pilotfill.allocator.similarity`)."""

    libraries: tuple[str, ...] = ()  # read-only libraries a site ships (JSON)
    # the user's own, read and added to as models are measured; "" : models.json beside the run directory
    library: str = ""
    enabled: bool = True  # false: every type of a new job is learned from nothing
    # a model whose nearest measured model is less similar than this is measured once on every type (0: never)
    far: float = 0.25


@dataclass(frozen=True)
class Config:
    """A site config. Each batch system's own section (``[pbs]``, ``[slurm]``, ``[local]``) is its adapter's dataclass
    (``BatchScheduler.config_class``), kept in ``sections`` by name and read as ``config.pbs``; a section the file does
    not have is its class's defaults."""

    scheduler: str = "local"
    pilots: PilotConfig = field(default_factory=PilotConfig)
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    source: str = "<embedded default>"
    node_types: tuple[NodeTypeConfig, ...] = ()  # a machine with several kinds of node: [node_types.NAME] tables
    similarity: SimilarityConfig = field(default_factory=SimilarityConfig)
    sections: dict[str, Any] = field(default_factory=dict)  # batch system -> its section

    def node_type(self, name: str | None) -> NodeTypeConfig | None:
        return next((t for t in self.node_types if t.name == name), None)

    def section(self, name: str) -> Any:
        """Batch system ``name``'s section: as the file gave it, else its defaults."""
        found = self.sections.get(name)
        return found if found is not None else adapter_class(name).config_class()

    def __getattr__(self, name: str) -> Any:
        if name in BATCH_SYSTEM_NAMES:
            return self.section(name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


SCHEDULERS = BATCH_SYSTEM_NAMES  # pilotfill/schedulers/registry.py
OPTIONAL_STRINGS = {"account", "qos", "python", "library"}
MAY_BE_ZERO = {
    "share_cost",
    "gpus_per_node",
    "release_after_s",
    "t_fwd",
    "max_jobs",
    "weigh_waiting",
    "pilot_walltime_s",
    "far",
}
# Values that validate as numbers and then cannot work (issue: tick_s = 1e12 killed the controller four times with an
# OverflowError in zmq_poll; heartbeat_s = 1e-6 lost 12 pilots in 30 s): (lowest, highest, what goes wrong outside).
BOUNDS: dict[str, tuple[float, float, str]] = {
    "similarity.far": (0.0, 1.0, "a similarity is at most 1: above it every model would be measured on every type"),
    "controller.tick_s": (
        0.01,
        60.0,
        "the controller's loop waits this long between passes; beyond a minute nothing is timely",
    ),
    "controller.solver_time_limit_s": (0.01, 600.0, "a decision may take this long"),
    "controller.share_cost": (0.0, 1.0, "a fraction of the samples optimum"),
    "pilots.heartbeat_s": (0.05, 600.0, "each agent asks the controller this often; faster floods it"),
    "pilots.heartbeat_deadline_s": (0.5, 3600.0, "a pilot silent this long is taken for lost"),
    "pilots.grace_s": (0.1, 3600.0, "ranks get this long to commit after SIGTERM"),
    "pilots.release_after_s": (0.0, 86400.0, "an unused node is kept this long"),
    "runtime.collective_timeout_s": (1.0, 86400.0, "a collective waiting this long for a peer fails"),
    "runtime.silent_s": (10.0, 86400.0, "a job whose ranks are silent this long is formed again"),
}
RUNTIMES = RUNTIME_NAMES  # pilotfill/elastic/registry.py
DRAIN_MARGIN_S = 2.0  # a pilot is drained grace_s + this before its walltime ends (controller/walltime.py)
MIN_TRAIN_S = 15.0
"""A pilot must train at least this long before its drain: a job's start and stop cost that much by default
(its scale-up and scale-down costs), and no job is started on a node that ends sooner —
pilots would come and go, unused."""
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
OBJECTIVES = ("samples", "share")
ADMISSIONS = ("worth", "arrival")  # controller/waiting.py
FORMULATIONS = ("aggregated", "milp", "greedy")  # BFTrainer's node-level model is a baseline, never a decision maker


def load_config(path: str | Path | None = None) -> Config:
    """Read a config file, a name in the package's configs (``local``), or the embedded default."""
    if path is None:
        path = PACKAGE_CONFIGS / "local.toml"
    path = Path(path)
    if not path.exists() and (PACKAGE_CONFIGS / f"{path}.toml").exists():
        path = PACKAGE_CONFIGS / f"{path}.toml"
    if not path.exists():
        bundled = ", ".join(sorted(p.stem for p in PACKAGE_CONFIGS.glob("*.toml")))
        raise ConfigError(f"{path}: no such config file, nor a bundled config of that name (bundled: {bundled})")
    if not path.is_file():
        raise ConfigError(f"{path}: not a file (a config is a TOML file)")
    try:
        data = tomllib.loads(path.read_bytes().decode("utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}): a config is a TOML file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    return parse_config(data, str(path))


def parse_config(data: dict[str, Any], source: str = "<config>") -> Config:
    def where(key: str) -> str:
        return f"{source}: {key}"

    known = {"scheduler", *SCHEDULERS, "pilots", "controller", "runtime", "node_types", "similarity"}
    for key in data:
        if key not in known:
            raise ConfigError(f"{where(key)}: unknown key{_meant(key, known)} (known: {', '.join(sorted(known))})")
    scheduler = data.get("scheduler", "local")
    if isinstance(scheduler, dict):  # [scheduler] kind = "slurm", written the way [runtime] kind is
        kind = scheduler.get("kind")
        name = kind if kind in SCHEDULERS else "slurm"
        options = [k for k in scheduler if k != "kind"]
        moved = (
            f", and its options ({', '.join(options)}) under [{name}]"
            if options
            else f"; its options go under [{name}]"
        )
        raise ConfigError(
            f'{where("scheduler")}: is a plain key, not a table: write scheduler = "{name}" at the top of the file, '
            f"before any [table]{moved}"
        )
    if not isinstance(scheduler, str) or scheduler not in SCHEDULERS:
        raise ConfigError(f"{where('scheduler')}: {scheduler!r} is not one of {', '.join(SCHEDULERS)}")
    for key in known - {"scheduler"}:
        if key in data and not isinstance(data[key], dict):
            hint = (
                f': write [{key}] with kind = "{data[key]}" under it'
                if key == "runtime" and isinstance(data[key], str)
                else ""
            )
            if key == "node_types":
                hint = ": one table per kind of node, e.g. [node_types.a100] with constraint = \"a100\" under it"
            raise ConfigError(f"{where(key)}: must be a table ([{key}]), got {data[key]!r}{hint}")
    pilots = section(PilotConfig, data.get("pilots", {}), "pilots", where)
    if pilots.heartbeat_deadline_s <= pilots.heartbeat_s:
        raise ConfigError(f"{where('pilots.heartbeat_deadline_s')}: must be longer than pilots.heartbeat_s")
    lead = pilots.grace_s + DRAIN_MARGIN_S  # a pilot's nodes are drained this long before its walltime ends
    sections = {name: adapter_class(name).parse_section(data.get(name, {}), name, where, lead) for name in SCHEDULERS}
    controller = section(ControllerConfig, data.get("controller", {}), "controller", where)
    if controller.formulation not in FORMULATIONS:
        raise ConfigError(
            f"{where('controller.formulation')}: {controller.formulation!r} is not one of {', '.join(FORMULATIONS)}"
        )
    if controller.objective not in OBJECTIVES:
        raise ConfigError(
            f"{where('controller.objective')}: {controller.objective!r} is not one of {', '.join(OBJECTIVES)}"
        )
    if controller.objective == "share" and controller.formulation != "aggregated":
        raise ConfigError(
            f'{where("controller.objective")}: "share" is solved by the exact aggregated solvers; '
            f"formulation {controller.formulation!r} cannot (leave it out)"
        )
    if controller.admission not in ADMISSIONS:
        raise ConfigError(
            f"{where('controller.admission')}: {controller.admission!r} is not one of {', '.join(ADMISSIONS)}"
        )
    runtime = section(RuntimeConfig, data.get("runtime", {}), "runtime", where)
    if runtime.kind not in RUNTIMES:
        raise ConfigError(f"{where('runtime.kind')}: {runtime.kind!r} is not one of {', '.join(RUNTIMES)}")
    node_types = _node_types(data.get("node_types", {}), scheduler, where)
    adapter_class(scheduler).check_node_types(node_types, sections[scheduler], where)
    similarity = section(SimilarityConfig, data.get("similarity", {}), "similarity", where)
    return Config(scheduler, pilots, controller, runtime, source, node_types, similarity, sections)


NODE_TYPE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,62}")


def _selectors() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Each batch system's title and the ``[node_types]`` keys that select its nodes (its adapter says them)."""
    return {name: (adapter_class(name).title, adapter_class(name).selects) for name in SCHEDULERS}


def _node_types(raw: Any, scheduler: str, where) -> tuple[NodeTypeConfig, ...]:
    """``[node_types.NAME]`` tables: each names how the batch system selects that kind of node."""
    if not isinstance(raw, dict):
        raise ConfigError(
            f'{where("node_types")}: must be tables, one per kind of node: [node_types.a100] constraint = "a100"'
        )
    out = []
    allowed = {f.name for f in fields(NodeTypeConfig)} - {"name"}
    for name, table in raw.items():
        key = f"node_types.{name}"
        if not NODE_TYPE_NAME.fullmatch(name):
            raise ConfigError(
                f"{where(key)}: a node type's name is letters, digits, '.', '_', '+', '-' (it names job-file columns)"
            )
        if not isinstance(table, dict):
            raise ConfigError(f"{where(key)}: must be a table ([{key}]) saying how {scheduler} selects these nodes")
        values: dict[str, Any] = {}
        for k, v in table.items():
            if k not in allowed:
                raise ConfigError(
                    f"{where(f'{key}.{k}')}: unknown key{_meant(k, allowed)} (known: {', '.join(sorted(allowed))})"
                )
            default = getattr(NodeTypeConfig(name), k)
            if isinstance(default, int) and (isinstance(v, bool) or not isinstance(v, int)):
                raise ConfigError(f"{where(f'{key}.{k}')}: expected an integer, got {v!r}")
            if isinstance(default, str) and not isinstance(v, str):
                raise ConfigError(f"{where(f'{key}.{k}')}: expected a string, got {v!r}")
            if k in ("nodes", "ranks_per_node") and v < 0 or k == "gpus_per_node" and v < -1:
                raise ConfigError(f"{where(f'{key}.{k}')}: must be zero or more, got {v!r}")
            values[k] = v
        selectors = _selectors()
        own = selectors[scheduler][1]
        chosen = [k for k in own if values.get(k)]
        foreign = [
            (k, title)
            for s, (title, keys) in selectors.items()
            if s != scheduler
            for k in keys
            if k not in own and values.get(k)
        ]
        if foreign:
            (k, title) = foreign[0]
            raise ConfigError(
                f"{where(f'{key}.{k}')}: is how {title} selects nodes, "
                f"but scheduler = {scheduler!r}: use {' or '.join(own or ('nothing',))}"
            )
        if not chosen:
            raise ConfigError(f"{where(key)}: says nothing that selects these nodes: set {' or '.join(own)}")
        out.append(NodeTypeConfig(name, **values))
    if len(out) == 1:
        raise ConfigError(f"{where('node_types')}: one node type only; name two or more, or none (every node alike)")
    return tuple(out)


def _meant(key: str, known) -> str:
    """``; did you mean grace_s?`` for a near miss, else nothing."""
    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def parse_duration(text: str) -> int:
    """Seconds in ``[[D-]HH:]MM:SS`` (the form both Slurm and PBS take); ValueError otherwise."""
    days = 0
    if "-" in text:
        d, text = text.split("-", 1)
        days = int(d)
    parts = [int(p) for p in text.split(":")]
    if not 1 <= len(parts) <= 3 or any(p < 0 for p in parts) or days < 0:
        raise ValueError(text)
    while len(parts) < 3:
        parts.insert(0, 0)
    h, m, sec = parts
    return ((days * 24 + h) * 60 + m) * 60 + sec


def check_range(lo: str, hi: str, lo_key: str, hi_key: str, where) -> None:
    for key, value in ((lo_key, lo), (hi_key, hi)):
        try:
            parse_duration(value)
        except ValueError:
            raise ConfigError(f"{where(key)}: {value!r} is not a duration like 01:30:00") from None
    if parse_duration(lo) > parse_duration(hi):
        raise ConfigError(f"{where(lo_key)}: {lo} is longer than {hi_key} {hi}")


def check_walltime(longest: str, key: str, lead: float, where) -> None:
    """A pilot's longest walltime must outlast the drain before its end, or no pilot would ever train."""
    if parse_duration(longest) < lead + MIN_TRAIN_S:
        raise ConfigError(f"{where(key)}: {longest} cannot work: {too_short(parse_duration(longest), lead)}")


def too_short(walltime: float, lead: float) -> str:
    return (
        f"a pilot's nodes are drained pilots.grace_s + {DRAIN_MARGIN_S:g} s = {lead:g} s before its walltime ends, "
        f"which leaves {max(0.0, walltime - lead):g} s to train: "
        f"less than the {MIN_TRAIN_S:g} s a job's start and stop cost, "
        f"so no job would ever start on a pilot (make it at least {lead + MIN_TRAIN_S:g} s)"
    )


def section(cls, raw: Any, name: str, where, bounds: dict[str, tuple[float, float, str]] | None = None) -> Any:
    """A table read into ``cls``: every key known, of its type, non-empty, finite, positive (or zero where that means
    "none"), within its bounds (``bounds``: a plugin's own, by ``section.key``),
    else a :class:`ConfigError` naming it."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where(name)}: must be a table")
    allowed = {f.name: f for f in fields(cls) if f.name != "script"}
    values = {}
    for key, value in raw.items():
        if key not in allowed:
            if key == "scheduler":  # TOML: a key after a [table] header belongs to that table
                raise ConfigError(
                    f"{where(f'{name}.{key}')}: scheduler is a top-level key: "
                    f"move scheduler = {value!r} above [{name}] "
                    f"(a key written after a [table] header belongs to that table)"
                )
            raise ConfigError(
                f"{where(f'{name}.{key}')}: unknown key{_meant(key, allowed)} (known: {', '.join(sorted(allowed))})"
            )
        default = getattr(cls(), key)
        if isinstance(default, tuple):
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"{where(f'{name}.{key}')}: expected a list of strings, got {value!r}")
            values[key] = tuple(value)
            continue
        if isinstance(default, bool) != isinstance(value, bool):
            raise ConfigError(f"{where(f'{name}.{key}')}: expected {type(default).__name__}, got {value!r}")
        if isinstance(default, float) and isinstance(value, int):
            value = float(value)
        if not isinstance(value, type(default)):
            raise ConfigError(f"{where(f'{name}.{key}')}: expected {type(default).__name__}, got {value!r}")
        if isinstance(value, str) and not value and key not in OPTIONAL_STRINGS:
            raise ConfigError(f"{where(f'{name}.{key}')}: must not be empty")
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{where(f'{name}.{key}')}: must be a finite number, got {value!r}")
        if (
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and (value < 0 if key in MAY_BE_ZERO else value <= 0)
        ):
            raise ConfigError(
                f"{where(f'{name}.{key}')}: "
                f"must be {'zero or more' if key in MAY_BE_ZERO else 'positive'}, got {value!r}"
            )
        bound = (bounds or BOUNDS).get(f"{name}.{key}")
        if bound is not None and not (bound[0] <= value <= bound[1]) and not (value == 0 and key in MAY_BE_ZERO):
            raise ConfigError(
                f"{where(f'{name}.{key}')}: must be between {bound[0]:g} and {bound[1]:g} ({bound[2]}), got {value!r}"
            )
        values[key] = value
    return cls(**values)
