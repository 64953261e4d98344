"""Entry vectors in a Milvus collection, through pymilvus: the memory's server mode (``memory.uri``: a Milvus
server). The same code also talks to Milvus Lite (a ``.db`` directory, served from this process), which the
embedded default no longer uses: its search walks every row in Python (docs/search.md). Blocking: call from a
thread.

Only what filters need is copied next to each vector (kind, source, session, wall time, document); the entry
itself lives in the SQLite store."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from pipelines.memory.entries import MemoryEntry, SearchFilters

log = logging.getLogger(__name__)

_MAX_ID_CHARS = 256


def _quote(value: str) -> str:
    """A Milvus string literal (JSON escaping is valid in Milvus expressions)."""
    return json.dumps(value)


def milvus_filter(filters: SearchFilters) -> str:
    clauses = [f"kind in [{', '.join(_quote(k) for k in filters.kinds)}]"]
    return " and ".join(clauses + filters.store_clauses(_quote, "=="))


class _UnimplementedMilvusCalls(logging.Filter):
    """pymilvus asks every server for AllocTimestamp; Milvus Lite's in-process server does not implement it and
    grpc logs a traceback per connection. Harmless (pymilvus carries on): keep it out of Vigil's log."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], NotImplementedError):
            tb = record.exc_info[2]
            while tb is not None and tb.tb_next is not None:
                tb = tb.tb_next
            return tb is None or not tb.tb_frame.f_code.co_filename.endswith("milvus_pb2_grpc.py")
        return True


class MilvusVectors:
    def __init__(self, uri: str, collection: str, dimension: int, token: str | None = None) -> None:
        from pymilvus import MilvusClient  # deferred: pymilvus imports pandas and grpc (a second)

        self.uri, self.collection, self.dimension = uri, collection, dimension
        self.embedded = not uri.startswith(("http://", "https://", "tcp://"))
        if self.embedded:
            grpc_log = logging.getLogger("grpc._server")
            if not any(isinstance(f, _UnimplementedMilvusCalls) for f in grpc_log.filters):
                grpc_log.addFilter(_UnimplementedMilvusCalls())
        self._client = MilvusClient(uri=uri, token=token or "")
        if not self._client.has_collection(collection):
            self._create()
        self._client.load_collection(collection)

    def _create(self) -> None:
        from pymilvus import DataType

        schema = self._client.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field("id", DataType.INT64, is_primary=True)
        schema.add_field("vector", DataType.FLOAT_VECTOR, dim=self.dimension)
        schema.add_field("kind", DataType.VARCHAR, max_length=16)
        schema.add_field("source", DataType.VARCHAR, max_length=_MAX_ID_CHARS)
        schema.add_field("session", DataType.VARCHAR, max_length=_MAX_ID_CHARS)
        schema.add_field("document_id", DataType.VARCHAR, max_length=64)
        schema.add_field("wall_time", DataType.DOUBLE)
        index = self._client.prepare_index_params()
        # Unit vectors: inner product is the cosine. HNSW: sub-linear search as the memory grows.
        index.add_index("vector", index_type="HNSW", metric_type="IP", params={"M": 16, "efConstruction": 64})
        self._client.create_collection(self.collection, schema=schema, index_params=index)
        log.info("created Milvus collection %s (%d dimensions) at %s", self.collection, self.dimension,
                 "embedded " + self.uri if self.embedded else self.uri)

    def add(self, entries: Sequence[MemoryEntry], vectors: np.ndarray) -> None:
        rows = [{"id": e.id, "vector": v.tolist(), "kind": e.kind, "source": e.source[:_MAX_ID_CHARS],
                 "session": e.session[:_MAX_ID_CHARS], "document_id": e.document_id or "",
                 "wall_time": float(e.wall_time)} for e, v in zip(entries, vectors, strict=True)]
        self._client.upsert(self.collection, rows)  # upsert: re-indexing after a crash must not duplicate

    def search(self, vector: np.ndarray, filters: SearchFilters, limit: int) -> list[int]:
        """Ids of the nearest vectors that pass the filters, nearest first."""
        results = self._client.search(
            self.collection, [vector.tolist()], anns_field="vector", limit=limit, filter=milvus_filter(filters),
            output_fields=["id"], search_params={"metric_type": "IP", "params": {"ef": max(64, limit)}},
        )
        return [int(hit["id"]) for hit in results[0]]

    def delete(self, ids: Sequence[int]) -> None:
        if ids:
            self._client.delete(self.collection, ids=list(ids))

    def count(self) -> int:
        return int(self._client.get_collection_stats(self.collection).get("row_count", 0))

    def close(self) -> None:
        self._client.close()
        if self.embedded:  # stop the in-process Milvus Lite server so the directory can be opened again
            from milvus_lite.server_manager import server_manager_instance

            server_manager_instance.release_server(str(Path(self.uri)))
