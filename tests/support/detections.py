"""One detector's detections against another's on the same images: the tolerance check the backend-parity tests
share (OpenVINO, Triton and CUDA against the CPU torch ``yolo`` backend)."""

from __future__ import annotations

from dataclasses import dataclass

from models.detectors import Detection


@dataclass(frozen=True)
class Tolerance:
    """Per confident (conf > 0.4) reference detection, matched to the other side's detection of highest IoU."""

    min_iou: float
    max_conf: float  # |confidence difference|
    max_keypoint: float  # |dx| + |dy| of a visible (conf > 0.5) keypoint, normalised coordinates
    count_slack: int = 0  # confident detections one side may have more than the other


def box_iou(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    x1, y1, x2, y2 = max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3])
    inter = max(0.0, x2 - x1) * max(0.0, y2 - y1)
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union else 0.0


def assert_same_detections(want: list[Detection], got: list[Detection], tolerance: Tolerance) -> list[float]:
    """Asserts ``got`` finds what ``want`` finds within ``tolerance``; returns the keypoint errors compared."""
    confident = [d for d in want if d.conf > 0.4]
    assert confident, "the image should show people"
    other = [d for d in got if d.conf > 0.4]
    if tolerance.count_slack:
        assert abs(len(confident) - len(other)) <= tolerance.count_slack, (confident, other)
    else:
        assert sorted(d.label for d in confident) == sorted(d.label for d in other), (confident, other)
    errors: list[float] = []
    for expected in confident:
        match = max(got, key=lambda d: box_iou(d.box, expected.box))
        assert box_iou(match.box, expected.box) >= tolerance.min_iou, (expected, match)
        assert match.label == expected.label
        assert abs(match.conf - expected.conf) <= tolerance.max_conf, (expected.conf, match.conf)
        if expected.keypoints is None:
            continue
        assert match.keypoints is not None
        errors += [abs(k[0] - m[0]) + abs(k[1] - m[1])
                   for k, m in zip(expected.keypoints, match.keypoints, strict=True) if k[2] > 0.5]
    assert max(errors, default=0.0) <= tolerance.max_keypoint, errors
    return errors
