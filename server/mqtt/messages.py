"""What Vigil publishes over MQTT, as plain data: the topics, the event payload made from a timeline entry, and
Home Assistant's discovery configs. No I/O here (``server.mqtt.publisher`` sends them)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from pipelines.timeline.store import TimelineEntry
from server.config.mqtt import MqttSettings

# Characters a topic level must not hold: '/' splits levels, '+' and '#' are wildcards; Home Assistant's object ids
# take only [a-zA-Z0-9_-].
_TOPIC_UNSAFE = re.compile(r"[/+#\x00]")
_OBJECT_ID_UNSAFE = re.compile(r"[^a-zA-Z0-9_-]")
PUBLISHED_KINDS = ("event", "alert")  # timeline kinds published on <prefix>/events


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One publish: held in the publisher's bounded queue until the broker acknowledged it."""

    topic: str
    payload: bytes
    retain: bool = False


def topic_level(name: str) -> str:
    """A source or label as one topic level (never a wildcard or a level separator)."""
    return _TOPIC_UNSAFE.sub("_", name.strip()) or "_"


def object_id(*parts: str) -> str:
    return _OBJECT_ID_UNSAFE.sub("_", "_".join(parts)).lower()


def entity_id_options(platform: str, entity: str) -> dict[str, str]:
    """The entity id Home Assistant should give a discovered entity. ``default_entity_id`` since Home Assistant
    2025.10, which deprecated ``object_id`` ("stops working in 2026.4"); not both, as a removed option may come to
    be refused. Earlier releases drop the key they do not know and name the entity after the device and its name."""
    return {"default_entity_id": f"{platform}.{entity}"}


def source_of(entry: TimelineEntry) -> str:
    """The source as topics name it: its configured name (a server-side source), else the session or source id."""
    return topic_level(entry.source_name or entry.source)


class Topics:
    def __init__(self, config: MqttSettings) -> None:
        self.prefix = config.topic_prefix
        self.discovery_prefix = config.discovery_prefix
        self.availability = f"{self.prefix}/available"
        self.events = f"{self.prefix}/events"

    def count(self, source: str, label: str) -> str:
        return f"{self.prefix}/{source}/{topic_level(label)}"

    def snapshot(self, source: str, label: str) -> str:
        return f"{self.count(source, label)}/snapshot"


def event_payload(entry: TimelineEntry, *, base_url: str | None, snapshots: bool) -> dict[str, Any]:
    """An event or alert entry as published on ``<prefix>/events``: the same names as ``/api/events`` where they
    overlap (``id``, ``source``, ``source_name``), flattened for automations (``type``, ``label``, ``zone``...).
    The snapshot and clip URLs are where they will be served once written (``snapshots``: they are recorded)."""
    data = entry.data
    base = (base_url or "").rstrip("/")
    recorded = entry.clip_state in ("pending", "ready")
    payload: dict[str, Any] = {
        "id": entry.id,
        "type": entry.name if entry.kind == "event" else "alert",
        "source": entry.source,
        "source_name": entry.source_name,
        "label": data.get("label"),
        "zone": data.get("zone"),
        "line": data.get("line"),
        "direction": data.get("direction"),
        "track_id": data.get("track_id"),
        "score": data.get("conf"),
        "time": entry.wall_ts,
        "identity": data.get("identity"),
        "plate": data.get("plate"),
        "snapshot_url": f"{base}/api/events/{entry.id}/snapshot.jpg" if recorded and snapshots else None,
        "clip_url": f"{base}/api/events/{entry.id}/clip.mp4" if recorded else None,
    }
    if entry.kind == "alert":
        payload.update(event=data.get("event"), text=entry.text, spoken=data.get("spoken"))
    elif data.get("dwell_s") is not None:
        payload["dwell_s"] = data["dwell_s"]
    return payload


def encode(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, separators=(",", ":"), default=str).encode()


def discovery_messages(config: MqttSettings, topics: Topics, source: str, label: str) -> list[Outgoing]:
    """Home Assistant MQTT discovery for one source's label: a sensor (how many are in view) and, with snapshots,
    a camera showing the last event's snapshot; both go unavailable with Vigil (the last will)."""
    node = object_id(config.client_id)
    device = {"identifiers": [node], "name": f"Vigil ({config.client_id})", "manufacturer": "Vigil",
              "model": "stream analysis server"}
    availability = {"availability_topic": topics.availability, "payload_available": "online",
                    "payload_not_available": "offline"}
    sensor_id = object_id(node, source, label)
    sensor = {
        "name": f"{source} {label} count", "unique_id": f"{sensor_id}_count",
        **entity_id_options("sensor", sensor_id),
        "state_topic": topics.count(source, label), "unit_of_measurement": label, "state_class": "measurement",
        "icon": "mdi:account-multiple" if label == "person" else "mdi:shape", "device": device, **availability,
    }
    out = [Outgoing(f"{topics.discovery_prefix}/sensor/{sensor_id}/config", encode(sensor), retain=True)]
    if config.snapshots:
        camera = {"name": f"{source} {label} snapshot", "unique_id": f"{sensor_id}_snapshot",
                  **entity_id_options("camera", f"{sensor_id}_snapshot"), "topic": topics.snapshot(source, label),
                  "device": device, **availability}
        out.append(Outgoing(f"{topics.discovery_prefix}/camera/{sensor_id}/config", encode(camera), retain=True))
    return out


def switch_discovery(config: MqttSettings, topics: Topics, key: str, name: str, command_topic: str,
                     state_topic: str) -> Outgoing:
    """Home Assistant discovery of a switch Vigil obeys (``server.mqtt.commands``): a source's detection, alerts."""
    node = object_id(config.client_id)
    switch_id = object_id(node, key)
    switch = {"name": name, "unique_id": switch_id, **entity_id_options("switch", switch_id),
              "command_topic": command_topic,
              "state_topic": state_topic, "payload_on": "ON", "payload_off": "OFF",
              "device": {"identifiers": [node], "name": f"Vigil ({config.client_id})", "manufacturer": "Vigil",
                         "model": "stream analysis server"},
              "availability_topic": topics.availability, "payload_available": "online",
              "payload_not_available": "offline"}
    return Outgoing(f"{topics.discovery_prefix}/switch/{switch_id}/config", encode(switch), retain=True)
