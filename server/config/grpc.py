"""``grpc``: the gRPC InferenceService."""

from __future__ import annotations

from pydantic import Field

from server.config.base import Section


class GrpcSettings(Section):
    enabled: bool = Field(True, description="Serve the gRPC InferenceService beside HTTP, in the same process.")
    host: str = "127.0.0.1"
    port: int = Field(50051, ge=0, le=65535, description="0: any free port.")
    max_message_bytes: int = Field(4 * 1024 * 1024, ge=1024, description="Largest message either way.")
    keepalive_time_s: float = Field(30.0, gt=0, description="Ping an idle connection this often.")
    keepalive_timeout_s: float = Field(10.0, gt=0, description="Drop a connection whose ping goes unanswered.")
    max_concurrent_rpcs: int = Field(64, ge=1, description="RPCs served at once; more get RESOURCE_EXHAUSTED.")
    max_conversations: int = Field(8, ge=1, description="Concurrent Converse streams (each runs a voice loop).")
    max_audio_s: float = Field(120.0, gt=0, description="Longest StreamInput audio (RESOURCE_EXHAUSTED beyond).")
    max_tokens_limit: int | None = Field(
        None, ge=1, description="Deprecated alias of api.max_output_tokens, which limits every chat entrypoint "
        "(HTTP and gRPC alike); when set, it sets api.max_output_tokens."
    )
    outbound_queue_messages: int = Field(
        1000, ge=10, description="Converse messages buffered for a slow client before the call is ended."
    )
