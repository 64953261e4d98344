"""Detection in worker processes (``video.detector_workers``): the same detections as in process, batched across
streams; a worker killed (SIGKILL) or hung (SIGSTOP) is restarted, its frames fail as a counted outage and
detection resumes; shared memory is unlinked on close and when the server itself is killed; and, through a real
``vigil serve`` with a WebRTC session, killing the worker never ends the session.

The default detector (``openvino`` here, yolo11n-pose; its IR made by scripts/setup.sh) runs in the workers."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from pathlib import Path

import aiohttp
import av
import pytest
from aiortc.contrib.media import MediaPlayer
from prometheus_client import REGISTRY

from models.detectors import load_detector
from pipelines.video.batcher import BatchResult, InferenceBatcher
from pipelines.video.workers import SHM_PREFIX, DetectorOutage, DetectorWorkers
from server.cli.client import VigilClient
from server.config import Settings
from server.media.ice import restrict_host_addresses
from tests.support.detections import Tolerance, assert_same_detections
from tests.support.media import letterbox, real_image, slideshow
from tests.support.vigil_process import VigilProcess

SAME = Tolerance(min_iou=0.99, max_conf=0.01, max_keypoint=0.01)  # one model, one runtime: the same numbers


def _frame(name: str) -> av.VideoFrame:
    return av.VideoFrame.from_ndarray(letterbox(real_image(name), (640, 480)), format="rgb24")


def _blocks(pid: int) -> list[str]:
    """This process's shared-memory blocks for detector workers."""
    return sorted(p.name for p in Path("/dev/shm").glob(f"{SHM_PREFIX}{pid}-*"))


