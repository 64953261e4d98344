"""``backend: triton``: a YOLO model served by NVIDIA Triton Inference Server (``models/triton_detector.py``).

``weights`` are what ``vigil export-detector`` exports into Triton's model repository; ``triton`` says where it
is served. One cross-stream batch is one Triton request."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from models.detector import Detector
from models.detectors import DETECTORS
from models.registry import BackendConfig
from models.triton_detector import TritonDetectorConfig


class TritonConfig(BackendConfig):
    backend: Literal["triton"] = "triton"
    weights: str | None = Field(None, description="Exported by `vigil export-detector`; None: the packaged "
                                "yolo11n-pose.pt.")
    imgsz: int = Field(640, ge=32)
    conf: float = Field(0.25, gt=0, lt=1)
    classes: list[int] | None = None
    triton: TritonDetectorConfig = TritonDetectorConfig()


@DETECTORS.register(TritonConfig)
def build(config: TritonConfig) -> Detector:
    from models.triton_detector import TritonDetector

    return TritonDetector(config.triton, imgsz=config.imgsz, conf=config.conf, classes=config.classes)
