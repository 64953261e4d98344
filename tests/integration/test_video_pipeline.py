"""The video pipeline with real models on real photographs (Ultralytics' and scikit-image's sample images)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiortc.contrib.media import MediaPlayer

from server.cli.analyze import analyze_file
from server.cli.client import VigilClient
from server.config import load_settings
from server.engines import Engines
from tests.support.media import slideshow, sliding_person
from tests.support.motion_clips import background, person, scene_clip, walk_then_stop

SEGMENT_S = 1.5
SHOW = [("bus", SEGMENT_S), ("coffee", SEGMENT_S), ("zidane", SEGMENT_S), ("chelsea", SEGMENT_S)]
# Tests that measure the detector on every sampled frame of a still picture turn motion gating off: gated, a still
# segment is analysed at its cut and at refreshes only (tests/integration/test_motion.py covers gating).
EVERY_FRAME = {"enabled": False}


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("video")
    slideshow(root / "show.mp4", SHOW, fps=4)
    slideshow(root / "still.mp4", [("zidane", 3.0)], fps=5)
    slideshow(root / "fast30.mp4", [("astronaut", 4.0)], fps=30, size=(320, 240))
    sliding_person(root / "slide.mp4", seconds=6.0, fps=10)
    return root


async def _analyze(path: Path, **overrides: Any) -> list[dict]:
    settings = load_settings(None, {"voice": {"enabled": False}, **overrides})
    messages: list[dict] = []
    await analyze_file(path, settings, lambda m: messages.append(m.model_dump(exclude_none=True)),
                       Engines(settings))
    return messages


def _segment(pts: float) -> str:
    return SHOW[min(int(pts // SEGMENT_S), len(SHOW) - 1)][0]


def _labels_by_segment(messages: list[dict]) -> dict[str, set[str]]:
    seen: dict[str, set[str]] = {name: set() for name, _ in SHOW}
    for m in messages:
        if m["type"] == "detections" and m["pts"] % SEGMENT_S > 0.3:  # skip frames at a cut
            seen[_segment(m["pts"])] |= {o["label"] for o in m["objects"]}
    return seen


async def test_yolo_pose_finds_people_only_where_there_are_people(media: Path):
    # conf 0.7: the nano pose model gives the cat photo a 0.6 "person"; real people score > 0.8
    messages = await _analyze(media / "show.mp4", video={"target_fps": 2, "motion": EVERY_FRAME},
                              models={"detector": {"backend": "yolo", "conf": 0.7}})
    seen = _labels_by_segment(messages)
    assert seen == {"bus": {"person"}, "coffee": set(), "zidane": {"person"}, "chelsea": set()}
    people = [m for m in messages if m["type"] == "detections" and m["objects"]]
    first = people[0]["objects"][0]
    assert first["class_id"] == 0 and len(first["keypoints"]) == 17
    x1, y1, x2, y2 = first["box"]
    assert 0 <= x1 < x2 <= 1 and 0 <= y1 < y2 <= 1
    assert people[0]["model"] == "yolo11n-pose@640" and people[0]["width"] == 640


async def test_ssd_finds_bus_cup_and_cat_at_the_right_times(media: Path):
    messages = await _analyze(media / "show.mp4", video={"target_fps": 2, "motion": EVERY_FRAME},
                              models={"detector": {"backend": "opencv-ssd", "conf": 0.5}})
    seen = _labels_by_segment(messages)
    assert "bus" in seen["bus"] and "person" in seen["bus"]
    assert "cup" in seen["coffee"] and "person" not in seen["coffee"]
    assert "person" in seen["zidane"]
    assert "cat" in seen["chelsea"] and "person" not in seen["chelsea"]


async def test_replaying_twice_gives_identical_detections(media: Path):
    settings = {"video": {"target_fps": 2, "motion": EVERY_FRAME}, "models": {"detector": {"backend": "yolo"}}}
    first = await _analyze(media / "show.mp4", **settings)
    second = await _analyze(media / "show.mp4", **settings)

    def stable(messages: list[dict]) -> list[dict]:  # inference time is the one measured (wall) quantity
        return [{k: v for k, v in m.items() if k != "inference_ms"} for m in messages]

    assert stable(first) == stable(second)
    assert sum(1 for m in first if m["type"] == "detections") == 12


@pytest.mark.parametrize("target_fps", [5.0, 7.0, 12.0])
async def test_sampling_holds_the_target_rate_on_a_30fps_source(media: Path, target_fps: float):
    messages = await _analyze(media / "fast30.mp4", video={"target_fps": target_fps},
                              models={"detector": {"backend": "none"}})
    video = messages[-1]["media"]["video"]
    assert video["frames_in"] == 120
    rate = video["frames_sampled"] / 4.0
    assert abs(rate - target_fps) <= 0.1 * target_fps, rate


async def test_track_ids_stay_stable_on_a_still_scene(media: Path):
    messages = await _analyze(media / "still.mp4", video={"target_fps": 5, "motion": EVERY_FRAME},
                              models={"detector": {"backend": "yolo"}})
    frames = [m for m in messages if m["type"] == "detections"]
    assert len(frames) == 15
    ids = [sorted(o.get("track_id") for o in m["objects"]) for m in frames[1:]]
    assert all(len(i) == 2 and None not in i for i in ids), ids
    assert all(i == ids[0] for i in ids), ids


async def test_a_person_crossing_a_zone_gives_one_enter_and_one_exit(media: Path):
    zone = {"name": "middle", "polygon": [[0.4, 0.0], [0.6, 0.0], [0.6, 1.0], [0.4, 1.0]]}
    line = {"name": "half", "start": [0.5, 0.0], "end": [0.5, 1.0]}
    messages = await _analyze(media / "slide.mp4", video={"target_fps": 5, "zones": [zone], "lines": [line]},
                              models={"detector": {"backend": "yolo"}})
    events = [m for m in messages if m["type"] == "event" and m["name"] in ("zone.enter", "zone.exit", "line.cross")]
    names = [e["name"] for e in events]
    assert names.count("zone.enter") == 1 and names.count("zone.exit") == 1, events
    assert names.count("line.cross") == 1, events
    enter = next(e for e in events if e["name"] == "zone.enter")
    exit_ = next(e for e in events if e["name"] == "zone.exit")
    assert enter["data"]["zone"] == "middle" and enter["data"]["track_id"] == exit_["data"]["track_id"]
    assert enter["pts"] < exit_["pts"]
    assert exit_["data"]["dwell_s"] == pytest.approx(exit_["pts"] - enter["pts"], abs=0.21)
    # the person's bottom-centre moves at ~0.094 of the frame width per second: ~2 s inside a 0.2-wide zone
    assert 1.4 <= exit_["data"]["dwell_s"] <= 2.8


async def test_overload_drops_frames_keeps_latency_bounded_and_serves_every_stream(vigil, tmp_path: Path):
    slideshow(tmp_path / "busy.mp4", [("zidane", 2.0), ("bus", 2.0)] * 3, fps=15)
    # every frame to the detector: the test needs more work than the CPU can do (gated, still segments cost nothing)
    server = await vigil(sources={"media_root": str(tmp_path)}, video={"target_fps": 10, "motion": EVERY_FRAME},
                         models={"detector": {"backend": "yolo"}})
    streams = 4
    async with aiohttp.ClientSession() as http:
        ids = []
        for _ in range(streams):
            async with http.post(f"{server.url}/api/sources", json={"path": "busy.mp4"}) as response:
                assert response.status == 201
                ids.append((await response.json())["id"])
        pending_peak = 0
        queue_ms: list[float] = []
        sockets = [await http.ws_connect(f"{server.url}/api/sources/{i}/results") for i in ids]
        deadline = asyncio.get_running_loop().time() + 6.0
        while asyncio.get_running_loop().time() < deadline:
            for ws in sockets:
                try:
                    message = await ws.receive_json(timeout=0.05)
                except TimeoutError:
                    continue
                if message["type"] == "detections":
                    queue_ms.append(message["queue_ms"])
            for source in server.sources.sources.values():
                video_analyzer = source.pipeline._video_analyzer
                pending_peak = max(pending_peak, len(video_analyzer.batcher._pending))
        infos = []
        for i in ids:
            async with http.get(f"{server.url}/api/sources/{i}") as response:
                infos.append(await response.json())
        for ws in sockets:
            await ws.close()
    for info in infos:
        video = info["counts"]["video"]
        assert video["frames_analyzed"] > 3, info  # every stream is served
        assert video["frames_dropped"] > 0, info  # more work than the CPU can do: dropped, counted
    assert pending_peak <= streams  # at most one frame per stream waits for the model: no queue grows
    assert queue_ms and max(queue_ms) < 5000, max(queue_ms)  # latest-frame-wins keeps waiting bounded


async def test_webrtc_client_receives_people_detections(vigil, media: Path):
    server = await vigil(models={"detector": {"backend": "yolo"}}, video={"target_fps": 2})
    player = MediaPlayer(str(media / "still.mp4"))
    client = VigilClient(server.url)
    session_id = await client.connect([player.video])
    hello = await client.next_message("hello")
    assert hello["models"]["video"] == "yolo11n-pose@640"
    # A first sighting is not trusted yet (no track): the scene counts people from their confirmed track on.
    detections = await client.next_message("detections", timeout=30,
                                           where=lambda m: any(o.get("confirmed") for o in m["objects"]))
    assert {o["label"] for o in detections["objects"]} == {"person"}
    async with aiohttp.ClientSession() as http, http.get(f"{server.url}/api/sessions/{session_id}/scene") as response:
        scene = await response.json()
    people = scene["counts"].get("person", 0)
    assert people >= 1 and ("1 person" if people == 1 else f"{people} people") in scene["summary"]
    await client.close()
    player.video.stop()


def test_weights_that_are_not_on_disk_fail_at_start_up_with_how_to_supply_them(tmp_path: Path):
    from models.packaged import ModelNotAvailable

    with pytest.raises(ModelNotAvailable, match="never downloads"):
        _ = Engines(load_settings(None, {"voice": {"enabled": False},
                                         "models": {"detector": {"weights": "yolo11x.pt"}}})).analyzers
    with pytest.raises(ModelNotAvailable, match="CUDA is not available"):
        _ = Engines(load_settings(None, {"voice": {"enabled": False},
                                         "models": {"detector": {"device": "cuda:0"}}})).analyzers
    result = subprocess.run(
        [sys.executable, "-m", "server.cli", "serve", "--port", "0"],
        env={**os.environ, "VIGIL_MODELS__DETECTOR__WEIGHTS": str(tmp_path / "missing.pt"),
             **{f"VIGIL_{section.upper()}__DATA_DIR": str(tmp_path / section)  # never the checkout's data/
                for section in ("storage", "memory", "transcription")}},
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2 and "models.detector.weights" in result.stderr


async def _realtime_detection_times(url: str, path: str, options: dict[str, Any]) -> list[float]:
    """The media times of every ``detections`` message of a real-time file source, until it ends."""
    times: list[float] = []
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}/api/sources", json={"path": path, "realtime": True, "options": options}) as r:
            source = await r.json()
            assert r.status == 201, source
        async with http.ws_connect(f"{url}/api/sources/{source['id']}/results") as ws:
            async for message in ws:
                data = message.json()
                if data["type"] == "detections":
                    times.append(data["pts"])
                elif data["type"] == "event" and data["name"] == "source.state" and data["data"]["state"] == "ended":
                    break
    return times


async def test_motion_boost_samples_faster_while_something_moves(vigil, tmp_path: Path):
    """video.motion.boost_fps: a person walking all the time across a real photograph, a 15 fps real-time file, is
    analysed at 10 fps with the boost (the detector has headroom: a small model), at the 5 fps target without it."""
    cut = person(220)
    walk = walk_then_stop(background("coffee"), cut, 60, 60, 0, 640 - cut.shape[1], 360 - 220 - 5)
    scene_clip(tmp_path / "slide15.mp4", 60, 15, walk)
    server = await vigil(sources={"media_root": str(tmp_path)},
                         models={"detector": {"backend": "yolo", "imgsz": 320}})
    gaps = {}
    for boost in (10.0, 0.0):
        times = await _realtime_detection_times(server.url, "slide15.mp4", {"video": {
            "target_fps": 5, "motion": {"boost_fps": boost}}})
        gaps[boost] = (times[-1] - times[0]) / (len(times) - 1)  # a 0.1 s grid on 1/15 s frames: 1 or 2 apart
    assert gaps[10.0] == pytest.approx(0.1, abs=0.025), gaps
    assert gaps[0.0] == pytest.approx(0.2, abs=0.025), gaps
