"""Detector backends are registered by name: each declares its own config; the config tree takes their union,
discriminated by ``backend``; a new backend needs no other change."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import BaseModel

from models.detectors import DETECTORS
from models.registry import BackendConfig, Registry
from server.config import ConfigError, load_settings


def test_the_existing_keys_still_mean_what_they_meant():
    assert load_settings(None, {}).models.detector.backend == "yolo"  # the default
    yolo = load_settings(None, {"models": {"detector": {"weights": "y.pt", "imgsz": 320}}}).models.detector
    assert (yolo.backend, yolo.weights, yolo.imgsz) == ("yolo", "y.pt", 320)  # no backend given: yolo
    ssd = load_settings(None, {"models": {"detector": {"backend": "opencv-ssd", "conf": 0.5}}}).models.detector
    assert (ssd.backend, ssd.conf) == ("opencv-ssd", 0.5)
    assert DETECTORS.build(load_settings(None, {"models": {"detector": {"backend": "none"}}}).models.detector) is None


def test_a_backend_refuses_the_keys_it_does_not_use():
    with pytest.raises(ConfigError, match="imgsz"):
        load_settings(None, {"models": {"detector": {"backend": "opencv-ssd", "imgsz": 320}}})
    with pytest.raises(ConfigError, match=r"'tpu'.*'none', 'opencv-ssd', 'triton', 'yolo'"):
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
