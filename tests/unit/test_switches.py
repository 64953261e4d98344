"""The kept switches (server.mqtt.switches): written atomically, read back, and an unreadable file never fatal."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from server.mqtt.switches import SOURCES_MAX, SwitchStore


def test_switches_are_read_back_by_a_new_store(tmp_path: Path):
    store = SwitchStore(tmp_path / "data")  # the folder need not exist yet
    assert store.alerts is None and store.detect("yard") is None
    store.set_detect("yard", False)
    store.set_detect("back/door", True)  # spelled as topics spell it
    store.set_alerts(False)
    again = SwitchStore(tmp_path / "data")
    assert again.alerts is False and again.detect("yard") is False and again.detect("back_door") is True
    assert [p.name for p in (tmp_path / "data").iterdir()] == ["switches.json"]  # no temporary file left


def test_only_the_latest_sources_are_kept(tmp_path: Path):
    store = SwitchStore(tmp_path)
    for n in range(SOURCES_MAX + 5):
        store.set_detect(f"cam{n}", False)
    again = SwitchStore(tmp_path).detected_sources()
    assert len(again) == SOURCES_MAX and "cam0" not in again and f"cam{SOURCES_MAX + 4}" in again


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"alerts": "no", "detect": {"yard": "off"}}'])
def test_an_unreadable_file_starts_everything_on(tmp_path: Path, text: str, caplog: pytest.LogCaptureFixture):
    (tmp_path / "switches.json").write_text(text)
    caplog.set_level(logging.WARNING)
    store = SwitchStore(tmp_path)
    assert store.alerts is None and store.detected_sources() == {}
    store.set_alerts(True)  # and it is written anew
    assert json.loads((tmp_path / "switches.json").read_text()) == {"detect": {}, "alerts": True}


def test_an_unwritable_dir_is_logged_not_raised(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    (tmp_path / "file").write_text("")
    store = SwitchStore(tmp_path / "file")  # a file where the folder should be
    store.set_alerts(False)
    assert store.alerts is False and "cannot write" in caplog.text
