"""tests/conftest.py's guard: a whole run must leave the checkout's ``data/`` (but ``data/models``) as it was."""

from __future__ import annotations

from pathlib import Path

from tests.support.data_guard import changes, snapshot


def test_the_guard_sees_every_write_under_data_but_models(tmp_path: Path):
    data = tmp_path / "data"
    (data / "models").mkdir(parents=True)
    (data / "timeline").mkdir()
    (data / "timeline" / "timeline.db").write_bytes(b"x")
    before = snapshot(data)
    (data / "models" / "llm.gguf").write_bytes(b"weights")  # set-up's: not user data
    assert changes(before, snapshot(data)) == []
    (data / "timeline" / "clips").mkdir()
    (data / "timeline" / "clips" / "a.mp4").write_bytes(b"clip")
    (data / "timeline" / "timeline.db").write_bytes(b"xy")
    (data / "memory").mkdir()
    assert changes(before, snapshot(data)) == ["+ memory", "+ timeline/clips", "+ timeline/clips/a.mp4",
                                               "~ timeline/timeline.db"]


def test_a_missing_data_dir_is_an_empty_snapshot(tmp_path: Path):
    assert snapshot(tmp_path / "data") == {}
    (tmp_path / "data" / "timeline").mkdir(parents=True)
    assert changes({}, snapshot(tmp_path / "data")) == ["+ timeline"]
