"""The switches MQTT's commands flip (``server.mqtt.commands``), kept across restarts: each server-side source's
detection (by its name as topics spell it) and alerts. One small JSON file in ``storage.data_dir``, replaced
atomically on every change (a crash mid-write leaves the previous file), read once at start-up.

A source's detection is kept by name because a source's id is new each time it is added: a source added after a
restart under the same name starts with the detection it had. WebRTC sessions are not kept (their ids never
return)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import tempfile
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from server.mqtt.messages import topic_level

log = logging.getLogger(__name__)

SWITCHES_FILE = "switches.json"
SOURCES_MAX = 256  # sources whose detection is kept; past it the least recently switched is forgotten


class SwitchStore:
    """Read at construction (a missing file: every switch at its default; an unreadable one is logged and
    ignored, never fatal); ``set_*`` write it at once: off the event loop when called on one (a writer thread of
    its own keeps the writes in order; an fsync can take long on a busy disk), else on the caller's thread."""

    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir) / SWITCHES_FILE
        self.alerts: bool | None = None  # None: never switched (on)
        self._detect: OrderedDict[str, bool] = OrderedDict()
        self._detect_listeners: list[Callable[[str, bool], None]] = []
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="switches")
        self._load()

    def add_detect_listener(self, listener: Callable[[str, bool], None]) -> None:
        """Called (on the caller's thread) with (source name as topics spell it, enabled) on every change, from
        MQTT or a REST config patch: the publisher keeps the retained state right."""
        self._detect_listeners.append(listener)

    def detect(self, source: str) -> bool | None:
        """The kept detection of a source (its name or id, spelled as in topics); None: never switched."""
        return self._detect.get(topic_level(source))

    def detected_sources(self) -> dict[str, bool]:
        return dict(self._detect)

    def set_detect(self, source: str, enabled: bool) -> None:
        key = topic_level(source)
        self._detect[key] = enabled
        self._detect.move_to_end(key)
        while len(self._detect) > SOURCES_MAX:
            self._detect.popitem(last=False)
        self._save()
        for listener in self._detect_listeners:
            listener(key, enabled)

    def set_alerts(self, enabled: bool) -> None:
        self.alerts = enabled
        self._save()

    def _load(self) -> None:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as error:
            log.warning("switches: %s unreadable (%s): detection and alerts start on", self.path, error)
            return
        if not isinstance(data, dict):
            log.warning("switches: %s is not a JSON object: detection and alerts start on", self.path)
            return
        if isinstance(data.get("alerts"), bool):
            self.alerts = data["alerts"]
        detect = data.get("detect")
        if isinstance(detect, dict):
            for name, enabled in list(detect.items())[-SOURCES_MAX:]:
                if isinstance(name, str) and isinstance(enabled, bool):
                    self._detect[topic_level(name)] = enabled

    def _save(self) -> None:
        data: dict[str, Any] = {"detect": dict(self._detect)}
        if self.alerts is not None:
            data["alerts"] = self.alerts
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            self._write(data)
        else:
            self._writer.submit(self._write, data)

    def flush(self) -> None:
        """Wait for the writes handed to the writer thread (blocking; at shutdown)."""
        self._writer.submit(lambda: None).result()

    def _write(self, data: dict[str, Any]) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # A temporary file in the same directory, synced, then renamed over the old one: readers (and a
            # restart after a crash) see the old file or the new one, never half of one.
            fd, temporary = tempfile.mkstemp(prefix=".switches-", suffix=".json", dir=self.path.parent)
            try:
                with os.fdopen(fd, "w") as file:
                    json.dump(data, file)
                    file.flush()
                    os.fsync(file.fileno())
                os.replace(temporary, self.path)
            except BaseException:
                Path(temporary).unlink(missing_ok=True)
                raise
        except OSError as error:  # an unwritable data dir: the switch holds until the restart
            log.warning("switches: cannot write %s (%s): this change is lost on restart", self.path, error)
