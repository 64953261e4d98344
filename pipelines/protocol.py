"""The data-channel protocol, version 1: every message Vigil sends or accepts, as pydantic models.

This module is the public contract. ``docs/protocol.schema.json`` is generated from it
(``python -m pipelines.protocol > docs/protocol.schema.json``) and a test keeps the two in step.
Changes must be additive within ``v: 1``.
"""

from __future__ import annotations

import json
import string
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator, model_validator

PROTOCOL_VERSION = 1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Outbound(BaseModel):
    """What Vigil sends: a field the model does not declare is an error where the message is built, never a key
    silently dropped (or sent unannounced)."""

    model_config = ConfigDict(extra="forbid")


# ---------------------------------------------------------------- per-session configuration


Point = tuple[Annotated[float, Field(ge=0, le=1)], Annotated[float, Field(ge=0, le=1)]]
# Fields a spoken-alert template may use: plain names only (no attribute or index access, no format specs).
ANNOUNCE_FIELDS = frozenset({"zone", "line", "label", "track_id", "direction", "source", "event", "identity",
                             "plate"})


def _check_announce(template: str | None) -> str | None:
    if template is None:
        return None
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as error:
        raise ValueError(f"announce: {error}") from None
    for _, field_name, spec, conversion in parts:
        if field_name is None:
            continue
        if field_name not in ANNOUNCE_FIELDS or spec or conversion:
            raise ValueError(f"announce: '{{{field_name}}}' is not allowed; use {sorted(ANNOUNCE_FIELDS)}")
    return template


class _Announced(BaseModel):
    announce: str | None = Field(None, min_length=1, max_length=300, description=(
        "Spoken on the session's reply track when an object enters the zone (crosses the line), e.g. "
        "'Someone entered the {zone}', '{identity} is at the door'. Fields: zone, line, label, track_id, direction, "
        "source, event, identity (the enrolled name, else 'someone'), plate (its name, else its text)."))
    announce_cooldown_s: float = Field(30.0, ge=0, le=86400, description="At most one alert per this many seconds.")

    @field_validator("announce")
    @classmethod
    def _template(cls, value: str | None) -> str | None:
        return _check_announce(value)


class ZoneConfig(_Strict, _Announced):
    """A polygon in normalised image coordinates; objects entering/leaving it raise zone events."""

    name: str = Field(min_length=1, max_length=100)
    polygon: list[Point] = Field(min_length=3, max_length=100)


class LineConfig(_Strict, _Announced):
    """A counting line from ``start`` to ``end`` (normalised); crossings raise line.cross events."""

    name: str = Field(min_length=1, max_length=100)
    start: Point
    end: Point


class MotionConfig(_Strict):
    """Motion-gated detection: a sampled frame goes to the detector only when it shows motion, when it is the
    stream's first, or when a detected object is due for a refresh; any other frame is counted as ``no_motion``."""

    enabled: bool = Field(True, description="Gate the detector on motion; false: every sampled frame is detected.")
    threshold: int = Field(25, ge=1, le=255, description=(
        "Grey-level change (0-255, after a blur, against the running background) for a pixel to count as moving; "
        "higher ignores more sensor noise."))
    min_area: float = Field(0.001, ge=0, le=1, description=(
        "Smallest moving blob that counts as motion, as a fraction of the frame's area (0.001: 0.1 %)."))
    refresh_s: float = Field(5.0, gt=0, le=3600, description=(
        "While objects are in view, detect at least this often without motion, so a parked car or a seated person "
        "stays tracked (and stays inside its zones)."))
    masks: list[list[Point]] = Field(default_factory=list, max_length=32, description=(
        "Polygons (normalised image coordinates, 3-100 points each) where motion is ignored, e.g. a tree or a "
        "clock; objects there are still detected when motion elsewhere (or a refresh) runs the detector."))
    boost_fps: float = Field(0.0, ge=0, le=120, description=(
        "While the gate sees motion, sample up to this rate (e.g. 10: a runner is seen twice as often as at 5 fps) "
        "when the detector has headroom (busy under half its time, so the node's other streams keep their rate); "
        "back to target_fps when quiet. At or below target_fps (0, the default): no boost. Off by default: beside "
        "a live voice loop on 2 cores it cost the voice 1.39x its idle latency (bench/capacity.py --cameras 8)."))

    @field_validator("masks")
    @classmethod
    def _polygons(cls, value: list[list[tuple[float, float]]]) -> list[list[tuple[float, float]]]:
        for index, polygon in enumerate(value):
            if not 3 <= len(polygon) <= 100:
                raise ValueError(f"masks[{index}]: a polygon needs 3 to 100 points, got {len(polygon)}")
        return value


