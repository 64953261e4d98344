"""The persisted timeline: one SQLite database (WAL) under the data dir, written by one writer thread.

Producers (the media loops) only ``put_nowait`` into a bounded queue: a full queue drops the entry (counted) and
never blocks. The writer commits what is queued in one transaction per batch. Reads (REST) use their own
connection on a worker thread; WAL lets them run beside the writer. A write that fails (disk full, read-only
disk) is reported to the entry's ``on_failure`` callback; the media loops keep sending events live.

Clips and snapshots are files under ``clips/`` and ``snapshots/``, named by entry id; the table holds their
paths relative to the data dir. Retention deletes entries older than ``max_age_s`` and, while clips and
snapshots exceed ``quota_bytes``, the oldest clips first (their entries stay, without a clip). Several entries may
share one clip (an event during another's ``post_s``) or one snapshot (events on the same frame): a file goes when
the last entry that names it does. A file no entry names (its events were deleted while it was being written, or a
crash) is removed when its write commits, or by retention once it is ``ORPHAN_AGE_S`` old.

After a crash (SIGKILL, power cut) ``open`` settles every clip left ``pending``: no recorder of this process can
finish it. A clip file that was fully written (its rename to ``.mp4``, or its entry's update, never happened) is
kept when it decodes, and its entries become ``ready``; any other pending clip becomes ``failed`` with the reason
in ``clip_error`` (a clip is muxed in one go once its ``post_s`` has passed, so a crash usually leaves nothing).

``forget_identity`` takes a deleted person's name out of every entry (``pipelines.timeline.forget``), and out of
entries still queued or being made when it runs; their clips and snapshots stay (docs/faces.md says why).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import re
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from prometheus_client import Counter

from pipelines.timeline.forget import anonymise

log = logging.getLogger(__name__)

EntryKind = Literal["event", "transcript", "reply", "scene", "alert"]
ENTRY_KINDS: tuple[str, ...] = ("event", "transcript", "reply", "scene", "alert")
_ID = re.compile(r"^[0-9a-f]{16}$")
MEDIA_DIRS = ("clips", "snapshots")
MEDIA_COLUMNS = ("clip", "snapshot")
# A file under clips/ or snapshots/ that no entry names is removed by retention once it is this old; younger ones
# may be a write in flight (written, its entry update still queued).
ORPHAN_AGE_S = 60.0

DROPPED = Counter("vigil_timeline_dropped_total",
                  "Timeline writes (entries, clip and snapshot updates) refused because the write queue was full.")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    source TEXT NOT NULL,      -- the session or source id
    origin TEXT NOT NULL,      -- webrtc | rtsp | file | analyze
    source_name TEXT,
    wall_ts REAL NOT NULL,     -- seconds since the epoch
    pts REAL,                  -- media time, seconds since the stream's first frame
    text TEXT,                 -- transcripts, replies, alerts
    data TEXT NOT NULL,        -- JSON object
    clip TEXT,                 -- relative path of the MP4, NULL until ready (or deleted by retention)
    clip_state TEXT NOT NULL DEFAULT 'none',  -- none | pending | ready | failed | deleted
    clip_start_pts REAL,
    clip_duration_s REAL,
    snapshot TEXT,             -- relative path of the JPEG
    clip_error TEXT            -- why the clip is failed
);
CREATE INDEX IF NOT EXISTS entries_by_time ON entries (wall_ts, seq);
CREATE INDEX IF NOT EXISTS entries_by_source ON entries (source, seq);
CREATE INDEX IF NOT EXISTS entries_by_clip ON entries (clip);
CREATE INDEX IF NOT EXISTS entries_by_snapshot ON entries (snapshot);
"""


def new_entry_id() -> str:
    return uuid.uuid4().hex[:16]


def valid_entry_id(value: str) -> bool:
    return bool(_ID.match(value))


