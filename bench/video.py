"""Video analysis benchmark: pipeline overhead, conversion savings and batching gain, as ratios from one run.

Model: yolo11n-pose (the packaged weights) at each ``--imgsz``. Input: a 30 fps 640x480 H.264 slideshow of real
photos (people, a bus, ...) written on the spot with ``tests.support.media.slideshow``; nothing is downloaded.

* P1, pipeline overhead: analysed frames/s through N ``SessionPipeline``s (wall clock, their own workers,
  ``DetectorVideoAnalyzer`` over one shared ``InferenceBatcher`` with ``--max-batch``/``--max-wait-ms``, the server
  defaults) ÷ ``detector.detect`` in a tight loop on the same frames pre-converted to BGR (batches of 1 for one
  stream, of 4 for four). Goal >= 0.9.
  Feeding: each stream is handed its next decoded ``av.VideoFrame`` the moment its worker takes the previous one
  from the latest-frame slot, so the slot always holds work (as with a camera faster than the analysis) yet no
  CPU is spent on frames that would only be dropped; ``target_fps`` is 120, so sampling never skips a frame.
* P2, CPU per stream: process CPU seconds (all threads) to replay the 30 fps file sampled at 5 fps with a
  ``VirtualClock`` through ``ContainerSource`` (decoding included), Vigil (only sampled frames are converted,
  inside the batcher) ÷ a naive variant that converts every decoded frame to BGR before sampling and runs the
  same detector on the sampled arrays. Both analyse the same frames. Goal <= 0.5. Two extra rows (decoding
  alone, decoding + converting every frame) show where the CPU goes.
* P3, batching gain: throughput of 8 streams with ``max_batch=8`` ÷ the same 8 streams with ``max_batch=1``.
  Goal >= 1.25 (this CPU).

Throughput is counted between detector-call boundaries: frames in the calls that end after a leg's first call
(the first call of every leg is warm-up), over the time from the end of that first call to the end of the last;
so a batch is never half counted, and every gap the pipeline leaves between calls is in the time. Each pair of
setups runs A-B-B-A (half of ``--seconds`` per leg) to spread drift; the ratios are the point, not the fps.

Run (about 3 minutes on 2 CPU cores with the defaults)::

    cd /work/main && .venv/bin/python -m bench.video
    cd /work/main && .venv/bin/python -m bench.video --device cuda --seconds 6   # a GPU host (fp16)
"""

from __future__ import annotations

import os

os.environ.setdefault("YOLO_OFFLINE", "1")  # before anything imports ultralytics

import argparse
import asyncio
import contextlib
import logging
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, cast

import av
import numpy as np

from models.detector import Detection, Detector
from models.detectors import load_detector
from pipelines.clock import VirtualClock, WallClock
from pipelines.protocol import SessionConfig, VideoSessionConfig
from pipelines.session import DetectionResult, SampledFrame, SessionPipeline, VideoAnalyzer
from pipelines.sources.container import ContainerSource, SourceState
from pipelines.video.analyzer import DetectorVideoAnalyzer
from pipelines.video.batcher import InferenceBatcher, to_bgr
from tests.support.media import slideshow

FPS = 30
SIZE = (640, 480)
SAMPLED_FPS = 5.0  # P2's target rate
UNSAMPLED_FPS = 120.0  # P1/P3: above the feed rate, so every fed frame is due


def _discard(message: Any) -> None:
    return None


# ---------------------------------------------------------------------------- measuring


@dataclass(slots=True)
class Rate:
    frames: int = 0
    seconds: float = 0.0
    calls: int = 0
    analyzed: int = 0  # the pipelines' own frames_analyzed (a cross-check; 0 for raw legs)

    def __add__(self, other: Rate) -> Rate:
        return Rate(self.frames + other.frames, self.seconds + other.seconds, self.calls + other.calls,
                    self.analyzed + other.analyzed)

    @property
    def fps(self) -> float:
        return self.frames / self.seconds if self.seconds else float("nan")


class TimedDetector:
    """Wraps the detector, recording the end time and size of every call (the batch boundaries)."""

    def __init__(self, inner: Detector) -> None:
        self.inner, self.name, self.device = inner, inner.name, inner.device
        self.calls: list[tuple[float, int]] = []
        self.first = threading.Event()  # the first call ended
        self.idle = threading.Event()  # no call in progress
        self.idle.set()

    def detect(self, images: list[np.ndarray]) -> list[list[Detection]]:
        self.idle.clear()
        try:
            return self.inner.detect(images)
        finally:
            self.calls.append((time.perf_counter(), len(images)))
            self.first.set()
            self.idle.set()

    def rate(self, until: float = float("inf")) -> Rate:
        calls = [c for c in self.calls if c[0] <= until]
        if len(calls) < 2:
            return Rate()
        return Rate(sum(n for _, n in calls[1:]), calls[-1][0] - calls[0][0], len(calls) - 1)


