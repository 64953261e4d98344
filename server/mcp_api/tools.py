"""The MCP tools: what an agent may ask Vigil, answered with the REST API's own response models (so each tool's
structured content has the same fields as its endpoint) by the same functions the HTTP handlers use."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal, TypeVar

from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, Field

from models.llm import ChatMessage, LlmRequest
from pipelines.errors import ApiError
from pipelines.memory.entries import KINDS, TIMELINE_KINDS, SearchFilters
from pipelines.memory.index import MemoryIndex
from pipelines.memory.recall import fit_entries, format_entry_time_last
from pipelines.timeline.store import TimelineStore
from server.config import Settings
from server.engines import Engines
from server.media.routes import Scene, SourceInfo
from server.media.sources import SourceManager
from server.records.events import EventList, event_info, find_events, stored_event, usable_store
from server.records.faces import PeopleList, PersonInfo
from server.records.memory import SearchResponse, SearchResult, enabled_index, run_search, search_result

_Tool = TypeVar("_Tool", bound=Callable[..., Awaitable[Any]])


def reported(tool: _Tool) -> _Tool:
    """An ``ApiError`` becomes the SDK's ``ToolError``: the agent reads its code and message (any other exception
    is a crash, which the SDK answers without its text)."""

    @functools.wraps(tool)
    async def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return await tool(*args, **kwargs)
        except ApiError as error:
            raise ToolError(f"{error.code}: {error.message}") from None

    return call  # type: ignore[return-value]


MAX_EVENTS = 200  # a page of list_events (an agent's context is small: /api/events allows 500)

# The example shows the small LLM the shape of a grounded answer: what happened, then the time the entry gives
# (told only "say when", it copied the entry's words and left the time out).
ASK_SYSTEM = ("You answer questions about what Vigil's cameras and microphones saw and heard, only from the "
              "remembered entries below (most relevant first), in one sentence that says what happened and the "
              "time the entry gives (e.g. 'A person entered zone 'door' at 14:05:09 UTC.'). If they do not answer "
              "the question, say that you do not remember it.\n")


class SourceWithScene(SourceInfo):
    scene: Scene = Field(description="What the source's camera sees now (GET /api/sources/{id}/scene).")


class SourceScenes(BaseModel):
    sources: list[SourceWithScene]


class SnapshotLink(BaseModel):
    id: str
    snapshot_url: str | None = Field(description="Path of the event's JPEG snapshot on this server (GET with the "
                                     "API token); null when none was recorded.")
    clip_url: str | None = Field(description="Path of the event's MP4 clip; null when none was recorded.")
    clip_state: str


class Answer(BaseModel):
    question: str
    answer: str
    results: list[SearchResult] = Field(description="The memory entries the answer was made from.")


Since = Annotated[float | None, Field(description="Only entries at or after this time (unix seconds).")]
Until = Annotated[float | None, Field(description="Only entries at or before this time (unix seconds).")]
SourceId = Annotated[str | None, Field(description="Only this session or source id.")]


class VigilTools:
    """The tools, bound to the app's services (constructor arguments, as every service gets them)."""

    def __init__(self, settings: Settings, engines: Engines, timeline: TimelineStore | None,
                 memory: MemoryIndex | None, sources: SourceManager) -> None:
        self.settings = settings
        self.engines = engines
        self.timeline = timeline
        self.memory = memory
        self.sources = sources

    @reported
    async def search_memory(
            self, query: Annotated[str, Field(description="What to look for, in words.")],
            source: SourceId = None,
            kind: Annotated[list[str] | None, Field(description=f"Entry kinds among {', '.join(KINDS)}; "
                                                   "default: what sessions and sources saw and heard.")] = None,
            since: Since = None, until: Until = None,
            limit: Annotated[int, Field(ge=1, le=100)] = 10,
            mode: Literal["hybrid", "keyword", "vector"] = "hybrid") -> SearchResponse:
        """Search memory: what Vigil's sessions and sources saw and heard (events, transcripts, replies, scene
        summaries, alerts) and the chat documents, by keyword and by meaning (as GET /api/search)."""
        index = enabled_index(self.memory)
        query = query.strip()
        if not query:
            raise ApiError("empty_query", "query must not be empty")
        bad = [k for k in kind or () if k not in KINDS]
        if bad:
            raise ApiError("unknown_kind", f"unknown kind(s) {', '.join(bad)[:200]}; known: {', '.join(KINDS)}")
        if since is not None and until is not None and since > until:
            raise ApiError("invalid_time", "since is after until")
        filters = SearchFilters(kinds=tuple(dict.fromkeys(kind or ())) or TIMELINE_KINDS, source=source,
                                since=since, until=until)
        return await run_search(index, query[:self.settings.memory.max_query_chars], filters,
                                min(limit, self.settings.memory.max_results), mode)

    @reported
    async def list_events(
            self, source: SourceId = None,
            name: Annotated[str | None, Field(description="zone.enter, zone.exit, line.cross, object.appeared, "
                                              "alert ...")] = None,
            since: Since = None, until: Until = None,
            identity: Annotated[str | None, Field(description="Only events of this enrolled person.")] = None,
            plate: Annotated[str | None, Field(description="Only events of this licence plate.")] = None,
            limit: Annotated[int, Field(ge=1, le=MAX_EVENTS)] = 20,
            cursor: Annotated[int | None, Field(description="next_cursor of the previous page.")] = None,
    ) -> EventList:
        """The stored events and alerts, newest first (as GET /api/events), with their snapshot and clip paths."""
        return await find_events(usable_store(self.timeline), source=source, name=name, since=since, until=until,
                                 identity=identity, plate=plate, limit=limit, cursor=cursor)

    @reported
    async def list_sources(self) -> SourceScenes:
        """The server-side sources (RTSP cameras, files; as GET /api/sources), each with what it sees now."""
        return SourceScenes(sources=[
            SourceWithScene.model_validate({**source.describe(), "scene": Scene(
                **source.pipeline.scene.as_dict(), summary=source.pipeline.scene.summary())})
            for source in list(self.sources.sources.values()) if source.reader is not None])

    @reported
    async def get_snapshot_url(self, event_id: Annotated[str, Field(description="An event's id.")]) -> SnapshotLink:
        """Where an event's snapshot (JPEG, boxes drawn) and clip (MP4) are served on this server."""
        info = event_info(await stored_event(usable_store(self.timeline), event_id))
        return SnapshotLink(id=info.id, snapshot_url=info.snapshot_url, clip_url=info.clip_url,
                            clip_state=info.clip_state)

    @reported
    async def list_faces(self) -> PeopleList:
        """The people enrolled for face recognition (as GET /api/faces)."""
        gallery = await asyncio.to_thread(self.engines.face_gallery)
        return PeopleList(people=[PersonInfo(**p.info()) for p in gallery.people()])

    @reported
    async def ask(self, question: Annotated[str, Field(description="A question about what happened.")],
                  source: SourceId = None) -> Answer:
        """Answer a question about the past from memory, in words, by Vigil's LLM (as the voice loop recalls)."""
        index = enabled_index(self.memory)
        question = question.strip()
        if not question:
            raise ApiError("empty_query", "question must not be empty")
        config = self.settings.mcp
        hits = await index.search(question[:self.settings.memory.max_query_chars],
                                  SearchFilters(kinds=("transcript", "event", "scene", "alert"), source=source),
                                  config.ask_entries)
        lines = fit_entries(hits, config.ask_entries, config.ask_context_tokens, time.time(),
                            format_entry_time_last)
        remembered = "\n".join(lines) if lines else "(nothing in memory matches)"
        llm = await asyncio.to_thread(self.engines.llm)  # loads on first use: seconds
        request = LlmRequest(messages=[ChatMessage("system", ASK_SYSTEM + remembered),
                                       ChatMessage("user", question)],
                             max_tokens=config.ask_answer_tokens, repeat_penalty=1.1)
        parts: list[str] = []
        async with contextlib.aclosing(llm.stream(request)) as stream:
            async for text in stream:
                parts.append(text)
        return Answer(question=question, answer="".join(parts).strip(), results=[search_result(h) for h in hits])
