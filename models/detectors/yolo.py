"""``backend: yolo``: Ultralytics YOLO (detect or pose), any .pt/.onnx/.engine weights, CPU or CUDA.

Ultralytics YOLO (detect or pose) behind the detector protocol: any .pt/.onnx/.engine weights, CPU or CUDA."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field

from models.detectors import DETECTORS, Detection, Detector
from models.packaged import ModelNotAvailable, yolo_pose_weights
from models.registry import BackendConfig

# Never reach for the network: no hub downloads, no pip auto-installs (air-gapped cameras are the norm).
os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("YOLO_AUTOINSTALL", "False")
os.environ.setdefault("YOLO_VERBOSE", "False")


def resolve_weights(weights: str | None) -> Path:
    if weights is None:
        return yolo_pose_weights()
    path = Path(weights).expanduser()
    if path.is_file():
        return path
    raise ModelNotAvailable(
        f"YOLO weights {weights!r} not found on disk and Vigil never downloads at run time: fetch the file on a "
        "connected machine (e.g. the Ultralytics release page), copy it here and set models.detector.weights "
        "to its path"
    )


def check_device(device: str) -> str:
    if device == "cpu":
        return device
    import torch

    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ModelNotAvailable(f"models.detector.device is {device!r} but CUDA is not available here")
        index = int(device.split(":", 1)[1]) if ":" in device else 0
        if index >= torch.cuda.device_count():
            raise ModelNotAvailable(f"{device!r}: only {torch.cuda.device_count()} CUDA device(s)")
        return device
    raise ModelNotAvailable(f"unknown device {device!r}: use cpu, cuda or cuda:N")


class UltralyticsDetector:
    def __init__(self, weights: str | None = None, *, device: str = "cpu", imgsz: int = 640, conf: float = 0.25,
                 half: bool = False, classes: list[int] | None = None) -> None:
        from ultralytics import YOLO

        path = resolve_weights(weights)
        self.device = check_device(device)
        self.imgsz, self.conf, self.classes = imgsz, conf, classes
        self.half = half and self.device.startswith("cuda")  # fp16 only where it helps (and works)
        self.model = YOLO(str(path))
        self.name = f"{path.stem}@{imgsz}"
        self.detect([np.zeros((imgsz, imgsz, 3), np.uint8)])  # warm-up: first-call costs stay out of results

    def detect(self, images: list[np.ndarray]) -> list[list[Detection]]:
        options = {"half": True} if self.half else {}  # passing half=False logs a deprecation on every call
        results = self.model.predict(images, imgsz=self.imgsz, conf=self.conf, device=self.device,
                                     classes=self.classes, verbose=False, **options)
        out: list[list[Detection]] = []
        for result in results:
            boxes = result.boxes
            xyxyn = boxes.xyxyn.cpu().numpy() if boxes is not None else np.zeros((0, 4))
            confs = boxes.conf.cpu().numpy() if boxes is not None else np.zeros(0)
            classes = boxes.cls.cpu().numpy().astype(int) if boxes is not None else np.zeros(0, int)
            keypoints = None
            if result.keypoints is not None and len(result.keypoints):
                xyn = result.keypoints.xyn.cpu().numpy()
                kconf = (result.keypoints.conf.cpu().numpy() if result.keypoints.conf is not None
                         else np.ones(xyn.shape[:2]))
                keypoints = np.concatenate([xyn, kconf[..., None]], axis=-1)
            out.append([
                Detection(
                    label=result.names[int(cls)], class_id=int(cls), conf=float(conf),
                    box=tuple(float(v) for v in np.clip(box, 0.0, 1.0)),  # type: ignore[arg-type]
                    keypoints=[tuple(map(float, k)) for k in keypoints[i]] if keypoints is not None else None,
                )
                for i, (box, conf, cls) in enumerate(zip(xyxyn, confs, classes, strict=True))
            ])
        return out


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
    return UltralyticsDetector(config.weights, device=config.device, imgsz=config.imgsz, conf=config.conf,
                               half=config.half, classes=config.classes)
