"""The memory's HTTP API: ``GET /api/search`` over what the timeline store committed, the chat documents'
collections (``/api/collections/...``), and a chat request's documents (``chat_documents``). (The index, its feed
from the timeline, voice recall and the chat service's retriever are built by ``server.services``.)"""

from __future__ import annotations

import dataclasses
import re
import time
from datetime import UTC, datetime
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from pipelines.errors import parse_number
from pipelines.memory.documents import document_entries
from pipelines.memory.entries import KINDS, TIMELINE_KINDS, SearchFilters, SearchHit
from pipelines.memory.index import MemoryIndex, SearchMode
from pipelines.serving.chat import ChatInput
from server.config import Settings
from server.http.errors import ApiError, read_body, validate_json
from server.http.route import Route
from server.state import MEMORY, SETTINGS

_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
SEARCH_PARAMS = frozenset({"q", "source", "session", "kind", "since", "until", "limit", "mode"})
MODES: tuple[SearchMode, ...] = ("hybrid", "keyword", "vector")


def _index(request: web.Request) -> MemoryIndex:
    return enabled_index(request.app.get(MEMORY))


def enabled_index(index: MemoryIndex | None) -> MemoryIndex:
    if index is None:
        raise ApiError("memory_disabled", "memory is disabled (memory.enabled: false)")
    return index


# ---------------------------------------------------------------- search


class SearchResult(BaseModel):
    id: int
    time: str = Field(description="Wall time, ISO 8601 UTC.")
    wall_time: float = Field(description="Wall time, unix seconds.")
    media_time: float | None = Field(None, description="Seconds since the stream's first frame.")
    source: str = Field(description="Session or source id (a document's collection).")
    session: str
    kind: str
    text: str
    score: float = Field(description="Reciprocal rank fusion score (higher is better).")
    matched: list[str] = Field(description="Which searches found it: keyword, vector.")
    event_id: str | None = None
    clip_id: str | None = None
    document_id: str | None = None
    labels: list[str] = []
    track_ids: list[int] = []
    meta: dict[str, Any] = {}


class SearchResponse(BaseModel):
    query: str
    mode: str
    took_ms: float
    timings_ms: dict[str, float] = Field(description="Server-side steps: keyword, embed (the query), vector, fetch "
                                         "(in hybrid mode, keyword runs beside embed and vector).")
    results: list[SearchResult]


def parse_time(name: str, value: str) -> float:
    """Unix seconds (finite: ``nan`` or ``1e400`` would reach the filters) or ISO 8601 (UTC when no zone)."""
    what = "unix seconds (a finite number) or ISO 8601"
    try:
        float(value)
    except ValueError:
        pass
    else:
        return float(parse_number(name, value, code="invalid_time", what=what))
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ApiError("invalid_time", f"{name} must be unix seconds or ISO 8601 (got {value[:64]!r})") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def parse_search(query: dict[str, str], getall: Any, settings: Settings) -> tuple[str, SearchFilters, int, SearchMode]:
    config = settings.memory
    unknown = sorted(set(query) - SEARCH_PARAMS)
    if unknown:
        raise ApiError("unknown_parameter", f"unknown parameter(s) {', '.join(unknown)}; "
                                                 f"known: {', '.join(sorted(SEARCH_PARAMS))}")
    q = query.get("q", "").strip()
    if not q:
        raise ApiError("empty_query", "q is required and must not be empty")
    if len(q) > config.max_query_chars:
        raise ApiError("query_too_long", f"q has {len(q)} characters; the limit is {config.max_query_chars}")
    kinds: list[str] = []
    for value in getall("kind", []):
        kinds += [k.strip() for k in value.split(",") if k.strip()]
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise ApiError("unknown_kind", f"unknown kind(s) {', '.join(bad)[:200]}; known: {', '.join(KINDS)}")
    filters = SearchFilters(kinds=tuple(dict.fromkeys(kinds)) or TIMELINE_KINDS)
    for name in ("source", "session"):
        value = query.get(name)
        if value is not None:
            if not _ID.match(value):
                raise ApiError("invalid_filter", f"{name} must be an id of 1-128 letters, digits, _.:-")
            setattr(filters, name, value)
    if "since" in query:
        filters.since = parse_time("since", query["since"])
    if "until" in query:
        filters.until = parse_time("until", query["until"])
    if filters.since is not None and filters.until is not None and filters.since > filters.until:
        raise ApiError("invalid_time", "since is after until")
    limit = parse_number("limit", query.get("limit", "10"), integer=True, minimum=1, maximum=config.max_results,
                         code="invalid_limit")
    mode = query.get("mode", "hybrid")
    if mode not in MODES:
        raise ApiError("invalid_mode", f"mode must be one of {', '.join(MODES)}")
    return q, filters, limit, mode  # type: ignore[return-value]


