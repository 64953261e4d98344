"""Memory: hybrid search over what sessions and sources saw and heard, chat documents, and voice-loop recall.
Real models throughout (MiniLM embeddings, LanceDB, a Milvus server, Whisper, SmolLM2, Piper, YOLO)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from pipelines.memory.entries import MemoryEntry
from pipelines.timeline.store import TimelineEntry
from server.state import MEMORY, TIMELINE
from tests.integration.test_voice_loop import VOICE, VoiceCall, _system_text
from tests.support.audio import silence, speech
from tests.support.media import sliding_person
from tests.support.milvus_server import MilvusServer

SENTENCE = "The red bicycle is locked next to the bakery."


def _memory(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    return {"enabled": True, "data_dir": str(tmp_path / "memory"), **extra}


async def _indexed(server: Any) -> None:
    """Wait until what the timeline was given is committed (its listener feeds memory), then indexed."""
    assert await asyncio.to_thread(server.app[TIMELINE].flush, 60.0)
    await server.app[MEMORY].flush()


async def _search(http: aiohttp.ClientSession, url: str, **params: Any) -> tuple[int, dict[str, Any]]:
    async with http.get(f"{url}/api/search", params={k: str(v) for k, v in params.items()}) as response:
        return response.status, await response.json()


async def test_spoken_sentence_is_searchable_and_the_voice_loop_recalls_it(vigil, tmp_path: Path):
    # A loaded test machine may take seconds to embed the question: don't let the default 3 s give up on it.
    server = await vigil(voice=VOICE, memory=_memory(tmp_path, voice={"timeout_s": 60}))
    before = time.time()
    async with VoiceCall(server.url) as call:
        call.mic.say(silence(0.3))
        call.mic.say(speech(SENTENCE))
        first = await call.turn(1)
        assert "bicycle" in first["final"]["text"].lower(), first["final"]
        assert "memory_retrieval_ms" not in first["metrics"], first["metrics"]  # a statement, not a question
        await _indexed(server)
        async with aiohttp.ClientSession() as http:
            status, found = await _search(http, server.url, q="where is the bicycle")
            assert status == 200, found
            top = found["results"][0]
            assert top["kind"] == "transcript" and "bakery" in top["text"].lower(), found["results"]
            assert top["session"] == call.client.session_id and top["wall_time"] >= before
            assert set(top["matched"]) == {"keyword", "vector"}
            # A time range that ends before the session hides it; one that starts before it keeps it.
            status, hidden = await _search(http, server.url, q="where is the bicycle", until=before - 1)
            assert status == 200 and not any("bakery" in r["text"].lower() for r in hidden["results"]), hidden
            status, kept = await _search(http, server.url, q="where is the bicycle", since=before - 1,
                                         kind="transcript")
            assert kept["results"][0]["text"] == top["text"]

        # An ordinary question: no retrieval.
        call.mic.say(speech("How many people do you see?"))
        ordinary = await call.turn(2)
        assert "memory_retrieval_ms" not in ordinary["metrics"], ordinary["metrics"]
        assert "bakery" not in _system_text(server)

        # A question about the past: the remembered sentence is in the prompt, the metrics say so.
        call.mic.say(speech("What did I tell you about the bicycle earlier?"))
        recalled = await call.turn(3)
        metrics = recalled["metrics"]
        assert metrics["memory_entries"] >= 1 and metrics["memory_retrieval_ms"] > 0, metrics
        system = _system_text(server)
        assert "bakery" in system.lower(), system


async def _played_and_indexed(http: aiohttp.ClientSession, server: Any, body: dict[str, Any]) -> dict[str, Any]:
    """Start a file source, wait (up to ~30 s) until it has played to its end and what it raised is indexed; its
    info."""
    async with http.post(f"{server.url}/api/sources", json=body) as response:
        source = await response.json()
        assert response.status == 201, source
    for _ in range(300):
        async with http.get(f"{server.url}/api/sources/{source['id']}") as response:
            if (await response.json())["state"] == "ended":
                break
        await asyncio.sleep(0.1)
    await _indexed(server)
    return source


async def test_zone_event_is_found_by_its_zone_and_survives_a_restart(vigil, tmp_path: Path):
    sliding_person(tmp_path / "slide.mp4", seconds=6.0, fps=10)
    zone = {"name": "loading dock", "polygon": [[0.4, 0.0], [0.6, 0.0], [0.6, 1.0], [0.4, 1.0]]}
    overrides = {"memory": _memory(tmp_path), "sources": {"media_root": str(tmp_path)},
                 "video": {"target_fps": 5}, "models": {"detector": {"backend": "yolo"}}}
    server = await vigil(**overrides)
    async with aiohttp.ClientSession() as http:
        body = {"path": "slide.mp4", "realtime": False, "options": {"video": {"zones": [zone]}}}
        source = await _played_and_indexed(http, server, body)
        status, found = await _search(http, server.url, q="who went into the loading dock", kind="event")
        assert status == 200, found
        top = found["results"][0]
        assert top["kind"] == "event" and "loading dock" in top["text"] and top["source"] == source["id"], found
        assert top["labels"] == ["person"] and top["track_ids"] and top["media_time"] > 0
        await server.stop()

    restarted = await vigil(**overrides)
    async with aiohttp.ClientSession() as http:
        status, again = await _search(http, restarted.url, q="who went into the loading dock", kind="event")
        assert status == 200 and again["results"][0]["text"] == top["text"], again
        status, vector = await _search(http, restarted.url, q="someone walked into the dock area", mode="vector",
                                       kind="event")
        assert any("loading dock" in r["text"] for r in vector["results"]), vector


async def test_memory_indexes_what_the_timeline_commits(vigil, tmp_path: Path):
    """'object appeared' events exist only in the timeline (the recorder raises them from storage.appear): memory
    finds one, linked to its stored timeline entry and clip."""
    sliding_person(tmp_path / "slide.mp4", seconds=4.0, fps=10)
    server = await vigil(memory=_memory(tmp_path), sources={"media_root": str(tmp_path)}, video={"target_fps": 5},
                         models={"detector": {"backend": "yolo"}}, storage={"appear": [{"label": "person"}]})
    async with aiohttp.ClientSession() as http:
        source = await _played_and_indexed(http, server, {"path": "slide.mp4", "realtime": False})
        status, found = await _search(http, server.url, q="a person appeared", kind="event")
        assert status == 200, found
        appeared = [r for r in found["results"] if r["meta"].get("event") == "object.appeared"]
        assert appeared and appeared[0]["source"] == source["id"] and appeared[0]["labels"] == ["person"], found
        async with http.get(f"{server.url}/api/events/{appeared[0]['event_id']}") as response:
            stored = await response.json()
            assert response.status == 200 and stored["name"] == "object.appeared", stored
        assert appeared[0]["clip_id"] == stored["id"]


async def test_a_deleted_or_expired_timeline_entry_leaves_memory(vigil, tmp_path: Path):
    server = await vigil(memory=_memory(tmp_path))
    timeline, index = server.app[TIMELINE], server.app[MEMORY]
    assert index.opened  # loaded at start-up: the first entry must not load a model inside a live session
    now = time.time()
    said = {text: TimelineEntry(kind="transcript", name="transcript", source="cam1", origin="file", wall_ts=now,
                                pts=1.0, text=text)
            for text in ("The red bicycle is locked next to the bakery.", "The blue van waited at dock four.",
                         "The ladder leans against the shed.")}
    for entry in said.values():
        assert timeline.put(entry)
    await _indexed(server)
    assert await index.counts() == (3, 3)
    bicycle = said["The red bicycle is locked next to the bakery."]

    async with aiohttp.ClientSession() as http:
        for mode in ("keyword", "vector"):
            status, found = await _search(http, server.url, q="where is the bicycle", mode=mode)
            assert status == 200 and found["results"][0]["event_id"] == bicycle.id, found
        async with http.delete(f"{server.url}/api/events/{bicycle.id}") as response:
            assert response.status == 204, await response.text()
        for mode in ("hybrid", "keyword", "vector"):  # gone from every search at once, before the vectors go
            status, found = await _search(http, server.url, q="where is the bicycle", mode=mode)
            assert status == 200 and bicycle.id not in {r["event_id"] for r in found["results"]}, found
        await index.flush()
        assert await index.counts() == (2, 2)  # its vector is gone too

        # Retention deletes expired entries on the timeline's writer thread: memory forgets them too.
        await asyncio.to_thread(timeline.enforce_retention, now + timeline.max_age_s + 1)
        await index.flush()
        assert await index.counts() == (0, 0)
        status, found = await _search(http, server.url, q="van at the dock", mode="keyword")
        assert status == 200 and found["results"] == [], found


async def test_memory_without_storage_says_so_and_still_searches_documents(vigil, tmp_path: Path, caplog):
    with caplog.at_level("WARNING", logger="server.services"):
        server = await vigil(memory=_memory(tmp_path), storage={"enabled": False})
    assert "nothing sessions and sources see or hear is recorded to index" in caplog.text
    assert not server.app[MEMORY].opened  # nothing feeds it: the embedder waits for the first document
    async with aiohttp.ClientSession() as http:
        body = {"name": "gate", "text": "The side gate code is 4711.", "format": "text"}
        async with http.post(f"{server.url}/api/collections/site/documents", json=body) as response:
            assert response.status == 201, await response.text()
        status, found = await _search(http, server.url, q="gate code", kind="document")
        assert status == 200 and "4711" in found["results"][0]["text"], found


async def test_a_memory_that_cannot_open_at_start_up_does_not_stop_the_server(vigil, tmp_path: Path, caplog):
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("a file where the memory's data_dir should be")
    with caplog.at_level("ERROR", logger="server.services"):
        server = await vigil(memory={"enabled": True, "data_dir": str(blocked)})
    assert "cannot open the index at start-up" in caplog.text
    assert not server.app[MEMORY].opened
    async with aiohttp.ClientSession() as http, http.get(f"{server.url}/readyz") as response:
        assert response.status == 200, await response.text()  # the server serves; memory tries again on use


async def test_index_survives_restart_and_reembeds_entries_without_vectors(vigil, tmp_path: Path):
    server = await vigil(memory=_memory(tmp_path))
    index = server.app[MEMORY]
    ids = await index.add_now([MemoryEntry("transcript", "The parcel for Mrs Lee is under the stairs.", "cam1",
                                           "cam1", 1.0, time.time())])
    await server.stop()
    # A crash between the record and its vector: the entry is in SQLite, marked not indexed.
    import sqlite3

    with sqlite3.connect(tmp_path / "memory" / "entries.sqlite3") as db:
        db.execute("UPDATE entries SET indexed = 0 WHERE id = ?", (ids[0],))
        db.execute("INSERT INTO entries (kind, text, source, session, wall_time, labels, track_ids, meta) "
                   "VALUES ('transcript', 'The spare key hangs in the garage.', 'cam1', 'cam1', ?, '[]', '[]', "
                   "'{}')", (time.time(),))
    restarted = await vigil(memory=_memory(tmp_path))
    async with aiohttp.ClientSession() as http:
        status, found = await _search(http, restarted.url, q="where can I find a key to get in", mode="vector")
        assert status == 200 and "spare key" in found["results"][0]["text"], found
        status, found = await _search(http, restarted.url, q="parcel", mode="keyword")
        assert [r["text"] for r in found["results"]] == ["The parcel for Mrs Lee is under the stairs."]


async def test_bad_search_input_gets_clear_errors(vigil, tmp_path: Path):
    server = await vigil(memory=_memory(tmp_path, max_query_chars=1000))
    async with aiohttp.ClientSession() as http:
        cases = [
            ({}, 400, "empty_query"),
            ({"q": "   "}, 400, "empty_query"),
            ({"q": "x" * 5000}, 413, "query_too_long"),
            ({"q": "van", "colour": "red"}, 400, "unknown_parameter"),
            ({"q": "van", "kind": "telegram"}, 400, "unknown_kind"),
            ({"q": "van", "since": "yesterday"}, 400, "invalid_time"),
            ({"q": "van", "since": "2026-01-02T00:00:00", "until": "2026-01-01T00:00:00"}, 400, "invalid_time"),
            *[({"q": "van", name: value}, 400, "invalid_time")  # would reach the filters as `wall_time >= nan`
              for name in ("since", "until") for value in ("nan", "inf", "-inf", "1e400", "NaN")],
            ({"q": "van", "limit": "99999999999999999999"}, 400, "invalid_limit"),
            ({"q": "van", "limit": "0"}, 400, "invalid_limit"),
            ({"q": "van", "limit": "many"}, 400, "invalid_limit"),
            ({"q": "van", "source": "a\" or kind != \"x"}, 400, "invalid_filter"),
            ({"q": "van", "mode": "psychic"}, 400, "invalid_mode"),
        ]
        for params, status, code in cases:
            got, body = await _search(http, server.url, **params)
            assert (got, body["error"]["code"]) == (status, code), (params, body)
            if code in ("invalid_time", "invalid_limit"):
                assert body["error"]["message"].startswith(next(k for k in ("since", "until", "limit")
                                                                if k in params)), body
        # 100 kB in the URL: refused before any handler runs, still a 4xx.
        async with http.get(f"{server.url}/api/search", params={"q": "y" * 100_000}) as response:
            assert 400 <= response.status < 500
        # FTS5 syntax in a query is only text.
        got, body = await _search(http, server.url, q='bicycle" OR NEAR(a b) *')
        assert got == 200, body
        async with http.get(f"{server.url}/openapi.json") as response:
            paths = (await response.json())["paths"]
        assert "get" in paths["/api/search"] and "post" in paths["/api/collections/{collection}/documents"]
    disabled = await vigil()
    async with aiohttp.ClientSession() as http:
        got, body = await _search(http, disabled.url, q="van")
        assert (got, body["error"]["code"]) == (503, "memory_disabled")


@pytest.mark.parametrize("token", ["s3cret"])
async def test_search_needs_the_api_token(vigil, tmp_path: Path, token: str):
    server = await vigil(memory=_memory(tmp_path), auth={"token": token})
    async with aiohttp.ClientSession() as http:
        got, body = await _search(http, server.url, q="van")
        assert got == 401, body
        async with http.get(f"{server.url}/api/search", params={"q": "van"},
                            headers={"Authorization": f"Bearer {token}"}) as response:
            assert response.status == 200, await response.text()


async def test_a_milvus_server_by_uri_serves_the_same_search(vigil, tmp_path: Path):
    with MilvusServer(tmp_path / "milvus") as milvus:
        server = await vigil(memory=_memory(tmp_path, uri=milvus.uri))
        index = server.app[MEMORY]
        now = time.time()
        await index.add_now([
            MemoryEntry("transcript", "The red bicycle is locked next to the bakery.", "cam1", "cam1", 2.0, now),
            MemoryEntry("event", "car (track 4) entered zone 'driveway'", "cam1", "cam1", 3.0, now),
            MemoryEntry("scene", "The camera currently sees 1 dog.", "cam2", "cam2", 4.0, now),
        ])
        assert not (tmp_path / "memory" / "vectors.lance").exists()  # nothing embedded: the vectors are remote
        async with aiohttp.ClientSession() as http:
            status, found = await _search(http, server.url, q="where is the bicycle", mode="vector")
            assert status == 200 and "bicycle" in found["results"][0]["text"], found
            status, found = await _search(http, server.url, q="pet animal", mode="vector", source="cam2")
            assert [r["text"] for r in found["results"]] == ["The camera currently sees 1 dog."], found
        await server.stop()
        # The vectors live in the server's own directory.
        assert any((tmp_path / "milvus").iterdir())


MANUAL = """# Depot handbook

