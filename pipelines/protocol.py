"""The data-channel protocol, version 1: every message Vigil sends or accepts, as pydantic models.

This module is the public contract. ``docs/protocol.schema.json`` is generated from it
(``python -m pipelines.protocol > docs/protocol.schema.json``) and a test keeps the two in step.
Changes must be additive within ``v: 1``.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

PROTOCOL_VERSION = 1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ---------------------------------------------------------------- per-session configuration


Point = tuple[Annotated[float, Field(ge=0, le=1)], Annotated[float, Field(ge=0, le=1)]]


class ZoneConfig(_Strict):
    """A polygon in normalised image coordinates; objects entering/leaving it raise zone events."""

    name: str = Field(min_length=1, max_length=100)
    polygon: list[Point] = Field(min_length=3, max_length=100)


class LineConfig(_Strict):
    """A counting line from ``start`` to ``end`` (normalised); crossings raise line.cross events."""

    name: str = Field(min_length=1, max_length=100)
    start: Point
    end: Point


class VideoSessionConfig(_Strict):
    target_fps: float = Field(5.0, gt=0, le=120, description="Frames analysed per second (at most).")
    zones: list[ZoneConfig] = Field(default_factory=list, max_length=32)
    lines: list[LineConfig] = Field(default_factory=list, max_length=32)


class SessionConfig(_Strict):
    """The knobs a client may set per session: in the offer's ``options`` or later by a ``config`` message."""

    video: VideoSessionConfig = VideoSessionConfig()

    def merged(self, patch: SessionConfigPatch) -> SessionConfig:
        data = self.model_dump()
        for section, values in patch.model_dump(exclude_none=True).items():
            data[section].update(values)
        return SessionConfig.model_validate(data)


class VideoSessionConfigPatch(_Strict):
    target_fps: float | None = Field(None, gt=0, le=120)
    zones: list[ZoneConfig] | None = Field(None, max_length=32)
    lines: list[LineConfig] | None = Field(None, max_length=32)


class SessionConfigPatch(_Strict):
    video: VideoSessionConfigPatch | None = None


# ---------------------------------------------------------------- server -> client


class ServerMessage(BaseModel):
    v: Literal[1] = PROTOCOL_VERSION
    session: str = Field(description="Session or source id.")
    ts: float = Field(description="Server clock, seconds (wall clock; media clock in as-fast-as-possible replay).")
    pts: float | None = Field(None, description="Media time in seconds, where the message concerns media.")


class ServerInfo(BaseModel):
    name: str = "vigil"
    version: str


class Hello(ServerMessage):
    type: Literal["hello"] = "hello"
    server: ServerInfo
    config: SessionConfig
    tracks: list[Literal["video", "audio"]] = Field(description="Media tracks this session receives.")
    models: dict[str, str] = Field(default_factory=dict, description="Stage -> model/backend name.")


class DetectedObject(BaseModel):
    label: str
    class_id: int
    conf: float
    box: tuple[float, float, float, float] = Field(description="x1, y1, x2, y2 normalised to 0..1.")
    track_id: int | None = None
    keypoints: list[tuple[float, float, float]] | None = Field(None, description="x, y (0..1), confidence.")


class Detections(ServerMessage):
    type: Literal["detections"] = "detections"
    width: int
    height: int
    objects: list[DetectedObject]
    inference_ms: float
    queue_ms: float
    model: str


class Transcript(ServerMessage):
    type: Literal["transcript"] = "transcript"
    turn: int
    text: str
    final: bool


class Reply(ServerMessage):
    type: Literal["reply"] = "reply"
    turn: int
    delta: str | None = None
    done: bool = False


class Event(ServerMessage):
    type: Literal["event"] = "event"
    name: str = Field(description="e.g. source.state, config, zone.enter, barge_in.")
    data: dict[str, Any] = Field(default_factory=dict)


class VideoCounts(BaseModel):
    frames_in: int = 0
    frames_sampled: int = 0
    frames_analyzed: int = 0
    frames_dropped: int = Field(0, description="Sampled frames replaced by a newer one before analysis.")


class AudioCounts(BaseModel):
    frames_in: int = 0
    samples_in: int = 0
    seconds_in: float = 0.0


