"""Client messages (data channel and WebSocket): parsed, validated and applied to a session, or answered with an
``error`` message; never raised."""

from __future__ import annotations

import logging
from typing import Any, Protocol

from pydantic import ValidationError

from pipelines.errors import ApiError, describe_validation_error, parse_json
from pipelines.ports import MessageSink
from pipelines.protocol import (
    ConfigRequest,
    Ping,
    Pong,
    ServerMessage,
    SessionConfig,
    SessionConfigPatch,
    client_message_adapter,
)

log = logging.getLogger(__name__)


class ClientMessageTarget(Protocol):
    """What a client message may do to a session: be answered, or change its config."""

    session_id: str

    def make(self, message_type: type[ServerMessage], **fields: Any) -> ServerMessage: ...

    def emit(self, message: ServerMessage) -> None: ...

    def error_message(self, code: str, message: str, ref: str | None = None) -> ServerMessage: ...

    def apply_config(self, patch: SessionConfigPatch) -> SessionConfig: ...


def handle_client_message(
    pipeline: ClientMessageTarget,
    raw: str | bytes,
    max_bytes: int,
    reply: MessageSink | None = None,
) -> None:
    """Apply one client message; anything wrong is answered with an ``error`` message, never raised.

    This is the one entry point for client messages (data channel and WebSocket): *any* failure (bad JSON,
    nesting deep enough to hit the recursion limit, lone surrogates, a bug) becomes an ``error`` message, so
    one message can never end a session or a subscriber.
    ``reply`` receives errors and pongs (the sender only); config changes are announced to everyone.
    """
    answer = reply or pipeline.emit
    try:
        _apply_client_message(pipeline, raw, max_bytes, answer)
    except Exception as error:  # RecursionError, MemoryError's cousins, bugs: answered, never raised
        log.warning("client message failed in %s: %r", pipeline.session_id, error)
        try:
            answer(pipeline.error_message("invalid_message", f"message rejected: {type(error).__name__}"))
        except Exception:
            log.exception("could not answer a failed client message in %s", pipeline.session_id)


def _message_size(raw: str | bytes) -> int:
    return len(raw.encode("utf-8", "surrogatepass")) if isinstance(raw, str) else len(raw)


def _apply_client_message(pipeline: ClientMessageTarget, raw: str | bytes, max_bytes: int,
                          answer: MessageSink) -> None:
    size = _message_size(raw)
    if size > max_bytes:
        answer(pipeline.error_message("message_too_large", f"message of {size} bytes exceeds {max_bytes}"))
        return
    try:
        data = parse_json(raw, what="message")
    except ApiError as error:
        answer(pipeline.error_message(error.code, error.message))
        return
    ref = data.get("type") if isinstance(data, dict) and isinstance(data.get("type"), str) else None
    try:
        message = client_message_adapter.validate_python(data)
    except ValidationError as error:
        details = describe_validation_error(error, root="<message>", limit=1000)
        answer(pipeline.error_message("invalid_message", details, ref=ref))
        return
    except RecursionError:
        answer(pipeline.error_message("invalid_message", "message nested too deeply", ref=ref))
        return
    if isinstance(message, Ping):
        answer(pipeline.make(Pong, id=message.id))
    elif isinstance(message, ConfigRequest):
        pipeline.apply_config(SessionConfigPatch.model_validate(message.model_dump(exclude={"v", "type"})))
