"""From the timeline (``pipelines.timeline.store``) to memory: every committed entry worth remembering becomes one
``MemoryEntry``. The timeline is the one record of what sessions and sources saw and heard; memory indexes it.

``memory_entry`` is the one mapping; ``TimelineFeed`` is the store's commit listener. It runs on the timeline's
writer thread, so it only maps and then hops to the event loop (``MemoryIndex.add`` uses an asyncio queue)."""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from fnmatch import fnmatchcase
from typing import Any

from pipelines.memory.entries import MemoryEntry
from pipelines.timeline.store import TimelineEntry

log = logging.getLogger(__name__)

SCENE_SOURCES_MAX = 4096  # sources whose last scene is remembered (to skip unchanged ones)


def describe_event(name: str, data: dict[str, Any]) -> str:
    """One English sentence for an event: what is embedded and shown in search results."""
    who = f"{data.get('label') or 'object'}" + (f" (track {data['track_id']})" if data.get("track_id") is not None
                                                 else "")
    identity, plate = data.get("identity") or {}, data.get("plate") or {}
    if identity.get("name"):  # search finds "when did Alice come?"
        who = f"{identity['name']}, a {who},"
    if plate.get("text"):  # and a car by its plate or its name
        who += f" with plate {plate['text']}" + (f" ({plate['name']})" if plate.get("name") else "")
    if name == "zone.enter":
        return f"{who} entered zone '{data.get('zone')}'"
    if name == "zone.exit":
        dwell = f" after {data['dwell_s']:.1f} s" if isinstance(data.get("dwell_s"), int | float) else ""
        return f"{who} left zone '{data.get('zone')}'{dwell}"
    if name == "line.cross":
        return f"{who} crossed line '{data.get('line')}' going {data.get('direction', '?')}"
    if name == "object.appeared":
        return f"{who} appeared"
    details = ", ".join(f"{key} {value}" for key, value in data.items() if not isinstance(value, dict | list))
    return f"{name}: {details}" if details else name


def describe_scene(data: dict[str, Any]) -> str:
    """A scene entry's counts (and tracks) in the words ``SceneState.summary`` uses."""
    counts = data.get("counts") or {}
    seen = ", ".join(f"{n} {label}{'s' if n != 1 else ''}" for label, n in counts.items()) or "nothing"
    tracks = ", ".join(f"{t.get('label')} {t.get('id')}" for t in data.get("tracks") or [])
    return f"The camera currently sees {seen}." + (f" Tracks: {tracks}." if tracks else "")


def memory_entry(entry: TimelineEntry) -> MemoryEntry:
    """The one mapping from a timeline entry to what memory indexes (its text is what is embedded and searched)."""
    data = entry.data
    meta: dict[str, Any] = {"origin": entry.origin, "name": entry.name}
    if entry.source_name:
        meta["source_name"] = entry.source_name
    labels: list[str] = []
    track_ids: list[int] = []
    if entry.kind == "event":
        text = describe_event(entry.name, data)
        meta.update({"event": entry.name, **{k: v for k, v in data.items() if k in ("zone", "line", "direction")}})
    elif entry.kind == "scene":
        text = describe_scene(data)
        meta["counts"] = data.get("counts") or {}
        labels = list(meta["counts"])
        track_ids = [t["id"] for t in data.get("tracks") or [] if isinstance(t.get("id"), int)]
    else:  # transcript, reply, alert: their own words
        text = (entry.text or "").strip()
        meta.update({k: v for k, v in data.items() if k in ("turn", "event", "zone", "line", "spoken")})
    if entry.kind != "scene":
        labels = [str(data["label"])] if data.get("label") else []
        track_ids = [data["track_id"]] if isinstance(data.get("track_id"), int) else []
    return MemoryEntry(
        kind=entry.kind, text=text, source=entry.source, session=entry.source, media_time=entry.pts,
        wall_time=entry.wall_ts, event_id=entry.id, timeline_seq=entry.seq,
        # The entry's clip is served at /api/events/{id}/clip.mp4 once written (pending until then).
        clip_id=entry.id if entry.clip_state in ("pending", "ready") else None,
        labels=labels, track_ids=track_ids, meta=meta,
    )


class TimelineFeed:
    """The timeline store's commit listener: maps entries, keeps events matching ``event_names`` and scene
    summaries that changed (per source), and hands them to ``add`` on ``loop``."""

    def __init__(self, add: Callable[[Sequence[MemoryEntry]], int], loop: asyncio.AbstractEventLoop, *,
                 event_names: Sequence[str]) -> None:
        self._add, self._loop = add, loop
        self._event_names = tuple(event_names)
        # source -> last scene text indexed (writer thread only); bounded: sessions come and go for months
        self._last_scene: OrderedDict[str, str] = OrderedDict()

    def __call__(self, committed: list[TimelineEntry]) -> None:
        entries = [memory_entry(e) for e in committed if self._wanted(e)]
        entries = [e for e in entries if e.text and self._new_scene(e)]
        if entries and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._add, entries)

    def backlog(self, committed: Sequence[TimelineEntry],
                last_scene: Callable[[str], str | None]) -> tuple[list[MemoryEntry], int]:
        """Catching up (``MemoryIndex.catch_up``, blocking): the entries the live feed would have indexed, and the
        last seq looked at. A scene counts as changed against the last one memory holds for its source
        (``last_scene``), not the live feed's own (another thread's)."""
        scenes: dict[str, str | None] = {}
        kept: list[MemoryEntry] = []
        for entry in (memory_entry(e) for e in committed if self._wanted(e)):
            if not entry.text:
                continue
            if entry.kind == "scene":
                previous = scenes[entry.source] if entry.source in scenes else last_scene(entry.source)
                if previous == entry.text:
                    continue
                scenes[entry.source] = entry.text
            kept.append(entry)
        return kept, max((e.seq or 0 for e in committed), default=0)

    def _wanted(self, entry: TimelineEntry) -> bool:
        return entry.kind != "event" or any(fnmatchcase(entry.name, p) for p in self._event_names)

    def _new_scene(self, entry: MemoryEntry) -> bool:
        if entry.kind != "scene":
            return True
        if self._last_scene.get(entry.source) == entry.text:
            return False
        self._last_scene[entry.source] = entry.text
        self._last_scene.move_to_end(entry.source)
        while len(self._last_scene) > SCENE_SOURCES_MAX:
            self._last_scene.popitem(last=False)
        return True
