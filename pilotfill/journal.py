"""The durable journal of a run: SQLite in WAL mode, written only by the controller.

The controller's working state lives in memory (:mod:`pilotfill.controller.world`);
this is where every change to it is written, and committed before the
controller replies, so that a controller killed at any moment loses nothing it
answered. On the hot path it is only ever written, by key, never read back
whole; it is read whole only by a controller recovering on the same run
directory and by readers (``pilotfill top`` without a live controller, tests),
which open it read-only while the controller writes (WAL allows that).

Ended pilots and old events are pruned (:meth:`Journal.prune`) so that the
working set stays bounded over a long run; counts that matter (pilots
submitted, nodes released, …) are kept as counters in ``meta``.

Inside a transaction, writes to a row are gathered and written once, when the
transaction commits: a preemption of two thousand nodes changes one big job's
node list two thousand times, and the journal writes it once, with every
event of the burst in one ``executemany``. What is committed is exactly what
was written; a reader inside the transaction sees it first.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import sqlite3
import struct
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STATE_FILE = "state.sqlite"

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    name TEXT NOT NULL,
    spec TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('pending', 'running', 'finished', 'failed', 'cancelled')),
    progress REAL NOT NULL DEFAULT 0,
    committed REAL NOT NULL DEFAULT 0,
    redone REAL NOT NULL DEFAULT 0,
    overran INTEGER NOT NULL DEFAULT 0,
    nodes TEXT NOT NULL DEFAULT '[]',
    result TEXT,
    error TEXT,
    submitted REAL NOT NULL,
    started REAL,
    ended REAL,
    rescales INTEGER NOT NULL DEFAULT 0,
    launches INTEGER NOT NULL DEFAULT 0,
    crashes INTEGER NOT NULL DEFAULT 0,
    key TEXT,
    held INTEGER NOT NULL DEFAULT 0,
    request TEXT
);
CREATE TABLE IF NOT EXISTS pilots (
    id TEXT PRIMARY KEY,
    scheduler_id TEXT,
    state TEXT NOT NULL CHECK (state IN ('queued', 'running', 'leaving', 'ended', 'lost')),
    nodes TEXT NOT NULL DEFAULT '[]',
    pid INTEGER,
    submitted REAL NOT NULL,
    last_heartbeat REAL,
    walltime_end REAL,
    ended REAL,
    controller INTEGER NOT NULL,
    requested INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS nodes (
    name TEXT PRIMARY KEY,
    pilot TEXT,
    state TEXT NOT NULL CHECK (state IN ('ready', 'leaving', 'gone')),
    job TEXT,
    since REAL NOT NULL,
    deadline REAL
);
CREATE TABLE IF NOT EXISTS processes (
    pid INTEGER NOT NULL,
    start_ticks INTEGER NOT NULL,
    kind TEXT NOT NULL,
    job TEXT,
    host TEXT,
    controller INTEGER NOT NULL,
    PRIMARY KEY (pid, start_ticks)
);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    time REAL NOT NULL,
    kind TEXT NOT NULL,
    job TEXT,
    pilot TEXT,
    node TEXT,
    data TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS events_kind ON events (kind);
CREATE INDEX IF NOT EXISTS pilots_state ON pilots (state);
CREATE INDEX IF NOT EXISTS jobs_key ON jobs (key);
"""

INDEXES_ADDED = "CREATE INDEX IF NOT EXISTS jobs_request ON jobs (request);"
"""Indexes on added columns: created after the columns exist."""

COLUMNS_ADDED = {
    "jobs": {
        "crashes": "INTEGER NOT NULL DEFAULT 0",
        "key": "TEXT",
        "held": "INTEGER NOT NULL DEFAULT 0",
        "committed": "REAL NOT NULL DEFAULT 0",
        "redone": "REAL NOT NULL DEFAULT 0",
        "overran": "INTEGER NOT NULL DEFAULT 0",
        "request": "TEXT",
    },
    "pilots": {"requested": "INTEGER NOT NULL DEFAULT 0", "node_type": "TEXT"},
    "nodes": {"node_type": "TEXT"},
}
"""Columns newer than the first schema: added in place to a run directory an older pilotfill made."""


class JournalError(RuntimeError):
    """The journal cannot be written (disk full, read-only, I/O error): the controller must stop."""


