"""From what a session or source publishes (protocol messages) to memory entries: final transcripts, complete
replies, zone/line events and, at most every ``scene_interval_s``, a scene summary when the scene changed.

This is the one place that decides what is remembered. When the timeline store (events and clips) lands, its
entries can feed ``MemoryIndex.add`` instead, and this tap goes."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Any

from pipelines.memory.entries import MemoryEntry
from pipelines.protocol import Event, Reply, ServerMessage, Transcript

if TYPE_CHECKING:
    from pipelines.session import SessionPipeline


def describe_event(name: str, data: dict[str, Any]) -> str:
    """One English sentence for an event: what is embedded and shown in search results."""
    who = f"{data.get('label') or 'object'}" + (f" (track {data['track_id']})" if data.get("track_id") is not None
                                                 else "")
    if name == "zone.enter":
        return f"{who} entered zone '{data.get('zone')}'"
    if name == "zone.exit":
        dwell = f" after {data['dwell_s']:.1f} s" if isinstance(data.get("dwell_s"), int | float) else ""
        return f"{who} left zone '{data.get('zone')}'{dwell}"
    if name == "line.cross":
        return f"{who} crossed line '{data.get('line')}' going {data.get('direction', '?')}"
    details = ", ".join(f"{key} {value}" for key, value in data.items() if not isinstance(value, dict | list))
    return f"{name}: {details}" if details else name


class SessionTap:
    """Watches one pipeline's messages (call it with each one) and hands entries to ``add``."""

    def __init__(self, pipeline: SessionPipeline, add: Callable[[Sequence[MemoryEntry]], int], *,
                 event_names: Sequence[str], scene_interval_s: float) -> None:
        self.pipeline = pipeline
        self._add = add
        self._event_names = tuple(event_names)
        self._scene_interval_s = scene_interval_s
        self._replies: dict[int, list[str]] = {}
        self._last_scene_at = 0.0
        self._last_scene = ""

    def _entry(self, kind: str, text: str, message: ServerMessage, **fields: Any) -> MemoryEntry:
        session = self.pipeline.session_id
        return MemoryEntry(kind=kind, text=text, source=session, session=session, media_time=message.pts,
                           wall_time=time.time(), meta={"origin": self.pipeline.origin, **fields.pop("meta", {})},
                           **fields)

    def __call__(self, message: ServerMessage) -> None:
        if isinstance(message, Transcript):
            if message.final and message.text.strip():
                self._add([self._entry("transcript", message.text.strip(), message, meta={"turn": message.turn})])
        elif isinstance(message, Reply):
            parts = self._replies.setdefault(message.turn, [])
            if message.delta:
                parts.append(message.delta)
            if message.done:
                text = "".join(self._replies.pop(message.turn, [])).strip()
                if text:
                    self._add([self._entry("reply", text, message, meta={"turn": message.turn})])
        elif isinstance(message, Event):
            if any(fnmatchcase(message.name, pattern) for pattern in self._event_names):
                self._add([self._event(message)])
        self._maybe_scene(message)

    def _event(self, message: Event) -> MemoryEntry:
        data = message.data
        track = data.get("track_id")
        return self._entry(
            "alert" if message.name.startswith("alert") else "event", describe_event(message.name, data), message,
            event_id=str(data["id"]) if data.get("id") is not None else None,
            clip_id=str(data["clip_id"]) if data.get("clip_id") is not None else None,
            labels=[str(data["label"])] if data.get("label") else [],
            track_ids=[int(track)] if isinstance(track, int) else [],
            meta={"event": message.name, **{k: v for k, v in data.items() if k in ("zone", "line", "direction")}},
        )

    def _maybe_scene(self, message: ServerMessage) -> None:
        scene = self.pipeline.scene
        now = time.monotonic()
        if scene.pts is None or now - self._last_scene_at < self._scene_interval_s:
            return
        summary = scene.summary()
        if summary == self._last_scene:
            return
        self._last_scene_at, self._last_scene = now, summary
        track_ids = sorted({i for ids in scene.zone_occupancy.values() for i in ids})
        self._add([MemoryEntry(kind="scene", text=summary, source=self.pipeline.session_id,
                               session=self.pipeline.session_id, media_time=scene.pts, wall_time=time.time(),
                               labels=list(scene.counts), track_ids=track_ids,
                               meta={"origin": self.pipeline.origin, "counts": scene.counts})])
