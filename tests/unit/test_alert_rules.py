"""Spoken-alert rules without a voice loop: which events become alerts, the per-zone/line cooldown, the template's
fields, and the templates the protocol refuses. Speaking them over WebRTC is tests/integration/test_alerts.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from pydantic import ValidationError

from pipelines.protocol import LineConfig, SessionConfig, VideoSessionConfig, ZoneConfig
from pipelines.timeline.alerts import AlertAnnouncer

SQUARE = [(0.0, 0.0), (1.0, 0.0), (1.0, 1.0)]


@dataclass
class SessionWithoutAudioForTest:
    """Named seam: what AlertAnnouncer reads of a session pipeline, with no audio track (alerts are recorded, not
    spoken)."""

    config: SessionConfig
    session_id: str = "s1"
    tracks: dict[str, Any] = field(default_factory=dict)
    audio_analyzer: Any = None


async def _recorded(config: VideoSessionConfig, events: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict]]:
    recorded: list[tuple[str, dict[str, Any]]] = []
    announcer = AlertAnnouncer(SessionWithoutAudioForTest(SessionConfig(video=config)),
                               lambda text, data: recorded.append((text, data)))
    for name, data in events:
        announcer.on_event(name, data, source="cam1")
    if announcer._task is not None:
        await announcer._task
    await announcer.close()
    return recorded


@pytest.mark.parametrize(("cooldown_s", "expected"), [(60.0, 1), (0.0, 3)])
async def test_one_alert_per_zone_per_cooldown(cooldown_s: float, expected: int) -> None:
    zone = ZoneConfig(name="kitchen", polygon=SQUARE, announce="Someone entered the {zone}",
                      announce_cooldown_s=cooldown_s)
    entries = [("zone.enter", {"zone": "kitchen", "track_id": n, "label": "person"}) for n in (1, 2, 3)]
    recorded = await _recorded(VideoSessionConfig(zones=[zone]), entries)
    assert [text for text, _ in recorded] == ["Someone entered the kitchen"] * expected
    assert all(data["zone"] == "kitchen" and data["spoken"] is False for _, data in recorded)


async def test_cooldown_is_per_zone_and_only_zones_and_lines_that_announce_speak() -> None:
    zones = [ZoneConfig(name="kitchen", polygon=SQUARE, announce="{label} in the {zone}", announce_cooldown_s=60),
             ZoneConfig(name="hall", polygon=SQUARE, announce="{label} in the {zone}", announce_cooldown_s=60),
             ZoneConfig(name="quiet", polygon=SQUARE)]
    lines = [LineConfig(name="gate", start=(0.0, 0.5), end=(1.0, 0.5),
                        announce="A {label} crossed the {line} going {direction}")]
    recorded = await _recorded(VideoSessionConfig(zones=zones, lines=lines), [
        ("zone.enter", {"zone": "kitchen", "track_id": 1, "label": "person"}),
        ("zone.enter", {"zone": "hall", "track_id": 1, "label": "person"}),
        ("zone.enter", {"zone": "quiet", "track_id": 1, "label": "person"}),
        ("zone.exit", {"zone": "kitchen", "track_id": 1, "label": "person"}),
        ("line.cross", {"line": "gate", "track_id": 2, "label": "car", "direction": "in"}),
        ("zone.enter", {"zone": "unknown", "track_id": 3, "label": "dog"}),
    ])
    assert [text for text, _ in recorded] == [
        "person in the kitchen", "person in the hall", "A car crossed the gate going in"]
    assert recorded[2][1]["line"] == "gate" and recorded[2][1]["event"] == "line.cross"


@pytest.mark.parametrize("template", ["{zone.__class__}", "{zone!r}", "{zone:>10}", "{password}", "{0}", "{zone"])
def test_templates_with_anything_but_plain_fields_are_refused(template: str) -> None:
    with pytest.raises(ValidationError, match="announce"):
        ZoneConfig(name="kitchen", polygon=SQUARE, announce=template)
