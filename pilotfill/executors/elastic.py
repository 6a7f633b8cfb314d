"""``ElasticExecutor``: a Parsl executor whose tasks are elastic training jobs on harvested nodes.

``submit`` turns an app call into a controller job — the function and its
arguments serialized with Parsl's own serializer, the app's resource
specification (min/max nodes, optional known curve, work, weight, rescale
costs, and the runtime the app names, if it names one) as the job's bounds — and returns a future at once; a
background thread sends the job and resolves the future with rank 0's return value, or
with the remote exception and its traceback. The controller, not Parsl,
decides where and on how many nodes the job runs.

A task that carries no pilotfill resource specification (an ordinary
``@python_app`` that Parsl happened to route here) runs in a small local
thread pool instead of being turned into a training job.
"""

from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable

from parsl.executors import ThreadPoolExecutor
from parsl.executors.base import ParslExecutor
from parsl.serialize import deserialize

from ..client import ControllerClient
from ..lifecycle import TERMINAL, JobStatus
from ..results import ResultUnavailable, is_packed, unpack
from ..transport import ControllerUnavailable, Interrupted
from .identity import call_key
from .shipping import CannotShip, pack_call

log = logging.getLogger("pilotfill.executor")

SPEC_KEYS = {
    "min_nodes",
    "max_nodes",
    "curve",
    "curves",
    "model",
    "total_samples",
    "weight",
    "scale_up_cost_s",
    "scale_down_cost_s",
    "restart_cost_s",
    "name",
    "runtime",
    "runtime_detected",
    "group",
    "fresh",
    "global_batch",
    "min_per_rank",
    "model_name",
}


class CampaignHalted(RuntimeError):
    """The app did not finish because the campaign could not go on (its controller is gone for good)."""


def call_name(name: str, args: tuple, kwargs: dict, limit: int = 48) -> str:
    """``train(2, 96, 'relu')``: which call a job is, in views and status tables."""
    shown = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items() if not k.startswith("parsl_")]
    text = f"{name}({', '.join(shown)})"
    return text if len(text) <= limit else text[: limit - 2] + "…)"


