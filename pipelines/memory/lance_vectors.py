"""Entry vectors in embedded LanceDB tables (a directory in ``memory.data_dir``): the default vector index.

LanceDB searches in Rust (Arrow columns, SIMD distances): at 100k entries its IVF_FLAT index answers a top-50 in a
few ms here, where Milvus Lite 3 (pure Python) walked every row in Python per search (~140 ms). Why it was chosen
and how it was measured: docs/search.md. Blocking: call from the index's threads (one writer, readers beside it:
Lance versions every commit, so a search reads a consistent snapshot while the writer appends).

Two tables: the timeline's entries and chat documents' chunks. A search over every timeline kind (the default)
then needs no filter at all: a prefilter builds a row mask over the whole table, which cost more than the IVF
search itself at 100k rows (~8 ms of ~11). Only what filters need is copied next to each vector (kind, source,
session, wall time, document); the entry itself lives in the SQLite store, which can rebuild these tables."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

from pipelines.memory.entries import TIMELINE_KINDS, MemoryEntry, SearchFilters

log = logging.getLogger(__name__)

INDEX_MIN_ROWS = 5_000  # below this a flat search (every vector) is faster than training an index is worth
PARTITION_ROWS = 320  # ~sqrt(100k): 20 probes compare ~6% of the vectors at 100k entries
PROBES = 20  # IVF partitions searched (LanceDB's default)
OPTIMIZE_EVERY_WRITES = 64  # each write is a Lance fragment; compaction keeps searches from visiting hundreds
OPTIMIZE_EVERY_ROWS = 4_096  # rows not in the index yet are searched one by one
OLD_VERSIONS_KEPT = timedelta(minutes=1)  # a search in flight still reads the version it started on
# LanceDB's caches, bounded (its defaults: 1 GiB of metadata, 6 GiB of index). Every write is a new table version
# whose manifest and fragment metadata are cached and never evicted below the bound (~29 KB per write): the
# server grew by the bound and its allocator's overhead as sessions wrote (1 GiB: +60 MB over 1,000 soak
# sessions; 8 MiB: +9.7 MB anonymous over 260, still +3.3 MB per 100 at the end; 1 MiB: +3.7 MB, +0.5 per 100).
# Searches read only the live version: p50 7-10 ms at 2k and 12k rows with either bound.
METADATA_CACHE_BYTES = 1 << 20
INDEX_CACHE_BYTES = 256 << 20  # an IVF_FLAT index holds its vectors: ~1.5 KB a row, 100k rows ~150 MB


def _quote(value: str) -> str:
    """A SQL string literal for Lance's (DataFusion) filter expressions."""
    return "'" + value.replace("'", "''") + "'"


def lance_filter(filters: SearchFilters, kinds: Sequence[str] | None) -> str | None:
    """The filter expression, or None when nothing is filtered (``kinds`` None: every kind in the table)."""
    clauses = [f"kind IN ({', '.join(_quote(k) for k in kinds)})"] if kinds is not None else []
    return " AND ".join(clauses + filters.store_clauses(_quote, "=")) or None


class _VectorTable:
    """One LanceDB table and the upkeep of its IVF_FLAT index."""

    def __init__(self, db: Any, name: str, schema: Any) -> None:
        self._table = db.create_table(name, schema=schema, exist_ok=True)
        self._maintenance = threading.Lock()
        self._writes_since_optimize = self._rows_since_optimize = 0
        self._indexed_at_rows = self.count() if self.has_index() else 0

    def has_index(self) -> bool:
        return any("vector" in index.columns for index in self._table.list_indices())

    def count(self) -> int:
        return int(self._table.count_rows())

    def add(self, batch: Any) -> None:
        self._table.add(batch)
        with self._maintenance:
            self._writes_since_optimize += 1
            self._rows_since_optimize += batch.num_rows
            rows = self.count()
            if rows >= INDEX_MIN_ROWS and rows >= 2 * self._indexed_at_rows:
                self._train(rows)
            elif (self._writes_since_optimize >= OPTIMIZE_EVERY_WRITES
                  or self._rows_since_optimize >= OPTIMIZE_EVERY_ROWS):
                # Compacts fragments, adds new rows to the index (splitting partitions past PARTITION_ROWS),
                # and deletes old versions.
                self._table.optimize(cleanup_older_than=OLD_VERSIONS_KEPT)
                self._writes_since_optimize = self._rows_since_optimize = 0

    def _train(self, rows: int) -> None:
        """(Re)train once the table is big enough, and again when it has doubled (centroids drift)."""
        from lancedb.index import IvfFlat

        # LanceDB's default partitions hold ~4k rows: 20 probes of 24 at 100k rows is nearly a flat search.
        config = IvfFlat(distance_type="dot", target_partition_size=PARTITION_ROWS)
        self._table.create_index("vector", config=config, replace=True)
        self._indexed_at_rows = rows
        self._writes_since_optimize = self._rows_since_optimize = 0
        log.info("memory: vector index (IVF_FLAT) trained on %d entries", rows)

    def search(self, vector: np.ndarray, where: str | None, limit: int) -> list[tuple[int, float]]:
        """(id, distance) of the nearest rows passing ``where``, nearest first. The IVF index probes ``PROBES``
        partitions; when a selective filter leaves fewer than ``limit`` rows in them, the search goes on through
        more partitions until it has them (``maximum_nprobes(0)``: unbounded)."""
        def run(unbounded: bool) -> list[tuple[int, float]]:
            query = self._table.search(vector, vector_column_name="vector").distance_type("dot")
            if where is not None:
                query = query.where(where, prefilter=True)
            query = query.minimum_nprobes(PROBES).maximum_nprobes(0) if unbounded else query.nprobes(PROBES)
            found = query.select(["id", "_distance"]).limit(limit).to_arrow()  # no _distance: a warning per query
            return list(zip(found["id"].to_pylist(), found["_distance"].to_pylist(), strict=True))

        hits = run(unbounded=False)
        if len(hits) < limit and where is not None and self._indexed_at_rows:
            hits = run(unbounded=True)
        return hits

    def delete(self, ids: Sequence[int]) -> None:
        self._table.delete(f"id IN ({', '.join(str(int(i)) for i in ids)})")


