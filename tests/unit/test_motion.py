"""The motion detector on real photographs with sensor noise (no model): what counts as motion and what does not."""

from __future__ import annotations

from collections.abc import Callable

import av
import numpy as np

from pipelines.protocol import MotionConfig
from pipelines.video.motion import MotionDetector
from tests.support.motion_clips import background, noisy, paste, person, walk_then_stop

FPS = 5


def _moving(picture_at: Callable[[int], np.ndarray], frames: int, config: MotionConfig | None = None,
            sigma: float = 8.0) -> list[int]:
    """Indices of the frames the detector calls moving (fresh Gaussian noise on every frame)."""
    rng = np.random.default_rng(1)
    detector = MotionDetector(config or MotionConfig())
    found = []
    for index in range(frames):
        frame = av.VideoFrame.from_ndarray(noisy(picture_at(index), rng, sigma), format="rgb24")
        if detector.check(frame, index / FPS).moving:
            found.append(index)
    return found


def test_a_still_noisy_scene_moves_only_on_its_first_frame():
    scene = background("coffee")
    assert _moving(lambda _: scene, 50, sigma=12.0) == [0]


def test_a_slow_light_ramp_is_not_motion():
    scene = background("coffee").astype(np.float32)

    def brighter(index: int) -> np.ndarray:  # +30 % over 10 s
        return np.clip(scene * (1 + 0.3 * index / (10 * FPS)), 0, 255).astype(np.uint8)

    assert _moving(brighter, 12 * FPS) == [0]


def test_lights_switched_on_are_detected_once():
    scene = background("coffee").astype(np.float32)
    lit = np.clip(scene * 1.6 + 20, 0, 255).astype(np.uint8)
    assert _moving(lambda i: lit if i >= 10 else scene.astype(np.uint8), 30) == [0, 10]


def test_a_camera_shake_is_detected_once_or_twice_not_on_every_frame():
    scene = background("bus")
    shaken = np.roll(scene, (6, 10), axis=(0, 1))
    moving = _moving(lambda i: shaken if 10 <= i < 13 else scene, 30)
    assert moving[0] == 0 and 1 <= len(moving[1:]) <= 2 and all(10 <= i <= 13 for i in moving[1:]), moving
    rng = np.random.default_rng(3)
    jitter = [np.roll(scene, tuple(rng.integers(-8, 9, 2)), axis=(0, 1)) for _ in range(25)]
    moving = _moving(lambda i: jitter[i - 5] if 5 <= i < 30 else scene, 35)  # 5 s of a shaking camera
    assert len(moving[1:]) <= 7, moving  # about once a second, not 25 times


def test_a_person_walking_across_the_scene_is_motion_on_every_frame():
    scene, cut = background("coffee"), person(200)
    walk = walk_then_stop(scene, cut, 40, 40, 0, scene.shape[1] - cut.shape[1], 150)
    assert _moving(walk, 40) == list(range(40))


def test_a_small_person_far_away_is_motion_and_a_few_pixels_are_not():
    scene, cut = background("coffee"), person(60)
    assert _moving(walk_then_stop(scene, cut, 20, 20, 100, 400, 250), 20) == list(range(20))
    speck = np.full((3, 3, 3), 255, np.uint8)  # a 3x3 flicker: under min_area at any position
    assert _moving(lambda i: paste(scene, speck, 300, 200) if i % 2 else scene, 20) == [0]


def test_a_mask_over_the_moving_region_suppresses_it():
    scene, cut = background("coffee"), person(120)
    walk = walk_then_stop(scene, cut, 30, 30, 0, scene.shape[1] - cut.shape[1], 200)  # y 200..320 of 360
    lower = [(0.0, 0.5), (1.0, 0.5), (1.0, 1.0), (0.0, 1.0)]
    assert _moving(walk, 30, MotionConfig(masks=[lower])) == [0]
    upper = [(0.0, 0.0), (1.0, 0.0), (1.0, 0.5), (0.0, 0.5)]
    assert _moving(walk, 30, MotionConfig(masks=[upper])) == list(range(30))  # a mask elsewhere changes nothing


def test_a_session_changes_only_the_motion_keys_it_names():
    from pipelines.protocol import SessionConfig, SessionConfigPatch

    server = SessionConfig.model_validate({"video": {"motion": {"threshold": 40, "refresh_s": 10}}})
    merged = server.merged(SessionConfigPatch.model_validate({"video": {"motion": {"refresh_s": 2}}}))
    assert (merged.video.motion.threshold, merged.video.motion.refresh_s) == (40, 2)
    assert merged.merged(SessionConfigPatch.model_validate({"video": {"target_fps": 3}})).video.motion.refresh_s == 2


def test_a_mask_needs_three_points():
    import pydantic
    import pytest

    with pytest.raises(pydantic.ValidationError, match=r"masks\[0\]: a polygon needs 3 to 100 points"):
        MotionConfig(masks=[[(0.0, 0.0), (1.0, 1.0)]])