class ElasticExecutor(ParslExecutor):
    """Parsl executor backed by a pilotfill controller (started by ``pilotfill run``)."""

    def __init__(
        self,
        controller_run_dir: str | Path,
        label: str = "elastic",
        poll_s: float = 0.5,
        default_runtime: str = "torch",
        on_note: Callable[[str], None] = lambda text: None,
    ):
        """``default_runtime``: the site config's (``[runtime] kind``); ``on_note``: told once per app whose code chose
        another (``pilotfill run`` puts it on the progress line)."""
        super().__init__()
        self.label = label
        self.controller_run_dir = Path(controller_run_dir)
        self.poll_s = poll_s
        self.default_runtime, self.on_note = default_runtime, on_note
        self._noted: set[str] = set()
        self._outbox: queue.Queue = queue.Queue()
        # job -> the futures of the calls it is (a cached call made twice is one job)
        self._pending: dict[str, list[Future]] = {}
        self._calls: dict[str, int] = {}  # an uncached call's key -> how often this campaign made it (each its own job)
        self._stop = threading.Event()
        self._failed: str | None = None
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
        if self._failed is not None:
            future.set_exception(CampaignHalted(self._failed))
            return future
        # no runtime: the config's
        job = {k: v for k, v in spec.items() if k in SPEC_KEYS and not (k == "runtime" and v is None)}
        function = job.get("name") or getattr(func, "__name__", "task")
        detected = job.get("runtime_detected")
        if detected and job.get("runtime") != self.default_runtime and function not in self._noted:
            self._noted.add(function)  # once per app, not per call
            self.on_note(
                f"{function}(): its code {detected}: it runs under the {job['runtime']} runtime (the config's is "
                f"{self.default_runtime}); elastic_app(runtime=...) chooses another"
            )
        job["name"] = call_name(function, args, kwargs)
        try:
            payload = pack_call(job["name"], func, args, kwargs)
        except CannotShip as exc:  # said when the app is called, naming what cannot go
            future.set_exception(exc)
            return future
        key = call_key(func, args, kwargs)
        if key is not None and job.get("fresh"):
            # cache=False: each call is its own job; the n-th such call still resumes the n-th of an interrupted run
            n = self._calls[key] = self._calls.get(key, -1) + 1
            key = f"{key}#{n}"
        if key is not None:
            job["key"] = key
        job["payload"] = payload
        self._outbox.put((future, job))
        return future

    def fail_all(self, reason: str) -> None:
        """The controller is gone for good: every app still waiting fails with ``reason``, and so will new ones."""
        self._failed = reason
        while True:
            try:
                future, _ = self._outbox.get_nowait()
            except queue.Empty:
                break
            if not future.done():
                future.set_exception(CampaignHalted(reason))
        for job_id, futures in list(self._pending.items()):
            self._pending.pop(job_id, None)
            for future in futures:
                if not future.done():
                    future.set_exception(CampaignHalted(reason))

    def shutdown(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        for job_id, futures in list(self._pending.items()):
            for future in futures:
                if not future.done():
                    future.set_exception(RuntimeError(f"executor shut down before job {job_id} finished"))
        self._local.shutdown()

    # ------------------------------------------------------------ the background thread

    def _work(self) -> None:
        # shutdown does not wait on a request
        client = ControllerClient(self.controller_run_dir, interrupt=self._stop.is_set)
        while not self._stop.is_set():
            self._send(client)
            self._collect(client)
            self._stop.wait(self.poll_s)
        client.close()

    def _send(self, client: ControllerClient) -> None:
        """Submit what the campaign launched; while the controller is away (restarting), keep it for later."""
        waiting = []
        while True:
            try:
                future, job = self._outbox.get_nowait()
            except queue.Empty:
                break
            if future.done():
                continue
            try:
                job_id = client.submit(job)
            except (ControllerUnavailable, Interrupted):
                waiting.append((future, job))
                continue
            except Exception as exc:  # refused (a bad spec, an impossible job): the app fails, clearly
                future.set_exception(exc)
                continue
            if job_id in self._pending and job["name"] not in self._noted:
                self._noted.add(job["name"])
                self.on_note(
                    f"{job['name']} was called again while it trains: one training answers both calls (cached apps "
                    f"share a call's result; elastic_app(cache=False) runs every call)"
                )
            self._pending.setdefault(job_id, []).append(future)
        for item in waiting:
            self._outbox.put(item)
        if self._failed is not None:  # failed while this pass was sending: what it held back fails too
            self.fail_all(self._failed)

    def _collect(self, client: ControllerClient) -> None:
        """Resolve the futures of jobs that ended (one request for all of them)."""
        if not self._pending:
            return
        try:
            records = client.status(list(self._pending))
        except ControllerUnavailable as exc:
            log.info("controller unavailable (%s); still waiting", exc)
            return
        except Interrupted:  # shutting down
            return
        for job_id, record in records.items():
            if record["status"] in TERMINAL:
                for future in self._pending.pop(job_id, []):
                    if not future.done():
                        self._resolve(future, record)

    def _resolve(self, future: Future, record: dict[str, Any]) -> None:
        result = record.get("result")
        if is_packed(result):
            # rank 0's return value, or Parsl's RemoteExceptionWrapper carrying the remote traceback; inline, or (a
            # large one) in the run directory beside the journal
            try:
                data = unpack(self.controller_run_dir, result)
            except ResultUnavailable as exc:
                future.set_exception(exc)
                return
            future.set_result(deserialize(data))
        elif record["status"] == JobStatus.FINISHED:
            future.set_result(result)
        else:
            future.set_exception(
                RuntimeError(f"elastic job {record['id']} {record['status']}: {record.get('error') or ''}".strip())
            )
