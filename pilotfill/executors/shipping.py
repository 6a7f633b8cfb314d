"""Sending an elastic app's call to the nodes, with what it references from the campaign.

A campaign is a script, run as ``__main__``: its functions cannot be imported
by name where ranks run. So a call is shipped by value with cloudpickle,
which takes along what the function refers to in the campaign — module-level
imports (by name: ``import pilotfill`` arrives as the module), helper
functions and constants (by value) — as users of Parsl-based tools expect from
a decorated function in their script. What cannot be shipped is said when
the app is called, naming the variable; a module that cannot be imported where
the rank runs is said by the rank, naming the module.
"""

from __future__ import annotations

import base64
import pickle
from typing import Any, Callable

import cloudpickle


class CannotShip(RuntimeError):
    """A call that cannot be sent to the nodes, or cannot be opened there; ``str()`` says which name and why."""


def pack_call(name: str, func: Callable, args: tuple, kwargs: dict) -> str:
    """The call as text (base64 of a cloudpickle), or :class:`CannotShip` naming what cannot go."""
    try:
        return base64.b64encode(cloudpickle.dumps((func, args, kwargs))).decode()
    except Exception as exc:
        raise CannotShip(f"{name}: cannot be sent to the nodes: {_culprit(func, args, kwargs) or exc}") from None


def unpack_call(payload: str) -> tuple[Callable, tuple, dict]:
    """The call back, where a rank runs it; a module missing here is named."""
    try:
        func, args, kwargs = pickle.loads(base64.b64decode(payload))
    except ModuleNotFoundError as exc:
        raise CannotShip(
            f"the app needs the module {exc.name!r}, which cannot be imported where it runs (install it on the compute "
            f"nodes, or make it importable: PYTHONPATH)"
        ) from None
    except Exception as exc:
        raise CannotShip(f"the app's call could not be opened where it runs: {type(exc).__name__}: {exc}") from None
    return func, args, kwargs


def _culprit(func: Callable, args: tuple, kwargs: dict) -> str | None:
    """Which argument or global of the function cannot be pickled (the first one found), in words."""
    for i, value in enumerate(args):
        if not _ships(value):
            return f"argument {i + 1} ({type(value).__name__}) cannot be pickled"
    for key, value in kwargs.items():
        if not _ships(value):
            return f"argument {key}= ({type(value).__name__}) cannot be pickled"
    for target in _functions(func):
        names = getattr(getattr(target, "__code__", None), "co_names", ())
        scope: dict[str, Any] = getattr(target, "__globals__", {})
        for name in names:
            if name in scope and not _ships(scope[name]):
                return f"it uses the global {name!r} ({type(scope[name]).__name__}), which cannot be pickled"
    return None


def _functions(func: Callable) -> list[Callable]:
    """The function and the functions it wraps (Parsl's and pilotfill's wrappers hold the user's in closures)."""
    seen, todo = [], [func]
    while todo:
        f = todo.pop()
        if f in seen or not callable(f):
            continue
        seen.append(f)
        todo += [
            c.cell_contents
            for c in (getattr(f, "__closure__", None) or ())
            if callable(getattr(c, "cell_contents", None))
        ]
        wrapped = getattr(f, "__wrapped__", None)
        if wrapped is not None:
            todo.append(wrapped)
    return seen


def _ships(value: Any) -> bool:
    try:
        cloudpickle.dumps(value)
        return True
    except Exception:
        return False