@dataclass(slots=True)
class TimelineEntry:
    kind: EntryKind
    name: str  # e.g. zone.enter, line.cross, object.appeared, scene, transcript, reply, alert
    source: str
    origin: str
    wall_ts: float
    pts: float | None = None
    data: dict[str, Any] = field(default_factory=dict)
    text: str | None = None
    source_name: str | None = None
    id: str = field(default_factory=new_entry_id)
    clip_state: str = "none"
    clip: str | None = None
    clip_start_pts: float | None = None
    clip_duration_s: float | None = None
    snapshot: str | None = None
    seq: int | None = None  # the store's commit order (set once stored)
    clip_error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "kind": self.kind, "name": self.name, "source": self.source, "origin": self.origin,
            "source_name": self.source_name, "wall_ts": self.wall_ts, "pts": self.pts, "text": self.text,
            "data": self.data, "clip_state": self.clip_state, "has_clip": self.clip is not None,
            "has_snapshot": self.snapshot is not None, "clip_start_pts": self.clip_start_pts,
            "clip_duration_s": self.clip_duration_s, "clip_error": self.clip_error,
        }


@dataclass(slots=True)
class _MediaUpdate:
    ids: list[str]
    clip: str | None = None
    clip_state: str | None = None
    clip_start_pts: float | None = None
    clip_duration_s: float | None = None
    snapshot: str | None = None
    clip_error: str | None = None
    # Called on the writer thread once the update is committed, with the ids it updated (some may have been
    # deleted meanwhile); not called when none was left.
    on_committed: Callable[[list[str]], None] | None = None
    updated: list[str] = field(default_factory=list)  # the ids still stored when it was applied


@dataclass(slots=True)
class Forgotten:
    """What ``forget_identity`` changed."""

    entries: list[TimelineEntry] = field(default_factory=list)  # the entries changed, as now stored
    identities: int = 0  # entries whose data lost the person's identity (events, and alerts that carry one)
    texts: int = 0  # entries whose text named them (alerts, replies, transcripts): the name is now "someone"
    clips: int = 0  # clip files of those entries, kept
    snapshots: int = 0  # snapshot files of those entries, kept


FailureCallback = Callable[[str], None]
# Called on the writer thread with the entries of each batch once it is committed (e.g. the memory's feed): it
# must not block and must hop to its own loop for anything that is not thread-safe.
CommitListener = Callable[[list["TimelineEntry"]], None]
DeleteListener = Callable[[list[str]], None]  # ids of entries deleted (by the API or by retention)
SnapshotListener = Callable[[list[str], str], None]  # ids of entries and the snapshot (relative path) they now share


class _Retention:
    """Queue marker: run retention now (after a clip was written)."""


_Item = tuple[TimelineEntry | _MediaUpdate | _Retention, FailureCallback | None]


CRASH_CLIP_ERROR = "the server stopped before this clip was written"


def decodable_duration(path: Path) -> float | None:
    """The video's duration in seconds if the file opens as a finished container and its first frame decodes, else
    None (an MP4 cut short has no index: it does not open)."""
    import av  # deferred: only crash recovery needs it here

    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                return None
            stream = container.streams.video[0]
            next(container.decode(stream))
            if stream.duration is not None and stream.time_base is not None:
                return float(stream.duration * stream.time_base)
            return container.duration / av.time_base if container.duration else 0.0
    except (av.FFmpegError, OSError, ValueError, StopIteration):
        return None


def _row_entry(row: sqlite3.Row) -> TimelineEntry:
    return TimelineEntry(
        kind=row["kind"], name=row["name"], source=row["source"], origin=row["origin"], wall_ts=row["wall_ts"],
        pts=row["pts"], data=json.loads(row["data"]), text=row["text"], source_name=row["source_name"],
        id=row["id"], clip_state=row["clip_state"], clip=row["clip"], clip_start_pts=row["clip_start_pts"],
        clip_duration_s=row["clip_duration_s"], snapshot=row["snapshot"], seq=row["seq"],
        clip_error=row["clip_error"],
    )


