"""Checkpoints that are safe to load: private, the user's own, and whole.

Parsl's app checkpoints (``runs/parsl/*/checkpoint/tasks.pkl``) and training
commits (``runs/checkpoints/*.pt``) are pickles: loading one runs code. So a
file is loaded only when it and every folder above it, up to the campaign's
``runs/``, belong to the user and nobody else can write them; anything else is
refused with an error naming the file. A Parsl checkpoint cut short (a kill or
a full disk mid-write) keeps the entries written before the cut: they are
salvaged and the file rewritten, so one damaged record costs at most the apps
after it, not every later run.

:class:`CampaignMemoizer` writes those checkpoints: Parsl's memoizer, except
that a result plain pickle cannot store is kept for the campaign (only its
checkpoint is skipped, and said) instead of raising inside Parsl's completion
callback, which left the app's future unresolved for ever; and each entry is
pickled whole before it is written, so a failure never leaves half an entry in
the file.
"""

from __future__ import annotations

import logging
import os
import pickle
import stat
import threading
from pathlib import Path
from typing import Any

from parsl.dataflow.memoization import BasicMemoizer, id_for_memo

log = logging.getLogger("pilotfill.checkpoints")


def checkpoint_path(job_id: str | None = None) -> Path | None:
    """Where the running job's commits go (None outside pilotfill): named by its app call
    (``PILOTFILL_CHECKPOINT``, from the controller), so that a re-run resumes them."""
    if job_id is None and os.environ.get("PILOTFILL_CHECKPOINT"):
        return Path(os.environ["PILOTFILL_CHECKPOINT"])
    run_dir = os.environ.get("PILOTFILL_RUN_DIR")
    job_id = job_id or os.environ.get("PILOTFILL_JOB_ID")
    if not run_dir or not job_id:
        return None
    return Path(run_dir) / "checkpoints" / f"{job_id}.pt"


class UnsafeCheckpoint(PermissionError):
    """A checkpoint someone else could have written: never loaded."""


def check_private(path: Path, root: Path) -> None:
    """Refuse ``path`` unless it and its folders up to ``root`` are the user's own and writable by nobody else."""
    path, root = Path(path), Path(root)
    uid = os.getuid()
    current = path
    while True:
        try:
            st = current.lstat()
        except FileNotFoundError:
            break
        if stat.S_ISLNK(st.st_mode):
            raise UnsafeCheckpoint(f"{current} is a symbolic link: refusing to load {path}")
        if st.st_uid != uid:
            raise UnsafeCheckpoint(
                f"{current} belongs to uid {st.st_uid}, not you (uid {uid}): refusing to load {path}; remove it"
            )
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise UnsafeCheckpoint(
                f"{current} is writable by others (mode {stat.S_IMODE(st.st_mode):o}): refusing to load {path}; remove "
                "it or chmod go-w"
            )
        if current == root or current.parent == current:
            break
        current = current.parent


def parsl_checkpoints(parsl_dir: Path, root: Path) -> list[str]:
    """Parsl run folders with a checkpoint to reuse: checked, and salvaged when cut short."""
    found = []
    for tasks in sorted(Path(parsl_dir).glob("*/checkpoint/tasks.pkl")):
        check_private(tasks, root)
        _salvage(tasks)
        found.append(str(tasks.parent))
    return found


