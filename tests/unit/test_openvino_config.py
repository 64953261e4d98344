"""``models.detector.backend: openvino`` declares its own keys: the YOLO-like ones it uses, its cache, threads and
precision; a key it does not declare is refused. It is the default detector on x86-64 where ``openvino``
imports; elsewhere, and for a section that sets torch's own keys (``device``, ``half``) or weights it does not
take, the default stays ``yolo``; ``backend: yolo`` keeps torch anywhere."""

from __future__ import annotations

import platform
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from models.detectors import openvino_usable
from models.detectors.openvino import default_threads
from server.config import REPO_ROOT, ConfigError, load_settings


def _detector(section: dict) -> object:
    return load_settings(None, {"models": {"detector": section}}).models.detector


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """Another machine for ``openvino_usable`` (cached per process): its cache is cleared before and after."""
    openvino_usable.cache_clear()
    yield monkeypatch
    monkeypatch.undo()
    openvino_usable.cache_clear()


def test_openvino_is_the_default_on_x86_64(machine: pytest.MonkeyPatch):
    machine.setattr(platform, "machine", lambda: "x86_64")
    assert load_settings(None, {}).models.detector.backend == "openvino"
    assert _detector({"weights": "custom.pt", "imgsz": 320}).backend == "openvino"  # no backend: the default
    assert _detector({"weights": "exported_openvino_model"}).backend == "openvino"  # an IR folder
    assert _detector({"backend": "yolo"}).backend == "yolo"  # torch, one line away


@pytest.mark.parametrize("section", [
    {"device": "cuda:0"}, {"device": "cuda", "half": True}, {"device": "cpu"},  # torch's own keys
    {"weights": "model.onnx"}, {"weights": "model.engine"},  # weights only Ultralytics loads
])
def test_torch_keys_keep_torch_on_x86_64(machine: pytest.MonkeyPatch, section: dict):
    machine.setattr(platform, "machine", lambda: "x86_64")
    assert _detector(section).backend == "yolo"


def test_cuda_from_the_environment_keeps_torch(machine: pytest.MonkeyPatch):
    machine.setattr(platform, "machine", lambda: "x86_64")
    machine.setenv("VIGIL_MODELS__DETECTOR__DEVICE", "cuda:0")
    detector = load_settings(None, {}).models.detector
    assert (detector.backend, detector.device) == ("yolo", "cuda:0")


@pytest.mark.parametrize("arch", ["aarch64", "arm64"])
def test_arm_keeps_torch(machine: pytest.MonkeyPatch, arch: str):
    machine.setattr(platform, "machine", lambda: arch)
    assert load_settings(None, {}).models.detector.backend == "yolo"


def test_no_openvino_package_keeps_torch(machine: pytest.MonkeyPatch):
    machine.setattr(platform, "machine", lambda: "x86_64")
    machine.setitem(sys.modules, "openvino", None)  # as when it is not installed: its import fails
    assert load_settings(None, {}).models.detector.backend == "yolo"


def test_openvino_keys_and_cache_dir():
    default = _detector({"backend": "openvino"})
    assert (default.backend, default.weights, default.imgsz, default.conf, default.classes) == (
        "openvino", None, 640, 0.25, None)
    assert (default.threads, default.precision) == (None, "auto")
    # absolute, in the checkout's git-ignored data/: the IR scripts/setup.sh exported, whatever the cwd
    assert Path(default.cache_dir) == REPO_ROOT / "data" / "models" / "openvino"
    tuned = _detector({"backend": "openvino", "imgsz": 320, "conf": 0.5, "classes": [0], "threads": 2,
                       "precision": "f32", "cache_dir": "/var/cache/vigil"})
    assert (tuned.imgsz, tuned.conf, tuned.classes, tuned.threads, tuned.precision, tuned.cache_dir) == (
        320, 0.5, [0], 2, "f32", "/var/cache/vigil")
    assert default_threads() >= 1


@pytest.mark.parametrize(("section", "error"), [
    # the yolo backend's keys: not this one's
    ({"backend": "openvino", "device": "cuda"}, r"detector\.openvino\.device: Extra inputs are not permitted"),
    ({"backend": "openvino", "half": True}, r"detector\.openvino\.half: Extra inputs are not permitted"),
    ({"backend": "openvino", "precison": "f32"}, r"detector\.openvino\.precison: Extra inputs are not permitted"),
    ({"backend": "openvino", "precision": "f16"}, r"detector\.openvino\.precision: Input should be 'auto', 'f32'"),
    ({"backend": "openvino", "threads": 0}, r"detector\.openvino\.threads: Input should be greater than"),
    # and the yolo backend refuses openvino's keys
    ({"backend": "yolo", "precision": "f32"}, r"detector\.yolo\.precision: Extra inputs are not permitted"),
])
def test_openvino_refuses_keys_it_does_not_declare(section: dict, error: str):
    with pytest.raises(ConfigError, match=error):
        _detector(section)
