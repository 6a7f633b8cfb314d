"""Durable state of a run: SQLite in WAL mode, written only by the controller.

Jobs (spec, status, progress, result), pilots, nodes and who holds them, the
processes the controller started (so a successor can make sure none
survives), and an append-only event log. A controller can be killed at any
moment: what was committed is what a new controller on the same run
directory starts from. Readers (``pilotfill top``, tests) may open the file
read-only at any time; WAL lets them read while the controller writes.
"""

from __future__ import annotations

import json
import sqlite3
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
    nodes TEXT NOT NULL DEFAULT '[]',
    result TEXT,
    error TEXT,
    submitted REAL NOT NULL,
    started REAL,
    ended REAL,
    rescales INTEGER NOT NULL DEFAULT 0,
    launches INTEGER NOT NULL DEFAULT 0
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
    controller INTEGER NOT NULL
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
"""

TERMINAL = ("finished", "failed", "cancelled")


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
    )


class State:
    """The run's database. One writer (the controller); ``readonly=True`` for everyone else."""

    def __init__(self, run_dir: Path, readonly: bool = False):
        self.path = Path(run_dir) / STATE_FILE
        if readonly:
            if not self.path.exists():
                raise FileNotFoundError(f"no pilotfill state at {self.path}")
            self.db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=10, isolation_level=None)
        else:
            self.db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.executescript(SCHEMA)
            self.path.chmod(0o600)
        self.db.row_factory = sqlite3.Row

    def close(self) -> None:
        self.db.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """All writes of one controller step commit together, or not at all (nested: joins the outer one)."""
        if self.db.in_transaction:
            yield self.db
            return
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    # ---------------------------------------------------------------- meta

    def get_meta(self, key: str, default: str | None = None) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row["value"] if row else default

    def set_meta(self, key: str, value: str) -> None:
        self.db.execute("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value", (key, value))

    def next_incarnation(self) -> int:
        """Number this controller: 1 for the first on the run directory, then 2, 3, …"""
        n = int(self.get_meta("incarnation", "0")) + 1
        self.set_meta("incarnation", str(n))
        return n

    # ---------------------------------------------------------------- events

    def log(self, kind: str, job: str | None = None, pilot: str | None = None, node: str | None = None, now: float | None = None, **data: Any) -> None:
        self.db.execute(
            "INSERT INTO events (time, kind, job, pilot, node, data) VALUES (?, ?, ?, ?, ?, ?)",
            (time.time() if now is None else now, kind, job, pilot, node, json.dumps(data, default=str)),
        )

    def events(self, kind: str | None = None, after: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
        sql = "SELECT * FROM events WHERE seq > ?" + (" AND kind = ?" if kind else "") + " ORDER BY seq"
        args: tuple = (after, kind) if kind else (after,)
        if limit is not None:
            sql = f"SELECT * FROM ({sql.replace('ORDER BY seq', 'ORDER BY seq DESC')} LIMIT {int(limit)}) ORDER BY seq"
        return [{**dict(r), "data": json.loads(r["data"])} for r in self.db.execute(sql, args)]

    # ---------------------------------------------------------------- jobs

    def add_job(self, job_id: str, name: str, spec: dict[str, Any], now: float) -> None:
        seq = self.db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM jobs").fetchone()[0]
        self.db.execute(
            "INSERT INTO jobs (id, seq, name, spec, status, submitted) VALUES (?, ?, ?, ?, 'pending', ?)",
            (job_id, seq, name, json.dumps(spec), now),
        )

    def job(self, job_id: str) -> JobRow | None:
        row = self.db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return _job(row) if row else None

    def jobs(self, status: tuple[str, ...] | None = None) -> list[JobRow]:
        if status:
            marks = ",".join("?" * len(status))
            rows = self.db.execute(f"SELECT * FROM jobs WHERE status IN ({marks}) ORDER BY seq", status)
        else:
            rows = self.db.execute("SELECT * FROM jobs ORDER BY seq")
        return [_job(r) for r in rows]

    def add_progress(self, job_id: str, samples: float) -> float:
        """Add reported samples (never negative); return the job's total."""
        self.db.execute("UPDATE jobs SET progress = progress + ? WHERE id = ?", (max(0.0, samples), job_id))
        return self.db.execute("SELECT progress FROM jobs WHERE id = ?", (job_id,)).fetchone()[0]

    def set_job(self, job_id: str, **fields: Any) -> None:
        for key in ("nodes", "result"):
            if key in fields:
                fields[key] = json.dumps(fields[key])
        cols = ", ".join(f"{k} = ?" for k in fields)
        self.db.execute(f"UPDATE jobs SET {cols} WHERE id = ?", (*fields.values(), job_id))

    # ---------------------------------------------------------------- pilots and nodes

    def upsert_pilot(self, pilot_id: str, **fields: Any) -> None:
        if "nodes" in fields:
            fields["nodes"] = json.dumps(fields["nodes"])
        self._upsert("pilots", "id", pilot_id, fields)

    def _upsert(self, table: str, key: str, value: str, fields: dict[str, Any]) -> None:
        """Update the row whose ``key`` is ``value``, or insert it (table and columns are ours, never user input)."""
        if self.db.execute(f"SELECT 1 FROM {table} WHERE {key} = ?", (value,)).fetchone():
            cols = ", ".join(f"{k} = ?" for k in fields)
            self.db.execute(f"UPDATE {table} SET {cols} WHERE {key} = ?", (*fields.values(), value))
        else:
            cols = ", ".join([key, *fields])
            self.db.execute(f"INSERT INTO {table} ({cols}) VALUES ({','.join('?' * (len(fields) + 1))})", (value, *fields.values()))

    def pilots(self, states: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
        rows = self.db.execute("SELECT * FROM pilots ORDER BY submitted")
        out = [{**dict(r), "nodes": json.loads(r["nodes"])} for r in rows]
        return [p for p in out if states is None or p["state"] in states]

    def set_node(self, name: str, **fields: Any) -> None:
        self._upsert("nodes", "name", name, fields)

    def nodes(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self.db.execute("SELECT * FROM nodes ORDER BY name")]

    # ---------------------------------------------------------------- processes

    def add_process(self, pid: int, start_ticks: int, kind: str, controller: int, job: str | None = None, host: str | None = None) -> None:
        self.db.execute("INSERT OR REPLACE INTO processes VALUES (?, ?, ?, ?, ?, ?)", (pid, start_ticks, kind, job, host, controller))

    def drop_process(self, pid: int) -> None:
        self.db.execute("DELETE FROM processes WHERE pid = ?", (pid,))

    def processes(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self.db.execute("SELECT * FROM processes")]