def raw_leg(detector: Detector, images: list[np.ndarray], batch: int, seconds: float) -> Rate:
    timed = TimedDetector(detector)
    index = 0
    while len(timed.calls) < 1 or time.perf_counter() < timed.calls[0][0] + seconds:
        timed.detect([images[(index + j) % len(images)] for j in range(batch)])
        index += batch
    return timed.rate()


class RefillingAnalyzer:
    """``DetectorVideoAnalyzer`` plus a signal to the feeder: the worker took a frame, so refill the slot."""

    def __init__(self, inner: DetectorVideoAnalyzer, taken: asyncio.Event) -> None:
        self.inner, self.name, self.taken = inner, inner.name, taken

    def configure(self, config: VideoSessionConfig) -> None:
        self.inner.configure(config)

    async def analyze(self, sampled: SampledFrame) -> DetectionResult:
        self.taken.set()
        return await self.inner.analyze(sampled)


async def _feed(pipeline: SessionPipeline, frames: list[av.VideoFrame], offset: int, taken: asyncio.Event) -> None:
    for index in range(10**9):
        frame = frames[(offset + index) % len(frames)]
        assert frame.time_base is not None
        frame.pts = round(Fraction(index, FPS) / frame.time_base)  # read at once by feed_video: sharing is safe
        taken.clear()
        await pipeline.feed_video(frame)
        await taken.wait()


