"""``backend: openvino``: YOLO on Intel's OpenVINO runtime (CPU), the IR exported offline from the weights into
``cache_dir`` at set-up (``scripts/setup.sh``) or on first load (``models/openvino_detector.py``). The default
on x86-64 (``models/detectors.py`` ``default_backend``); detections match the ``yolo`` backend's within the
tolerance stated in ``tests/integration/test_openvino_detector.py``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from models.detector import Detector
from models.detectors import DETECTORS
from models.packaged import DERIVED_MODELS_DIR
from models.registry import BackendConfig

DEFAULT_CACHE_DIR = DERIVED_MODELS_DIR / "openvino"


class OpenVinoConfig(BackendConfig):
    backend: Literal["openvino"] = "openvino"
    weights: str | None = Field(None, description="A .pt file (exported to IR once) or an OpenVINO IR directory; "
                                "None: the packaged yolo11n-pose.pt.")
    cache_dir: str = Field(str(DEFAULT_CACHE_DIR), description="Where exported IRs are kept (one folder per "
                           "weights file, keyed by its hash). The default is the checkout's data/models/openvino, "
                           "absolute so that any working directory finds the IR scripts/setup.sh exported.")
    imgsz: int = Field(640, ge=32)
    conf: float = Field(0.25, gt=0, lt=1)
    classes: list[int] | None = None
    threads: int | None = Field(None, ge=1, description="Inference threads; None: max(1, cores - 1), one core "
                                "left to the voice loop.")
    precision: Literal["auto", "f32", "bf16"] = Field(
        "auto", description="auto: OpenVINO's choice (bf16 on CPUs that have it, else f32).")


@DETECTORS.register(OpenVinoConfig)
def build(config: OpenVinoConfig) -> Detector:
    from models.openvino_detector import OpenVinoDetector

    return OpenVinoDetector(config.weights, cache_dir=config.cache_dir, imgsz=config.imgsz, conf=config.conf,
                            classes=config.classes, threads=config.threads, precision=config.precision)