class MotionConfigPatch(_Strict):
    enabled: bool | None = None
    threshold: int | None = Field(None, ge=1, le=255)
    min_area: float | None = Field(None, ge=0, le=1)
    refresh_s: float | None = Field(None, gt=0, le=3600)
    masks: list[list[Point]] | None = Field(None, max_length=32)
    boost_fps: float | None = Field(None, ge=0, le=120)


class ObjectFilter(_Strict):
    """Which detections of one label may start a track, and when a track is trusted (Frigate's object filters).

    A detection below ``min_score`` or outside the area and ratio bounds is never tracked; a track raises events
    (zones, lines, appearances, clips, alerts) only once the median of its last scores reaches ``threshold``, and
    stays confirmed from then on. Unconfirmed objects are still sent in ``detections`` (``confirmed: false``)."""

    min_score: float = Field(0.5, ge=0, le=1, description=(
        "Smallest detector confidence that may start or continue a track (weaker ones are shown, never tracked)."))
    threshold: float = Field(0.7, ge=0, le=1, description=(
        "A track raises events once the median of its last 10 scores reaches this (then stays confirmed)."))
    min_area: float = Field(0.0, ge=0, le=1, description="Smallest box, as a fraction of the frame's area.")
    max_area: float = Field(1.0, ge=0, le=1, description="Largest box, as a fraction of the frame's area.")
    min_ratio: float = Field(0.0, ge=0, le=1000, description="Smallest width / height of a box.")
    max_ratio: float = Field(1000.0, ge=0, le=1000, description="Largest width / height of a box.")

    @model_validator(mode="after")
    def _bounds(self) -> ObjectFilter:
        if self.min_area > self.max_area:
            raise ValueError("min_area must be <= max_area")
        if self.min_ratio > self.max_ratio:
            raise ValueError("min_ratio must be <= max_ratio")
        return self


class ObjectsConfig(_Strict):
    """Per-label detection filters (``video.objects``)."""

    default: ObjectFilter = Field(default_factory=ObjectFilter, description="The filter of every label not in filters.")
    filters: dict[Annotated[str, Field(min_length=1, max_length=100)], ObjectFilter] = Field(
        default_factory=dict, max_length=100, description=(
            "Label -> its filter, replacing default for that label (keys not given take the built-in defaults)."))

    def of(self, label: str) -> ObjectFilter:
        return self.filters.get(label, self.default)


class ObjectsConfigPatch(_Strict):
    default: ObjectFilter | None = None
    filters: dict[Annotated[str, Field(min_length=1, max_length=100)], ObjectFilter] | None = Field(
        None, max_length=100)


class VideoSessionConfig(_Strict):
    detect: bool = Field(True, description="Run detection; off, frames are counted but not analysed (no objects, "
                         "events or clips) until it is turned on again.")
    target_fps: float = Field(5.0, gt=0, le=120, description="Frames analysed per second (at most).")
    zones: list[ZoneConfig] = Field(default_factory=list, max_length=32)
    lines: list[LineConfig] = Field(default_factory=list, max_length=32)
    motion: MotionConfig = Field(default_factory=MotionConfig, description="Motion-gated detection.")
    objects: ObjectsConfig = Field(default_factory=ObjectsConfig, description=(
        "Per-label filters: which detections are tracked and when a track raises events."))


class SessionConfig(_Strict):
    """The knobs a client may set per session: in the offer's ``options`` or later by a ``config`` message."""

    video: VideoSessionConfig = VideoSessionConfig()

    def merged(self, patch: SessionConfigPatch) -> SessionConfig:
        data = self.model_dump()
        for section, values in patch.model_dump(exclude_none=True).items():
            for key, value in values.items():
                if isinstance(value, dict) and isinstance(data[section].get(key), dict):
                    data[section][key].update(value)  # a nested section (video.motion): only the keys given
                else:
                    data[section][key] = value
        return SessionConfig.model_validate(data)


