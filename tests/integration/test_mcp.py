"""The MCP server at /mcp: the ``mcp`` SDK's own client (streamable HTTP) lists and calls Vigil's tools on a real
``vigil serve``, with and without the API token; each tool's structured content has the REST API's fields."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import av
import numpy as np
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from pipelines.timeline.store import TimelineEntry, TimelineStore
from tests.support.media import keyframed_sliding_person, make_clip
from tests.support.vigil_process import VigilProcess
from tests.support.zone_entry import RIGHT_HALF

TOKEN = "mcp-test-token"
TOOLS = {"search_memory", "list_events", "list_sources", "get_snapshot_url", "list_faces", "ask"}
ALICE_AT = time.time() - 600  # ten minutes ago


def _seed_timeline(data_dir: Path) -> str:
    """A timeline from an earlier run: Alice entered the door zone of the 'porch' camera (with a snapshot)."""
    store = TimelineStore(data_dir, max_age_s=30 * 86400, quota_bytes=10**9)
    store.open()
    entry = TimelineEntry(kind="event", name="zone.enter", source="porch-cam", origin="rtsp", source_name="porch",
                          wall_ts=ALICE_AT, pts=12.0,
                          data={"zone": "door", "label": "person", "track_id": 7, "conf": 0.93,
                                "identity": {"name": "Alice", "score": 0.97}})
    store.put(entry)
    snapshot = data_dir / "snapshots" / f"{entry.id}.jpg"
    snapshot.parent.mkdir(parents=True, exist_ok=True)
    frame = av.VideoFrame.from_ndarray(np.zeros((64, 64, 3), np.uint8), format="rgb24")
    frame.to_image().save(snapshot, format="JPEG")
    store.update_media([entry.id], snapshot=f"snapshots/{entry.id}.jpg")
    assert store.flush()
    store.close()
    return entry.id


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[VigilProcess, str]]:
    """One `vigil serve` with a token, memory on (it indexes the seeded timeline at start-up) and a file source."""
    root = tmp_path_factory.mktemp("mcp")
    event_id = _seed_timeline(root / "timeline")
    (root / "media").mkdir()
    make_clip(root / "media" / "clip.mp4", seconds=2.0)
    config = {"storage": {"data_dir": str(root / "timeline")}, "memory": {"enabled": True},
              "sources": {"media_root": str(root / "media")}, "models": {"detector": {"backend": "none"}},
              "voice": {"enabled": False}, "webrtc": {"host_addresses": ["127.0.0.1"]}}
    server = VigilProcess(root, config, token=TOKEN, memory_off=False).start()
    try:
        yield server, event_id
    finally:
        server.stop()


def _rest(server: VigilProcess, path: str, body: dict[str, Any] | None = None) -> Any:
    request = urllib.request.Request(server.url + path, data=json.dumps(body).encode() if body else None,
                                     headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


@contextlib.asynccontextmanager
async def mcp_client(server: VigilProcess, token: str | None,
                     statuses: list[int] | None = None) -> AsyncIterator[Client]:
    """The SDK's client over its own streamable-HTTP transport; ``statuses`` collects each HTTP answer's status."""
    headers = {"Authorization": f"Bearer {token}"} if token else None
    async with create_mcp_http_client(headers=headers) as http:
        if statuses is not None:
            async def record(response: Any) -> None:
                statuses.append(response.status_code)

            http.event_hooks["response"].append(record)
        async with Client(streamable_http_client(f"{server.url}/mcp", http_client=http)) as client:
            yield client


async def _call(client: Client, tool: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments or {})
    assert not result.is_error, result.content
    assert result.structured_content is not None
    # The text content is the same JSON, for clients that read only text.
    assert json.loads(result.content[0].text) == result.structured_content
    return result.structured_content


async def test_tools_answer_with_the_rest_apis_fields(served: tuple[VigilProcess, str]):
    server, event_id = served
    source = await asyncio.to_thread(_rest, server, "/api/sources", {"path": "clip.mp4", "name": "yard",
                                                                      "loop": True})
    async with mcp_client(server, TOKEN) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert set(tools) == TOOLS
        assert tools["list_events"].output_schema is not None  # structured, with a schema

        events = await _call(client, "list_events", {"identity": "Alice"})
        rest = await asyncio.to_thread(_rest, server, "/api/events?identity=Alice")
        assert events == rest and [e["id"] for e in events["events"]] == [event_id]
        assert events["events"][0]["data"]["zone"] == "door"
        assert (await _call(client, "list_events", {"identity": "Bob"}))["events"] == []
        assert (await _call(client, "list_events", {"since": ALICE_AT + 60}))["events"] == []

        link = await _call(client, "get_snapshot_url", {"event_id": event_id})
        assert link["snapshot_url"] == rest["events"][0]["snapshot_url"] == f"/api/events/{event_id}/snapshot.jpg"
        missing = await client.call_tool("get_snapshot_url", {"event_id": "0" * 16})
        assert missing.is_error and "no such event" in missing.content[0].text

        sources = (await _call(client, "list_sources"))["sources"]
        assert [s["id"] for s in sources] == [source["id"]] and sources[0]["name"] == "yard"
        assert set(sources[0]) >= set(source) and "summary" in sources[0]["scene"]

        assert await _call(client, "list_faces") == await asyncio.to_thread(_rest, server, "/api/faces")

        found = await _call(client, "search_memory", {"query": "Alice entered the door", "limit": 5})
        assert event_id in [r["event_id"] for r in found["results"]]
        assert set(found) == {"query", "mode", "took_ms", "timings_ms", "results"}

        answer = await _call(client, "ask", {"question": "When did Alice come to the door?"})
        assert answer["answer"].strip() and event_id in [r["event_id"] for r in answer["results"]]


async def test_the_token_is_required_when_set(served: tuple[VigilProcess, str]):
    server, _ = served
    for token in (None, "wrong"):
        statuses: list[int] = []
        with pytest.raises(Exception):  # noqa: B017 - the SDK's error for an HTTP error (it hides the status)
            async with mcp_client(server, token, statuses) as client:
                await client.list_tools()
        assert statuses and set(statuses) == {401}, statuses  # Vigil's auth answered, before the MCP server
    statuses = []
    async with mcp_client(server, TOKEN, statuses) as client:
        await client.list_tools()
    assert set(statuses) <= {200, 202, 204, 405}, statuses


async def test_without_a_token_it_is_open(tmp_path: Path):
    config = {"models": {"detector": {"backend": "none"}}, "voice": {"enabled": False}}
    server = await asyncio.to_thread(VigilProcess(tmp_path, config).start)
    try:
        async with mcp_client(server, None) as client:
            assert {tool.name for tool in (await client.list_tools()).tools} == TOOLS
            assert (await _call(client, "list_events"))["events"] == []
            off = await client.call_tool("search_memory", {"query": "anything"})
            assert off.is_error and "memory_disabled: memory is disabled" in off.content[0].text
        async with aiohttp.ClientSession() as http, http.get(f"{server.url}/mcp") as response:
            # Stateless: no server-initiated stream to hold open (the SDK's transport would wait forever).
            assert response.status == 405 and (await response.json())["error"]["code"] == "method_not_allowed"
    finally:
        await asyncio.to_thread(server.stop)


GATE = {**RIGHT_HALF, "name": "gate"}


def _wait_for_enter(server: VigilProcess, timeout: float = 60.0) -> dict[str, Any]:
    """The replay's zone.enter into the gate, once the timeline stored it and memory indexed it."""
    deadline = time.monotonic() + timeout
    while True:
        events = _rest(server, "/api/events?name=zone.enter")["events"]
        if events and _rest(server, "/api/search?q=entered+zone+gate&mode=keyword")["results"]:
            return events[0]
        assert time.monotonic() < deadline, f"no zone.enter indexed in time:\n{server.log()}"
        time.sleep(0.25)


