"""Plates on with a detector that cannot give them vehicles are named at start-up: the app's
real detector is loaded and its own class names (less its ``classes`` filter) are compared with
``video.plates.labels``; a warning names the key."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from server.config import load_settings
from server.engines import Engines

ENGINES_LOG = "server.engines"


async def _start_up_warnings(model_pool: Any, caplog: pytest.LogCaptureFixture, **overrides: Any) -> list[str]:
    settings = load_settings(None, {"voice": {"enabled": False}, **overrides})
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=ENGINES_LOG):
        engines = Engines(settings, models=model_pool)
        analyzers = engines.analyzers  # what the app builds at start-up: the detector, then the plate reader
    await analyzers.close()
    await engines.close()
    return [r.getMessage() for r in caplog.records if r.name == ENGINES_LOG and r.levelno >= logging.WARNING]


async def test_plates_with_the_default_pose_detector_warn_that_it_has_no_vehicles(model_pool, caplog):
    warnings = await _start_up_warnings(model_pool, caplog, video={"plates": {"enabled": True}})
    (warning,) = [w for w in warnings if "video.plates" in w]
    assert "video.plates.enabled" in warning and "no vehicle" in warning and "person" in warning, warning


async def test_a_plate_label_the_detector_does_not_have_is_named(model_pool, caplog):
    warnings = await _start_up_warnings(model_pool, caplog, models={"detector": {"backend": "opencv-ssd"}},
                                        video={"plates": {"enabled": True, "labels": ["car", "lorry"]}})
    (warning,) = [w for w in warnings if "video.plates" in w]
    assert "video.plates.labels" in warning and "'lorry'" in warning and "'car'" not in warning, warning


async def test_a_detector_filtered_to_people_has_no_vehicles_for_plates(model_pool, caplog):
    warnings = await _start_up_warnings(model_pool, caplog,
                                        models={"detector": {"backend": "opencv-ssd", "classes": [1]}},  # person
                                        video={"plates": {"enabled": True}})
    (warning,) = [w for w in warnings if "video.plates" in w]
    assert "video.plates.enabled" in warning and "models.detector.classes" in warning, warning


async def test_plates_with_no_detector_at_all_are_named(model_pool, caplog):
    warnings = await _start_up_warnings(model_pool, caplog, models={"detector": {"backend": "none"}},
                                        video={"plates": {"enabled": True}})
    assert [w for w in warnings if "video.plates.enabled" in w and "'none'" in w], warnings


async def test_plates_a_detector_can_give_start_without_a_word(model_pool, caplog):
    warnings = await _start_up_warnings(model_pool, caplog, models={"detector": {"backend": "opencv-ssd"}},
                                        video={"plates": {"enabled": True}})
    assert not [w for w in warnings if "video.plates" in w], warnings