## Opening hours
The depot opens at seven in the morning and closes at six in the evening, Monday to Saturday.

## Deliveries
Drivers unload at bay three. Pallets wider than one metre go to bay five, next to the cold store.

## Side gate
The side gate at the Harbour Street depot opens with the code 4817. Close it behind you after dark.

## Fire safety
Extinguishers hang beside every exit. The assembly point is the car park across the road.
"""


async def test_a_document_collection_answers_chat_questions_and_deletes_cleanly(vigil, tmp_path: Path):
    documents = {"chunk_chars": 200, "chunk_overlap_chars": 40, "max_document_bytes": 4096}
    server = await vigil(memory=_memory(tmp_path, documents=documents))
    base = f"{server.url}/api/collections/handbook/documents"
    async with aiohttp.ClientSession() as http:
        async with http.post(base, json={"name": "depot.md", "text": MANUAL}) as response:
            created = await response.json()
            assert response.status == 201, created
        assert created["chunks"] >= 4
        async with http.post(f"{base}?name=notes.txt", data="Bay five is for wide pallets only.",
                             headers={"Content-Type": "text/plain"}) as response:
            assert response.status == 201, await response.text()
        async with http.get(base) as response:
            listed = await response.json()
        assert [d["name"] for d in listed["documents"]] == ["depot.md", "notes.txt"]

        question = {"model": "smollm2-135m-instruct", "max_tokens": 24, "temperature": 0,
                    "messages": [{"role": "user", "content": "What is the code for the side gate on Harbour Street?"}],
                    "vigil": {"collection": "handbook"}}
        async with http.post(f"{server.url}/v1/chat/completions", json=question) as response:
            answer = await response.json()
            assert response.status == 200, answer
        sources = answer["vigil"]["sources"]
        assert "4817" in sources[0]["text"] and sources[0]["name"] == "depot.md", sources
        assert sources[0]["document_id"] == created["id"] and answer["vigil"]["prompt"]["dropped_documents"] == 0
        # Streamed: the sources come in the last chunk's vigil field.
        async with http.post(f"{server.url}/v1/chat/completions",
                             json={**question, "stream": True, "max_tokens": 8}) as response:
            assert response.status == 200, await response.text()
            chunks = [json.loads(line[5:]) for line in (await response.text()).splitlines()
                      if line.startswith("data:") and line != "data: [DONE]"]
        streamed = next(c["vigil"]["sources"] for c in chunks if "vigil" in c)
        assert [s["text"] for s in streamed] == [s["text"] for s in sources]

        # Bad input: a collection that has nothing, a malformed extension, a document over the limit, no body.
        async with http.post(f"{server.url}/v1/chat/completions",
                             json={**question, "vigil": {"collection": "nothing-here"}}) as response:
            assert response.status == 404, await response.text()
        async with http.post(f"{server.url}/v1/chat/completions", json={**question, "vigil": "handbook"}) as response:
            assert response.status == 400, await response.text()
        async with http.post(base, json={"name": "big.md", "text": "word " * 2000}) as response:
            assert (response.status, (await response.json())["error"]["code"]) == (413, "document_too_large")
        async with http.post(base, json={"name": "empty.md", "text": "   "}) as response:
            assert response.status == 400, await response.text()
        async with http.post(base, data=b"\xff\xfe", headers={"Content-Type": "text/plain"}) as response:
            assert response.status == 400, await response.text()
        async with http.post(f"{server.url}/api/collections/bad name!/documents", json={"name": "x", "text": "y"}) \
                as response:
            assert response.status == 400, await response.text()

        # Deleting the document removes its chunks from the store, the keyword index and the vectors.
        async with http.get(f"{base}/{created['id']}") as response:
            detail = await response.json()
            assert any("4817" in c["text"] for c in detail["content"])
        async with http.delete(f"{base}/{created['id']}") as response:
            assert response.status == 204
        async with http.get(f"{base}/{created['id']}") as response:
            assert response.status == 404
        for mode in ("keyword", "vector"):
            status, found = await _search(http, server.url, q="side gate code", kind="document", mode=mode)
            assert status == 200 and all(r["document_id"] != created["id"] for r in found["results"]), found
        async with http.post(f"{server.url}/v1/chat/completions", json=question) as response:
            answer = await response.json()
        assert all("4817" not in s["text"] for s in answer["vigil"]["sources"]), answer["vigil"]


async def test_a_document_has_its_own_body_limit_not_the_servers(vigil, tmp_path: Path):
    """memory.documents.max_document_bytes (1 MB by default) applies to documents, not server.max_body_bytes
    (256 KiB by default): a 300 KB body is accepted; over 1 MB is a 413, declared or streamed (chunked)."""
    server = await vigil(memory=_memory(tmp_path))
    assert server.settings.server.max_body_bytes < 300_000 < server.settings.memory.documents.max_document_bytes
    base = f"{server.url}/api/collections/big/documents"
    text = "The spare key for the loading bay is in the blue box by the fire door."
    body = json.dumps({"name": "padded.md", "text": text})
    padded = body[:-1] + " " * (300_000 - len(body)) + "}"  # JSON whitespace: 300 KB to read, one chunk to embed
    async with aiohttp.ClientSession() as http:
        async with http.post(base, data=padded, headers={"Content-Type": "application/json"}) as response:
            assert response.status == 201, await response.text()
        too_big = b"word " * 220_000  # 1.1 MB

        async def streamed():  # no Content-Length: the limit holds as the body arrives
            for start in range(0, len(too_big), 65536):
                yield too_big[start:start + 65536]

        for data in (too_big, streamed()):
            async with http.post(f"{base}?name=huge.txt", data=data,
                                 headers={"Content-Type": "text/plain"}) as response:
                body = await response.json()
                assert (response.status, body["error"]["code"]) == (413, "document_too_large"), body
        status, found = await _search(http, server.url, q="spare key loading bay", kind="document", mode="keyword")
        assert status == 200 and [r["text"] for r in found["results"]] == [text], found


class CountingEmbedderForTest:
    """The real MiniLM, counting how many texts each embedding call gets."""

    def __init__(self, real: Any) -> None:
        self.real, self.batches = real, []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def embed(self, texts: list[str]) -> Any:
        self.batches.append(len(texts))
        return self.real.embed(texts)


async def test_documents_posted_together_are_embedded_together(vigil, tmp_path: Path):
    """10,000 small documents took 418 s, each embedded (and written to the vector index) alone: documents that
    wait at the same time are written as one batch."""
    import threading

    server = await vigil(memory=_memory(tmp_path))
    index = server.app[MEMORY]
    await index.open()
    index._embedder = counting = CountingEmbedderForTest(index._embedder)
    gate = threading.Event()
    index._writer.submit(gate.wait)  # the writer thread is busy: every document below has to wait for it
    base = f"{server.url}/api/collections/notes/documents"
    count = 24

    async def post(http: aiohttp.ClientSession, number: int) -> int:
        async with http.post(f"{base}?name=n{number}.txt", data=f"Note {number}: bay {number} takes pallets.",
                             headers={"Content-Type": "text/plain"}) as response:
            return response.status

    arrived = 0
    add_now = index.add_now

    async def counted(entries: Any) -> Any:  # the real method, counting the documents that reached it
        nonlocal arrived
        arrived += 1
        return await add_now(entries)

    index.add_now = counted
    async with aiohttp.ClientSession() as http:
        posts = asyncio.gather(*(post(http, n) for n in range(count)))
        try:
            async with asyncio.timeout(30):
                while True:  # every document has reached the index (add_now queues it before its first await)
                    if arrived >= count:
                        break
                    await asyncio.sleep(0.02)
        finally:
            gate.set()
        assert await posts == [201] * count
        status, found = await _search(http, server.url, q="bay 17 pallets", kind="document", mode="keyword")
        assert status == 200 and found["results"][0]["text"] == "Note 17: bay 17 takes pallets.", found
    assert sum(counting.batches) == count and len(counting.batches) <= 2, counting.batches  # not 24 calls of 1
