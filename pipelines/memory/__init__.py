"""Searchable memory: entries (what was seen and heard, and chat documents) in a SQLite store with FTS5, their
embeddings in LanceDB (embedded) or a Milvus server, hybrid search fused by reciprocal rank. Pure asyncio on the
outside; every blocking call runs on the index's own threads."""