class LanceVectors:
    def __init__(self, path: Path, table: str, dimension: int, *, metadata_cache_bytes: int = METADATA_CACHE_BYTES,
                 index_cache_bytes: int = INDEX_CACHE_BYTES) -> None:
        # LanceDB's Rust logger (read once, at import) warns on stderr at every optimize() that splits partitions
        # ("partition index is N but the number of partitions is M"): harmless, and not Vigil's log format.
        os.environ.setdefault("LANCEDB_LOG", "error")
        import lancedb  # deferred: only a server that uses its memory pays for the import
        import pyarrow as pa

        self.path, self.dimension = Path(path), dimension
        self._schema = pa.schema([
            pa.field("id", pa.int64()), pa.field("vector", pa.list_(pa.float32(), dimension)),
            pa.field("kind", pa.string()), pa.field("source", pa.string()), pa.field("session", pa.string()),
            pa.field("document_id", pa.string()), pa.field("wall_time", pa.float64()),
        ])
        self.cache = lancedb.Session(index_cache_size_bytes=index_cache_bytes,
                                     metadata_cache_size_bytes=metadata_cache_bytes)
        self._db = lancedb.connect(str(self.path), session=self.cache)
        self._timeline = _VectorTable(self._db, table, self._schema)
        self._documents = _VectorTable(self._db, f"{table}_documents", self._schema)

    def _has_index(self) -> bool:
        return self._timeline.has_index()

    def count(self) -> int:
        return self._timeline.count() + self._documents.count()

    def add(self, entries: Sequence[MemoryEntry], vectors: np.ndarray) -> None:
        import pyarrow as pa

        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        for table, rows in ((self._timeline, [i for i, e in enumerate(entries) if e.kind != "document"]),
                            (self._documents, [i for i, e in enumerate(entries) if e.kind == "document"])):
            if not rows:
                continue
            chosen = [entries[i] for i in rows]
            table.add(pa.table({
                "id": pa.array([e.id for e in chosen], pa.int64()),
                "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors[rows].ravel()), self.dimension),
                "kind": [e.kind for e in chosen], "source": [e.source for e in chosen],
                "session": [e.session for e in chosen], "document_id": [e.document_id or "" for e in chosen],
                "wall_time": pa.array([float(e.wall_time) for e in chosen], pa.float64()),
            }, schema=self._schema))

    def search(self, vector: np.ndarray, filters: SearchFilters, limit: int) -> list[int]:
        """Ids of the nearest vectors (inner product: cosine on unit vectors) that pass the filters, nearest
        first; filters are applied before the nearest are taken."""
        vector = np.asarray(vector, dtype=np.float32)
        timeline_kinds = [k for k in filters.kinds if k != "document"]
        hits: list[tuple[int, float]] = []
        if timeline_kinds:
            every_kind = set(timeline_kinds) >= set(TIMELINE_KINDS)
            hits += self._timeline.search(vector, lance_filter(filters, None if every_kind else timeline_kinds),
                                          limit)
        if "document" in filters.kinds:
            hits += self._documents.search(vector, lance_filter(filters, None), limit)
            hits.sort(key=lambda hit: hit[1])
        return [int(entry_id) for entry_id, _ in hits[:limit]]

    def delete(self, ids: Sequence[int]) -> None:
        if ids:
            self._timeline.delete(ids)
            self._documents.delete(ids)

    def close(self) -> None:
        self._timeline = self._documents = self._db = self.cache = None  # type: ignore[assignment]
