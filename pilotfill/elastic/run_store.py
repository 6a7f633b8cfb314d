"""``RunStore``: a ``torch.distributed.Store`` backed by the run's store (:mod:`pilotfill.elastic.torch.store`).

What the torch agents' rendezvous and the ranks' ``init_process_group()`` use
in place of a ``TCPStore``: every request goes over pilotfill's transport
(CurveZMQ with the run's keys, HMAC with the store channel's key), so only
holders of the run's secret can use it. A blocking ``get``/``wait`` waits at
the store (a long poll), not in a loop of requests.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

from torch.distributed import Store

from ..transport import Client, ControllerUnavailable, RequestRefused
from .torch.store import (
    CHANNEL,
    StoreAdd,
    StoreAppend,
    StoreCheck,
    StoreCompareSet,
    StoreDelete,
    StoreGet,
    StoreMultiGet,
    StoreMultiSet,
    StoreNumKeys,
    StoreRequest,
    StoreSet,
    StoreWait,
    decode,
    encode,
)

RPC_S = 30.0
"""How long a store request may take beyond its own wait (a busy machine) before the store counts as gone."""


_ALIVE: list[Store] = []
"""Every RunStore made in this process. torch holds a Python store by its C++ half only: were the Python object
collected, torch's next call on it would fail ("Not implemented"). They are few (one per round and clone)."""


class RunStore(Store):
    """``torch.distributed.Store`` backed by the run's store: what agents and ranks use in place of a ``TCPStore``.

    Thread-safe (one request at a time); ``clone()`` gives an independent connection.
    """

    def __init__(self, run_dir: str | Path, host: str, port: int, timeout: timedelta = timedelta(seconds=300)):
        super().__init__()
        _ALIVE.append(self)
        self._where = (str(run_dir), str(host), int(port))
        self._client = Client(run_dir, timeout_s=RPC_S, endpoint=f"tcp://{host}:{int(port)}", channel=CHANNEL)
        self._lock = threading.Lock()
        self.set_timeout(timeout)

    # --------------------------------------------------------- torch's Store API

    def set(self, key: str, value: bytes | str) -> None:
        self._call(StoreSet(key, encode(_raw(value))))

    def get(self, key: str) -> bytes:
        return self._values([key], self.timeout, single=True)[0]

    def add(self, key: str, amount: int) -> int:
        return int(self._call(StoreAdd(key, int(amount)))["value"])

    def compare_set(self, key: str, expected_value: bytes | str, desired_value: bytes | str) -> bytes:
        reply = self._call(StoreCompareSet(key, encode(_raw(expected_value)), encode(_raw(desired_value))))
        return decode(reply["value"])

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        wait = timeout if timeout is not None else self.timeout
        reply = self._call(StoreWait(list(keys), wait.total_seconds()), wait.total_seconds())
        if reply.get("timeout"):
            self._timed_out(keys, wait)

    def check(self, keys: list[str]) -> bool:
        return bool(self._call(StoreCheck(list(keys)))["present"])

    def delete_key(self, key: str) -> bool:
        return bool(self._call(StoreDelete(key))["deleted"])

    def num_keys(self) -> int:
        return int(self._call(StoreNumKeys())["count"])

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return self._values(list(keys), self.timeout)

    def multi_set(self, keys: list[str], values: list[bytes | str]) -> None:
        self._call(StoreMultiSet(list(keys), [encode(_raw(v)) for v in values]))

    def append(self, key: str, value: bytes | str) -> None:
        self._call(StoreAppend(key, encode(_raw(value))))

    def clone(self) -> RunStore:
        return RunStore(*self._where, timeout=self.timeout)

    # --------------------------------------------------------- helpers

    def _values(self, keys: list[str], wait: timedelta, single: bool = False) -> list[bytes]:
        """``get`` (``single``: one key) or ``multi_get``: waits at the store until every key is set."""
        message = StoreGet(wait.total_seconds(), keys[0]) if single else StoreMultiGet(wait.total_seconds(), keys)
        reply = self._call(message, wait.total_seconds())
        if reply.get("timeout"):
            self._timed_out(keys, wait)
        return [decode(v) for v in reply["values"]]

    def _call(self, message: StoreRequest, wait_s: float = 0.0) -> dict[str, Any]:
        from torch.distributed import DistStoreError

        budget = wait_s + RPC_S
        try:
            with self._lock:
                return self._client.request(message, timeout_s=budget, attempt_s=budget)
        except ControllerUnavailable:
            _, host, port = self._where
            raise DistStoreError(
                f"the run's torch store at {host}:{port} did not answer {message.TYPE} within {budget:.0f} s"
            ) from None
        except RequestRefused as exc:
            raise DistStoreError(f"the run's torch store refused {message.TYPE}: {exc}") from None

    def _timed_out(self, keys: list[str], wait: timedelta) -> None:
        from torch.distributed import DistStoreError

        raise DistStoreError(
            f"timed out after {wait.total_seconds():.0f} s waiting for {list(keys)[:4]} in the run's torch store"
        )


def _raw(value: bytes | str) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)
