"""The ``yolo`` backend on CUDA finds what it finds on the CPU, on real photos: FP16 (``models.detector.half: true``,
what a GPU host is configured with, and what scripts/gpu-check.sh measures) and FP32.

Skipped where torch sees no CUDA device (CI has none): run it on a GPU host, e.g. through ``scripts/gpu-check.sh``.
Tolerances per confident (conf > 0.4) CPU detection, matched to the CUDA detection of highest IoU, with the same
labels: FP32 box IoU >= 0.97, conf within 0.02, visible keypoints within 0.05; FP16 as the OpenVINO bf16 check
(IoU >= 0.85, conf within 0.03, keypoints within 0.1). The measured worst case is printed (``-s``)."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch

from models.detectors.yolo import UltralyticsDetector
from tests.support.detections import Tolerance, assert_same_detections, box_iou
from tests.support.media import real_image

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA device here: runs on a GPU host (scripts/gpu-check.sh)")

TOLERANCE = {False: Tolerance(min_iou=0.97, max_conf=0.02, max_keypoint=0.05),
             True: Tolerance(min_iou=0.85, max_conf=0.03, max_keypoint=0.1)}


def _photos() -> list[np.ndarray]:
    bus = cv2.cvtColor(real_image("bus"), cv2.COLOR_RGB2BGR)  # four people and a bus
    zidane = cv2.cvtColor(real_image("zidane"), cv2.COLOR_RGB2BGR)  # two people
    return [bus, zidane, zidane[:, :640].copy()]


@pytest.mark.parametrize("half", [False, True], ids=["fp32", "fp16"])
def test_cuda_finds_what_the_cpu_finds_on_real_photos(half: bool):
    cpu = UltralyticsDetector()
    gpu = UltralyticsDetector(device="cuda:0", half=half)
    assert gpu.device == "cuda:0" and gpu.half is half
    photos = _photos()
    pairs = [(cpu.detect([p])[0], gpu.detect([p])[0]) for p in photos]  # one photo per call
    pairs += list(zip(cpu.detect(photos), gpu.detect(photos), strict=True))  # one batch of mixed shapes
    errors: list[float] = []
    ious: list[float] = []
    for want, got in pairs:
        errors += assert_same_detections(want, got, TOLERANCE[half])
        ious += [max(box_iou(d.box, w.box) for d in got) for w in want if w.conf > 0.4]
    assert len(errors) > 40  # keypoints were really compared
    print(f"\n{'fp16' if half else 'fp32'} on {torch.cuda.get_device_name(0)}: {len(ious)} boxes, min IoU "
          f"{min(ious):.3f}, keypoint error max {max(errors):.4f}, p90 {float(np.percentile(errors, 90)):.4f}")
