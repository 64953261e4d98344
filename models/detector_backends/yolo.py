"""``backend: yolo``: Ultralytics YOLO (detect or pose), any .pt/.onnx/.engine weights, CPU or CUDA."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from models.detector import Detector
from models.detectors import DETECTORS
from models.registry import BackendConfig


class YoloConfig(BackendConfig):
    backend: Literal["yolo"] = "yolo"
    weights: str | None = Field(None, description="Path or name; None: the packaged yolo11n-pose.pt.")
    device: str = "cpu"
    imgsz: int = Field(640, ge=32)
    conf: float = Field(0.25, gt=0, lt=1)
    half: bool = False
    classes: list[int] | None = None


@DETECTORS.register(YoloConfig)
def build(config: YoloConfig) -> Detector:
    from models.yolo import UltralyticsDetector

    return UltralyticsDetector(config.weights, device=config.device, imgsz=config.imgsz, conf=config.conf,
                               half=config.half, classes=config.classes)
