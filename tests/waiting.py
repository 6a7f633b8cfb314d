"""Waiting for a condition in a test, with a generous limit (CI's machine may be busy) and a message naming what."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str, poll_s: float = 0.1, detail: Callable[[], str] | None = None) -> Any:
    """Return the first true value of ``predicate()``; after ``timeout_s``, raise naming ``what`` (and ``detail()``, a log tail)."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll_s)
    more = detail() if detail is not None else ""
    raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}" + (f"\n{more}" if more else ""))
