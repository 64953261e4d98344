"""Documents indexed while clients wait: N small documents through ``MemoryIndex.add_now``, C at a time (as C
concurrent ``POST /api/collections/{c}/documents`` would), with the real MiniLM and LanceDB.

    python -m bench.documents 1000 16

Measured on the shared 2-core machine (1,000 documents, 16 at a time): 28.6 ms per document when each was
embedded and written alone, 7.3 ms once waiting documents are written together (64 at a time: 6.2 ms)."""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time

from models.embeddings import MiniLmEmbedder
from pipelines.memory.documents import document_entries
from server.config import load_settings
from server.services import build_index


async def run(count: int, concurrency: int) -> None:
    embedder = MiniLmEmbedder()
    embedder.embed(["warm up"])
    with tempfile.TemporaryDirectory() as data_dir:
        index = build_index(load_settings(None, {"memory": {"enabled": True, "data_dir": data_dir}}),
                            lambda: embedder)
        await index.open()
        texts = [f"Note {i}: the delivery for bay {i % 40} arrives at {i % 24}:00; sign at the desk."
                 for i in range(count)]

        async def client(mine: list[str]) -> None:
            for text in mine:
                _, entries = document_entries("notes", "note", text, markdown=False, chunk_chars=800,
                                              overlap_chars=150)
                await index.add_now(entries)

        started = time.perf_counter()
        await asyncio.gather(*(client(texts[i::concurrency]) for i in range(concurrency)))
        took = time.perf_counter() - started
        print(f"{count} documents, {concurrency} at a time: {took:.1f} s, {1000 * took / count:.1f} ms per document")
        await index.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("count", type=int, nargs="?", default=1000)
    parser.add_argument("concurrency", type=int, nargs="?", default=16)
    args = parser.parse_args()
    asyncio.run(run(args.count, args.concurrency))


if __name__ == "__main__":
    main()
