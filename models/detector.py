"""The detector protocol: a batch of BGR images in, per-image detections out. Blocking; callers run it on a
worker thread."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np


@dataclass(slots=True)
class Detection:
    label: str
    class_id: int
    conf: float
    box: tuple[float, float, float, float]  # x1, y1, x2, y2 normalised to 0..1
    keypoints: list[tuple[float, float, float]] | None = None  # x, y normalised, confidence
    track_id: int | None = field(default=None)

    def as_message(self) -> dict:
        data: dict = {
            "label": self.label,
            "class_id": self.class_id,
            "conf": round(self.conf, 4),
            "box": [round(v, 5) for v in self.box],
            "track_id": self.track_id,
        }
        if self.keypoints is not None:
            data["keypoints"] = [[round(x, 5), round(y, 5), round(c, 4)] for x, y, c in self.keypoints]
        return data


class Detector(Protocol):
    name: str
    device: str

    def detect(self, images: list[np.ndarray]) -> list[list[Detection]]:
        """One call for the whole batch (BGR uint8 HxWx3 arrays, any sizes)."""
        ...
