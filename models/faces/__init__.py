"""Face models: the protocol (faces found in an RGB image, one embedding per face; blocking, so callers run it on
a worker thread) and the registry of backends, one module each: ``centerface`` (the default: CenterFace finds
faces turned, tilted and small, dlib's ResNet embeds them) and ``dlib`` (dlib's HOG frontal detector). Heavy
imports (dlib, ONNX Runtime) stay inside the builders, so loading the config stays cheap. Whoever builds a model
owns it (the app's engines, through its ``ModelPool``): there is no process-wide cache here."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from models.registry import Registry


@dataclass(frozen=True, slots=True)
class FaceBox:
    """A face in pixel coordinates of the image it was found in."""

    left: int
    top: int
    right: int
    bottom: int
    score: float  # the detector's confidence (HOG: the SVM margin, > 0 for a face; CenterFace: 0-1)
    # The detector's own 5 points (x, y): eyes (the person's right, then left), nose tip, mouth corners (right,
    # left); None from a detector without landmarks (HOG: the embedding finds its own).
    landmarks: tuple[tuple[float, float], ...] | None = None

    @property
    def width(self) -> int:
        return self.right - self.left


class FaceModel(Protocol):
    name: str

    def find(self, image: np.ndarray, upsample: int = 0) -> list[FaceBox]:
        """Faces in an RGB uint8 HxWx3 image (the backend's detector decides which views it finds); ``upsample``
        doubles the image that many times first (smaller faces are found, at four times the cost each time)."""
        ...

    def embed(self, image: np.ndarray, face: FaceBox) -> np.ndarray:
        """The face's embedding, a unit float32 vector: similar faces have a high dot product."""
        ...


FACE_MODELS: Registry[FaceModel] = Registry("faces", default="centerface")

FACE_MODELS.discover(sys.modules[__name__])  # each module registers itself on import
