"""Labelled event bench: are Vigil's zone and line events *right*, as a user watching the results meets them?

``python -m bench.events [--baseline REV] [--boost FPS] [--details]``

Videos are composed here from real photographs that ship offline (people cut from Ultralytics' ``bus.jpg``,
backgrounds and the look-alike cat from scikit-image's data), 640x480 H.264 at 15 fps with Gaussian sensor noise
on every frame, and each comes with its ground truth: who enters and leaves the zone (the right 40 % of the view)
and who crosses the line (the vertical middle), in which direction, and when. Scenarios:

- ``walk``: four passes, alternating directions, 7 s to cross.
- ``run``: six runners (a person ~54 px wide) crossing in 1.7 s: ~98 px between two samples at 5 fps, more than
  the box's own width, so consecutive boxes never overlap.
- ``cross``: two people crossing each other in opposite directions, three times (identity swaps).
- ``stationary``: a person walks into the zone, stands 20 s, walks out: one enter and one exit.
- ``lookalike``: a cat in the scene that the detector takes for a person at 0.25-0.35; and a bigger one on grass
  at 0.35-0.65. Nobody passes: every event is false.
- ``lights``: a dim scene whose lights switch on (x2.5 at once), then a walker.
- ``noise``: heavy sensor noise (sigma 12 instead of 3), two walkers.
- ``occlusion``: walkers passing behind a pillar inside the zone (hidden ~0.4 s).
- ``park``: a motorcycle (scikit-image's ``stereo_motorcycle``, a real photograph) rides into the zone, stays
  parked 20 s and rides out: one line crossing, one enter, one exit. The default detector (yolo11n-pose) sees
  people only, so this scenario runs on a second server with ``models.detector.backend: opencv-ssd`` (COCO,
  offline), at its defaults otherwise, and so does each baseline.

Every scenario plays at once as a real-time file source of one ``vigil serve`` (the default config, the zone and
line in the source's options), the way a user runs cameras; the client follows each source's results WebSocket
and scores what it receives (a separate process from the server). Reference: the same clips analysed as fast as
possible (media time, nothing dropped) with detection on every frame (``target_fps`` 15, motion gating off), by the
same code. ``--baseline REV`` serves that commit (a git worktree) at its default config in the same run.

Scoring: a ground-truth event is found by the first unused received event of the same name, zone or line and
direction whose media time lies within its window (enter and cross: 1 s early to 1.5 s late; an exit where the
person leaves the view while inside: up to the tracker's ``LOST_TRACK_S`` + 2 s late). Received events left over
are false. Identity switches: each detections message is matched to the visible people by box overlap (IoU >= 0.3);
a switch is a person's track id changing between two matched sightings. Delay: the received event's media time
minus the ground truth's, for enters and crossings. Numbers live here, not in timed tests.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

REPO = Path(__file__).resolve().parents[1]
SIZE = (640, 480)
FPS = 15
FEET_Y = 455  # where people stand (pixels from the top)
ZONE_X = 0.6  # the zone: x from here to the right edge
LINE_X = 0.5
ZONE = {"name": "right", "polygon": [[ZONE_X, 0.0], [1.0, 0.0], [1.0, 1.0], [ZONE_X, 1.0]]}
LINE = {"name": "middle", "start": [LINE_X, 0.0], "end": [LINE_X, 1.0]}  # drawn top to bottom: left-to-right is "in"
LOST_TRACK_S = 2.0  # pipelines.video.tracking's (kept here: the baseline serves other code)
VISIBLE = 0.6  # share of a person's width in view (and not hidden) for the ground truth to call them visible
EARLY_S, LATE_S = 1.0, 1.5
LEAD_S = 3.0  # an empty scene before the first pass of every clip
# What crosses the scenes: people cut from bus.jpg (x1, y1, x2, y2 in the photo, the packaged detector's boxes:
# full bodies, head to feet), and a motorcycle from scikit-image's stereo pair (opencv-ssd's box, conf 0.99).
CUTS = {"left": ("bus", (48, 399, 243, 906)), "right": ("bus", (669, 388, 810, 877)),
        "middle": ("bus", (222, 405, 344, 858)), "motorcycle": ("stereo_motorcycle", (102, 65, 680, 445))}
VEHICLES = {"models": {"detector": {"backend": "opencv-ssd"}}}  # the server config of vehicle scenarios


# ---------------------------------------------------------------------- scenes and their ground truth


@dataclass
class Actor:
    """A person crossing the view horizontally: the centre's x (normalised) at key times, linear between them;
    in view from the first key time to the last."""

    person: str
    height: int
    keys: list[tuple[float, float]]  # (seconds, centre x)

    def centre(self, t: float) -> float | None:
        if not self.keys[0][0] <= t <= self.keys[-1][0]:
            return None
        for (t0, x0), (t1, x1) in zip(self.keys, self.keys[1:], strict=False):
            if t0 <= t <= t1:
                return x0 if t1 == t0 else x0 + (x1 - x0) * (t - t0) / (t1 - t0)
        return self.keys[-1][1]


@dataclass
class Scenario:
    name: str
    seconds: float
    background: str
    actors: list[Actor] = field(default_factory=list)
    sigma: float = 3.0
    pillar: tuple[float, float] | None = None  # x range (normalised) of a pillar in front of everyone
    cat: tuple[int, str] | None = None  # (width px, background) a look-alike cat standing in the scene
    lights_on_at: float | None = None  # before: the scene at 40 % brightness
    vehicles: bool = False  # served with a detector that has vehicles (VEHICLES), not the default one


def crossing(person: str, start: float, seconds: float, left_to_right: bool = True, height: int = 230) -> Actor:
    a, b = (-0.15, 1.15) if left_to_right else (1.15, -0.15)
    return Actor(person, height, [(start, a), (start + seconds, b)])


def scenarios(scale: float = 1.0) -> list[Scenario]:
    """``scale`` stretches the gaps between passes (not the passes): 1.0 is the bench. Nobody passes in the first
    ``LEAD_S``: every camera starts at once, and a camera watched for a while is what a user runs."""
    gap = 3.0 * scale  # longer than LOST_TRACK_S: one pass's exit comes before the next pass
    t0 = LEAD_S
    walkers = ["left", "middle", "right", "left"]
    walk = [crossing(p, t0 + i * (7 + gap), 7, left_to_right=i % 2 == 0) for i, p in enumerate(walkers)]
    runs = [crossing("middle", t0 + i * (1.7 + gap), 1.7, left_to_right=i % 2 == 0, height=200) for i in range(6)]
    cross: list[Actor] = []
    for i in range(3):
        start = t0 + i * (7 + gap)
        # B sets off 2.2 s before A: they meet left of the line (x 0.3), apart when each crosses it
        cross += [crossing("left", start + 2.2, 7), crossing("right", start, 7, left_to_right=False, height=215)]
    stand = [Actor("left", 230, [(t0, -0.15), (t0 + 3, 0.8), (t0 + 23, 0.8), (t0 + 25, 1.15)])]
    tail = LOST_TRACK_S + 2.0  # after the last person leaves: their exit comes before the clip ends
    lights = [crossing("middle", t0 + 15, 7)]
    noise = [crossing("left", t0 + 1, 7), crossing("right", t0 + 13, 7, left_to_right=False)]
    occlusion = [crossing("left", t0, 8), crossing("middle", t0 + 10, 8, left_to_right=False)]
    park = [Actor("motorcycle", 150, [(t0, -0.2), (t0 + 4, 0.78), (t0 + 24, 0.78), (t0 + 26, 1.2)])]
    return [
        Scenario("walk", walk[-1].keys[-1][0] + tail, "coffee", walk),
        Scenario("run", runs[-1].keys[-1][0] + tail, "brick", runs),
        Scenario("cross", cross[-1].keys[-1][0] + tail, "rocket", cross),
        Scenario("stationary", stand[0].keys[-1][0] + tail, "grass", stand),
        Scenario("lookalike", 30.0, "coffee", cat=(300, "coffee")),
        Scenario("lookalike-big", 30.0, "grass", cat=(420, "grass")),
        Scenario("lights", lights[-1].keys[-1][0] + tail, "rocket", lights, lights_on_at=t0 + 9),
        Scenario("noise", noise[-1].keys[-1][0] + tail, "gravel", noise, sigma=12.0),
        Scenario("occlusion", occlusion[-1].keys[-1][0] + tail, "brick", occlusion, pillar=(0.72, 0.80)),
        Scenario("park", park[0].keys[-1][0] + tail, "gravel", park, vehicles=True),
    ]


def _cut(person: str, height: int) -> np.ndarray:
    import cv2

    from tests.support.media import real_image

    photo, (x1, y1, x2, y2) = CUTS[person]
    image = real_image(photo)
    image = image[0] if isinstance(image, tuple) else image  # stereo_motorcycle: (left, right, disparity)
    cut = image[y1:y2, x1:x2, :3]
    return cv2.resize(cut, (max(1, round(cut.shape[1] * height / cut.shape[0])), height))


def _background(scenario: Scenario) -> np.ndarray:
    import cv2

    from tests.support.media import letterbox, real_image

    image = real_image(scenario.background)
    if image.ndim == 2:
        image = np.stack([image] * 3, axis=-1)
    scene = letterbox(image[..., :3], SIZE)
    if scenario.cat is not None:
        width = scenario.cat[0]
        cat = real_image("chelsea")
        cat = cv2.resize(cat, (width, round(cat.shape[0] * width / cat.shape[1])))
        y, x = SIZE[1] - cat.shape[0] - 20, (SIZE[0] - width) // 2
        scene[y: y + cat.shape[0], x: x + width] = cat
    return scene


def _pillar() -> np.ndarray:
    from tests.support.media import real_image

    stone = real_image("gravel")
    return np.stack([stone[:SIZE[1], :SIZE[0]]] * 3, axis=-1)


@dataclass
class Box:
    x1: float
    y1: float
    x2: float
    y2: float  # pixels

    def iou(self, other: Box) -> float:
        w = max(0.0, min(self.x2, other.x2) - max(self.x1, other.x1))
        h = max(0.0, min(self.y2, other.y2) - max(self.y1, other.y1))
        inter = w * h
        union = (self.x2 - self.x1) * (self.y2 - self.y1) + (other.x2 - other.x1) * (other.y2 - other.y1) - inter
        return inter / union if union > 0 else 0.0


def actor_box(actor: Actor, width: int, t: float) -> Box | None:
    centre = actor.centre(t)
    if centre is None:
        return None
    left = centre * SIZE[0] - width / 2
    return Box(left, FEET_Y - actor.height, left + width, FEET_Y)


def visible_share(box: Box, pillar: tuple[float, float] | None) -> float:
    """Share of the box's width in view and not behind the pillar."""
    x1, x2 = max(box.x1, 0.0), min(box.x2, SIZE[0])
    seen = max(0.0, x2 - x1)
    if pillar is not None and seen > 0:
        p1, p2 = pillar[0] * SIZE[0], pillar[1] * SIZE[0]
        seen -= max(0.0, min(x2, p2) - max(x1, p1))
    return seen / (box.x2 - box.x1)


