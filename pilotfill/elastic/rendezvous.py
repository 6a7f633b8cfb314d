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
the run's torch store (:mod:`pilotfill.elastic.torch_store`), handed out only
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
        """The controller's hosts for ``job_id`` now (start, resize; [] on stop). Opens a round on any change."""
        hosts = list(dict.fromkeys(hosts))
        job = self._jobs.get(job_id)
        if job is not None and set(job.current.hosts) == set(hosts):
            return job.current
        if not hosts and job is None:
            return None
        previous = job.current.hosts if job is not None else ()
        order = tuple([h for h in previous if h in hosts] + [h for h in hosts if h not in previous])
        return self._open(job_id, order, now)

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
        return {"number": rnd.number, "hosts": list(rnd.hosts), "prefix": rnd.prefix, "opened": rnd.opened, "joined": sorted(rnd.joined),
                "closed_at": rnd.closed_at, "history": [[n, list(h)] for n, h in job.history.items()]}  # fmt: skip

    def restore(self, job_id: str, saved: dict[str, Any]) -> Round:
        """Take ``job_id``'s round back from a predecessor's :meth:`saved`: its agents carry on in it."""
        rnd = Round(int(saved["number"]), tuple(saved["hosts"]), str(saved["prefix"]), float(saved["opened"]), set(saved["joined"]), saved["closed_at"])
        self._jobs[job_id] = _Job(rnd, {int(n): tuple(h) for n, h in saved["history"]})
        self._next_round = max(self._next_round, rnd.number + 1)
        return rnd

    def hosts(self, job_id: str) -> list[str]:
        job = self._jobs.get(job_id)
        return list(job.current.hosts) if job is not None else []

    def round(self, job_id: str) -> Round | None:
        job = self._jobs.get(job_id)
        return job.current if job is not None else None

    # ------------------------------------------------------------ agent side (through handle)

    def join(self, job_id: str, host: str, last_round: int, now: float) -> dict[str, Any]:
        job = self._jobs.get(job_id)
        if job is None or host not in job.current.hosts:
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
        if not rnd.closed:
            return {"state": "wait", "round": rnd.number}
        store_host, store_port = self.store if self.store is not None else ("", 0)
        return {
            "state": "closed",
            "round": rnd.number,
            "rank": rnd.hosts.index(host),
            "world_size": len(rnd.hosts),
            "hosts": list(rnd.hosts),
            "store": {"host": store_host, "port": store_port, "prefix": rnd.prefix},
        }

    def poll(self, job_id: str, host: str, round_number: int) -> dict[str, Any]:
        job = self._jobs.get(job_id)
        if job is None:
            return {"waiting": 1, "current": 0, "member": False}
        rnd = job.current
        member = host in rnd.hosts
        if round_number == rnd.number:
            return {"waiting": 0 if member else 1, "current": rnd.number, "member": member, "same_hosts": True}
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
        return {"waiting": waiting, "current": rnd.number, "member": member, "same_hosts": same}

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


def handle(book: RendezvousBook, message: dict[str, Any], now: float) -> dict[str, Any]:
    """Answer one ``rdzv.join`` or ``rdzv.poll`` (see the module's table)."""
    kind = message.get("type")
    if kind not in FIELDS:
        raise RendezvousMessageError(f"not a rendezvous message: {kind!r}")
    for name, typ in FIELDS[kind].items():
        value = message.get(name)
        if not isinstance(value, typ) or isinstance(value, bool):
            raise RendezvousMessageError(f"{kind}: field {name!r} missing or not {typ.__name__}")
    if kind == "rdzv.join":
        reply = book.join(message["job_id"], message["host"], message["last_round"], now)
    else:
        reply = book.poll(message["job_id"], message["host"], message["round"])
    return {"ok": True, **reply}
