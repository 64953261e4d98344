"""Typed event payloads and strict outbound messages: a misspelled or missing key fails where the message is
built, and the docs are generated from the models."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from pipelines.protocol import Event, Metrics, TurnMetrics, events_markdown

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"
BASE = {"session": "s", "ts": 1.0}


def test_each_event_name_has_its_payload():
    Event(**BASE, name="zone.enter", data={"zone": "door", "track_id": 3, "label": "person"})
    Event(**BASE, name="source.state", data={"state": "reconnecting", "attempt": 2, "reason": "eof",
                                              "retry_in_s": 0.4})
    Event(**BASE, name="config", data={"video": {"target_fps": 2.0}})
    for name, data in [
        ("zone.enter", {"zone": "door", "track": 3, "label": "person"}),  # misspelled key
        ("line.cross", {"line": "l", "track_id": 1, "label": "car", "direction": "up"}),  # wrong value
        ("barge_in", {"turn": 1}),  # missing key
        ("source.state", {"state": "live", "extra": 1}),  # extra key
        ("zone.entered", {}),  # unknown name
    ]:
        with pytest.raises(ValidationError):
            Event(**BASE, name=name, data=data)


def test_outbound_models_refuse_unknown_fields():
    with pytest.raises(ValidationError, match="first_audo_ms"):
        TurnMetrics(turn=1, speech_ms=800.0, first_audo_ms=120.0)  # a typo is an error, not a dropped key
    with pytest.raises(ValidationError):
        Metrics(**BASE, turns=None)


def test_the_event_table_in_the_docs_is_generated_from_the_models():
    text = DOC.read_text()
    start, end = text.index("<!-- events:begin -->\n"), text.index("<!-- events:end -->")
    assert text[start + len("<!-- events:begin -->\n"):end] == events_markdown(), (
        "regenerate: python -m pipelines.protocol --events-markdown (into docs/protocol.md)")
