"""Detector loading: weights load once per process and are shared by every session."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Literal

from models.detector import Detector

if TYPE_CHECKING:
    from models.triton_detector import TritonDetectorConfig

_cache: dict[tuple, Detector] = {}
_lock = threading.Lock()


def load_detector(backend: Literal["yolo", "opencv-ssd", "triton"], *, weights: str | None = None,
                  device: str = "cpu", imgsz: int = 640, conf: float = 0.25, half: bool = False,
                  classes: list[int] | None = None, triton: TritonDetectorConfig | None = None) -> Detector:
    key = (backend, weights, device, imgsz, conf, half, tuple(classes or ()),
           triton.model_dump_json() if triton is not None else None)
    with _lock:
        if key not in _cache:
            if backend == "yolo":
                from models.yolo import UltralyticsDetector

                _cache[key] = UltralyticsDetector(weights, device=device, imgsz=imgsz, conf=conf, half=half,
                                                  classes=classes)
            elif backend == "opencv-ssd":
                from models.opencv_ssd import OpenCvSsdDetector

                _cache[key] = OpenCvSsdDetector(device=device, conf=conf, classes=classes)
            elif backend == "triton":
                from models.triton_detector import TritonDetector, TritonDetectorConfig

                _cache[key] = TritonDetector(triton or TritonDetectorConfig(), imgsz=imgsz, conf=conf,
                                             classes=classes)
            else:
                raise ValueError(f"unknown detector backend {backend!r}")
        return _cache[key]