class VideoSessionConfigPatch(_Strict):
    detect: bool | None = None
    target_fps: float | None = Field(None, gt=0, le=120)
    zones: list[ZoneConfig] | None = Field(None, max_length=32)
    lines: list[LineConfig] | None = Field(None, max_length=32)
    motion: MotionConfigPatch | None = None
    objects: ObjectsConfigPatch | None = None


class SessionConfigPatch(_Strict):
    video: VideoSessionConfigPatch | None = None


# ---------------------------------------------------------------- server -> client


class ServerMessage(_Outbound):
    v: Literal[1] = PROTOCOL_VERSION
    session: str = Field(description="Session or source id.")
    ts: float = Field(description="Server clock, seconds (wall clock; media clock in as-fast-as-possible replay).")
    pts: float | None = Field(None, description="Media time in seconds, where the message concerns media.")


class ServerInfo(_Outbound):
    name: str = "vigil"
    version: str


class Hello(ServerMessage):
    type: Literal["hello"] = "hello"
    server: ServerInfo
    config: SessionConfig
    tracks: list[Literal["video", "audio"]] = Field(description="Media tracks this session receives.")
    models: dict[str, str] = Field(default_factory=dict, description="Stage -> model/backend name.")


class Identity(_Outbound):
    """Who a tracked person is (``video.faces``): an enrolled name, or null for a face that matches nobody."""

    name: str | None = Field(description="The enrolled person's name; null: a face seen that matches nobody.")
    score: float = Field(description="Cosine similarity to the best-matching enrolled face.")


class PlateReading(_Outbound):
    """A vehicle track's best licence-plate reading (``video.plates``)."""

    text: str = Field(description="Upper-case letters and digits (spaces and dashes dropped).")
    score: float = Field(description="The text reader's confidence, 0..1.")
    name: str | None = Field(None, description="The name of a known plate (video.plates.known).")


class DetectedObject(_Outbound):
    label: str
    class_id: int
    conf: float
    box: tuple[float, float, float, float] = Field(description="x1, y1, x2, y2 normalised to 0..1.")
    track_id: int | None = None
    confirmed: bool | None = Field(None, description=(
        "Whether the object's track is trusted (video.objects: its score passed min_score and its track's median "
        "score reached threshold); false: shown, but it raises no event, clip or alert. Null: not tracked."))
    keypoints: list[tuple[float, float, float]] | None = Field(None, description="x, y (0..1), confidence.")
    identity: Identity | None = Field(None, description="A person's face, once looked at (video.faces).")
    plate: PlateReading | None = Field(None, description="A vehicle's best plate reading (video.plates).")


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
    kind: Literal["answer", "alert"] | None = Field(
        None, description="'alert': a spoken alert (a zone's or line's announce), not an answer; absent: an answer.")
    interrupted: bool = Field(
        False, description="With done: the reply was cut short (a barge-in or a newer turn), not finished.")


# ---------------------------------------------------------------- event payloads (``event.data`` by ``event.name``)


class _Known(_Outbound):
    identity: Identity | None = Field(None, description="Who the track is (video.faces), when known.")
    plate: PlateReading | None = Field(None, description="The track's plate (video.plates), when read.")


class _Scored(_Known):
    score: float | None = Field(None, description="The track's best detector score so far.")


class ZoneEnter(_Scored):
    zone: str
    track_id: int
    label: str


class ZoneExit(_Scored):
    zone: str
    track_id: int
    label: str
    dwell_s: float = Field(description="Seconds the track spent inside (media time).")


class LineCross(_Scored):
    line: str
    track_id: int
    label: str
    direction: Literal["in", "out"]


class ObjectAppeared(_Known):
    """First sighting of a track whose label has a ``storage.appear`` rule."""

    label: str
    track_id: int
    conf: float


class BargeIn(_Outbound):
    turn: int = Field(description="The turn whose reply was interrupted.")
    dropped_audio_ms: float = Field(description="Reply audio discarded, not played.")


class SourceStateChange(_Outbound):
    state: Literal["connecting", "live", "reconnecting", "ended", "failed", "stopped"]
    attempt: int | None = Field(None, description="connecting / reconnecting: the attempt, from 0.")
    reason: str | None = Field(None, description="reconnecting / failed: why.")
    retry_in_s: float | None = Field(None, description="reconnecting: the backoff before the next attempt.")


