"""Which call an app call is: its function's code, what that code ships with it, and its arguments.

A finished app's result is reused (Parsl's checkpoints) and an unfinished
training resumes from its commits (``runs/checkpoints/<key>.pt``) only for the
same call. Parsl identifies a function by its name alone, so an edited
training function re-ran with its old result, and two campaigns that both
define ``work`` shared results. Here a function is identified by a digest of
what runs: its bytecode and constants (not its line numbers: moving it is no
change), its defaults and closure, and every global it uses — the campaign's
helpers and constants by value, recursively, modules and library functions by
name. A user's own module beside the campaign (not installed, not the standard
library) counts as the campaign's code.
"""

from __future__ import annotations

import hashlib
import inspect
import pickle
import sys
import sysconfig
import types
from pathlib import Path
from typing import Any

import cloudpickle
from parsl.app.app import AppBase
from parsl.dataflow.memoization import id_for_memo

MAX_CODE_OBJECTS = 5_000
"""A digest walks at most this many functions and classes (a campaign is far smaller;
a cycle or a huge module is cut)."""

_LIBRARY_ROOTS = tuple(
    str(Path(p).resolve())
    for p in {*sysconfig.get_paths().values(), sys.prefix, sys.base_prefix, str(Path(__file__).resolve().parent.parent)}
)


@id_for_memo.register(bytes)
@id_for_memo.register(bytearray)
@id_for_memo.register(complex)
@id_for_memo.register(bool)
def _id_for_plain_value(obj: object, output_ref: bool = False) -> bytes:
    """Values Parsl's memoizer has no rule for, though their pickle is their identity (an app taking ``bytes`` was
    refused: "unknown type for memoization")."""
    return pickle.dumps(bytes(obj) if isinstance(obj, bytearray) else obj)


@id_for_memo.register(types.FunctionType)
def _id_for_function(func: types.FunctionType, output_ref: bool = False) -> bytes:
    """A function as an argument or as an app: its name and the digest of its code (Parsl's: the name alone)."""
    return pickle.dumps(["function", func.__name__, code_digest(func)])


def code_digest(func: Any) -> str:
    """What ``func`` runs, as a hex digest: equal for the same code, different when it or what it uses changed."""
    walk = _Walk()
    walk.function(inspect.unwrap(func))
    return walk.hash.hexdigest()[:32]


def call_key(func: Any, args: tuple, kwargs: dict) -> str | None:
    """Which call this is, stably across runs: the function's code digest and its arguments as Parsl's memoizer
    identifies them. None when an argument has no stable identity (no resume for that call, nothing worse)."""
    try:
        ident = id_for_memo(list(args)) + id_for_memo({k: v for k, v in kwargs.items() if not k.startswith("parsl_")})
    except Exception:
        return None
    name = getattr(inspect.unwrap(func), "__name__", "app")
    return hashlib.sha256(name.encode() + b"\0" + code_digest(func).encode() + b"\0" + ident).hexdigest()[:32]


def users_code(module_name: str | None) -> bool:
    """Whether a module is the campaign's own code (the script, or a file beside it) rather than a library."""
    if module_name in (None, "__main__"):
        return True
    module = sys.modules.get(module_name)
    path = getattr(module, "__file__", None)
    if path is None:
        return False
    resolved = str(Path(path).resolve())
    return not resolved.startswith(_LIBRARY_ROOTS)


class _Walk:
    """One digest: the functions and classes met so far, and the hash fed in a fixed order."""

    def __init__(self) -> None:
        self.hash = hashlib.sha256()
        self.seen: set[int] = set()

    def put(self, *parts: Any) -> None:
        self.hash.update(pickle.dumps(parts, protocol=4))

    def function(self, func: Any) -> None:
        if id(func) in self.seen or len(self.seen) >= MAX_CODE_OBJECTS:
            self.put("again", getattr(func, "__qualname__", ""))
            return
        self.seen.add(id(func))
        code = getattr(func, "__code__", None)
        if code is None:
            self.put("callable", _reference(func))
            return
        self.put("function", func.__qualname__)
        self.code(code)
        self.value(func.__defaults__)
        self.value(func.__kwdefaults__)
        for cell in func.__closure__ or ():
            try:
                self.global_value(cell.cell_contents)
            except ValueError:  # an empty cell
                self.put("empty cell")
        scope = func.__globals__
        for name in sorted(_names(code)):
            if name in scope:
                self.put("global", name)
                self.global_value(scope[name])

    def code(self, code: types.CodeType) -> None:
        self.put(
            code.co_name,
            code.co_argcount,
            code.co_posonlyargcount,
            code.co_kwonlyargcount,
            code.co_flags,
            code.co_code,
            code.co_names,
            code.co_varnames,
            code.co_freevars,
            code.co_cellvars,
        )
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                self.code(const)
            else:
                self.value(const)

    def global_value(self, value: Any) -> None:
        """A name the code uses: the campaign's own functions and classes by their code, the rest by what they are."""
        if isinstance(value, types.ModuleType):
            self.put("module", value.__name__)
        elif isinstance(value, (types.FunctionType, type)) and users_code(getattr(value, "__module__", None)):
            if isinstance(value, type):
                self.cls(value)
            else:
                self.function(value)
        elif isinstance(value, AppBase) and users_code(getattr(inspect.unwrap(value.func), "__module__", None)):
            self.function(inspect.unwrap(value.func))  # another app of the campaign: the function it wraps
        elif isinstance(value, (types.FunctionType, types.BuiltinFunctionType, type)):
            self.put("reference", _reference(value))
        else:
            self.value(value)

    def cls(self, cls: type) -> None:
        if id(cls) in self.seen:
            self.put("again", cls.__qualname__)
            return
        self.seen.add(id(cls))
        self.put("class", cls.__qualname__, [_reference(b) for b in cls.__bases__])
        for name, member in sorted(vars(cls).items()):
            if name in ("__dict__", "__weakref__", "__module__", "__doc__", "__qualname__"):
                continue
            self.put("member", name)
            target = getattr(member, "__func__", member)  # staticmethod, classmethod
            if isinstance(target, property):
                for part in (target.fget, target.fset, target.fdel):
                    self.global_value(part)
            else:
                self.global_value(target)

    def value(self, value: Any) -> None:
        """A constant: Parsl's identity where it has one (dicts by sorted keys), else its pickle, else its type."""
        if isinstance(value, (set, frozenset)):
            self.put(type(value).__name__, sorted(repr(v) for v in value))
            return
        try:
            self.put("value", id_for_memo(value))
            return
        except Exception:
            pass
        try:
            self.put("pickled", cloudpickle.dumps(value, protocol=4))
        except Exception:
            self.put("opaque", _reference(type(value)))


def _names(code: types.CodeType) -> set[str]:
    """Every global or attribute name the code and the code nested in it use."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def _reference(obj: Any) -> str:
    return (
        f"{getattr(obj, '__module__', '?')}."
        f"{getattr(obj, '__qualname__', getattr(obj, '__name__', type(obj).__name__))}"
    )
