"""One session's or source's recorder: timeline entries, the video ring buffer, event clips and snapshots.

The pipeline calls it from the event loop (decoded frames, and every outgoing message once); an RTSP or file source's
reader thread hands it the demuxed packets. Nothing here blocks: entries go to the store's bounded queue, clips
and snapshots are written on the clip executor. A storage failure is reported once per recorder as an ``error``
message (code ``storage_unavailable``); events keep flowing live.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import av

from pipelines.ports import AnalysedFrame, SessionView
from pipelines.protocol import Clip, Event, Reply, ServerMessage, Transcript
from pipelines.scene import trusted
from pipelines.timeline.alerts import AlertAnnouncer, AlertSwitch
from pipelines.timeline.media import (
    FrameRing,
    PacketRing,
    PacketTemplate,
    encode_clip,
    remux_clip,
    write_snapshot,
)
from pipelines.timeline.store import TimelineEntry, TimelineStore

log = logging.getLogger(__name__)

# How far behind the newest packet an analysed frame may be (analysis queueing) and still get its pre_s.
ANALYSIS_LAG_S = 2.0


@dataclass(frozen=True, slots=True)
class AppearRule:
    label: str
    min_conf: float = 0.0


@dataclass(frozen=True, slots=True)
class RecorderSettings:
    clips: bool = True
    pre_s: float = 3.0
    post_s: float = 3.0
    max_s: float = 60.0
    clip_fps: float = 10.0
    scene_interval_s: float = 5.0
    quota_bytes: int | None = None
    appear: tuple[AppearRule, ...] = ()


@dataclass(slots=True)
class _PendingClip:
    event_ids: list[str]
    start: float  # stream seconds
    end: float
    cap: float
    items: list[tuple[float, Any]]
    start_pts: float  # pipeline media time of ``start``


@dataclass(slots=True)
class _Turn:
    text: list[str] = field(default_factory=list)


class TimelineRecorder:
    """``mode``: ``packets`` (RTSP/file: remux), ``frames`` (WebRTC: encode) or ``none`` (entries only)."""

    def __init__(self, store: TimelineStore, settings: RecorderSettings, executor: Executor, *,
                 mode: Literal["packets", "frames", "none"], source_name: str | None = None,
                 alerts: AlertSwitch | None = None) -> None:
        self.store = store
        self.settings = settings
        self.mode = mode if settings.clips else "none"
        self.source_name = source_name
        self._executor = executor
        self._pipeline: Any = None  # a SessionView once attached
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()  # ring, template and pending clip: shared with the reader thread
        self._packets = PacketRing(settings.pre_s + ANALYSIS_LAG_S)
        self._frames = FrameRing(settings.pre_s + ANALYSIS_LAG_S, settings.clip_fps)
        self._template: PacketTemplate | None = None
        self._stream: av.VideoStream | None = None
        self._offset = 0.0
        self._pending: _PendingClip | None = None
        self._writes: set[asyncio.Future[Any]] = set()
        self._reported = False  # a storage failure was reported (once); writing is still tried
        self._seen_tracks: set[int] = set()
        self._next_scene_pts: float | None = None
        self._replies: dict[int, _Turn] = {}
        self._alerts: AlertAnnouncer | None = None
        self._alert_switch = alerts
        self._closed = False

    # ------------------------------------------------------------------ wiring

    def attach(self, pipeline: SessionView) -> None:
        self._pipeline = pipeline
        self._loop = asyncio.get_running_loop()
        self._alerts = AlertAnnouncer(pipeline, self.record_alert, self._alert_switch)

    def _entry(self, kind: Any, name: str, pts: float | None, **fields: Any) -> TimelineEntry:
        return TimelineEntry(kind=kind, name=name, source=self._pipeline.session_id, origin=self._pipeline.origin,
                             source_name=self.source_name, wall_ts=time.time(), pts=pts, **fields)

    def _put(self, entry: TimelineEntry, quiet: bool = False) -> bool:
        """``quiet``: a failure is only logged (scene summaries: the next event reports it to the client)."""
        return self.store.put(entry, on_failure=self._log_failure if quiet else self._report)

    def _log_failure(self, reason: str) -> None:
        log.warning("timeline entry not stored: %s", reason)

    def _report(self, reason: str) -> None:
        """Any thread: the first storage failure becomes one ``error`` message; later ones are only logged."""
        if self._reported:
            log.debug("timeline of %s: %s", self._pipeline.session_id if self._pipeline else "?", reason)
            return
        self._reported = True
        log.error("timeline of %s: %s", self._pipeline.session_id if self._pipeline else "?", reason)
        if self._loop is not None and self._pipeline is not None and not self._loop.is_closed():
            message = f"{reason}; events are sent live but not stored"
            self._loop.call_soon_threadsafe(self._pipeline.error, "storage_unavailable", message)

    # ------------------------------------------------------------------ event loop: pipeline hooks

    def on_outgoing(self, messages: list[ServerMessage],
                    analysed: AnalysedFrame | None = None) -> list[ServerMessage]:
        """Every outgoing message, once, before it is sent: final transcripts and finished replies become entries;
        the events of an ``analysed`` frame (plus 'object appeared' ones) are stored and start or extend their
        clip. Returns what to send: those events with their entry ids."""
        for message in messages:
            self._spoken(message)
        if analysed is None:
            return messages
        others = [m for m in messages if not isinstance(m, Event)]
        events = [(m.name, m.data) for m in messages if isinstance(m, Event)]
        return [*others, *self._analysed(analysed, events)]

    def _analysed(self, analysed: AnalysedFrame, events: list[tuple[str, dict[str, Any]]]) -> list[ServerMessage]:
        frame, pts = analysed.frame, analysed.pts
        objects = trusted(analysed.objects)  # an unconfirmed object is drawn live, never stored or announced
        events = [*events, *self._appeared(objects)]
        self._scene(pts, objects)
        if not events:
            return []
        stream_s = self._clip_time(frame, pts)
        boxes = {obj["track_id"]: obj["box"] for obj in objects if obj.get("track_id")}
        out: list[tuple[str, dict[str, Any], str]] = []
        for name, data in events:
            # The stored entry keeps where its track was on the snapshot's frame (normalised x1, y1, x2, y2), so
            # that a person can be enrolled from the event (POST /api/faces/{name} {"event_id"}); not on the wire.
            box = boxes.get(data.get("track_id"))
            stored = {**data, "box": [round(float(v), 4) for v in box]} if box is not None else data
            entry = self._entry("event", name, pts, data=stored,
                                clip_state="pending" if self.mode != "none" else "none")
            self._put(entry)
            out.append((name, data, entry.id))
        ids = [entry_id for _, _, entry_id in out]
        if self._alerts is not None:
            for name, data, _ in out:
                self._alerts.on_event(name, data, self.source_name or self._pipeline.session_id)
        if self.store.available:
            if self.settings.clips:
                self._submit(self._snapshot, ids, frame, objects)
            if self.mode != "none":
                with self._lock:
                    self._clip_event(ids, stream_s, pts)
        return [event for name, data, entry_id in out
                if (event := self._event(pts=pts, name=name, data=data, id=entry_id)) is not None]

    def _event(self, **fields: Any) -> ServerMessage | None:
        try:
            return self._pipeline.make(Event, **fields)
        except Exception:  # as the pipeline does with a message it cannot build: logged, the others still sent
            log.exception("could not build %s event", fields.get("name"))
            return None

    def _appeared(self, objects: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
        rules = {rule.label: rule for rule in self.settings.appear}
        found = []
        for obj in objects:
            track_id, rule = obj.get("track_id"), rules.get(obj["label"])
            if rule is None or track_id is None or track_id in self._seen_tracks or obj["conf"] < rule.min_conf:
                continue
            self._seen_tracks.add(track_id)
            found.append(("object.appeared", {"label": obj["label"], "track_id": track_id,
                                              "conf": round(obj["conf"], 3),
                                              **{k: obj[k] for k in ("identity", "plate") if obj.get(k)}}))
        return found

    def _scene(self, pts: float, objects: list[dict[str, Any]]) -> None:
        if self._next_scene_pts is not None and pts < self._next_scene_pts:
            return
        self._next_scene_pts = pts + self.settings.scene_interval_s
        counts: dict[str, int] = {}
        for obj in objects:
            counts[obj["label"]] = counts.get(obj["label"], 0) + 1
        tracks = sorted({(obj["track_id"], obj["label"]) for obj in objects if obj.get("track_id")})
        self._put(self._entry("scene", "scene", pts, data={
            "counts": dict(sorted(counts.items())), "tracks": [{"id": i, "label": label} for i, label in tracks]}),
            quiet=True)

    def _spoken(self, message: ServerMessage) -> None:
        if isinstance(message, Transcript) and message.final and message.text.strip():
            self._put(self._entry("transcript", "transcript", message.pts, text=message.text,
                                  data={"turn": message.turn}))
        elif isinstance(message, Reply) and message.kind != "alert":  # an alert is stored once, by record_alert
            turn = self._replies.setdefault(message.turn, _Turn())
            if message.delta:
                turn.text.append(message.delta)
            if message.done:
                self._replies.pop(message.turn, None)
                text = "".join(turn.text).strip()
                if text:
                    self._put(self._entry("reply", "reply", message.pts, text=text, data={"turn": message.turn}))

    def say(self, text: str) -> bool:
        """Speak ``text`` on the session's voice at the next quiet moment (stored as an alert); False: no voice."""
        return self._alerts is not None and self._alerts.say(text)

    def record_alert(self, text: str, data: dict[str, Any]) -> None:
        self._put(self._entry("alert", "alert", self._pipeline.scene.pts, text=text, data=data))

    def on_video_frame(self, frame: av.VideoFrame, pts: float) -> None:
        """Every decoded frame (WebRTC sessions keep some of them)."""
        if self.mode != "frames":
            return
        seconds = self._clip_time(frame, pts)
        with self._lock:
            if self._frames.due(seconds):
                self._frames.append(seconds, frame)
                self._grow(seconds, frame)

    def _clip_time(self, frame: av.VideoFrame, pts: float) -> float:
        """The one clock a clip is cut on. Packets: the frame's own stream time, the clock the demuxed packets
        share. Frames (WebRTC): the pipeline's media time, which runs on across a wrap of the 32-bit RTP
        timestamp; the frame's raw time jumps back there, and the ring would keep only pre-wrap frames."""
        return _seconds(frame, pts) if self.mode == "packets" else pts

    # ------------------------------------------------------------------ reader thread: encoded packets

    def stream_opened(self, stream: av.VideoStream, offset: float) -> None:
        with self._lock:
            self._stream, self._offset = stream, offset
            self._packets.clear()
            # Dropped, never closed: a clip of the last stream may still be remuxed from it on the clip executor,
            # and muxing from a closed template segfaults; it closes when that clip lets go of it.
            self._template = None

    def packet(self, packet: av.Packet) -> None:
        if self.mode != "packets" or packet.pts is None or packet.time_base is None or not packet.size:
            return
        seconds = float(packet.pts * packet.time_base) + self._offset
        with self._lock:
            if self._template is None:
                if not packet.is_keyframe or self._stream is None:
                    return
                try:
                    self._template = PacketTemplate(self._stream, packet)
                except (av.FFmpegError, ValueError) as error:
                    log.warning("cannot remux this stream's packets (%s): no clips", error)
                    self.mode = "none"
                    return
            self._packets.append(seconds, packet)
            self._grow(seconds, packet)

    def stream_ended(self) -> None:
        """The input ended (file end, camera lost): write the pending clip with what it has."""
        with self._lock:
            self._finish()

    # ------------------------------------------------------------------ clips (under the lock)

    def _clip_event(self, ids: list[str], stream_s: float, pts: float) -> None:
        pending = self._pending
        if pending is not None and stream_s <= pending.end:
            pending.event_ids += ids
            pending.end = min(max(pending.end, stream_s + self.settings.post_s), pending.cap)
            return
        start = stream_s - self.settings.pre_s
        items = self._packets.since(start) if self.mode == "packets" else self._frames.since(start)
        if not items:  # the stream's first keyframe has not arrived yet: no clip, and nothing wrong with storage
            self.store.update_media(ids, clip_state="failed", clip_error="no video had arrived yet",
                                    on_failure=self._report)
            return
        clip_start = items[0][0]
        end = min(stream_s + self.settings.post_s, clip_start + self.settings.max_s)
        # The ring may already hold video past the clip's end (analysis lag): a clip ends at ``end`` all the same.
        # The longest prefix, as in ``_grow`` (packets are in decoding order: a prefix decodes).
        kept = list(itertools.takewhile(lambda item: item[0] < end, items))
        self._pending = _PendingClip(ids, clip_start, end, clip_start + self.settings.max_s, kept,
                                     pts - (stream_s - clip_start))
        if len(kept) < len(items):
            self._finish()

    def _grow(self, seconds: float, item: Any) -> None:
        pending = self._pending
        if pending is None:
            return
        # Packets arrive in decoding order, so any prefix of them decodes (B-frames follow their references).
        if seconds >= pending.end:
            self._finish()
        else:
            pending.items.append((seconds, item))

    def _finish(self) -> None:
        pending, self._pending = self._pending, None
        if pending is None or not pending.items:
            return
        if self.mode == "packets":
            assert self._template is not None
            template = self._template
            self._submit(self._write_clip, pending, lambda path: remux_clip(path, template, pending.items))
        else:
            self._submit(self._write_clip, pending, lambda path: encode_clip(path, pending.items))

    # ------------------------------------------------------------------ writers (clip executor)

    def _submit(self, fn: Callable[..., Any], *args: Any) -> None:
        if self._loop is None or self._closed:
            return
        # Called from the event loop or the reader thread; the write itself runs on the clip executor.
        def start() -> None:
            future = self._loop.run_in_executor(self._executor, fn, *args)  # type: ignore[union-attr]
            self._writes.add(future)
            future.add_done_callback(self._writes.discard)

        if _on_loop(self._loop):
            start()
        else:
            self._loop.call_soon_threadsafe(start)

    def _snapshot(self, ids: list[str], frame: av.VideoFrame, objects: list[dict[str, Any]]) -> None:
        relative = f"snapshots/{ids[0]}.jpg"
        try:
            write_snapshot(self.store.root / relative, frame, objects)
        except Exception as error:  # disk full or read-only: keep going live
            self._report(f"cannot write snapshot: {error}")
            return
        self.store.update_media(ids, snapshot=relative, on_failure=self._report)

    def _write_clip(self, pending: _PendingClip, write: Callable[[Path], float]) -> None:
        relative = f"clips/{pending.event_ids[0]}.mp4"
        final = self.store.root / relative
        partial = final.with_name(final.name + ".part")
        try:
            duration = write(partial)
            size = partial.stat().st_size
            if self.settings.quota_bytes is not None and size > self.settings.quota_bytes:
                partial.unlink(missing_ok=True)
                raise OSError(f"a clip of {size} bytes exceeds storage.quota_bytes ({self.settings.quota_bytes})")
            partial.replace(final)
        except Exception as error:
            with contextlib.suppress(OSError):
                partial.unlink(missing_ok=True)
            self._media_failed(pending.event_ids, str(error))
            return
        def announce(event_ids: list[str]) -> None:  # once the clip can be fetched (by the events still stored)
            if self._loop is not None and not self._loop.is_closed():
                self._loop.call_soon_threadsafe(self._clip_ready, pending, event_ids, duration)

        self.store.update_media(pending.event_ids, clip=relative, clip_state="ready",
                                clip_start_pts=round(pending.start_pts, 3), clip_duration_s=round(duration, 3),
                                on_failure=self._report, on_committed=announce)
        self.store.request_retention()

    def _media_failed(self, ids: list[str], reason: str) -> None:
        self._report(f"cannot record the event clip: {reason}")
        self.store.update_media(ids, clip_state="failed", clip_error=reason[:500], on_failure=self._report)

    def _clip_ready(self, pending: _PendingClip, event_ids: list[str], duration: float) -> None:
        if self._pipeline is None:
            return
        self._pipeline.emit(self._pipeline.make(
            Clip, pts=round(pending.start_pts, 3), event_ids=event_ids, duration_s=round(duration, 3),
            url=f"/api/events/{event_ids[0]}/clip.mp4"))

    # ------------------------------------------------------------------ lifecycle

    async def close(self) -> None:
        """Write the pending clip, wait for the writes in flight."""
        if self._alerts is not None:
            await self._alerts.close()
            self._alerts = None  # it holds record_alert, a method of ours: a cycle
        with self._lock:
            self._finish()
        if self._writes:
            await asyncio.gather(*list(self._writes), return_exceptions=True)
        if self.store.available:  # the last clip's entry is committed and its clip message sent before we return
            await asyncio.to_thread(self.store.flush, 5.0)
            await asyncio.sleep(0)
        self._closed = True
        with self._lock:
            self._template = None  # closes with its last clip (see stream_opened)


def _seconds(frame: av.VideoFrame, pts: float) -> float:
    """A frame's own stream time (the clock its packets share); the pipeline's time when it has none."""
    if frame.pts is None or frame.time_base is None:
        return pts
    return float(frame.pts * frame.time_base)


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


