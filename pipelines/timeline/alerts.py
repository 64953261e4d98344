"""Spoken alerts: a zone's or line's ``announce`` template, said on the session's reply track.

When a ``zone.enter`` (``line.cross``) event matches a zone (line) with an ``announce`` template, the alert is
queued (at most one per zone or line per ``announce_cooldown_s``). It is spoken only while the voice loop is idle:
never over the user's speech, never over an answer; it waits for the turn to end. The voice loop says it as a reply
of kind ``alert`` (barge-in cuts it; its history keeps it). Every alert is also stored in the timeline.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from pipelines.protocol import LineConfig, ZoneConfig

log = logging.getLogger(__name__)

POLL_S = 0.1  # how often a queued alert checks whether the voice loop has become idle
MAX_QUEUED = 8  # alerts waiting for a quiet moment; older ones give way (a stale alert is worse than none)


def render(template: str, fields: dict[str, Any]) -> str:
    """Fill a template validated by the protocol (plain field names only); a field the event lacks stays empty."""
    return template.format_map(_Blank({name: "" if value is None else str(value) for name, value in fields.items()}))


def spoken_names(data: dict[str, Any]) -> dict[str, str]:
    """``{identity}`` and ``{plate}`` as words: the enrolled name or 'someone'; a known plate's name or its text."""
    identity, plate = data.get("identity") or {}, data.get("plate") or {}
    return {"identity": identity.get("name") or "someone", "plate": plate.get("name") or plate.get("text") or ""}


class AlertSwitch:
    """Whether alerts are on, for every session at once (MQTT's ``<prefix>/alerts/set``): one object shared by all
    announcers; off, a matching event raises no alert (nothing spoken, nothing stored)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled


class _Blank(dict[str, str]):
    def __missing__(self, key: str) -> str:
        return ""


class AlertAnnouncer:
    """One per session. ``voice`` is the session's audio analyser (alerts are spoken only if it has
    ``announce`` and ``idle``); ``record`` stores a spoken alert (text, data) in the timeline."""

    def __init__(self, pipeline: Any, record: Callable[[str, dict[str, Any]], None],
                 switch: AlertSwitch | None = None) -> None:
        self._pipeline = pipeline
        self._record = record
        self._switch = switch
        self._last: dict[tuple[str, str], float] = {}
        self._queue: deque[tuple[str, dict[str, Any]]] = deque(maxlen=MAX_QUEUED)
        self._task: asyncio.Task[None] | None = None

    def on_event(self, name: str, data: dict[str, Any], source: str) -> None:
        if self._switch is not None and not self._switch.enabled:
            return
        rule = self._rule(name, data)
        if rule is None or rule.announce is None:
            return
        key = ("zone" if isinstance(rule, ZoneConfig) else "line", rule.name)
        now = time.monotonic()
        if now - self._last.get(key, -float("inf")) < rule.announce_cooldown_s:
            return
        self._last[key] = now
        text = render(rule.announce, {**data, **spoken_names(data), "event": name, "source": source}).strip()
        if not text:
            return
        self._queue.append((text, {"event": name, key[0]: rule.name, **data}))
        self._start_speaking()

    @property
    def speaks(self) -> bool:
        voice = self._pipeline.audio_analyzer
        return callable(getattr(voice, "announce", None)) and "audio" in self._pipeline.tracks

    def say(self, text: str) -> bool:
        """Say ``text`` as an alert at the next quiet moment (MQTT's ``<prefix>/<session>/say``); False when the
        session has no voice to say it with."""
        if not self.speaks or not text.strip():
            return False
        self._queue.append((text.strip(), {"event": "say"}))
        self._start_speaking()
        return True

    def _start_speaking(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._speak_when_idle(), name=f"{self._pipeline.session_id}:alerts")

    def _rule(self, name: str, data: dict[str, Any]) -> ZoneConfig | LineConfig | None:
        video = self._pipeline.config.video
        if name == "zone.enter":
            return next((zone for zone in video.zones if zone.name == data.get("zone")), None)
        if name == "line.cross":
            return next((line for line in video.lines if line.name == data.get("line")), None)
        return None

    async def _speak_when_idle(self) -> None:
        voice = self._pipeline.audio_analyzer
        speaks = self.speaks
        while self._queue:
            if speaks:
                # The user is speaking or being answered: wait for the turn to end. Polled, because the voice
                # loop only exposes ``idle`` (no event to await).
                while not voice.idle:  # noqa: ASYNC110
                    await asyncio.sleep(POLL_S)
            text, data = self._queue.popleft()
            if speaks:
                voice.announce(text)
            self._record(text, {**data, "spoken": speaks})

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None  # its CancelledError's traceback holds this announcer: a cycle
