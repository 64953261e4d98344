"""The memory's feed from the timeline: a real ``TimelineStore`` (SQLite in a temp dir) commits entries on its
writer thread and its listener, ``TimelineFeed``, hands their memory entries to ``add`` on the event loop."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

from pipelines.memory.entries import MemoryEntry
from pipelines.memory.feed import TimelineFeed, memory_entry
from pipelines.timeline.store import TimelineEntry, TimelineStore


def _entry(kind: str, name: str, **fields: object) -> TimelineEntry:
    return TimelineEntry(kind=kind, name=name, source="cam1", origin="file", wall_ts=time.time(), pts=2.5,
                         **fields)  # type: ignore[arg-type]


def test_an_event_maps_to_a_searchable_sentence_linked_to_its_entry_and_clip():
    event = _entry("event", "zone.enter", clip_state="pending",
                   data={"zone": "loading dock", "label": "person", "track_id": 7})
    mapped = memory_entry(event)
    assert mapped.text == "person (track 7) entered zone 'loading dock'"
    assert (mapped.kind, mapped.source, mapped.session, mapped.media_time) == ("event", "cam1", "cam1", 2.5)
    assert mapped.event_id == event.id == mapped.clip_id and mapped.wall_time == event.wall_ts
    assert mapped.labels == ["person"] and mapped.track_ids == [7] and mapped.meta["zone"] == "loading dock"
    no_clip = memory_entry(_entry("event", "line.cross", data={"line": "gate", "direction": "in", "label": "car"}))
    assert no_clip.text == "car crossed line 'gate' going in" and no_clip.clip_id is None


async def test_committed_entries_reach_add_on_the_loop_filtered_and_scenes_only_when_changed(tmp_path: Path):
    store = TimelineStore(tmp_path, max_age_s=3600, quota_bytes=10**9)
    store.open()
    added: list[tuple[MemoryEntry, bool]] = []
    loop_thread = threading.get_ident()
    done = asyncio.Event()

    def add(entries: list[MemoryEntry]) -> int:  # stands in for MemoryIndex.add: records the thread it runs on
        added.extend((e, threading.get_ident() == loop_thread) for e in entries)
        if any(e.kind == "alert" for e in entries):
            done.set()
        return len(entries)

    store.add_listener(TimelineFeed(add, asyncio.get_running_loop(), event_names=["zone.*", "object.*"]))
    two_people = {"counts": {"person": 2}, "tracks": [{"id": 3, "label": "person"}, {"id": 4, "label": "person"}]}
    for entry in [
        _entry("scene", "scene", data=two_people),
        _entry("scene", "scene", data=two_people),  # unchanged: not indexed again
        _entry("event", "object.appeared", data={"label": "dog", "track_id": 9, "conf": 0.8}),
        _entry("event", "source.state", data={"state": "ended"}),  # not in event_names
        _entry("scene", "scene", data={"counts": {}, "tracks": []}),
        _entry("transcript", "transcript", text="The van is blue.", data={"turn": 1}),
        _entry("alert", "alert", text="Someone entered the kitchen", data={"zone": "kitchen", "spoken": True}),
    ]:
        assert store.put(entry)
    try:
        await asyncio.wait_for(done.wait(), 30)
    finally:
        await asyncio.to_thread(store.close)
    assert all(on_loop for _, on_loop in added), "add ran off the event loop's thread"
    assert [(e.kind, e.text) for e, _ in added] == [
        ("scene", "The camera currently sees 2 persons. Tracks: person 3, person 4."),
        ("event", "dog (track 9) appeared"),
        ("scene", "The camera currently sees nothing."),
        ("transcript", "The van is blue."),
        ("alert", "Someone entered the kitchen"),
    ]
    scene, alert = added[0][0], added[-1][0]
    assert scene.labels == ["person"] and scene.track_ids == [3, 4]
    assert alert.meta["zone"] == "kitchen" and alert.meta["spoken"] is True