class StorageUnavailable(Exception):
    pass


class TimelineStore:
    """The timeline of every session and source. ``put`` never blocks; reads are blocking (call them on a
    thread). ``open()`` creates the data dir; when it cannot (read-only disk), ``available`` is False and every
    ``put`` reports its failure instead."""

    def __init__(self, data_dir: Path, *, max_age_s: float, quota_bytes: int, queue_entries: int = 10_000,
                 batch_entries: int = 200, retention_interval_s: float = 60.0) -> None:
        self.data_dir = data_dir
        self.max_age_s = max_age_s
        self.quota_bytes = quota_bytes
        self.batch_entries = batch_entries
        self.retention_interval_s = retention_interval_s
        self.dropped = 0  # writes refused because the queue was full (also vigil_timeline_dropped_total)
        self.open_error: str | None = None
        self._queue: queue.Queue[_Item | None] = queue.Queue(queue_entries)
        self._writer: threading.Thread | None = None
        self._conn: sqlite3.Connection | None = None
        self._read_lock = threading.Lock()
        self._reader: sqlite3.Connection | None = None
        self._retention_lock = threading.Lock()
        self._idle = threading.Condition()
        self._pending = 0
        self._listeners: list[CommitListener] = []
        self._delete_listeners: list[DeleteListener] = []
        self._snapshot_listeners: list[SnapshotListener] = []
        # Names of people deleted (forget_identity) and not enrolled again since: taken out of entries as they are
        # written (an event of the frame analysed while the person was deleted, still queued here).
        self._forgotten_names: set[str] = set()

    # ------------------------------------------------------------------ lifecycle

    @property
    def available(self) -> bool:
        return self._conn is not None

    @property
    def root(self) -> Path:
        return self.data_dir.resolve()

    def open(self) -> None:
        try:
            for sub in ("", "clips", "snapshots"):
                (self.data_dir / sub).mkdir(parents=True, exist_ok=True)
            self._conn = self._connect()
            self._conn.executescript(_SCHEMA)
            if "clip_error" not in {row["name"] for row in self._conn.execute("PRAGMA table_info(entries)")}:
                self._conn.execute("ALTER TABLE entries ADD COLUMN clip_error TEXT")  # a store made before it
            self._reader = self._connect()
            self.recover_pending_clips()
        except (OSError, sqlite3.Error) as error:
            self.open_error = f"timeline storage unavailable ({self.data_dir}): {error}"
            log.error("%s; events are sent live only", self.open_error)
            self._conn = None
            return
        self._writer = threading.Thread(target=self._write_loop, name="vigil-timeline-writer", daemon=True)
        self._writer.start()

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.data_dir / "timeline.db", isolation_level=None, check_same_thread=False,
                               timeout=30)
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: a power cut may lose the last batch, never corrupt
        return conn

    def close(self) -> None:
        """Write what is queued, then stop (blocking)."""
        if self._writer is not None:
            self._queue.put(None)
            self._writer.join(timeout=30)
            self._writer = None
        # Under the read lock: a read still running on another thread (memory catching up) finishes first, and
        # the next one finds the store closed; closing a connection under a running query segfaults.
        with self._read_lock:
            for conn in (self._conn, self._reader):
                if conn is not None:
                    with contextlib.suppress(sqlite3.Error):
                        conn.close()
            self._conn = self._reader = None

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything queued so far is committed (tests, shutdown)."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def add_listener(self, listener: CommitListener) -> None:
        """Hear of every entry committed from now on (a list append is atomic: safe beside the writer thread)."""
        self._listeners.append(listener)

    def add_snapshot_listener(self, listener: SnapshotListener) -> None:
        """Hear of every snapshot committed from now on (ids still stored, relative path; ``media_path`` finds its
        file): on the writer thread, so a listener must be quick and never raise."""
        self._snapshot_listeners.append(listener)

    def add_delete_listener(self, listener: DeleteListener) -> None:
        """Hear of entries deleted from now on, after the deletion committed: on the deleting thread (the API's
        worker thread, or the writer thread for retention), so a listener must be quick and never raise."""
        self._delete_listeners.append(listener)

    def _deleted(self, ids: list[str]) -> None:
        for listener in self._delete_listeners if ids else ():
            try:
                listener(ids)
            except Exception:  # a listener's bug must not stop a deletion or retention
                log.exception("timeline delete listener failed")

    # ------------------------------------------------------------------ writes (never block)

    def put(self, entry: TimelineEntry, on_failure: FailureCallback | None = None) -> bool:
        return self._offer((entry, on_failure))

    def update_media(self, ids: list[str], *, on_failure: FailureCallback | None = None,
                     on_committed: Callable[[list[str]], None] | None = None, **fields: Any) -> bool:
        """Set clip/snapshot fields of stored entries; ``on_committed`` runs (writer thread) once they are
        visible to readers."""
        return self._offer((_MediaUpdate(list(ids), on_committed=on_committed, **fields), on_failure))

    def request_retention(self) -> None:
        """Run retention on the writer thread soon (e.g. after a clip was written)."""
        self._offer((_Retention(), None))

    def _offer(self, item: _Item) -> bool:
        if self._conn is None:
            if item[1] is not None and self.open_error is not None:  # never opened: storage is off, say nothing
                item[1](self.open_error)
            return False
        with self._idle:
            self._pending += 1
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            with self._idle:
                self._pending -= 1
                self._idle.notify_all()
            if isinstance(item[0], _Retention):  # only a nudge: the writer runs retention on its timer anyway
                return False
            self.dropped += 1
            DROPPED.inc()
            if item[1] is not None:
                item[1]("timeline write queue full: entries are being dropped")
            return False
        return True

    def _write_loop(self) -> None:
        last_retention = 0.0
        while True:
            try:
                first = self._queue.get(timeout=self.retention_interval_s)
            except queue.Empty:
                first = ...
            stop = first is None
            batch: list[_Item] = [first] if isinstance(first, tuple) else []
            while not stop and len(batch) < self.batch_entries:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                else:
                    batch.append(item)
            retention_due = any(isinstance(item, _Retention) for item, _ in batch)
            if batch:
                self._commit([(item, cb) for item, cb in batch if not isinstance(item, _Retention)])
            if retention_due or time.monotonic() - last_retention >= self.retention_interval_s:
                last_retention = time.monotonic()
                self.enforce_retention()
            if batch:
                with self._idle:
                    self._pending -= len(batch)
                    self._idle.notify_all()
            if stop:
                return
            # Waiting for the next entry, hold no callback of the last batch: each is a recorder of some session,
            # which would outlive its close until then.
            first = item = batch = None  # type: ignore[assignment]

    def _commit(self, batch: list[_Item]) -> None:
        assert self._conn is not None
        try:
            with _transaction(self._conn):
                for item, _ in batch:
                    if isinstance(item, TimelineEntry):
                        self._insert(item)
                    elif isinstance(item, _MediaUpdate):
                        self._update(item)
        except sqlite3.Error as error:
            log.error("timeline write failed: %s", error)
            for callback in dict.fromkeys(cb for _, cb in batch if cb is not None):
                callback(f"timeline write failed: {error}")
            return
        for item, _ in batch:
            if not isinstance(item, _MediaUpdate):
                continue
            if not item.updated:  # its entries were deleted while the file was written: nothing will serve it
                for relative in (item.clip, item.snapshot):
                    self._unlink_unused(self._conn, relative)
                continue
            if item.on_committed is not None:
                try:
                    item.on_committed(item.updated)
                except Exception:
                    log.exception("timeline commit callback failed")
        committed = [item for item, _ in batch if isinstance(item, TimelineEntry)]
        for listener in self._listeners if committed else ():
            try:
                listener(committed)
            except Exception:  # a listener's bug must not stop the writer
                log.exception("timeline commit listener failed")
        # After the entries: an event and its snapshot may commit in one batch, and a listener hears of the event
        # first.
        snapshots = [(item.updated, item.snapshot) for item, _ in batch
                     if isinstance(item, _MediaUpdate) and item.updated and item.snapshot]
        for snapshot_listener in self._snapshot_listeners if snapshots else ():
            for ids, relative in snapshots:
                try:
                    snapshot_listener(ids, relative)
                except Exception:  # a listener's bug must not stop the writer
                    log.exception("timeline snapshot listener failed")

    def _insert(self, e: TimelineEntry) -> None:
        assert self._conn is not None
        for name in tuple(self._forgotten_names) if self._forgotten_names else ():
            anonymise(e, name)
        e.seq = self._conn.execute(
            "INSERT INTO entries (id, kind, name, source, origin, source_name, wall_ts, pts, text, data, clip,"
            " clip_state, clip_start_pts, clip_duration_s, snapshot) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (e.id, e.kind, e.name, e.source, e.origin, e.source_name, e.wall_ts, e.pts, e.text,
             json.dumps(e.data, default=str), e.clip, e.clip_state, e.clip_start_pts, e.clip_duration_s,
             e.snapshot),
        ).lastrowid  # listeners (memory) keep track of how far they got by it

    def _update(self, u: _MediaUpdate) -> None:
        assert self._conn is not None
        values = {k: getattr(u, k) for k in ("clip", "clip_state", "clip_start_pts", "clip_duration_s", "snapshot",
                                             "clip_error") if getattr(u, k) is not None}
        if not values:
            return
        assignments = ", ".join(f"{column} = ?" for column in values)
        u.updated = [entry_id for entry_id in u.ids if self._conn.execute(
            f"UPDATE entries SET {assignments} WHERE id = ?", (*values.values(), entry_id)).rowcount]

    # ------------------------------------------------------------------ crash recovery (open)

    def recover_pending_clips(self) -> tuple[int, int]:
        """Settle the clips a crash left ``pending`` (call before any recorder runs: none of them is still being
        written). Returns (entries whose clip was kept, entries marked failed)."""
        assert self._conn is not None
        rows = self._conn.execute("SELECT id, source, pts FROM entries WHERE clip_state = 'pending' ORDER BY seq")
        pending = [(row["id"], row["source"], row["pts"]) for row in rows.fetchall()]
        if not pending:
            return 0, 0
        kept: dict[str, tuple[str, float]] = {}  # entry id -> (clip, duration)
        heads: dict[str, tuple[float | None, str, float]] = {}  # source -> the latest clip kept: (pts, clip, s)
        for entry_id, source, pts in pending:
            relative = f"clips/{entry_id}.mp4"  # a clip is named after its first event
            duration = self._finish_clip_file(relative)
            if duration is not None:
                heads[source] = (pts, relative, duration)
                kept[entry_id] = (relative, duration)
                continue
            head = heads.get(source)  # a later event of a kept clip (it joined while the clip was recorded)
            if head is not None and head[0] is not None and pts is not None and head[0] <= pts <= head[0] + head[2]:
                kept[entry_id] = (head[1], head[2])
        failed = [entry_id for entry_id, _, _ in pending if entry_id not in kept]
        with _transaction(self._conn):
            for entry_id, (relative, duration) in kept.items():
                self._conn.execute("UPDATE entries SET clip = ?, clip_state = 'ready', clip_duration_s = ?"
                                   " WHERE id = ?", (relative, round(duration, 3), entry_id))
            self._conn.executemany(
                "UPDATE entries SET clip_state = 'failed', clip_error = ? WHERE id = ?",
                [(CRASH_CLIP_ERROR, entry_id) for entry_id in failed])
        log.warning("timeline: %d clip(s) left pending by the last run: %d entries kept a clip written before it "
                    "stopped, %d marked failed", len(pending), len(kept), len(failed))
        return len(kept), len(failed)

    def _finish_clip_file(self, relative: str) -> float | None:
        """The duration of the clip at ``relative`` (or its ``.part``, renamed into place) if it decodes; a part
        that does not is removed. None: no usable clip."""
        final = self.data_dir / relative
        partial = final.with_name(final.name + ".part")
        for path in (final, partial):
            if not path.is_file():
                continue
            duration = decodable_duration(path)
            if duration is None:
                log.info("timeline: %s does not decode (cut short by a crash): removed", path.name)
                with contextlib.suppress(OSError):
                    path.unlink()
                continue
            if path == partial:
                partial.replace(final)
            return duration
        return None

    # ------------------------------------------------------------------ reads (blocking: call on a thread)

    @contextlib.contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        with self._read_lock:
            if self._reader is None:
                raise StorageUnavailable(self.open_error or "timeline storage is not open")
            yield self._reader

    def query(self, *, source: str | None = None, name: str | None = None, kinds: tuple[str, ...] = ("event",),
              since: float | None = None, until: float | None = None, before_seq: int | None = None,
              limit: int = 50, identity: str | None = None, plate: str | None = None) -> list[TimelineEntry]:
        """Newest first; ``before_seq`` is the paging cursor (the last page's smallest ``seq``); ``identity``: a
        person's enrolled name (video.faces), ``plate``: a normalised plate text (video.plates)."""
        where, args = [f"kind IN ({','.join('?' * len(kinds))})"], list(kinds)
        for clause, value in (("source = ?", source), ("name = ?", name), ("wall_ts >= ?", since),
                              ("wall_ts < ?", until), ("seq < ?", before_seq),
                              ("json_extract(data, '$.identity.name') = ?", identity),
                              ("json_extract(data, '$.plate.text') = ?", plate)):
            if value is not None:
                where.append(clause)
                args.append(value)
        with self._reading() as conn:
            rows = conn.execute(f"SELECT * FROM entries WHERE {' AND '.join(where)} ORDER BY seq DESC LIMIT ?",
                                (*args, limit)).fetchall()
        return [_row_entry(row) for row in rows]

    def entries_after(self, seq: int, limit: int) -> list[TimelineEntry]:
        """Entries committed after ``seq``, in commit order (memory catching up after a crash)."""
        with self._reading() as conn:
            rows = conn.execute("SELECT * FROM entries WHERE seq > ? ORDER BY seq LIMIT ?", (seq, limit)).fetchall()
        return [_row_entry(row) for row in rows]

    def get(self, entry_id: str) -> TimelineEntry | None:
        if not valid_entry_id(entry_id):
            return None
        with self._reading() as conn:
            row = conn.execute("SELECT * FROM entries WHERE id = ?", (entry_id,)).fetchone()
        return _row_entry(row) if row is not None else None

    def media_path(self, relative: str | None) -> Path | None:
        """The file a stored relative path names, only if it lies inside the data dir."""
        if not relative:
            return None
        path = (self.root / relative).resolve()
        if not path.is_relative_to(self.root) or not path.is_file():
            return None
        return path

    def delete(self, entry_id: str) -> bool:
        """Delete an entry, and its clip and snapshot once no other entry uses them (blocking)."""
        if not valid_entry_id(entry_id):
            return False
        # On the reader's connection (not the writer's): SQLite serialises the two writers itself. The row is read
        # inside the write transaction, so a clip or snapshot committed just before is seen (and removed).
        with self._retention_lock, self._reading() as conn:
            with _transaction(conn):
                row = conn.execute("SELECT clip, snapshot FROM entries WHERE id = ?", (entry_id,)).fetchone()
                if row is None:
                    return False
                conn.execute("DELETE FROM entries WHERE id = ?", (entry_id,))
            for relative in (row["clip"], row["snapshot"]):
                self._unlink_unused(conn, relative)
        self._deleted([entry_id])
        return True

    def forget_identity(self, name: str, *, enrolled: bool) -> Forgotten:
        """Take a deleted person's name out of every entry (blocking): ``identity`` naming them goes from events'
        and alerts' data, and their name becomes "someone" in texts (alerts, replies, transcripts); entries written
        from now on are treated alike until ``allow_identity``. Clips and snapshots stay (no name is drawn on them).
        ``enrolled``: the person was enrolled until now; otherwise texts are changed only if some entry carries
        the name as an identity (a retry after a crash), so that no word of any transcript can be rewritten by
        deleting a name that never was a person's. Deleted bytes are zeroed (``secure_delete``) and the WAL
        truncated when no reader holds it, so the old rows do not linger in the files either."""
        if enrolled:  # before the transaction below: a row committed after it was anonymised as it was written
            self._forgotten_names.add(name)
        needle = json.dumps(name)[1:-1]  # as the name is written inside the data's JSON
        forgotten = Forgotten()
        with self._retention_lock, self._reading() as conn:
            conn.execute("PRAGMA secure_delete = ON")
            with _transaction(conn):
                rows = conn.execute("SELECT * FROM entries WHERE instr(data, ?) > 0 OR instr(text, ?) > 0",
                                    (needle, name)).fetchall()
                entries = [_row_entry(row) for row in rows]
                changes = [(entry, *anonymise(entry, name)) for entry in entries]
                if not enrolled and not any(identity for _, identity, _ in changes):
                    return forgotten  # nothing says this name was ever a person's: no text is touched
                self._forgotten_names.add(name)
                for entry, identity, named in changes:
                    if not identity and not named:
                        continue
                    conn.execute("UPDATE entries SET data = ?, text = ? WHERE id = ?",
                                 (json.dumps(entry.data, default=str), entry.text, entry.id))
                    forgotten.entries.append(entry)
                    forgotten.identities += identity
                    forgotten.texts += named
            with contextlib.suppress(sqlite3.Error):  # busy while a read is open: the WAL is reused soon anyway
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        forgotten.clips = len({e.clip for e in forgotten.entries if e.clip})
        forgotten.snapshots = len({e.snapshot for e in forgotten.entries if e.snapshot})
        return forgotten

    def unname(self, entry_id: str, name: str) -> TimelineEntry | None:
        """Take ``name`` out of one entry (blocking), as deleting the person does everywhere (its identity goes,
        its text says "someone"): the event was marked "not this person". Returns the changed entry (None: no such
        entry, or it does not carry the name)."""
        if not valid_entry_id(entry_id):
            return None
        with self._retention_lock, self._reading() as conn:
            conn.execute("PRAGMA secure_delete = ON")
            with _transaction(conn):
                row = conn.execute("SELECT * FROM entries WHERE id = ?", (entry_id,)).fetchone()
                if row is None:
                    return None
                entry = _row_entry(row)
                identity, named = anonymise(entry, name)
                if not identity and not named:
                    return None
                conn.execute("UPDATE entries SET data = ?, text = ? WHERE id = ?",
                             (json.dumps(entry.data, default=str), entry.text, entry.id))
        return entry

    def allow_identity(self, name: str) -> None:
        """``name`` was enrolled again: entries written from now on keep it."""
        self._forgotten_names.discard(name)

    def _unlink_unused(self, conn: sqlite3.Connection, relative: str | None) -> int:
        """Remove a clip or snapshot file unless an entry still names it (entries share them)."""
        if not relative:
            return 0
        for column in MEDIA_COLUMNS:
            if conn.execute(f"SELECT 1 FROM entries WHERE {column} = ? LIMIT 1", (relative,)).fetchone():
                return 0
        return self._unlink(relative)

    # ------------------------------------------------------------------ retention (writer thread or tests)

    def disk_usage(self) -> int:
        total = 0
        for sub in MEDIA_DIRS:
            for dirpath, _, files in os.walk(self.data_dir / sub):
                for name in files:
                    with contextlib.suppress(OSError):
                        total += os.stat(os.path.join(dirpath, name)).st_size
        return total

    def enforce_retention(self, now: float | None = None) -> None:
        """Delete entries past their age, then the oldest clips (and snapshots) until under the quota."""
        if self._conn is None:
            return
        cutoff = (now if now is not None else time.time()) - self.max_age_s
        try:
            with self._retention_lock:
                with _transaction(self._conn):
                    old = self._conn.execute("SELECT id, clip, snapshot FROM entries WHERE wall_ts < ?",
                                             (cutoff,)).fetchall()
                    self._conn.execute("DELETE FROM entries WHERE wall_ts < ?", (cutoff,))
                self._deleted([row["id"] for row in old])
                for relative in dict.fromkeys(r for row in old for r in (row["clip"], row["snapshot"]) if r):
                    self._unlink_unused(self._conn, relative)
                self._sweep_orphans()
                self._enforce_quota()
        except sqlite3.Error as error:
            log.error("timeline retention failed: %s", error)

    def _sweep_orphans(self) -> None:
        """Remove files under clips/ and snapshots/ that no entry names, once they are ``ORPHAN_AGE_S`` old (a
        clip written for entries deleted meanwhile, a ``.part`` left by a crash)."""
        assert self._conn is not None
        named = {row[0] for row in self._conn.execute(
            "SELECT clip FROM entries WHERE clip IS NOT NULL UNION SELECT snapshot FROM entries"
            " WHERE snapshot IS NOT NULL")}
        older_than = time.time() - ORPHAN_AGE_S
        for sub in MEDIA_DIRS:
            with contextlib.suppress(OSError), os.scandir(self.data_dir / sub) as files:
                for file in files:
                    relative = f"{sub}/{file.name}"
                    with contextlib.suppress(OSError):
                        if relative not in named and file.is_file() and file.stat().st_mtime < older_than:
                            log.info("timeline retention: removing %s (no entry names it)", relative)
                            self._unlink(relative)

    def _enforce_quota(self) -> None:
        assert self._conn is not None
        usage = self.disk_usage()
        if usage <= self.quota_bytes:
            return
        # Oldest clips first (by the first entry that uses each), then the oldest snapshots.
        clips = self._conn.execute("SELECT clip, min(seq) AS first FROM entries WHERE clip IS NOT NULL"
                                   " GROUP BY clip ORDER BY first").fetchall()
        for row in clips:
            if usage <= self.quota_bytes:
                return
            usage -= self._unlink(row["clip"])
            with _transaction(self._conn):
                self._conn.execute("UPDATE entries SET clip = NULL, clip_state = 'deleted' WHERE clip = ?",
                                   (row["clip"],))
        snapshots = self._conn.execute("SELECT snapshot, min(seq) AS first FROM entries WHERE snapshot IS NOT NULL"
                                       " GROUP BY snapshot ORDER BY first")
        for row in snapshots.fetchall():
            if usage <= self.quota_bytes:
                return
            usage -= self._unlink(row["snapshot"])
            with _transaction(self._conn):
                self._conn.execute("UPDATE entries SET snapshot = NULL WHERE snapshot = ?", (row["snapshot"],))

    def _unlink(self, relative: str | None) -> int:
        if not relative:
            return 0
        path = (self.root / relative).resolve()
        if not path.is_relative_to(self.root):
            return 0
        try:
            size = path.stat().st_size
            path.unlink()
        except OSError:
            return 0
        return size


@contextlib.contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
