"""What Vigil publishes over MQTT, as plain data: topic levels, the event payload, Home Assistant discovery."""

from __future__ import annotations

import json

from pipelines.timeline.store import TimelineEntry
from server.config.mqtt import MqttSettings
from server.mqtt.commands import on_off
from server.mqtt.messages import Topics, discovery_messages, event_payload, object_id, source_of, topic_level


def test_a_name_is_one_topic_level_never_a_wildcard():
    assert topic_level("front/door #1+") == "front_door _1_"
    assert topic_level("  ") == "_"
    assert object_id("vigil", "Front Door", "person") == "vigil_front_door_person"


def test_an_event_payload_is_flat_and_names_its_media():
    entry = TimelineEntry(kind="event", name="zone.exit", source="abc", origin="rtsp", source_name="porch/cam",
                          wall_ts=1000.5, clip_state="pending",
                          data={"zone": "door", "label": "car", "track_id": 3, "conf": 0.8, "dwell_s": 4.2,
                                "plate": {"text": "AB123", "name": "Van"}})
    payload = event_payload(entry, base_url="http://vigil.lan/", snapshots=True)
    assert source_of(entry) == "porch_cam"
    assert payload["type"] == "zone.exit" and payload["score"] == 0.8 and payload["dwell_s"] == 4.2
    assert payload["plate"] == {"text": "AB123", "name": "Van"} and payload["identity"] is None
    assert payload["snapshot_url"] == f"http://vigil.lan/api/events/{entry.id}/snapshot.jpg"
    assert event_payload(entry, base_url=None, snapshots=False)["snapshot_url"] is None
    alert = TimelineEntry(kind="alert", name="alert", source="abc", origin="rtsp", wall_ts=1.0, text="Hi",
                          data={"event": "zone.enter", "zone": "door", "spoken": False})
    assert {k: event_payload(alert, base_url=None, snapshots=True)[k] for k in ("type", "event", "text", "spoken",
                                                                              "clip_url")} == {
        "type": "alert", "event": "zone.enter", "text": "Hi", "spoken": False, "clip_url": None}


def test_discovery_describes_a_count_sensor_and_a_snapshot_camera():
    config = MqttSettings(topic_prefix="home/vigil/", discovery_prefix="ha")
    sensor, camera = discovery_messages(config, Topics(config), "porch", "person")
    assert sensor.topic == "ha/sensor/vigil_porch_person/config" and sensor.retain
    body = json.loads(sensor.payload)
    assert body["state_topic"] == "home/vigil/porch/person" and body["availability_topic"] == "home/vigil/available"
    assert json.loads(camera.payload)["topic"] == "home/vigil/porch/person/snapshot"
    # Home Assistant's entity ids, as it asks since 2025.10 (object_id is deprecated there)
    assert body["default_entity_id"] == "sensor.vigil_porch_person" and "object_id" not in body
    assert json.loads(camera.payload)["default_entity_id"] == "camera.vigil_porch_person_snapshot"
    assert len(discovery_messages(MqttSettings(snapshots=False), Topics(MqttSettings()), "porch", "person")) == 1


def test_commands_take_on_and_off():
    assert [on_off(p) for p in (b"ON", b" off\n", b"1", b"maybe")] == [True, False, True, None]
