"""Each boundary between the config tree and a lower layer passes every field, by name, on purpose: a field that
exists on one side only fails here, and every value set in the config arrives."""

from __future__ import annotations

import dataclasses

import pytest

from models.llm.openai import routing_config, upstream_configs
from models.llm.router import RoutingConfig, UpstreamConfig
from pipelines.voice.loop import VoiceLoopConfig
from server.config import LlmRouting, LlmUpstream, VoiceSettings, load_settings
from server.config_mapping import VOICE_SETTINGS_NOT_PASSED, voice_loop_config


def _fields(config: type) -> set[str]:
    return {f.name for f in dataclasses.fields(config)}


def test_voice_settings_and_the_voice_loop_have_the_same_fields():
    assert set(VoiceSettings.model_fields) - set(VOICE_SETTINGS_NOT_PASSED) == _fields(VoiceLoopConfig)


def test_routing_settings_and_the_router_have_the_same_fields():
    assert set(LlmRouting.model_fields) == _fields(RoutingConfig)


def test_upstream_settings_and_the_router_have_the_same_fields():
    assert set(LlmUpstream.model_fields) == _fields(UpstreamConfig)


def _changed(value):
    """A valid value unlike the default, for every field type the sections use."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value * 2 if value < 0.4 else value / 2 if isinstance(value, float) else value + 1
    if isinstance(value, str):
        return value + " (changed)"
    raise AssertionError(f"add a case for {value!r}")


def test_every_voice_value_set_in_the_config_arrives():
    defaults = VoiceSettings()
    overrides = {name: _changed(getattr(defaults, name)) for name in VoiceSettings.model_fields
                 if name not in ("enabled", "echo_gating", "turn_detection")}
    overrides["turn_detection"] = "silence"  # a Literal: the other choice than the default (smart-turn)
    assert defaults.turn_detection != "silence"
    voice = load_settings(None, {"voice": {**overrides, "echo_gating": "on"}}).voice
    mapped = voice_loop_config(voice, "webrtc")
    for name, value in overrides.items():
        assert getattr(mapped, name) == value, name
    assert mapped.echo_gating is True
    auto = VoiceSettings(echo_gating="auto")
    assert voice_loop_config(auto, "rtsp").echo_gating and not voice_loop_config(auto, "webrtc").echo_gating


def test_the_voice_prompt_has_one_source():
    with pytest.raises(TypeError):
        VoiceLoopConfig()  # type: ignore[call-arg]  # no second default to drift from voice.system_prompt


def test_every_routing_value_set_in_the_config_arrives():
    routing = LlmRouting(strategy="cost-aware", saturation=9, health_interval_s=7.0, health_timeout_s=1.5,
                         request_timeout_s=11.0, latency_alpha=0.7, max_attempts=5, affinity_conversations=3,
                         probe_interval_s=0.25)
    assert dataclasses.asdict(routing_config(routing)) == routing.model_dump()


def test_upstreams_keep_their_values_and_the_plain_base_url_comes_first():
    llm = load_settings(None, {"models": {"llm": {"backend": "openai", "base_url": "http://a/v1", "api_key": "ka",
                                                  "upstreams": [{"name": "b", "base_url": "http://b/v1",
                                                                 "models": ["m"], "api_key": "kb", "cost": 2.0,
                                                                 "context_window": 8192}]}}}).models.llm
    first, second = upstream_configs(llm)
    assert (first.name, first.base_url, first.models, first.api_key) == ("default", "http://a/v1", ("*",), "ka")
    assert second == UpstreamConfig("b", "http://b/v1", ("m",), "kb", 2.0, 8192)
