"""Per-stream tracking, zones and counting lines.

Tracking is Norfair's ``Tracker`` (``norfair-enough``, the maintained fork of Tryolabs' Norfair, which Frigate uses
too): a constant-velocity Kalman filter per track and association by a *distance scaled by the box's size*
(Frigate's: the bottom-centre's move in box widths and heights, plus the change of size), not by IoU. A runner
sampled at 5 fps moves more than its own width between two samples: its boxes never overlap, so an IoU tracker
(ByteTrack, before) started a new track at every sighting and never gave it an id. Here the second sighting is
matched within ``MAX_DISTANCE`` box sizes of the first, and from then on the filter predicts where it goes.

Zones and lines are supervision's ``sv.PolygonZone`` and ``sv.LineZone``, built in pixel coordinates for the
current frame size. This module adds the trust rules (``video.objects``, Frigate's object filters) and the event
bookkeeping (enter/exit/dwell, counts).

Conventions:

* Track ids are positive ints, stable for as long as the track lives (``LOST_TRACK_S`` of absence at most, counted
  in analysed frames at the target rate: a frame the motion gate skips ages nothing).
* A detection below its label's ``min_score`` or outside its area and ratio bounds is never tracked. A track is
  *confirmed* once the median of its last ``SCORE_HISTORY`` scores reaches the label's ``threshold``, and stays
  so; only confirmed tracks enter zones, cross lines and raise events. Every detection is still returned, marked
  (``confirmed``), so the overlay can show what was seen but not trusted.
* Zones and lines test one point per box: its bottom-centre (where a person stands).
* Line direction follows ``sv.LineZone``: facing from ``start`` towards ``end`` *as drawn on the image* (y down),
  crossing from the right-hand side to the left-hand side is ``"in"``, the reverse is ``"out"``. E.g. for a
  vertical line drawn top to bottom, left-to-right motion is ``"in"``; for a horizontal line drawn left to
  right, bottom-to-top motion is ``"in"``.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import supervision as sv
from norfair import Detection as NorfairDetection
from norfair import OptimizedKalmanFilterFactory, Tracker
from norfair.distances import VectorizedDistance

from models.detectors import Detection
from pipelines.protocol import LineConfig, ObjectFilter, ObjectsConfig, ZoneConfig

LOST_TRACK_S = 2.0  # how long a vanished track keeps its id (and its zone membership) before it is dropped
MAX_DISTANCE = 2.5  # association gate, in box sizes (Frigate's default): ~2 widths a sample is a sprint at 5 fps
SCORE_HISTORY = 10  # scores whose median confirms a track (Frigate's)
EDGE_PX = 2.0  # a box this close to the frame's edge is cut by it
MOVING_WIDTHS = 0.05  # a track moving faster than this share of its width an update is followed frame by frame
_ANCHOR = (sv.Position.BOTTOM_CENTER,)
# Velocity is unknown at a track's birth: a large prior lets the second sighting set it (Norfair's default, 1, makes
# the filter believe a runner stands still for several samples).
_FILTER = OptimizedKalmanFilterFactory(R=4.0, Q=0.1, pos_variance=10, vel_variance=1e4)


@dataclass(slots=True)
class SceneEvent:
    name: str  # "zone.enter" | "zone.exit" | "line.cross"
    data: dict[str, Any]


@dataclass(slots=True)
class _Occupant:
    enter_pts: float
    last_pts: float
    label: str


@dataclass(slots=True)
class _TrackScore:
    """What the trust rule keeps of one track: its last scores, its best, whether it was ever confirmed."""

    first: tuple[Detection, float] | None = None  # the sighting before the track had an id, and its pts
    scores: deque[float] = field(default_factory=lambda: deque(maxlen=SCORE_HISTORY))
    best: float = 0.0
    confirmed: bool = False

    def add(self, score: float, rule: ObjectFilter) -> bool:
        self.scores.append(score)
        self.best = max(self.best, score)
        if not self.confirmed and statistics.median(self.scores) >= rule.threshold:
            self.confirmed = True  # once a true positive, always one (a person turning away scores lower)
        return self.confirmed


def size_scaled_distance(candidates: np.ndarray, estimates: np.ndarray, width: float = math.inf,
                         height: float = math.inf) -> np.ndarray:
    """Frigate's association distance, for every (detection, track) pair of one label: the bottom-centre's move in
    the predicted box's widths and heights, plus the relative change of width and height (a box twice as big is
    another object even at the same place). Rows are boxes as ``x1, y1, x2, y2`` in pixels of a ``width`` x
    ``height`` frame. A box cut by the frame's edge says nothing of its object's size: a runner entering the view
    grows from a sliver to its width in two samples, so the size change along that axis is left out and the move is
    measured in the larger box."""
    det = candidates[:, None, :]
    est = estimates[None, :, :]
    est_w, est_h = np.maximum(est[..., 2] - est[..., 0], 1.0), np.maximum(est[..., 3] - est[..., 1], 1.0)
    det_w, det_h = np.maximum(det[..., 2] - det[..., 0], 1.0), np.maximum(det[..., 3] - det[..., 1], 1.0)
    cut_x = _at_edge(det[..., 0], det[..., 2], width) | _at_edge(est[..., 0], est[..., 2], width)
    cut_y = _at_edge(det[..., 1], det[..., 3], height) | _at_edge(est[..., 1], est[..., 3], height)
    # The move is measured in the object's size: where a box is cut, the larger of the two is the nearer to it.
    dx = ((det[..., 0] + det[..., 2]) - (est[..., 0] + est[..., 2])) / 2 / np.where(cut_x, np.maximum(est_w, det_w),
                                                                                 est_w)
    dy = (det[..., 3] - est[..., 3]) / np.where(cut_y, np.maximum(est_h, det_h), est_h)
    width_change = np.where(cut_x, 0.0, np.maximum(est_w, det_w) / np.minimum(est_w, det_w) - 1.0)
    height_change = np.where(cut_y, 0.0, np.maximum(est_h, det_h) / np.minimum(est_h, det_h) - 1.0)
    return np.sqrt(dx * dx + dy * dy + width_change * width_change + height_change * height_change)


def _at_edge(low: np.ndarray, high: np.ndarray, size: float) -> np.ndarray:
    return (low <= EDGE_PX) | (high >= size - EDGE_PX)


def passes(rule: ObjectFilter, detection: Detection) -> bool:
    """Whether a detection may be tracked: score, area (of the frame) and width/height ratio within its label's
    bounds."""
    x1, y1, x2, y2 = detection.box
    width, height = max(x2 - x1, 0.0), max(y2 - y1, 0.0)
    area = width * height
    ratio = width / height if height > 0 else math.inf
    return (detection.conf >= rule.min_score and rule.min_area <= area <= rule.max_area
            and rule.min_ratio <= ratio <= rule.max_ratio)


class StreamTracker:
    """One per stream; never shared. Not thread-safe (called from one task).

    ``update`` keeps every input detection and sets, in place, ``track_id`` (the track's id, or ``None`` for a
    detection that is filtered out or a new object's first sighting) and ``confirmed``.
    """

    def __init__(self, zones: list[ZoneConfig], lines: list[LineConfig], frame_rate: float = 5.0,
                 objects: ObjectsConfig | None = None) -> None:
        self._lost_updates = _updates_spanning(LOST_TRACK_S, frame_rate)
        self._tracker = Tracker(
            distance_function="iou",  # replaced below: the constructor takes a name or a per-pair function only
            distance_threshold=MAX_DISTANCE,
            hit_counter_max=self._lost_updates,
            initialization_delay=1,  # an id from the second sighting: one stray detection never becomes a track
            filter_factory=_FILTER,
            past_detections_length=0,
        )
        self._tracker.distance_function = VectorizedDistance(self._distance)
        self._objects = objects or ObjectsConfig()
        self._scores: dict[int, _TrackScore] = {}  # track id -> its trust state
        self._first: dict[int, tuple[Detection, float]] = {}  # Norfair's initializing id -> the first sighting
        self._update_count = 0
        self._rate = frame_rate
        self._last_pts: float | None = None
        self._missing: set[int] = set()  # ids of the tracks the last update did not see
        self._zones: list[ZoneConfig] = []
        self._lines: list[LineConfig] = []
        self._size: tuple[int, int] | None = None
        self._sv_zones: list[sv.PolygonZone] = []
        self._sv_lines: list[sv.LineZone | None] = []
        self._inside: list[dict[int, _Occupant]] = []
        self._counts: list[dict[str, int]] = []
        self.configure(zones, lines, frame_rate, self._objects)

    def configure(self, zones: list[ZoneConfig], lines: list[LineConfig], frame_rate: float,
                  objects: ObjectsConfig | None = None) -> None:
        """Apply new settings at run time. Track ids survive; zone (line) state is reset only when the zones
        (lines) actually changed: memberships are dropped without exit events, counts restart at zero."""
        if frame_rate <= 0:
            raise ValueError("frame_rate must be positive")
        # Norfair counts absence in updates: keep it spanning LOST_TRACK_S at this rate.
        self.set_rate(frame_rate)
        if objects is not None:
            self._objects = objects
        if list(zones) != self._zones:
            self._zones = list(zones)
            self._inside = [{} for _ in self._zones]
            self._size = None  # rebuild the sv objects on the next frame
        if list(lines) != self._lines:
            self._lines = list(lines)
            self._counts = [{"in": 0, "out": 0} for _ in self._lines]
            self._size = None

    def _distance(self, candidates: np.ndarray, estimates: np.ndarray) -> np.ndarray:
        width, height = self._size or (math.inf, math.inf)
        return size_scaled_distance(candidates, estimates, width, height)

    def _age_missed_samples(self, frame: int, pts: float) -> None:
        """Norfair ages a track one step an update. A track already missing at the last update is followed at the
        full rate (the gate), so a longer gap since then is samples dropped under load: they age it too, and its
        exit comes LOST_TRACK_S after it left, not later. (A gap after a track was last *seen* is the gate's
        refresh of a still scene: one miss there costs one step, as a single flaky detection should.)"""
        steps = round((pts - self._last_pts) * self._rate) if self._last_pts is not None else 1
        missing = set()
        for obj in self._tracker.tracked_objects:
            if obj.id is None or obj.last_detection.data[0] == frame:
                continue
            missing.add(obj.id)
            if obj.id in self._missing and steps > 1:
                obj.hit_counter -= steps - 1
        self._missing, self._last_pts = missing, pts

    def set_rate(self, frame_rate: float) -> None:
        """The rate frames are analysed at now (a motion boost changes it): absence is counted in updates, so
        each live track's remaining allowance is rescaled to the same seconds."""
        self._rate = frame_rate
        updates = _updates_spanning(LOST_TRACK_S, frame_rate)
        if updates == self._lost_updates:
            return
        scale = updates / self._lost_updates
        self._lost_updates = updates
        self._tracker.hit_counter_max = updates
        for obj in self._tracker.tracked_objects:
            obj.hit_counter_max = updates
            obj.hit_counter = min(updates, max(0, round(obj.hit_counter * scale)))

    def update(self, detections: list[Detection], width: int, height: int, pts: float) -> list[SceneEvent]:
        """Track this frame's detections (setting ``track_id`` and ``confirmed`` in place) and return its zone and
        line events.

        A track inside a zone that stops being detected stays inside while it lives (occlusion); once it is
        dropped it leaves with a ``zone.exit`` whose ``dwell_s`` runs to the last frame it was seen in.
        """
        if self._size != (width, height):
            self._build(width, height)
        self._update_count += 1
        frame = self._update_count
        candidates: list[NorfairDetection] = []
        for index, det in enumerate(detections):
            det.track_id, det.confirmed = None, False
            if passes(self._objects.of(det.label), det):
                x1, y1, x2, y2 = det.box
                points = np.array([[x1 * width, y1 * height], [x2 * width, y2 * height]], dtype=np.float64)
                candidates.append(NorfairDetection(points, label=det.label, data=(frame, index)))
        self._tracker.update(candidates)
        self._age_missed_samples(frame, pts)

        trusted: list[tuple[int, Detection]] = []  # confirmed tracks seen now, with their detection
        newly: list[tuple[int, Detection, float]] = []  # tracks trusted from now on: (id, first sighting, its pts)
        alive: set[int] = set()
        initializing: set[int] = set()
        for obj in self._tracker.tracked_objects:
            seen_frame, index = obj.last_detection.data
            if obj.id is None:  # seen once: remember where, so a track trusted later starts from there
                initializing.add(obj.initializing_id)
                if seen_frame == frame and obj.initializing_id not in self._first:
                    self._first[obj.initializing_id] = (detections[index], pts)
                continue
            if not obj.hit_counter_is_positive:
                continue  # dropped at the next update
            alive.add(obj.id)
            if seen_frame != frame:
                continue  # alive but not seen now (occluded, or gone and not yet dropped)
            det = detections[index]
            state = self._scores.get(obj.id)
            if state is None:
                state = self._scores[obj.id] = _TrackScore(first=self._first.pop(obj.initializing_id, None))
            was_confirmed = state.confirmed
            det.track_id = obj.id
            det.confirmed = state.add(det.conf, self._objects.of(det.label))
            if det.confirmed:
                trusted.append((obj.id, det))
                if not was_confirmed and state.first is not None:
                    newly.append((obj.id, *state.first))
        for key in [k for k in self._first if k not in initializing]:
            del self._first[key]

        tracked = _sv_detections(trusted, width, height)
        # A track newly trusted starts where it was first seen: a runner seen once inside the zone and next
        # beyond it entered and left it; one first seen left of a line and now right of it crossed it.
        firsts = _sv_detections([(track_id, det) for track_id, det, _ in newly], width, height)
        events: list[SceneEvent] = []
        for zone, sv_zone, inside in zip(self._zones, self._sv_zones, self._inside, strict=True):
            if newly:
                for (track_id, det, first_pts), hit in zip(newly, sv_zone.trigger(firsts), strict=True):
                    if hit and track_id not in inside:
                        inside[track_id] = _Occupant(first_pts, first_pts, det.label)
                        events.append(SceneEvent("zone.enter", {"zone": zone.name, "track_id": track_id,
                                                                "label": det.label, "score": self._best(track_id)}))
            hits = sv_zone.trigger(tracked) if trusted else []
            seen: set[int] = set()
            for (track_id, det), hit in zip(trusted, hits, strict=True):
                seen.add(track_id)
                occupant = inside.get(track_id)
                if hit and occupant is None:
                    inside[track_id] = _Occupant(pts, pts, det.label)
                    events.append(SceneEvent("zone.enter", {"zone": zone.name, "track_id": track_id,
                                                            "label": det.label, "score": self._best(track_id)}))
                elif hit and occupant is not None:
                    occupant.last_pts, occupant.label = pts, det.label
                elif occupant is not None:
                    events.append(self._exit(zone, track_id, inside.pop(track_id), pts))
            for track_id in [t for t in inside if t not in seen and t not in alive]:
                occupant = inside.pop(track_id)
                events.append(self._exit(zone, track_id, occupant, occupant.last_pts))

        for line, sv_line, counts in zip(self._lines, self._sv_lines, self._counts, strict=True):
            if sv_line is None or not trusted:
                continue
            if newly:
                sv_line.trigger(firsts)  # the side each newly trusted track started on
            crossed_in, crossed_out = sv_line.trigger(tracked)
            for (track_id, det), went_in, went_out in zip(trusted, crossed_in, crossed_out, strict=True):
                if not (went_in or went_out):
                    continue
                direction = "in" if went_in else "out"
                counts[direction] += 1
                events.append(SceneEvent("line.cross", {"line": line.name, "track_id": track_id, "label": det.label,
                                                        "direction": direction, "score": self._best(track_id)}))
        for track_id in [t for t in self._scores if t not in alive]:
            del self._scores[track_id]  # after the exits, which carry its best score
        return events

    @property
    def moving(self) -> int:
        """Tracks with an id the filter sees moving (more than ``MOVING_WIDTHS`` of their width an update). A fast
        object barely marks a motion background, so when it leaves the view no motion says so: look again."""
        count = 0
        for obj in self._tracker.tracked_objects:
            if obj.id is None or not obj.hit_counter_is_positive:
                continue
            box = obj.estimate
            width = max(box[1, 0] - box[0, 0], 1.0)
            if float(np.abs(obj.estimate_velocity).mean(axis=0).max()) > MOVING_WIDTHS * width:
                count += 1
        return count

    @property
    def lost(self) -> int:
        """Tracks the last update did not see (occluded or gone) that are not dropped yet."""
        return sum(1 for o in self._tracker.tracked_objects
                   if o.id is not None and o.last_detection.data[0] != self._update_count)

    @property
    def unconfirmed(self) -> int:
        """New tracks seen once: the next update gives them an id or drops them."""
        return sum(1 for o in self._tracker.tracked_objects if o.id is None)

    @property
    def undecided(self) -> int:
        """Tracks not confirmed yet whose score history is still filling: the next sightings decide them (a track
        still unconfirmed with a full history is a doubtful object, e.g. a look-alike: no hurry)."""
        return sum(1 for state in self._scores.values() if not state.confirmed and len(state.scores) < SCORE_HISTORY)

    @property
    def tracking(self) -> bool:
        """Whether any track lives (confirmed, lost or new)."""
        return bool(self._tracker.tracked_objects)

    @property
    def occupancy(self) -> dict[str, list[int]]:
        """Zone name -> ids of the tracks inside now (including ones briefly lost but still tracked)."""
        return {zone.name: sorted(inside) for zone, inside in zip(self._zones, self._inside, strict=True)}

    @property
    def line_counts(self) -> dict[str, dict[str, int]]:
        """Line name -> {"in": n, "out": n} since the lines were last (re)configured."""
        return {line.name: dict(counts) for line, counts in zip(self._lines, self._counts, strict=True)}

    def _best(self, track_id: int) -> float:
        return round(self._scores[track_id].best, 4) if track_id in self._scores else 0.0

    def _exit(self, zone: ZoneConfig, track_id: int, occupant: _Occupant, exit_pts: float) -> SceneEvent:
        return SceneEvent("zone.exit", {"zone": zone.name, "track_id": track_id, "label": occupant.label,
                                        "dwell_s": round(exit_pts - occupant.enter_pts, 3),
                                        "score": self._best(track_id)})

    def _build(self, width: int, height: int) -> None:
        # Geometry only: memberships and counts live here, not in the sv objects. A rebuilt LineZone forgets
        # which side each track was on, so a crossing in progress across a resize is not counted.
        size = np.array([width, height], dtype=np.float64)
        self._sv_zones = [
            sv.PolygonZone(np.rint(np.array(z.polygon) * size).astype(int), triggering_anchors=_ANCHOR)
            for z in self._zones
        ]
        self._sv_lines = [_line_zone(line, width, height) for line in self._lines]
        self._size = (width, height)


def _updates_spanning(seconds: float, frame_rate: float) -> int:
    # At least 2: Norfair needs more than the one update a new track waits for its id.
    return max(2, math.ceil(seconds * frame_rate))


def _sv_detections(rows: list[tuple[int, Detection]], width: int, height: int) -> sv.Detections:
    scale = np.array([width, height, width, height], dtype=np.float64)
    return sv.Detections(
        xyxy=np.array([det.box for _, det in rows], dtype=np.float64).reshape(len(rows), 4) * scale,
        confidence=np.array([det.conf for _, det in rows], dtype=np.float64),
        class_id=np.array([det.class_id for _, det in rows], dtype=int),
        tracker_id=np.array([track_id for track_id, _ in rows], dtype=int),
    )


def _line_zone(line: LineConfig, width: int, height: int) -> sv.LineZone | None:
    start = sv.Point(line.start[0] * width, line.start[1] * height)
    end = sv.Point(line.end[0] * width, line.end[1] * height)
    if start.x == end.x and start.y == end.y:
        return None  # a zero-length line can never be crossed (sv.LineZone rejects it)
    return sv.LineZone(start=start, end=end, triggering_anchors=_ANCHOR)