async def pipeline_leg(detector: Detector, frames: list[av.VideoFrame], streams: int, max_batch: int,
                       max_wait_ms: float, seconds: float) -> Rate:
    timed = TimedDetector(detector)
    batcher = InferenceBatcher(timed, max_batch=max_batch, max_wait_ms=max_wait_ms)
    config = SessionConfig(video=VideoSessionConfig(target_fps=UNSAMPLED_FPS))
    pipelines: list[SessionPipeline] = []
    feeders: list[asyncio.Task[None]] = []
    for k in range(streams):
        taken = asyncio.Event()
        pipeline = SessionPipeline(f"bench-{k}", origin="bench", clock=WallClock(), emit=_discard, config=config,
                                   server_version="bench",
                                   video_analyzer=RefillingAnalyzer(DetectorVideoAnalyzer(batcher), taken))
        pipeline.start()
        pipelines.append(pipeline)
        feeders.append(asyncio.create_task(_feed(pipeline, frames, k * len(frames) // streams, taken)))
    try:
        await asyncio.to_thread(timed.first.wait)
        until = timed.calls[0][0] + seconds
        await asyncio.sleep(until - time.perf_counter())
        rate = timed.rate(until)
        rate.analyzed = sum(p.counts.video.frames_analyzed for p in pipelines)
    finally:
        for task in feeders:
            task.cancel()
        await asyncio.gather(*feeders, return_exceptions=True)
        for pipeline in pipelines:
            await pipeline.close()
        await batcher.close()
        await asyncio.to_thread(timed.idle.wait)  # the executor may still finish a batch: keep it out of the next leg
    return rate


async def abba(a: Callable[[float], Awaitable[Rate]], b: Callable[[float], Awaitable[Rate]], seconds: float
               ) -> tuple[Rate, Rate]:
    """A-B-B-A with half the time per leg; each side's legs pooled."""
    ra1, rb1 = await a(seconds / 2), await b(seconds / 2)
    rb2, ra2 = await b(seconds / 2), await a(seconds / 2)
    return ra1 + ra2, rb1 + rb2


# ---------------------------------------------------------------------------- P2: CPU per stream


class ArrayAnalyzer:
    """The naive variant's analyser: detects on the array its feeder already converted."""

    def __init__(self, detector: Detector) -> None:
        self.detector, self.name = detector, detector.name
        self.current: np.ndarray | None = None

    def configure(self, config: VideoSessionConfig) -> None:
        return None

    async def analyze(self, sampled: SampledFrame) -> DetectionResult:
        assert self.current is not None
        started = time.perf_counter()
        detections = self.detector.detect([self.current])[0]
        return DetectionResult(sampled.frame.width, sampled.frame.height, [d.as_message() for d in detections],
                               (time.perf_counter() - started) * 1000.0, self.name)


class ConvertEveryFrame:
    """What ContainerSource feeds in the naive variant: every decoded frame is converted before sampling."""

    def __init__(self, pipeline: SessionPipeline, analyzer: ArrayAnalyzer | None) -> None:
        self.pipeline, self.analyzer = pipeline, analyzer

    def add_track(self, kind: str) -> None:
        self.pipeline.add_track(kind)

    async def feed_video(self, frame: av.VideoFrame) -> None:
        image = frame.to_ndarray(format="bgr24")
        if self.analyzer is not None:
            self.analyzer.current = image
        await self.pipeline.feed_video(frame)

    async def feed_audio(self, frame: av.AudioFrame) -> None:
        await self.pipeline.feed_audio(frame)


@dataclass(slots=True)
class CpuRun:
    name: str
    cpu_s: float
    wall_s: float
    frames_in: int
    analyzed: int


async def cpu_run(name: str, path: Path, detector: Detector | None, *, naive: bool, max_batch: int,
                  max_wait_ms: float) -> CpuRun:
    batcher = InferenceBatcher(detector, max_batch=max_batch, max_wait_ms=max_wait_ms) if detector and not naive \
        else None
    analyzer: VideoAnalyzer | None = None
    if detector is not None:
        analyzer = ArrayAnalyzer(detector) if naive else DetectorVideoAnalyzer(cast(InferenceBatcher, batcher))
    pipeline = SessionPipeline(name, origin="bench", clock=VirtualClock(), emit=_discard, server_version="bench",
                               config=SessionConfig(video=VideoSessionConfig(target_fps=SAMPLED_FPS)),
                               video_analyzer=analyzer)
    target = ConvertEveryFrame(pipeline, cast(ArrayAnalyzer | None, analyzer)) if naive else pipeline
    source = ContainerSource(str(path), cast(SessionPipeline, target), kind="file", realtime=False)
    cpu, wall = time.process_time(), time.perf_counter()
    pipeline.start()
    await source.start()
    await pipeline.close()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    if batcher is not None:
        await batcher.close()
    if source.state != SourceState.ENDED:
        raise RuntimeError(f"{name}: source ended in state {source.state} {source.state_detail}")
    return CpuRun(name, cpu, wall, pipeline.counts.video.frames_in, pipeline.counts.video.frames_analyzed)


# ---------------------------------------------------------------------------- report


def _verdict(ratio: float, goal: float, at_least: bool) -> str:
    met = ratio >= goal if at_least else ratio <= goal
    return f"(goal {'>=' if at_least else '<='} {goal:g}: {'met' if met else 'NOT met'})"


def _row(name: str, streams: int, batch: str, rate: Rate) -> str:
    analyzed = str(rate.analyzed) if rate.analyzed else "-"
    mean = f"{rate.frames / rate.calls:.2f}" if rate.calls else "-"
    return (f"  {name:<26}{streams:>8}{batch:>7}{rate.calls:>7}{mean:>7}{rate.frames:>8}{analyzed:>10}"
            f"{rate.seconds:>9.2f}{rate.fps:>9.2f}")


async def bench_imgsz(imgsz: int, opts: argparse.Namespace, clip: Path, frames: list[av.VideoFrame],
                      images: list[np.ndarray]) -> list[str]:
    import torch

    detector = load_detector("yolo", imgsz=imgsz, device=opts.device, half=opts.device.startswith("cuda"))
    mb, wait, seconds = opts.max_batch, opts.max_wait_ms, opts.seconds

    def raw(batch: int) -> Callable[[float], Awaitable[Rate]]:
        async def leg(s: float) -> Rate:
            return raw_leg(detector, images, batch, s)
        return leg

    def pipe(streams: int, max_batch: int) -> Callable[[float], Awaitable[Rate]]:
        return lambda s: pipeline_leg(detector, frames, streams, max_batch, wait, s)

    raw1, pipe1 = await abba(raw(1), pipe(1, mb), seconds)
    raw4, pipe4 = await abba(raw(4), pipe(4, mb), seconds)
    on8, off8 = await abba(pipe(8, mb), pipe(8, 1), seconds)
    raw8 = await raw(8)(seconds / 2)
    runs = [await cpu_run("decode only", clip, None, naive=False, max_batch=mb, max_wait_ms=wait),
            await cpu_run("decode + convert all", clip, None, naive=True, max_batch=mb, max_wait_ms=wait),
            await cpu_run("vigil", clip, detector, naive=False, max_batch=mb, max_wait_ms=wait),
            await cpu_run("naive (convert all)", clip, detector, naive=True, max_batch=mb, max_wait_ms=wait)]

    print(f"\nimgsz={imgsz}: {detector.name} on {opts.device}, torch threads {torch.get_num_threads()}, "
          f"max_wait_ms={wait:g}")
    print(f"  {'throughput (wall clock)':<26}{'streams':>8}{'batch':>7}{'calls':>7}{'mean':>7}{'frames':>8}"
          f"{'analysed':>10}{'seconds':>9}{'fps':>9}")
    for row in [_row("P1 raw detect", 1, "1", raw1), _row("P1 pipeline", 1, f"<={mb}", pipe1),
                _row("P1 raw detect", 4, "4", raw4), _row("P1 pipeline", 4, f"<={mb}", pipe4),
                _row("P3 pipeline batched", 8, f"<={mb}", on8), _row("P3 pipeline batching off", 8, "1", off8),
                _row("(ref) raw detect", 8, "8", raw8)]:
        print(row)
    clip_s = runs[0].frames_in / FPS
    print(f"  {'P2 CPU, 1 stream, ' + str(FPS) + '->' + f'{SAMPLED_FPS:g} fps':<30}{'frames':>8}{'analysed':>10}"
          f"{'cpu s':>9}{'wall s':>9}{'cpu s/media s':>15}{'cpu ms/frame in':>17}")
    for r in runs:
        print(f"  {r.name:<30}{r.frames_in:>8}{r.analyzed:>10}{r.cpu_s:>9.2f}{r.wall_s:>9.2f}"
              f"{r.cpu_s / clip_s:>15.3f}{1000 * r.cpu_s / r.frames_in:>17.2f}")

    lines = []
    for streams, p, r in ((1, pipe1, raw1), (4, pipe4, raw4)):
        ratio = p.fps / r.fps
        gap = 1000 * (p.seconds / p.calls - r.seconds / r.calls) if p.calls and r.calls else float("nan")
        lines.append(f"P1 imgsz={imgsz} streams={streams}: pipeline {p.fps:.2f} fps / raw {r.fps:.2f} fps = "
                     f"{ratio:.2f} {_verdict(ratio, 0.9, True)}  [+{gap:.1f} ms per detector call]")
    vigil, naive = runs[2], runs[3]
    ratio = vigil.cpu_s / naive.cpu_s
    lines.append(f"P2 imgsz={imgsz}: vigil {vigil.cpu_s:.2f} cpu s / naive {naive.cpu_s:.2f} cpu s per stream "
                 f"({clip_s:g} s at {FPS} fps, {vigil.analyzed} analysed) = {ratio:.2f} {_verdict(ratio, 0.5, False)}")
    ratio = on8.fps / off8.fps
    lines.append(f"P3 imgsz={imgsz} streams=8: batched {on8.fps:.2f} fps / batching off {off8.fps:.2f} fps = "
                 f"{ratio:.2f} {_verdict(ratio, 1.25, True)}  [raw batch 8 / raw batch 1: "
                 f"{raw8.fps / raw1.fps:.2f}]")
    for line in lines:
        print(line, flush=True)
    return lines


class _CountDeprecations(logging.Filter):
    """ultralytics 8.4 logs "'half' is deprecated" on every predict call given half=...: count, don't print."""

    count = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if "is deprecated" in record.getMessage():
            self.count += 1
            return False
        return True


async def main(opts: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="vigil-bench-") as tmp:
        third = opts.seconds / 3
        clip = slideshow(Path(tmp) / "clip.mp4", [("bus", third), ("zidane", third), ("astronaut", third)],
                         fps=FPS, size=SIZE)
        with av.open(str(clip)) as container:
            frames = list(container.decode(video=0))
        images = [to_bgr(frame) for frame in frames]
        print(f"clip: {len(frames)} frames, {SIZE[0]}x{SIZE[1]} @ {FPS} fps; {opts.seconds:g} s measured per setup "
              "(A-B-B-A legs of half that); fps counted between detector-call boundaries", flush=True)
        summary = [line for imgsz in opts.imgsz for line in await bench_imgsz(imgsz, opts, clip, frames, images)]
    print("\nsummary")
    for line in summary:
        print(line)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--imgsz", type=int, nargs="+", default=[320, 640])
    parser.add_argument("--seconds", type=float, default=8.0,
                        help="measured seconds per setup (split over its two legs); also the P2 clip's length")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (CUDA runs fp16)")
    parser.add_argument("--max-batch", type=int, default=8, help="the batcher's max_batch (P1, P3 batched)")
    parser.add_argument("--max-wait-ms", type=float, default=10.0, help="the batcher's max_wait_ms")
    return parser.parse_args(argv)


def run(argv: list[str] | None = None) -> None:
    opts = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    from ultralytics.utils import LOGGER  # after YOLO_OFFLINE is set

    deprecations = _CountDeprecations()
    LOGGER.addFilter(deprecations)
    started = time.perf_counter()
    asyncio.run(main(opts))
    print(f"total wall time {time.perf_counter() - started:.1f} s; ultralytics deprecation warnings suppressed: "
          f"{deprecations.count}")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        run()
