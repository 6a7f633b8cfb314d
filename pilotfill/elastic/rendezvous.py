"""The controller's side of the torch rendezvous: membership is what the controller allocated.

Pure: no I/O, no clocks read (``now`` is passed in), no processes. The torch
runtime keeps one :class:`RendezvousBook`; the controller calls
:meth:`RendezvousBook.expect` on every start, resize and stop of a job and
routes the two ``rdzv.*`` messages to :func:`handle`.

A *round* is one membership of a job: the hosts the controller allocated, in
a stable order (rank = position). Every change of those hosts opens a new
round at once; the round closes the moment every one of its hosts has joined
it — nothing waits out a timeout, since the controller knows exactly who is
coming. Each round has its own store namespace: a random 128-bit prefix in
the run's torch store (:mod:`pilotfill.elastic.torch.store`), handed out only
in the reply to an authenticated ``rdzv.join`` by a member of that round.

Messages (agents send them through :class:`pilotfill.transport.Client`, so
every one is HMAC-signed with the run's secret; unsigned ones never get here):

=============  =================================  =====================================================
type           fields                             reply
=============  =================================  =====================================================
rdzv.join      job_id (str), host (str),          state: "wait" (ask again shortly);
               last_round (int: the round this    "closed" with round (int), rank (int: node rank),
               agent last ran in, -1 if none)     world_size (int: nodes), hosts [str] (by rank),
                                                  store {host, port, prefix};
                                                  "ended": this host has no part in the job (exit)
rdzv.poll      job_id, host, round (int)          waiting (int: nodes that joined a newer round or
                                                  left since ``round``; 0 = keep training),
                                                  current (int: the latest round), member (bool:
                                                  host is in the latest round), same_hosts (bool:
                                                  the latest round has ``round``'s hosts — a
                                                  re-form after a failure, not the controller's
                                                  change)
=============  =================================  =====================================================

Replies carry ``ok: true`` like every controller reply.

Growing does not stop the running round until the new hosts are actually
there: ``waiting`` counts a new host only once its agent has joined the new
round (torch's meaning of ``num_nodes_waiting``: nodes waiting at the barrier),
so the old members keep training while the new node boots. A host that left
counts at once: the survivors re-form now. An agent whose workers failed
without any membership change re-joins the round it already had; that opens a
fresh round with the same hosts, which the others see as ``waiting`` too.

A job whose ranks re-form in place (:mod:`pilotfill.elastic.torch.inplace`: its
agents say ``in_place``) is *staged*: its workers keep their processes, so a
round must never make the survivors wait for a node that is still starting. A
change that drops hosts opens a round of the hosts kept at once; a new host
enters a round only once its agent joins (its workers are ready at their first
batch), together with every other new host ready within :data:`STAGE_S` — so
a node swapped for another costs a shrink now and a grow when the newcomer is
there, not a pause of the whole job while it starts. ``rdzv.poll`` then also
answers ``in_place: true`` (a new node's agent starts its workers provisional).

A restarted controller adopts the rounds its predecessor opened: the book says
what changed (:meth:`RendezvousBook.take_changed`), the torch runtime writes
each changed job's :meth:`~RendezvousBook.saved` form, and the next book
restores it with :meth:`~RendezvousBook.restore` — the same round numbers, hosts, ranks
and store prefix, so agents polling their round hear "keep training".
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

HISTORY = 32
"""Rounds per job whose hosts are remembered for ``rdzv.poll`` (older ones count as 'everything changed')."""
STAGE_S = 1.0
"""A staged job's new host that is ready waits at most this long for the others that arrived with it, so that a grow by
several nodes is one re-form rather than one per node."""


@dataclass
class Round:
    number: int
    hosts: tuple[str, ...]  # in rank order
    prefix: str
    opened: float
    joined: set[str] = field(default_factory=set)
    closed_at: float | None = None

    @property
    def closed(self) -> bool:
        return self.closed_at is not None


@dataclass
class _Job:
    current: Round
    history: dict[int, tuple[str, ...]] = field(default_factory=dict)
    in_place: bool = False  # its ranks re-form in place: its rounds are staged
    target: tuple[str, ...] = ()  # the controller's hosts: the current round's and those still to enter one (staged)
    # hosts still to enter a round whose agents asked to join (since when)
    ready: dict[str, float] = field(default_factory=dict)


class RendezvousBook:
    """Per job: the allocated hosts, the current round, who joined it, ranks and the store namespace."""

    def __init__(self, token: Callable[[], str] = lambda: secrets.token_hex(16)):
        self._token = token
        self._jobs: dict[str, _Job] = {}
        self._next_round = 1
        self.store: tuple[str, int] | None = None
        self._changed: set[str] = set()  # jobs whose round opened, closed or ended since take_changed

    # ------------------------------------------------------------ controller side

    def set_store(self, host: str, port: int) -> None:
        """Where the run's torch store listens; rounds close only once it is known."""
        self.store = (host, int(port))

    def expect(self, job_id: str, hosts: Sequence[str], now: float) -> Round | None:
        """The controller's hosts for ``job_id`` now (start, resize; [] on stop). Opens a round on any change — a
        staged job's only for the hosts that leave; its new hosts enter a round when they join (module docstring)."""
        hosts = list(dict.fromkeys(hosts))
        job = self._jobs.get(job_id)
        if job is None:
            if not hosts:
                return None
            rnd = self._open(job_id, tuple(hosts), now)
            self._jobs[job_id].target = tuple(hosts)
            return rnd
        job.target = tuple(hosts)
        current = job.current.hosts
        if not job.in_place:
            if set(current) == set(hosts):
                return job.current
            order = tuple([h for h in current if h in hosts] + [h for h in hosts if h not in current])
            return self._open(job_id, order, now)
        job.ready = {h: t for h, t in job.ready.items() if h in hosts and h not in current}
        kept = tuple(h for h in current if h in hosts)
        if not kept:
            # nobody trains on: all at once
            return self._open(job_id, tuple(hosts), now) if set(current) != set(hosts) else job.current
        if kept != current:
            return self._open(job_id, kept, now)  # the hosts that stay re-form now; new ones enter when they are ready
        return job.current

    def forget(self, job_id: str) -> None:
        """Drop everything about ``job_id`` (it ended); its agents are told ``ended``."""
        if self._jobs.pop(job_id, None) is not None:
            self._changed.add(job_id)

    # ------------------------------------------------------------ across controller restarts

    def take_changed(self) -> set[str]:
        """The jobs whose round opened, closed or was forgotten since the last call (what a successor must know)."""
        changed, self._changed = self._changed, set()
        return changed

    def saved(self, job_id: str) -> dict[str, Any] | None:
        """What a successor's book needs of ``job_id`` (plain JSON), or None: the job has no round."""
        job = self._jobs.get(job_id)
        if job is None:
            return None
        rnd = job.current
        return {
            "number": rnd.number,
            "hosts": list(rnd.hosts),
            "prefix": rnd.prefix,
            "opened": rnd.opened,
            "joined": sorted(rnd.joined),
            "closed_at": rnd.closed_at,
            "history": [[n, list(h)] for n, h in job.history.items()],
            "in_place": job.in_place,
            "target": list(job.target),
            "ready": job.ready,
        }

    def restore(self, job_id: str, saved: dict[str, Any]) -> Round:
        """Take ``job_id``'s round back from a predecessor's :meth:`saved`: its agents carry on in it."""
        rnd = Round(
            int(saved["number"]),
            tuple(saved["hosts"]),
            str(saved["prefix"]),
            float(saved["opened"]),
            set(saved["joined"]),
            saved["closed_at"],
        )
        self._jobs[job_id] = _Job(
            rnd,
            {int(n): tuple(h) for n, h in saved["history"]},
            bool(saved.get("in_place")),
            tuple(saved.get("target") or rnd.hosts),
            {str(h): float(t) for h, t in (saved.get("ready") or {}).items()},
        )
        self._next_round = max(self._next_round, rnd.number + 1)
        return rnd

    def hosts(self, job_id: str) -> list[str]:
        job = self._jobs.get(job_id)
        return list(job.current.hosts) if job is not None else []

    def round(self, job_id: str) -> Round | None:
        job = self._jobs.get(job_id)
        return job.current if job is not None else None

    # ------------------------------------------------------------ agent side (through handle)

    def join(self, job_id: str, host: str, last_round: int, now: float, in_place: bool = False) -> dict[str, Any]:
        job = self._jobs.get(job_id)
        if job is None:
            return {"state": "ended"}
        if in_place and not job.in_place:
            job.in_place = True
            self._changed.add(job_id)
        if host not in job.current.hosts and job.in_place and host in job.target:
            # a staged new host, ready: it enters the next round (with those ready with it)
            job.ready.setdefault(host, now)
            self._stage(job_id, job, now)
            if host not in job.current.hosts:
                return {"state": "wait", "round": job.current.number, "in_place": True}
        if host not in job.current.hosts:
            return {"state": "ended"}
        rnd = job.current
        if rnd.closed and last_round == rnd.number:
            # This agent already ran in the current round and is back: its workers failed with
            # nobody coming or going. Everyone re-forms with the same hosts.
            rnd = self._open(job_id, rnd.hosts, now)
        rnd.joined.add(host)
        if not rnd.closed and rnd.joined >= set(rnd.hosts) and self.store is not None:
            rnd.closed_at = now
            self._changed.add(job_id)
        extra = {"in_place": True} if job.in_place else {}
        if not rnd.closed:
            return {"state": "wait", "round": rnd.number, **extra}
        store_host, store_port = self.store if self.store is not None else ("", 0)
        return {
            "state": "closed",
            "round": rnd.number,
            "rank": rnd.hosts.index(host),
            "world_size": len(rnd.hosts),
            "hosts": list(rnd.hosts),
            "store": {"host": store_host, "port": store_port, "prefix": rnd.prefix},
            **extra,
        }

    def poll(
        self, job_id: str, host: str, round_number: int, in_place: bool = False, now: float | None = None
    ) -> dict[str, Any]:
        job = self._jobs.get(job_id)
        if job is None:
            return {"waiting": 1, "current": 0, "member": False}
        if in_place and not job.in_place:
            job.in_place = True
            self._changed.add(job_id)
        if now is not None and job.ready:
            self._stage(job_id, job, now)
        rnd = job.current
        member = host in rnd.hosts or job.in_place and host in job.target
        extra = {"in_place": True} if job.in_place else {}
        if round_number == rnd.number:
            return {"waiting": 0 if member else 1, "current": rnd.number, "member": member, "same_hosts": True, **extra}
        mine = job.history.get(round_number)
        same = mine is not None and set(mine) == set(rnd.hosts)
        if mine is None:
            waiting = max(1, len(rnd.joined - {host}))
        else:
            left = [h for h in mine if h not in rnd.hosts]
            arrived = rnd.joined - {host}
            waiting = len(left) + len(arrived)
            if not member:
                waiting = max(waiting, 1)
        return {"waiting": waiting, "current": rnd.number, "member": member, "same_hosts": same, **extra}

    def in_place(self, job_id: str) -> bool:
        """Whether ``job_id``'s ranks re-form in place (its agents said so): a resize keeps what they did."""
        job = self._jobs.get(job_id)
        return job is not None and job.in_place

    def _stage(self, job_id: str, job: _Job, now: float) -> None:
        """Let a staged job's ready new hosts into a round: once the others that arrived with them are ready too, or
        the first has waited :data:`STAGE_S`."""
        pending = [h for h in job.target if h not in job.current.hosts]
        ready = [h for h in pending if h in job.ready]
        if not ready or (len(ready) < len(pending) and now - min(job.ready[h] for h in ready) < STAGE_S):
            return
        kept = tuple(h for h in job.current.hosts if h in job.target)
        for h in ready:
            job.ready.pop(h, None)
        self._open(job_id, kept + tuple(ready), now)

    # ------------------------------------------------------------ helpers

    def _open(self, job_id: str, hosts: tuple[str, ...], now: float) -> Round:
        rnd = Round(self._next_round, hosts, self._token(), now)
        self._next_round += 1
        job = self._jobs.get(job_id)
        if job is None:
            job = self._jobs[job_id] = _Job(rnd)
        job.current = rnd
        job.history[rnd.number] = hosts
        while len(job.history) > HISTORY:
            del job.history[min(job.history)]
        self._changed.add(job_id)
        return rnd


