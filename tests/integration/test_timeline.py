"""The persisted timeline: stored events with clips and snapshots, served over REST, surviving a restart."""

from __future__ import annotations

import asyncio
import io
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import av
import numpy as np
import pytest
from PIL import Image

from server.config import load_settings
from server.engines import build_batcher
from tests.integration.test_sources import Watcher
from tests.support.media import keyframed_sliding_person
from tests.support.zone_entry import RIGHT_HALF, ZoneEntryAnalyzerForTest

PRE_S, POST_S = 1.5, 1.5


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("timeline-media")
    keyframed_sliding_person(root / "slide.mp4")
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
        one = "/api/events/{event_id}"
        documented = {(path, method) for path, methods in paths.items() if path.startswith("/api/events")
                      for method in methods}
        assert documented == {("/api/events", "get"), (one, "get"), (one, "delete"), (one + "/clip.mp4", "get"),
                              (one + "/snapshot.jpg", "get"), (one + "/not-this-person", "post")}  # docs/faces.md
        assert set(paths[one]["delete"]["responses"]) == {"204", "401", "404", "503"}
        for media in ("/clip.mp4", "/snapshot.jpg"):  # a range past the end: 416 with the JSON error body
            schema = paths[one + media]["get"]["responses"]["416"]["content"]["application/json"]["schema"]
            assert schema == {"$ref": "#/components/schemas/ErrorBody"}


async def test_the_event_api_needs_the_token(vigil, tmp_path: Path):
    server = await vigil(auth={"token": "s3cret"}, storage=_storage(tmp_path))
    async with aiohttp.ClientSession() as http:
        status, _, _ = await _get(http, f"{server.url}/api/events")
        assert status == 401
        status, body, _ = await _get(http, f"{server.url}/api/events", headers={"Authorization": "Bearer s3cret"})
        assert status == 200 and json.loads(body) == {"events": [], "next_cursor": None}
        for bad in ("limit=0", "limit=x", "since=yesterday", "kind=bogus", "cursor=1.5",
                    # beyond SQLite's 64-bit integers, non-finite times, an empty window: 400s naming the parameter
                    "cursor=9223372036854775808", "cursor=-9223372036854775809", "limit=99999999999999999999",
                    "since=nan", "since=inf", "until=-inf", "until=1e400", "since=2000&until=1000"):
            status, body, _ = await _get(http, f"{server.url}/api/events?{bad}",
                                         headers={"Authorization": "Bearer s3cret"})
            assert status == 400 and json.loads(body)["error"]["code"] == "invalid_parameter", (bad, body)
            assert bad.split("=")[0] in json.loads(body)["error"]["message"], body


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


class EntriesIntoTwoZonesOnOneFrameAnalyzerForTest(ZoneEntryAnalyzerForTest):
    """No detector runs: at 1 s of media time one frame reports entries into two zones (door, window), so both
    events share that frame's snapshot and one clip; the storage under test (recorder, store, API) is real."""

    name = "entries-into-two-zones-for-test"

    def due(self, sampled: Any) -> bool:
        return sampled.pts >= 1.0

    async def analyze(self, sampled: Any) -> Any:
        result = await super().analyze(sampled)
        result.events += [(name, {**data, "zone": "window"}) for name, data in result.events]
        return result


