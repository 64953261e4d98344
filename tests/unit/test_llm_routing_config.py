"""``models.llm``'s routing and upstreams reach the router (``models/llm/openai.py`` maps them to the router's
dataclasses): the two sides have the same fields, and every value set in the config arrives."""

from __future__ import annotations

import dataclasses

from models.llm.openai import routing_config, upstream_configs
from models.llm.router import RoutingConfig, UpstreamConfig
from server.config import LlmRouting, LlmUpstream, load_settings


def _fields(config: type) -> set[str]:
    return {f.name for f in dataclasses.fields(config)}


def test_routing_settings_and_the_router_have_the_same_fields():
    assert set(LlmRouting.model_fields) == _fields(RoutingConfig)


def test_upstream_settings_and_the_router_have_the_same_fields():
    assert set(LlmUpstream.model_fields) == _fields(UpstreamConfig)


def test_the_router_defaults_to_the_configs_routing():
    # Declared twice (the router's dataclass serves its direct callers): at least they may not drift apart.
    assert dataclasses.asdict(RoutingConfig()) == LlmRouting().model_dump()


def test_every_routing_value_set_in_the_config_arrives():
    routing = LlmRouting(strategy="cost-aware", saturation=9, health_interval_s=7.0, health_timeout_s=1.5,
                         request_timeout_s=11.0, latency_alpha=0.7, max_attempts=5, affinity_conversations=3,
                         probe_interval_s=0.25)
    assert dataclasses.asdict(routing_config(routing)) == routing.model_dump()


def test_upstreams_keep_their_values_and_the_plain_base_url_comes_first():
    llm = load_settings(None, {"models": {"llm": {"backend": "openai", "base_url": "http://a/v1", "api_key": "ka",
                                                  "final_message": "llama.cpp",
                                                  "upstreams": [{"name": "b", "base_url": "http://b/v1",
                                                                 "models": ["m"], "api_key": "kb", "cost": 2.0,
                                                                 "context_window": 8192,
                                                                 "final_message": "vllm"}]}}}).models.llm
    first, second = upstream_configs(llm)
    assert (first.name, first.base_url, first.models, first.api_key) == ("default", "http://a/v1", ("*",), "ka")
    assert first.final_message == "llama.cpp"
    assert second == UpstreamConfig("b", "http://b/v1", ("m",), "kb", 2.0, 8192, "vllm")


def test_the_router_continues_a_last_assistant_message_only_if_every_upstream_does():
    from models.llm.router import RoutedLlm

    vllm, plain = UpstreamConfig("a", "http://a/v1", final_message="vllm"), UpstreamConfig("b", "http://b/v1")
    assert RoutedLlm([vllm], "m").continues_final_message
    assert not RoutedLlm([vllm, plain], "m").continues_final_message