def search_result(hit: SearchHit) -> SearchResult:
    e = hit.entry
    return SearchResult(
        id=e.id or 0, time=datetime.fromtimestamp(e.wall_time, UTC).isoformat(), wall_time=e.wall_time,
        media_time=e.media_time, source=e.source, session=e.session, kind=e.kind, text=e.text, score=hit.score,
        matched=[name for name, rank in (("keyword", hit.keyword_rank), ("vector", hit.vector_rank)) if rank],
        event_id=e.event_id, clip_id=e.clip_id, document_id=e.document_id, labels=e.labels, track_ids=e.track_ids,
        meta=e.meta,
    )


async def search(request: web.Request) -> web.Response:
    index = _index(request)
    settings: Settings = request.app[SETTINGS]
    q, filters, limit, mode = parse_search(dict(request.query), request.query.getall, settings)
    body = await run_search(index, q, filters, limit, mode)
    return web.json_response(body.model_dump(mode="json"))


async def run_search(index: MemoryIndex, q: str, filters: SearchFilters, limit: int,
                     mode: SearchMode = "hybrid") -> SearchResponse:
    """``GET /api/search`` and the MCP tools ``search_memory`` and ``ask`` alike."""
    started = time.perf_counter()
    timings: dict[str, float] = {}
    hits = await index.search(q, filters, limit, mode, timings)
    took = round((time.perf_counter() - started) * 1000.0, 2)
    return SearchResponse(query=q, mode=mode, took_ms=took, timings_ms=timings,
                          results=[search_result(h) for h in hits])


# ---------------------------------------------------------------- documents


class DocumentBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=200, description="Shown in sources.")
    text: str = Field(min_length=1, description="The document, UTF-8 text or Markdown.")
    format: str = Field("markdown", pattern="^(markdown|text)$")


class DocumentInfo(BaseModel):
    id: str
    collection: str
    name: str | None
    chunks: int
    created: float | None = None


class DocumentList(BaseModel):
    collection: str
    documents: list[DocumentInfo]


class DocumentChunk(BaseModel):
    index: int
    text: str


class DocumentDetail(DocumentInfo):
    content: list[DocumentChunk]


def _collection(request: web.Request) -> str:
    name = request.match_info["collection"]
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name):
        raise ApiError("invalid_collection", "a collection name is 1-64 letters, digits, _ . -")
    return name


async def add_document(request: web.Request) -> web.Response:
    index = _index(request)
    settings: Settings = request.app[SETTINGS]
    limits = settings.memory.documents
    collection = _collection(request)
    # Its own limit, not server.max_body_bytes (256 KiB), which request.read() would apply first.
    raw = await read_body(request, limits.max_document_bytes, code="document_too_large", what="document")
    if request.content_type == "application/json":
        body = validate_json(raw, DocumentBody)  # the one JSON parser: invalid_json 400, invalid_body 422
    elif request.content_type in ("text/plain", "text/markdown"):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ApiError("invalid_text", "the document is not UTF-8 text") from None
        name = request.query.get("name") or "untitled"
        fmt = "markdown" if request.content_type == "text/markdown" else "text"
        try:
            body = DocumentBody(name=name[:200], text=text, format=fmt)
        except ValueError:
            raise ApiError("empty_document", "the document is empty") from None
    else:
        raise ApiError("unsupported_media_type",
                       "send application/json {name, text, format}, or text/plain or text/markdown with ?name=")
    if not body.text.strip():
        raise ApiError("empty_document", "the document is empty")
    document_id, entries = document_entries(
        collection, body.name, body.text, markdown=body.format == "markdown", chunk_chars=limits.chunk_chars,
        overlap_chars=limits.chunk_overlap_chars)
    await index.add_now(entries)
    info = DocumentInfo(id=document_id, collection=collection, name=body.name, chunks=len(entries),
                        created=entries[0].wall_time if entries else None)
    return web.json_response(info.model_dump(), status=201)


