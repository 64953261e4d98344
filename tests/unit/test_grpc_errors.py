"""gRPC statuses come from the one error model: servicers, the auth check and request parsing raise
``ApiError``; one interceptor (``server/grpc_api/errors.py``) picks the status, from the code's HTTP status."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from pipelines.errors import ApiError
from server.grpc_api.errors import grpc_status

GRPC_API = Path(__file__).resolve().parents[2] / "server" / "grpc_api"


def test_no_grpc_module_picks_a_status_by_hand() -> None:
    # metrics.py only reads the status a call ended with
    for path in sorted(GRPC_API.glob("*.py")):
        if path.name in {"errors.py", "metrics.py"} or "_pb2" in path.name:
            continue
        text = path.read_text()
        assert "StatusCode." not in text and ".abort(" not in text and ".set_code(" not in text, path.name


@pytest.mark.parametrize(("code", "status"), [
    ("invalid_audio", grpc.StatusCode.INVALID_ARGUMENT),
    ("invalid_message", grpc.StatusCode.INVALID_ARGUMENT),
    ("unauthorized", grpc.StatusCode.UNAUTHENTICATED),
    ("audio_too_long", grpc.StatusCode.RESOURCE_EXHAUSTED),
    ("too_many_conversations", grpc.StatusCode.RESOURCE_EXHAUSTED),
    ("client_not_reading", grpc.StatusCode.RESOURCE_EXHAUSTED),
    ("voice_disabled", grpc.StatusCode.FAILED_PRECONDITION),
    ("reply_timeout", grpc.StatusCode.DEADLINE_EXCEEDED),
    ("model_unavailable", grpc.StatusCode.UNAVAILABLE),
    ("internal", grpc.StatusCode.INTERNAL),
])
def test_each_code_has_the_status_its_call_ended_with_before(code: str, status: grpc.StatusCode) -> None:
    assert grpc_status(ApiError(code, "m")) == status