class RendezvousMessageError(ValueError):
    """An authentic rdzv.* message with missing or ill-typed fields."""


FIELDS: dict[str, dict[str, type]] = {
    "rdzv.join": {"job_id": str, "host": str, "last_round": int},
    "rdzv.poll": {"job_id": str, "host": str, "round": int},
}
"""Each message's required fields; ``in_place`` (bool: the agent's workers re-form in place) is optional in both."""


def handle(book: RendezvousBook, message: dict[str, Any], now: float) -> dict[str, Any]:
    """Answer one ``rdzv.join`` or ``rdzv.poll`` (see the module's table)."""
    kind = message.get("type")
    if kind not in FIELDS:
        raise RendezvousMessageError(f"not a rendezvous message: {kind!r}")
    for name, typ in FIELDS[kind].items():
        value = message.get(name)
        if not isinstance(value, typ) or isinstance(value, bool):
            raise RendezvousMessageError(f"{kind}: field {name!r} missing or not {typ.__name__}")
    in_place = message.get("in_place") is True
    if kind == "rdzv.join":
        reply = book.join(message["job_id"], message["host"], message["last_round"], now, in_place=in_place)
    else:
        reply = book.poll(message["job_id"], message["host"], message["round"], in_place=in_place, now=now)
    return {"ok": True, **reply}
