"""MQTT in: commands Vigil takes from its broker (``docs/mqtt.md``).

- ``<prefix>/<source>/detect/set`` ``ON``/``OFF``: a source's or session's detection (its ``video.detect``, as a
  ``config`` patch would set it); the new state is published on ``<prefix>/<source>/detect/state`` (retained).
- ``<prefix>/alerts/set`` ``ON``/``OFF``: every session's alerts (``<prefix>/alerts/state``, retained).
- ``<prefix>/<session>/say`` text: the session's voice loop says it at the next quiet moment (when it has one).

``<source>`` is a source's name as topics spell it, or a source or session id. A command Vigil cannot follow is
logged and dropped (nothing answers an MQTT publish)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from pipelines.protocol import SessionConfigPatch
from pipelines.timeline.alerts import AlertSwitch
from server.config.mqtt import MqttSettings
from server.media.sessions import SessionRegistry
from server.media.sources import SourceManager
from server.mqtt.messages import Outgoing, Topics, topic_level
from server.mqtt.switches import SwitchStore

log = logging.getLogger(__name__)

MAX_SAY_CHARS = 500  # one announcement, not a speech


def on_off(payload: bytes) -> bool | None:
    word = payload.strip().upper()
    return True if word in (b"ON", b"TRUE", b"1") else False if word in (b"OFF", b"FALSE", b"0") else None


class MqttCommands:
    def __init__(self, config: MqttSettings, sources: SourceManager, sessions: SessionRegistry,
                 alerts: AlertSwitch, switches: SwitchStore | None = None) -> None:
        self.topics = Topics(config)
        self._sources = sources
        self._sessions = sessions
        self._alerts = alerts
        self._switches = switches  # where a flip is kept across restarts (None: not kept)

    def subscriptions(self) -> list[str]:
        prefix = self.topics.prefix
        return [f"{prefix}/+/detect/set", f"{prefix}/alerts/set", f"{prefix}/+/say"]

    def alerts_state(self) -> Outgoing:
        return Outgoing(f"{self.topics.prefix}/alerts/state", b"ON" if self._alerts.enabled else b"OFF", retain=True)

    def kept_detect_states(self) -> list[tuple[str, Outgoing]]:
        """The detection kept from before the restart, per source name: (its name in topics, its state message),
        published at start-up so the retained state is right before the source is added again."""
        kept = self._switches.detected_sources() if self._switches is not None else {}
        return [(name, self._detect_message(name, on)) for name, on in kept.items()]

    def watch_switches(self, publish: Callable[[str, Outgoing], None]) -> None:
        """``publish(source, state)`` on every change of a kept detection switch (MQTT's or a REST patch's)."""
        if self._switches is not None:
            self._switches.add_detect_listener(lambda name, on: publish(name, self._detect_message(name, on)))

    def _detect_message(self, name: str, enabled: bool) -> Outgoing:
        return Outgoing(f"{self.topics.prefix}/{name}/detect/state", b"ON" if enabled else b"OFF", retain=True)

    def detect_state(self, source: str) -> Outgoing | None:
        found = self._find(source)
        if found is None:
            return None
        name, pipeline = found  # the topic's own spelling: the name if it has one, even when addressed by id
        return self._detect_message(name, pipeline.config.video.detect)

    def handle(self, topic: str, payload: bytes) -> list[Outgoing]:
        """One command; returns the state messages to publish."""
        levels = topic[len(self.topics.prefix) + 1:].split("/") if topic.startswith(self.topics.prefix + "/") else []
        if levels == ["alerts", "set"]:
            wanted = on_off(payload)
            if wanted is None:
                log.warning("mqtt: %s takes ON or OFF", topic)
                return []
            self._alerts.enabled = wanted
            if self._switches is not None:
                self._switches.set_alerts(wanted)
            log.info("mqtt: alerts turned %s", "on" if wanted else "off")
            return [self.alerts_state()]
        if len(levels) == 3 and levels[1:] == ["detect", "set"]:
            return self._set_detect(topic, levels[0], payload)
        if len(levels) == 2 and levels[1] == "say":
            self._say(levels[0], payload)
            return []
        log.warning("mqtt: no command at %s", topic)
        return []

    def _set_detect(self, topic: str, source: str, payload: bytes) -> list[Outgoing]:
        wanted = on_off(payload)
        found = self._find(source)
        pipeline = found[1] if found is not None else None
        if wanted is None or pipeline is None:
            log.warning("mqtt: %s: %s", topic, "no such source or session" if pipeline is None else "ON or OFF")
            return []
        patch = SessionConfigPatch.model_validate({"video": {"detect": wanted}})
        source_found = self._source(source)
        if source_found is not None:  # kept across restarts, as the REST config patch keeps it
            self._sources.configure(source_found, patch)
        else:
            pipeline.apply_config(patch)
        state = self.detect_state(source)
        return [state] if state is not None else []

    def _say(self, session: str, payload: bytes) -> None:
        found = self._find(session)
        pipeline = found[1] if found is not None else None
        text = payload.decode("utf-8", "replace").strip()[:MAX_SAY_CHARS]
        recorder = getattr(pipeline, "timeline", None)
        if recorder is None or not text or not recorder.say(text):
            log.warning("mqtt: %s/say: %s", session, "no such session" if pipeline is None else
                        "nothing to say" if not text else "the session has no voice to say it with")

    def _source(self, name: str) -> Any:
        """A server-side source by its topic name or id (None: none, or a WebRTC session, whose id never
        returns and so is not kept)."""
        return next((s for s in list(self._sources.sources.values())
                     if s.id == name or topic_level(s.name or s.id) == name), None)

    def _find(self, name: str) -> tuple[str, Any] | None:
        """A source by its topic name or id, else a session by id: (its name in topics, its pipeline)."""
        for source in list(self._sources.sources.values()):
            level = topic_level(source.name or source.id)
            if source.id == name or level == name:
                return level, source.pipeline
        session = self._sessions.get(name)
        return (topic_level(name), session.pipeline) if session is not None else None
