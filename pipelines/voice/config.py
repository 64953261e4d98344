"""The voice loop's config: one session's knobs, built from ``voice`` by ``server.config_mapping``."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class VoiceLoopConfig:
    vad_threshold: float = 0.5
    min_speech_ms: float = 250
    turn_detection: str = "silence"  # "smart-turn" needs VoiceEngine.turn
    end_of_turn_silence_ms: float = 600
    turn_check_silence_ms: float = 200
    turn_max_silence_ms: float = 1500
    turn_threshold: float = 0.5
    max_turn_s: float = 30.0
    partial_interval_ms: float = 400
    prefill: bool = True
    prefill_stable_ms: float = 300
    barge_in: bool = True
    barge_in_min_speech_ms: float = 200
    echo_gating: bool = False
    # No default: the one prompt is the config's (voice.system_prompt), passed by server.config_mapping.
    system_prompt: str = field(kw_only=True)
    max_reply_tokens: int = 96
    max_reply_sentences: int = 3  # a spoken answer stops after this many sentences (and at a repeated one)
    repeat_penalty: float = 1.1  # llama.cpp's repetition penalty (1: off); the sentence guard catches the rest
    memory_tokens: int = 1024
    temperature: float = 0.0
    silent_track_s: float = 10.0
    reply_burst_ms: float = 80.0
