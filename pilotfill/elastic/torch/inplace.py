"""In-place resize for the torch runtime: a worker outlives its job's membership changes.

torch elastic ends every worker of a job on any membership change and starts
new ones, which re-import, re-read their data and resume from the last durable
commit: a grow cost the new node seconds before it trained and a shrink sent
every rank back to its commit (issue 58). Here a worker keeps its process, its data and its state
in memory; only its process group changes, at a step boundary:

* **the boundary** is the :class:`~pilotfill.elastic.loader.ElasticLoader`'s
  next global batch (:meth:`Membership.boundary`): every rank of the group
  reaches it in step, so it is where they agree, with one all-reduce of a flag,
  whether to re-form now — all of them at the same step, or none;
* **survivors** leave their group there, join the controller's next round (new
  rank and world size, its store prefix; the node's torch agent hands them the
  round in a *notice*, :mod:`pilotfill.elastic.torch.agent`), point every
  ``DistributedDataParallel`` they hold at the new group (a new reducer,
  :func:`regroup_ddp`) and go on with the same step;
* **joiners** (a new node's workers, or a node's restarted workers) run the
  function's prologue — ``init_process_group``, data, model, ``ElasticState``,
  DDP — in a group of one (*provisional*), without waiting for anyone, and join
  the job's group at their first batch, where the first rank that holds the
  job's state (a survivor: survivors get the lowest ranks) broadcasts it —
  model, optimizer, loader position, named values — to those that lack it. A
  group where nobody holds state (a job started again) takes rank 0's read of
  the durable commit instead;
* **a rank that must go** (its node released, or preempted with a grace
  period: SIGTERM) leaves at the next boundary, after the flag told the others,
  so they keep every step they took. One stuck away from any boundary (waiting
  on a vanished peer) goes after a few steps' time instead;
* **a hard loss** (a peer killed, a node gone silent, a collective that fails)
  ends the worker as before (:mod:`pilotfill.elastic.torch.worker`); its agent
  starts it again provisional, and it resumes from the last commit as its node
  holds it in memory (``/dev/shm``: local rank 0 writes each commit there), not
  from the durable copy.

What the code must do is what the README's campaign does: ``init_process_group``
with the default ``env://``, a :class:`~pilotfill.elastic.loader.ElasticLoader`
for its steps and an :class:`~pilotfill.elastic.state.ElasticState` for what it
keeps; ``dist.get_rank()`` and ``get_world_size()`` change at each boundary (a
value copied before the loop does not). Code that never reaches a loader
boundary is restarted on a change, as torch elastic does.

Only the torch runtime's workers with ``PILOTFILL_RESIZE=in_place`` (set by
their agent) install this; nothing here runs elsewhere.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

log = logging.getLogger("pilotfill.inplace")

RESIZE_ENV = "PILOTFILL_RESIZE"
"""``in_place``: this worker resizes in place (set by its agent); anything else: torch elastic's restarts."""
NOTICE_DIR_ENV = "PILOTFILL_NOTICE_DIR"
"""The agent's private, node-local directory: its notices to its workers, their status, the commit in memory."""
PROVISIONAL_ENV = "PILOTFILL_PROVISIONAL"
"""``1``: this worker joins a job that trains: its prologue runs in a group of one."""

NOTICE = "notice.json"
NUDGE = "nudge"
LEAVE, CHANGE = 2, 1
"""The boundary's flag: this rank goes, or its agent has a newer round for it."""
STUCK_LEAVE_S = 2.0
"""A rank told to go that reaches no boundary for this long (or three steps) goes anyway: it waits on something
(a vanished peer) that will not come, and the node is wanted now."""
STUCK_REFORM_S = 15.0
"""A rank whose agent has a newer round and that reaches no boundary for this long (or ten steps) is stuck in a
collective with a peer that is gone (gloo cannot be aborted): it ends, and its agent starts it again from the
commit its node holds."""
NOTICE_WAIT_S = 1800.0
EXIT_LEFT = 76
"""Exit status of a worker that left its job at a step boundary, as it was told (its agent does not restart it)."""


