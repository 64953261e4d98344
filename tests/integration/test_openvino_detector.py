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

from models.detectors.openvino import OpenVinoDetector, export_ir
from models.detectors.yolo import UltralyticsDetector
from tests.support.detections import Tolerance, assert_same_detections
from tests.support.media import real_image

TOLERANCE = {"f32": Tolerance(min_iou=0.99, max_conf=0.01, max_keypoint=0.01),
             "auto": Tolerance(min_iou=0.85, max_conf=0.03, max_keypoint=0.1)}
KEYPOINT_P90 = {"f32": 0.01, "auto": 0.02}  # the 90th percentile of the keypoint errors


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
        errors += assert_same_detections(want, got, TOLERANCE[precision])
    for want, got in zip(torch_detector.detect(photos), detector.detect(photos), strict=True):
        errors += assert_same_detections(want, got, TOLERANCE[precision])
    assert len(errors) > 40  # keypoints were really compared
    assert float(np.percentile(errors, 90)) <= KEYPOINT_P90[precision]
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


def test_a_batch_runs_in_compiled_chunks_and_finds_what_one_at_a_time_finds(ir_cache: Path):
    """Seven frames of one shape run as 4 + 2 + 1: only the single-image model is compiled while the first batch
    waits (the larger chunks in the background, used once ready), never one model per batch size."""
    detector = OpenVinoDetector(cache_dir=ir_cache, precision="f32")
    zidane = cv2.cvtColor(real_image("zidane"), cv2.COLOR_RGB2BGR)
    frames = [zidane, zidane[:, ::-1].copy(), zidane // 2 + 60, zidane, zidane[:, ::-1].copy(), zidane, zidane]
    alone = [detector.detect([frame])[0] for frame in frames]
    letterbox = (3, 384, 640)  # 1280x720 in the minimal stride-32 rectangle
    first = detector.detect(frames)  # only the single-image model of this shape is compiled yet
    assert sorted(detector.compiled_shapes(wait=True)) == sorted(
        [(1, 3, 640, 640)] + [(size, *letterbox) for size in (1, 2, 4)])
    again = detector.detect(frames)  # now 4 + 2 + 1
    for want, got_first, got_again in zip(alone, first, again, strict=True):
        assert_same_detections(want, got_first, TOLERANCE["f32"])
        assert_same_detections(want, got_again, TOLERANCE["f32"])
        assert len(want) >= 1
    detector.detect(frames[:3] * 3)  # nine: 4 + 4 + 1, no new model
    assert len(detector.compiled_shapes(wait=True)) == 4
