"""``ElasticExecutor``: a Parsl executor whose tasks are elastic training jobs on harvested nodes.

``submit`` turns an app call into a controller job — the function and its
arguments serialized with Parsl's own serializer, the app's resource
specification (min/max nodes, optional known curve, work, weight, rescale
costs) as the job's bounds — and returns a future at once; a background
thread sends the job and resolves the future with rank 0's return value, or
with the remote exception and its traceback. The controller, not Parsl,
decides where and on how many nodes the job runs.

A task that carries no pilotfill resource specification (an ordinary
``@python_app`` that Parsl happened to route here) runs in a small local
thread pool instead of being turned into a training job.
"""

from __future__ import annotations

import base64
import logging
import queue
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable

from parsl.executors import ThreadPoolExecutor
from parsl.executors.base import ParslExecutor
from parsl.serialize import deserialize, pack_apply_message

from ..client import ControllerClient
from ..state import TERMINAL

log = logging.getLogger("pilotfill.executor")

SPEC_KEYS = {"min_nodes", "max_nodes", "curve", "total_samples", "weight", "scale_up_cost_s", "scale_down_cost_s", "name"}


def call_name(name: str, args: tuple, kwargs: dict, limit: int = 48) -> str:
    """``train(2, 96, 'relu')``: which call a job is, in views and status tables."""
    shown = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items() if not k.startswith("parsl_")]
    text = f"{name}({', '.join(shown)})"
    return text if len(text) <= limit else text[: limit - 2] + "…)"


class ElasticExecutor(ParslExecutor):
    """Parsl executor backed by a pilotfill controller (started by ``pilotfill run``)."""

    def __init__(self, controller_run_dir: str | Path, label: str = "elastic", poll_s: float = 0.5):
        super().__init__()
        self.label = label
        self.controller_run_dir = Path(controller_run_dir)
        self.poll_s = poll_s
        self._outbox: queue.Queue = queue.Queue()
        self._pending: dict[str, Future] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._local = ThreadPoolExecutor(label=f"{label}-local", max_threads=2)

    def start(self) -> None:
        self._local.run_dir = self.run_dir
        self._local.start()
        self._thread = threading.Thread(target=self._work, name="pilotfill-elastic-executor", daemon=True)
        self._thread.start()

    def submit(self, func: Callable, resource_specification: dict[str, Any], *args: Any, **kwargs: Any) -> Future:
        spec = dict(resource_specification or {})
        if "min_nodes" not in spec:
            return self._local.submit(func, {}, *args, **kwargs)
        future: Future = Future()
        payload = base64.b64encode(pack_apply_message(func, args, kwargs)).decode()
        job = {k: v for k, v in spec.items() if k in SPEC_KEYS}
        job["name"] = call_name(job.get("name") or getattr(func, "__name__", "task"), args, kwargs)
        job["payload"] = payload
        self._outbox.put((future, job))
        return future

    def shutdown(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        for job_id, future in list(self._pending.items()):
            if not future.done():
                future.set_exception(RuntimeError(f"executor shut down before job {job_id} finished"))
        self._local.shutdown()

    # ------------------------------------------------------------ the background thread

    def _work(self) -> None:
        client = ControllerClient(self.controller_run_dir)
        while not self._stop.is_set():
            try:
                while True:
                    future, job = self._outbox.get_nowait()
                    try:
                        self._pending[client.submit(job)] = future
                    except Exception as exc:  # refused (bad spec) or no controller: the app fails, clearly
                        future.set_exception(exc)
            except queue.Empty:
                pass
            for job_id, future in list(self._pending.items()):
                try:
                    record = client.job(job_id)
                except Exception as exc:
                    log.warning("cannot read job %s: %s", job_id, exc)
                    break
                if record["status"] in TERMINAL:
                    del self._pending[job_id]
                    self._resolve(future, record)
            self._stop.wait(self.poll_s)
        client.close()

    @staticmethod
    def _resolve(future: Future, record: dict[str, Any]) -> None:
        result = record.get("result")
        if isinstance(result, dict) and "parsl" in result:
            # rank 0's return value, or Parsl's RemoteExceptionWrapper carrying the remote traceback
            future.set_result(deserialize(base64.b64decode(result["parsl"])))
        elif record["status"] == "finished":
            future.set_result(result)
        else:
            future.set_exception(RuntimeError(f"elastic job {record['id']} {record['status']}: {record.get('error') or ''}".strip()))