@dataclass
class Truth:
    name: str  # zone.enter | zone.exit | line.cross
    place: str  # the zone's or line's name
    direction: str | None
    t: float
    late_s: float = LATE_S
    actor: int = 0


def ground_truth(scenario: Scenario) -> list[Truth]:
    """The events a perfect pipeline raises, from where each person is at every source frame."""
    truths: list[Truth] = []
    for index, actor in enumerate(scenario.actors):
        width = _cut(actor.person, actor.height).shape[1]
        inside, side, last_seen_inside = False, None, None
        for frame in range(round(scenario.seconds * FPS)):
            t = frame / FPS
            box = actor_box(actor, width, t)
            seen = box is not None and visible_share(box, scenario.pillar) >= VISIBLE
            if box is None:
                if inside:  # left the view while inside: the exit comes once the tracker drops the track
                    truths.append(Truth("zone.exit", ZONE["name"], None, last_seen_inside,
                                        LOST_TRACK_S + 2.0, index))
                inside = False
                side = None
                continue
            if not seen:
                continue  # hidden (behind the pillar or at the edge): nothing changes
            # The anchor: bottom-centre of the part in view (what the detector boxes).
            x = (max(box.x1, 0.0) + min(box.x2, SIZE[0])) / 2 / SIZE[0]
            now_inside = x >= ZONE_X
            if now_inside and not inside:
                truths.append(Truth("zone.enter", ZONE["name"], None, t, actor=index))
            elif inside and not now_inside:
                truths.append(Truth("zone.exit", ZONE["name"], None, t, actor=index))
            inside = now_inside
            if inside:
                last_seen_inside = t
            now_side = "left" if x < LINE_X else "right"
            if side is not None and now_side != side:
                truths.append(Truth("line.cross", LINE["name"], "in" if now_side == "right" else "out", t,
                                    actor=index))
            side = now_side
        if inside:
            truths.append(Truth("zone.exit", ZONE["name"], None, last_seen_inside, LOST_TRACK_S + 2.0, index))
    return sorted(truths, key=lambda truth: truth.t)


