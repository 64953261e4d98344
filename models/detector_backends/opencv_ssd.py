"""``backend: opencv-ssd``: SSD-MobileNetV2-COCO on OpenCV DNN (CPU), general objects offline."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from models.detector import Detector
from models.detectors import DETECTORS
from models.registry import BackendConfig


class OpenCvSsdConfig(BackendConfig):
    backend: Literal["opencv-ssd"] = "opencv-ssd"
    device: str = Field("cpu", description="cpu only.")
    conf: float = Field(0.25, gt=0, lt=1)
    classes: list[int] | None = Field(None, description="COCO ids to keep; None: all.")


@DETECTORS.register(OpenCvSsdConfig)
def build(config: OpenCvSsdConfig) -> Detector:
    from models.opencv_ssd import OpenCvSsdDetector

    return OpenCvSsdDetector(device=config.device, conf=config.conf, classes=config.classes)
