"""``/api/events``: the persisted timeline, event clips (range requests) and snapshots. (The timeline store and
the recorder every session and source gets are built by ``server.services``.)"""

from __future__ import annotations

import asyncio
import math
import os
import re
from pathlib import Path
from typing import Any, Literal

from aiohttp import hdrs, web
from pydantic import BaseModel, Field

from pipelines.errors import parse_number
from pipelines.timeline.store import ENTRY_KINDS, StorageUnavailable, TimelineEntry, TimelineStore
from pipelines.video.plates import normalise_plate
from server.http.errors import ApiError
from server.http.route import Route
from server.state import TIMELINE

MAX_PAGE = 500


class EventInfo(BaseModel):
    id: str
    kind: Literal["event", "transcript", "reply", "scene", "alert"]
    name: str = Field(description="zone.enter, zone.exit, line.cross, object.appeared, transcript, reply, ...")
    source: str = Field(description="The session or source id.")
    origin: str
    source_name: str | None
    wall_ts: float = Field(description="Seconds since the epoch.")
    pts: float | None = Field(description="Media time (seconds since the stream's first frame).")
    text: str | None
    data: dict[str, Any]
    clip_state: str = Field(description="none | pending | ready | failed | deleted (by retention)")
    has_clip: bool
    has_snapshot: bool
    clip_start_pts: float | None
    clip_duration_s: float | None
    clip_error: str | None = Field(None, description="Why the clip is failed (e.g. the server stopped before it "
                                   "was written).")
    clip_url: str | None = None
    snapshot_url: str | None = None


class EventList(BaseModel):
    events: list[EventInfo]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next (older) page; null at the end.")


def event_info(entry: TimelineEntry) -> EventInfo:
    info = EventInfo.model_validate(entry.as_dict())
    if entry.clip:
        info.clip_url = f"/api/events/{entry.id}/clip.mp4"
    if entry.snapshot:
        info.snapshot_url = f"/api/events/{entry.id}/snapshot.jpg"
    return info


def _store(request: web.Request) -> TimelineStore:
    return usable_store(request.app.get(TIMELINE))


def usable_store(store: TimelineStore | None) -> TimelineStore:
    """The stored timeline, or the error every reader of it answers (off, or its storage unusable)."""
    if store is None:
        raise ApiError("not_found", "the timeline is off (storage.enabled: false)")
    if not store.available:
        raise ApiError("storage_unavailable", store.open_error or "timeline storage unavailable")
    return store


async def stored_event(store: TimelineStore, event_id: str) -> TimelineEntry:
    entry = await _blocking(store.get, event_id)
    if entry is None:
        raise ApiError("not_found", "no such event")
    return entry


def _float(request: web.Request, name: str) -> float | None:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return None
    return float(parse_number(name, raw, what="a finite number (seconds since the epoch)"))


