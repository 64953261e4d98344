"""The persisted job queue: one SQLite database (WAL) driven from one dedicated thread.

Jobs and their chunk plans live in two tables. A job's chunks are planned once and stored; each decoded
batch of chunks is saved in one transaction together with the job's progress, and a chunk that already has
its segments is never overwritten. So a job interrupted by a crash resumes at its first undecoded chunk, and
its result (the chunks' segments in chunk order) holds every segment exactly once.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from models.stt.batch import AudioChunk, FileSegment

JobStatus = Literal["queued", "running", "completed", "failed", "cancelled"]
ACTIVE_STATUSES = ("queued", "running")
T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    status TEXT NOT NULL,
    created_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    filename TEXT NOT NULL,
    audio_path TEXT NOT NULL,
    model TEXT NOT NULL,
    language TEXT,
    prompt TEXT,
    duration REAL NOT NULL,
    detected_language TEXT,
    chunks_total INTEGER,
    chunks_done INTEGER NOT NULL DEFAULT 0,
    attempts INTEGER NOT NULL DEFAULT 0,
    error TEXT
);
CREATE INDEX IF NOT EXISTS jobs_by_status ON jobs (status, seq);
CREATE TABLE IF NOT EXISTS chunks (
    job_id TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    idx INTEGER NOT NULL,
    start REAL NOT NULL,
    "end" REAL NOT NULL,
    segments TEXT,  -- JSON list of FileSegment; NULL until decoded
    PRIMARY KEY (job_id, idx)
);
"""


# a job's row and the audio seconds its decoded chunks cover (its progress)
_JOB_COLUMNS = ("jobs.*, (SELECT coalesce(sum(c.\"end\" - c.start), 0) FROM chunks c"
                " WHERE c.job_id = jobs.id AND c.segments IS NOT NULL) AS audio_seconds_done")


@dataclass(frozen=True, slots=True)
class JobRecord:
    id: str
    status: JobStatus
    created_at: float
    started_at: float | None
    finished_at: float | None
    filename: str
    audio_path: str
    model: str
    language: str | None
    prompt: str | None
    duration: float
    detected_language: str | None
    chunks_total: int | None
    chunks_done: int
    attempts: int
    error: str | None
    audio_seconds_done: float = 0.0

    @property
    def active(self) -> bool:
        return self.status in ACTIVE_STATUSES