class Phase(str, Enum):
    """Where a worker stands with its job's process group."""

    ALONE = "alone"  # no process group yet (before init_process_group)
    PROVISIONAL = "provisional"  # the prologue runs in a group of one: the job's group is joined at the first batch
    FORMED = "formed"  # in the job's group of its current round
    LEAVING = "leaving"  # told to go: leaves at the next boundary


MOVES: dict[Phase, frozenset[Phase]] = {
    Phase.ALONE: frozenset({Phase.PROVISIONAL, Phase.FORMED, Phase.LEAVING}),
    Phase.PROVISIONAL: frozenset({Phase.FORMED, Phase.LEAVING}),
    Phase.FORMED: frozenset({Phase.FORMED, Phase.LEAVING}),
    Phase.LEAVING: frozenset(),
}


class IllegalPhase(RuntimeError):
    """A move :data:`MOVES` does not list: a bug, said where it happened."""


@dataclass(frozen=True)
class Notice:
    """What a node's agent tells its workers: the round to be in (``round`` -1: none yet), or to leave."""

    serial: int
    round: int = -1
    node_rank: int = 0
    nodes: int = 1
    store_host: str = ""
    store_port: int = 0
    prefix: str = ""
    leave: bool = False

    @classmethod
    def read(cls, path: Path) -> Notice | None:
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        store = raw.get("store") or {}
        return cls(
            int(raw.get("serial", 0)),
            int(raw.get("round", -1)),
            int(raw.get("node_rank", 0)),
            int(raw.get("nodes", 1)),
            str(store.get("host", "")),
            int(store.get("port", 0)),
            str(store.get("prefix", "")),
            bool(raw.get("leave")),
        )

    def write(self, path: Path) -> None:
        """Atomically (a new inode each time: the workers notice it by ``stat`` alone)."""
        body = {
            "serial": self.serial,
            "round": self.round,
            "node_rank": self.node_rank,
            "nodes": self.nodes,
            "leave": self.leave,
            "store": {"host": self.store_host, "port": self.store_port, "prefix": self.prefix},
        }
        write_atomically(path, json.dumps(body).encode())


def write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def worker_status_path(notice_dir: Path, local_rank: int) -> Path:
    return notice_dir / f"worker.{local_rank}.json"


def returned_path(notice_dir: Path, local_rank: int) -> Path:
    """Written by a worker whose function returned (its exit 0 is not the app's own ``os._exit(0)``)."""
    return notice_dir / f"returned.{local_rank}"


def returned() -> None:
    """This worker's function returned: said to its agent before the worker exits 0."""
    directory, local_rank = os.environ.get(NOTICE_DIR_ENV), os.environ.get("LOCAL_RANK", "0")
    if directory:
        with contextlib.suppress(OSError):
            returned_path(Path(directory), int(local_rank)).touch()


def commit_path(notice_dir: Path, index: int) -> Path:
    """Where a node keeps its last commit of a job's ``index``-th ElasticState in memory (the notice dir: /dev/shm)."""
    return notice_dir / f"commit.{index}.pt"


_active: Membership | None = None


def active() -> Membership | None:
    """This worker's membership, if it resizes in place (None anywhere else)."""
    return _active


def install() -> Membership | None:
    """Make this worker resize in place if its agent says so (``PILOTFILL_RESIZE=in_place``); called before the
    job's code runs. Returns its :class:`Membership`, or None."""
    global _active
    if os.environ.get(RESIZE_ENV) != "in_place" or not os.environ.get(NOTICE_DIR_ENV):
        return None
    if _active is None:
        _active = Membership(
            Path(os.environ[NOTICE_DIR_ENV]),
            int(os.environ.get("LOCAL_RANK", "0")),
            int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
            provisional=os.environ.get(PROVISIONAL_ENV) == "1",
        )
        _active.patch()
    return _active