async def test_an_agent_finds_when_someone_entered_the_gate_zone(tmp_path: Path):
    """A replayed video of a person walking into the gate zone (YOLO, the packaged LLM): the agent lists the tools,
    finds the enter event, and asks in words; the answer carries the event's time."""
    (tmp_path / "media").mkdir()
    keyframed_sliding_person(tmp_path / "media" / "slide.mp4")
    config = {"memory": {"enabled": True}, "sources": {"media_root": str(tmp_path / "media")},
              "models": {"detector": {"backend": "yolo"}}, "video": {"target_fps": 5},
              "voice": {"enabled": False}, "webrtc": {"host_addresses": ["127.0.0.1"]}}
    server = await asyncio.to_thread(VigilProcess(tmp_path, config, token=TOKEN, memory_off=False).start)
    try:
        await asyncio.to_thread(_rest, server, "/api/sources", {
            "path": "slide.mp4", "name": "entrance", "realtime": False, "options": {"video": {"zones": [GATE]}}})
        enter = await asyncio.to_thread(_wait_for_enter, server)
        async with mcp_client(server, TOKEN) as client:
            assert {tool.name for tool in (await client.list_tools()).tools} == TOOLS

            found = (await _call(client, "list_events", {"name": "zone.enter", "source": enter["source"]}))["events"]
            gate = [e for e in found if e["data"]["zone"] == "gate" and e["data"]["label"] == "person"]
            assert [e["id"] for e in gate] == [enter["id"]]
            assert gate[0]["wall_ts"] == pytest.approx(time.time(), abs=120)

            answer = await _call(client, "ask", {"question": "When did someone enter the gate zone?"})
        cited = [r for r in answer["results"] if r["event_id"] == enter["id"]]
        assert cited and cited[0]["wall_time"] == pytest.approx(enter["wall_ts"], abs=0.01), answer["results"]
        at = datetime.fromtimestamp(enter["wall_ts"], UTC)
        assert at.strftime("%H:%M") in answer["answer"] and "gate" in answer["answer"], answer
    finally:
        await asyncio.to_thread(server.stop)
