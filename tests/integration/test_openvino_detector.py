"""The OpenVINO detector backend finds what the torch ``yolo`` backend finds, on real photos.

The IR is exported offline once per test session (Ultralytics' exporter, the packaged yolo11n-pose.pt) into a
temporary cache, as the backend does on its first load. Both run at imgsz 640 and conf 0.25, Ultralytics' own
pre/post-processing on both sides. Tolerances, per confident (conf > 0.4) torch detection matched to the OpenVINO
detection of highest IoU, with the same label and the same number of confident detections per photo:

* ``f32``: box IoU >= 0.99, |conf difference| <= 0.01, visible keypoints (conf > 0.5) within 0.01 (x + y,
  normalised). Measured here: identical (IoU 1.0, conf difference 0).
* ``auto`` (OpenVINO picks bf16 on this CPU): box IoU >= 0.85, |conf difference| <= 0.03, visible keypoints
  within 0.1, 90 % of them within 0.02. Measured here: IoU >= 0.90 (0.901: Zidane's outstretched arm, where the
  box ends at a hand; every other box >= 0.98), conf within 0.006, keypoints within 0.066 (the same hand).
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from models.detectors import Detection
from models.detectors.openvino import OpenVinoDetector, export_ir
from models.detectors.yolo import UltralyticsDetector
from tests.support.media import real_image

TOLERANCE = {  # precision: (min IoU, max conf difference, max keypoint error, 90th-percentile keypoint error)
    "f32": (0.99, 0.01, 0.01, 0.01),
    "auto": (0.85, 0.03, 0.1, 0.02),
}


@pytest.fixture(scope="session")
def ir_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = tmp_path_factory.mktemp("openvino-cache")
    export_ir(None, cache)  # the packaged weights, offline (YOLO_OFFLINE=1, no network in the sandbox)
    return cache


@pytest.fixture(scope="session")
def torch_detector() -> UltralyticsDetector:
    return UltralyticsDetector()


def _photos() -> list[np.ndarray]:
    bus = cv2.cvtColor(real_image("bus"), cv2.COLOR_RGB2BGR)  # 810x1080, portrait: four people and a bus
    zidane = cv2.cvtColor(real_image("zidane"), cv2.COLOR_RGB2BGR)  # 1280x720: two people
    return [bus, zidane, zidane[:, :640].copy()]


def _iou(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    x1, y1, x2, y2 = max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3])
    inter = max(0.0, x2 - x1) * max(0.0, y2 - y1)
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union else 0.0


def _assert_same(want: list[Detection], got: list[Detection], precision: str) -> list[float]:
    """Asserts the tolerance of ``precision``; returns the keypoint errors compared."""
    min_iou, max_conf, max_keypoint, _ = TOLERANCE[precision]
    confident = [d for d in want if d.conf > 0.4]
    assert confident, "the photo should show people"
    assert sorted(d.label for d in confident) == sorted(d.label for d in got if d.conf > 0.4)
    errors: list[float] = []
    for expected in confident:
        match = max(got, key=lambda d: _iou(d.box, expected.box))
        assert _iou(match.box, expected.box) >= min_iou, (expected, match)
        assert match.label == expected.label
        assert abs(match.conf - expected.conf) <= max_conf, (expected.conf, match.conf)
        assert expected.keypoints is not None and match.keypoints is not None
        errors += [abs(k[0] - m[0]) + abs(k[1] - m[1])
                   for k, m in zip(expected.keypoints, match.keypoints, strict=True) if k[2] > 0.5]
    assert max(errors, default=0.0) <= max_keypoint, errors
    return errors


@pytest.mark.parametrize("precision", ["auto", "f32"])
def test_openvino_finds_what_torch_finds_on_real_photos(ir_cache: Path, torch_detector: UltralyticsDetector,
                                                        precision: str):
    detector = OpenVinoDetector(cache_dir=ir_cache, precision=precision)  # type: ignore[arg-type]
    assert detector.precision in ("bf16", "f32") and detector.device == "cpu"
    if precision == "f32":
        assert detector.precision == "f32"
    photos = _photos()
    errors: list[float] = []
    # One photo per call (each its own minimal letterbox), then all in one batch of mixed shapes (square 640).
    for want, got in zip([torch_detector.detect([p])[0] for p in photos],
                         [detector.detect([p])[0] for p in photos], strict=True):
        errors += _assert_same(want, got, precision)
    for want, got in zip(torch_detector.detect(photos), detector.detect(photos), strict=True):
        errors += _assert_same(want, got, precision)
    assert len(errors) > 40  # keypoints were really compared
    assert float(np.percentile(errors, 90)) <= TOLERANCE[precision][3]
    assert all(d.keypoints is not None and len(d.keypoints) == 17 for d in detector.detect(photos[:1])[0])


def test_the_ir_is_exported_once_and_reused(ir_cache: Path):
    folders = [path for path in ir_cache.iterdir() if not path.name.startswith(".")]
    assert len(folders) == 1 and folders[0].name.startswith("yolo11n-pose-")
    assert {path.suffix for path in folders[0].iterdir()} >= {".xml", ".bin", ".yaml"}
    written = (folders[0] / "yolo11n-pose.xml").stat().st_mtime_ns
    assert export_ir(None, ir_cache) == folders[0]  # a lookup: no second export
    assert (folders[0] / "yolo11n-pose.xml").stat().st_mtime_ns == written
    assert export_ir(str(folders[0]), ir_cache / "unused") == folders[0]  # an IR directory is taken as is
    assert not (ir_cache / "unused").exists()
