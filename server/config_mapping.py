"""Where the config tree meets the lower layers: one explicit function per boundary, building the typed config a
pipeline or model takes from its section of ``Settings``. Every field is named on both sides, so a field renamed
or added on one side fails here (and in ``tests/unit/test_config_mapping.py``), instead of being dropped by a
name match. The lower layers' own defaults serve their direct callers (tests, benches); the server always
passes every value from the config.
"""

from __future__ import annotations

from pydantic import SecretStr

from models.router import ANY_MODEL, RoutingConfig, UpstreamConfig
from pipelines.voice.loop import VoiceLoopConfig
from server.config import LlmModel, LlmRouting, VoiceSettings

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
        memory_tokens=voice.memory_tokens,
        temperature=voice.temperature,
        silent_track_s=voice.silent_track_s,
        reply_burst_ms=voice.reply_burst_ms,
    )


def routing_config(routing: LlmRouting) -> RoutingConfig:
    """``models.llm.routing`` -> the LLM router's strategy and timings."""
    return RoutingConfig(
        strategy=routing.strategy,
        saturation=routing.saturation,
        health_interval_s=routing.health_interval_s,
        health_timeout_s=routing.health_timeout_s,
        request_timeout_s=routing.request_timeout_s,
        latency_alpha=routing.latency_alpha,
        max_attempts=routing.max_attempts,
        affinity_conversations=routing.affinity_conversations,
        probe_interval_s=routing.probe_interval_s,
    )


def _secret(value: SecretStr | None) -> str | None:
    return value.get_secret_value() if value else None


def upstream_configs(llm: LlmModel) -> list[UpstreamConfig]:
    """``models.llm`` (openai backend) -> the router's upstreams; a plain ``base_url`` is one upstream serving any
    model name, first."""
    upstreams = [
        UpstreamConfig(
            name=u.name, base_url=u.base_url, models=tuple(u.models), api_key=_secret(u.api_key), cost=u.cost,
            context_window=u.context_window,
        )
        for u in llm.upstreams
    ]
    if llm.base_url:
        upstreams.insert(0, UpstreamConfig(name="default", base_url=llm.base_url, models=(ANY_MODEL,),
                                           api_key=_secret(llm.api_key)))
    return upstreams
