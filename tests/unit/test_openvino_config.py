"""``models.detector.backend: openvino`` declares its own keys: the YOLO-like ones it uses, its cache, threads and
precision; a key it does not declare is refused, and the default detector stays ``yolo``."""

from __future__ import annotations

import pytest

from models.openvino_detector import default_threads
from server.config import ConfigError, load_settings


def _detector(section: dict) -> object:
    return load_settings(None, {"models": {"detector": section}}).models.detector


def test_openvino_is_opt_in_with_its_own_keys():
    assert load_settings(None, {}).models.detector.backend == "yolo"
    default = _detector({"backend": "openvino"})
    assert (default.backend, default.weights, default.imgsz, default.conf, default.classes) == (
        "openvino", None, 640, 0.25, None)
    assert (default.threads, default.precision, default.cache_dir) == (None, "auto", "data/models/openvino")
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
