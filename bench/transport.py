"""Glass-to-glass transport benchmark: Vigil vs a bare aiortc echo server, measured in one run.

What is measured: the time from a synthetic video frame being handed to aiortc on the client (the moment
``FrameCodeTrack.recv()`` returns it) to the result message for that frame arriving back on the client's
"results" data channel. That covers VP8 encode, RTP over loopback, jitter buffer, decode, the server side and
the data channel back. Each frame carries its 16-bit id *in the picture* (a row of large blocks plus a
complement row as a check), so both servers read it back the same way, with ``decode_frame_id``.

Two setups, both in this process, on 127.0.0.1 only:

* bare:  a plain aiortc ``RTCPeerConnection`` (signalled directly in-process, no HTTP) that decodes the id of
  every received frame and sends ``{"frame": id}`` back on the client's "results" channel;
* vigil: the real app (``create_app``) served by aiohttp on 127.0.0.1, with ``FrameCodeAnalyzer`` injected as
  its video analyser (label ``frame:<id>``), ``video.target_fps`` above the send rate so no frame is sampled
  away, and ``VigilClient`` as the client.

Legs alternate A-B-B-A (``--rounds``) to spread drift; the first ``--warmup`` seconds of every leg are discarded.
Frames sent in the measured window but never answered are counted as lost.

Expect a floor of about one frame interval (1/fps) in *both* setups: aiortc's video jitter buffer hands a frame to
the decoder only once the first packet of the next frame arrives. The ratio is what this benchmark is for.

Run it inside a private network namespace (nothing can leave the machine)::

    cd /work/main && unshare -n bash -c 'ip link set lo up && .venv/bin/python -m bench.transport --seconds 10'
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import logging
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np
from aiohttp import web
from aiortc import MediaStreamTrack, RTCConfiguration, RTCPeerConnection
from aiortc.mediastreams import MediaStreamError
from aiortc.rtcdatachannel import RTCDataChannel

from pipelines.ports import DetectionResult, SampledFrame
from server.app import create_app
from server.cli.client import VigilClient
from server.config import load_settings
from server.engines import Analyzers
from server.http.serve import start_serving
from server.media.ice import restrict_host_addresses
from tests.support.vigil_process import with_data_dirs

BITS = 16
CLOCK_RATE = 90_000  # the RTP video clock, so pts survive the trip unrounded
LABEL_PREFIX = "frame:"

# ---------------------------------------------------------------------------- the frame code


def _layout(width: int, height: int) -> tuple[int, int, int]:
    """Block width, block height, left margin. Blocks are multiples of 16 px, aligned to VP8 macroblocks,
    so each block is one flat macroblock column and survives quantisation."""
    block_w = max(16, (width // BITS) // 16 * 16)
    if block_w * BITS > width or 2 * 32 > height:
        raise ValueError(f"{width}x{height} is too small for a {BITS}-bit frame code")
    return block_w, 32, (width - block_w * BITS) // 32 * 16


def make_frame(frame_id: int, width: int, height: int, n: int) -> av.VideoFrame:
    """A yuv420p frame: mid-grey, a moving bar (so the encoder has motion to code), the id in the top rows."""
    block_w, block_h, x0 = _layout(width, height)
    luma = np.full((height, width), 128, np.uint8)
    bar = (n * 8) % width
    luma[2 * block_h :, bar : bar + 16] = 200
    for bit in range(BITS):
        on = (frame_id >> (BITS - 1 - bit)) & 1
        xs = slice(x0 + bit * block_w, x0 + (bit + 1) * block_w)
        luma[0:block_h, xs] = 255 if on else 0
        luma[block_h : 2 * block_h, xs] = 0 if on else 255  # complement row: a cheap integrity check
    chroma = np.full((height // 2, width), 128, np.uint8)  # U and V planes, stacked as av expects
    return av.VideoFrame.from_ndarray(np.vstack([luma, chroma]), format="yuv420p")


def decode_frame_id(frame: av.VideoFrame) -> int | None:
    """The id in ``frame``, or None when the code is unreadable (a row and its complement disagree)."""
    luma = frame.to_ndarray(format="gray")
    block_w, block_h, x0 = _layout(frame.width, frame.height)

    def row_bits(y0: int) -> np.ndarray:
        # Mean of the central half of each block (its edges are where VP8 ringing lives), thresholded.
        band = luma[y0 + block_h // 4 : y0 + block_h * 3 // 4, x0 : x0 + BITS * block_w]
        return band.reshape(band.shape[0], BITS, block_w)[:, :, block_w // 4 : block_w * 3 // 4].mean(axis=(0, 2)) > 128

    bits, check = row_bits(0), row_bits(block_h)
    if (bits == check).any():
        return None
    return int(sum(int(b) << (BITS - 1 - i) for i, b in enumerate(bits)))


_ids = itertools.count(1)  # process-wide (ids unique for 65535 frames): a late answer from an earlier leg cannot match


class FrameCodeTrack(MediaStreamTrack):
    """Synthetic video at a fixed rate; records when each frame id is handed to aiortc."""

    kind = "video"

    def __init__(self, width: int, height: int, fps: float) -> None:
        super().__init__()
        self.width, self.height, self.fps = width, height, fps
        self.sent: dict[int, float] = {}  # frame id -> perf_counter() when recv() handed it over
        self.first = asyncio.Event()
        self._n = 0
        self._start: float | None = None

    async def recv(self) -> av.VideoFrame:
        if self.readyState != "live":
            raise MediaStreamError
        if self._start is None:
            self._start = time.perf_counter()
        else:  # pace against the ideal schedule, not the previous frame, so sleep jitter does not accumulate
            await asyncio.sleep(max(0.0, self._start + self._n / self.fps - time.perf_counter()))
        frame_id = next(_ids) & 0xFFFF
        frame = make_frame(frame_id, self.width, self.height, self._n)
        frame.pts = round(self._n * CLOCK_RATE / self.fps)
        frame.time_base = Fraction(1, CLOCK_RATE)
        self._n += 1
        self.sent[frame_id] = time.perf_counter()
        self.first.set()
        return frame


# ---------------------------------------------------------------------------- one leg's bookkeeping


@dataclass
class Leg:
    setup: str
    sent: dict[int, float]
    window: tuple[float, float]
    arrived: dict[int, float] = field(default_factory=dict)
    unmatched: int = 0  # answers naming a frame this leg never sent (a misread code)
    undecodable: int = 0  # frames the server could not read an id from
    notes: str = ""

    def arrive(self, frame_id: int, at: float) -> None:
        if frame_id in self.sent:
            self.arrived.setdefault(frame_id, at)
        else:
            self.unmatched += 1

    @property
    def measured(self) -> list[int]:
        lo, hi = self.window
        return [i for i, t in self.sent.items() if lo <= t < hi]

    @property
    def latencies_ms(self) -> list[float]:
        return [(self.arrived[i] - self.sent[i]) * 1000.0 for i in self.measured if i in self.arrived]


@dataclass
class Options:
    seconds: float
    fps: float
    width: int
    height: int
    warmup: float
    grace: float
    rounds: int


async def _stream(track: FrameCodeTrack, opts: Options, per_leg: float) -> tuple[float, float]:
    """Let the track run through warm-up, the measured window and a grace period; return the window."""
    await asyncio.wait_for(track.first.wait(), 20.0)
    start = min(track.sent.values())
    await asyncio.sleep(max(0.0, start + opts.warmup + per_leg + opts.grace - time.perf_counter()))
    return start + opts.warmup, start + opts.warmup + per_leg


# ---------------------------------------------------------------------------- bare aiortc echo


async def bare_leg(opts: Options, per_leg: float) -> Leg:
    """Client and echo peer in this process; the SDP is handed across directly (no signalling server)."""
    config = RTCConfiguration(iceServers=[])
    client, echo = RTCPeerConnection(config), RTCPeerConnection(config)
    track = FrameCodeTrack(opts.width, opts.height, opts.fps)
    leg = Leg("bare", track.sent, (0.0, 0.0))
    results = client.createDataChannel("results")
    opened = asyncio.Event()
    results.on("open", opened.set)
    results.on("message", lambda raw: leg.arrive(json.loads(raw)["frame"], time.perf_counter()))
    back: list[RTCDataChannel] = []
    tasks: list[asyncio.Task[None]] = []

    async def echo_frames(remote: MediaStreamTrack) -> None:
        while True:
            try:
                frame = await remote.recv()
            except MediaStreamError:
                return
            frame_id = decode_frame_id(frame)
            if frame_id is None:
                leg.undecodable += 1
            elif back and back[0].readyState == "open":
                back[0].send(json.dumps({"frame": frame_id}))

    echo.on("datachannel", back.append)
    echo.on("track", lambda remote: tasks.append(asyncio.create_task(echo_frames(remote))))
    client.addTrack(track)
    try:
        await client.setLocalDescription(await client.createOffer())
        await echo.setRemoteDescription(client.localDescription)
        await echo.setLocalDescription(await echo.createAnswer())
        await client.setRemoteDescription(echo.localDescription)
        await asyncio.wait_for(opened.wait(), 20.0)
        leg.window = await _stream(track, opts, per_leg)
    finally:
        await client.close()
        await echo.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return leg


# ---------------------------------------------------------------------------- Vigil


class FrameCodeAnalyzer:
    """Bench seam: a VideoAnalyzer that 'detects' the frame's code, so each frame's answer can be matched."""

    name = "bench-frame-code"

    def __init__(self, on_undecodable: Callable[[], None]) -> None:
        self._on_undecodable = on_undecodable

    def configure(self, config: object) -> None:
        return None  # no zones or rates to follow

    async def analyze(self, sampled: SampledFrame) -> DetectionResult | None:
        started = time.perf_counter()
        frame_id = decode_frame_id(sampled.frame)
        if frame_id is None:
            self._on_undecodable()
            return None
        obj = {"label": f"{LABEL_PREFIX}{frame_id}", "class_id": 0, "conf": 1.0, "box": [0.0, 0.0, 1.0, 1.0]}
        return DetectionResult(sampled.frame.width, sampled.frame.height, [obj],
                               (time.perf_counter() - started) * 1000.0, self.name)


class VigilServer:
    """The real app on 127.0.0.1 (ephemeral port), started once and shared by all Vigil legs."""

    def __init__(self, opts: Options) -> None:
        self.current: Leg | None = None  # the leg whose undecodable frames the analyser counts
        self.data = tempfile.TemporaryDirectory(prefix="vigil-bench-transport-")  # never the checkout's data/
        settings = load_settings(None, with_data_dirs({
            "webrtc": {"host_addresses": ["127.0.0.1"]},
            "video": {"target_fps": min(120.0, opts.fps * 2)},  # above the send rate: nothing sampled away
        }, Path(self.data.name)))
        self.app = create_app(settings, Analyzers(video=lambda: FrameCodeAnalyzer(self._undecodable)))
        self.runner: web.AppRunner | None = None
        self.url = ""

    def _undecodable(self) -> None:
        if self.current is not None:
            self.current.undecodable += 1

    async def start(self) -> None:
        self.runner = await start_serving(self.app, "127.0.0.1", 0, shutdown_timeout=2.0)
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


async def vigil_leg(server: VigilServer, opts: Options, per_leg: float) -> Leg:
    track = FrameCodeTrack(opts.width, opts.height, opts.fps)
    leg = Leg("vigil", track.sent, (0.0, 0.0))
    server.current = leg
    counts: dict[str, Any] = {}

    def on_message(message: dict[str, Any], arrived: float) -> None:
        if message.get("type") == "detections":
            for obj in message["objects"]:
                if obj["label"].startswith(LABEL_PREFIX):
                    leg.arrive(int(obj["label"].removeprefix(LABEL_PREFIX)), arrived)
        elif message.get("type") == "metrics":
            counts.update(message["media"]["video"])

    client = VigilClient(server.url)
    client.on_message = on_message
    try:
        await client.connect([track])
        leg.window = await _stream(track, opts, per_leg)
    finally:
        await client.close()  # DELETE first, so the final metrics (with the drop count) arrive
        server.current = None
    # Vigil's own counters show where a missing frame went: never decoded, sampled away, or dropped by the slot.
    leg.notes = " ".join(f"{k}={counts.get(k, '?')}" for k in ("frames_in", "frames_sampled", "frames_dropped"))
    return leg


# ---------------------------------------------------------------------------- report


def _stats(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return (values[0], values[0]) if values else (float("nan"), float("nan"))
    return statistics.median(values), statistics.quantiles(values, n=20, method="inclusive")[18]


def report(legs: list[Leg], fps: float) -> None:
    print(f"{'leg':<4}{'setup':<7}{'sent':>6}{'recv':>6}{'lost':>6}{'unmatched':>10}{'undecodable':>12}"
          f"{'median':>9}{'p95':>9}  notes")
    for n, leg in enumerate(legs, 1):
        measured, lat = leg.measured, leg.latencies_ms
        med, p95 = _stats(lat)
        print(f"{n:<4}{leg.setup:<7}{len(measured):>6}{len(lat):>6}{len(measured) - len(lat):>6}{leg.unmatched:>10}"
              f"{leg.undecodable:>12}{med:>9.2f}{p95:>9.2f}  {leg.notes}")
    print()
    summary: dict[str, tuple[float, float]] = {}
    for setup in ("bare", "vigil"):
        mine = [leg for leg in legs if leg.setup == setup]
        sent = sum(len(leg.measured) for leg in mine)
        lat = [x for leg in mine for x in leg.latencies_ms]
        summary[setup] = _stats(lat)
        print(f"{setup:<6} sent={sent} received={len(lat)} lost={sent - len(lat)} "
              f"unmatched={sum(leg.unmatched for leg in mine)} undecodable={sum(leg.undecodable for leg in mine)} "
              f"median={summary[setup][0]:.2f} ms p95={summary[setup][1]:.2f} ms")
    (bare_med, bare_p95), (vigil_med, vigil_p95) = summary["bare"], summary["vigil"]
    print(f"ratio vigil/bare: median {vigil_med / bare_med:.2f}x  p95 {vigil_p95 / bare_p95:.2f}x")
    print(f"(both include ~1 frame interval, {1000 / fps:.1f} ms: aiortc's jitter buffer releases a video frame "
          "only when the next frame's first packet arrives)")


async def main(opts: Options) -> list[Leg]:
    restrict_host_addresses(["127.0.0.1"])  # aioice would otherwise gather every interface
    server = VigilServer(opts)
    await server.start()
    per_leg = opts.seconds / opts.rounds
    legs: list[Leg] = []
    try:
        for r in range(opts.rounds):
            # A-B then B-A: each setup goes first equally often, so warming/drift does not favour one.
            for setup in ("bare", "vigil") if r % 2 == 0 else ("vigil", "bare"):
                leg = await (bare_leg(opts, per_leg) if setup == "bare" else vigil_leg(server, opts, per_leg))
                legs.append(leg)
    finally:
        await server.stop()
    return legs


def parse_args(argv: list[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per setup, over all rounds")
    parser.add_argument("--fps", type=float, default=15.0)
    parser.add_argument("--width", type=int, default=320)
    parser.add_argument("--height", type=int, default=240)
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds discarded at the start of every leg")
    parser.add_argument("--grace", type=float, default=0.5, help="seconds to wait for late answers after a leg")
    parser.add_argument("--rounds", type=int, default=2, help="1: bare then vigil; 2: bare, vigil, vigil, bare")
    a = parser.parse_args(argv)
    if a.width % 2 or a.height % 2:
        parser.error("--width and --height must be even (yuv420p)")
    return Options(a.seconds, a.fps, a.width, a.height, a.warmup, a.grace, max(1, a.rounds))


def run(argv: list[str] | None = None) -> None:
    opts = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    print(f"transport benchmark: {opts.width}x{opts.height} @ {opts.fps:g} fps, {opts.seconds:g} s measured per "
          f"setup in {opts.rounds} round(s), {opts.warmup:g} s warm-up discarded per leg; latency in ms", flush=True)
    started = time.perf_counter()
    legs = asyncio.run(main(opts))
    report(legs, opts.fps)
    print(f"total wall time {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        run()
