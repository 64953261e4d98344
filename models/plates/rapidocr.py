"""PP-OCRv4 text detection and recognition (ONNX, shipped inside ``rapidocr-onnxruntime``, Apache-2.0) on ONNX
Runtime. The recogniser reads Latin letters and digits besides Chinese, which is what plates need."""

from __future__ import annotations

import logging
import threading
from typing import Literal

import numpy as np
from pydantic import Field

from models.plates import TEXT_READERS, TextLine
from models.registry import BackendConfig


class RapidOcrConfig(BackendConfig):
    backend: Literal["rapidocr"] = "rapidocr"
    threads: int = Field(1, ge=1, le=64, description=(
        "ONNX Runtime threads per model: one leaves the other cores to the detector and the voice loop."))
    det_side: int = Field(960, ge=64, le=4096, description=(
        "The text detector scales the crop so that its longer side is at most this (pixels): plates are small "
        "in a vehicle crop, larger finds smaller ones, at a quadratic cost."))


class RapidOcr:
    name = "pp-ocrv4"

    def __init__(self, config: RapidOcrConfig) -> None:
        from rapidocr_onnxruntime import RapidOCR  # deferred: onnxruntime sessions, loaded only when plates are on

        self._engine = RapidOCR(intra_op_num_threads=config.threads, inter_op_num_threads=1,
                                det_limit_type="max", det_limit_side_len=config.det_side)
        # Its logger prints every warning to stderr through a handler of its own: leave it to ours.
        ocr_log = logging.getLogger("RapidOCR")
        ocr_log.handlers.clear()
        ocr_log.setLevel(logging.WARNING)
        ocr_log.propagate = True
        self._lock = threading.Lock()

    def read(self, image: np.ndarray) -> list[TextLine]:
        with self._lock:
            found, _ = self._engine(np.ascontiguousarray(image, dtype=np.uint8))
        lines = []
        for box, text, score in found or ():
            points = np.asarray(box, dtype=np.float64)
            lines.append(TextLine(str(text), float(score), (float(points[:, 0].min()), float(points[:, 1].min()),
                                                            float(points[:, 0].max()), float(points[:, 1].max()))))
        return lines


@TEXT_READERS.register(RapidOcrConfig)
def build(config: RapidOcrConfig) -> RapidOcr:
    return RapidOcr(config)
