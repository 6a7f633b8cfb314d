"""How an app's outcome travels from its rank to the campaign: in the message, or beside it in the run directory.

An app may return anything Parsl can serialize, of any size. A message to the controller is capped
(:data:`pilotfill.transport.MAX_MESSAGE_BYTES`: 256 MB, a peer that sends more is cut off), so a result of 300 MB sent
inline never arrived: the rank took the cut-off for a lost controller and the job ran again, for ever. An outcome up
to :data:`INLINE_BYTES` travels inline (base64 in the signed message, kept in the journal); a larger one is written by
the rank to ``RUN_DIR/results/`` (atomically, 0600: the run directory is the user's alone, as the journal is) and the
message carries its name, size and SHA-256, which the campaign checks when it reads it back. A result that cannot be
written fails the app with a line that says why.
"""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path
from typing import Any

INLINE_BYTES = 8 * 1024 * 1024
RESULTS_DIR = "results"


class ResultUnavailable(RuntimeError):
    """A result the rank wrote beside its message cannot be read back as it was written (missing, cut short,
    changed)."""


def is_packed(value: Any) -> bool:
    return isinstance(value, dict) and ("parsl" in value or "parsl_file" in value)


def pack(run_dir: Path | str, job_id: str, data: bytes) -> dict[str, Any]:
    """``data`` (Parsl-serialized) as a message field: inline, or written to the run directory when large. Raises
    ``OSError`` (naming the file) when it cannot be written."""
    if len(data) <= INLINE_BYTES:
        return {"parsl": base64.b64encode(data).decode()}
    digest = hashlib.sha256(data).hexdigest()
    folder = Path(run_dir) / RESULTS_DIR
    name = f"{job_id}.{digest[:16]}.parsl"
    tmp = folder / f".{name}.{os.getpid()}.tmp"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, folder / name)
    except OSError as exc:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise OSError(
            exc.errno, f"the result ({len(data) / 1e6:.0f} MB) cannot be written to {folder / name}: {exc.strerror}"
        ) from None
    return {"parsl_file": f"{RESULTS_DIR}/{name}", "bytes": len(data), "sha256": digest}


def unpack(run_dir: Path | str, value: dict[str, Any]) -> bytes:
    """The serialized outcome ``value`` carries (see :func:`pack`)."""
    if "parsl" in value:
        return base64.b64decode(value["parsl"])
    name = str(value.get("parsl_file", ""))
    path = Path(run_dir) / name
    if not name.startswith(f"{RESULTS_DIR}/") or "/" in name[len(RESULTS_DIR) + 1 :] or name.startswith("/"):
        raise ResultUnavailable(f"a result named {name!r}: not a file of {Path(run_dir) / RESULTS_DIR}")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ResultUnavailable(f"the result in {path} cannot be read: {exc.strerror}") from None
    if len(data) != value.get("bytes") or hashlib.sha256(data).hexdigest() != value.get("sha256"):
        raise ResultUnavailable(
            f"the result in {path} is not what its rank wrote ({len(data)} bytes; {value.get('bytes')} were written)"
        )
    return data
