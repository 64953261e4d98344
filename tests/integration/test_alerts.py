"""Spoken alerts over real WebRTC with the real voice models: a zone's ``announce`` is heard by the client, never
over the user's speech, and the next answer knows it was said."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from aiortc.contrib.media import MediaPlayer

from models.stt.whisper import WhisperStt
from pipelines.voice.audio import OUT_RATE, resample_pcm
from server.cli.client import VigilClient
from server.config import load_settings
from server.engines import Engines
from tests.support.audio import Recorder, ScriptedMicrophone, rms, silence, speech
from tests.support.media import sliding_person
from tests.support.zone_entry import ZoneEntryAnalyzerForTest

# Silence end of turn: these tests are about alerts, and the user's long question must stay one turn (Smart Turn
# may end it at a breath, which splits it in two and changes what the timeline stores).
VOICE = {"enabled": True, "turn_detection": "silence", "end_of_turn_silence_ms": 500, "silent_track_s": 600,
         "max_reply_tokens": 24}
KITCHEN = {"name": "kitchen", "polygon": [[0.5, 0.0], [1.0, 0.0], [1.0, 1.0], [0.5, 1.0]],
           "announce": "Someone entered the {zone}", "announce_cooldown_s": 60}


@pytest.fixture(scope="module")
def slide(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sliding_person(tmp_path_factory.mktemp("alerts") / "slide.mp4", seconds=6.0, fps=10)


class Call:
    """An aiortc client with a scripted microphone (and a video), keeping every message and the reply audio."""

    def __init__(self, url: str, video: Any, options: dict[str, Any]) -> None:
        self.mic = ScriptedMicrophone()
        self.client = VigilClient(url, options=options)
        self.video = video
        self.messages: list[tuple[float, dict[str, Any]]] = []
        self.client.on_message = lambda message, arrived: self.messages.append((arrived, message))
        self.recorder: Recorder | None = None

        @self.client.pc.on("track")
        def on_track(track: Any) -> None:
            if track.kind == "audio":
                self.recorder = Recorder(track)

    async def __aenter__(self) -> Call:
        await self.client.connect([self.mic, self.video])
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.recorder is not None:
            await self.recorder.stop()
        await self.client.close()

    async def wait_for(self, where: Callable[[dict[str, Any]], bool], timeout: float = 60.0) -> tuple[float, dict]:
        async with asyncio.timeout(timeout):
            while True:
                for arrived, message in self.messages:
                    if where(message):
                        return arrived, message
                await asyncio.sleep(0.05)

    async def quiet(self, seconds: float = 1.0, timeout: float = 60.0) -> None:
        """Until no loud reply audio has arrived for ``seconds``."""
        async with asyncio.timeout(timeout):
            while True:
                assert self.recorder is not None
                last = self.recorder.last_loud()
                if last is not None and time.perf_counter() - last >= seconds:
                    return
                await asyncio.sleep(0.1)


def _alert(message: dict[str, Any]) -> bool:
    return message["type"] == "reply" and message.get("kind") == "alert" and bool(message.get("delta"))


def _heard(pcm48: np.ndarray) -> str:
    return WhisperStt().transcribe(resample_pcm(pcm48, OUT_RATE, 16000).astype(np.float32) / 32768.0).text


async def test_a_zone_alert_is_heard_by_the_client_and_remembered(vigil, slide: Path, tmp_path: Path):
    server = await vigil(voice=VOICE, models={"detector": {"backend": "yolo"}}, video={"target_fps": 5},
                         storage={"data_dir": str(tmp_path / "events"), "clips": False})
    async with Call(server.url, MediaPlayer(str(slide)).video, {"video": {"zones": [KITCHEN]}}) as call:
        _, enter = await call.wait_for(lambda m: m["type"] == "event" and m["name"] == "zone.enter")
        _, alert = await call.wait_for(_alert)
        assert alert["delta"] == "Someone entered the kitchen"
        await call.wait_for(lambda m: m["type"] == "reply" and m.get("kind") == "alert" and m.get("done"))
        await call.quiet()
        assert call.recorder is not None
        assert "kitchen" in _heard(call.recorder.audio()).lower()

        call.mic.say(speech("What did you just say?"))
        await call.wait_for(lambda m: m["type"] == "reply" and m.get("done") and m["turn"] > alert["turn"]
                            and m.get("kind") is None)
        (session,) = server.sessions.sessions.values()
        history = session.pipeline.audio_analyzer.last_request.messages
        assert any(m.role == "assistant" and m.content == "Someone entered the kitchen" for m in history), history
        assert sum(1 for _, m in call.messages if _alert(m)) == 1  # one per zone per cooldown

    async with aiohttp.ClientSession() as http, http.get(f"{server.url}/api/events?kind=alert") as response:
        alerts = (await response.json())["events"]
    assert [(a["text"], a["data"]["zone"]) for a in alerts] == [("Someone entered the kitchen", "kitchen")]
    assert enter["id"]


class ZoneEntryWhenToldAnalyzerForTest(ZoneEntryAnalyzerForTest):
    """Reports one ``zone.enter`` into 'kitchen' on the first frame after ``fire`` is set, so the test can make the
    alert due while the user is speaking."""

    name = "zone-entry-when-told-for-test"
    zone = "kitchen"
    fire = asyncio.Event()

    def due(self, sampled: Any) -> bool:
        return self.fire.is_set()


async def test_an_alert_due_while_the_user_speaks_waits_for_the_turn_to_end(vigil, model_pool, slide: Path,
                                                                           tmp_path: Path):
    settings = load_settings(None, {"voice": VOICE, "models": {"detector": {"backend": "none"}}})
    analyzers = Engines(settings, models=model_pool).analyzers
    ZoneEntryWhenToldAnalyzerForTest.fire = asyncio.Event()
    analyzers.video = ZoneEntryWhenToldAnalyzerForTest
    server = await vigil(analyzers, voice=VOICE, storage={"data_dir": str(tmp_path / "events"), "clips": False})
    video = MediaPlayer(str(slide), loop=True).video
    async with Call(server.url, video, {"video": {"zones": [KITCHEN]}}) as call:
        call.mic.say(silence(0.5))
        call.mic.say(speech("Please describe everything you can see on the camera right now, every person and "
                            "every object in the room, and tell me what they are doing."))
        await asyncio.sleep(2.5)  # the user is mid-sentence (about 8 s of speech) when the zone entry happens
        (session,) = server.sessions.sessions.values()
        assert call.mic.speaking and not session.pipeline.audio_analyzer.idle  # a user turn is in progress
        ZoneEntryWhenToldAnalyzerForTest.fire.set()
        event_at, _ = await call.wait_for(lambda m: m["type"] == "event" and m["name"] == "zone.enter")
        assert call.mic.speaking, "the speech ended before the alert was due: the test proves nothing"
        await call.mic.spoken.wait()
        speech_ended = time.perf_counter()
        alert_at, alert = await call.wait_for(_alert)
        _, final = await call.wait_for(lambda m: m["type"] == "transcript" and m["final"])
        # Due during the user's turn, said after it: once the user went quiet (it may come before the answer).
        assert event_at < speech_ended < alert_at
        assert alert["turn"] > final["turn"]
        await call.quiet()
        assert call.recorder is not None
        # Nothing loud reached the client while the user was speaking; the alert was heard afterwards.
        during = [s for t, s in call.recorder.frames if event_at <= t <= speech_ended]
        assert during and max(rms(s) for s in during) < 300
        assert "kitchen" in _heard(call.recorder.audio(since=alert_at - 0.5)).lower()

    async with aiohttp.ClientSession() as http, http.get(f"{server.url}/api/events?kind=alert,transcript,reply"
                                                         ) as response:
        kinds = [e["kind"] for e in reversed((await response.json())["events"])]
    assert sorted(kinds) == ["alert", "reply", "transcript"], kinds


async def test_speaking_over_an_alert_cuts_it_like_a_reply(vigil, model_pool, slide: Path, tmp_path: Path):
    settings = load_settings(None, {"voice": VOICE, "models": {"detector": {"backend": "none"}}})
    analyzers = Engines(settings, models=model_pool).analyzers
    ZoneEntryWhenToldAnalyzerForTest.fire = asyncio.Event()
    analyzers.video = ZoneEntryWhenToldAnalyzerForTest
    server = await vigil(analyzers, voice=VOICE, storage={"data_dir": str(tmp_path / "events"), "clips": False})
    long_alert = {**KITCHEN, "announce": "Attention please: someone has just entered the {zone}, and they are "
                                         "walking slowly across the room right now, so please take a careful "
                                         "look at the camera when you have a moment."}
    video = MediaPlayer(str(slide), loop=True).video
    async with Call(server.url, video, {"video": {"zones": [long_alert]}}) as call:
        await asyncio.sleep(1.0)
        ZoneEntryWhenToldAnalyzerForTest.fire.set()
        alert_at, alert = await call.wait_for(_alert)
        async with asyncio.timeout(30):  # until the alert is heard
            while call.recorder is None or call.recorder.first_loud(since=alert_at) is None:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        call.mic.say(speech("Stop, wait a moment please."))
        _, barge = await call.wait_for(lambda m: m["type"] == "event" and m["name"] == "barge_in")
        assert barge["data"]["turn"] == alert["turn"]
        assert barge["data"]["dropped_audio_ms"] > 1000  # most of the alert was never played