class MediaCounts(BaseModel):
    video: VideoCounts = VideoCounts()
    audio: AudioCounts = AudioCounts()


class TurnMetrics(BaseModel):
    """One voice turn's timings in milliseconds; absent stages did not happen (e.g. no reply after barge-in)."""

    turn: int
    speech_ms: float = Field(description="Length of the user's speech.")
    end_of_speech_to_final_ms: float | None = Field(None, description="End of speech -> final transcript.")
    llm_first_token_ms: float | None = Field(None, description="LLM request -> first token.")
    first_audio_ms: float | None = Field(None, description="End of speech -> first reply audio queued to play.")
    voice_to_voice_ms: float | None = Field(None, description="End of speech -> first reply audio frame sent.")
    barge_in_stop_ms: float | None = Field(None, description="Barge-in detected -> reply audio stopped.")
    prefill: Literal["none", "reused", "restarted"] = Field(
        "none", description="Streaming prefill: not started, its early LLM request reused, or cancelled and redone."
    )
    prefill_saved_ms: float | None = Field(None, description="How much earlier the reused LLM request started.")
    end_of_turn: Literal["model", "silence_cap", "silence", "max_turn"] | None = Field(
        None, description="What ended the turn: the turn model found it complete (model), the silence cap after the "
        "model called it unfinished (silence_cap), the fixed silence of turn_detection: silence (silence), or "
        "voice.max_turn_s (max_turn)."
    )
    end_of_turn_ms: float | None = Field(None, description="Silence heard after the speech before the turn ended.")
    turn_score: float | None = Field(None, description="The turn model's last completion probability (0..1).")
    turn_model_ms: float | None = Field(None, description="Time the turn model's last answer took.")
    final_decode: Literal["early", "partial", "new"] | None = Field(
        None, description="Where the final transcript came from: the decode started when the user went quiet, the "
        "last partial decode (no speech after either), or a new decode of the whole turn."
    )
    speculation: Literal["none", "played", "discarded"] = Field(
        "none", description="Speculative reply: none started, played (its held reply was confirmed by the final "
        "transcript), or discarded unheard (the user went on, or the final transcript differed); played wins when a "
        "later speculation of the same turn played."
    )
    speculations_discarded: int = Field(0, description="Speculative replies of this turn discarded unheard.")
    audio_send_ms: float | None = Field(
        None, description="First reply audio queued (first_audio_ms) -> its first frame sent (voice_to_voice_ms)."
    )


class Metrics(ServerMessage):
    type: Literal["metrics"] = "metrics"
    media: MediaCounts | None = None
    turn: TurnMetrics | None = None


class Error(ServerMessage):
    type: Literal["error"] = "error"
    code: str = Field(description="Stable machine-readable code, e.g. invalid_json, invalid_message.")
    message: str
    ref: str | None = Field(None, description="The type (or id) of the client message that caused it.")


class Pong(ServerMessage):
    type: Literal["pong"] = "pong"
    id: str | int | None = None


ServerMessageUnion = Annotated[
    Hello | Detections | Transcript | Reply | Event | Metrics | Error | Pong, Field(discriminator="type")
]

# ---------------------------------------------------------------- client -> server


class ClientMessage(_Strict):
    v: Literal[1] = PROTOCOL_VERSION


class ConfigRequest(ClientMessage, SessionConfigPatch):
    type: Literal["config"]


class Ping(ClientMessage):
    type: Literal["ping"]
    id: str | int | None = None


ClientMessageUnion = Annotated[ConfigRequest | Ping, Field(discriminator="type")]
client_message_adapter: TypeAdapter[ConfigRequest | Ping] = TypeAdapter(ClientMessageUnion)
server_message_adapter: TypeAdapter[Any] = TypeAdapter(ServerMessageUnion)


def json_schema() -> dict[str, Any]:
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"Vigil data-channel protocol v{PROTOCOL_VERSION}",
        "server_to_client": server_message_adapter.json_schema(),
        "client_to_server": client_message_adapter.json_schema(),
    }


if __name__ == "__main__":
    print(json.dumps(json_schema(), indent=2, sort_keys=True))