async def test_events_on_one_frame_share_a_snapshot_and_clip_until_the_last_is_deleted(
        vigil, media: Path, tmp_path: Path):
    from server.engines import Analyzers

    server = await vigil(Analyzers(video=EntriesIntoTwoZonesOnOneFrameAnalyzerForTest),
                         sources={"media_root": str(media)}, storage=_storage(tmp_path))
    data_dir = tmp_path / "events"
    async with aiohttp.ClientSession() as http:
        source = await _start_slide(http, server.url)
        async with http.ws_connect(f"{server.url}/api/sources/{source['id']}/results") as ws:
            watcher = Watcher(ws)
            clip_message = await watcher.next(lambda m: m["type"] == "clip", timeout=60)
        door, window = [m for m in watcher.seen if m["type"] == "event" and m["name"] == "zone.enter"]
        assert (door["data"]["zone"], window["data"]["zone"]) == ("door", "window")
        assert clip_message["event_ids"] == [door["id"], window["id"]]
        events = f"{server.url}/api/events"

        # ?session= is ?source='s alias
        status, body, _ = await _get(http, f"{events}?session={source['id']}")
        assert status == 200 and [e["id"] for e in json.loads(body)["events"]] == [window["id"], door["id"]]
        status, body, _ = await _get(http, f"{events}?session=not-this-one")
        assert status == 200 and json.loads(body)["events"] == []

        status, snapshot, _ = await _get(http, f"{events}/{door['id']}/snapshot.jpg")
        assert status == 200 and snapshot[:2] == b"\xff\xd8"
        assert (await _get(http, f"{events}/{window['id']}/snapshot.jpg"))[:2] == (200, snapshot)
        status, clip, _ = await _get(http, f"{events}/{door['id']}/clip.mp4")
        assert status == 200 and len(clip) > 1000

        for media_file, size in (("clip.mp4", len(clip)), ("snapshot.jpg", len(snapshot))):
            for past_the_end in (f"bytes={size}-", "bytes=999999999-", "bytes=999999999-999999999",
                                 "bytes=-0"):  # an empty suffix: unsatisfiable (RFC 9110 14.1.3), not the whole file
                status, body, headers = await _get(http, f"{events}/{door['id']}/{media_file}",
                                                   headers={"Range": past_the_end})
                assert status == 416 and headers["Content-Range"] == f"bytes */{size}", (media_file, past_the_end)
                assert headers["Content-Type"].startswith("application/json")
                assert json.loads(body)["error"]["code"] == "range_not_satisfiable"
        status, part, _ = await _get(http, f"{events}/{door['id']}/clip.mp4",
                                     headers={"Range": f"bytes={len(clip) - 1}-"})
        assert status == 206 and part == clip[-1:]  # the last byte is still within
        # If-Range (RFC 9110 13.1.5): the range only while the file is the one the client names, else all of it, 200
        status, _, served = await _get(http, f"{events}/{door['id']}/clip.mp4")
        for validator, expected in ((served["ETag"], 206), (served["Last-Modified"], 206), ('"not-this-one"', 200),
                                    (f"W/{served['ETag']}", 200), ("Mon, 01 Jan 2001 00:00:00 GMT", 200),
                                    ("garbage", 200)):
            status, body, headers = await _get(http, f"{events}/{door['id']}/clip.mp4",
                                               headers={"Range": "bytes=0-99", "If-Range": validator})
            assert (status, body) == (expected, clip[:100] if expected == 206 else clip), (validator, status)

        async with http.delete(f"{events}/{door['id']}") as response:
            assert response.status == 204
        status, body, _ = await _get(http, f"{events}/{window['id']}")
        assert status == 200 and json.loads(body)["has_snapshot"] and json.loads(body)["has_clip"]
        assert (await _get(http, f"{events}/{window['id']}/snapshot.jpg"))[:2] == (200, snapshot)
        assert (await _get(http, f"{events}/{window['id']}/clip.mp4"))[:2] == (200, clip)

        async with http.delete(f"{events}/{window['id']}") as response:
            assert response.status == 204
    assert list((data_dir / "clips").iterdir()) == [] and list((data_dir / "snapshots").iterdir()) == []


class ZoneEntryAtFourSecondsAnalyzerForTest(ZoneEntryAnalyzerForTest):
    """The RTSP camera shows a test pattern (no person), so this analyser reports one zone entry at 4 s of media
    time (the ring buffer is full by then); the clip path under test (ring buffer, remux) is real."""

    name = "zone-entry-at-4s-for-test"

    def due(self, sampled: Any) -> bool:
        return sampled.pts >= 4.0