FS_IOC_GETFLAGS = 0x80086601
FS_IMMUTABLE_FL, FS_APPEND_FL = 0x10, 0x20


def unwritable(path: Path) -> str | None:
    """Why ``path`` (an existing file or directory) cannot be written, in words; None when it can.

    Asked before SQLite maps the journal's ``-shm`` file: writing to a mapped
    file that has become immutable kills the process with SIGBUS, and SQLite
    opens an immutable file read-only without saying why. So the reason —
    immutable or append-only (``chattr``), a read-only filesystem, no
    permission — is found here and named with the file.
    """
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{path}: cannot be opened: {exc.strerror}"
    try:
        try:
            flags = struct.unpack("i", fcntl.ioctl(fd, FS_IOC_GETFLAGS, b"\0" * 4))[0]
        except OSError:  # a filesystem without inode flags
            flags = 0
    finally:
        os.close(fd)
    if flags & FS_IMMUTABLE_FL:
        return f"{path} is immutable (chattr +i): nothing in it can change; `chattr -i {path}` lifts it"
    if flags & FS_APPEND_FL:
        return f"{path} is append-only (chattr +a): SQLite must rewrite it; `chattr -a {path}` lifts it"
    if path.is_dir():
        probe = path / f".pilotfill-probe-{os.getpid()}"
        try:
            os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            os.unlink(probe)
        except OSError as exc:
            return _why(path, exc)
        return None
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK))
    except OSError as exc:
        return _why(path, exc)
    return None


def _why(path: Path, exc: OSError) -> str:
    if exc.errno == errno.EROFS:
        return f"{path} is on a read-only filesystem"
    return f"{path} cannot be written: {exc.strerror}"


def journal_unwritable(run_dir: Path) -> str | None:
    """Why the first file of the journal (or its directory) that cannot be written cannot be; None when all can."""
    run_dir = Path(run_dir)
    for path in (run_dir, *(run_dir / f"{STATE_FILE}{suffix}" for suffix in ("", "-wal", "-shm"))):
        why = unwritable(path)
        if why is not None:
            return why
    return None


def check_journal_writable(run_dir: Path) -> None:
    """Raise :class:`JournalError` naming the first file of the journal (or its directory) that cannot be written."""
    why = journal_unwritable(run_dir)
    if why is not None:
        raise JournalError(why)


@dataclass(frozen=True)
class JobRow:
    id: str
    seq: int
    name: str
    spec: dict[str, Any]
    status: str
    progress: float
    nodes: list[str]
    result: Any
    error: str | None
    submitted: float
    started: float | None
    ended: float | None
    rescales: int
    launches: int
    crashes: int = 0
    key: str | None = None
    held: bool = False
    committed: float = 0.0  # progress at the job's last commit: what a stop falls back to
    redone: float = 0.0  # samples counted and then lost to stops (the work done again)
    overran: bool = False  # its counted progress passed its declared total_samples


def _job(row: sqlite3.Row) -> JobRow:
    return JobRow(
        id=row["id"],
        seq=row["seq"],
        name=row["name"],
        spec=json.loads(row["spec"]),
        status=row["status"],
        progress=row["progress"],
        nodes=json.loads(row["nodes"]),
        result=json.loads(row["result"]) if row["result"] is not None else None,
        error=row["error"],
        submitted=row["submitted"],
        started=row["started"],
        ended=row["ended"],
        rescales=row["rescales"],
        launches=row["launches"],
        crashes=row["crashes"],
        key=row["key"],
        held=bool(row["held"]),
        committed=row["committed"],
        redone=row["redone"],
        overran=bool(row["overran"]),
    )


_ENCODE = json.JSONEncoder(default=str).encode
"""One encoder for every event (``json.dumps`` with an option builds a new one per call)."""
UPSERTED = {"pilots": "id", "nodes": "name"}
"""Tables whose rows are written by key, inserted when new (the journal knows which keys it holds)."""
ENCODED = {"jobs": ("nodes", "result", "spec"), "pilots": ("nodes",)}
"""Columns kept as JSON text."""


