"""The entry store: SQLite in WAL mode, the record of every entry, with an FTS5 index for keyword (BM25) search.

The vectors live elsewhere (``vectors.py``) and can be rebuilt from here. Blocking: call from the index's
threads; each thread gets its own connection (WAL lets readers run beside the one writer)."""

from __future__ import annotations

import json
import math
import re
import sqlite3
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from pipelines.memory.entries import MemoryEntry, SearchFilters

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL, text TEXT NOT NULL, source TEXT NOT NULL, session TEXT NOT NULL,
    media_time REAL, wall_time REAL NOT NULL, event_id TEXT, clip_id TEXT,
    labels TEXT NOT NULL, track_ids TEXT NOT NULL, document_id TEXT, meta TEXT NOT NULL,
    indexed INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS entries_kind_time ON entries (kind, wall_time);
CREATE INDEX IF NOT EXISTS entries_source ON entries (source, wall_time);
CREATE INDEX IF NOT EXISTS entries_document ON entries (document_id);
CREATE INDEX IF NOT EXISTS entries_event ON entries (event_id);
CREATE INDEX IF NOT EXISTS entries_unindexed ON entries (indexed) WHERE indexed = 0;
CREATE VIRTUAL TABLE IF NOT EXISTS entries_fts USING fts5(text, tokenize = 'porter unicode61');
CREATE TABLE IF NOT EXISTS progress (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""

# Words that match nearly every entry: left out of the keyword query (BM25 would weigh them low anyway, but they
# make FTS5 visit most rows).
STOPWORDS = frozenset(
    "a an and are as at be been but by can did do does for from had has have he her him his how i if in into is it "
    "its me my no not of on or our she so than that the their them then there these they this those to was we were "
    "what when where which who whom why will with you your".split()
)
_WORD = re.compile(r"\w+", re.UNICODE)
COMMON_TERM_SHARE = 0.05  # a term in more than this share of entries does not pick keyword candidates
FREQUENCY_TTL_S = 60.0


def query_terms(text: str, max_terms: int = 32) -> list[str]:
    """The text's distinct words that are not stopwords, each quoted for FTS5 (no FTS5 syntax gets through)."""
    words = [w for w in (m.group(0).lower() for m in _WORD.finditer(text)) if w not in STOPWORDS]
    return [f'"{w}"' for w in list(dict.fromkeys(words))[:max_terms]]


def keyword_query(text: str, max_terms: int = 32) -> str | None:
    """An FTS5 query matching any of the text's words, or None."""
    terms = query_terms(text, max_terms)
    return " OR ".join(terms) if terms else None


def tied_ranks(scores: dict[int, float]) -> list[tuple[int, float]]:
    """(id, rank), best first; equal scores share the average of the ranks they span (1-based)."""
    ordered = sorted(scores, key=lambda i: -scores[i])
    ranked: list[tuple[int, float]] = []
    start = 0
    while start < len(ordered):
        end = start
        while end + 1 < len(ordered) and abs(scores[ordered[end + 1]] - scores[ordered[start]]) < 1e-9:
            end += 1
        ranked += [(i, (start + end) / 2 + 1) for i in ordered[start:end + 1]]
        start = end + 1
    return ranked


def _where(filters: SearchFilters, alias: str = "e") -> tuple[str, list[object]]:
    clauses, params = [f"{alias}.kind IN ({','.join('?' * len(filters.kinds))})"], list(filters.kinds)
    for column, value in (("source", filters.source), ("session", filters.session),
                          ("document_id", filters.document_id)):
        if value is not None:
            clauses.append(f"{alias}.{column} = ?")
            params.append(value)
    if filters.since is not None:
        clauses.append(f"{alias}.wall_time >= ?")
        params.append(filters.since)
    if filters.until is not None:
        clauses.append(f"{alias}.wall_time <= ?")
        params.append(filters.until)
    return " AND ".join(clauses), params


class EntryStore:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._frequencies: dict[str, tuple[int, float]] = {}  # term -> (entries containing it, when counted)
        self._db().executescript(_SCHEMA)

    def _db(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(self.path, check_same_thread=False, timeout=30.0)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across a process crash
            self._local.db = db
            with self._lock:
                self._connections.append(db)
        return db

    def close(self) -> None:
        with self._lock:
            for db in self._connections:
                db.close()
            self._connections.clear()
        self._local = threading.local()

    # ------------------------------------------------------------------ writes

    def add(self, entries: Sequence[MemoryEntry], advance: bool = True) -> list[int]:
        """Store entries (and their keyword index) in one transaction; sets and returns their ids. ``advance``:
        move the timeline mark to the newest of them (the live feed, which comes in commit order)."""
        db = self._db()
        with db:
            ids = [self._insert(db, e) for e in entries]
            # In the same transaction: every timeline entry up to the mark is stored (the feed is in commit order).
            if advance:
                self._advance_timeline_seq(db, max((e.timeline_seq or 0 for e in entries), default=0))
        return ids

    @staticmethod
    def _insert(db: sqlite3.Connection, e: MemoryEntry) -> int:
        cursor = db.execute(
            "INSERT INTO entries (kind, text, source, session, media_time, wall_time, event_id, clip_id, "
            "labels, track_ids, document_id, meta) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            (e.kind, e.text, e.source, e.session, e.media_time, e.wall_time, e.event_id, e.clip_id,
             json.dumps(e.labels), json.dumps(e.track_ids), e.document_id, json.dumps(e.meta)),
        )
        e.id = int(cursor.lastrowid or 0)
        db.execute("INSERT INTO entries_fts (rowid, text) VALUES (?, ?)", (e.id, e.text))
        return e.id

    def replace_events(self, entries: Sequence[MemoryEntry]) -> list[int]:
        """Put these versions (new texts) in place of the entries held for the same timeline entries (event
        ids): the old rows and their keyword index go, the new rows get new ids and wait for their vectors
        (``indexed`` 0). Entries memory does not hold are left out. Deleted bytes are zeroed (``secure_delete``);
        ``purge_deleted_text`` then drops the old words from the keyword index's segments too. Returns the ids
        replaced (their vectors are to be deleted)."""
        db = self._db()
        db.execute("PRAGMA secure_delete = ON")
        replaced: list[int] = []
        with db:
            for entry in entries:
                old = [r[0] for r in db.execute("SELECT id FROM entries WHERE event_id = ?", (entry.event_id,))]
                if not old:
                    continue
                db.executemany("DELETE FROM entries_fts WHERE rowid = ?", [(i,) for i in old])
                db.executemany("DELETE FROM entries WHERE id = ?", [(i,) for i in old])
                self._insert(db, entry)
                replaced += old
        return replaced

    def purge_deleted_text(self) -> None:
        """Rewrite the keyword index in one segment (FTS5 'optimize'): a deleted row's words otherwise stay in
        older segments, marked deleted, until a merge; then truncate the WAL (when no reader holds it)."""
        db = self._db()
        db.execute("PRAGMA secure_delete = ON")
        with db:
            db.execute("INSERT INTO entries_fts (entries_fts) VALUES ('optimize')")
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def _advance_timeline_seq(self, db: sqlite3.Connection, seq: int) -> None:
        if seq > 0:
            db.execute("INSERT INTO progress (name, value) VALUES ('timeline_seq', ?) ON CONFLICT (name) DO UPDATE "
                       "SET value = max(value, excluded.value)", (seq,))

    def advance_timeline_seq(self, seq: int) -> None:
        """Every timeline entry up to ``seq`` is in memory, or was not meant to be (filtered out)."""
        db = self._db()
        with db:
            self._advance_timeline_seq(db, seq)

    def timeline_seq(self) -> int:
        """The timeline's commit order up to which memory has everything (0: nothing yet)."""
        row = self._db().execute("SELECT value FROM progress WHERE name = 'timeline_seq'").fetchone()
        return int(row[0]) if row else 0

    def last_scene(self, source: str) -> str | None:
        """The text of the newest scene summary held for a source."""
        row = self._db().execute("SELECT text FROM entries WHERE kind = 'scene' AND source = ? ORDER BY wall_time "
                                 "DESC, id DESC LIMIT 1", (source,)).fetchone()
        return row[0] if row else None

    def stored_events(self, event_ids: Sequence[str]) -> set[str]:
        """Which of these timeline entries memory already holds."""
        found: set[str] = set()
        for start in range(0, len(event_ids), 500):  # SQLite's bound-parameter limit
            part = list(event_ids[start:start + 500])
            found.update(r[0] for r in self._db().execute(
                f"SELECT event_id FROM entries WHERE event_id IN ({','.join('?' * len(part))})", part))
        return found

    def mark_indexed(self, ids: Iterable[int]) -> None:
        db = self._db()
        with db:
            db.executemany("UPDATE entries SET indexed = 1 WHERE id = ?", [(i,) for i in ids])

    def mark_all_unindexed(self) -> None:
        db = self._db()
        with db:
            db.execute("UPDATE entries SET indexed = 0")

    def unindexed(self, limit: int) -> list[MemoryEntry]:
        """Entries whose vectors never reached the vector index (e.g. the process died in between)."""
        rows = self._db().execute(f"SELECT {_COLUMNS} FROM entries e WHERE indexed = 0 ORDER BY id LIMIT ?",
                                  (limit,)).fetchall()
        return [_entry(row) for row in rows]

    def delete_document(self, document_id: str) -> list[int]:
        db = self._db()
        with db:
            ids = [r[0] for r in db.execute("SELECT id FROM entries WHERE document_id = ?", (document_id,))]
            db.executemany("DELETE FROM entries_fts WHERE rowid = ?", [(i,) for i in ids])
            db.execute("DELETE FROM entries WHERE document_id = ?", (document_id,))
        return ids

    def delete_events(self, event_ids: Sequence[str]) -> list[int]:
        """Remove the entries of these timeline entries (and their keyword index); returns their ids."""
        db = self._db()
        ids: list[int] = []
        with db:
            for start in range(0, len(event_ids), 500):  # SQLite's bound-parameter limit
                part = list(event_ids[start:start + 500])
                ids += [r[0] for r in db.execute(
                    f"SELECT id FROM entries WHERE event_id IN ({','.join('?' * len(part))})", part)]
            db.executemany("DELETE FROM entries_fts WHERE rowid = ?", [(i,) for i in ids])
            db.executemany("DELETE FROM entries WHERE id = ?", [(i,) for i in ids])
        return ids

    # ------------------------------------------------------------------ reads

    def keyword_search(self, query: str, filters: SearchFilters, limit: int) -> list[tuple[int, float]]:
        """(id, rank) of the best keyword matches of the query's words that pass the filters, best first.

        Candidates come from FTS5's BM25; they are then ranked by which query terms they contain (the sum of those
        terms' inverse document frequencies), and entries containing the same terms share a rank. BM25 would order
        them by length, which for one-line entries says nothing: a tie leaves the order to the vector search."""
        terms = query_terms(query)
        if not terms:
            return []
        db = self._db()
        total = int(db.execute("SELECT COALESCE(MAX(id), 0) FROM entries").fetchone()[0])  # ~count, O(log n)
        frequencies = {term: self._document_frequency(term) for term in terms}
        terms = [term for term in terms if frequencies[term]]
        # Terms in a large share of entries ("person", "zone") add little but make FTS5 score most rows: they
        # still count below, but candidates come from the rarer terms when there are any.
        rare = [term for term in terms if frequencies[term] <= COMMON_TERM_SHARE * total] or terms
        if not rare:
            return []
        where, params = _where(filters)
        candidates = [r[0] for r in db.execute(
            f"SELECT f.rowid FROM entries_fts f JOIN entries e ON e.id = f.rowid "
            f"WHERE entries_fts MATCH ? AND {where} ORDER BY bm25(entries_fts) LIMIT ?",
            [" OR ".join(rare), *params, limit],
        )]
        if not candidates:
            return []
        scores = dict.fromkeys(candidates, 0.0)
        marks = ",".join("?" * len(candidates))
        for term in terms:
            frequency = frequencies[term]
            idf = math.log((total - frequency + 0.5) / (frequency + 0.5) + 1.0)
            for (row,) in db.execute(f"SELECT rowid FROM entries_fts WHERE entries_fts MATCH ? AND rowid IN ({marks})",
                                     [term, *candidates]):
                scores[row] += idf
        return tied_ranks(scores)

    def _document_frequency(self, term: str) -> int:
        """Entries containing the (quoted) term; cached for a while, since it changes slowly and counting a
        common term's entries costs milliseconds at 100k entries."""
        now = time.monotonic()
        cached = self._frequencies.get(term)
        if cached is not None and now - cached[1] < FREQUENCY_TTL_S:
            return cached[0]
        count = int(self._db().execute("SELECT COUNT(*) FROM entries_fts WHERE entries_fts MATCH ?",
                                       (term,)).fetchone()[0])
        if len(self._frequencies) >= 10_000:
            self._frequencies.clear()
        self._frequencies[term] = (count, now)
        return count

    def get(self, ids: Sequence[int]) -> dict[int, MemoryEntry]:
        if not ids:
            return {}
        rows = self._db().execute(
            f"SELECT {_COLUMNS} FROM entries e WHERE id IN ({','.join('?' * len(ids))})", list(ids)
        ).fetchall()
        return {row[0]: _entry(row) for row in rows}

    def document_chunks(self, document_id: str) -> list[MemoryEntry]:
        rows = self._db().execute(f"SELECT {_COLUMNS} FROM entries e WHERE document_id = ? ORDER BY id",
                                  (document_id,)).fetchall()
        return [_entry(row) for row in rows]

    def filtered_ids(self, filters: SearchFilters, limit: int) -> list[int]:
        where, params = _where(filters)
        return [r[0] for r in self._db().execute(
            f"SELECT id FROM entries e WHERE {where} ORDER BY wall_time DESC LIMIT ?", [*params, limit])]

    def documents(self, collection: str) -> list[dict[str, object]]:
        rows = self._db().execute(
            "SELECT document_id, COUNT(*), MIN(wall_time), MIN(meta) FROM entries "
            "WHERE kind = 'document' AND source = ? GROUP BY document_id ORDER BY MIN(id)", (collection,)).fetchall()
        return [{"id": r[0], "chunks": r[1], "created": r[2], "name": json.loads(r[3]).get("name")} for r in rows]

    def count(self) -> int:
        return int(self._db().execute("SELECT COUNT(*) FROM entries").fetchone()[0])


_COLUMNS = ("e.id, e.kind, e.text, e.source, e.session, e.media_time, e.wall_time, e.event_id, e.clip_id, "
            "e.labels, e.track_ids, e.document_id, e.meta")


def _entry(row: Sequence[object]) -> MemoryEntry:
    return MemoryEntry(
        id=int(row[0]), kind=str(row[1]), text=str(row[2]), source=str(row[3]), session=str(row[4]),
        media_time=row[5], wall_time=float(row[6]), event_id=row[7], clip_id=row[8],  # type: ignore[arg-type]
        labels=json.loads(str(row[9])), track_ids=json.loads(str(row[10])), document_id=row[11],  # type: ignore[arg-type]
        meta=json.loads(str(row[12])),
    )