def _parameter_sets(extradata: bytes) -> list[bytes]:
    """H.264 SPS and PPS from either extradata layout: Annex B (RTSP) or avcC (MP4 stores it so)."""
    if extradata.startswith((b"\0\0\0\1", b"\0\0\1")):
        # a NAL unit never ends in a zero byte (its stop bit): zeros around a start code belong to the start code
        return [unit.strip(b"\0") for unit in extradata.split(b"\0\0\1") if unit.strip(b"\0")]
    units, at = [], 6
    for count_mask in (0x1F, 0xFF):  # the SPS count shares its byte with reserved bits
        count = extradata[at - 1] & count_mask
        for _ in range(count):
            size = int.from_bytes(extradata[at: at + 2], "big")
            units.append(extradata[at + 2: at + 2 + size])
            at += 2 + size
        at += 1
    return units


async def test_an_rtsp_clip_is_remuxed_with_the_cameras_codec_parameters(vigil, tmp_path: Path, monkeypatch):
    from pipelines.timeline import recorder
    from server.engines import Analyzers
    from tests.support.ports import free_port
    from tests.support.rtsp import RtspCamera

    calls = {"remux": 0, "encode": 0}

    def counted(name: str, fn: Any) -> Any:
        def wrapper(*args: Any) -> Any:
            calls[name] += 1
            return fn(*args)
        return wrapper

    monkeypatch.setattr(recorder, "remux_clip", counted("remux", recorder.remux_clip))
    monkeypatch.setattr(recorder, "encode_clip", counted("encode", recorder.encode_clip))
    server = await vigil(Analyzers(video=ZoneEntryAtFourSecondsAnalyzerForTest), storage=_storage(tmp_path))
    camera = RtspCamera(free_port(), width=320, height=240, fps=15)
    await asyncio.to_thread(camera.start)
    try:
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{server.url}/api/sources", json={"url": camera.url}) as response:
                source = await response.json()
            async with http.ws_connect(f"{server.url}/api/sources/{source['id']}/results") as ws:
                clip_message = await Watcher(ws).next(lambda m: m["type"] == "clip", timeout=60)
            status, clip, _ = await _get(http, server.url + clip_message["url"])
            assert status == 200
        with av.open(camera.url, options={"rtsp_transport": "tcp"}, timeout=10) as direct:
            camera_codec = direct.streams.video[0].codec_context
            camera_params = (camera_codec.name, camera_codec.width, camera_codec.height, camera_codec.profile,
                             _parameter_sets(camera_codec.extradata))
    finally:
        await asyncio.to_thread(camera.stop)
    path = tmp_path / "rtsp.mp4"
    path.write_bytes(clip)
    with av.open(str(path)) as container:
        codec = container.streams.video[0].codec_context
        assert (codec.name, codec.width, codec.height, codec.profile, _parameter_sets(codec.extradata)) == camera_params
        frames = list(container.decode(video=0))
    assert calls == {"remux": 1, "encode": 0}
    # every camera frame (15 fps), from a keyframe (1 s GOP) at or before pre_s until post_s after the entry
    assert PRE_S + POST_S - 0.3 <= len(frames) / 15 <= PRE_S + 1.0 + POST_S + 0.3, len(frames)