class Membership:
    """One worker's part in its job's group across rounds (the module docstring says how it moves)."""

    def __init__(self, notice_dir: Path, local_rank: int, nproc: int, provisional: bool):
        self.dir, self.local_rank, self.nproc = notice_dir, local_rank, nproc
        self.provisional_start = provisional
        self.phase = Phase.ALONE
        self.round = int(os.environ.get("PILOTFILL_RDZV_ROUND", "-1")) if not provisional else -1
        self.rank = int(os.environ.get("RANK", "0"))
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.states: list[weakref.ref] = []
        self.ddps: list[weakref.ref] = []
        self.init_kwargs: dict[str, Any] = {}
        # the gloo group the boundary's flags go over (None: the default group, when it is gloo)
        self.control: Any = None
        self.boundaries = 0
        self.capable_said = False
        self.last_boundary = time.monotonic()
        self.step_s = 0.0
        self.formed_at = 0.0
        self.paused_s = 0.0
        self._notice_key: tuple[int, int] | None = None
        self._notice: Notice | None = None
        self.term_at: float | None = None
        self._lock = threading.Lock()
        self._real_init: Any = None
        self._notice_path = self.dir / NOTICE
        self._status = worker_status_path(self.dir, local_rank)
        self._status_body: dict[str, Any] = {"pid": os.getpid(), "capable": False, "parked": None, "wants": None}
        self._write_status()

    # ------------------------------------------------------------ set up once, before the job's code

    def patch(self) -> None:
        """Take over ``init_process_group`` (a joiner's prologue runs in a group of one), know every DDP the job makes
        (its group changes at a re-form) and turn SIGTERM into "leave at the next boundary"."""
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d
        from torch.nn.parallel import DistributedDataParallel

        if getattr(c10d.init_process_group, "pilotfill_inplace", False):
            return
        real = c10d.init_process_group
        self._real_init = real

        def init_process_group(backend: Any = None, init_method: str | None = None, *args: Any, **kwargs: Any) -> None:
            return self._init(real, backend, init_method, *args, **kwargs)

        init_process_group.pilotfill_inplace = True  # type: ignore[attr-defined]
        init_process_group.__doc__ = real.__doc__
        c10d.init_process_group = init_process_group
        dist.init_process_group = init_process_group
        ddp_init = DistributedDataParallel.__init__
        membership = self

        def ddp_registered(module: Any, *args: Any, **kwargs: Any) -> None:
            ddp_init(module, *args, **kwargs)
            membership.ddps.append(weakref.ref(module))

        DistributedDataParallel.__init__ = ddp_registered  # type: ignore[method-assign]
        signal.signal(signal.SIGTERM, self._on_term)
        threading.Thread(target=self._watch, name="pilotfill-inplace-watch", daemon=True).start()

    def _init(self, real: Any, backend: Any, init_method: str | None, *args: Any, **kwargs: Any) -> None:
        """The job's ``init_process_group``: the job's group of this round, or — a joiner — a group of one."""
        import torch.distributed as dist

        if (
            self.phase is not Phase.ALONE
            or args
            or kwargs.get("store") is not None
            or (init_method not in (None, "env://"))
        ):
            # its own rendezvous, or a second group: not ours to move
            return real(backend, init_method, *args, **kwargs)
        self.init_kwargs = {k: v for k, v in kwargs.items() if k not in ("rank", "world_size", "group_name")}
        self.init_kwargs["backend"] = backend
        if self.provisional_start:
            real(backend, store=dist.HashStore(), rank=0, world_size=1, **self.init_kwargs_without_backend())
            self._move(Phase.PROVISIONAL)
            self.rank, self.world = 0, 1
            return None
        real(backend, init_method, **kwargs)
        self._formed(int(os.environ.get("PILOTFILL_RDZV_ROUND", "-1")))
        return None

    def init_kwargs_without_backend(self) -> dict[str, Any]:
        return {k: v for k, v in self.init_kwargs.items() if k != "backend"}

    # ------------------------------------------------------------ what the job's code calls (through pilotfill)

    @property
    def provisional(self) -> bool:
        """Whether the job's state is still to come from a peer (or the commit) when this worker joins."""
        return self.phase is Phase.PROVISIONAL or (self.phase is Phase.ALONE and self.provisional_start)

    def register_state(self, state: Any) -> int:
        """An ElasticState of the job's code (in the order the code makes them:
        the same on every rank). Returns its index."""
        self.states.append(weakref.ref(state))
        return len(self.states) - 1

    def boundary(self) -> bool:
        """The loader's next global batch: re-form here if the job's membership changed. True: this rank's group, rank,
        world or position changed (the loader plans the rest of the epoch anew)."""
        if self.phase is Phase.PROVISIONAL:
            self._join_job()
            return True
        if self.phase is not Phase.FORMED:
            return False
        now = time.monotonic()
        self.boundaries += 1
        if self.boundaries > 1:
            gap = now - self.last_boundary
            self.step_s = gap if self.step_s == 0.0 else 0.8 * self.step_s + 0.2 * gap
        self.last_boundary = now
        if not self.capable_said:
            self.capable_said = True
            self._say(capable=True)  # its agent: this job's ranks re-form in place (and tells the controller so)
        flag = LEAVE if self.term_at is not None else CHANGE if self._newer_notice() else 0
        if self.world == 1 and flag == 0:
            return False
        most, least = self._agree(flag)
        if most == 0:
            return False
        if self.term_at is not None:
            if least == LEAVE:
                # the whole job goes (stopped, or every node preempted): keep its last step
                self._commit_before_leaving()
            self._leave("told to go")
        self._reform(paused_from=now)
        return True

    # ------------------------------------------------------------ the group

    def _agree(self, flag: int) -> tuple[int, int]:
        """The largest and the smallest of every rank's flag (one all-reduce): the same answer on every rank, at the
        same step."""
        import torch
        import torch.distributed as dist

        box = torch.tensor([flag, -flag], dtype=torch.int32)
        dist.all_reduce(box, op=dist.ReduceOp.MAX, group=self.control)
        return int(box[0].item()), -int(box[1].item())

    def _commit_before_leaving(self) -> None:
        """Every rank leaves at this boundary: rank 0 commits durably first (the job resumes here, not at its last
        commit), within the grace the batch system gives."""
        if self.rank != 0:
            return
        for state in [s for s in (ref() for ref in self.states) if s is not None]:
            if getattr(state, "path", None) is not None:
                state._save(state.state_dict())

    def _join_job(self) -> None:
        """A provisional worker at its first batch: the job's group, and the job's state from whoever holds it."""
        self._park()
        self._reform(paused_from=time.monotonic())

    def _reform(self, paused_from: float) -> None:
        """Leave this group, join the agent's newer round, point the job's DDPs at it, and sync the state."""
        import torch.distributed as dist

        from .worker import bind_store

        notice = self._await_notice(self.round)
        started = time.monotonic()
        if dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()  # every group of the old round; gloo's go at once
        self.control = None
        rank, world = notice.node_rank * self.nproc + self.local_rank, notice.nodes * self.nproc
        os.environ.update(
            {
                "RANK": str(rank),
                "WORLD_SIZE": str(world),
                "GROUP_RANK": str(notice.node_rank),
                "GROUP_WORLD_SIZE": str(notice.nodes),
                "ROLE_RANK": str(rank),
                "ROLE_WORLD_SIZE": str(world),
                "MASTER_ADDR": notice.store_host,
                "MASTER_PORT": str(notice.store_port),
                "PILOTFILL_RDZV_PREFIX": f"{notice.prefix}/workers",
                "PILOTFILL_RDZV_ROUND": str(notice.round),
            }
        )
        bind_store(f"{notice.prefix}/workers")
        kwargs = self.init_kwargs_without_backend()
        self._real_init(self.init_kwargs.get("backend"), "env://", rank=rank, world_size=world, **kwargs)
        for ref in self.ddps:
            ddp = ref()
            if ddp is not None:
                regroup_ddp(ddp, dist.group.WORLD)
        was_provisional = self.phase is Phase.PROVISIONAL
        self._formed(notice.round)
        self.rank, self.world = rank, world
        moved = self._sync(was_provisional)
        self.paused_s = time.monotonic() - paused_from
        self._say(parked=None, wants=None)
        from ...report import measure_from

        measure_from(time.time())  # the next report is the first of the new size (what the change cost)
        log.info(
            "rank %d of %d in round %d (%.2f s to re-form, %s)",
            rank,
            world,
            notice.round,
            time.monotonic() - started,
            moved,
        )

    def _formed(self, round_number: int) -> None:
        import torch.distributed as dist

        self._move(Phase.FORMED)
        self.round = round_number
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        backend = str(dist.get_backend()).lower()
        self.control = None if backend == "gloo" else dist.new_group(backend="gloo")
        self.formed_at = time.monotonic()
        self._write_status()  # its agent joins no newer round before every worker of the node is in this one

    def _sync(self, provisional: bool) -> str:
        """Everyone says whether it holds the job's state, and where its loader is; the lowest rank that holds it sends
        it to those that lack it or are elsewhere. Nobody holds it: rank 0 reads the durable commit and sends that."""
        import torch
        import torch.distributed as dist

        states = [s for s in (ref() for ref in self.states) if s is not None]
        holds = not provisional and bool(states) or any(getattr(s, "_held", False) for s in states)
        mark = _mark(states) if holds else -1
        mine = torch.tensor([1 if holds else 0, mark], dtype=torch.int64)
        everyone = [torch.zeros(2, dtype=torch.int64) for _ in range(self.world)]
        dist.all_gather(everyone, mine, group=self.control)
        holders = [r for r, t in enumerate(everyone) if int(t[0])]
        if holders:
            source, from_disk = holders[0], False
            wanting = [r for r, t in enumerate(everyone) if not int(t[0]) or int(t[1]) != int(everyone[source][1])]
        else:
            # rank 0 too: it read the commit, it did not hold it
            source, from_disk, wanting = 0, True, list(range(self.world))
        if not wanting:
            return "nothing to send"
        if self.rank == source:
            box = [[s._payload(from_disk) for s in states]]
        else:
            box = [None]
        dist.broadcast_object_list(box, src=source, group=self.control)
        if self.rank in wanting and box[0] is not None:
            for state, payload in zip(states, box[0]):
                state._take(payload, from_disk=from_disk)
        return f"state {'read from the commit' if from_disk else 'from rank ' + str(source)} to {len(wanting)} rank(s)"

    # ------------------------------------------------------------ the agent

    def _newer_notice(self) -> bool:
        """Whether the agent wrote a notice for a round after this rank's (one ``stat``; read only when it changed)."""
        try:
            st = os.stat(self._notice_path)
        except FileNotFoundError:
            return False
        key = (st.st_ino, st.st_mtime_ns)
        if key != self._notice_key:
            self._notice_key = key
            self._notice = Notice.read(self._notice_path)
        n = self._notice
        return n is not None and (n.leave or n.round > self.round)

    def _await_notice(self, after: int) -> Notice:
        """The agent's notice of a round after ``after`` (asking it to look at once);
        a notice to leave ends the worker."""
        deadline = time.monotonic() + NOTICE_WAIT_S
        self._say(wants=after)
        nudged = 0.0
        while time.monotonic() < deadline:
            if self._newer_notice_than(after):
                assert self._notice is not None
                if self._notice.leave:
                    self._leave("its node leaves the job")
                return self._notice
            if self.term_at is not None:
                self._leave("told to go while waiting for its round")
            if time.monotonic() - nudged > 0.5:
                nudged = time.monotonic()
                with contextlib.suppress(OSError):
                    # the agent asks the controller now, not at its next poll
                    (self.dir / NUDGE).write_text(str(time.time()))
            time.sleep(0.005)
        raise TimeoutError(f"no round from this node's agent within {NOTICE_WAIT_S:.0f} s")

    def _newer_notice_than(self, after: int) -> bool:
        self._newer_notice()
        n = self._notice
        return n is not None and (n.leave or n.round > after)

    def _park(self) -> None:
        """A provisional worker is ready to join: its agent joins the round once every worker of the node is."""
        self._say(parked=True)

    def _say(self, **fields: Any) -> None:
        self._status_body.update(fields)
        self._write_status()

    def _write_status(self) -> None:
        with contextlib.suppress(OSError):
            write_atomically(
                self._status, json.dumps({**self._status_body, "phase": self.phase.value, "round": self.round}).encode()
            )

    # ------------------------------------------------------------ leaving

    def _on_term(self, signum: int, frame: Any) -> None:
        """SIGTERM (the node is released or preempted): go at the next boundary — at once if none will come."""
        if self.phase is not Phase.FORMED or self.boundaries == 0:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            # not training in steps yet: nothing to finish, end as torch's workers do
            os.kill(os.getpid(), signal.SIGTERM)
            return
        if self.term_at is None:
            self.term_at = time.monotonic()
            self._say(leaving=True)

    def _leave(self, why: str) -> None:
        with contextlib.suppress(Exception):
            self._move(Phase.LEAVING)
        print(f"pilotfill: rank {self.rank} leaves the job at a step boundary ({why})", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(EXIT_LEFT)  # nothing left to do here: the others go on without this rank

    def _watch(self) -> None:
        """A rank that cannot reach a boundary goes: told to leave and stuck, or stuck while its round is over."""
        while True:
            time.sleep(0.2)
            if self.phase is not Phase.FORMED:
                continue
            idle = time.monotonic() - self.last_boundary
            if (
                self.term_at is not None
                and time.monotonic() - self.term_at > max(STUCK_LEAVE_S, 3 * self.step_s)
                and idle > max(STUCK_LEAVE_S, 3 * self.step_s)
            ):
                print(
                    f"pilotfill: rank {self.rank} was told to go and reached no step boundary for {idle:.1f} s: "
                    "leaving now",
                    file=sys.stderr,
                    flush=True,
                )
                os._exit(143)
            if self.boundaries and idle > max(STUCK_REFORM_S, 10 * self.step_s) and self._newer_notice():
                from .worker import EXIT_PEER_LOST

                print(
                    f"pilotfill: rank {self.rank} reached no step boundary for {idle:.1f} s while its job re-forms (a "
                    "peer it waits on is gone): restarting from the commit its node holds",
                    file=sys.stderr,
                    flush=True,
                )
                os._exit(EXIT_PEER_LOST)

    def _move(self, to: Phase) -> None:
        with self._lock:
            if to not in MOVES[self.phase]:
                raise IllegalPhase(f"in-place membership: {self.phase.value} -> {to.value}")
            self.phase = to
        self._status_body["phase"] = to.value


def regroup_ddp(ddp: Any, group: Any) -> None:
    """Point a DistributedDataParallel at ``group`` with a new reducer, its buckets laid out as at construction.

    torch's own ``_update_process_group`` keeps the reducer, and with it the bucket layout the reducer rebuilt after
    its first step (the order gradients became ready): a survivor holds that layout, a joiner (whose DDP never
    stepped) the construction one, and the first all-reduce of the new group then sums one parameter's gradient into
    another's — every rank's model changes, each differently. A new reducer has the same layout on every rank (it
    depends only on the parameters), and every rank rebuilds it after the same first step."""
    parameters, expect_sparse_gradient = ddp._build_params_for_reducer()
    ddp.process_group = group
    ddp._has_rebuilt_buckets = False
    ddp._ddp_init_helper(
        parameters, expect_sparse_gradient, ddp._build_debug_param_to_name_mapping(parameters), ddp.static_graph
    )
    if ddp.static_graph:
        ddp.reducer._set_static_graph()
        ddp.logger._set_static_graph()
    import torch.distributed as dist

    for hook, state in ddp._comm_hooks:  # a hook's state naming the old group is the app's to update (torch's rule)
        dist._register_comm_hook(ddp.reducer, state, hook)


def _mark(states: list[Any]) -> int:
    """Where the held state is, to tell ranks that hold the same from those that do not: its loader's position."""
    for state in states:
        for key in getattr(state, "keys", ()):
            value = getattr(state, key, None)
            if hasattr(value, "position") and isinstance(getattr(value, "position"), int):
                return int(value.position)
    return 0
