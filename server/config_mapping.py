"""Where the config tree meets the lower layers: one explicit function per boundary, building the typed config a
pipeline or model takes from its section of ``Settings``. Every field is named on both sides, so a field renamed
or added on one side fails here (and in ``tests/unit/test_config_mapping.py``), instead of being dropped by a
name match. The lower layers' own defaults serve their direct callers (tests, benches); the server always
passes every value from the config. A backend's config (``models.<kind>``) needs no function here: the backend
module declares it and maps it itself (e.g. ``models/llm/openai.py`` to the router's dataclasses).
"""

from __future__ import annotations

from pipelines.voice.loop import VoiceLoopConfig
from server.config import VoiceSettings

# Settings fields deliberately not passed down, per boundary (each with its reason).
VOICE_SETTINGS_NOT_PASSED = {"enabled": "decides whether the loop is built at all (server.engines)"}


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
