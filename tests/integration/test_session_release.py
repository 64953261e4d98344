"""Ended sessions are freed by reference counting alone.

Ended sessions used to live on in reference cycles (aiortc's peer connection and its transports, the pipeline with
its recorder and voice loop, finished tasks' tracebacks) until Python's full collection, which a server holding
large models runs rarely: RSS and OS threads (each voice loop's resampler filter graph keeps native worker threads)
grew with every session. Here the garbage collector is off while real aiortc peers with audio and video come and
go, so only explicit cleanup can free them.
"""

from __future__ import annotations

import asyncio
import gc
import os
import threading
import weakref
from collections import Counter
from fractions import Fraction
from typing import Any

import av
import numpy as np
from aiortc import MediaStreamTrack

from server.cli.client import VigilClient
from server.media.rtc_release import release_peer_connection
from tests.support.audio import ScriptedMicrophone

CYCLES = 6
FPS = 10
SERVER_ONLY_TYPES = ("WebRTCSession", "SessionPipeline", "TrackTime", "TimelineRecorder", "VoiceLoop")


def vp8_packets(count: int = FPS * 2, size: tuple[int, int] = (160, 120)) -> list[bytes]:
    """A moving square, VP8-encoded once (a keyframe every second): the camera below costs no encoding."""
    width, height = size
    codec = av.CodecContext.create("libvpx", "w")
    codec.width, codec.height, codec.pix_fmt = width, height, "yuv420p"
    codec.time_base, codec.framerate, codec.gop_size = Fraction(1, FPS), Fraction(FPS), FPS
    packets: list[bytes] = []
    for index in range(count):
        picture = np.full((height, width, 3), 60, np.uint8)
        picture[40:80, index * 6 % (width - 40):][:, :40] = 220
        frame = av.VideoFrame.from_ndarray(picture, format="rgb24")
        frame.pts, frame.time_base = index, Fraction(1, FPS)
        packets += [bytes(packet) for packet in codec.encode(frame)]
    packets += [bytes(packet) for packet in codec.encode(None)]
    return packets


class LoopedVp8Camera(MediaStreamTrack):
    """Pre-encoded VP8 packets, looped in real time (aiortc's sender packetizes an ``av.Packet`` as it is)."""

    kind = "video"

    def __init__(self, packets: list[bytes]) -> None:
        super().__init__()
        self.packets, self.index = packets, 0

    async def recv(self) -> av.Packet:
        await asyncio.sleep(1 / FPS)
        packet = av.Packet(self.packets[self.index % len(self.packets)])
        packet.pts, packet.time_base = self.index, Fraction(1, FPS)
        self.index += 1
        return packet


def native_threads() -> int:
    """OS threads that are not Python threads: codec, filter-graph and model workers."""
    return len(os.listdir("/proc/self/task")) - threading.active_count()


def live_server_objects() -> Counter[str]:
    return Counter(name for obj in gc.get_objects() if (name := type(obj).__name__) in SERVER_ONLY_TYPES)


async def one_session(server: Any, packets: list[bytes]) -> list[weakref.ref[Any]]:
    """Connect with audio + video, stream a little, hang up; weak references to the server's side of it."""
    client = VigilClient(server.url)
    camera, microphone = LoopedVp8Camera(packets), ScriptedMicrophone()
    try:
        session_id = await client.connect([microphone, camera])
        await client.next_message("metrics", where=lambda m: m["media"]["video"]["frames_in"] > 0
                                  and m["media"]["audio"]["frames_in"] > 0)
        session = server.sessions.get(session_id)
        pipeline = session.pipeline
        kept = [session, session.pc, pipeline, pipeline._video_time, pipeline._audio_time, pipeline.timeline,
                pipeline.audio_analyzer, *session.pc.getReceivers(), *session.pc.getSenders()]
        refs = [weakref.ref(obj) for obj in kept if obj is not None]
        del session, pipeline, kept
    finally:
        await client.close(grace=5.0)
        camera.stop()
        microphone.stop()
        # The client's own peer connection is aiortc's too: released the same way, so its codec threads go now.
        release_peer_connection(client.pc)
        client.channel.remove_all_listeners()
    return refs


async def test_ended_sessions_free_their_objects_and_threads_without_the_garbage_collector(vigil):
    server = await vigil(voice={"enabled": True})  # the voice loop: a resampler filter graph per session
    packets = vp8_packets()
    await one_session(server, packets)  # warm-up: models, pools and lazily started threads
    await asyncio.sleep(0.5)
    gc.collect()
    threads_before = native_threads()
    assert live_server_objects() == Counter()

    refs: list[weakref.ref[Any]] = []
    gc.disable()
    try:
        for _ in range(CYCLES):
            refs += await one_session(server, packets)
        for _ in range(100):  # until every close has finished (they run on after the DELETE is answered)
            if not any(ref() is not None for ref in refs) and len(server.sessions) == 0:
                break
            await asyncio.sleep(0.1)
        alive = Counter(type(obj).__name__ for ref in refs if (obj := ref()) is not None)
        live = live_server_objects()
        threads_after = native_threads()
    finally:
        gc.enable()
    assert len(server.sessions) == 0
    assert alive == Counter(), f"objects of {CYCLES} ended sessions still alive without a full collection"
    assert live == Counter()
    assert threads_after <= threads_before, f"native threads {threads_before} -> {threads_after}"