async def list_documents(request: web.Request) -> web.Response:
    index = _index(request)
    collection = _collection(request)
    documents = [DocumentInfo(collection=collection, **d) for d in await index.documents(collection)]  # type: ignore[arg-type]
    return web.json_response(DocumentList(collection=collection, documents=documents).model_dump())


async def get_document(request: web.Request) -> web.Response:
    index = _index(request)
    collection = _collection(request)
    chunks = await index.document_chunks(request.match_info["document_id"][:64])
    chunks = [c for c in chunks if c.source == collection]
    if not chunks:
        raise ApiError("not_found", "no such document in this collection")
    detail = DocumentDetail(id=chunks[0].document_id or "", collection=collection, name=chunks[0].meta.get("name"),
                            chunks=len(chunks), created=chunks[0].wall_time,
                            content=[DocumentChunk(index=c.meta.get("chunk", i), text=c.text)
                                     for i, c in enumerate(chunks)])
    return web.json_response(detail.model_dump())


async def delete_document(request: web.Request) -> web.Response:
    index = _index(request)
    collection = _collection(request)
    document_id = request.match_info["document_id"][:64]
    chunks = await index.document_chunks(document_id)
    if not chunks or chunks[0].source != collection:
        raise ApiError("not_found", "no such document in this collection")
    await index.delete_document(document_id)
    return web.Response(status=204)


# ---------------------------------------------------------------- the chat API's collections


async def chat_documents(index: MemoryIndex, settings: Settings, raw: dict[str, Any],
                         chat: ChatInput) -> tuple[ChatInput, list[dict[str, Any]]]:
    """The request's collection (``vigil: {collection}``, else ``memory.documents.chat_collection``): its chunks
    closest to the last user message go into the prompt's documents; their sources go back in the response."""
    config = settings.memory.documents
    extension = raw.get("vigil")
    if extension is not None and not isinstance(extension, dict):
        raise ApiError("invalid_request", "vigil must be an object, e.g. {\"collection\": \"manuals\"}", param="vigil")
    collection = (extension or {}).get("collection", config.chat_collection)
    if collection is None:
        return chat, []
    if not isinstance(collection, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", collection):
        raise ApiError("invalid_request", "vigil.collection must be a collection name (1-64 letters, digits, _ . -)",
                             param="vigil.collection")
    question = next((m.content for m in reversed(chat.messages) if m.role == "user"), "")
    if not question.strip():
        return chat, []
    if not await index.documents(collection):
        raise ApiError("collection_not_found", f"collection {collection!r} has no documents",
                       param="vigil.collection")
    room = max(settings.api.prompt.max_context_documents - len(chat.documents), 0)
    hits = await index.search(question[: settings.memory.max_query_chars],
                              SearchFilters(kinds=("document",), source=collection), min(config.chat_top_k, room))
    sources = [{"collection": collection, "document_id": h.entry.document_id, "name": h.entry.meta.get("name"),
                "chunk": h.entry.meta.get("chunk"), "score": h.score, "text": h.entry.text} for h in hits]
    documents = [h.entry.text for h in hits] + list(chat.documents)
    return dataclasses.replace(chat, documents=documents), sources


# ---------------------------------------------------------------- routes (also in /openapi.json)


_ERRORS = (400, 401, 413, 503)
MEMORY_ROUTES: tuple[Route, ...] = (
    Route("GET", "/api/search", search, "Search memory: hybrid keyword + vector, fused by reciprocal rank; "
          "query parameters q, source, session, kind, since, until, limit, mode", response=SearchResponse,
          errors=_ERRORS),
    Route("POST", "/api/collections/{collection}/documents", add_document,
          "Add a document (JSON {name, text, format}, or a text/plain or text/markdown body) to a collection",
          DocumentBody, DocumentInfo, status=201, errors=(*_ERRORS, 415, 422)),
    Route("GET", "/api/collections/{collection}/documents", list_documents, "A collection's documents",
          response=DocumentList, errors=(400, 401, 503)),
    Route("GET", "/api/collections/{collection}/documents/{document_id}", get_document,
          "A document and its chunks", response=DocumentDetail, errors=(400, 401, 404, 503)),
    Route("DELETE", "/api/collections/{collection}/documents/{document_id}", delete_document,
          "Delete a document and its chunks", status=204, errors=(400, 401, 404, 503)),
)


