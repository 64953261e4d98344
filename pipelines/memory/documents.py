"""Documents for the chat API: text or Markdown cut into overlapping chunks, each one memory entry.

Chunking uses ``semantic-text-splitter`` (Rust, no dependencies): it cuts at the largest boundary that fits
(Markdown headings and blocks, then paragraphs, sentences, words), which keeps a chunk about one thing."""

from __future__ import annotations

import time
import uuid

from pipelines.memory.entries import MemoryEntry


def chunk_text(text: str, *, markdown: bool, chunk_chars: int, overlap_chars: int) -> list[str]:
    from semantic_text_splitter import MarkdownSplitter, TextSplitter

    overlap = min(overlap_chars, chunk_chars // 2)
    splitter = (MarkdownSplitter if markdown else TextSplitter)(chunk_chars, overlap=overlap)
    return [chunk for chunk in splitter.chunks(text) if chunk.strip()]


def document_entries(collection: str, name: str, text: str, *, markdown: bool, chunk_chars: int,
                     overlap_chars: int) -> tuple[str, list[MemoryEntry]]:
    """A new document id and its chunks as entries (kind ``document``, source = the collection)."""
    document_id = uuid.uuid4().hex[:16]
    now = time.time()
    chunks = chunk_text(text, markdown=markdown, chunk_chars=chunk_chars, overlap_chars=overlap_chars)
    return document_id, [
        MemoryEntry(kind="document", text=chunk, source=collection, session="", wall_time=now,
                    document_id=document_id, meta={"name": name, "chunk": index, "chunks": len(chunks)})
        for index, chunk in enumerate(chunks)
    ]
