"""Detector backends are registered by name: each declares its own config; the config tree takes their union,
discriminated by ``backend``; a new backend needs no other change."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import BaseModel

from models.detectors import DETECTORS, openvino_usable
from models.registry import BackendConfig, Registry
from server.config import ConfigError, load_settings


def test_the_existing_keys_still_mean_what_they_meant():
    default = "openvino" if openvino_usable() else "yolo"  # x86-64 with openvino installed, else torch
    assert load_settings(None, {}).models.detector.backend == default
    yolo = load_settings(None, {"models": {"detector": {"weights": "y.pt", "imgsz": 320}}}).models.detector
    assert (yolo.backend, yolo.weights, yolo.imgsz) == (default, "y.pt", 320)  # no backend given: the default
    cuda = load_settings(None, {"models": {"detector": {"device": "cuda:0", "half": True}}}).models.detector
    assert (cuda.backend, cuda.device, cuda.half) == ("yolo", "cuda:0", True)  # torch's own keys: torch
    ssd = load_settings(None, {"models": {"detector": {"backend": "opencv-ssd", "conf": 0.5}}}).models.detector
    assert (ssd.backend, ssd.conf) == ("opencv-ssd", 0.5)
    assert DETECTORS.build(load_settings(None, {"models": {"detector": {"backend": "none"}}}).models.detector) is None


def test_a_backend_refuses_the_keys_it_does_not_use():
    with pytest.raises(ConfigError, match="imgsz"):
        load_settings(None, {"models": {"detector": {"backend": "opencv-ssd", "imgsz": 320}}})
    with pytest.raises(ConfigError, match=r"'tpu'.*'none', 'opencv-ssd', 'openvino', 'triton', 'yolo'"):
        load_settings(None, {"models": {"detector": {"backend": "tpu"}}})


class EchoConfigForTest(BackendConfig):
    backend: Literal["echo"] = "echo"
    greeting: str = "hi"


def test_a_new_backend_is_its_config_and_its_builder():
    registry: Registry[str] = Registry("thing", default="echo")

    @registry.register(EchoConfigForTest)
    def build(config: EchoConfigForTest) -> str:
        return config.greeting

    class Section(BaseModel):
        thing: registry.config_type()  # type: ignore[valid-type]

    section = Section.model_validate({"thing": {"greeting": "hello"}})
    assert registry.build(section.thing) == "hello"
    with pytest.raises(ValueError, match="registered twice"):
        registry.register(EchoConfigForTest)(build)


def test_stt_llm_and_tts_backends_are_registered_and_keep_their_keys():
    models = load_settings(None, {}).models  # the defaults, as before the registry
    assert (models.stt.backend, models.stt.model_dir, models.stt.compute_type, models.stt.short_window) == (
        "whisper", None, "int8", True)
    assert (models.llm.backend, models.llm.model_path, models.llm.model) == ("embedded", None,
                                                                             "smollm2-135m-instruct")
    assert (models.tts.backend, models.tts.voice) == ("piper", None)
    configured = load_settings(None, {"models": {
        "stt": {"model_dir": "base", "device": "cuda", "short_window": False},  # no backend: whisper
        "llm": {"backend": "openai", "base_url": "http://a/v1", "model": "m", "routing": {"strategy": "cost-aware"}},
        "tts": {"backend": "espeak", "voice": "en-gb"},
    }}).models
    assert (configured.stt.backend, configured.stt.model_dir, configured.stt.device) == ("whisper", "base", "cuda")
    assert not configured.stt.short_window
    assert (configured.llm.base_url, configured.llm.model, configured.llm.routing.strategy) == (
        "http://a/v1", "m", "cost-aware")
    assert (configured.tts.backend, configured.tts.voice) == ("espeak", "en-gb")
    with pytest.raises(ConfigError, match="modle"):  # a key no LLM backend has
        load_settings(None, {"models": {"llm": {"modle": "m"}}})
    with pytest.raises(ConfigError, match=r"'coqui'.*'espeak', 'piper'"):
        load_settings(None, {"models": {"tts": {"backend": "coqui"}}})


def test_the_environment_still_picks_and_configures_a_backend(monkeypatch):
    monkeypatch.setenv("VIGIL_MODELS__LLM__BACKEND", "openai")
    monkeypatch.setenv("VIGIL_MODELS__LLM__BASE_URL", "http://vllm:8000/v1")
    monkeypatch.setenv("VIGIL_MODELS__STT__DEVICE", "cuda")
    models = load_settings(None, {}).models
    assert (models.llm.backend, models.llm.base_url, models.stt.backend, models.stt.device) == (
        "openai", "http://vllm:8000/v1", "whisper", "cuda")


def test_llm_keys_of_the_other_backend_are_ignored_as_before_the_split(caplog):
    # models.llm was one flat section: api_key or base_url with the embedded LLM was accepted (and unused).
    llm = load_settings(None, {"models": {"llm": {"api_key": "sk-secret", "base_url": "http://a/v1"}}}).models.llm
    assert llm.backend == "embedded" and "api_key" not in llm.model_dump()
    assert "api_key, base_url not used by backend 'embedded'" in caplog.text and "sk-secret" not in caplog.text