def write_clip(path: Path, scenario: Scenario) -> None:
    import av

    scene = _background(scenario).astype(np.float32)
    cuts = [_cut(actor.person, actor.height) for actor in scenario.actors]
    pillar = _pillar() if scenario.pillar else None
    rng = np.random.default_rng(sum(map(ord, scenario.name)))
    tmp = path.with_suffix(".part.mp4")
    with av.open(str(tmp), "w") as container:
        stream = container.add_stream("libx264", rate=FPS)
        stream.width, stream.height, stream.pix_fmt = SIZE[0], SIZE[1], "yuv420p"
        stream.options = {"preset": "ultrafast", "crf": "20", "x264-params": f"keyint={2 * FPS}"}
        for index in range(round(scenario.seconds * FPS)):
            t = index / FPS
            picture = scene.copy()
            for actor, cut in zip(scenario.actors, cuts, strict=True):
                box = actor_box(actor, cut.shape[1], t)
                if box is None:
                    continue
                left, top = round(box.x1), round(box.y1)
                x0, x1 = max(left, 0), min(left + cut.shape[1], SIZE[0])
                if x1 > x0:
                    picture[top: top + cut.shape[0], x0:x1] = cut[:, x0 - left: x1 - left]
            if pillar is not None and scenario.pillar is not None:
                p0, p1 = round(scenario.pillar[0] * SIZE[0]), round(scenario.pillar[1] * SIZE[0])
                picture[:, p0:p1] = pillar[:, p0:p1]
            if scenario.lights_on_at is not None and t < scenario.lights_on_at:
                picture *= 0.4
            picture += rng.normal(0.0, scenario.sigma, picture.shape).astype(np.float32)
            frame = av.VideoFrame.from_ndarray(np.clip(picture, 0, 255).astype(np.uint8), format="rgb24")
            frame.pts, frame.time_base = index, Fraction(1, FPS)
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    tmp.rename(path)