class JobStore:
    """Async facade over the SQLite file; every statement runs on the store's own thread, in order."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="vigil-jobs-db")
        self._conn: sqlite3.Connection | None = None

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    # ------------------------------------------------------------------ lifecycle

    async def open(self) -> None:
        await self._call(self._open)

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30)
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: a power cut may lose the last step, never corrupt
        conn.execute("PRAGMA foreign_keys=ON")
        conn.executescript(_SCHEMA)
        self._conn = conn

    async def close(self) -> None:
        if self._conn is not None:
            await self._call(self._conn.close)
            self._conn = None
        await asyncio.to_thread(self._executor.shutdown, True)

    @property
    def conn(self) -> sqlite3.Connection:
        if self._conn is None:
            raise RuntimeError("job store is not open")
        return self._conn

    # ------------------------------------------------------------------ jobs

    async def insert(self, job: JobRecord, max_active: int | None = None) -> bool:
        """Store a new job; False (nothing stored) when ``max_active`` jobs are queued or running already.
        Counting and inserting are one transaction, so concurrent submissions never exceed the limit."""
        def run() -> bool:
            with _transaction(self.conn):
                if max_active is not None and self.conn.execute(
                        "SELECT count(*) FROM jobs WHERE status IN ('queued', 'running')").fetchone()[0] >= max_active:
                    return False
                self.conn.execute(
                    "INSERT INTO jobs (id, status, created_at, filename, audio_path, model, language, prompt,"
                    " duration) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (job.id, job.status, job.created_at, job.filename, job.audio_path, job.model, job.language,
                     job.prompt, job.duration),
                )
                return True
        return await self._call(run)

    async def count_active(self) -> int:
        def run() -> int:
            return self.conn.execute(
                "SELECT count(*) FROM jobs WHERE status IN ('queued', 'running')").fetchone()[0]
        return await self._call(run)

    async def requeue_running(self) -> int:
        """Jobs left 'running' by a process that stopped: queue them again (they resume where they were)."""
        def run() -> int:
            return self.conn.execute("UPDATE jobs SET status = 'queued' WHERE status = 'running'").rowcount
        return await self._call(run)

    async def release(self, job_ids: list[str]) -> int:
        """Jobs a stopping worker held: queued again, their attempt not counted. How many were still running."""
        def run() -> int:
            return self.conn.executemany(
                "UPDATE jobs SET status = 'queued', attempts = max(attempts - 1, 0) WHERE id = ?"
                " AND status = 'running'", [(job_id,) for job_id in job_ids]).rowcount
        return await self._call(run)

    async def claim_next(self, max_attempts: int) -> JobRecord | None:
        """The oldest queued job, marked running (atomic); jobs that used up their attempts are failed."""
        def run() -> JobRecord | None:
            conn = self.conn
            while True:
                with _transaction(conn):
                    row = conn.execute(
                        "SELECT id, attempts FROM jobs WHERE status = 'queued' ORDER BY seq LIMIT 1").fetchone()
                    if row is None:
                        return None
                    now = time.time()
                    if row["attempts"] >= max_attempts:
                        conn.execute(
                            "UPDATE jobs SET status = 'failed', finished_at = ?, error = ? WHERE id = ?",
                            (now, f"gave up after {row['attempts']} attempts (the server stopped during each)",
                             row["id"]),
                        )
                        continue
                    conn.execute(
                        "UPDATE jobs SET status = 'running', attempts = attempts + 1,"
                        " started_at = coalesce(started_at, ?) WHERE id = ?",
                        (now, row["id"]),
                    )
                    return self._get(row["id"])
        return await self._call(run)

    async def get(self, job_id: str) -> JobRecord | None:
        return await self._call(self._get, job_id)

    def _get(self, job_id: str) -> JobRecord | None:
        row = self.conn.execute(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return _record(row) if row is not None else None

    async def list(self, status: str | None = None, limit: int = 100) -> list[JobRecord]:
        def run() -> list[JobRecord]:
            where, params = ("WHERE status = ?", [status]) if status else ("", [])
            rows = self.conn.execute(
                f"SELECT {_JOB_COLUMNS} FROM jobs {where} ORDER BY seq DESC LIMIT ?",
                (*params, limit)).fetchall()
            return [_record(row) for row in rows]
        return await self._call(run)

    async def finish(self, job_id: str, status: JobStatus, error: str | None = None) -> bool:
        """Mark a running job finished; False if it was not running any more (cancelled or deleted)."""
        def run() -> bool:
            return self.conn.execute(
                "UPDATE jobs SET status = ?, finished_at = ?, error = ? WHERE id = ? AND status = 'running'",
                (status, time.time(), error, job_id)).rowcount == 1
        return await self._call(run)

    async def cancel(self, job_id: str) -> JobRecord | None:
        """Cancel a queued or running job (a running one stops after its current step)."""
        def run() -> JobRecord | None:
            self.conn.execute(
                "UPDATE jobs SET status = 'cancelled', finished_at = ? WHERE id = ?"
                " AND status IN ('queued', 'running')", (time.time(), job_id))
            return self._get(job_id)
        return await self._call(run)

    async def delete(self, job_id: str) -> JobRecord | None:
        def run() -> JobRecord | None:
            with _transaction(self.conn):
                job = self._get(job_id)
                if job is not None:
                    self.conn.execute("DELETE FROM jobs WHERE id = ?", (job_id,))
                return job
        return await self._call(run)

    async def active_ids(self) -> set[str]:
        def run() -> set[str]:
            return {row[0] for row in self.conn.execute(
                "SELECT id FROM jobs WHERE status IN ('queued', 'running')")}
        return await self._call(run)

    # ------------------------------------------------------------------ chunks

    async def stored_plan(self, job_id: str) -> list[AudioChunk]:
        """The job's chunk plan as stored (empty if not planned yet)."""
        return await self._call(self._stored_plan, job_id)

    async def set_plan(self, job_id: str, chunks: list[AudioChunk]) -> list[AudioChunk] | None:
        """Store the job's chunk plan, unless one is stored already (then that one is kept and returned).
        None (nothing stored) if the job is no longer running (cancelled or deleted)."""
        def run() -> list[AudioChunk] | None:
            with _transaction(self.conn):
                row = self.conn.execute("SELECT status FROM jobs WHERE id = ?", (job_id,)).fetchone()
                if row is None or row["status"] != "running":
                    return None
                if existing := self._stored_plan(job_id):
                    return existing
                self.conn.executemany(
                    'INSERT INTO chunks (job_id, idx, start, "end") VALUES (?, ?, ?, ?)',
                    [(job_id, i, c.start, c.end) for i, c in enumerate(chunks)])
                self.conn.execute("UPDATE jobs SET chunks_total = ? WHERE id = ?", (len(chunks), job_id))
                return chunks
        return await self._call(run)

    def _stored_plan(self, job_id: str) -> list[AudioChunk]:
        rows = self.conn.execute('SELECT start, "end" FROM chunks WHERE job_id = ? ORDER BY idx', (job_id,))
        return [AudioChunk(row[0], row[1]) for row in rows]

    async def pending_chunks(self, job_id: str) -> list[tuple[int, AudioChunk]]:
        def run() -> list[tuple[int, AudioChunk]]:
            rows = self.conn.execute(
                'SELECT idx, start, "end" FROM chunks WHERE job_id = ? AND segments IS NULL ORDER BY idx',
                (job_id,))
            return [(row[0], AudioChunk(row[1], row[2])) for row in rows]
        return await self._call(run)

    async def save_chunks(self, job_id: str, results: dict[int, list[FileSegment]], language: str) -> bool:
        """Store decoded chunks and the job's progress in one transaction. A chunk already decoded keeps its
        first result. False (nothing stored) if the job is no longer running (cancelled or deleted)."""
        def run() -> bool:
            conn = self.conn
            with _transaction(conn):
                row = conn.execute("SELECT status FROM jobs WHERE id = ?", (job_id,)).fetchone()
                if row is None or row["status"] != "running":
                    return False
                conn.executemany(
                    "UPDATE chunks SET segments = ? WHERE job_id = ? AND idx = ? AND segments IS NULL",
                    [(json.dumps([s.to_dict() for s in segments]), job_id, idx)
                     for idx, segments in results.items()])
                conn.execute(
                    "UPDATE jobs SET detected_language = ?, chunks_done = (SELECT count(*) FROM chunks"
                    " WHERE job_id = ? AND segments IS NOT NULL) WHERE id = ?", (language, job_id, job_id))
                return True
        return await self._call(run)

    async def segments(self, job_id: str) -> list[FileSegment]:
        """The job's decoded segments, in chunk order (each chunk once)."""
        def run() -> list[FileSegment]:
            rows = self.conn.execute(
                "SELECT segments FROM chunks WHERE job_id = ? AND segments IS NOT NULL ORDER BY idx", (job_id,))
            return [FileSegment.from_dict(item) for row in rows for item in json.loads(row[0])]
        return await self._call(run)


class _transaction:
    """BEGIN IMMEDIATE ... COMMIT (ROLLBACK on error) on an autocommit connection."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> sqlite3.Connection:
        self.conn.execute("BEGIN IMMEDIATE")
        return self.conn

    def __exit__(self, exc_type: object, *_: object) -> None:
        self.conn.execute("ROLLBACK" if exc_type is not None else "COMMIT")


def _record(row: sqlite3.Row) -> JobRecord:
    data = dict(row)
    data.pop("seq", None)
    return JobRecord(**data)
