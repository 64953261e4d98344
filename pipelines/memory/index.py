"""``MemoryIndex``: the one ingestion interface (``add``) and hybrid search over what sessions saw and heard.

Ingestion never blocks the caller: ``add`` puts entries on a bounded queue (a full queue refuses and counts
them), one task takes them in batches and a writer thread stores each batch in SQLite first (the record: nothing
stored is lost), then embeds it and adds the vectors. Entries whose vectors never made it (a crash in between)
are embedded again when the index next opens. Models and the vector index load lazily, on the first entry or
search, so a server that never uses its memory never pays for torch.

Search: keyword (SQLite FTS5, BM25) and vector (MiniLM + LanceDB, or a Milvus server) candidates under the same
filters, fused by reciprocal rank: score = sum over the lists an entry is in of 1 / (rrf_k + rank). Searches run on
their own threads (``search_workers``); at most ``search_queue_max`` more wait for one, and a search beyond that is
refused at once (``server_busy``, with Retry-After) instead of queueing for seconds behind the others.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal, Protocol, TypeVar

import numpy as np
from prometheus_client import Counter, Gauge, Histogram

from models.embeddings import TextEmbedder
from pipelines.errors import ApiError
from pipelines.memory.entries import MemoryEntry, SearchFilters, SearchHit
from pipelines.memory.store import EntryStore

log = logging.getLogger(__name__)

SearchMode = Literal["hybrid", "keyword", "vector"]
T = TypeVar("T")

ENTRIES = Counter("vigil_memory_entries_total", "Entries indexed in memory, by kind.", ["kind"])
DROPPED = Counter("vigil_memory_dropped_total", "Entries refused because the memory's queue was full.")
FAILED = Counter("vigil_memory_failed_total", "Entries whose embedding or vector write failed (retried on open).")
QUEUED = Gauge("vigil_memory_queue_entries", "Entries waiting to be embedded.")
SHED = Counter("vigil_memory_searches_shed_total", "Searches refused (server_busy) because every search thread "
               "was busy and the wait queue was full.")
SEARCHES = Gauge("vigil_memory_searches_in_flight", "Searches running or waiting for a search thread.")
SEARCH_MS = Histogram("vigil_memory_search_ms", "Memory search time (embedding the query included), ms.",
                      ["mode"], buckets=(2, 5, 10, 20, 35, 50, 75, 100, 200, 500, 1000, 2500))


class VectorIndex(Protocol):
    def add(self, entries: Sequence[MemoryEntry], vectors: np.ndarray) -> None: ...
    def search(self, vector: np.ndarray, filters: SearchFilters, limit: int) -> list[int]: ...
    def delete(self, ids: Sequence[int]) -> None: ...
    def count(self) -> int: ...
    def close(self) -> None: ...


FORGOTTEN_MAX = 10_000  # timeline entries deleted recently, remembered so a still-queued copy is not indexed


def reciprocal_rank_fusion(rankings: Sequence[Sequence[tuple[int, float]]],
                           k: int) -> list[tuple[int, float, list[float | None]]]:
    """Each ranking is (id, 1-based rank), best first (tied entries may share a rank). Returns (id, score, rank in
    each list or None), best first: score = sum of 1 / (k + rank)."""
    scores: dict[int, float] = {}
    ranks: dict[int, list[float | None]] = {}
    for list_index, ranking in enumerate(rankings):
        for entry_id, rank in ranking:
            scores[entry_id] = scores.get(entry_id, 0.0) + 1.0 / (k + rank)
            ranks.setdefault(entry_id, [None] * len(rankings))[list_index] = rank
    ordered = sorted(scores, key=lambda i: (-scores[i], i))
    return [(i, scores[i], ranks[i]) for i in ordered]


class MemoryIndex:
    def __init__(
        self,
        data_dir: Path,
        embedder: Callable[[], TextEmbedder],
        vectors: Callable[[int], VectorIndex],
        *,
        queue_max: int = 10_000,
        batch_max: int = 64,
        candidates: int = 50,
        rrf_k: int = 60,
        search_workers: int = 2,
        search_queue_max: int = 8,
        search_retry_after_s: float = 1.0,
    ) -> None:
        """``embedder`` and ``vectors`` (given the embedding dimension) are factories, called on first use."""
        self.data_dir = Path(data_dir)
        self._embedder_factory, self._vectors_factory = embedder, vectors
        self._batch_max, self.candidates, self.rrf_k = batch_max, candidates, rrf_k
        self._queue: asyncio.Queue[MemoryEntry] = asyncio.Queue(queue_max)
        self._writer = ThreadPoolExecutor(1, "memory-write")
        self._readers = ThreadPoolExecutor(2, "memory-read")  # documents and counts (short SQLite reads)
        # Searches have their own threads, so a burst of them never waits behind (or delays) anything else.
        self._searchers = ThreadPoolExecutor(search_workers, "memory-search")
        self._keyword_pool = ThreadPoolExecutor(search_workers, "memory-keyword")  # beside a search embedding
        self.search_capacity = search_workers + search_queue_max  # running + waiting; more are refused
        self.search_retry_after_s = search_retry_after_s
        self.searches_in_flight = 0  # event loop only
        self._open_lock = threading.Lock()  # held while the models load (seconds)
        self._store_lock = threading.Lock()  # only while SQLite opens: deleting never waits for a model
        self._store: EntryStore | None = None
        self._embedder: TextEmbedder | None = None
        self._vectors: VectorIndex | None = None
        self._worker: asyncio.Task[None] | None = None
        self._forgotten: OrderedDict[str, None] = OrderedDict()  # event ids (any thread; under _forget_lock)
        # New versions of entries (rewrite_events): a copy still queued with the old text is swapped for it.
        self._rewritten: OrderedDict[str, MemoryEntry] = OrderedDict()  # by event id; under _forget_lock
        self._forget_lock = threading.Lock()
        # While catching up, live entries newer than the catch-up's position must not move the timeline mark
        # past entries it has not indexed yet: only the catch-up moves it.
        self._catching_up = False
        self.dropped = 0
        # Documents indexed while the client waits, written together when several wait (see add_now).
        self._waiting_documents: deque[tuple[list[MemoryEntry], asyncio.Future[list[int]]]] = deque()
        self._documents_writer: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        if self._worker is None:
            self._worker = asyncio.create_task(self._drain(), name="memory:ingest")

    async def open(self) -> None:
        """Load the embedder and open the stores now (off the event loop), not on the first entry."""
        await asyncio.get_running_loop().run_in_executor(self._writer, self._open)

    async def use_embedder_for_test(self, wrap: Callable[[TextEmbedder], TextEmbedder]) -> None:
        """Test seam: open the index, then embed with ``wrap(the loaded embedder)`` (e.g. a HeldModelForTest)."""
        await self.open()
        with self._open_lock:
            assert self._embedder is not None
            self._embedder = wrap(self._embedder)

    @property
    def opened(self) -> bool:
        return self._embedder is not None and self._vectors is not None

    async def close(self) -> None:
        """Index what was accepted, then release the store, the vector index and the threads."""
        if self._worker is not None:
            try:
                await asyncio.wait_for(self._queue.join(), timeout=30.0)
            except TimeoutError:
                log.warning("memory: %d entries not indexed at shutdown", self._queue.qsize())
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
            self._worker = None
        # Searches and reads still running (their callers cancelled) finish before the store closes: a SQLite
        # connection closed under a running query crashes the process.
        for pool in (self._readers, self._searchers, self._keyword_pool):
            await asyncio.to_thread(pool.shutdown, True)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._writer, self._release)
        self._writer.shutdown(wait=False)

    def _release(self) -> None:
        with self._open_lock, self._store_lock:
            if self._vectors is not None:
                self._vectors.close()
            if self._store is not None:
                self._store.close()
            self._vectors = self._store = None

    def _open_store(self) -> EntryStore:
        """The SQLite store alone (no model): what deleting needs."""
        with self._store_lock:
            if self._store is None:
                self.data_dir.mkdir(parents=True, exist_ok=True)
                self._store = EntryStore(self.data_dir / "entries.sqlite3")
            return self._store

    def _open(self) -> tuple[EntryStore, TextEmbedder, VectorIndex]:
        store = self._open_store()
        with self._open_lock:
            if self._embedder is None or self._vectors is None:
                started = time.perf_counter()
                embedder = self._embedder or self._embedder_factory()
                self._vectors = self._vectors_factory(embedder.dimension)
                self._embedder = embedder
                log.info("memory opened in %.1f s: %d entries in %s", time.perf_counter() - started, store.count(),
                         self.data_dir)
                if self._vectors.count() == 0 and store.count():
                    # A new or lost vector index (e.g. moved to another engine): rebuild it from the record.
                    store.mark_all_unindexed()
                self._reindex(store, embedder, self._vectors)
            return store, self._embedder, self._vectors

    def _reindex(self, store: EntryStore, embedder: TextEmbedder, vectors: VectorIndex) -> None:
        while batch := store.unindexed(self._batch_max):
            ids = [e.id for e in batch if e.id is not None]
            vectors.delete(ids)  # a crash after the vector write but before mark_indexed: no duplicates
            vectors.add(batch, embedder.embed([e.text for e in batch]))
            store.mark_indexed(ids)
            log.info("memory: embedded %d entries that had no vector", len(batch))

    # ------------------------------------------------------------------ ingestion

    def add(self, entries: Sequence[MemoryEntry]) -> int:
        """Queue entries for indexing without waiting; returns how many were accepted (the rest are counted)."""
        accepted = 0
        for entry in entries:
            if not entry.text.strip():
                continue
            try:
                self._queue.put_nowait(entry)
            except asyncio.QueueFull:
                self.dropped += 1
                DROPPED.inc()
                if self.dropped == 1 or self.dropped % 1000 == 0:
                    log.error("memory queue full (%d entries): %d entries refused so far", self._queue.maxsize,
                              self.dropped)
                continue
            accepted += 1
        QUEUED.set(self._queue.qsize())
        return accepted

    async def add_now(self, entries: Sequence[MemoryEntry]) -> list[int]:
        """Index entries before returning (documents: the client waits for its upload to be searchable). Calls
        that wait at the same time for entries with no timeline event (documents) are written together: one
        embedding batch and one vector write for many small documents instead of one each."""
        entries = list(entries)
        loop = asyncio.get_running_loop()
        if any(e.event_id is not None for e in entries):  # may be filtered in _write: ids no longer line up
            return await loop.run_in_executor(self._writer, self._write, entries)
        done: asyncio.Future[list[int]] = loop.create_future()
        self._waiting_documents.append((entries, done))
        if self._documents_writer is None or self._documents_writer.done():
            self._documents_writer = asyncio.create_task(self._write_waiting_documents(), name="memory:documents")
        return await done

    async def _write_waiting_documents(self) -> None:
        loop = asyncio.get_running_loop()
        waiting = self._waiting_documents
        while waiting:
            group: list[tuple[list[MemoryEntry], asyncio.Future[list[int]]]] = []
            while waiting and (not group or sum(len(e) for e, _ in group) + len(waiting[0][0]) <= self._batch_max):
                group.append(waiting.popleft())
            together = [entry for entries, _ in group for entry in entries]
            try:
                ids = await loop.run_in_executor(self._writer, self._write, together)
            except Exception as error:  # each waiting client gets the error (records are repaired on next open)
                for _, done in group:
                    if not done.done():
                        done.set_exception(error)
                continue
            start = 0
            for entries, done in group:  # no event ids: _write keeps every entry, ids in order
                if not done.done():
                    done.set_result(ids[start:start + len(entries)])
                start += len(entries)

    async def flush(self) -> None:
        """Wait until everything queued so far is indexed (and vectors of deleted entries are gone)."""
        await self._queue.join()
        await asyncio.get_running_loop().run_in_executor(self._writer, lambda: None)  # the writer is one thread

    async def counts(self) -> tuple[int, int]:
        """(entries stored, vectors indexed)."""
        def count() -> tuple[int, int]:
            store, _, vectors = self._open()
            return store.count(), vectors.count()

        return await asyncio.get_running_loop().run_in_executor(self._readers, count)

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._queue.get()]
            while len(batch) < self._batch_max and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            try:
                await loop.run_in_executor(self._writer, self._write, batch)
            except Exception:
                log.exception("memory: indexing %d entries failed", len(batch))
            finally:
                for _ in batch:
                    self._queue.task_done()
                QUEUED.set(self._queue.qsize())

    def _current(self, entries: list[MemoryEntry]) -> list[MemoryEntry]:
        """Entries as they are to be stored now (under ``_forget_lock``): forgotten ones dropped, rewritten ones
        in their new version."""
        return [dataclasses.replace(self._rewritten[e.event_id]) if e.event_id in self._rewritten else e
                for e in entries if e.event_id is None or e.event_id not in self._forgotten]

    def _write(self, entries: list[MemoryEntry]) -> list[int]:
        with self._forget_lock:
            entries = self._current(entries)
        if not entries:
            return []
        store, embedder, vectors = self._open()
        # Checked again and stored under the lock: an entry forgotten or rewritten meanwhile (forget_events,
        # rewrite_events, on other threads) is never stored as it was.
        with self._forget_lock:
            entries = self._current(entries)
            # Idempotent: a timeline entry reaches memory once, by the live feed or by catching up after a crash.
            stored = store.stored_events([e.event_id for e in entries if e.event_id is not None])
            if stored:
                if not self._catching_up:
                    store.advance_timeline_seq(max((e.timeline_seq or 0 for e in entries), default=0))
                entries = [e for e in entries if e.event_id not in stored]
            if not entries:
                return []
            # The record first: a failure below is repaired on the next open.
            ids = store.add(entries, advance=not self._catching_up)
        try:
            vectors.add(entries, embedder.embed([e.text for e in entries]))
        except Exception:
            FAILED.inc(len(entries))
            raise
        store.mark_indexed(ids)
        for entry in entries:
            ENTRIES.labels(kind=entry.kind).inc()
        return ids

    # ------------------------------------------------------------------ catching up with the timeline

    async def catch_up(self, read_after: Callable[[int, int], Sequence[T]],
                       select: Callable[[Sequence[T], Callable[[str], str | None]], tuple[list[MemoryEntry], int]],
                       batch: int = 500) -> int:
        """Index what the timeline committed that memory never got (the process died with entries still queued
        here, or memory was off): ``read_after(seq, limit)`` gives timeline entries after ``seq`` in commit order;
        ``select(entries, last_scene)`` maps them as the live feed does (``last_scene(source)``: the scene text
        memory holds last) and says the last seq it looked at. From the mark the store keeps (``timeline_seq``);
        idempotent (entries already held are skipped). Returns how many were indexed."""
        def step(after: int) -> tuple[list[MemoryEntry], int] | None:
            found = read_after(after, batch)
            return select(found, self._open_store().last_scene) if found else None

        loop = asyncio.get_running_loop()
        after = await loop.run_in_executor(self._writer, lambda: self._open_store().timeline_seq())
        indexed = 0
        self._catching_up = True
        try:
            # On the writer thread, as _release is: a cancelled catch-up's step still running on another thread
            # used a SQLite connection that close() closed under it (a segfault at shutdown).
            while (selected := await loop.run_in_executor(self._writer, step, after)) is not None:
                entries, after = selected
                indexed += len(await self.add_now(entries)) if entries else 0
                await loop.run_in_executor(self._writer, self._open_store().advance_timeline_seq, after)
        finally:
            self._catching_up = False
        if indexed:
            log.info("memory: indexed %d timeline entries it had missed (a crash, or memory was off)", indexed)
        return indexed

    # ------------------------------------------------------------------ search

    async def search(self, query: str, filters: SearchFilters, limit: int = 10, mode: SearchMode = "hybrid",
                     timings: dict[str, float] | None = None, *, shed: bool = True) -> list[SearchHit]:
        """Raises ``ApiError("server_busy")`` when ``search_capacity`` searches are already running or waiting
        (``shed=False``: wait anyway, for callers that bound their own wait, e.g. the voice loop's recall)."""
        if shed and self.searches_in_flight >= self.search_capacity:
            SHED.inc()
            raise ApiError("server_busy", f"{self.searches_in_flight} searches are running or waiting; retry "
                           "shortly", retry_after_s=self.search_retry_after_s)
        self.searches_in_flight += 1  # counted before the first await: a parallel burst cannot overshoot
        SEARCHES.set(self.searches_in_flight)
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        try:
            hits = await loop.run_in_executor(self._searchers, self.search_blocking, query, filters, limit, mode,
                                              timings)
        finally:
            self.searches_in_flight -= 1
            SEARCHES.set(self.searches_in_flight)
        SEARCH_MS.labels(mode=mode).observe((time.perf_counter() - started) * 1000.0)
        return hits

    def search_blocking(self, query: str, filters: SearchFilters, limit: int, mode: SearchMode = "hybrid",
                        timings: dict[str, float] | None = None) -> list[SearchHit]:
        """``timings`` (when given) receives each step's milliseconds: keyword, embed, vector, fetch. In hybrid
        mode the keyword search (SQLite) runs on its own thread while the query is embedded (torch): both release
        the GIL, so on two idle cores the keyword step costs no wall time."""
        store, embedder, vectors = self._open()
        depth = max(self.candidates, limit)
        steps: dict[str, float] = {}

        def timed(step: str, started: float) -> None:
            steps[step] = round((time.perf_counter() - started) * 1000.0, 2)

        def keyword_search() -> list[tuple[int, float]]:
            started = time.perf_counter()
            found = store.keyword_search(query, filters, depth)
            timed("keyword", started)
            return found

        keyword: list[tuple[int, float]] = []
        vector: list[tuple[int, float]] = []
        pending = self._keyword_pool.submit(keyword_search) if mode == "hybrid" else None
        if mode == "keyword":
            keyword = keyword_search()
        if mode != "keyword":
            started = time.perf_counter()
            query_vector = embedder.embed([query])[0]
            timed("embed", started)
            started = time.perf_counter()
            vector = [(i, rank) for rank, i in enumerate(vectors.search(query_vector, filters, depth), start=1)]
            timed("vector", started)
        if pending is not None:
            keyword = pending.result()
        fused = reciprocal_rank_fusion([keyword, vector], self.rrf_k)[:limit]
        started = time.perf_counter()
        entries = store.get([entry_id for entry_id, _, _ in fused])
        timed("fetch", started)
        if timings is not None:
            timings.update(steps)
        return [SearchHit(entries[i], round(score, 6), ranks[0], ranks[1]) for i, score, ranks in fused
                if i in entries]

    def forget_events(self, event_ids: Iterable[str]) -> int:
        """Remove the entries of deleted timeline entries (blocking; any thread: the timeline calls it when an
        entry is deleted or expires). The record goes at once, so searches stop returning them; the vectors go on
        the writer thread. Returns how many entries were removed."""
        event_ids = list(event_ids)
        if not event_ids:
            return 0
        with self._forget_lock:  # an entry still queued for indexing is dropped when its batch is written
            for event_id in event_ids:
                self._forgotten[event_id] = None
                self._forgotten.move_to_end(event_id)
            while len(self._forgotten) > FORGOTTEN_MAX:
                self._forgotten.popitem(last=False)
        ids = self._open_store().delete_events(event_ids)
        if ids:
            try:
                self._writer.submit(self._delete_vectors, ids)
            except RuntimeError:  # shut down: the vectors of rows no longer stored are never returned anyway
                pass
        return len(ids)

    def rewrite_events(self, entries: Sequence[MemoryEntry]) -> int:
        """Replace what memory holds for these timeline entries with these versions (their text changed: a
        deleted person's name taken out). Blocking; any thread. The old rows and their keyword index go at once,
        so no search returns the old text (a vector search's old ids no longer name a row); the new ones are
        found by keyword at once and by vector once embedded, on the writer thread, which also deletes the old
        vectors and purges the old words from the keyword index. A copy still queued with the old text is
        swapped for the new version. Returns how many entries were replaced."""
        by_event = {e.event_id: e for e in entries if e.event_id is not None}
        if not by_event:
            return 0
        with self._forget_lock:
            for event_id, entry in by_event.items():
                self._rewritten[event_id] = entry
                self._rewritten.move_to_end(event_id)
            while len(self._rewritten) > FORGOTTEN_MAX:
                self._rewritten.popitem(last=False)
            replaced = self._open_store().replace_events([dataclasses.replace(e) for e in by_event.values()])
        if replaced:
            try:
                self._writer.submit(self._reembed, replaced)
            except RuntimeError:  # shut down: the next open embeds the new rows (indexed 0)
                pass
        return len(replaced)

    def _reembed(self, replaced: list[int]) -> None:
        try:
            store, embedder, vectors = self._open()
            vectors.delete(replaced)
            self._reindex(store, embedder, vectors)
            store.purge_deleted_text()
        except Exception:
            log.exception("memory: re-embedding %d rewritten entries failed", len(replaced))

    def _delete_vectors(self, ids: list[int]) -> None:
        try:
            self._open()[2].delete(ids)
        except Exception:
            log.exception("memory: deleting %d vectors failed", len(ids))

    async def documents(self, collection: str) -> list[dict[str, object]]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._readers, lambda: self._open()[0].documents(collection))

    async def document_chunks(self, document_id: str) -> list[MemoryEntry]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._readers, lambda: self._open()[0].document_chunks(document_id))

    async def delete_document(self, document_id: str) -> int:
        """Remove a document's chunks from the store and the vector index; returns how many there were."""
        def delete() -> int:
            store, _, vectors = self._open()
            ids = store.delete_document(document_id)
            vectors.delete(ids)
            return len(ids)

        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._writer, delete)