# ---------------------------------------------------------------------- what the client receives


@dataclass
class Received:
    events: list[dict[str, Any]] = field(default_factory=list)  # {"name", "pts", "data"}
    detections: list[tuple[float, list[dict[str, Any]]]] = field(default_factory=list)  # (pts, objects)
    ended: asyncio.Event = field(default_factory=asyncio.Event)


async def play(http: aiohttp.ClientSession, url: str, scenario: Scenario, realtime: bool,
               options: dict[str, Any]) -> Received:
    body = {"path": f"{scenario.name}.mp4", "realtime": realtime, "loop": False,
            "options": {"video": {"zones": [ZONE], "lines": [LINE], **options}}}
    received = Received()
    async with http.post(f"{url}/api/sources", json=body) as response:
        answer = await response.json()
        if response.status >= 400:
            raise RuntimeError(f"POST /api/sources: {response.status} {answer}")
    async with http.ws_connect(f"{url}/api/sources/{answer['id']}/results", heartbeat=20) as ws:
        async for message in ws:
            if message.type != aiohttp.WSMsgType.TEXT:
                continue
            data = json.loads(message.data)
            if data.get("type") == "detections":
                received.detections.append((data["pts"], data["objects"]))
            elif data.get("type") == "event":
                if data["name"] in ("zone.enter", "zone.exit", "line.cross"):
                    received.events.append({"name": data["name"], "pts": data.get("pts") or 0.0, "data": data["data"]})
                elif data["name"] == "source.state" and data["data"].get("state") in ("ended", "failed"):
                    break
    with contextlib.suppress(Exception):
        async with http.delete(f"{url}/api/sources/{answer['id']}"):
            pass
    return received


