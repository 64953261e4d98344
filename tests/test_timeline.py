"""The persisted timeline: stored events with clips and snapshots, served over REST, surviving a restart."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import aiohttp
import av
import numpy as np
import pytest
from PIL import Image

from server.config import load_settings
from server.engines import build_batcher
from tests.support.media import sliding_person
from tests.test_sources import Watcher

PRE_S, POST_S = 1.5, 1.5
RIGHT_HALF = {"name": "door", "polygon": [[0.5, 0.0], [1.0, 0.0], [1.0, 1.0], [0.5, 1.0]]}


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("timeline-media")
    # A keyframe every 0.5 s: the clip starts at the keyframe at or before pre_s, so it is close to pre_s.
    sliding_person(root / "slide.mp4", seconds=6.0, fps=10, options={"preset": "ultrafast", "g": "5"})
    return root


@pytest.fixture(scope="module")
def person_detector():
    """The real detector the server uses, to check what the snapshot and the clip show."""
    batcher = build_batcher(load_settings(None, {"models": {"detector": {"backend": "yolo"}}}))
    return batcher.detector


def _people(detector: Any, rgb: np.ndarray) -> int:
    return sum(1 for d in detector.detect([np.ascontiguousarray(rgb[..., ::-1])])[0] if d.label == "person")


def _storage(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    return {"data_dir": str(tmp_path / "events"), "pre_s": PRE_S, "post_s": POST_S, **extra}


async def _start_slide(http: aiohttp.ClientSession, url: str) -> dict:
    body = {"path": "slide.mp4", "name": "hall", "realtime": False, "options": {"video": {"zones": [RIGHT_HALF]}}}
    async with http.post(f"{url}/api/sources", json=body) as response:
        assert response.status == 201, await response.text()
        return await response.json()


async def _get(http: aiohttp.ClientSession, url: str, **kwargs: Any) -> tuple[int, bytes, Any]:
    async with http.get(url, **kwargs) as response:
        return response.status, await response.read(), response.headers


async def test_a_person_entering_a_zone_is_stored_with_a_clip_and_snapshot_that_show_them(
        vigil, media: Path, tmp_path: Path, person_detector):
    server = await vigil(sources={"media_root": str(media)}, video={"target_fps": 5},
                         models={"detector": {"backend": "yolo"}}, storage=_storage(tmp_path))
    async with aiohttp.ClientSession() as http:
        source = await _start_slide(http, server.url)
        async with http.ws_connect(f"{server.url}/api/sources/{source['id']}/results") as ws:
            watcher = Watcher(ws)
            clip_message = await watcher.next(lambda m: m["type"] == "clip", timeout=60)
            await watcher.state("ended", timeout=60)
        enters = [m for m in watcher.seen if m["type"] == "event" and m["name"] == "zone.enter"]
        assert len(enters) == 1, enters
        enter = enters[0]
        assert enter["id"] and clip_message["event_ids"] == [enter["id"]]

        status, body, _ = await _get(http, f"{server.url}/api/events?source={source['id']}")
        listed = json.loads(body)["events"]
        assert status == 200 and [e["id"] for e in listed] == [enter["id"]]
        event = listed[0]
        assert event["name"] == "zone.enter" and event["data"]["zone"] == "door" and event["source_name"] == "hall"
        assert event["clip_state"] == "ready" and event["clip_url"] and event["snapshot_url"]

        status, snapshot, headers = await _get(http, server.url + event["snapshot_url"])
        assert status == 200 and headers["Content-Type"] == "image/jpeg"
        assert _people(person_detector, np.asarray(Image.open(io.BytesIO(snapshot)).convert("RGB"))) >= 1

        status, clip, headers = await _get(http, server.url + event["clip_url"])
        assert status == 200 and headers["Content-Type"] == "video/mp4"
    path = tmp_path / "clip.mp4"
    path.write_bytes(clip)
    with av.open(str(path)) as container, av.open(str(media / "slide.mp4")) as original:
        stream = container.streams.video[0]
        # Remuxed, not re-encoded: the camera's own codec parameters.
        assert stream.codec_context.name == "h264"
        assert stream.codec_context.extradata == original.streams.video[0].codec_context.extradata
        frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(stream)]
    duration = len(frames) / 10
    assert PRE_S + POST_S - 0.6 <= duration <= PRE_S + POST_S + 0.6, duration
    assert event["clip_start_pts"] < enter["pts"] - 1.0  # starts about pre_s before the entry
    assert _people(person_detector, frames[-1]) >= 1


async def test_events_and_clips_survive_a_restart_and_are_served_with_ranges(vigil, media: Path, tmp_path: Path):
    storage = _storage(tmp_path)
    server = await vigil(sources={"media_root": str(media)}, video={"target_fps": 5},
                         models={"detector": {"backend": "yolo"}}, storage=storage)
    async with aiohttp.ClientSession() as http:
        source = await _start_slide(http, server.url)
        async with http.ws_connect(f"{server.url}/api/sources/{source['id']}/results") as ws:
            clip_message = await Watcher(ws).next(lambda m: m["type"] == "clip", timeout=60)
        event_id = clip_message["event_ids"][0]
        _, before, _ = await _get(http, f"{server.url}/api/events/{event_id}/clip.mp4")
    await server.stop()

    again = await vigil(sources={"media_root": str(media)}, storage=storage)
    async with aiohttp.ClientSession() as http:
        status, body, _ = await _get(http, f"{again.url}/api/events")
        assert status == 200 and [e["id"] for e in json.loads(body)["events"]] == [event_id]
        status, clip, _ = await _get(http, f"{again.url}/api/events/{event_id}/clip.mp4")
        assert status == 200 and clip == before and len(clip) > 1000

        status, part, headers = await _get(http, f"{again.url}/api/events/{event_id}/clip.mp4",
                                           headers={"Range": "bytes=100-599"})
        assert status == 206 and part == clip[100:600]
        assert headers["Content-Range"] == f"bytes 100-599/{len(clip)}"
        status, tail, _ = await _get(http, f"{again.url}/api/events/{event_id}/clip.mp4",
                                     headers={"Range": "bytes=-10"})
        assert status == 206 and tail == clip[-10:]

        for bad in ("0123456789abcdef", "nothex", "..%2F..%2Ftimeline.db", "%2E%2E", "../../etc/passwd"):
            for suffix in ("", "/clip.mp4", "/snapshot.jpg"):
                status, body, _ = await _get(http, f"{again.url}/api/events/{bad}{suffix}")
                assert status == 404, (bad, suffix, body)
        async with http.delete(f"{again.url}/api/events/0123456789abcdef") as response:
            assert response.status == 404

        async with http.delete(f"{again.url}/api/events/{event_id}") as response:
            assert response.status == 204
        status, _, _ = await _get(http, f"{again.url}/api/events/{event_id}/clip.mp4")
        assert status == 404
        assert not list((tmp_path / "events" / "clips").glob("*.mp4"))
        status, body, _ = await _get(http, f"{again.url}/openapi.json")
        paths = json.loads(body)["paths"]
        assert {"/api/events", "/api/events/{event_id}", "/api/events/{event_id}/clip.mp4"} <= set(paths)


async def test_the_event_api_needs_the_token(vigil, tmp_path: Path):
    server = await vigil(auth={"token": "s3cret"}, storage=_storage(tmp_path))
    async with aiohttp.ClientSession() as http:
        status, _, _ = await _get(http, f"{server.url}/api/events")
        assert status == 401
        status, body, _ = await _get(http, f"{server.url}/api/events", headers={"Authorization": "Bearer s3cret"})
        assert status == 200 and json.loads(body) == {"events": [], "next_cursor": None}
        status, _, _ = await _get(http, f"{server.url}/api/events?limit=0", headers={"Authorization": "Bearer s3cret"})
        assert status == 400


@pytest.mark.parametrize("failure", ["unusable data dir", "tiny quota"])
async def test_storage_failure_degrades_to_live_events_with_one_error(vigil, media: Path, tmp_path: Path,
                                                                    failure: str):
    if failure == "unusable data dir":
        blocker = tmp_path / "not-a-dir"
        blocker.write_text("a file where the data dir should be")
        storage = _storage(tmp_path, data_dir=str(blocker / "events"))
    else:
        storage = _storage(tmp_path, quota_bytes=2000)
    server = await vigil(sources={"media_root": str(media)}, video={"target_fps": 5},
                         models={"detector": {"backend": "yolo"}}, storage=storage)
    async with aiohttp.ClientSession() as http:
        source = await _start_slide(http, server.url)
        async with http.ws_connect(f"{server.url}/api/sources/{source['id']}/results") as ws:
            watcher = Watcher(ws)
            await watcher.state("ended", timeout=60)
            await asyncio.sleep(1.0)  # any late clip error would arrive now
            with pytest.raises(TimeoutError):
                await watcher.next(lambda m: m["type"] == "error", timeout=1.0)
        errors = [m for m in watcher.seen if m["type"] == "error"]
        assert [e["code"] for e in errors] == ["storage_unavailable"], errors
        assert [m["name"] for m in watcher.seen if m["type"] == "event" and m["name"] == "zone.enter"] == ["zone.enter"]
        assert not any(m["type"] == "clip" for m in watcher.seen)
        status, body, _ = await _get(http, f"{server.url}/api/sources/{source['id']}")
        assert status == 200 and json.loads(body)["state"] == "ended"
        if failure == "tiny quota":  # the event itself is still stored, without a clip
            status, body, _ = await _get(http, f"{server.url}/api/events")
            events = json.loads(body)["events"]
            assert [e["name"] for e in events] == ["zone.enter"] and events[0]["clip_state"] == "failed"
            assert not list((tmp_path / "events" / "clips").iterdir())
