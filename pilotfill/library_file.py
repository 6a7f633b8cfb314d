"""The similarity library as a file: read, and written atomically, private to the user.

The library itself (:mod:`pilotfill.allocator.similarity`) is pure, as the
allocator is; its documents are read and written here, by the shell that owns
the paths (the controller's node types, ``pilotfill replay``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .allocator.similarity import Library, LibraryError


def read_library(path: str | Path) -> Library:
    """The library in a JSON file; a missing file is an empty library (the first campaign has measured nothing)."""
    path = Path(path).expanduser()
    if not path.exists():
        return Library()
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise LibraryError(f"{path}: cannot read it: {exc}") from None
    except json.JSONDecodeError as exc:
        raise LibraryError(f"{path}: not valid JSON: {exc}") from None
    return Library.from_document(doc, str(path))


def write_library(library: Library, path: str | Path) -> None:
    """Write atomically (write, fsync, rename): a campaign killed mid-write leaves the previous library whole."""
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(library.to_document(), f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


__all__ = ["read_library", "write_library"]
