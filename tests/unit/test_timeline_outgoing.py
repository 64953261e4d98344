"""The recorder's one way in for messages: every message a session sends passes ``on_outgoing`` exactly once, an
analysed frame's ``detections`` and events as one batch. A real recorder and store (temp dir) behind a real
session pipeline (virtual clock); only the detector is faked."""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np

from pipelines.clock import VirtualClock
from pipelines.ports import AnalysedFrame, DetectionResult, SampledFrame
from pipelines.protocol import Detections, Event, Reply, ServerMessage, SessionConfig, Transcript
from pipelines.session import SessionPipeline
from pipelines.timeline.recorder import AppearRule, RecorderSettings, TimelineRecorder
from pipelines.timeline.store import TimelineStore


class FakePersonAtTheDoorAnalyzer:
    """Named seam: no detector runs; one tracked person is in view from 1 s and enters the zone 'door' at 2 s."""

    name = "fake-person-at-the-door"

    def configure(self, config: Any) -> None:
        return None

    async def analyze(self, sampled: SampledFrame) -> DetectionResult:
        person = {"label": "person", "class_id": 0, "conf": 0.9, "box": [0.1, 0.1, 0.3, 0.8], "track_id": 7}
        objects = [person] if sampled.pts >= 1.0 else []
        events = [("zone.enter", {"zone": "door", "track_id": 7, "label": "person"})] \
            if abs(sampled.pts - 2.0) < 1e-6 else []
        return DetectionResult(width=sampled.frame.width, height=sampled.frame.height, objects=objects,
                               inference_ms=1.0, model=self.name, events=events)


class OutgoingLog:
    """Wraps a recorder's ``on_outgoing``: what each call was given and what it returned."""

    def __init__(self, recorder: TimelineRecorder) -> None:
        self.calls: list[tuple[list[ServerMessage], AnalysedFrame | None, list[ServerMessage]]] = []
        enter = recorder.on_outgoing

        def on_outgoing(messages: list[ServerMessage], analysed: AnalysedFrame | None = None) -> list[ServerMessage]:
            returned = enter(messages, analysed)
            self.calls.append((list(messages), analysed, list(returned)))
            return returned

        recorder.on_outgoing = on_outgoing  # type: ignore[method-assign]


def _frame(index: int) -> av.VideoFrame:
    frame = av.VideoFrame.from_ndarray(np.full((48, 64, 3), 90, np.uint8), format="rgb24")
    frame.pts, frame.time_base = index * 9_000, Fraction(1, 90_000)
    return frame


async def test_every_outgoing_message_enters_the_recorder_once(tmp_path: Path):
    store = TimelineStore(tmp_path / "timeline", max_age_s=3600, quota_bytes=10**9)
    store.open()
    executor = ThreadPoolExecutor(1)
    settings = RecorderSettings(pre_s=0.5, post_s=0.5, clip_fps=10, appear=(AppearRule("person"),))
    recorder = TimelineRecorder(store, settings, executor, mode="frames")
    log = OutgoingLog(recorder)
    sent: list[ServerMessage] = []
    pipeline = SessionPipeline("s1", origin="webrtc", clock=VirtualClock(), emit=sent.append,
                               config=SessionConfig(), server_version="test",
                               video_analyzer=FakePersonAtTheDoorAnalyzer(), timeline=recorder)
    pipeline.add_track("video")
    pipeline.hello()
    for index in range(40):  # 4 s at 10 fps
        await pipeline.feed_video(_frame(index))
    pipeline.send(Transcript, turn=1, text="who is at the door?", final=True)  # as the voice loop sends them
    pipeline.send(Reply, turn=1, delta="Someone is.")
    pipeline.send(Reply, turn=1, done=True)
    await pipeline.close()
    executor.shutdown()

    returned = Counter(id(message) for _, _, out in log.calls for message in out)
    assert sent and all(returned[id(message)] == 1 for message in sent)  # each, once, on its way out
    assert sum(returned.values()) == len(sent)  # and nothing reached the recorder that was not sent
    assert not hasattr(recorder, "on_analyzed") and not hasattr(recorder, "on_message")

    batches = [(given, analysed) for given, analysed, _ in log.calls if analysed is not None]
    assert len(batches) == pipeline.counts.video.frames_analyzed  # one entry per analysed frame
    assert all(isinstance(given[0], Detections) for given, _ in batches)

    events = [m for m in sent if isinstance(m, Event) and m.name != "config"]
    assert [e.name for e in events] == ["object.appeared", "zone.enter"]
    assert all(e.id is not None for e in events)  # stored, with their entry ids
    assert any(m.type == "clip" for m in sent)
    assert store.flush()
    stored = store.query(source="s1", kinds=("event", "transcript", "reply"), limit=100)
    assert sorted(entry.name for entry in stored) == ["object.appeared", "reply", "transcript", "zone.enter"]
    assert {entry.id for entry in stored if entry.kind == "event"} == {e.id for e in events}
    store.close()