# ---------------------------------------------------------------------- scoring


@dataclass
class Score:
    truths: int = 0
    found: int = 0
    false: int = 0
    switches: int = 0
    crossings: int = 0
    delays: list[float] = field(default_factory=list)
    events: list[str] = field(default_factory=list)  # what was received, for the stationary check
    missed: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def add(self, other: Score) -> None:
        self.truths += other.truths
        self.found += other.found
        self.false += other.false
        self.switches += other.switches
        self.crossings += other.crossings
        self.delays += other.delays
        self.seconds += other.seconds

    @property
    def recall(self) -> float:
        return self.found / self.truths if self.truths else float("nan")

    @property
    def precision(self) -> float:
        received = self.found + self.false
        return self.found / received if received else float("nan")


def score(scenario: Scenario, received: Received) -> Score:
    truths = ground_truth(scenario)
    result = Score(truths=len(truths), crossings=len(scenario.actors), seconds=scenario.seconds)
    unused = list(received.events)
    for truth in truths:
        for event in unused:
            place = event["data"].get("zone") or event["data"].get("line")
            if (event["name"] == truth.name and place == truth.place
                    and event["data"].get("direction") == truth.direction
                    and truth.t - EARLY_S <= event["pts"] <= truth.t + truth.late_s):
                unused.remove(event)
                result.found += 1
                if truth.name != "zone.exit":
                    result.delays.append(event["pts"] - truth.t)
                break
        else:
            result.missed.append(f"{truth.name}{' ' + truth.direction if truth.direction else ''} at {truth.t:.2f}")
    result.false = len(unused)
    result.unexpected = [f"{e['name']}{' ' + e['data']['direction'] if e['data'].get('direction') else ''} at "
                         f"{e['pts']:.2f} (track {e['data'].get('track_id')})" for e in unused]
    result.events = [event["name"] for event in received.events]
    result.switches = identity_switches(scenario, received)
    return result


def identity_switches(scenario: Scenario, received: Received) -> int:
    """Each person's track id from sighting to sighting: detections matched one to one to the people in view by
    box overlap (best first, IoU >= 0.3), skipping people whose boxes overlap each other's (while two people pass
    one another, which box is whose is the very question: the ids before and after it are compared)."""
    widths = [_cut(actor.person, actor.height).shape[1] for actor in scenario.actors]
    last: list[int | None] = [None] * len(scenario.actors)
    switches = 0
    for pts, objects in received.detections:
        boxes = [Box(o["box"][0] * SIZE[0], o["box"][1] * SIZE[1], o["box"][2] * SIZE[0], o["box"][3] * SIZE[1])
                 for o in objects]
        people: dict[int, Box] = {}
        for index, (actor, width) in enumerate(zip(scenario.actors, widths, strict=True)):
            truth = actor_box(actor, width, pts)
            if truth is not None and visible_share(truth, scenario.pillar) >= VISIBLE:
                people[index] = Box(max(truth.x1, 0), truth.y1, min(truth.x2, SIZE[0]), truth.y2)
        clear = {i: box for i, box in people.items()
                 if all(other.iou(box) < 0.05 for j, other in people.items() if j != i)}
        pairs = sorted(((boxes[k].iou(box), i, k) for i, box in clear.items() for k in range(len(boxes))),
                       reverse=True)
        used_people: set[int] = set()
        used_boxes: set[int] = set()
        for overlap, index, k in pairs:
            if overlap < 0.3:
                break
            if index in used_people or k in used_boxes:
                continue
            used_people.add(index)
            used_boxes.add(k)
            track = objects[k].get("track_id")
            if track is None:
                continue
            if last[index] is not None and track != last[index]:
                switches += 1
            last[index] = track
    return switches


# ---------------------------------------------------------------------- runs


@dataclass
class Run:
    label: str
    root: Path
    realtime: bool
    options: dict[str, Any]
    config: dict[str, Any] = field(default_factory=dict)
    scores: dict[str, Score] = field(default_factory=dict)


