"""What the user should know now while nothing has failed for good: said on the progress line and in ``pilotfill top``.

A campaign that waits says why: the batch system does not answer, it has no idle node to give, it refused a pilot,
a job keeps losing its work to its pilots' walltime. Each is a notice kept under a key until what it says stops
being true (the next successful call, a submission that goes through, a commit), and journaled on every change so a
view with no controller running shows it too. A notice is ``failing`` (something does not work) or ``waiting``
(nothing is wrong: the machine is full), and the line says which.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Any, Literal

from ..journal import Journal

META_KEY = "notices"

Level = Literal["failing", "waiting"]


@dataclass(frozen=True)
class Notice:
    key: str
    text: str
    level: Level
    at: float
    retry_at: float | None = None


class Notices:
    """The notices in force, by key; journaled (``meta.notices``) whenever one is said, changed or cleared."""

    def __init__(self, journal: Journal):
        self.journal = journal
        self._current: dict[str, Notice] = {}
        for item in _decode(journal.get_meta(META_KEY)):
            self._current[item["key"]] = Notice(**item)

    def say(self, key: str, text: str, now: float, level: Level = "failing", retry_at: float | None = None) -> None:
        old = self._current.get(key)
        if old is not None and (old.text, old.level, old.retry_at) == (text, level, retry_at):
            return
        self._current[key] = Notice(key, text, level, old.at if old is not None and old.text == text else now, retry_at)
        self._journal()

    def clear(self, key: str) -> None:
        if self._current.pop(key, None) is not None:
            self._journal()

    def clear_prefix(self, prefix: str) -> None:
        gone = [k for k in self._current if k.startswith(prefix)]
        for key in gone:
            del self._current[key]
        if gone:
            self._journal()

    def get(self, key: str) -> Notice | None:
        return self._current.get(key)

    def as_list(self) -> list[dict[str, Any]]:
        """Failing ones first, then by when they were first said."""
        return [asdict(n) for n in sorted(self._current.values(), key=lambda n: (n.level != "failing", n.at))]

    def _journal(self) -> None:
        self.journal.set_meta(META_KEY, json.dumps(self.as_list()))


def _decode(text: str | None) -> list[dict[str, Any]]:
    try:
        items = json.loads(text or "[]")
    except ValueError:
        return []
    return ([i for i in items if isinstance(i, dict) and {"key", "text", "level", "at"} <= set(i)]
            if isinstance(items, list) else [])


def notice_line(notice: dict[str, Any] | None, now: float | None = None) -> str | None:
    """One line for a notice (a snapshot's ``notices`` entry): its text, and when it is asked again if it will be."""
    if not notice or not notice.get("text"):
        return None
    retry_at = notice.get("retry_at")
    if retry_at is None:
        return str(notice["text"])
    wait = float(retry_at) - (time.time() if now is None else now)
    return f"{notice['text']} · " + (f"next try in {wait:.0f} s" if wait >= 1 else "asking again now")

