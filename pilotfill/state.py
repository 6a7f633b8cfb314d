"""The journal's earlier name: ``from pilotfill.state import State`` is :class:`pilotfill.journal.Journal`."""

from .journal import *  # noqa: F403 — the same names, for code written against the earlier module
from .journal import Journal as State

__all__ = ["State"]
