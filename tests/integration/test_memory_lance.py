"""The embedded vector index (LanceDB) on its own, past the size where it trains its IVF index: filtered search
finds every match of a selective filter, deletes stick, and a reopened table keeps its vectors and index.
Random unit vectors stand in for embeddings (no model needed to test the engine)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipelines.memory.entries import MemoryEntry, SearchFilters
from pipelines.memory.lance_vectors import INDEX_MIN_ROWS, LanceVectors

DIM = 384


def _corpus(count: int) -> tuple[list[MemoryEntry], np.ndarray]:
    rng = np.random.default_rng(5)
    vectors = rng.standard_normal((count, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    entries = []
    for i in range(count):
        session = "rare" if i % 2000 == 7 else f"cam{i % 300}"  # "rare": 6 rows scattered over the partitions
        kind = "scene" if i % 10 == 0 else "event"
        entries.append(MemoryEntry(kind, f"entry {i}", session, session, None, 1000.0 + i, id=i + 1))
    return entries, vectors


def test_indexed_search_filters_deletes_and_reopens(tmp_path: Path):
    # Trained at 5,000 rows, retrained at 10,000 into ~31 partitions: 20 probes miss some.
    entries, vectors = _corpus(2 * INDEX_MIN_ROWS + 2000)
    index = LanceVectors(tmp_path / "vectors.lance", "vigil_memory", DIM)
    for start in range(0, len(entries), 500):
        index.add(entries[start:start + 500], vectors[start:start + 500])
    assert index.count() == len(entries) and index._has_index()

    everything = SearchFilters()
    assert index.search(vectors[1234], everything, 10)[0] == 1235  # itself first (ids are 1-based)
    # Six rows in scattered partitions: the search probes past its 20 partitions until it has them all.
    rare = [e.id for e in entries if e.session == "rare"]
    assert len(rare) == 6
    assert sorted(index.search(vectors[0], SearchFilters(session="rare"), 10)) == rare
    scenes = index.search(vectors[40], SearchFilters(kinds=("scene",)), 20)
    assert scenes[0] == 41 and all((i - 1) % 10 == 0 for i in scenes)
    assert index.search(vectors[1234], SearchFilters(until=1000.0 + 1233), 5)[0] != 1235  # after `until`
    assert index.search(vectors[1234], SearchFilters(since=1000.0 + 1234, until=1000.0 + 1234), 5) == [1235]

    index.delete([1235, *rare[:1]])
    assert index.count() == len(entries) - 2
    assert 1235 not in index.search(vectors[1234], everything, 10)
    assert sorted(index.search(vectors[0], SearchFilters(session="rare"), 10)) == rare[1:]
    index.close()

    reopened = LanceVectors(tmp_path / "vectors.lance", "vigil_memory", DIM)
    assert reopened.count() == len(entries) - 2 and reopened._has_index()
    assert reopened.search(vectors[2345], everything, 3)[0] == 2346
    reopened.close()


def test_a_small_table_is_searched_without_an_index(tmp_path: Path):
    entries, vectors = _corpus(50)
    index = LanceVectors(tmp_path / "vectors.lance", "vigil_memory", DIM)
    index.add(entries, vectors)
    assert not index._has_index()
    assert index.search(vectors[17], SearchFilters(), 5)[0] == 18
    assert index.search(vectors[7], SearchFilters(session="rare"), 5) == [8]
    quoted = SearchFilters(source="it's \"odd\"")  # a value with quotes is a literal, not SQL
    assert index.search(vectors[7], quoted, 5) == []


def test_document_chunks_and_timeline_entries_are_searched_apart_and_together(tmp_path: Path):
    entries, vectors = _corpus(40)
    for entry in entries[:10]:  # ids 1..10 become document chunks (their own table)
        entry.kind, entry.source, entry.document_id = "document", "handbook", "doc-1"
    index = LanceVectors(tmp_path / "vectors.lance", "vigil_memory", DIM)
    index.add(entries, vectors)
    assert index.count() == 40
    assert index.search(vectors[3], SearchFilters(), 5)[0] > 10  # timeline kinds only: no chunk
    assert index.search(vectors[3], SearchFilters(kinds=("document",)), 5)[0] == 4
    chunks = index.search(vectors[3], SearchFilters(kinds=("document",), document_id="doc-1"), 40)
    assert set(chunks) == set(range(1, 11))
    both = index.search(vectors[30], SearchFilters(kinds=("event", "scene", "document")), 40)
    assert both[0] == 31 and set(both) == set(range(1, 41))  # the _corpus's kinds are event and scene
    index.delete([4, 31])
    assert 4 not in index.search(vectors[3], SearchFilters(kinds=("document",)), 5) and index.count() == 38


def test_lancedb_caches_stay_within_their_bound_over_many_writes(tmp_path: Path):
    # Every write is a new table version; LanceDB cached each version's metadata (~29 KB) up to its default 1 GiB:
    # the server's RSS grew with every session that wrote to memory.
    entries, vectors = _corpus(300)
    bound = 1 << 20
    index = LanceVectors(tmp_path / "vectors.lance", "vigil_memory", DIM, metadata_cache_bytes=bound)
    for start in range(0, len(entries), 2):  # 150 writes, two optimize() passes
        index.add(entries[start:start + 2], vectors[start:start + 2])
        index.search(vectors[start], SearchFilters(), 5)
    assert index.count() == len(entries)
    assert index.cache.size_bytes <= bound + (64 << 10)  # the index cache stays empty below INDEX_MIN_ROWS
    index.close()
