"""Which runtime an app's code is written for, read from the code itself before its first rank starts.

BFTrainer's users write Elastic Horovod (``hvd.init()``, ``hvd.DistributedOptimizer``, ``hvd.elastic.run``) and name
no runtime; torch users call ``torch.distributed.init_process_group``. Such an app should just run: an app that names
no runtime runs under the one its code is written for, and ``pilotfill run`` says so once when that is not the site
config's. What the function (and the campaign's own helpers it calls, its nested functions) imports and refers to
decides:

* Horovod — it imports ``horovod…`` or refers to a module, function or class of Horovod's;
* torch — it imports ``torch.distributed…``, refers to that module, or calls ``init_process_group``;
* neither — nothing to go by (plain Python, the processes runtime's ``pilotfill.report`` alone): the config's runtime.

Horovod wins where both appear (Horovod code uses torch too). ``elastic_app(runtime=…)`` is for the rare code this
cannot read (an import by name through ``importlib``); a rank that calls ``hvd.init()`` under another runtime still
fails at once, saying how to run it (:mod:`pilotfill.elastic.guard`).
"""

from __future__ import annotations

import dis
import types
from collections.abc import Callable
from typing import Any

MAX_DEPTH = 4
"""Helpers calling helpers: followed this deep into the campaign's own functions."""


def detect_runtime(func: Callable) -> tuple[str, str] | None:
    """``("horovod", "imports horovod.torch")``, ``("torch", "calls init_process_group()")`` or None."""
    found: dict[str, str] = {}
    seen: set[int] = set()
    home = getattr(func, "__module__", None)

    def note(runtime: str, why: str) -> None:
        found.setdefault(runtime, why)

    def look_at(name: str, obj: Any, depth: int) -> None:
        module = obj.__name__ if isinstance(obj, types.ModuleType) else getattr(obj, "__module__", None) or ""
        if module.split(".")[0] == "horovod":
            note("horovod", f"uses {name} ({module})")
        elif module.startswith("torch.distributed") and isinstance(obj, types.ModuleType):
            note("torch", f"uses {name} ({module})")
        elif isinstance(obj, types.FunctionType) and obj.__module__ == home and depth < MAX_DEPTH:
            visit(obj, depth + 1)

    def visit_code(code: types.CodeType, globs: dict[str, Any], depth: int) -> None:
        if id(code) in seen:
            return
        seen.add(id(code))
        for ins in dis.get_instructions(code):
            if ins.opname == "IMPORT_NAME":
                name = str(ins.argval)
                if name.split(".")[0] == "horovod":
                    note("horovod", f"imports {name}")
                elif name.startswith("torch.distributed"):
                    note("torch", f"imports {name}")
            elif ins.opname in ("LOAD_GLOBAL", "LOAD_NAME") and ins.argval in globs:
                look_at(str(ins.argval), globs[ins.argval], depth)
            elif ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and ins.argval == "init_process_group":
                note("torch", "calls init_process_group()")
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                visit_code(const, globs, depth)

    def visit(f: Callable, depth: int) -> None:
        f = getattr(f, "__wrapped__", f)
        code = getattr(f, "__code__", None)
        if code is None:
            return
        globs = getattr(f, "__globals__", {})
        for name, cell in zip(code.co_freevars, getattr(f, "__closure__", None) or ()):
            try:
                look_at(name, cell.cell_contents, depth)
            except ValueError:  # an empty cell
                pass
        visit_code(code, globs, depth)

    visit(func, 0)
    for runtime in ("horovod", "torch"):
        if runtime in found:
            return runtime, found[runtime]
    return None
