"""Lazy name -> class tables (the batch systems', the runtimes'): naming the entries imports none of them."""

from __future__ import annotations

import importlib
from collections.abc import Mapping


def load(table: Mapping[str, str], name: str, what: str) -> type:
    """The class ``table[name]`` names as ``"module:Class"``, imported now; ``what`` names the table in the error."""
    try:
        where = table[name]
    except KeyError:
        raise ValueError(f"unknown {what} {name!r} (known: {', '.join(table)})") from None
    module, _, cls = where.partition(":")
    return getattr(importlib.import_module(module), cls)
