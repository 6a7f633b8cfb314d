"""Code for another runtime than the one its ranks run under fails at once, saying how to run it.

Outside ``horovodrun``, ``hvd.init()`` does not fail: every process becomes a
Horovod world of its own, so the N ranks of a job would train N separate
copies, each believing it is alone, their reports summed as if they were one
job. So a rank of the torch or processes runtime refuses Horovod before the
app's code is opened: :func:`refuse_horovod` replaces Horovod's ``init`` (of
every framework: they share ``HorovodBasics``) with one that raises
:class:`RuntimeMismatch`, whose one line says how to run the app.

The Horovod runtime's ranks (``PILOTFILL_RUNTIME=horovod``, or any process
horovodrun started: ``HOROVOD_RANK``) are left alone.

The other way round, ``torch.distributed.init_process_group()`` with its
default ``env://`` rendezvous under a runtime that is not torch's finds no
``MASTER_ADDR`` or ``RANK`` and fails with torch's own words about environment
variables, which tell the user nothing of pilotfill. :func:`refuse_torch_distributed`
wraps it (when, and only if, the app imports ``torch.distributed``: importing
torch costs seconds a plain rank should not pay) so that it raises
:class:`RuntimeMismatch` with the line that says how to run the app.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from collections.abc import Callable
from types import ModuleType


class RuntimeMismatch(RuntimeError):
    """The app's code is written for another runtime than the one its ranks run under."""


def horovod_message(runtime: str) -> str:
    return (
        f"this app calls Horovod (hvd.init()), but its ranks run under the {runtime} runtime, which does not launch "
        "them with "
        'horovodrun: each rank would be a Horovod world of one. Run it with Horovod: @pilotfill.elastic_app(..., '
        f'runtime="horovod"), or [runtime] kind = "horovod" in the site config'
    )


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


def torch_message(runtime: str) -> str:
    return (
        f"this app calls torch.distributed.init_process_group() (env://), but its ranks run under the {runtime} "
        f"runtime, which does not start torch's rendezvous: no rank would find the others. Run it with torch: "
        f'@pilotfill.elastic_app(..., runtime="torch"), or [runtime] kind = "torch" in the site config'
    )


def refuse_torch_distributed(runtime: str) -> bool:
    """Make ``torch.distributed.init_process_group()`` with the ``env://`` rendezvous raise :class:`RuntimeMismatch`
    in this process, a rank of ``runtime``, unless something set that rendezvous up (``MASTER_ADDR``) or the app
    passes its own store or ``init_method``. False where the torch runtime runs it or torch is not installed."""
    if runtime == "torch":
        return False
    try:
        if importlib.util.find_spec("torch") is None:
            return False
    except Exception:
        return False
    message = torch_message(runtime)

    def patch(module: ModuleType) -> None:
        original = getattr(module, "init_process_group", None)
        if original is None or getattr(original, "pilotfill_runtime", None) == runtime:
            return

        def init_process_group(*args, **kwargs):
            init_method = kwargs.get("init_method", args[1] if len(args) > 1 else None)
            if (
                kwargs.get("store") is None
                and (init_method is None or str(init_method).startswith("env://"))
                and "MASTER_ADDR" not in os.environ
            ):
                raise RuntimeMismatch(message)
            return original(*args, **kwargs)

        init_process_group.pilotfill_runtime = runtime  # type: ignore[attr-defined]
        module.init_process_group = init_process_group

    if "torch.distributed" in sys.modules:
        patch(sys.modules["torch.distributed"])
    elif not any(isinstance(f, _AfterImport) and f.name == "torch.distributed" for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport("torch.distributed", patch))
    return True


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``then(module)`` right after the module ``name`` is first imported, without importing it before."""

    def __init__(self, name: str, then: Callable[[ModuleType], None]):
        self.name, self.then = name, then

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # found by the finders after this one; once is enough
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader, then = spec.loader, self.then
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            then(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec
