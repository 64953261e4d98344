"""Object detectors: the protocol (a batch of BGR images in, per-image detections out; blocking, so callers run
it on a worker thread) and the registry of backends, one module each in this package declaring its config, its
builder and its code (``yolo``, ``openvino``, ``opencv-ssd``, ``triton``, ``none``). ``load_detector`` builds
the configured one; whoever calls it owns the result (the app's engines), so there is no process-wide cache
here. Heavy imports (torch, OpenCV, OpenVINO) stay inside the builders and detectors, so loading the config
stays cheap."""

from __future__ import annotations

import functools
import importlib
import platform
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any, Protocol

import numpy as np

from models.registry import BackendConfig, Registry


@dataclass(slots=True)
class Detection:
    label: str
    class_id: int
    conf: float
    box: tuple[float, float, float, float]  # x1, y1, x2, y2 normalised to 0..1
    keypoints: list[tuple[float, float, float]] | None = None  # x, y normalised, confidence
    track_id: int | None = field(default=None)
    confirmed: bool | None = field(default=None)  # set by a tracker: whether the track may raise events

    def as_message(self) -> dict:
        data: dict = {
            "label": self.label,
            "class_id": self.class_id,
            "conf": round(self.conf, 4),
            "box": [round(v, 5) for v in self.box],
            "track_id": self.track_id,
        }
        if self.confirmed is not None:
            data["confirmed"] = self.confirmed
        if self.keypoints is not None:
            data["keypoints"] = [[round(x, 5), round(y, 5), round(c, 4)] for x, y, c in self.keypoints]
        return data


class Detector(Protocol):
    name: str
    device: str

    def detect(self, images: list[np.ndarray]) -> list[list[Detection]]:
        """One call for the whole batch (BGR uint8 HxWx3 arrays, any sizes)."""
        ...


X86_64 = {"x86_64", "amd64"}
OPENVINO_WEIGHTS = {".pt", ""}  # what the openvino backend loads: a .pt file (exported once) or an IR folder


@functools.cache
def openvino_usable() -> bool:
    """An x86-64 CPU and an ``openvino`` package that imports (ARM has no OpenVINO CPU plugin worth taking)."""
    if platform.machine().lower() not in X86_64:
        return False
    try:
        importlib.import_module("openvino")
    except Exception:  # missing, or a broken wheel: either way, torch serves
        return False
    return True


def default_backend(section: Mapping[str, Any]) -> str:
    """A ``models.detector`` section without ``backend``: ``openvino`` on x86-64 (detections match torch's within
    the tolerance of tests/integration/test_openvino_detector.py, ~2.3x faster here), else ``yolo``. A section
    that sets a key only the ``yolo`` backend has (``device``, ``half``: CUDA, or torch on purpose) or weights
    the OpenVINO backend does not take (not a .pt file or an IR folder: .onnx, .engine) keeps ``yolo``, so a config that
    worked before keeps its runtime."""
    yolo, openvino = (set(DETECTORS.backends[name].config.model_fields) for name in ("yolo", "openvino"))
    if (yolo - openvino) & section.keys():
        return "yolo"
    weights = section.get("weights")
    if isinstance(weights, str) and PurePath(weights).suffix.lower() not in OPENVINO_WEIGHTS:
        return "yolo"
    return "openvino" if openvino_usable() else "yolo"


DETECTORS: Registry[Detector | None] = Registry("detector", default=default_backend)


def load_detector(config: BackendConfig) -> Detector | None:
    """The configured detector (blocking: loads weights); None for ``backend: none``."""
    return DETECTORS.build(config)


DETECTORS.discover(sys.modules[__name__])  # each module registers itself on import