async def measure(run: Run, workdir: Path, media: Path, chosen: list[Scenario]) -> None:
    from tests.support.vigil_process import VigilProcess

    config = {"webrtc": {"host_addresses": ["127.0.0.1"]}, "grpc": {"port": 0},
              "sources": {"media_root": str(media)},
              "sessions": {"max_sources": len(chosen) + 2},
              "storage": {"data_dir": str(workdir / f"timeline-{run.label}")},
              "voice": {"enabled": False}, **run.config}
    server = await asyncio.to_thread(VigilProcess(workdir, config, root=run.root).start)
    started = time.perf_counter()
    try:
        async with aiohttp.ClientSession() as http:
            results = await asyncio.gather(*(play(http, server.url, s, run.realtime, run.options) for s in chosen))
    finally:
        await asyncio.to_thread(server.stop)
    for scenario, received in zip(chosen, results, strict=True):
        run.scores[scenario.name] = score(scenario, received)
    print(f"[{run.label}] {len(chosen)} sources in {time.perf_counter() - started:.0f} s "
          f"(load {os.getloadavg()[0]:.1f})", flush=True)


def worktree(rev: str, workdir: Path) -> Path:
    """A checkout of ``rev`` beside this one, sharing its installed models (data/models)."""
    path = workdir / f"baseline-{rev[:12]}"
    subprocess.run(["git", "worktree", "add", "--detach", "-f", str(path), rev], cwd=REPO, check=True,
                   capture_output=True)
    (path / "data").mkdir(exist_ok=True)
    models = REPO / "data" / "models"
    if models.exists():
        (path / "data" / "models").symlink_to(models)
    return path


def _pct(value: float) -> str:
    return "  -  " if math.isnan(value) else f"{100 * value:4.0f}%"


def report(runs: list[Run], chosen: list[Scenario], details: bool = False) -> None:
    print("\nper scenario: found/truths (recall), false events, identity switches, median delay of enters and "
          "crossings (s)")
    header = f"{'scenario':<14}" + "".join(f"{run.label[:34]:>36}" for run in runs)
    print(header)
    for scenario in chosen:
        cells = []
        for run in runs:
            s = run.scores[scenario.name]
            delay = f"{statistics.median(s.delays):+.2f}" if s.delays else "  -  "
            cells.append(f"{s.found:>3}/{s.truths:<3}{_pct(s.recall)} fp {s.false:<2} sw {s.switches:<2} {delay}")
        print(f"{scenario.name:<14}" + "".join(f"{c:>36}" for c in cells))
    if details:
        for run in runs:
            for name, result in run.scores.items():
                if result.missed or result.unexpected:
                    print(f"  [{run.label}] {name}: missed {result.missed}; false {result.unexpected}")
    print("\noverall")
    for run in runs:
        total = Score()
        for s in run.scores.values():
            total.add(s)
        fast = Score()
        for name in ("walk", "run"):
            if name in run.scores:
                fast.add(run.scores[name])
        clean = sum(run.scores[n].false for n in ("lookalike", "lookalike-big", "lights", "noise") if n in run.scores)
        hours = total.seconds / 3600
        stand = run.scores.get("stationary")
        stand_events = sorted(e for e in stand.events if e.startswith("zone.")) if stand else []
        per20 = 20 * total.switches / total.crossings if total.crossings else float("nan")
        delay = statistics.median(total.delays) if total.delays else float("nan")
        walk, run_ = run.scores.get("walk", Score()), run.scores.get("run", Score())
        print(f"  {run.label}: recall {_pct(total.recall)} (walk {_pct(walk.recall)}, run "
              f"{_pct(run_.recall)}), precision {_pct(total.precision)}, false events "
              f"{total.false} ({total.false / hours:.0f} per camera-hour), on look-alike/lights/noise {clean}, "
              f"identity switches {total.switches} ({per20:.1f} per 20 crossings), median delay {delay:+.2f} s, "
              f"stationary {stand_events}")
        goals = {
            "walkers >= 95 %": walk.recall >= 0.95,
            "runners >= 95 %": run_.recall >= 0.95,
            "0 false on look-alike, lights, noise": clean == 0,
            "switches <= 1 per 20 crossings": per20 <= 1,
            "stationary: one enter, one exit": stand_events == ["zone.enter", "zone.exit"],
        }
        print("    goals: " + ", ".join(f"{name}: {'met' if ok else 'NOT met'}" for name, ok in goals.items()))