def _counter(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def _detect_until_answered(workers: DetectorWorkers, frame: av.VideoFrame, timeout: float) -> BatchResult:
    """Frames sent while the worker restarts fail as an outage; the first one answered after it is back."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await workers.detect(frame, stream=0)
        except DetectorOutage:
            assert time.monotonic() < deadline, "detection did not resume after the worker was restarted"
            await asyncio.sleep(0.3)


@pytest.fixture
def detector_config():
    return Settings().models.detector  # the default backend, as vigil serve would load it


async def test_workers_find_what_the_in_process_batcher_finds(detector_config):
    frames = [_frame("zidane"), _frame("bus"), _frame("zidane")]
    local = InferenceBatcher(load_detector(detector_config), max_batch=4, max_wait_ms=50)  # type: ignore[arg-type]
    workers = DetectorWorkers(detector_config, workers=1, max_batch=4, max_wait_ms=50)
    await asyncio.to_thread(workers.start)
    try:
        assert workers.name == local.name
        assert workers.detector.names == {0: "person"}  # what the plates' label check reads
        expected = await asyncio.gather(*(local.detect(frame, stream) for stream, frame in enumerate(frames)))
        # Three streams at once: one batch in the worker, as in process.
        got = await asyncio.gather(*(workers.detect(frame, stream) for stream, frame in enumerate(frames)))
        assert max(result.batch_size for result in got) > 1
        for want, have in zip(expected, got, strict=True):
            assert any(d.label == "person" for d in want.detections)
            assert_same_detections(want.detections, have.detections, SAME)
        assert len(_blocks(os.getpid())) == len(frames)  # one block per stream
    finally:
        await workers.close()
        await local.close()
    assert _blocks(os.getpid()) == []


async def test_a_killed_worker_is_restarted_and_its_frames_count_as_an_outage(detector_config):
    workers = DetectorWorkers(detector_config, workers=1, answer_timeout_s=5)
    await asyncio.to_thread(workers.start)
    frame = _frame("zidane")
    try:
        assert (await workers.detect(frame, stream=0)).detections
        (pid,) = workers.pids
        assert pid is not None
        outages = _counter("vigil_detector_outages_total", reason="died")
        lost = _counter("vigil_detector_outage_frames_total")
        os.kill(pid, signal.SIGKILL)
        await asyncio.sleep(0.5)
        with pytest.raises(DetectorOutage):
            await workers.detect(frame, stream=0)
        result = await _detect_until_answered(workers, frame, timeout=120)
        assert any(d.label == "person" for d in result.detections)
        assert workers.pids[0] not in (None, pid)
        assert _counter("vigil_detector_outages_total", reason="died") == outages + 1
        assert _counter("vigil_detector_outage_frames_total") > lost
        assert len(_blocks(os.getpid())) == 1  # the stream's block outlived the worker and serves the new one
    finally:
        await workers.close()
    assert _blocks(os.getpid()) == []


async def test_a_hung_worker_is_killed_and_restarted(detector_config):
    workers = DetectorWorkers(detector_config, workers=1, answer_timeout_s=2)
    await asyncio.to_thread(workers.start)
    frame = _frame("zidane")
    try:
        await workers.detect(frame, stream=0)
        (pid,) = workers.pids
        assert pid is not None
        hangs = _counter("vigil_detector_outages_total", reason="hung")
        os.kill(pid, signal.SIGSTOP)  # alive, but neither answers nor sends heartbeats
        started = time.monotonic()
        with pytest.raises(DetectorOutage):
            await asyncio.wait_for(workers.detect(frame, stream=0), 30)
        assert time.monotonic() - started < 15  # answer_timeout_s, not forever
        assert _counter("vigil_detector_outages_total", reason="hung") == hangs + 1
        assert (await _detect_until_answered(workers, frame, timeout=120)).detections
        assert workers.pids[0] not in (None, pid)
    finally:
        await workers.close()
    assert _blocks(os.getpid()) == []


def _metric(exposition: str, name: str, labels: str = "") -> float | None:
    match = re.search(rf"^{re.escape(name + labels)} (\S+)$", exposition, re.MULTILINE)
    return float(match.group(1)) if match else None


async def _exposition(server: VigilProcess) -> str:
    async with aiohttp.ClientSession() as http, http.get(f"{server.url}/metrics") as response:
        return await response.text()


async def test_killing_the_worker_never_ends_a_session(tmp_path: Path):
    """A real vigil serve with one detector worker and a WebRTC session of a person in view: SIGKILL the worker; the
    data channel stays open, the session reports the outage once (detector_unavailable) and counts the frames it
    cost, vigil_detector_outages_total counts it, and detections of the person resume. Then the server itself is
    SIGKILLed: no shared memory is left behind."""
    clip = slideshow(tmp_path / "person.mp4", [("zidane", 120.0)], fps=10)
    server = VigilProcess(tmp_path, {
        "video": {"detector_workers": 1, "detector_worker_timeout_s": 5},
        "voice": {"enabled": False},
        "webrtc": {"host_addresses": ["127.0.0.1"]},
        "sessions": {"metrics_interval_s": 0.5},
    })
    await asyncio.to_thread(server.start)
    assert server.process is not None
    client: VigilClient | None = None
    try:
        worker_pid = _metric(await _exposition(server), "vigil_detector_worker_pid", '{worker="0"}')
        assert worker_pid, "the worker's pid is on /metrics"
        restrict_host_addresses(["127.0.0.1"])  # this process's client, in a loopback-only namespace
        client = VigilClient(server.url, options={"video": {"target_fps": 5, "motion": {"enabled": False}}})
        player = MediaPlayer(str(clip))
        await client.connect([player.video])

        def person(message: dict) -> bool:
            return any(o["label"] == "person" for o in message["objects"])

        await client.next_message("detections", timeout=60, where=person)
        os.kill(int(worker_pid), signal.SIGKILL)
        error = await client.next_message("error", timeout=30)
        assert error["code"] == "detector_unavailable", error
        await client.next_message("detections", timeout=90, where=person)
        metrics = await client.next_message("metrics", timeout=10)
        assert metrics["media"]["video"]["frames_failed"] > 0
        assert not client._channel_closed.is_set() and client.channel.readyState == "open"
        exposition = await _exposition(server)
        assert _metric(exposition, "vigil_detector_outages_total", '{reason="died"}') == 1.0
        assert (_metric(exposition, "vigil_detector_outage_frames_total") or 0) > 0
        assert _metric(exposition, "vigil_detector_worker_pid", '{worker="0"}') not in (None, 0.0, worker_pid)
        assert _blocks(server.process.pid), "the session's frames cross in shared memory"
    finally:
        if client is not None:
            await client.close(delete=False)
        server.stop(hard=True)
        restrict_host_addresses(None)
    # The server got no chance to unlink: multiprocessing's resource tracker does, once the worker (whose pipe
    # to the server closed) has exited too.
    for _ in range(60):
        if not _blocks(server.process.pid):
            break
        await asyncio.sleep(0.5)
    assert _blocks(server.process.pid) == []