async def _blocking(fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return await asyncio.to_thread(fn, *args, **kwargs)
    except StorageUnavailable as error:
        raise ApiError("storage_unavailable", str(error)) from None


async def list_events(request: web.Request) -> web.Response:
    store = _store(request)
    query = request.query
    limit = parse_number("limit", query.get("limit", "50"), integer=True, minimum=1, maximum=MAX_PAGE)
    cursor = parse_number("cursor", query["cursor"], integer=True) if query.get("cursor") else None
    kinds = tuple(k for k in query.get("kind", "event,alert").split(",") if k)
    page = await find_events(store, source=query.get("source") or query.get("session") or None,
                             name=query.get("name") or None, kinds=kinds, since=_float(request, "since"),
                             until=_float(request, "until"), cursor=cursor, limit=limit,
                             identity=query.get("identity") or None, plate=query.get("plate") or None)
    return web.json_response(text=page.model_dump_json())


async def find_events(store: TimelineStore, *, source: str | None = None, name: str | None = None,
                      kinds: tuple[str, ...] = ("event", "alert"), since: float | None = None,
                      until: float | None = None, cursor: int | None = None, limit: int = 50,
                      identity: str | None = None, plate: str | None = None) -> EventList:
    """One page of the timeline, newest first: ``GET /api/events`` and the MCP tool ``list_events`` alike."""
    if not kinds or any(k not in ENTRY_KINDS for k in kinds):
        raise ApiError("invalid_parameter", f"kind must be a comma-separated list of {', '.join(ENTRY_KINDS)}")
    if since is not None and until is not None and since > until:  # as /api/search answers it
        raise ApiError("invalid_parameter", "since is after until", param="since")
    entries = await _blocking(store.query, source=source, name=name, kinds=kinds, since=since, until=until,
                              before_seq=cursor, limit=limit, identity=identity,
                              plate=normalise_plate(plate or "") or None)
    next_cursor = str(entries[-1].seq) if len(entries) == limit else None
    return EventList(events=[event_info(e) for e in entries], next_cursor=next_cursor)


async def _entry_or_404(request: web.Request) -> tuple[TimelineStore, TimelineEntry]:
    store = _store(request)
    return store, await stored_event(store, request.match_info["event_id"])


async def get_event(request: web.Request) -> web.Response:
    _, entry = await _entry_or_404(request)
    return web.json_response(text=event_info(entry).model_dump_json())


def _media_file(store: TimelineStore, relative: str | None) -> tuple[Path, os.stat_result] | None:
    path = store.media_path(relative)
    if path is None:
        return None
    try:
        return path, path.stat()
    except OSError:  # removed meanwhile (retention)
        return None


def _if_range_holds(request: web.Request, stat: os.stat_result) -> bool:
    """Whether a Range may be served (RFC 9110 13.1.5): no If-Range, or one naming this file, by its strong ETag
    (aiohttp's FileResponse sends ``"<mtime_ns>-<size>"``) or exactly its Last-Modified date (to the second, as
    sent). A weak, other or unreadable validator means the client's copy is not this file: 200, all of it."""
    given = request.headers.get(hdrs.IF_RANGE)
    if given is None:
        return True
    given = given.strip()
    if given.startswith(("W/", '"')):
        return given == f'"{stat.st_mtime_ns:x}-{stat.st_size:x}"'
    moment = request.if_range
    return moment is not None and math.ceil(stat.st_mtime) == moment.timestamp()  # aiohttp sends it rounded up


def _range_unsatisfiable(request: web.Request, size: int) -> bool:
    """Whether the Range cannot be served, decided here as FileResponse would (it sends an empty body; Vigil's 416
    carries its JSON error): a malformed Range, one that starts at or past the end, or a zero-length suffix
    (``bytes=-0``, which aiohttp reads as ``bytes=0-``; RFC 9110 14.1.3: unsatisfiable)."""
    if re.fullmatch(r"\s*bytes\s*=\s*-0+\s*", request.headers.get(hdrs.RANGE, ""), re.IGNORECASE):
        return True
    try:
        wanted = request.http_range
    except ValueError:
        return True
    if wanted.start is None or (wanted.start < 0 and wanted.stop is None):  # no range, or the last N bytes
        return False
    return wanted.start >= size


class _DecidedFile(web.FileResponse):
    """A FileResponse whose If-Range was decided here (``_if_range_holds``; FileResponse knows no ETags there, and
    compares dates to the sub-second mtime): it is prepared for the request without If-Range, and without its
    Range when ``whole`` (200, the whole file)."""

    def __init__(self, path: Path, *, whole: bool, headers: dict[str, str]) -> None:
        super().__init__(path, headers=headers)
        self._whole = whole

    async def prepare(self, request: web.BaseRequest) -> Any:
        headers = request.headers.copy()
        headers.popall(hdrs.IF_RANGE, None)
        if self._whole:
            headers.popall(hdrs.RANGE, None)
        return await super().prepare(request.clone(headers=headers))


async def _file(request: web.Request, which: Literal["clip", "snapshot"], content_type: str) -> web.FileResponse:
    store, entry = await _entry_or_404(request)
    found = await asyncio.to_thread(_media_file, store, entry.clip if which == "clip" else entry.snapshot)
    if found is None:
        state = f" (clip {entry.clip_state})" if which == "clip" else ""
        raise ApiError("not_found", f"this event has no {which}{state}")
    path, stat = found
    headers = {"Content-Type": content_type, "Cache-Control": "private, max-age=3600"}
    if not _if_range_holds(request, stat):
        return _DecidedFile(path, whole=True, headers=headers)
    if _range_unsatisfiable(request, stat.st_size):
        raise ApiError("range_not_satisfiable", f"the requested range is not within the {which}'s "
                       f"{stat.st_size} bytes", headers={"Content-Range": f"bytes */{stat.st_size}"})
    # FileResponse answers Range requests (206 with the requested bytes), so a browser can seek in the clip.
    return _DecidedFile(path, whole=False, headers=headers)


async def get_event_clip(request: web.Request) -> web.FileResponse:
    return await _file(request, "clip", "video/mp4")


async def get_event_snapshot(request: web.Request) -> web.FileResponse:
    return await _file(request, "snapshot", "image/jpeg")


async def delete_event(request: web.Request) -> web.Response:
    store, entry = await _entry_or_404(request)
    await _blocking(store.delete, entry.id)
    return web.Response(status=204)


_ONE = "/api/events/{event_id}"
EVENT_ROUTES: tuple[Route, ...] = (
    Route("GET", "/api/events", list_events,
          "The timeline, newest first (?source=&session=&name=&kind=&since=&until=&limit=&cursor=&identity=&plate=)",
          response=EventList, errors=(400, 401, 404, 503)),
    Route("GET", _ONE, get_event, "One stored event", response=EventInfo, errors=(401, 404, 503)),
    Route("GET", _ONE + "/clip.mp4", get_event_clip, "The event's MP4 clip (HTTP range requests: 206)",
          errors=(401, 404, 416, 503), content_type="video/mp4"),
    Route("GET", _ONE + "/snapshot.jpg", get_event_snapshot, "The event frame with its boxes drawn (JPEG)",
          errors=(401, 404, 416, 503), content_type="image/jpeg"),
    Route("DELETE", _ONE, delete_event, "Delete a stored event, its snapshot and (unless shared) its clip",
          status=204, errors=(401, 404, 503)),
)
