"""The timeline's ring buffers and clip cutting: a real recorder, store and encoder behind a real session pipeline
(virtual clock), fed synthetic frames whose brightness says when they were taken."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest

from pipelines.clock import VirtualClock
from pipelines.ports import AnalysedFrame, DetectionResult
from pipelines.protocol import Clip, Event, SessionConfig
from pipelines.session import SessionPipeline
from pipelines.timeline.media import FrameRing, PacketRing
from pipelines.timeline.recorder import RecorderSettings, TimelineRecorder
from pipelines.timeline.store import TimelineStore

RTP_WRAP = 1 << 32
RTP_CLOCK = Fraction(1, 90_000)


class ZoneEntriesAtAnalyzerForTest:
    """Named seam: no detector runs; it reports one ``zone.enter`` at each of ``times`` (media seconds), on the
    first sampled frame at or after it, so the recorder gets real pipeline events."""

    name = "zone-entries-at-for-test"

    def __init__(self, times: Iterable[float]) -> None:
        self.times = sorted(times)

    def configure(self, config: Any) -> None:
        return None

    async def analyze(self, sampled: Any) -> DetectionResult:
        events = []
        while self.times and sampled.pts >= self.times[0] - 1e-6:
            self.times.pop(0)
            events.append(("zone.enter", {"zone": "door", "track_id": 1, "label": "person"}))
        return DetectionResult(width=sampled.frame.width, height=sampled.frame.height, objects=[],
                               inference_ms=0.0, model=self.name, events=events)


def _frame(brightness: int, pts: int | None = None) -> av.VideoFrame:
    frame = av.VideoFrame.from_ndarray(np.full((48, 64, 3), brightness, np.uint8), format="rgb24")
    if pts is not None:
        frame.pts, frame.time_base = pts, RTP_CLOCK
    return frame


class _Recording:
    """A frames-mode (WebRTC) recorder on a real store, behind a session pipeline with a virtual clock."""

    def __init__(self, root: Path, settings: RecorderSettings, entries_at: Iterable[float] = ()) -> None:
        self.store = TimelineStore(root, max_age_s=3600, quota_bytes=10**9)
        self.store.open()
        self.executor = ThreadPoolExecutor(1)
        self.recorder = TimelineRecorder(self.store, settings, self.executor, mode="frames")
        self.sent: list[Any] = []
        self.pipeline = SessionPipeline("s1", origin="webrtc", clock=VirtualClock(), emit=self.sent.append,
                                        config=SessionConfig(), server_version="test",
                                        video_analyzer=ZoneEntriesAtAnalyzerForTest(entries_at),
                                        timeline=self.recorder)

    async def close(self) -> list[Clip]:
        await self.pipeline.close()
        self.executor.shutdown()
        self.store.close()
        return [m for m in self.sent if isinstance(m, Clip)]

    def clip_frames(self) -> list[tuple[float, float]]:
        """(seconds from the clip's start, mean brightness) of each frame of the one clip written."""
        (path,) = (self.store.root / "clips").iterdir()
        with av.open(str(path)) as container:
            frames = list(container.decode(video=0))
        origin = frames[0].pts * frames[0].time_base
        return [(float(f.pts * f.time_base - origin), float(f.to_ndarray(format="gray").mean())) for f in frames]


async def test_a_webrtc_clip_after_the_rtp_timestamp_wrap_shows_the_frames_after_the_wrap(tmp_path: Path):
    recording = _Recording(tmp_path / "data", RecorderSettings(pre_s=1.0, post_s=1.0, clip_fps=10),
                           entries_at=[4.0])
    first = RTP_WRAP - 2 * 90_000  # a sender whose random first timestamp is 2 s before the wrap
    for index in range(60):  # 6 s at 10 fps: dark before the wrap, bright after it
        seconds = index / 10
        await recording.pipeline.feed_video(_frame(40 if seconds < 2.0 else 210,
                                                   (first + index * 9_000) % RTP_WRAP))
    (clip,) = await recording.close()
    frames = recording.clip_frames()
    assert clip.pts == pytest.approx(3.0, abs=0.01)  # pre_s before the entry at 4 s of media time
    assert clip.duration_s == pytest.approx(2.0, abs=0.15)  # pre_s + post_s
    assert len(frames) == 20 and all(brightness > 150 for _, brightness in frames), frames  # none from before


async def test_an_entry_during_post_s_extends_the_same_clip(tmp_path: Path):
    recording = _Recording(tmp_path / "data", RecorderSettings(pre_s=1.0, post_s=1.5, clip_fps=10),
                           entries_at=[3.0, 4.0])
    for index in range(80):
        await recording.pipeline.feed_video(_frame(100, index * 9_000))
    (clip,) = await recording.close()
    events = [m for m in recording.sent if m.type == "event"]
    assert [e.name for e in events] == ["zone.enter", "zone.enter"]
    assert clip.event_ids == [e.id for e in events]  # one clip for both entries
    assert clip.pts == pytest.approx(2.0, abs=0.01)
    assert clip.duration_s == pytest.approx(1.0 + 1.0 + 1.5, abs=0.15)  # pre_s + the second entry's lag + post_s
    assert recording.clip_frames()[-1][0] == pytest.approx(3.4, abs=0.05)


async def test_an_extended_clip_stops_at_max_s(tmp_path: Path):
    recording = _Recording(tmp_path / "data", RecorderSettings(pre_s=1.0, post_s=1.5, max_s=3.0, clip_fps=10),
                           entries_at=[3.0, 4.0])
    for index in range(80):
        await recording.pipeline.feed_video(_frame(100, index * 9_000))
    clips = await recording.close()
    assert len(clips) == 1 and len(clips[0].event_ids) == 2
    assert clips[0].duration_s == pytest.approx(3.0, abs=0.15)  # not 3.5: capped from the clip's start
    assert recording.clip_frames()[-1][0] < 3.0


async def test_a_late_analysis_ends_its_clip_at_post_s_though_the_ring_holds_later_frames(tmp_path: Path):
    recording = _Recording(tmp_path / "data", RecorderSettings(pre_s=1.0, post_s=1.0, clip_fps=10))
    recorder = recording.recorder
    frames = {index: _frame(100, index * 9_000) for index in range(38)}
    for index, frame in frames.items():  # the ring reaches 3.7 s before the analysis of the frame at 2 s is back
        recorder.on_video_frame(frame, index / 10)
    entered = recording.pipeline.make(Event, pts=2.0, name="zone.enter",
                                      data={"zone": "door", "track_id": 1, "label": "person"})
    (event,) = recorder.on_outgoing([entered], AnalysedFrame(frames[20], 2.0, []))
    (clip,) = await recording.close()
    assert clip.event_ids == [event.id]
    assert clip.pts == pytest.approx(1.0, abs=0.01)
    assert clip.duration_s == pytest.approx(1.9, abs=0.05)  # 1.0 .. 2.9, not up to the newest frame at 3.7
    assert recording.clip_frames()[-1][0] == pytest.approx(1.9, abs=0.05)


async def test_a_clip_whose_events_were_deleted_while_it_was_recorded_leaves_no_file(tmp_path: Path):
    recording = _Recording(tmp_path / "data", RecorderSettings(pre_s=1.0, post_s=1.5, clip_fps=10), entries_at=[2.0])
    for index in range(25):  # the entry at 2 s; its clip waits for post_s
        await recording.pipeline.feed_video(_frame(100, index * 9_000))
    (event,) = [m for m in recording.sent if m.type == "event"]
    assert await asyncio.to_thread(recording.store.flush)
    assert await asyncio.to_thread(recording.store.delete, event.id)  # what DELETE /api/events/{id} does
    for index in range(25, 50):
        await recording.pipeline.feed_video(_frame(100, index * 9_000))
    clips = await recording.close()
    assert clips == []  # no clip message for a clip nothing serves
    assert list((tmp_path / "data" / "clips").iterdir()) == []  # and no file counting against the quota
    assert list((tmp_path / "data" / "snapshots").iterdir()) == []


async def test_a_shared_clip_is_announced_for_the_events_still_stored(tmp_path: Path):
    recording = _Recording(tmp_path / "data", RecorderSettings(pre_s=1.0, post_s=1.5, clip_fps=10),
                           entries_at=[2.0, 2.6])
    for index in range(27):  # both entries; their clip waits for post_s
        await recording.pipeline.feed_video(_frame(100, index * 9_000))
    first, second = [m for m in recording.sent if m.type == "event"]
    assert await asyncio.to_thread(recording.store.flush)
    assert await asyncio.to_thread(recording.store.delete, first.id)
    for index in range(27, 60):
        await recording.pipeline.feed_video(_frame(100, index * 9_000))
    (clip,) = await recording.close()
    assert clip.event_ids == [second.id] and clip.url == f"/api/events/{second.id}/clip.mp4"
    assert recording.clip_frames()  # the file is there (named after the first event: the second names it)


# ---------------------------------------------------------------- ring buffers


def _packet(pts: int, keyframe: bool) -> av.Packet:
    packet = av.Packet(b"\0" * 8)
    packet.pts = packet.dts = pts
    packet.time_base = Fraction(1, 10)
    packet.is_keyframe = keyframe
    return packet


def test_a_packet_ring_starts_at_the_keyframe_at_or_before_pre_s():
    ring = PacketRing(keep_s=3.0)
    ring.append(-0.1, _packet(-1, keyframe=False))  # nothing decodable before the first keyframe
    for index in range(100):  # 10 s at 10 packets/s, a keyframe every second
        ring.append(index / 10, _packet(index, keyframe=index % 10 == 0))
    kept = ring.since(float("-inf"))
    assert kept[0][1].is_keyframe and kept[0][0] == pytest.approx(6.0)  # whole GOPs, back to latest - keep_s
    assert kept[-1][0] == pytest.approx(9.9) and len(kept) == 40

    clip = ring.since(8.5)  # a clip from 8.5 s starts at the keyframe at 8 s
    assert clip[0][0] == pytest.approx(8.0) and clip[0][1].is_keyframe and len(clip) == 20
    assert ring.since(8.0)[0][0] == pytest.approx(8.0)  # at: that keyframe itself
    assert ring.since(2.0)[0][0] == pytest.approx(6.0)  # before the ring: the oldest keyframe kept

    ring.clear()
    ring.append(10.0, _packet(100, keyframe=False))
    assert ring.since(0.0) == []


def test_a_frame_ring_keeps_a_bounded_rate_for_a_bounded_time():
    ring = FrameRing(keep_s=2.0, fps=5.0)
    taken = []
    for index in range(300):  # 10 s at 30 fps in
        seconds = index / 30
        if ring.due(seconds):
            ring.append(seconds, _frame(0))
            taken.append(seconds)
    assert len(taken) == pytest.approx(50, abs=1)  # 5 per second
    assert all(b - a >= 0.2 - 2e-3 for a, b in itertools.pairwise(taken))
    kept = ring.since(float("-inf"))
    assert len(kept) == pytest.approx(11, abs=1) and kept[0][0] >= taken[-1] - 2.0  # the last 2 s only
    assert [t for t, _ in ring.since(9.0)] == [t for t in taken if t >= 9.0]

    slow = FrameRing(keep_s=2.0, fps=5.0)  # a stream slower than fps is taken whole
    assert all(slow.due(index * 0.5) for index in range(10))


async def test_a_session_pipeline_feeds_its_recorder_the_unwrapped_media_time():
    """The recorder's clock for WebRTC frames is the pipeline's ``pts`` (see the wrap test above); this pins the
    pipeline side: it hands over media time that runs on across the wrap."""
    seen: list[float] = []

    class TimesForTest:  # named seam: a timeline sink that only notes the times it is given
        def attach(self, pipeline: Any) -> None: ...
        def on_video_frame(self, frame: av.VideoFrame, pts: float) -> None:
            seen.append(pts)
        def on_outgoing(self, messages: list, analysed: Any = None) -> list:
            return messages
        async def close(self) -> None: ...

    pipeline = SessionPipeline("s1", origin="webrtc", clock=VirtualClock(), emit=lambda m: None,
                               config=SessionConfig(), server_version="test", timeline=TimesForTest())
    first = RTP_WRAP - 9_000
    for index in range(4):
        await pipeline.feed_video(_frame(0, (first + index * 9_000) % RTP_WRAP))
    await pipeline.close()
    assert seen == pytest.approx([0.0, 0.1, 0.2, 0.3])


_REOPEN_DURING_REMUX = """
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import av

from pipelines.timeline.media import remux_clip
from pipelines.timeline.recorder import RecorderSettings, TimelineRecorder
from pipelines.timeline.store import TimelineStore
from tests.support.media import make_clip

root = Path(sys.argv[1])
clip = make_clip(root / "camera.mp4", seconds=2.0, audio=False)
store = TimelineStore(root / "timeline", max_age_s=3600, quota_bytes=10**9)
store.open()
recorder = TimelineRecorder(store, RecorderSettings(), ThreadPoolExecutor(1), mode="packets")
packets = []
with av.open(str(clip)) as container:
    stream = container.streams.video[0]
    recorder.stream_opened(stream, 0.0)
    for packet in container.demux(stream):
        if packet.size:
            recorder.packet(packet)
            packets.append((float(packet.pts * packet.time_base), packet))
in_flight = recorder._template  # what a clip of this loop, still being remuxed on the clip executor, holds
with av.open(str(clip)) as again:  # the looping source reopens its file (an RTSP camera: a reconnect)
    recorder.stream_opened(again.streams.video[0], 2.0)
print(remux_clip(root / "clip.mp4", in_flight, packets))
"""


def test_a_stream_reopened_while_a_clip_is_remuxed_leaves_that_clip_its_template(tmp_path: Path):
    """A file source that loops (or an RTSP camera that reconnects) opens its stream again while the last loop's
    clip may still be remuxed from the old template: closing that template under the remux crashed the whole
    server (a segfault in PyAV). Run in a child process, so a crash fails this test instead of the suite."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    child = subprocess.run([sys.executable, "-c", _REOPEN_DURING_REMUX, str(tmp_path)], cwd=repo,
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, f"exit {child.returncode}: {child.stderr[-2000:]}"
    assert float(child.stdout.strip().splitlines()[-1]) > 1.5
    with av.open(str(tmp_path / "clip.mp4")) as container:
        assert sum(1 for _ in container.decode(video=0)) >= 25
