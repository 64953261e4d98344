"""Entry vectors in an embedded LanceDB table (a directory in ``memory.data_dir``): the default vector index.

LanceDB searches in Rust (Arrow columns, SIMD distances): at 100k entries an IVF_FLAT index answers a filtered
top-50 in ~10-20 ms here, where Milvus Lite 3 (pure Python) walked every row in Python per search (~140 ms). Why it
was chosen and how it was measured: docs/search.md. Blocking: call from the index's threads (one writer, readers
beside it: Lance versions every commit, so a search reads a consistent snapshot while the writer appends).

Only what filters need is copied next to each vector (kind, source, session, wall time, document); the entry
itself lives in the SQLite store, which can rebuild this table."""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

import numpy as np

from pipelines.memory.entries import MemoryEntry, SearchFilters

log = logging.getLogger(__name__)

INDEX_MIN_ROWS = 5_000  # below this a flat search (every vector) is faster than training an index is worth
PROBES = 20  # IVF partitions searched at least (LanceDB's default), of about sqrt(rows)
OPTIMIZE_EVERY_WRITES = 64  # each write is a Lance fragment; compaction keeps searches from visiting hundreds
OPTIMIZE_EVERY_ROWS = 4_096  # rows not in the index yet are searched one by one
OLD_VERSIONS_KEPT = timedelta(minutes=1)  # a search in flight still reads the version it started on


def _quote(value: str) -> str:
    """A SQL string literal for Lance's (DataFusion) filter expressions."""
    return "'" + value.replace("'", "''") + "'"


def lance_filter(filters: SearchFilters) -> str:
    clauses = [f"kind IN ({', '.join(_quote(k) for k in filters.kinds)})"]
    for field, value in (("source", filters.source), ("session", filters.session),
                         ("document_id", filters.document_id)):
        if value is not None:
            clauses.append(f"{field} = {_quote(value)}")
    if filters.since is not None:
        clauses.append(f"wall_time >= {float(filters.since)!r}")
    if filters.until is not None:
        clauses.append(f"wall_time <= {float(filters.until)!r}")
    return " AND ".join(clauses)


class LanceVectors:
    def __init__(self, path: Path, table: str, dimension: int) -> None:
        import lancedb  # deferred: only a server that uses its memory pays for the import
        import pyarrow as pa

        self.path, self.dimension = Path(path), dimension
        self._schema = pa.schema([
            pa.field("id", pa.int64()), pa.field("vector", pa.list_(pa.float32(), dimension)),
            pa.field("kind", pa.string()), pa.field("source", pa.string()), pa.field("session", pa.string()),
            pa.field("document_id", pa.string()), pa.field("wall_time", pa.float64()),
        ])
        self._db = lancedb.connect(str(self.path))
        self._table = self._db.create_table(table, schema=self._schema, exist_ok=True)
        self._maintenance = threading.Lock()
        self._writes_since_optimize = self._rows_since_optimize = 0
        self._indexed_at_rows = self._table.count_rows() if self._has_index() else 0

    def _has_index(self) -> bool:
        return any("vector" in index.columns for index in self._table.list_indices())

    def count(self) -> int:
        return int(self._table.count_rows())

    def add(self, entries: Sequence[MemoryEntry], vectors: np.ndarray) -> None:
        import pyarrow as pa

        if not entries:
            return
        flat = pa.array(np.ascontiguousarray(vectors, dtype=np.float32).ravel())
        batch = pa.table({
            "id": pa.array([e.id for e in entries], pa.int64()),
            "vector": pa.FixedSizeListArray.from_arrays(flat, self.dimension),
            "kind": [e.kind for e in entries], "source": [e.source for e in entries],
            "session": [e.session for e in entries], "document_id": [e.document_id or "" for e in entries],
            "wall_time": pa.array([float(e.wall_time) for e in entries], pa.float64()),
        }, schema=self._schema)
        self._table.add(batch)
        self._maintain(len(entries))

    def _maintain(self, added: int) -> None:
        """Train the IVF index once the table is big enough, retrain it when the table doubled (its partitions
        were cut for fewer rows), and compact every so often (which also adds new rows to the index)."""
        with self._maintenance:
            self._writes_since_optimize += 1
            self._rows_since_optimize += added
            rows = self.count()
            if rows >= INDEX_MIN_ROWS and rows >= 2 * self._indexed_at_rows:
                from lancedb.index import IvfFlat

                # ~sqrt(rows) partitions (LanceDB's default cuts ~4k-row partitions: 20 probes of 24 at 100k
                # rows is nearly a flat search); 20 probes then compare ~6% of the vectors.
                partitions = max(8, math.isqrt(rows))
                self._table.create_index("vector", config=IvfFlat(distance_type="dot", num_partitions=partitions),
                                         replace=True)
                self._indexed_at_rows = rows
                self._writes_since_optimize = self._rows_since_optimize = 0
                log.info("memory: vector index (IVF_FLAT) trained on %d entries", rows)
            elif (self._writes_since_optimize >= OPTIMIZE_EVERY_WRITES
                  or self._rows_since_optimize >= OPTIMIZE_EVERY_ROWS):
                self._table.optimize(cleanup_older_than=OLD_VERSIONS_KEPT)
                self._writes_since_optimize = self._rows_since_optimize = 0

    def search(self, vector: np.ndarray, filters: SearchFilters, limit: int) -> list[int]:
        """Ids of the nearest vectors (inner product: cosine on unit vectors) that pass the filters, nearest
        first. The filter is applied first; the IVF index probes the ``PROBES`` nearest partitions, and more
        (``maximum_nprobes(0)``: no bound) while a selective filter leaves fewer than ``limit`` rows there."""
        query = (self._table.search(np.asarray(vector, dtype=np.float32), vector_column_name="vector")
                 .distance_type("dot").where(lance_filter(filters), prefilter=True)
                 .minimum_nprobes(PROBES).maximum_nprobes(0)
                 .select(["id", "_distance"]).limit(limit))  # _distance: selecting without it logs a warning
        return [int(i) for i in query.to_arrow()["id"].to_pylist()]

    def delete(self, ids: Sequence[int]) -> None:
        if ids:
            self._table.delete(f"id IN ({', '.join(str(int(i)) for i in ids)})")

    def close(self) -> None:
        self._table = self._db = None  # type: ignore[assignment]
