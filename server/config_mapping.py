"""Where the config tree meets the lower layers: one explicit function per boundary, building the typed config a
pipeline or model takes from its section of ``Settings``. Every field is named on both sides, so a field renamed
or added on one side fails here (and in ``tests/unit/test_config_mapping.py``), instead of being dropped by a
name match. The lower layers' own defaults serve their direct callers (tests, benches); the server always
passes every value from the config. A backend's config (``models.<kind>``) needs no function here: the backend
module declares it and maps it itself (e.g. ``models/llm/openai.py`` to the router's dataclasses).
"""

from __future__ import annotations

from pipelines.video.faces import FaceSettings
from pipelines.video.plates import PlateSettings
from pipelines.voice.config import VoiceLoopConfig
from server.config import VoiceSettings
from server.config.faces import FacesSettings, PlatesSettings

# Settings fields deliberately not passed down, per boundary (each with its reason).
VOICE_SETTINGS_NOT_PASSED = {"enabled": "decides whether the loop is built at all (server.engines)"}
FACES_SETTINGS_NOT_PASSED = {"model": "the face model's own config (server.engines builds it)"}
PLATES_SETTINGS_NOT_PASSED = {"model": "the text reader's own config (server.engines builds it)"}


def voice_loop_config(voice: VoiceSettings, origin: str) -> VoiceLoopConfig:
    """``voice`` -> the voice loop of one session; ``origin`` (webrtc, rtsp, file, grpc) decides ``auto`` echo
    gating: on for sources, which have no echo cancelling."""
    echo_gating = voice.echo_gating == "on" or (voice.echo_gating == "auto" and origin in ("rtsp", "file"))
    return VoiceLoopConfig(
        vad_threshold=voice.vad_threshold,
        min_speech_ms=voice.min_speech_ms,
        turn_detection=voice.turn_detection,
        end_of_turn_silence_ms=voice.end_of_turn_silence_ms,
        turn_check_silence_ms=voice.turn_check_silence_ms,
        turn_max_silence_ms=voice.turn_max_silence_ms,
        turn_threshold=voice.turn_threshold,
        max_turn_s=voice.max_turn_s,
        partial_interval_ms=voice.partial_interval_ms,
        prefill=voice.prefill,
        prefill_stable_ms=voice.prefill_stable_ms,
        barge_in=voice.barge_in,
        barge_in_min_speech_ms=voice.barge_in_min_speech_ms,
        echo_gating=echo_gating,
        system_prompt=voice.system_prompt,
        max_reply_tokens=voice.max_reply_tokens,
        max_reply_sentences=voice.max_reply_sentences,
        repeat_penalty=voice.repeat_penalty,
        memory_tokens=voice.memory_tokens,
        temperature=voice.temperature,
        silent_track_s=voice.silent_track_s,
        reply_burst_ms=voice.reply_burst_ms,
    )


def face_settings(faces: FacesSettings) -> FaceSettings:
    """``video.faces`` -> face recognition (``pipelines.video.faces``)."""
    return FaceSettings(enabled=faces.enabled, threshold=faces.threshold, interval_s=faces.interval_s,
                        max_per_frame=faces.max_per_frame, max_wait_s=faces.max_wait_s, min_face_px=faces.min_face_px,
                        labels=tuple(faces.labels), max_image_pixels=faces.max_image_pixels)


def plate_settings(plates: PlatesSettings) -> PlateSettings:
    """``video.plates`` -> plate reading (``pipelines.video.plates``)."""
    return PlateSettings(enabled=plates.enabled, labels=tuple(plates.labels), interval_s=plates.interval_s,
                         max_per_frame=plates.max_per_frame, max_wait_s=plates.max_wait_s, min_score=plates.min_score,
                         settle_score=plates.settle_score, known=dict(plates.known))
