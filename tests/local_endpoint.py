"""A stand-in for ``globus_compute_sdk.Executor`` that runs tasks in a local "endpoint" process.

Same interface as the SDK's executor (``submit(fn, *args, **kwargs)`` ->
future, ``endpoint_id``, ``client.get_endpoint_status``, ``shutdown``), and
every payload goes through the SDK's own ``ComputeSerializer`` both ways,
across a process boundary — so what works here serializes for the real
service. Failures come back as the SDK's own exception types.
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import Future
from typing import Any

import requests
from globus_compute_sdk.errors import TaskExecutionFailed
from globus_compute_sdk.serialize import ComputeSerializer
from globus_sdk import GlobusAPIError

WORKER = r"""
import sys, traceback
from globus_compute_sdk.serialize import ComputeSerializer
s = ComputeSerializer()
fn, args, kwargs = (s.deserialize(b) for b in s.unpack_buffers(sys.stdin.read()))
try:
    out = {"ok": s.serialize(fn(*args, **kwargs))}
except Exception:
    out = {"error": traceback.format_exc()}
import json
sys.stdout.write("\n@@RESULT@@" + json.dumps(out))
"""


def api_error(status: int, message: str) -> GlobusAPIError:
    """A GlobusAPIError as the service would raise it."""
    r = requests.Response()
    r.status_code = status
    r._content = json.dumps({"code": "NOT_FOUND" if status == 404 else "ERROR", "message": message}).encode()
    r.headers["Content-Type"] = "application/json"
    r.request = requests.Request("GET", "https://compute.api.globus.org/v2/endpoints/x/status").prepare()
    return GlobusAPIError(r)


class _Client:
    def __init__(self, status: str | Exception):
        self._status = status

    def get_endpoint_status(self, endpoint: str) -> dict[str, Any]:
        if isinstance(self._status, Exception):
            raise self._status
        return {"status": self._status}


class LocalEndpointExecutor:
    def __init__(self, endpoint_id: str, status: str | Exception = "online", env: dict[str, str] | None = None):
        self.endpoint_id = endpoint_id
        self.client = _Client(status)
        self.serializer = ComputeSerializer()
        self.env = env
        self.submitted: list[str] = []

    def submit(self, fn, *args: Any, **kwargs: Any) -> Future:
        payload = self.serializer.pack_buffers([self.serializer.serialize(x) for x in (fn, args, kwargs)])
        self.submitted.append(fn.__name__)
        future: Future = Future()
        proc = subprocess.run([sys.executable, "-c", WORKER], input=payload, capture_output=True, text=True, timeout=120, env=self.env)
        if "@@RESULT@@" not in proc.stdout:
            future.set_exception(TaskExecutionFailed(proc.stderr[-3000:]))
            return future
        out = json.loads(proc.stdout.split("@@RESULT@@", 1)[1])
        if "error" in out:
            future.set_exception(TaskExecutionFailed(out["error"]))
        else:
            future.set_result(self.serializer.deserialize(out["ok"]))
        return future

    def shutdown(self, wait: bool = True) -> None:
        pass