def _salvage(tasks: Path) -> None:
    """Keep the whole entries of a checkpoint log; rewrite it (atomically) if its tail is damaged."""
    entries = []
    damaged = None
    with open(tasks, "rb") as f:
        while True:
            try:
                entry = pickle.load(f)
            except EOFError:
                break
            except Exception as exc:  # cut short, or garbage after the last whole entry
                damaged = exc
                break
            if isinstance(entry, dict) and "hash" in entry and entry.get("exception") is None and "result" in entry:
                entries.append(entry)
    if damaged is None:
        return
    log.warning("%s was damaged (%s): kept its %d whole entries", tasks, damaged, len(entries))
    tmp = tasks.with_name(f".{tasks.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        for entry in entries:
            pickle.dump(entry, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, tasks)


class CampaignMemoizer(BasicMemoizer):
    """Parsl's memoizer with a checkpoint entry written as each app finishes (Parsl's ``task_exit`` mode, in
    Parsl's own file format, read back by ``checkpoint_files``); a result that cannot be stored is kept in
    memory and listed in :attr:`unsaved` as ``(function name, args, kwargs, why)``.

    A function is identified by its code (:mod:`pilotfill.executors.identity`), so an edited app runs anew. What
    the summary tells the user: :attr:`reused`, the calls answered by an earlier result of the same code and
    arguments, and :attr:`changed`, calls that an earlier run made with other code (each entry also records its
    call without the code, for that)."""

    def __init__(self, checkpoint_files: list[str]):
        from .executors import identity  # noqa: F401 - functions are identified by their code from here on

        super().__init__(checkpoint_files=checkpoint_files, checkpoint_mode=None)  # the checkpoints are written here
        self.unsaved: list[tuple[str, tuple, dict, str]] = []
        self.reused: list[tuple[str, tuple, dict]] = []
        self.changed: list[tuple[str, tuple, dict]] = []
        # a call without its code -> the hashes (with the code) it finished with
        self._earlier: dict[str, set[str]] = {}
        self._write_lock = threading.Lock()

    def _load_checkpoints(self, checkpoint_dirs):
        table = super()._load_checkpoints(checkpoint_dirs)
        for folder in checkpoint_dirs:
            try:
                with open(os.path.join(folder, "tasks.pkl"), "rb") as f:
                    while True:
                        entry = pickle.load(f)
                        if isinstance(entry, dict) and entry.get("call"):
                            self._earlier.setdefault(entry["call"], set()).add(entry["hash"])
            except (EOFError, OSError, pickle.UnpicklingError):
                continue
        return table

    def check_memo(self, task: Any):
        found = super().check_memo(task)
        call = (str(task["func_name"]), tuple(task.get("args") or ()), _plain_kwargs(task))
        if found is not None:
            self.reused.append(call)
        elif task.get("hashsum") and self._earlier.get(_call_id(task), set()) - {task["hashsum"]}:
            self.changed.append(call)
        return found

    def update_memo_result(self, task: Any, r: Any) -> None:
        super().update_memo_result(task, r)
        hashsum = task.get("hashsum") if hasattr(task, "get") else None
        if not hashsum:
            return  # not a cached app: nothing to checkpoint
        try:
            entry = pickle.dumps({"hash": hashsum, "exception": None, "result": r, "call": _call_id(task)})
        except Exception as exc:  # noqa: BLE001 - anything pickle raises: the result stays, the checkpoint goes
            why = f"{type(exc).__name__}: {exc}"[:300]
            log.warning(
                "the result of %s cannot be checkpointed (%s): a re-run runs it again", task.get("func_name"), why
            )
            self.unsaved.append(
                (str(task.get("func_name")), tuple(task.get("args") or ()), dict(task.get("kwargs") or {}), why)
            )
            return
        try:
            self._append(entry)
        except OSError as exc:  # a full disk: the app's result stands; only a re-run loses it
            log.warning("cannot write a checkpoint for %s: %s", task.get("func_name"), exc)
            self.unsaved.append(
                (str(task.get("func_name")), tuple(task.get("args") or ()), dict(task.get("kwargs") or {}), str(exc))
            )

    def _append(self, entry: bytes) -> None:
        folder = Path(self.run_dir) / "checkpoint"
        with self._write_lock:
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(folder / "tasks.pkl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                view = memoryview(entry)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
            self.checkpointed_tasks += 1


def _plain_kwargs(task: Any) -> dict:
    return {k: v for k, v in (task.get("kwargs") or {}).items() if k not in (task.get("ignore_for_cache") or ())}


def _call_id(task: Any) -> str | None:
    """The call without its function's code (name and arguments): which earlier entries were the same call."""
    import hashlib

    try:
        ident = id_for_memo(_plain_kwargs(task)) + id_for_memo(task.get("args") or ())
    except Exception:
        return None
    return hashlib.md5(str(task["func_name"]).encode() + b"\0" + ident).hexdigest()
