"""The ``pilotfill`` rendezvous backend of torch elastic: membership comes from the controller.

Registered in torch's ``rendezvous_handler_registry`` under ``"pilotfill"``.
Its :class:`PilotfillRendezvousHandler` speaks ``rdzv.join`` and ``rdzv.poll``
(:mod:`pilotfill.elastic.rendezvous`) to the controller over the run's signed
transport — there is no c10d rendezvous state, no keep-alive, no
``last_call_timeout``: a round closes when the controller's hosts have all
joined, and ``num_nodes_waiting()`` is the controller's answer to "did the
membership change since my round?".

The round's store is the run's store on the controller's machine
(:mod:`pilotfill.elastic.torch.store`, reached through an authenticated
:class:`~pilotfill.elastic.run_store.RunStore`) under the round's prefix:
``<prefix>/agent`` for the agents, ``<prefix>/workers`` for the workers'
``init_process_group`` (see :mod:`pilotfill.elastic.torch.worker`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from torch.distributed import PrefixStore, Store
from torch.distributed.elastic.rendezvous import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousGracefulExitError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStoreInfo,
    RendezvousTimeoutError,
    rendezvous_handler_registry,
)

from ...protocol import RdzvJoin, RdzvPoll
from ...transport import Client, ControllerUnavailable, RequestRefused
from ..run_store import RunStore

log = logging.getLogger(__name__)

BACKEND = "pilotfill"
JOIN_TIMEOUT_S = 1800.0
"""Waiting this long for a round to close is an error (the controller replaces hosts that never come)."""
POLL_INTERVAL_S = 0.2
"""``num_nodes_waiting`` asks the controller at most this often (torch calls it every monitor interval)."""
STORE_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class RoundInfo:
    """What this node got from the last closed round."""

    number: int
    rank: int
    world_size: int
    hosts: tuple[str, ...]
    store_host: str
    store_port: int
    prefix: str

    @property
    def worker_prefix(self) -> str:
        return f"{self.prefix}/workers"


class PilotfillRendezvousHandler(RendezvousHandler):
    def __init__(self, client: Client, job_id: str, host: str, min_nodes: int = 1, max_nodes: int = 1 << 30,
                 join_timeout_s: float = JOIN_TIMEOUT_S, poll_interval_s: float = POLL_INTERVAL_S):  # fmt: skip
        self.client = client
        self.job_id = job_id
        self.host = host
        self.min_nodes = min_nodes
        self.max_nodes = max_nodes
        self.join_timeout_s = join_timeout_s
        self.poll_interval_s = poll_interval_s
        self.round: RoundInfo | None = None
        self._closed = False
        self._stores: dict[tuple[str, int], Store] = {}
        self._polled_at = 0.0
        self._waiting = 0

    # ------------------------------------------------------------ RendezvousHandler

    def get_backend(self) -> str:
        return BACKEND

    @property
    def use_agent_store(self) -> bool:
        # Workers are clients of the run's store (MASTER_ADDR/PORT); nobody serves one on a node.
        return True

    def next_rendezvous(self) -> RendezvousInfo:
        if self._closed:
            raise RendezvousClosedError(f"the rendezvous of {self.job_id} is closed")
        last = self.round.number if self.round is not None else -1
        reply = self._join(last)
        store = reply["store"]
        self.round = RoundInfo(
            number=reply["round"],
            rank=reply["rank"],
            world_size=reply["world_size"],
            hosts=tuple(reply.get("hosts", ())),
            store_host=store["host"],
            store_port=int(store["port"]),
            prefix=store["prefix"],
        )
        self._waiting, self._polled_at = 0, time.monotonic()
        if not self.min_nodes <= self.round.world_size <= self.max_nodes:
            log.warning(
                "round %d has %d nodes, outside [%d, %d]",
                self.round.number,
                self.round.world_size,
                self.min_nodes,
                self.max_nodes,
            )
        log.info(
            "%s joined round %d of %s as node %d of %d",
            self.host,
            self.round.number,
            self.job_id,
            self.round.rank,
            self.round.world_size,
        )
        agent_store = PrefixStore(
            f"{self.round.prefix}/agent", self._store(self.round.store_host, self.round.store_port)
        )
        return RendezvousInfo(
            agent_store,
            self.round.rank,
            self.round.world_size,
            RendezvousStoreInfo(self.round.store_host, self.round.store_port),
        )

    def num_nodes_waiting(self) -> int:
        if self.round is None:
            return 0
        now = time.monotonic()
        if now - self._polled_at < self.poll_interval_s:
            return self._waiting
        self._polled_at = now
        try:
            reply = self.client.request(RdzvPoll(self.job_id, self.host, self.round.number), timeout_s=5.0)
        except (ControllerUnavailable, RequestRefused) as exc:
            log.warning("rdzv.poll: %s (keeping the current round)", exc)
            return 0
        self._waiting = int(reply["waiting"])
        return self._waiting

    def wait_for_change(self) -> bool:
        """This node's workers returned while the job goes on: wait for the controller's word. True: the round changed
        (a peer re-forms; join the next round); False: the job is over (rank 0's result came, or this host left it)."""
        while self.round is not None:
            try:
                reply = self.client.request(RdzvPoll(self.job_id, self.host, self.round.number), timeout_s=10.0)
            except (ControllerUnavailable, RequestRefused) as exc:
                log.warning("rdzv.poll: %s (still waiting for the job's end)", exc)
                time.sleep(1.0)
                continue
            if not reply.get("current") or not reply.get("member", True):
                return False
            if int(reply.get("waiting") or 0) > 0 or reply.get("current") != self.round.number:
                return True
            time.sleep(self.poll_interval_s)
        return False

    def is_closed(self) -> bool:
        return self._closed

    def set_closed(self) -> None:
        self._closed = True

    def get_run_id(self) -> str:
        return self.job_id

    def shutdown(self) -> bool:
        self._stores.clear()
        return True

    # ------------------------------------------------------------ helpers

    def _join(self, last_round: int) -> dict[str, Any]:
        """Ask until the round closes; back off from 20 ms to 200 ms between asks."""
        deadline = time.monotonic() + self.join_timeout_s
        delay = 0.02
        message = RdzvJoin(self.job_id, self.host, last_round)
        while True:
            try:
                reply = self.client.request(message, timeout_s=max(1.0, min(30.0, deadline - time.monotonic())))
            except ControllerUnavailable as exc:
                if time.monotonic() >= deadline:
                    raise RendezvousConnectionError(f"rdzv.join of {self.job_id}: {exc}") from exc
                continue
            except RequestRefused as exc:
                raise RendezvousConnectionError(f"rdzv.join of {self.job_id} refused: {exc}") from exc
            state = reply.get("state")
            if state == "closed":
                return reply
            if state == "ended":
                raise RendezvousGracefulExitError(f"{self.host} has no part in {self.job_id} any more")
            if time.monotonic() >= deadline:
                raise RendezvousTimeoutError(f"round of {self.job_id} did not close within {self.join_timeout_s:.0f} s")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.2)

    def _store(self, host: str, port: int) -> Store:
        key = (host, port)
        if key not in self._stores:
            self._stores.clear()  # the store moved (restarted): the old connection is useless
            self._stores[key] = RunStore(self.client.run_dir, host, port, timeout=timedelta(seconds=STORE_TIMEOUT_S))
        return self._stores[key]


def create_handler(params: RendezvousParameters) -> PilotfillRendezvousHandler:
    """torch's factory signature: ``endpoint`` is the run directory; ``host`` and ``job_id`` come in the config."""
    client = params.config.get("client") or Client(params.endpoint, timeout_s=30.0)
    return PilotfillRendezvousHandler(
        client,
        job_id=params.run_id,
        host=params.config["host"],
        min_nodes=params.min_nodes,
        max_nodes=params.max_nodes,
        join_timeout_s=float(params.get("join_timeout", JOIN_TIMEOUT_S)),
        poll_interval_s=float(params.get("poll_interval", POLL_INTERVAL_S)),
    )


rendezvous_handler_registry.register(BACKEND, create_handler)
