"""The detector backends, registered by name (``models/detector_backends/``: one module each, declaring its
config and its builder). ``load_detector`` builds the configured one; whoever calls it owns the result (the
app's engines), so there is no process-wide cache here."""

from __future__ import annotations

import functools
import importlib
import platform
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

from models import detector_backends
from models.detector import Detector
from models.registry import BackendConfig, Registry

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


DETECTORS.discover(detector_backends)  # each module registers itself on import
