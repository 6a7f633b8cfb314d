"""Horovod code under a runtime that did not launch it fails at once, saying how to run it.

Outside ``horovodrun``, ``hvd.init()`` does not fail: every process becomes a
Horovod world of its own, so the N ranks of a job would train N separate
copies, each believing it is alone, their reports summed as if they were one
job. So a rank of the torch or processes runtime refuses Horovod before the
app's code is opened: :func:`refuse_horovod` replaces Horovod's ``init`` (of
every framework: they share ``HorovodBasics``) with one that raises
:class:`RuntimeMismatch`, whose one line says how to run the app.

The Horovod runtime's ranks (``PILOTFILL_RUNTIME=horovod``, or any process
horovodrun started: ``HOROVOD_RANK``) are left alone.
"""

from __future__ import annotations

import importlib.util
import os


class RuntimeMismatch(RuntimeError):
    """The app's code is written for another runtime than the one its ranks run under."""


def horovod_message(runtime: str) -> str:
    return (f"this app calls Horovod (hvd.init()), but its ranks run under the {runtime} runtime, which does not launch them with "
            f"horovodrun: each rank would be a Horovod world of one. Run it with Horovod: @pilotfill.elastic_app(..., runtime=\"horovod\"), "
            f"or [runtime] kind = \"horovod\" in the site config")  # fmt: skip


def refuse_horovod(runtime: str) -> bool:
    """Make ``hvd.init()`` raise :class:`RuntimeMismatch` in this process, a rank of ``runtime``; False where
    Horovod is not installed (nothing to refuse). Call it before the app's modules are imported."""
    if runtime == "horovod" or "HOROVOD_RANK" in os.environ:  # launched by horovodrun: Horovod is what runs it
        return False
    try:
        if importlib.util.find_spec("horovod") is None:
            return False
        from horovod.common.basics import HorovodBasics
    except Exception:  # a broken Horovod install: the app's own import of it says what is wrong
        return False
    if getattr(HorovodBasics.init, "pilotfill_runtime", None) == runtime:
        return True
    message = horovod_message(runtime)

    def init(self, *args, **kwargs):
        raise RuntimeMismatch(message)

    init.pilotfill_runtime = runtime  # type: ignore[attr-defined]
    HorovodBasics.init = init  # horovod.torch (and .tensorflow, …) bind their init to this when first imported
    return True
