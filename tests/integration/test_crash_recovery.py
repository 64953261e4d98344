"""After a crash (SIGKILL) the next start settles what the last run left half done: clips still ``pending`` are
finished from disk or marked ``failed`` with a reason, and timeline entries memory never indexed are indexed.

The crashed state is built directly, with real parts, rather than by killing a server at a lucky moment: rows
committed by the real ``TimelineStore`` as the recorder commits them (``pending`` until the clip is written), clip
files written by the real muxer (``encode_clip``; a complete ``.part`` is what a kill between the write and its
rename leaves, a truncated one a kill mid-write), and timeline entries committed with no memory listening (what a
kill leaves when they were still queued for memory). The servers are real (the ``vigil`` fixture)."""

from __future__ import annotations

import io
import sqlite3
import time
from fractions import Fraction
from pathlib import Path

import aiohttp
import av
import numpy as np

from pipelines.timeline.media import encode_clip
from pipelines.timeline.store import CRASH_CLIP_ERROR, TimelineEntry, TimelineStore
from server.state import MEMORY, MEMORY_CATCH_UP, TIMELINE


def _store(data_dir: Path) -> TimelineStore:
    store = TimelineStore(data_dir, max_age_s=86_400, quota_bytes=10**9)
    store.open()
    return store


def _event(name: str, pts: float, **fields: object) -> TimelineEntry:
    return TimelineEntry(kind="event", name=name, source="cam-crash", origin="file", wall_ts=time.time(), pts=pts,
                         data={"label": "person", "track_id": 7, **fields}, clip_state="pending")


def _frames(seconds: float, fps: int = 10) -> list[tuple[float, av.VideoFrame]]:
    frames = []
    for index in range(int(seconds * fps)):
        picture = np.full((96, 128, 3), (index * 9) % 255, np.uint8)
        frame = av.VideoFrame.from_ndarray(picture, format="rgb24")
        frame.time_base = Fraction(1, fps)
        frames.append((index / fps, frame))
    return frames


def _commit(store: TimelineStore, *entries: TimelineEntry) -> None:
    for entry in entries:
        assert store.put(entry)
    assert store.flush(30.0)


async def test_clips_left_pending_by_a_crash_are_kept_when_written_else_failed_with_a_reason(vigil, tmp_path: Path):
    data_dir = tmp_path / "timeline"
    store = _store(data_dir)
    written = _event("zone.enter", 10.0, zone="door")  # its clip was muxed, the kill came before the rename
    joined = _event("zone.exit", 11.5, zone="door")  # an event during written's post_s: the same clip
    cut = _event("zone.enter", 40.0, zone="yard")  # killed mid-write: an MP4 with no index does not decode
    buffering = _event("zone.enter", 80.0, zone="gate")  # killed while its post_s was still being recorded
    _commit(store, written, joined, cut, buffering)
    store.close()
    clips = data_dir / "clips"
    encode_clip(clips / f"{written.id}.mp4.part", _frames(4.0))
    encode_clip(clips / "whole.mp4", _frames(4.0))
    whole = (clips / "whole.mp4").read_bytes()
    (clips / f"{cut.id}.mp4.part").write_bytes(whole[: len(whole) // 2])
    (clips / "whole.mp4").unlink()

    server = await vigil(storage={"data_dir": str(data_dir)})  # a real start on the crashed store
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{server.url}/api/events", params={"limit": "50"}) as response:
            assert response.status == 200, await response.text()
            events = {e["id"]: e for e in (await response.json())["events"]}
        assert not [e for e in events.values() if e["clip_state"] == "pending"], events
        for kept in (written, joined):
            info = events[kept.id]
            assert info["clip_state"] == "ready" and info["clip_url"] and info["clip_error"] is None, info
            assert 3.0 <= info["clip_duration_s"] <= 4.5, info
            async with http.get(f"{server.url}{info['clip_url']}") as response:
                assert response.status == 200
                body = await response.read()
            with av.open(io.BytesIO(body)) as container:  # it plays: every frame decodes
                assert sum(1 for _ in container.decode(video=0)) == 40
        for lost in (cut, buffering):
            info = events[lost.id]
            assert info["clip_state"] == "failed" and info["clip_error"] == CRASH_CLIP_ERROR, info
            assert info["clip_url"] is None
    assert sorted(p.name for p in clips.iterdir()) == [f"{written.id}.mp4"]  # the cut part is gone


async def test_timeline_entries_memory_never_indexed_are_indexed_at_start_once(vigil, tmp_path: Path):
    data_dir, memory_dir = tmp_path / "timeline", tmp_path / "memory"
    memory = {"enabled": True, "data_dir": str(memory_dir)}
    # Memory saw the first event (the live feed indexed it) ...
    server = await vigil(storage={"data_dir": str(data_dir)}, memory=memory)
    seen = _event("zone.enter", 1.0, zone="loading dock")
    seen.clip_state = "none"
    _commit(server.app[TIMELINE], seen)
    await server.app[MEMORY].flush()
    await server.stop()
    # ... then the timeline committed two more that the kill took from memory's queue (memory was not listening).
    store = _store(data_dir)
    missed = [_event("zone.exit", 30.0, zone="loading dock", dwell_s=29.0),
              _event("zone.enter", 35.0, zone="bicycle shed")]
    for entry in missed:
        entry.clip_state = "none"
    _commit(store, *missed)
    store.close()

    for start in range(2):  # the second start finds nothing more to do: no entry twice
        server = await vigil(storage={"data_dir": str(data_dir)}, memory=memory)
        await server.app[MEMORY_CATCH_UP]
        await server.app[MEMORY].flush()
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{server.url}/api/search", params={"q": "bicycle shed", "limit": "5"}) as response:
                assert response.status == 200, await response.text()
                results = (await response.json())["results"]
        assert results and results[0]["event_id"] == missed[1].id, results
        await server.stop()
        with sqlite3.connect(memory_dir / "entries.sqlite3") as db:
            held = sorted(row[0] for row in db.execute("SELECT event_id FROM entries"))
            mark = db.execute("SELECT value FROM progress WHERE name = 'timeline_seq'").fetchone()[0]
        assert held == sorted(e.id for e in (seen, *missed)), (start, held)
        assert mark == 3  # the timeline's last seq: the next start reads nothing again