async def test_a_webrtc_session_clip_is_encoded_from_its_frames(vigil, media: Path, tmp_path: Path, person_detector):
    from aiortc.contrib.media import MediaPlayer

    from server.cli.client import VigilClient

    server = await vigil(models={"detector": {"backend": "yolo"}}, video={"target_fps": 5},
                         storage=_storage(tmp_path, clip_fps=10))
    player = MediaPlayer(str(media / "slide.mp4"))
    client = VigilClient(server.url, options={"video": {"zones": [RIGHT_HALF]}})
    session_id = await client.connect([player.video])
    try:
        enter = await client.next_message("event", where=lambda m: m["name"] == "zone.enter", timeout=60)
        clip_message = await client.next_message("clip", timeout=60)
        assert clip_message["event_ids"] == [enter["id"]]
        async with aiohttp.ClientSession() as http:
            status, clip, _ = await _get(http, server.url + clip_message["url"])
            status_event, body, _ = await _get(http, f"{server.url}/api/events/{enter['id']}")
        assert status == 200 and status_event == 200
        assert json.loads(body)["source"] == session_id and json.loads(body)["origin"] == "webrtc"
    finally:
        await client.close()
        player.video.stop()
    path = tmp_path / "webrtc.mp4"
    path.write_bytes(clip)
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        assert stream.codec_context.name in ("h264", "mpeg4")
        frames = [frame for frame in container.decode(stream)]
        duration = float(frames[-1].pts * frames[-1].time_base - frames[0].pts * frames[0].time_base)
        last = frames[-1].to_ndarray(format="rgb24")
    assert PRE_S + POST_S - 0.8 <= duration <= PRE_S + POST_S + 0.5, duration
    assert _people(person_detector, last) >= 1


def test_retention_by_quota_removes_the_oldest_clip_first(tmp_path: Path):
    from pipelines.timeline.store import TimelineEntry, TimelineStore

    store = TimelineStore(tmp_path / "data", max_age_s=3600, quota_bytes=10**9)
    store.open()
    try:
        ids = []
        for index in range(3):
            entry = TimelineEntry(kind="event", name="zone.enter", source="cam", origin="rtsp",
                                  wall_ts=time.time() + index / 1000, clip_state="ready")
            relative = f"clips/{entry.id}.mp4"
            (store.root / relative).write_bytes(b"\0" * 4000)
            entry.clip = relative
            store.put(entry)
            ids.append(entry.id)
        assert store.flush()
        store.quota_bytes = 9000  # room for two clips of the three
        store.request_retention()
        assert store.flush()
        clips = {entry_id: store.get(entry_id).clip_state for entry_id in ids}  # type: ignore[union-attr]
        assert clips == {ids[0]: "deleted", ids[1]: "ready", ids[2]: "ready"}
        assert sorted(p.name for p in (store.root / "clips").iterdir()) == sorted(f"{i}.mp4" for i in ids[1:])
        store.max_age_s = 0.01  # by age
        time.sleep(0.1)
        store.request_retention()
        assert store.flush()
        assert store.query(kinds=("event",)) == [] and not list((store.root / "clips").iterdir())
    finally:
        store.close()


async def test_analyze_writes_events_and_clips_a_server_then_serves(vigil, media: Path, tmp_path: Path):
    import subprocess
    import sys

    import yaml

    config = tmp_path / "vigil.yaml"
    config.write_text(yaml.safe_dump({"video": {"target_fps": 5, "zones": [RIGHT_HALF]},
                                      "models": {"detector": {"backend": "yolo"}}, "voice": {"enabled": False},
                                      "storage": {"pre_s": PRE_S, "post_s": POST_S}}))
    events_dir, out = tmp_path / "analyzed", tmp_path / "out.jsonl"
    result = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "server.cli", "analyze", str(media / "slide.mp4"), "--config",
                         str(config), "-q", "-o", str(out), "--events-dir", str(events_dir)],
        capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    messages = [json.loads(line) for line in out.read_text().splitlines()]
    (enter,) = [m for m in messages if m["type"] == "event" and m["name"] == "zone.enter"]
    (clip,) = [m for m in messages if m["type"] == "clip"]
    assert clip["event_ids"] == [enter["id"]]

    server = await vigil(storage={"data_dir": str(events_dir)})
    async with aiohttp.ClientSession() as http:
        status, body, _ = await _get(http, f"{server.url}/api/events")
        (event,) = json.loads(body)["events"]
        assert status == 200 and event["id"] == enter["id"] and event["origin"] == "file"
        status, data, _ = await _get(http, server.url + event["clip_url"])
    assert status == 200
    path = tmp_path / "analyzed.mp4"
    path.write_bytes(data)
    with av.open(str(path)) as container:
        assert sum(1 for _ in container.decode(video=0)) / 10 == pytest.approx(PRE_S + POST_S, abs=0.6)


