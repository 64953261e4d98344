"""Cameras mode of ``bench/capacity.py``: what a camera costs and how many one node watches.

``python -m bench.capacity --cameras 1,4,8 [--seconds 15]`` serves ``vigil serve`` (default config, loopback ICE,
its ``sources.media_root`` a temporary folder) and, for each N, plays N looped real-time file sources
(``realtime: true, loop: true``) made here from real photographs: a photo letterboxed to 640x480 with Gaussian
sensor noise on every frame (no two frames, no two cameras bit-identical), H.264 in MP4 at 10 or 15 fps, analysed at
5 fps. Per N, three phases, each figure measured at the client (the results WebSockets, in this process):

- static: every scene empty. The server process's CPU (cores, from /proc/PID/stat) ÷ the decode-only floor: PyAV
  decoding the same N files in real time in a process of its own (measured alone, before any server runs).
- staggered: a person (cut from zidane.jpg) crosses each scene in turn, one camera at a time, with one live voice
  loop (Piper-spoken questions, the capacity step's ``VoiceSession``) beside them: per camera the analysed rate
  while the person is in view (``detections`` messages per second whose pts fall in the known in-view windows)
  ÷ target fps, zone events (a zone across the middle third) against the reference, and the heard voice-to-voice
  median against the same voice loop with no camera.
- all moving: the person crosses every scene at once (no voice loop: the server's CPU is the cameras' own).

Reference for zone-event recall: each camera's pass (the same frames, with 1 s of the same noisy scene before and
after) analysed as fast as possible (``realtime: false``: media time, nothing dropped) by a server with detection
on every sampled frame (``video.motion.enabled: false``). When the served checkout has motion gating, every phase
runs twice, gated (the default) and ungated, side by side; when it refuses the key, it says "motion gating not
available" and runs the default (ungated) only.

N holds when, in the staggered phase, every camera gets >= 0.9 of its target rate while the person is in view,
zone-event recall is 100 %, the voice loop's heard v2v is within +20 % of its idle median, and the static scenes
cost <= 2x decode-only (the issue's goals). The machine may be shared: the load average is printed beside figures.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

SIZE = (640, 480)
SLOT_S = 3.0  # one pass: the person's centre crosses the frame from the left edge to the right edge
# After the last pass of a loop, an empty scene longer than the recorder's clip tail (storage.post_s, 3 s), so
# each pass's clip is normally cut within its own loop. (Before 35bf703 a looping file source closed its clip
# template on reopening the file while a clip could still be remuxed from it: vigil serve segfaulted here.)
TAIL_S = 3.5
MOVING_GAP_S = 0.5  # all moving: the empty scene before the pass
STATIC_S = 6.0  # length of an empty scene's loop
STATIC_SETTLE_S = 8.0  # seconds before a static phase is measured (its sources' start-up is not a quiet camera)
REFERENCE_MARGIN_S = 1.0  # reference clips: the empty scene before and after the pass
FPS_CHOICES = (10, 15)  # source frame rates, alternating by camera (both multiples of the 5 fps target)
NOISE_SIGMA = 3.0  # sensor noise, grey levels
NOISE_FIELDS = 16
BACKGROUNDS = ("coffee", "brick", "rocket", "hubble_deep_field", "coins", "moon", "gravel",
               "grass")  # real photographs (skimage.data, installed) in which the default detector finds no person
ZONE = {"name": "middle", "polygon": [[0.4, 0.0], [0.6, 0.0], [0.6, 1.0], [0.4, 1.0]]}  # the person crosses it
ZONE_EVENTS = ("zone.enter", "zone.exit")
TARGET_FPS = 5.0
LOOP_GAP_S = 1e-3  # ContainerSource starts a loop 1 ms after the previous loop's last frame (media time)


# ---------------------------------------------------------------------- clips and where the person is


@dataclass(frozen=True)
class Clip:
    """One camera's looped file: ``frames`` at ``fps``; the person in view in frames [first, end) of each loop."""

    name: str
    fps: int
    frames: int
    in_view: tuple[int, int] | None = None

    @property
    def period(self) -> float:
        """Media seconds per loop as the server's file source chains loops (pts restart 1 ms after the last)."""
        return (self.frames - 1) / self.fps + LOOP_GAP_S

    def loop_in_view(self, pts: float) -> int | None:
        """The loop whose in-view window holds media time ``pts`` (a detection's or an event's), else None."""
        if self.in_view is None:
            return None
        loop = math.floor((pts + 1e-4) / self.period)
        within = pts - loop * self.period
        first, end = self.in_view
        if first / self.fps - 1e-3 <= within <= (end - 1) / self.fps + 1e-3:
            return loop
        return None

    def complete_windows(self, frames_from: int, frames_to: int) -> list[int]:
        """Loops whose whole in-view window lies between two of the source's frame counts (its ``frames_in``)."""
        if self.in_view is None or frames_to <= frames_from:
            return []
        first, end = self.in_view
        loop = max(0, -((first - frames_from) // self.frames))  # the first loop whose window starts in range
        out: list[int] = []
        while loop * self.frames + end <= frames_to:
            out.append(loop)
            loop += 1
        return out

    @property
    def window_s(self) -> float:
        assert self.in_view is not None
        return (self.in_view[1] - self.in_view[0]) / self.fps



def clip_plan(scenario: str, camera: int, cameras: int) -> tuple[str, int, float, float | None]:
    """(file name, fps, seconds, pass start in seconds or None) of one camera's clip in one scenario."""
    fps = FPS_CHOICES[camera % len(FPS_CHOICES)]
    if scenario == "static":
        return f"static-{camera}.mp4", fps, STATIC_S, None
    if scenario == "staggered":  # camera j's pass in slot j: one camera at a time has someone in view
        return f"staggered-{cameras}-{camera}.mp4", fps, cameras * SLOT_S + TAIL_S, camera * SLOT_S
    if scenario == "moving":  # every camera's pass at once
        return f"moving-{camera}.mp4", fps, MOVING_GAP_S + SLOT_S + TAIL_S, MOVING_GAP_S
    if scenario == "reference":
        return f"reference-{camera}.mp4", fps, SLOT_S + 2 * REFERENCE_MARGIN_S, REFERENCE_MARGIN_S
    raise ValueError(scenario)


def make_clip(media: Path, scenario: str, camera: int, cameras: int) -> Clip:
    """Write (once) and describe one camera's clip under the media root."""
    name, fps, seconds, start = clip_plan(scenario, camera, cameras)
    frames = round(seconds * fps)
    in_view = None if start is None else (round(start * fps), round(start * fps) + round(SLOT_S * fps))
    clip = Clip(name, fps, frames, in_view)
    if not (media / name).exists():
        _write(media / name, clip, camera)
    return clip


def _background(camera: int) -> np.ndarray:
    from tests.support.media import letterbox, real_image

    image = real_image(BACKGROUNDS[camera % len(BACKGROUNDS)])
    if image.ndim == 2:
        image = np.stack([image] * 3, axis=-1)
    return letterbox(image[..., :3], SIZE)


def _person() -> np.ndarray:
    import cv2

    from tests.support.media import real_image

    person = real_image("zidane")[60:720, 700:1130]  # the man on the right, head to knees
    height = int(SIZE[1] * 0.7)
    return cv2.resize(person, (int(person.shape[1] * height / person.shape[0]), height))


def _write(path: Path, clip: Clip, camera: int) -> None:
    """Frames: the scene + noise (a field chosen by the frame's distance to the pass, so a reference clip's pass
    has the same pixels as the live clip's) + the person, its centre moving left edge -> right edge."""
    import av

    width, height = SIZE
    scene = _background(camera).astype(np.int16)
    rng = np.random.default_rng(1000 + camera)
    noise = [rng.normal(0, NOISE_SIGMA, scene.shape).round().astype(np.int16) for _ in range(NOISE_FIELDS)]
    person = _person()
    first, end = clip.in_view or (0, 0)
    top = height - person.shape[0] - 20
    tmp = path.with_suffix(".part.mp4")
    with av.open(str(tmp), "w") as container:
        stream = container.add_stream("libx264", rate=clip.fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        # A camera's usual GOP (2 s); crf 23: noise costs bits as it would on a real camera.
        stream.options = {"preset": "ultrafast", "crf": "23", "x264-params": f"keyint={2 * clip.fps}"}
        for index in range(clip.frames):
            picture = scene + noise[(index - first) % NOISE_FIELDS]
            if first <= index < end:
                centre = round(width * (index - first) / max(end - first - 1, 1))
                left = centre - person.shape[1] // 2
                x0, x1 = max(left, 0), min(left + person.shape[1], width)
                picture[top: top + person.shape[0], x0:x1] = person[:, x0 - left: x1 - left]
            frame = av.VideoFrame.from_ndarray(np.clip(picture, 0, 255).astype(np.uint8), format="rgb24")
            frame.pts, frame.time_base = index, Fraction(1, clip.fps)
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    tmp.rename(path)


# ---------------------------------------------------------------------- one camera at the client


@dataclass
class CameraWatch:
    """A source's results WebSocket: detections and zone events by media time, frame counts by arrival."""

    clip: Clip
    source_id: str
    detections: list[float] = field(default_factory=list)  # pts
    events: list[tuple[str, float]] = field(default_factory=list)  # (name, pts)
    counts: list[tuple[float, dict[str, int]]] = field(default_factory=list)  # (arrival, server's video counts)
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None

    def received(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "detections" and message.get("pts") is not None:
            self.detections.append(message["pts"])
        elif kind == "event":
            if message.get("name") in ZONE_EVENTS:
                self.events.append((message["name"], message.get("pts") or 0.0))
            elif message.get("name") == "source.state" and message["data"].get("state") in ("ended", "failed"):
                self.ended.set()
        elif kind == "metrics" and message.get("media"):
            self.counts.append((time.perf_counter(), message["media"]["video"]))

    def frames_in_at(self, at: float) -> int:
        """The server's frames-in count for this source last reported before ``at``."""
        known = [c["frames_in"] for t, c in self.counts if t <= at]
        return known[-1] if known else 0

    def stage_rates(self, since: float, until: float) -> dict[str, float]:
        window = [(t, c) for t, c in self.counts if since <= t <= until]
        if len(window) < 2:
            return {}
        (t0, first), (t1, last) = window[0], window[-1]
        return {key: (last[key] - first.get(key, 0)) / (t1 - t0) for key in last if isinstance(last[key], int)}

    def report(self, since: float, until: float, reference: dict[str, int] | None) -> dict[str, Any]:
        windows = self.clip.complete_windows(self.frames_in_at(since), self.frames_in_at(until))
        analysed = sum(1 for pts in self.detections if self.clip.loop_in_view(pts) in windows)
        rate = analysed / (len(windows) * self.clip.window_s) / TARGET_FPS if windows else float("nan")
        live = [{name: 0 for name in ZONE_EVENTS} for _ in windows]
        for name, pts in self.events:
            loop = self.clip.loop_in_view(pts)
            if loop in windows:
                live[windows.index(loop)][name] += 1
        return {"windows": len(windows), "rate": rate, "stages": self.stage_rates(since, until),
                **event_recall(live, reference)}


def event_recall(live: list[dict[str, int]], reference: dict[str, int] | None) -> dict[str, Any]:
    """Zone events of the in-view windows against the reference pass's: found (at most the reference's count per
    event name and window), expected, and extra (more than the reference: flapping)."""
    if reference is None or not live:
        return {"found": 0, "expected": 0, "extra": 0}
    found = sum(min(window.get(name, 0), count) for window in live for name, count in reference.items())
    extra = sum(max(window.get(name, 0) - reference.get(name, 0), 0) for window in live for name in window)
    return {"found": found, "expected": sum(reference.values()) * len(live), "extra": extra}


async def watch(http: aiohttp.ClientSession, url: str, clip: Clip, body: dict[str, Any]) -> CameraWatch:
    """Start a file source and follow its results WebSocket."""
    async with http.post(f"{url}/api/sources", json=body) as response:
        answer = await response.json()
        if response.status >= 400:
            raise RuntimeError(f"POST /api/sources {body}: {response.status} {answer}")
    camera = CameraWatch(clip, answer["id"])

    async def follow() -> None:
        async with http.ws_connect(f"{url}/api/sources/{camera.source_id}/results", heartbeat=20) as ws:
            async for message in ws:
                if message.type == aiohttp.WSMsgType.TEXT:
                    camera.received(json.loads(message.data))
        camera.ended.set()

    camera.task = asyncio.create_task(follow())
    return camera


async def stop(http: aiohttp.ClientSession, url: str, cameras: list[CameraWatch]) -> None:
    for camera in cameras:
        async with http.delete(f"{url}/api/sources/{camera.source_id}"):
            pass
    for camera in cameras:
        if camera.task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(camera.task, 10)


# ---------------------------------------------------------------------- the decode-only floor


def decode_forever(paths: list[str]) -> None:
    """Child process: PyAV decodes each file in real time, looped, one thread each (as a file source reads it:
    ``thread_type`` AUTO), until stdin closes."""
    import av

    def run(path: str) -> None:
        while True:
            with av.open(path) as container:
                stream = container.streams.video[0]
                stream.thread_type = "AUTO"
                started, first = time.monotonic(), None
                for frame in container.decode(stream):
                    seconds = float(frame.pts * frame.time_base)
                    first = seconds if first is None else first
                    delay = started + (seconds - first) - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)

    for path in paths:
        threading.Thread(target=run, args=(path,), daemon=True).start()
    print("ready", flush=True)
    sys.stdin.read()


def decode_floor(paths: list[Path], seconds: float, warmup: float) -> float:
    """Cores a separate process spends decoding ``paths`` in real time."""
    from bench.capacity import cpu_seconds

    proc = subprocess.Popen([sys.executable, "-m", "bench.cameras", "--decode", *map(str, paths)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[1])
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        time.sleep(warmup)
        before, started = cpu_seconds(proc.pid), time.monotonic()
        time.sleep(seconds)
        return (cpu_seconds(proc.pid) - before) / (time.monotonic() - started)
    finally:
        proc.kill()
        proc.wait()


# ---------------------------------------------------------------------- phases against one server


def motion_gating_available(workdir: Path, root: Path) -> bool:
    """Whether the served checkout accepts ``video.motion.enabled`` (``vigil config show`` refuses unknown keys)."""
    config = workdir / "motion-check.yaml"  # JSON is valid YAML; the CLI reads .yaml
    config.write_text(json.dumps({"video": {"motion": {"enabled": False}}}))
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-m", "server.cli", "config", "show", "--config", str(config)],
                          cwd=root, env=env, capture_output=True, text=True)
    return done.returncode == 0


@dataclass
class Phase:
    scenario: str
    cameras: int
    cores: float
    reports: list[dict[str, Any]]
    heard: list[float] = field(default_factory=list)


async def voice_turns(url: str, until: float, heard: list[float], min_turns: int = 2) -> None:
    """Questions on a fresh voice session (no step pays for a longer history) until ``until`` and at least
    ``min_turns`` answers."""
    from bench.capacity import VoiceSession

    voice = VoiceSession(url)
    try:
        await voice.open()
        while time.perf_counter() < until or len(heard) < min_turns:
            v2v = await voice.heard_voice_to_voice()
            if v2v is not None:
                heard.append(v2v)
            elif time.perf_counter() >= until:
                break
    finally:
        with contextlib.suppress(Exception):
            await voice.close()


async def run_phase(http: aiohttp.ClientSession, server: Any, media: Path, scenario: str, count: int,
                    seconds: float, warmup: float, references: dict[int, dict[str, int]],
                    with_voice: bool) -> Phase:
    from bench.capacity import server_cpu_seconds

    clips = [make_clip(media, scenario, camera, count) for camera in range(count)]
    body = {"realtime": True, "loop": True, "options": {"video": {"target_fps": TARGET_FPS, "zones": [ZONE]}}}
    cameras = [await watch(http, server.url, clip, {**body, "path": clip.name}) for clip in clips]
    heard: list[float] = []
    try:
        # a quiet camera's cost is its steady state: its first seconds (probe, first frame detected, background
        # learnt, recorder opened) are start-up, ~0.5 core for 8 cameras for ~6 s here
        await asyncio.sleep(max(warmup, STATIC_SETTLE_S) if scenario == "static" else warmup)
        if scenario != "static":  # at least one whole pass per camera, wherever its loop stands now
            seconds = max(seconds, max(clip.frames / clip.fps for clip in clips) + SLOT_S + 1.0)
        since, cpu_before = time.perf_counter(), server_cpu_seconds(server.process.pid)
        voice = asyncio.create_task(voice_turns(server.url, since + seconds, heard)) if with_voice else None
        await asyncio.sleep(seconds)
        until, cpu_after = time.perf_counter(), server_cpu_seconds(server.process.pid)
        if voice is not None:
            await voice
        await asyncio.sleep(1.5)  # results of frames already in flight
    finally:
        await stop(http, server.url, cameras)
    reports = [camera.report(since, until, references.get(camera_index))
               for camera_index, camera in enumerate(cameras)]
    return Phase(scenario, count, (cpu_after - cpu_before) / (until - since), reports, heard)


async def reference_events(http: aiohttp.ClientSession, url: str, media: Path, count: int
                           ) -> dict[int, dict[str, int]]:
    """Each camera's pass analysed as fast as possible with detection on every sampled frame: its zone events."""
    clips = [make_clip(media, "reference", camera, count) for camera in range(count)]
    body = {"realtime": False, "loop": False, "options": {"video": {"target_fps": TARGET_FPS, "zones": [ZONE]}}}
    cameras = [await watch(http, url, clip, {**body, "path": clip.name}) for clip in clips]
    try:
        await asyncio.wait_for(asyncio.gather(*(camera.ended.wait() for camera in cameras)), 600)
        await asyncio.sleep(0.5)
    finally:
        await stop(http, url, cameras)
    out: dict[int, dict[str, int]] = {}
    for index, camera in enumerate(cameras):
        out[index] = {name: sum(1 for n, _ in camera.events if n == name) for name in ZONE_EVENTS}
    return out


async def serve_and_measure(workdir: Path, media: Path, label: str, config: dict[str, Any], levels: list[int],
                            seconds: float, warmup: float, turns: int, references: dict[int, dict[str, int]] | None,
                            reference_cameras: int) -> tuple[list[Phase], float, dict[int, dict[str, int]]]:
    """One server: the voice loop's idle baseline, then static, staggered and all-moving phases per N. Returns the
    phases, the idle v2v median and the references (made here when ``references`` is None)."""
    from tests.support.browser import VigilProcess

    server = await asyncio.to_thread(VigilProcess(workdir, config).start)
    phases: list[Phase] = []
    print(f"\n[{label}] vigil serve at {server.url}", flush=True)
    try:
        async with aiohttp.ClientSession() as http:
            if references is None:
                started = time.perf_counter()
                references = await reference_events(http, server.url, media, reference_cameras)
                print(f"[{label}] reference zone events per pass (detection on every sampled frame, as fast as "
                      f"possible, {time.perf_counter() - started:.0f} s): "
                      + ", ".join(f"cam{i} {'/'.join(str(r[n]) for n in ZONE_EVENTS)}"
                                  for i, r in references.items()) + " (enter/exit)", flush=True)
            idle_heard: list[float] = []
            if levels:
                await voice_turns(server.url, 0.0, [], 1)  # warm-up: first-call costs stay out of the figures
                await voice_turns(server.url, 0.0, idle_heard, turns)
                print(f"[{label}] voice loop alone: heard v2v median {statistics.median(idle_heard):.0f} ms over "
                      f"{len(idle_heard)} turns", flush=True)
            idle = statistics.median(idle_heard) if idle_heard else float("nan")
            for count in levels:
                for scenario in ("static", "staggered", "moving"):
                    phase = await run_phase(http, server, media, scenario, count, seconds, warmup, references,
                                            with_voice=scenario == "staggered")
                    phases.append(phase)
                    rates = [r["rate"] for r in phase.reports if not math.isnan(r["rate"])]
                    print(f"[{label}] N={count} {scenario}: server {phase.cores:.2f} cores"
                          + (f", min rate {min(rates):.2f} of target" if rates else "")
                          + (f", v2v median {statistics.median(phase.heard):.0f} ms" if phase.heard else "")
                          + f" (load {os.getloadavg()[0]:.1f})", flush=True)
    finally:
        if server.process is not None and server.process.poll() is not None:  # it died: say how, before the
            print(f"[{label}] vigil serve exited with {server.process.returncode}; its log ends:\n"  # tmp goes
                  + server.log()[-3000:], flush=True)
        server.stop()
    return phases, idle, references


# ---------------------------------------------------------------------- tables and verdict


@dataclass
class Row:
    """One N under one config, the figures the verdict reads."""

    min_rate: float
    mean_rate: float
    found: int
    expected: int
    extra: int
    cores: float
    v2v_ratio: float

    @property
    def recall(self) -> float:
        return self.found / self.expected if self.expected else float("nan")


def summarise(phase: Phase, idle_v2v: float) -> Row:
    rates = [r["rate"] for r in phase.reports if not math.isnan(r["rate"])]
    v2v = statistics.median(phase.heard) / idle_v2v if phase.heard else float("nan")
    return Row(min(rates) if len(rates) == len(phase.reports) and rates else float("nan"),
               statistics.mean(rates) if rates else float("nan"),
               sum(r["found"] for r in phase.reports), sum(r["expected"] for r in phase.reports),
               sum(r["extra"] for r in phase.reports), phase.cores, v2v)


def holds(staggered: Row, static_ratio: float) -> dict[str, bool]:
    """The issue's goals for one N: each one's pass/fail."""
    return {"rate >= 0.9": staggered.min_rate >= 0.9, "static <= 2x decode": static_ratio <= 2.0,
            "recall 100 %": staggered.recall >= 1.0, "v2v <= +20 %": staggered.v2v_ratio <= 1.2}


def print_tables(levels: list[int], floors: dict[int, float], runs: dict[str, tuple[list[Phase], float]]) -> None:
    print("\nstatic scenes (no one in view): server CPU vs decode-only (PyAV, same files, real time, own process)")
    print(f"{'N':>3} {'decode-only cores':>18} {'config':>26} {'server cores':>13} {'÷ decode':>9} "
          f"{'cores/camera':>13}  server frames/s per camera")
    for count in levels:
        for label, (phases, _) in runs.items():
            phase = next(p for p in phases if p.cameras == count and p.scenario == "static")
            stages = _mean_stages(phase)
            print(f"{count:>3} {floors[count]:>18.3f} {label:>26} {phase.cores:>13.3f} "
                  f"{phase.cores / floors[count]:>9.1f} {phase.cores / count:>13.3f}  {stages}")
    for scenario, title in (("staggered", "staggered: one camera at a time has someone in view; one live voice loop"),
                            ("moving", "all moving: someone in view in every camera at once; no voice loop")):
        print(f"\n{title}")
        print(f"{'N':>3} {'config':>26} {'min rate':>9} {'mean rate':>10} {'zone events':>12} {'recall':>7} "
              f"{'extra':>6} {'server cores':>13} {'cores/camera':>13} {'v2v vs idle':>12}")
        for count in levels:
            for label, (phases, idle) in runs.items():
                phase = next(p for p in phases if p.cameras == count and p.scenario == scenario)
                row = summarise(phase, idle)
                v2v = f"{row.v2v_ratio:.2f}" if not math.isnan(row.v2v_ratio) else "-"
                print(f"{count:>3} {label:>26} {row.min_rate:>9.2f} {row.mean_rate:>10.2f} "
                      f"{row.found:>5}/{row.expected:<6} {row.recall:>7.0%} {row.extra:>6} {row.cores:>13.3f} "
                      f"{row.cores / count:>13.3f} {v2v:>12}")
                print(f"{'':>31}per camera, rate (windows): "
                      + ", ".join(f"{r['rate']:.2f} ({r['windows']})" for r in phase.reports)
                      + f"; frames/s {_mean_stages(phase)}")


def _mean_stages(phase: Phase) -> str:
    keys = sorted({key for r in phase.reports for key in r["stages"]})
    means = {key: statistics.mean(r["stages"].get(key, 0.0) for r in phase.reports) for key in keys}
    return " ".join(f"{key.removeprefix('frames_')} {value:.1f}" for key, value in means.items())


def verdicts(levels: list[int], floors: dict[int, float], runs: dict[str, tuple[list[Phase], float]]) -> None:
    print()
    for label, (phases, idle) in runs.items():
        held, failed = 0, ""
        for count in levels:
            static = next(p for p in phases if p.cameras == count and p.scenario == "static")
            staggered = summarise(next(p for p in phases if p.cameras == count and p.scenario == "staggered"), idle)
            goals = holds(staggered, static.cores / floors[count])
            if all(goals.values()):
                held = count
            elif not failed:
                failed = f"; at N={count} missed: " + ", ".join(goal for goal, ok in goals.items() if not ok)
        print(f"verdict [{label}]: {held} camera(s) at {TARGET_FPS:g} fps hold with one live voice loop (goals: "
              f">= 0.9 of target while moving, static <= 2x decode-only, zone-event recall 100 %, v2v within "
              f"+20 % of idle {idle:.0f} ms){failed}")


# ---------------------------------------------------------------------- entry


def detector_rate(device: str, half: bool, seconds: float) -> None:
    """The packaged detector's images/s on ``device``, one image and batches of 8 (bus.jpg / zidane.jpg)."""
    import cv2

    from models.detectors.yolo import UltralyticsDetector
    from tests.support.media import real_image

    images = [cv2.cvtColor(real_image(name), cv2.COLOR_RGB2BGR) for name in ("bus", "zidane")]
    detector = UltralyticsDetector(device=device, half=half)
    for batch in (1, 8):
        frames = [images[i % 2] for i in range(batch)]
        detector.detect(frames)  # warm-up
        done, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            detector.detect(frames)
            done += batch
        print(f"detector yolo11n-pose @640 on {device}{' half' if half else ''}, batch {batch}: "
              f"{done / (time.perf_counter() - started):.1f} images/s", flush=True)


def gated_configs(base: dict[str, Any], video: dict[str, Any], detector_workers: list[int] | None,
                  inference_nice: list[int] | None) -> list[tuple[str, dict[str, Any]]]:
    """The motion-gated server configs to measure, labelled: ``base`` as it is, or one per combination of
    ``detector_workers`` and ``inference_nice`` values when more than one worker count or any niceness is asked."""
    if len(detector_workers or []) <= 1 and not inference_nice:
        return [("gated (default)", base)]
    configs = []
    for workers in detector_workers or [None]:
        for nice in inference_nice or [None]:
            variant = {**video, **({} if workers is None else {"detector_workers": workers}),
                       **({} if nice is None else {"inference_nice": nice})}
            label = ", ".join(["gated"] + ([] if workers is None else [f"workers {workers}"])
                              + ([] if nice is None else [f"nice {nice}"]))
            configs.append((label, {**base, "video": variant}))
    return configs


async def cameras(workdir: Path, levels: list[int], seconds: float, warmup: float, turns: int,
                  detector: dict[str, Any] | None = None, ungated: bool = True,
                  detector_workers: list[int] | None = None, inference_nice: list[int] | None = None) -> None:
    """``detector_workers`` and ``inference_nice``: serve the gated config once per combination of their values
    (``video.detector_workers``, ``video.inference_nice``), one after another in this run."""
    from tests.support.browser import REPO_ROOT

    media = workdir / "media"
    media.mkdir(exist_ok=True)
    started = time.perf_counter()
    plans = {clip_plan(scenario, camera, count)[0]: (media, scenario, camera, count) for count in levels
             for scenario in ("static", "staggered", "moving", "reference") for camera in range(count)}
    with concurrent.futures.ProcessPoolExecutor(os.cpu_count()) as pool:  # one encoder per core
        for done in pool.map(make_clip, *zip(*plans.values(), strict=True)):
            assert (media / done.name).exists()
    print(f"\ncameras: clips made in {time.perf_counter() - started:.0f} s under {media} (640x480 H.264, "
          f"{'/'.join(map(str, FPS_CHOICES))} fps by camera, noise sigma {NOISE_SIGMA:g}, a pass {SLOT_S:g} s, "
          f"zone x 0.4-0.6, target {TARGET_FPS:g} fps)", flush=True)
    floors: dict[int, float] = {}
    for count in levels:
        paths = [media / make_clip(media, "static", camera, count).name for camera in range(count)]
        floors[count] = await asyncio.to_thread(decode_floor, paths, seconds, min(warmup, 2.0))
        print(f"decode-only floor, {count} static file(s) in real time: {floors[count]:.3f} cores "
              f"(load {os.getloadavg()[0]:.1f})", flush=True)
    base: dict[str, Any] = {"webrtc": {"host_addresses": ["127.0.0.1"]}, "grpc": {"port": 0},
                            "sources": {"media_root": str(media)},
                            "storage": {"data_dir": str(workdir / "timeline")}}  # the recorder on, as by default
    if max(levels) > 16:
        base["sessions"] = {"max_sources": max(levels) + 2}
    if detector:
        base["models"] = {"detector": detector}
    video: dict[str, Any] = {}  # the served video section; variants below add to it
    if detector_workers:
        video["detector_workers"] = detector_workers[0]
        base["video"] = dict(video)
    ungated_video = {**video, "motion": {"enabled": False}}
    configs: list[tuple[str, dict[str, Any]]] = []
    if motion_gating_available(workdir, REPO_ROOT):
        if ungated:  # first: it also analyses the reference passes
            configs.append(("ungated", {**base, "video": ungated_video}))
        configs += gated_configs(base, video, detector_workers, inference_nice)
    else:
        print("motion gating not available (the server refuses video.motion): running ungated only", flush=True)
        configs.append(("default (no gating)", base))
    references: dict[int, dict[str, int]] | None = None
    runs: dict[str, tuple[list[Phase], float]] = {}
    for label, config in configs:
        if references is None and "motion" not in config.get("video", {}) and label.startswith("gated"):
            # --no-ungated: the references need detection on every frame, from a server of their own
            print("reference passes from a short-lived ungated server", flush=True)
            _, _, references = await serve_and_measure(workdir, media, "reference", {
                **base, "video": ungated_video}, [], seconds, warmup, 0, None, max(levels))
        phases, idle, references = await serve_and_measure(workdir, media, label, config, levels, seconds, warmup,
                                                           turns, references, max(levels))
        runs[label] = (phases, idle)
    print_tables(levels, floors, runs)
    verdicts(levels, floors, runs)


def main() -> None:
    parser = argparse.ArgumentParser(description="decode-only floor child process of bench.cameras")
    parser.add_argument("--decode", nargs="+", required=True)
    decode_forever(parser.parse_args().decode)


if __name__ == "__main__":
    main()
