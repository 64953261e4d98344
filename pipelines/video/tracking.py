"""Per-stream tracking, zones and counting lines.

Tracking is Roboflow's ``trackers.ByteTrackTracker`` (the successor of ``sv.ByteTrack``, which supervision
0.31 no longer ships); zones and lines are supervision's ``sv.PolygonZone`` and ``sv.LineZone``, built in pixel
coordinates for the current frame size. This module only adds the event bookkeeping (enter/exit/dwell, counts).

Conventions:

* Track ids are positive ints (the tracker's 0-based ids plus one, so an id is never falsy), stable for as long
  as ByteTrack keeps the track (``LOST_TRACK_S`` seconds of absence at most).
* Zones and lines test one point per box: its bottom-centre (where a person stands).
* Line direction follows ``sv.LineZone``: facing from ``start`` towards ``end`` *as drawn on the image* (y down),
  crossing from the right-hand side to the left-hand side is ``"in"``, the reverse is ``"out"``. E.g. for a
  vertical line drawn top to bottom, left-to-right motion is ``"in"``; for a horizontal line drawn left to
  right, bottom-to-top motion is ``"in"``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import supervision as sv
from trackers import ByteTrackTracker

from models.detectors import Detection
from pipelines.protocol import LineConfig, ZoneConfig

LOST_TRACK_S = 2.0  # how long a vanished track keeps its id (and its zone membership) before it is dropped
ACTIVATION_CONF = 0.25  # the detector already filters by its own threshold; don't second-guess it much
_ANCHOR = (sv.Position.BOTTOM_CENTER,)


@dataclass(slots=True)
class SceneEvent:
    name: str  # "zone.enter" | "zone.exit" | "line.cross"
    data: dict[str, Any]


@dataclass(slots=True)
class _Occupant:
    enter_pts: float
    last_pts: float
    label: str


class StreamTracker:
    """One per stream; never shared. Not thread-safe (called from one task).

    ``update`` keeps every input detection: ``track_id`` is set in place to the track's id, or ``None`` while
    ByteTrack has not confirmed a track for it (a new object's first frame, or a detection too weak to start a
    track). Unconfirmed detections take no part in zones or lines.
    """

    def __init__(self, zones: list[ZoneConfig], lines: list[LineConfig], frame_rate: float = 5.0) -> None:
        self._tracker = ByteTrackTracker(
            lost_track_buffer=round(LOST_TRACK_S * 30),  # the library counts this in 30 fps frames
            frame_rate=frame_rate,
            track_activation_threshold=ACTIVATION_CONF,
            high_conf_det_threshold=ACTIVATION_CONF,
            minimum_consecutive_frames=1,  # an id from the second sighting on
        )
        self._zones: list[ZoneConfig] = []
        self._lines: list[LineConfig] = []
        self._size: tuple[int, int] | None = None
        self._sv_zones: list[sv.PolygonZone] = []
        self._sv_lines: list[sv.LineZone | None] = []
        self._inside: list[dict[int, _Occupant]] = []
        self._counts: list[dict[str, int]] = []
        self.configure(zones, lines, frame_rate)

    def configure(self, zones: list[ZoneConfig], lines: list[LineConfig], frame_rate: float) -> None:
        """Apply new settings at run time. Track ids survive; zone (line) state is reset only when the zones
        (lines) actually changed: memberships are dropped without exit events, counts restart at zero."""
        if frame_rate <= 0:
            raise ValueError("frame_rate must be positive")
        # The buffer is a frame count: rescale it so that it still spans LOST_TRACK_S at the new rate.
        self._tracker.maximum_frames_without_update = max(1, math.ceil(LOST_TRACK_S * frame_rate))
        if list(zones) != self._zones:
            self._zones = list(zones)
            self._inside = [{} for _ in self._zones]
            self._size = None  # rebuild the sv objects on the next frame
        if list(lines) != self._lines:
            self._lines = list(lines)
            self._counts = [{"in": 0, "out": 0} for _ in self._lines]
            self._size = None

    def update(self, detections: list[Detection], width: int, height: int, pts: float) -> list[SceneEvent]:
        """Track this frame's detections (setting ``track_id`` in place) and return its zone and line events.

        A track inside a zone that stops being detected stays inside while ByteTrack keeps it (occlusion);
        once the track is dropped it leaves with a ``zone.exit`` whose ``dwell_s`` runs to the last frame it
        was seen in.
        """
        if self._size != (width, height):
            self._build(width, height)
        scale = np.array([width, height, width, height], dtype=np.float64)
        n = len(detections)
        tracked = self._tracker.update(
            sv.Detections(
                xyxy=np.array([d.box for d in detections], dtype=np.float64).reshape(n, 4) * scale,
                confidence=np.array([d.conf for d in detections], dtype=np.float64),
                class_id=np.array([d.class_id for d in detections], dtype=int),
                data={"index": np.arange(n)},  # sliced along with the rows: maps results back to the input
            )
        )
        for d in detections:
            d.track_id = None
        rows: list[tuple[int | None, str]] = []  # (track id, label) per row of `tracked`
        for index, raw in zip(tracked.data.get("index", ()), tracked.tracker_id, strict=True):
            det = detections[int(index)]
            det.track_id = int(raw) + 1 if raw >= 0 else None
            rows.append((det.track_id, det.label))
        alive = {t.tracker_id + 1 for t in self._tracker.tracks if t.tracker_id >= 0}

        events: list[SceneEvent] = []
        for zone, sv_zone, inside in zip(self._zones, self._sv_zones, self._inside, strict=True):
            hits = sv_zone.trigger(tracked)
            seen: set[int] = set()
            for (track_id, label), hit in zip(rows, hits, strict=True):
                if track_id is None:
                    continue
                seen.add(track_id)
                occupant = inside.get(track_id)
                if hit and occupant is None:
                    inside[track_id] = _Occupant(pts, pts, label)
                    events.append(SceneEvent("zone.enter", {"zone": zone.name, "track_id": track_id, "label": label}))
                elif hit and occupant is not None:
                    occupant.last_pts, occupant.label = pts, label
                elif occupant is not None:
                    events.append(_exit(zone, track_id, inside.pop(track_id), pts))
            for track_id in [t for t in inside if t not in seen and t not in alive]:
                occupant = inside.pop(track_id)
                events.append(_exit(zone, track_id, occupant, occupant.last_pts))

        for line, sv_line, counts in zip(self._lines, self._sv_lines, self._counts, strict=True):
            if sv_line is None:
                continue
            crossed_in, crossed_out = sv_line.trigger(tracked)
            for (track_id, label), went_in, went_out in zip(rows, crossed_in, crossed_out, strict=True):
                if track_id is None or not (went_in or went_out):
                    continue
                direction = "in" if went_in else "out"
                counts[direction] += 1
                events.append(SceneEvent("line.cross", {"line": line.name, "track_id": track_id, "label": label,
                                                        "direction": direction}))
        return events

    @property
    def lost(self) -> int:
        """Confirmed tracks the last update did not see (occluded or gone) and ByteTrack has not dropped yet."""
        return sum(1 for t in self._tracker.tracks if t.tracker_id >= 0 and t.time_since_update > 0)

    @property
    def unconfirmed(self) -> int:
        """New tracks seen once: the next update confirms them (an id) or drops them."""
        return sum(1 for t in self._tracker.tracks if t.tracker_id < 0)

    @property
    def tracking(self) -> bool:
        """Whether ByteTrack holds any track (confirmed, lost or new)."""
        return bool(self._tracker.tracks)

    @property
    def occupancy(self) -> dict[str, list[int]]:
        """Zone name -> ids of the tracks inside now (including ones briefly lost but still tracked)."""
        return {zone.name: sorted(inside) for zone, inside in zip(self._zones, self._inside, strict=True)}

    @property
    def line_counts(self) -> dict[str, dict[str, int]]:
        """Line name -> {"in": n, "out": n} since the lines were last (re)configured."""
        return {line.name: dict(counts) for line, counts in zip(self._lines, self._counts, strict=True)}

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


def _line_zone(line: LineConfig, width: int, height: int) -> sv.LineZone | None:
    start = sv.Point(line.start[0] * width, line.start[1] * height)
    end = sv.Point(line.end[0] * width, line.end[1] * height)
    if start.x == end.x and start.y == end.y:
        return None  # a zero-length line can never be crossed (sv.LineZone rejects it)
    return sv.LineZone(start=start, end=end, triggering_anchors=_ANCHOR)


def _exit(zone: ZoneConfig, track_id: int, occupant: _Occupant, exit_pts: float) -> SceneEvent:
    return SceneEvent("zone.exit", {"zone": zone.name, "track_id": track_id, "label": occupant.label,
                                    "dwell_s": round(exit_pts - occupant.enter_pts, 3)})
