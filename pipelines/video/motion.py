"""Per-stream motion detection on a small grey frame: the cheap test that decides whether a sampled frame is worth
the detector (``video.motion``; the gating itself is in ``pipelines.video.analyzer``).

The frame is scaled to ``WIDTH`` pixels wide in grey (FFmpeg's swscale, one call), blurred, and compared with a
running-average background:

* sensor noise: the downscale averages it, the blur averages it again, a pixel must change by ``threshold`` grey
  levels, and a moving blob must cover ``min_area`` of the frame (isolated pixels never do);
* slow light changes (dusk, a cloud): the background follows the scene with a time constant of ``BACKGROUND_S``
  (in media time, so the same at any sampling rate), so a gradual change stays below the threshold;
* sudden global changes (lights switched on, auto-exposure) and camera shake: when ``GLOBAL_CHANGE`` of the frame
  changes at once, or when the change is the whole view shifted (phase correlation finds a shift, and the shifted
  background explains most of the change), it is not an object moving; the background is re-learnt from this
  frame and the frame counts as motion once (the detector looks, since the view changed), then not again for
  ``GLOBAL_HOLD_S`` while it goes on;
* masks (normalised polygons): pixels inside never count, neither for motion nor for the global test.

Blocking (numpy/OpenCV, a few hundred microseconds): call ``check`` from an executor, never on the event loop.
One per stream; not thread-safe (each stream checks its frames one at a time).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import av
import cv2
import numpy as np

from pipelines.protocol import MotionConfig
from pipelines.video.frames import reformat

WIDTH = 256  # small enough to cost little, large enough that a person 30 px wide at 640 is still ~12 px
BLUR = (5, 5)
BACKGROUND_S = 2.0  # time constant of the background: a light ramp slower than ~threshold per 2 s goes unnoticed
GLOBAL_CHANGE = 0.5  # fraction of the unmasked frame: more than this changing at once is light or a shake
SHAKE_MIN = 0.02  # from this fraction changed, test whether the whole view moved (phase correlation)
SHAKE_EXPLAINED = 0.3  # the view moved when shifting the background leaves at most this share of the change
DILATION = np.ones((3, 3), np.uint8)  # joins a body's fragments; a changed pixel grows to at most its 9 pixels
GLOBAL_HOLD_S = 1.0  # a global change goes on (a shaking camera): re-learn, but detect once per this long


@dataclass(slots=True)
class Motion:
    moving: bool  # worth running the detector for
    changed: float  # fraction of the unmasked frame that changed
    boxes: list[tuple[float, float, float, float]] = field(default_factory=list)  # normalised x1, y1, x2, y2
    reason: str = "none"  # "first" | "motion" | "global" | "none"


class MotionDetector:
    def __init__(self, config: MotionConfig | None = None) -> None:
        self.config = config or MotionConfig()
        self._background: np.ndarray | None = None  # float32, blurred grey
        self._mask: np.ndarray | None = None  # bool, True where motion is ignored
        self._last_pts = 0.0
        self._last_global_pts: float | None = None

    def configure(self, config: MotionConfig) -> None:
        if config.masks != self.config.masks:
            self._mask = None  # rebuilt for the frame size on the next check
        self.config = config

    def reset(self) -> None:
        """Forget the background: the next frame is learnt (and reported as motion)."""
        self._background = None

    def check(self, frame: av.VideoFrame, pts: float) -> Motion:
        grey = small_grey(frame)
        image = cv2.GaussianBlur(grey, BLUR, 0).astype(np.float32)
        if self._background is None or self._background.shape != image.shape:
            self._background = image
            self._mask = None
            self._last_pts = pts
            return Motion(True, 1.0, [(0.0, 0.0, 1.0, 1.0)], "first")
        if self._mask is None:
            self._mask = _rasterise(self.config.masks, image.shape)
        diff = cv2.absdiff(image, self._background)
        moving = (diff > self.config.threshold) & ~self._mask
        unmasked = image.size - int(np.count_nonzero(self._mask))
        changed_px = int(np.count_nonzero(moving))
        changed = changed_px / unmasked if unmasked else 0.0
        if changed >= SHAKE_MIN and changed < GLOBAL_CHANGE:
            shaken = _shift_explains(self._background, image, self._mask, self.config.threshold, changed_px)
        else:
            shaken = False
        dt = pts - self._last_pts
        self._last_pts = pts
        if changed >= GLOBAL_CHANGE or shaken:
            self._background = image  # light or view changed: this frame is the new background
            due = self._last_global_pts is None or pts - self._last_global_pts >= GLOBAL_HOLD_S
            if due:
                self._last_global_pts = pts
            return Motion(due, changed, [(0.0, 0.0, 1.0, 1.0)] if due else [], "global" if due else "none")
        alpha = 1.0 - math.exp(-max(dt, 0.0) / BACKGROUND_S) if dt > 0 else 0.05
        cv2.accumulateWeighted(image, self._background, alpha)
        boxes = _blobs(moving, changed_px, self.config.min_area)
        return Motion(bool(boxes), changed, boxes, "motion" if boxes else "none")


def _shift_explains(background: np.ndarray, image: np.ndarray, mask: np.ndarray, threshold: int,
                    changed_px: int) -> bool:
    (dx, dy), _ = cv2.phaseCorrelate(background, image)
    if math.hypot(dx, dy) < 0.5:
        return False  # the view did not move: objects did
    moved = cv2.warpAffine(background, np.float32([[1, 0, dx], [0, 1, dy]]), background.shape[::-1],
                           borderMode=cv2.BORDER_REPLICATE)
    left = int(np.count_nonzero((cv2.absdiff(image, moved) > threshold) & ~mask))
    return left <= SHAKE_EXPLAINED * changed_px


def small_grey(frame: av.VideoFrame) -> np.ndarray:
    """The frame at most ``WIDTH`` wide, grey (uint8, height x width), in one swscale call."""
    width = min(WIDTH, frame.width)
    height = max(2, round(frame.height * width / frame.width / 2) * 2)
    return reformat(frame, width=width, height=height, format="gray").to_ndarray()


def _rasterise(polygons: list[list[tuple[float, float]]], shape: tuple[int, ...]) -> np.ndarray:
    height, width = shape[:2]
    mask = np.zeros((height, width), np.uint8)
    for polygon in polygons:
        points = np.rint(np.array(polygon, dtype=np.float64) * [width - 1, height - 1]).astype(np.int32)
        cv2.fillPoly(mask, [points], 1)
    return mask.astype(bool)


def _blobs(moving: np.ndarray, changed_px: int, min_area: float) -> list[tuple[float, float, float, float]]:
    """Connected moving regions (a small dilation joins a body's fragments) of at least ``min_area``."""
    height, width = moving.shape
    smallest = max(1.0, min_area * height * width)
    if changed_px * DILATION.size < smallest:
        # Even dilated, too few pixels changed to make one region: skip the labelling, which costs ~1 ms on the
        # small frame (most of a quiet camera's motion check, at every sampled frame).
        return []
    joined = cv2.dilate(moving.astype(np.uint8), DILATION)
    count, _, stats, _ = cv2.connectedComponentsWithStats(joined, connectivity=8)
    boxes = []
    for x, y, w, h, area in stats[1:count]:  # row 0 is the background
        if area >= smallest:
            boxes.append((x / width, y / height, (x + w) / width, (y + h) / height))
    return boxes