class Journal:
    """The run's database. One writer (the controller); ``readonly=True`` for everyone else."""

    def __init__(self, run_dir: Path, readonly: bool = False):
        self.path = Path(run_dir) / STATE_FILE
        self._began = False
        self._depth = 0
        # (table, key) -> (a new row?, fields): this transaction's row writes
        self._rows: dict[tuple[str, str], tuple[bool, dict[str, Any]]] = {}
        self._events: list[tuple] = []  # this transaction's events, in order
        self._meta: dict[str, str] = {}
        self._keys: dict[str, set[str]] = {}  # table -> the keys it holds (loaded when first written)
        try:
            if readonly:
                if not self.path.is_file():
                    raise FileNotFoundError(f"no pilotfill state at {self.path}")
                self.db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=10, isolation_level=None)
                if (
                    self.db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'jobs'").fetchone()
                    is None
                ):
                    self.db.close()  # the controller has created the file, not yet its tables: as good as no state yet
                    raise FileNotFoundError(f"no pilotfill state at {self.path} yet")
            else:
                check_journal_writable(self.path.parent)
                # One writer at a time (the controller), but not always on the thread that opened it.
                self.db = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
                self.db.execute("PRAGMA journal_mode=WAL")
                self.db.execute("PRAGMA synchronous=NORMAL")
                self.db.executescript(SCHEMA)
                self._add_missing_columns()
                self.db.executescript(INDEXES_ADDED)
                if self.path.stat().st_mode & 0o077:
                    self.path.chmod(0o600)
            self.db.row_factory = sqlite3.Row
        except sqlite3.DatabaseError as exc:
            raise JournalError(f"{self.path}: cannot open the run's state: {exc}") from None

    def _add_missing_columns(self) -> None:
        for table, columns in COLUMNS_ADDED.items():
            have = {r[1] for r in self.db.execute(f"PRAGMA table_info({table})")}
            for name, decl in columns.items():
                if name not in have:
                    self.db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {decl}")

    def close(self) -> None:
        self.db.close()

    # ---------------------------------------------------------------- transactions

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """Writes inside commit together when the outermost block ends (nested blocks join it).

        The transaction begins at the first write, so a block that writes
        nothing (a heartbeat) costs no commit. An exception commits what was
        written: the controller changes its memory only after the journal, so
        the two agree even when a handler fails half-way. A journal that cannot
        be written raises :class:`JournalError`.
        """
        self._depth += 1
        try:
            yield self.db
        finally:
            try:
                if self._depth == 1:
                    self._flush()  # inside the transaction: what was gathered commits with it
            finally:
                self._depth -= 1
            if self._depth == 0 and self._began:
                self._began = False
                try:
                    self.db.execute("COMMIT")
                except sqlite3.Error as exc:
                    self._rollback()
                    raise JournalError(self._failed("commit", exc)) from None

    def _write(self, sql: str, args: tuple | list = (), many: bool = False) -> sqlite3.Cursor:
        try:
            if self._depth > 0 and not self._began:
                self.db.execute("BEGIN IMMEDIATE")
                self._began = True
            return self.db.executemany(sql, args) if many else self.db.execute(sql, args)
        except sqlite3.Error as exc:
            if self._began:
                self._began = False
                self._rollback()
            raise JournalError(self._failed("write", exc)) from None

    def _failed(self, what: str, exc: sqlite3.Error) -> str:
        """Why a write or commit failed, naming the file: SQLite says only "disk I/O error" or "readonly database"
        when a journal file became immutable or its filesystem read-only, so the files are asked."""
        return journal_unwritable(self.path.parent) or f"{self.path}: cannot {what}: {exc}"

    def _rollback(self) -> None:
        self._rows.clear()
        self._events.clear()
        self._meta.clear()
        self._keys.clear()  # what the table holds is read again
        with contextlib.suppress(sqlite3.Error):  # SQLite already rolled back on the error: nothing left to undo
            self.db.execute("ROLLBACK")

    # ---------------------------------------------------------------- gathered writes

    def _set_row(self, table: str, key: str, fields: dict[str, Any], new: bool = False) -> None:
        """Write ``fields`` of one row: gathered until the transaction commits (at once outside one)."""
        if not fields and not new:
            return
        was = self._rows.get((table, key))
        if was is None:
            self._rows[(table, key)] = (new, dict(fields))
        else:
            was[1].update(fields)
        if self._depth == 0:
            self._flush()

    def _flush(self) -> None:
        """Write what this transaction gathered: per table and set of columns, one ``executemany``."""
        try:
            if self._rows:
                rows, self._rows = self._rows, {}
                groups: dict[tuple[str, bool, tuple[str, ...]], list[tuple]] = {}
                for (table, key), (new, fields) in rows.items():
                    keyed = UPSERTED.get(table)
                    if keyed is not None and not new:
                        new = key not in self._known(table)
                    if new and keyed is not None:
                        self._known(table).add(key)
                    encoded = ENCODED.get(table, ())
                    values = tuple(json.dumps(v) if k in encoded else v for k, v in fields.items())
                    groups.setdefault((table, new, tuple(fields)), []).append((key, *values) if new else (*values, key))
                for (table, new, cols), args in groups.items():
                    key = UPSERTED.get(table, "id")
                    if new:
                        names = ", ".join((key, *cols))
                        self._write(
                            f"INSERT INTO {table} ({names}) VALUES ({','.join('?' * (len(cols) + 1))})", args, many=True
                        )
                    else:
                        sets = ", ".join(f"{c} = ?" for c in cols)
                        self._write(f"UPDATE {table} SET {sets} WHERE {key} = ?", args, many=True)
            if self._events:
                events, self._events = self._events, []
                self._write(
                    "INSERT INTO events (time, kind, job, pilot, node, data) VALUES (?, ?, ?, ?, ?, ?)",
                    events,
                    many=True,
                )
            if self._meta:
                meta, self._meta = self._meta, {}
                self._write(
                    "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                    list(meta.items()),
                    many=True,
                )
        except BaseException:  # nothing of this transaction is half-written: it is rolled back whole
            if self._began:
                self._began = False
            self._rollback()
            raise

    def _known(self, table: str) -> set[str]:
        """The keys ``table`` holds (one read, then kept as rows are written and deleted)."""
        keys = self._keys.get(table)
        if keys is None:
            keys = self._keys[table] = {r[0] for r in self.db.execute(f"SELECT {UPSERTED[table]} FROM {table}")}
        return keys

    def _read(self, sql: str, args: tuple | list = ()) -> sqlite3.Cursor:
        """A read sees what this transaction wrote so far."""
        self._flush()
        return self.db.execute(sql, args)

    # ---------------------------------------------------------------- meta and counters

    def get_meta(self, key: str, default: str | None = None) -> str | None:
        row = self._read("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row["value"] if row else default

    def set_meta(self, key: str, value: str) -> None:
        self._meta[key] = value
        if self._depth == 0:
            self._flush()

    def next_incarnation(self) -> int:
        """Number this controller: 1 for the first on the run directory, then 2, 3, …"""
        n = int(self.get_meta("incarnation", "0")) + 1
        self.set_meta("incarnation", str(n))
        return n

    def counters(self) -> dict[str, int]:
        return {
            r["key"][len("counter.") :]: int(r["value"])
            for r in self._read("SELECT key, value FROM meta WHERE key LIKE 'counter.%'")
        }

    def set_counter(self, name: str, value: int) -> None:
        self.set_meta(f"counter.{name}", str(int(value)))

    # ---------------------------------------------------------------- events

    def log(
        self,
        kind: str,
        job: str | None = None,
        pilot: str | None = None,
        node: str | None = None,
        now: float | None = None,
        **data: Any,
    ) -> None:
        self._events.append((time.time() if now is None else now, kind, job, pilot, node, _ENCODE(data)))
        if self._depth == 0:
            self._flush()

    def events(self, kind: str | None = None, after: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
        sql = "SELECT * FROM events WHERE seq > ?" + (" AND kind = ?" if kind else "")
        args: tuple = (after, kind) if kind else (after,)
        if limit is not None:
            sql = f"SELECT * FROM ({sql} ORDER BY seq DESC LIMIT {int(limit)}) ORDER BY seq"
        else:
            sql += " ORDER BY seq"
        return [{**dict(r), "data": json.loads(r["data"])} for r in self._read(sql, args)]

    # ---------------------------------------------------------------- jobs

    def add_job(
        self, job_id: str, seq: int, name: str, spec: dict[str, Any], now: float, key: str | None = None
    ) -> None:
        self._set_row(
            "jobs",
            job_id,
            {"seq": seq, "name": name, "spec": spec, "status": "pending", "submitted": now, "key": key},
            new=True,
        )

    def job_by_request(self, request: str) -> str | None:
        """The job a ``job.submit`` with this request id created, in any incarnation (so a client's retry across a
        controller restart is answered with it, not applied again)."""
        row = self._read("SELECT id FROM jobs WHERE request = ?", (request,)).fetchone()
        return row["id"] if row else None

    def job(self, job_id: str) -> JobRow | None:
        row = self._read("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return _job(row) if row else None

    def jobs(self, status: tuple[str, ...] | None = None) -> list[JobRow]:
        if status:
            marks = ",".join("?" * len(status))
            rows = self._read(f"SELECT * FROM jobs WHERE status IN ({marks}) ORDER BY seq", status)
        else:
            rows = self._read("SELECT * FROM jobs ORDER BY seq")
        return [_job(r) for r in rows]

    def max_job_seq(self) -> int:
        return int(self._read("SELECT COALESCE(MAX(seq), 0) FROM jobs").fetchone()[0])

    def set_job(self, job_id: str, **fields: Any) -> None:
        """Change a job's columns (a JSON column's value is encoded when the transaction is written)."""
        if "spec" in fields or "result" in fields:
            # what cannot be stored fails here, not at the commit
            json.dumps({k: fields[k] for k in ("spec", "result") if k in fields})
        self._set_row("jobs", job_id, fields)

    # ---------------------------------------------------------------- pilots and nodes

    def upsert_pilot(self, pilot_id: str, **fields: Any) -> None:
        """Change a pilot's columns, inserting it when new (a new pilot's first write gives every column it needs)."""
        if "nodes" in fields:
            fields["nodes"] = list(fields["nodes"])
        self._set_row("pilots", pilot_id, fields)

    def set_node(self, name: str, **fields: Any) -> None:
        """Change a node's columns, inserting it when new (its first write gives every column it needs)."""
        self._set_row("nodes", name, fields)

    def pilots(self, states: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
        if states:
            rows = self._read(
                f"SELECT * FROM pilots WHERE state IN ({','.join('?' * len(states))}) ORDER BY submitted", states
            )
        else:
            rows = self._read("SELECT * FROM pilots ORDER BY submitted")
        return [{**dict(r), "nodes": json.loads(r["nodes"])} for r in rows]

    def nodes(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self._read("SELECT * FROM nodes ORDER BY name")]

    # ---------------------------------------------------------------- processes

    def add_process(
        self, pid: int, start_ticks: int, kind: str, controller: int, job: str | None = None, host: str | None = None
    ) -> None:
        self._write(
            "INSERT OR REPLACE INTO processes VALUES (?, ?, ?, ?, ?, ?)",
            (pid, start_ticks, kind, job, host, controller),
        )

    def drop_process(self, pid: int) -> None:
        self._write("DELETE FROM processes WHERE pid = ?", (pid,))

    def clear_processes(self) -> None:
        self._write("DELETE FROM processes")

    def processes(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self._read("SELECT * FROM processes")]

    # ---------------------------------------------------------------- bounded size

    def prune_events(self, keep: int) -> int:
        """Drop all but the newest ``keep`` events (by key: cheap however long the run)."""
        self._flush()
        return self._write("DELETE FROM events WHERE seq <= (SELECT MAX(seq) FROM events) - ?", (keep,)).rowcount

    def delete_pilots(self, ids: list[str]) -> None:
        """Forget ended pilots (the oldest, chosen by the controller)."""
        self._flush()
        self._keys.pop("pilots", None)  # read again when next needed
        for i in range(0, len(ids), 500):
            batch = ids[i : i + 500]
            self._write(
                f"DELETE FROM pilots WHERE id IN ({','.join('?' * len(batch))}) AND state IN ('ended', 'lost')", batch
            )

    def prune_ended_pilots(self, keep: int) -> int:
        """Drop all but the newest ``keep`` ended pilots (a full scan: at start-up, not on the hot path)."""
        self._flush()
        self._keys.pop("pilots", None)
        return self._write(
            "DELETE FROM pilots WHERE state IN ('ended', 'lost') AND id NOT IN "
            "(SELECT id FROM pilots WHERE state IN ('ended', 'lost') ORDER BY ended DESC LIMIT ?)",
            (keep,),
        ).rowcount