# name -> the model of its ``data``; a new event name is one line here plus its model (config: the session's new
# effective config, after a client's ``config`` message).
EVENT_PAYLOADS: dict[str, type[BaseModel]] = {
    "zone.enter": ZoneEnter, "zone.exit": ZoneExit, "line.cross": LineCross, "object.appeared": ObjectAppeared,
    "barge_in": BargeIn, "source.state": SourceStateChange, "config": SessionConfig,
}


class Event(ServerMessage):
    type: Literal["event"] = "event"
    name: str = Field(description="One of EVENT_PAYLOADS: zone.enter, zone.exit, line.cross, object.appeared, "
                      "barge_in, source.state, config.")
    data: dict[str, Any] = Field(default_factory=dict, description="The payload model of ``name``.")
    id: str | None = Field(None, description="Timeline entry id of a stored event (GET /api/events/{id}).")

    @model_validator(mode="after")
    def _payload_matches_its_name(self) -> Event:
        payload = EVENT_PAYLOADS.get(self.name)
        if payload is None:
            raise ValueError(f"event {self.name!r} has no payload model (pipelines.protocol.EVENT_PAYLOADS)")
        payload.model_validate(self.data)  # a missing, misspelled or extra key fails here
        return self


class Clip(ServerMessage):
    """An event clip is ready (after ``storage.post_s``); ``pts`` is the clip's start in media time."""

    type: Literal["clip"] = "clip"
    event_ids: list[str] = Field(description="The stored events this clip covers (later events extend a clip).")
    duration_s: float
    url: str = Field(description="GET it for the MP4 (range requests supported); any of event_ids serves it.")


class VideoCounts(_Outbound):
    frames_in: int = 0
    frames_sampled: int = 0
    frames_analyzed: int = 0
    frames_dropped: int = Field(0, description="Sampled frames replaced by a newer one before analysis.")
    frames_no_motion: int = Field(0, description=(
        "Sampled frames not sent to the detector: no motion, and no object due for a refresh (video.motion)."))
    frames_failed: int = Field(0, description=(
        "Sampled frames whose analysis failed: a detector outage (a worker process restarting, an inference server "
        "down) or a model error; the session goes on."))


class AudioCounts(_Outbound):
    frames_in: int = 0
    samples_in: int = 0
    seconds_in: float = 0.0


class MediaCounts(_Outbound):
    video: VideoCounts = VideoCounts()
    audio: AudioCounts = AudioCounts()


class TurnMetrics(_Outbound):
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
    memory_retrieval_ms: float | None = Field(
        None, description="A question about the past: time to rewrite it, search memory and fit the entries."
    )
    memory_entries: int | None = Field(None, description="Remembered entries put into the prompt.")
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
    continues_turn: int | None = Field(
        None, description="The user went on after a pause before they could have heard turn N's reply (before any "
        "of it, or within 0.5 s of its start; it was cut): this turn's text starts with turn N's, and its answer is "
        "to both."
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
    Hello | Detections | Transcript | Reply | Event | Clip | Metrics | Error | Pong, Field(discriminator="type")
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
        "event_payloads": {name: model.model_json_schema() for name, model in EVENT_PAYLOADS.items()},
    }


def _type_name(annotation: Any) -> str:
    text = getattr(annotation, "__name__", None) if getattr(annotation, "__args__", None) is None else None
    text = text or str(annotation).replace("typing.", "").replace("NoneType", "None")
    text = text.replace("__main__.", "").replace("pipelines.protocol.", "")  # a model of ours: its name alone
    return text.replace(" | ", " or ")  # a bare '|' would split the markdown table's cell


def events_markdown() -> str:
    """The table of event payloads in docs/protocol.md (between its ``events`` markers; a test compares)."""
    rows = ["| `name` | `data` fields |", "|---|---|"]
    for name, model in EVENT_PAYLOADS.items():
        if model is SessionConfig:
            rows.append(f"| `{name}` | the session's new effective config (`SessionConfig`: `video`, ...) |")
            continue
        fields = []
        for field_name, field in model.model_fields.items():
            optional = "" if field.is_required() else ", optional"
            note = f": {field.description.rstrip('.')}" if field.description else ""
            fields.append(f"`{field_name}` ({_type_name(field.annotation)}{optional}){note}")
        rows.append(f"| `{name}` | {'; '.join(fields)} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["--events-markdown"]:
        print(events_markdown(), end="")
    else:
        print(json.dumps(json_schema(), indent=2, sort_keys=True))
