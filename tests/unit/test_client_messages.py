"""The data channel's client messages go through the same JSON parser and validation wording as HTTP bodies:
every malformed message is answered with an ``error``, none raises (nesting too deep included)."""

from __future__ import annotations

import pytest

from pipelines.client_messages import handle_client_message
from pipelines.clock import VirtualClock
from pipelines.protocol import SessionConfig
from pipelines.session import SessionPipeline


@pytest.fixture
def session() -> tuple[SessionPipeline, list]:
    sent: list = []
    pipeline = SessionPipeline("s1", origin="file", clock=VirtualClock(), emit=sent.append,
                               config=SessionConfig(), server_version="test")
    return pipeline, sent


@pytest.mark.parametrize(("raw", "code"), [
    ("{oops", "invalid_json"),
    (b"\xff\xfe", "invalid_json"),
    ('{"v": 1, "type": "ping", "id": "\\ud800"}', "invalid_json"),  # a lone surrogate
    ("[" * 20_000 + "]" * 20_000, "invalid_json"),  # deeper than the parser recurses
    ('{"v": 1, "type": "dance"}', "invalid_message"),
    ('{"v": 1, "type": "config", "video": {"target_fps": "fast"}}', "invalid_message"),
])
def test_malformed_messages_are_answered_never_raised(session, raw, code):
    pipeline, sent = session
    handle_client_message(pipeline, raw, max_bytes=65_536)
    assert sent[-1].type == "error" and sent[-1].code == code and sent[-1].message


def test_validation_errors_name_the_field(session):
    pipeline, sent = session
    handle_client_message(pipeline, '{"v": 1, "type": "config", "video": {"target_fps": "fast"}}', 65_536)
    assert "video.target_fps" in sent[-1].message and sent[-1].ref == "config"