def report_vehicles(runs: list[Run], chosen: list[Scenario]) -> None:
    """The parked vehicle: every event found, nothing false, one enter and one exit."""
    print("\nvehicles (models.detector.backend: opencv-ssd): found/truths, false events, identity switches, events")
    for scenario in chosen:
        for run in runs:
            s = run.scores[scenario.name]
            zone = sorted(e for e in s.events if e.startswith("zone."))
            ok = s.found == s.truths and s.false == 0 and zone == ["zone.enter", "zone.exit"]
            print(f"  {scenario.name:<10} {run.label:<36} {s.found}/{s.truths} fp {s.false} sw {s.switches}  "
                  f"{zone}  goal (all found, none false, one enter, one exit): {'met' if ok else 'NOT met'}")
            if s.missed or s.unexpected:
                print(f"{'':>14}missed {s.missed}; false {s.unexpected}")


async def main_async(args: argparse.Namespace) -> None:
    chosen = [s for s in scenarios(args.gap_scale) if not args.only or s.name in args.only]
    with tempfile.TemporaryDirectory(prefix="vigil-events-") as tmp:
        workdir = Path(tmp)
        media = workdir / "media"
        media.mkdir()
        started = time.perf_counter()
        await asyncio.gather(*(asyncio.to_thread(write_clip, media / f"{s.name}.mp4", s) for s in chosen))
        truths = {s.name: ground_truth(s) for s in chosen}
        print(f"events bench: {len(chosen)} clips made in {time.perf_counter() - started:.0f} s (640x480, {FPS} fps, "
              f"zone x >= {ZONE_X}, line x = {LINE_X}); ground truth: "
              + ", ".join(f"{name} {len(t)}" for name, t in truths.items()), flush=True)
        people = [s for s in chosen if not s.vehicles]
        vehicles = [s for s in chosen if s.vehicles]
        runs = [Run("vigil (default)", REPO, True, {})]
        vehicle_runs = [Run("vigil, opencv-ssd", REPO, True, {}, VEHICLES)]
        if args.boost:
            boosted = {"motion": {"boost_fps": args.boost}}
            runs.append(Run(f"vigil, motion boost {args.boost:g} fps", REPO, True, boosted))
        if not args.no_reference:
            runs.append(Run("reference (every frame)", REPO, False, {"target_fps": FPS, "motion": {"enabled": False}}))
        trees: list[Path] = []
        try:
            for rev in args.baseline:
                trees.append(await asyncio.to_thread(worktree, rev, workdir))
                runs.append(Run(f"baseline {rev[:10]} (default)", trees[-1], True, {}))
                vehicle_runs.append(Run(f"baseline {rev[:10]}, opencv-ssd", trees[-1], True, {}, VEHICLES))
            for group, scenes in ((runs, people), (vehicle_runs, vehicles)):
                for run in group if scenes else []:
                    await measure(run, workdir, media, scenes)
        finally:
            for tree in trees:
                await asyncio.to_thread(subprocess.run, ["git", "worktree", "remove", "--force", str(tree)], cwd=REPO,
                                        capture_output=True)
        if people:
            report(runs, people, args.details)
        if vehicles:
            report_vehicles(vehicle_runs, vehicles)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", action="append", default=[], metavar="REV",
                        help="also serve this commit (a git worktree) at its default config, in the same run")
    parser.add_argument("--only", nargs="+", help="these scenarios only")
    parser.add_argument("--boost", type=float, metavar="FPS",
                        help="also run the default with video.motion.boost_fps at this rate")
    parser.add_argument("--details", action="store_true", help="list each missed and each false event")
    parser.add_argument("--no-reference", action="store_true", help="skip the detect-every-frame reference")
    parser.add_argument("--gap-scale", type=float, default=1.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("YOLO_OFFLINE", "1")
    asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
