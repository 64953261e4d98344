"""Recording benchmark: what event clips cost, as CPU seconds per stream with recording on ÷ off, and how long after
``post_s`` a clip is available.

Two inputs at 30 fps, each against a Vigil server in a separate process (``python -m bench.recording --serve``),
in three modes, legs in the order off, rec, default, default, rec, off:

* ``off``: recording off (``storage.enabled: false``);
* ``rec``: recording on (``pre_s`` 3, ``post_s`` 3, the defaults) with the memory index off, which is what
  recording itself costs;
* ``default``: the shipped defaults, recording on and the memory index embedding what the timeline commits.

The inputs:

* RTSP: a live H.264 camera (``tests/support/rtsp_camera.py``, 640x480, GOP 1 s) -> ``POST /api/sources``; clips
  are *remuxed* from the ring of demuxed packets.
* WebRTC: an aiortc client sending 640x480 at 30 fps (VP8); clips are *encoded* from frames kept at
  ``storage.clip_fps``.

The server's video analyser is ``ZoneEntryEveryTenSecondsForBench`` (named seam): it reports a zone entry every
10 s of media time, so a leg writes a clip every 10 s without a model's CPU hiding the recording's. CPU is the
server process's user+system time (``/proc/PID/stat``) over the measured window, after a warm-up. "Clip after
post_s" is the time from the event message to the clip message at the client, minus ``post_s``.

Goals: remux <= 1.05x, encode <= 1.3x.

Run (about 5 minutes)::

    cd /work/main && .venv/bin/python -m bench.recording
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import av
import numpy as np
from aiortc import VideoStreamTrack

EVENT_EVERY_S = 10.0
POST_S = 3.0


class ZoneEntryEveryTenSecondsForBench:
    """Named seam: a zone entry every 10 s of media time, no model."""

    name = "zone-entry-every-10s-for-bench"

    def __init__(self) -> None:
        self.next_at = 2.0

    def configure(self, config: Any) -> None:
        return None

    async def analyze(self, sampled: Any) -> Any:
        from pipelines.ports import DetectionResult

        events = []
        if sampled.pts >= self.next_at:
            self.next_at += EVENT_EVERY_S
            events = [("zone.enter", {"zone": "door", "track_id": 1, "label": "person"})]
        return DetectionResult(width=sampled.frame.width, height=sampled.frame.height, objects=[],
                               inference_ms=0.0, model=self.name, events=events)


MODES = ("off", "rec", "default")


def serve(port: int, mode: str, data_dir: str) -> None:
    from server.app import run
    from server.config import load_settings
    from server.engines import Analyzers

    settings = load_settings(None, {
        "server": {"host": "127.0.0.1", "port": port}, "webrtc": {"host_addresses": ["127.0.0.1"]},
        "voice": {"enabled": False}, "models": {"detector": {"backend": "none"}}, "grpc": {"enabled": False},
        "sources": {"media_root": data_dir}, "storage": {"enabled": mode != "off", "data_dir": data_dir},
        "memory": {"enabled": mode == "default", "data_dir": os.path.join(data_dir, "memory")},
    })
    run(settings, Analyzers(video=ZoneEntryEveryTenSecondsForBench))


class MovingSquareTrack(VideoStreamTrack):
    """640x480 at 30 fps, a moving square (so the encoder has work like a camera's)."""

    def __init__(self) -> None:
        super().__init__()
        self.index = 0

    async def recv(self) -> av.VideoFrame:
        pts, time_base = await self.next_timestamp()
        picture = np.full((480, 640, 3), 60, np.uint8)
        x = (self.index * 7) % 560
        picture[200:280, x: x + 80] = 220
        self.index += 1
        frame = av.VideoFrame.from_ndarray(picture, format="rgb24")
        frame.pts, frame.time_base = pts, time_base
        return frame


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _wait_up(url: str) -> None:
    async with aiohttp.ClientSession() as http:
        for _ in range(300):
            try:
                async with http.get(f"{url}/healthz") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError("server did not start")


async def leg(kind: str, mode: str, seconds: float, camera_url: str | None) -> dict[str, Any]:
    from tests.support.ports import free_port

    port = free_port()
    with tempfile.TemporaryDirectory() as data_dir:
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.recording", "--serve", str(port),
            "--mode", mode, "--data-dir", data_dir,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        events: dict[str, float] = {}
        delays: list[float] = []

        def on_message(message: dict[str, Any], arrived: float) -> None:
            if message.get("type") == "event" and message.get("id"):
                events[message["id"]] = arrived
            elif message.get("type") == "clip":
                first = min((events[i] for i in message["event_ids"] if i in events), default=None)
                if first is not None:
                    delays.append(arrived - first - POST_S)

        try:
            await _wait_up(url)
            warm_up = 4.0
            if kind == "rtsp":
                async with aiohttp.ClientSession() as http:
                    async with http.post(f"{url}/api/sources", json={"url": camera_url}) as response:
                        source = (await response.json())["id"]
                    async with http.ws_connect(f"{url}/api/sources/{source}/results") as ws:
                        cpu = await _measure(child.pid, warm_up, seconds, lambda: _drain_ws(ws, on_message))
                    frames = await _frames(http, f"{url}/api/sources/{source}")
            else:
                from server.cli.client import VigilClient

                client = VigilClient(url)
                client.on_message = on_message
                track = MovingSquareTrack()
                await client.connect([track])
                cpu = await _measure(child.pid, warm_up, seconds, None)
                async with aiohttp.ClientSession() as http:
                    frames = await _frames(http, f"{url}/api/sessions/{client.session_id}")
                await client.close()
                track.stop()
        finally:
            child.terminate()
            await asyncio.wait_for(child.wait(), 20)
    return {"kind": kind, "mode": mode, "cpu_s": cpu, "seconds": seconds, "frames_in": frames,
            "clip_delays": delays}


async def _drain_ws(ws: aiohttp.ClientWebSocketResponse, on_message: Any) -> None:
    async for msg in ws:
        if msg.type == aiohttp.WSMsgType.TEXT:
            on_message(json.loads(msg.data), time.perf_counter())


async def _frames(http: aiohttp.ClientSession, url: str) -> int:
    async with http.get(url) as response:
        return (await response.json())["counts"]["video"]["frames_in"]


async def _measure(pid: int, warm_up: float, seconds: float, background: Any) -> float:
    task = asyncio.create_task(background()) if background else None
    try:
        await asyncio.sleep(warm_up)
        start = _cpu_s(pid)
        await asyncio.sleep(seconds)
        return _cpu_s(pid) - start
    finally:
        if task is not None:
            task.cancel()


async def main(seconds: float) -> None:
    from server.media.ice import restrict_host_addresses
    from tests.support.ports import free_port
    from tests.support.rtsp import RtspCamera

    restrict_host_addresses(["127.0.0.1"])  # aioice offers no loopback candidate otherwise

    camera = RtspCamera(free_port(), width=640, height=480, fps=30)
    await asyncio.to_thread(camera.start)
    results = []
    try:
        for kind in ("rtsp", "webrtc"):
            for mode in ("off", "rec", "default", "default", "rec", "off"):
                results.append(await leg(kind, mode, seconds, camera.url))
    finally:
        await asyncio.to_thread(camera.stop)
    print(f"recording benchmark: 640x480 at 30 fps in, a clip every {EVENT_EVERY_S:g} s (pre_s 3, post_s {POST_S:g}),"
          f" {seconds:g} s per leg; rec = recording without the memory index, default = recording + memory")
    print(f"{'input':8} {'mode':>9} {'CPU s/stream':>13} {'frames in':>10} {'clips':>6}")
    for r in results:
        print(f"{r['kind']:8} {r['mode']:>9} {r['cpu_s']:13.2f} {r['frames_in']:10d}"
              f" {len(r['clip_delays']):6d}")
    for kind, goal, what in (("rtsp", 1.05, "remux"), ("webrtc", 1.3, "encode")):
        cpu = {mode: sum(r["cpu_s"] for r in results if r["kind"] == kind and r["mode"] == mode) for mode in MODES}
        delays = [d for r in results if r["kind"] == kind for d in r["clip_delays"]]
        delay = f"median {statistics.median(delays):.2f} s, max {max(delays):.2f} s" if delays else "no clips"
        ratio = cpu["rec"] / cpu["off"] if cpu["off"] else float("nan")
        with_memory = cpu["default"] / cpu["off"] if cpu["off"] else float("nan")
        print(f"{kind} ({what}): CPU rec/off = {ratio:.3f}x (goal <= {goal}x: {'met' if ratio <= goal else 'NOT met'});"
              f" default (+ memory index)/off = {with_memory:.3f}x; clip available after post_s: {delay}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=25.0, help="measured seconds per leg")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=MODES, default="default", help=argparse.SUPPRESS)
    parser.add_argument("--data-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.mode, args.data_dir)
    else:
        asyncio.run(main(args.seconds))
