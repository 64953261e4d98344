"""The published JSON Schema is current, and the client-message handler never raises (property-based)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines.client_messages import handle_client_message
from pipelines.clock import VirtualClock
from pipelines.protocol import SessionConfig, json_schema
from pipelines.session import SessionPipeline

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "docs" / "protocol.schema.json"


def test_committed_schema_is_current():
    committed = json.loads(SCHEMA_FILE.read_text())
    assert committed == json_schema(), "regenerate: python -m pipelines.protocol > docs/protocol.schema.json"


def _pipeline(sent: list) -> SessionPipeline:
    return SessionPipeline("s1", origin="test", clock=VirtualClock(), emit=sent.append, config=SessionConfig(),
                           server_version="test")


SERVER_VALIDATOR = jsonschema.Draft202012Validator(json_schema()["server_to_client"])


def _validate(message) -> dict:
    data = json.loads(message.model_dump_json(exclude_none=True))
    SERVER_VALIDATOR.validate(data)
    return data


def test_ping_config_and_errors_follow_the_schema():
    sent: list = []
    pipeline = _pipeline(sent)
    handle_client_message(pipeline, json.dumps({"v": 1, "type": "ping", "id": 7}), 1024)
    handle_client_message(pipeline, json.dumps({"v": 1, "type": "config", "video": {"target_fps": 2}}), 1024)
    handle_client_message(pipeline, json.dumps({"v": 1, "type": "config", "video": {"target_fps": -1}}), 1024)
    handle_client_message(pipeline, json.dumps({"v": 2, "type": "ping"}), 1024)
    handle_client_message(pipeline, "{not json", 1024)
    handle_client_message(pipeline, json.dumps({"v": 1, "type": "dance"}), 1024)
    handle_client_message(pipeline, "x" * 2000, 1024)
    out = [_validate(m) for m in sent]
    assert out[0]["type"] == "pong" and out[0]["id"] == 7
    assert out[1]["type"] == "event" and out[1]["name"] == "config" and out[1]["data"]["video"]["target_fps"] == 2
    assert pipeline.config.video.target_fps == 2
    codes = [m["code"] for m in out[2:]]
    assert codes == ["invalid_message", "invalid_message", "invalid_json", "invalid_message", "message_too_large"]
    assert "target_fps" in out[2]["message"] and out[2]["ref"] == "config"
    assert out[5]["ref"] == "dance"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)
client_like = st.fixed_dictionaries(
    {"type": st.sampled_from(["ping", "config", "hello", "", "x"]) | st.text(max_size=8)},
    optional={"v": st.sampled_from([1, 2, "1", None]), "id": json_values, "video": json_values,
              "extra": json_values},
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payload=st.one_of(client_like.map(json.dumps), json_values.map(json.dumps), st.text(max_size=200),
                         st.binary(max_size=200)))
def test_random_client_messages_get_an_answer_never_an_exception(payload):
    sent: list = []
    pipeline = _pipeline(sent)
    before = pipeline.config
    handle_client_message(pipeline, payload, 4096)
    assert len(sent) == 1, "every client message gets exactly one answer (pong, config event or error)"
    answer = _validate(sent[0])
    if answer["type"] == "error":
        assert answer["code"] in {"invalid_json", "invalid_message", "message_too_large"}
        assert pipeline.config == before, "a rejected message must not change the session"
    else:
        assert answer["type"] in {"pong", "event"}


def test_grpc_carries_every_turn_metric_and_the_interrupted_reply():
    """The gRPC Converse output maps the data channel's turn metrics and reply end field for field."""
    from pipelines.protocol import Metrics, Reply, TurnMetrics
    from server.grpc_api import inference_pb2 as pb
    from server.grpc_api.conversation import to_output

    assert set(TurnMetrics.model_fields) <= set(pb.TurnMetrics.DESCRIPTOR.fields_by_name)
    full = TurnMetrics(turn=3, speech_ms=900.0, memory_retrieval_ms=4.5, memory_entries=2, end_of_turn="model",
                       end_of_turn_ms=210.0, turn_score=0.93, turn_model_ms=41.0, final_decode="early",
                       speculation="played", speculations_discarded=1, audio_send_ms=3.0)
    out = to_output(Metrics(session="s1", ts=0.0, turn=full)).metrics
    assert (out.end_of_turn, out.turn_score, out.memory_entries, out.speculation) == ("model", 0.93, 2, "played")
    cut = to_output(Reply(session="s1", ts=0.0, turn=3, done=True, interrupted=True)).reply
    assert (cut.done, cut.interrupted) == (True, True)
