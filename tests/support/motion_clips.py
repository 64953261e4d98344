"""Scenes for motion gating, built from real photographs: a background photo with Gaussian sensor noise on every
frame, and the person cut from zidane.jpg composited into it (moving, stopping), a light ramp or a camera shake."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from tests.support.media import letterbox, real_image, write_video

SIZE = (640, 360)


def background(name: str = "coffee", size: tuple[int, int] = SIZE) -> np.ndarray:
    return letterbox(real_image(name), size)


def person(height: int) -> np.ndarray:
    """The man on the right of zidane.jpg, head to knees, ``height`` pixels tall (RGB)."""
    import cv2

    cut = real_image("zidane")[60:720, 700:1130]
    return cv2.resize(cut, (int(cut.shape[1] * height / cut.shape[0]), height))


def noisy(picture: np.ndarray, rng: np.random.Generator, sigma: float) -> np.ndarray:
    """Sensor noise: independent Gaussian noise on every pixel of every frame."""
    return np.clip(picture.astype(np.float32) + rng.normal(0, sigma, picture.shape), 0, 255).astype(np.uint8)


def paste(scene: np.ndarray, cut: np.ndarray, x: int, y: int) -> np.ndarray:
    out = scene.copy()
    out[y: y + cut.shape[0], x: x + cut.shape[1]] = cut
    return out


def scene_clip(path: Path, frames: int, fps: int, picture_at: Callable[[int], np.ndarray], *, sigma: float = 6.0,
               seed: int = 0) -> Path:
    """``frames`` frames of ``picture_at(index)`` with fresh sensor noise on each (H.264, crf 18)."""
    rng = np.random.default_rng(seed)
    return write_video(path, [noisy(picture_at(index), rng, sigma) for index in range(frames)], fps)


def walk_then_stop(scene: np.ndarray, cut: np.ndarray, frames: int, stop_at: int, x0: int, x1: int,
                   y: int) -> Callable[[int], np.ndarray]:
    """The person walks from ``x0`` to ``x1`` over the first ``stop_at`` frames, then stands still."""

    def picture_at(index: int) -> np.ndarray:
        x = x0 + (x1 - x0) * min(index, stop_at) // stop_at
        return paste(scene, cut, x, y)

    return picture_at
