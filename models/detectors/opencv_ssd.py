"""``backend: opencv-ssd``: SSD-MobileNetV2-COCO on OpenCV DNN (CPU), general objects offline.

SSD-MobileNetV2-COCO (90 COCO ids) on OpenCV DNN, for users who want general objects offline."""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field

from models.detectors import DETECTORS, Detection, Detector
from models.detectors.coco import COCO90
from models.packaged import ModelNotAvailable, ssd_mobilenet_coco
from models.registry import BackendConfig

INPUT_SIZE = 300


class OpenCvSsdDetector:
    def __init__(self, *, device: str = "cpu", conf: float = 0.4, classes: list[int] | None = None) -> None:
        import cv2  # deferred, as in every backend module: loading the config imports them all

        if device != "cpu":
            raise ModelNotAvailable("the OpenCV SSD backend runs on the CPU only; use the yolo backend on a GPU")
        if not hasattr(cv2.dnn, "readNetFromTensorflow"):
            raise ModelNotAvailable("this OpenCV has no TensorFlow importer (OpenCV 5); install opencv-python<5")
        graph, text = ssd_mobilenet_coco()
        self.net = cv2.dnn.readNetFromTensorflow(str(graph), str(text))
        self.device, self.conf = device, conf
        self.classes = set(classes) if classes else None
        self.names = COCO90  # the labels it can report (before ``classes``), as the YOLO backends' ``names``
        self.name = "ssd_mobilenet_v2_coco"
        self.detect([np.zeros((INPUT_SIZE, INPUT_SIZE, 3), np.uint8)])  # warm-up

    def detect(self, images: list[np.ndarray]) -> list[list[Detection]]:
        import cv2

        blob = cv2.dnn.blobFromImages(images, size=(INPUT_SIZE, INPUT_SIZE), swapRB=True)
        self.net.setInput(blob)
        rows = self.net.forward().reshape(-1, 7)  # [image index, class id, confidence, x1, y1, x2, y2]
        out: list[list[Detection]] = [[] for _ in images]
        for index, class_id, conf, *box in rows[rows[:, 2] >= self.conf]:
            class_id = int(class_id)
            if class_id not in COCO90 or (self.classes is not None and class_id not in self.classes):
                continue
            out[int(index)].append(Detection(
                label=COCO90[class_id], class_id=class_id, conf=float(conf),
                box=tuple(float(v) for v in np.clip(box, 0.0, 1.0)),  # type: ignore[arg-type]
            ))
        return out


class OpenCvSsdConfig(BackendConfig):
    backend: Literal["opencv-ssd"] = "opencv-ssd"
    device: str = Field("cpu", description="cpu only.")
    conf: float = Field(0.25, gt=0, lt=1)
    classes: list[int] | None = Field(None, description="COCO ids to keep; None: all.")


@DETECTORS.register(OpenCvSsdConfig)
def build(config: OpenCvSsdConfig) -> Detector:
    return OpenCvSsdDetector(device=config.device, conf=config.conf, classes=config.classes)
