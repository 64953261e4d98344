"""dlib's face recognition: HOG frontal-face detector, 5-point landmarks and the ResNet embedding (128-d; 99.38 %
on LFW by its author), CC0 weights shipped in ``face-recognition-models`` (never imported: located on disk), dlib
itself from the prebuilt ``dlib-bin`` wheel. The MMOD CNN detector in the same package is not used (~2.5 s per
640x480 frame on this CPU against ~25 ms for HOG)."""

from __future__ import annotations

import threading
from typing import Literal

import numpy as np
from pydantic import Field

from models.faces import FACE_MODELS, FaceBox
from models.packaged import packaged_file
from models.registry import BackendConfig

PACKAGE = "face_recognition_models"


class DlibEmbeddingConfig(BackendConfig):
    """What every backend that embeds with dlib's ResNet takes (each adds its own ``backend`` and finder)."""

    jitters: int = Field(0, ge=0, le=10, description=(
        "Embed this many jittered copies of each face and average them (dlib's num_jitters): a little more "
        "robust, that many times slower. 0: the face once."))


class DlibFacesConfig(DlibEmbeddingConfig):
    backend: Literal["dlib"] = "dlib"


class DlibFaces:
    name = "dlib-resnet"

    def __init__(self, config: DlibFacesConfig) -> None:
        import dlib  # deferred: a C++ extension, loaded only when faces are on

        self._dlib = dlib
        self._jitters = config.jitters
        self._detector = dlib.get_frontal_face_detector()
        self._landmarks = dlib.shape_predictor(
            str(packaged_file(PACKAGE, "models/shape_predictor_5_face_landmarks.dat")))
        self._net = dlib.face_recognition_model_v1(
            str(packaged_file(PACKAGE, "models/dlib_face_recognition_resnet_model_v1.dat")))
        self._lock = threading.Lock()  # one caller at a time: the HTTP enrolment and the streams share the model

    def find(self, image: np.ndarray, upsample: int = 0) -> list[FaceBox]:
        image = np.ascontiguousarray(image, dtype=np.uint8)
        with self._lock:
            rects, scores, _ = self._detector.run(image, upsample, 0.0)
        height, width = image.shape[:2]
        return [FaceBox(max(0, r.left()), max(0, r.top()), min(width, r.right()), min(height, r.bottom()),
                        float(score)) for r, score in zip(rects, scores, strict=True)]

    def embed(self, image: np.ndarray, face: FaceBox) -> np.ndarray:
        image = np.ascontiguousarray(image, dtype=np.uint8)
        rect = self._dlib.rectangle(face.left, face.top, face.right, face.bottom)
        with self._lock:
            shape = self._landmarks(image, rect)
            vector = np.array(self._net.compute_face_descriptor(image, shape, self._jitters), dtype=np.float32)
        return vector / max(float(np.linalg.norm(vector)), 1e-9)


@FACE_MODELS.register(DlibFacesConfig)
def build(config: DlibFacesConfig) -> DlibFaces:
    return DlibFaces(config)