async def test_object_appeared_rules_and_scene_summaries_are_stored(vigil, media: Path, tmp_path: Path):
    server = await vigil(sources={"media_root": str(media)}, video={"target_fps": 5},
                         models={"detector": {"backend": "yolo"}},
                         storage=_storage(tmp_path, clips=False, scene_interval_s=1.0,
                                          appear=[{"label": "person", "min_conf": 0.5}, {"label": "bus"}]))
    async with aiohttp.ClientSession() as http:
        body = {"path": "slide.mp4", "realtime": False}
        async with http.post(f"{server.url}/api/sources", json=body) as response:
            source = await response.json()
        async with http.ws_connect(f"{server.url}/api/sources/{source['id']}/results") as ws:
            watcher = Watcher(ws)
            await watcher.state("ended", timeout=60)
        appeared = [m for m in watcher.seen if m["type"] == "event" and m["name"] == "object.appeared"]
        assert len(appeared) == 1 and appeared[0]["data"]["label"] == "person" and appeared[0]["id"]
        assert appeared[0]["data"]["conf"] >= 0.5

        status, body, _ = await _get(http, f"{server.url}/api/events?kind=scene&source={source['id']}&limit=3")
        page = json.loads(body)
        assert status == 200 and len(page["events"]) == 3 and page["next_cursor"]
        older = json.loads((await _get(http, f"{server.url}/api/events?kind=scene&source={source['id']}"
                                             f"&limit=3&cursor={page['next_cursor']}"))[1])["events"]
        scenes = page["events"] + older
        assert [s["pts"] for s in scenes] == sorted((s["pts"] for s in scenes), reverse=True)  # newest first
        assert len({s["id"] for s in scenes}) == 6  # pages do not overlap
        assert all(s["data"]["counts"] == {"person": 1} for s in scenes[:3])  # the person is in view at the end
        assert scenes[0]["data"]["tracks"] == [{"id": appeared[0]["data"]["track_id"], "label": "person"}]
        by_name = f"{server.url}/api/events?name=object.appeared"
        status, body, _ = await _get(http, by_name)
        assert [e["id"] for e in json.loads(body)["events"]] == [appeared[0]["id"]]
        stored_at = json.loads(body)["events"][0]["wall_ts"]
        for window, found in ((f"since={stored_at - 60}&until={stored_at + 60}", True),
                              (f"since={stored_at + 60}", False), (f"until={stored_at - 60}", False)):
            events = json.loads((await _get(http, f"{by_name}&{window}"))[1])["events"]
            assert bool(events) == found, window


def test_a_write_failure_is_reported_and_the_writer_recovers(tmp_path: Path):
    from pipelines.timeline.store import TimelineEntry, TimelineStore

    store = TimelineStore(tmp_path / "data", max_age_s=3600, quota_bytes=10**9)
    store.open()
    try:
        def entry() -> TimelineEntry:
            return TimelineEntry(kind="event", name="zone.enter", source="cam", origin="rtsp", wall_ts=time.time())

        failures: list[str] = []
        assert store.flush()
        assert store._conn is not None
        store._conn.execute("PRAGMA query_only = 1")  # SQLite refuses writes (SQLITE_READONLY), as a read-only disk
        refused = [entry() for _ in range(5)]
        for item in refused:
            assert store.put(item, on_failure=failures.append)  # accepted without blocking ...
        assert store.flush()
        assert failures and all("write failed" in f and "readonly" in f for f in failures)  # ... and reported
        assert all(store.get(item.id) is None for item in refused)
        store._conn.execute("PRAGMA query_only = 0")  # the disk is back
        later = entry()
        store.put(later, on_failure=failures.append)
        assert store.flush() and store.get(later.id) is not None
    finally:
        store.close()
