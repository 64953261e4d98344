"""Per-session scene state: what the camera sees now, kept by the session pipeline for the REST API, the voice
loop's prompt and the timeline's alerts."""

from __future__ import annotations

from collections import Counter, deque
from typing import Any


class SceneState:
    def __init__(self, recent_events: int = 20) -> None:
        self.counts: dict[str, int] = {}
        self.zone_occupancy: dict[str, list[int]] = {}
        self.line_counts: dict[str, dict[str, int]] = {}
        self.recent_events: deque[dict[str, Any]] = deque(maxlen=recent_events)
        self.pts: float | None = None  # media time of the last analysed frame
        self.ts: float | None = None
        self.last_change_ts: float | None = None
        self.model: str | None = None
        self.known: list[str] = []  # who and which is in view (video.faces, video.plates): known_in_view

    def update(self, *, labels: list[str], pts: float, ts: float, model: str,
               zone_occupancy: dict[str, list[int]], line_counts: dict[str, dict[str, int]],
               events: list[dict[str, Any]], known: list[str] | None = None) -> None:
        counts = dict(sorted(Counter(labels).items()))
        self.known = list(known or [])
        occupancy = {name: sorted(ids) for name, ids in zone_occupancy.items()}
        if counts != self.counts or occupancy != self.zone_occupancy or events:
            self.last_change_ts = ts
        self.counts, self.zone_occupancy = counts, occupancy
        self.line_counts = {name: dict(c) for name, c in line_counts.items()}
        self.pts, self.ts, self.model = pts, ts, model
        for event in events:
            self.recent_events.append({"ts": ts, "pts": pts, **event})

    def as_dict(self) -> dict[str, Any]:
        return {
            "counts": self.counts,
            "zones": self.zone_occupancy,
            "lines": self.line_counts,
            "recent_events": list(self.recent_events),
            "pts": self.pts,
            "ts": self.ts,
            "last_change_ts": self.last_change_ts,
            "model": self.model,
            "known": self.known,
        }

    def summary(self) -> str:
        """One short English paragraph for an LLM prompt."""
        if self.pts is None:
            return "The camera has not been analysed yet."
        # People first and spelt out, "no one: 0 people" when none: a small model asked "do you see anyone?"
        # answers yes to "sees nothing", and reads a count of people (bench/answers.py, the scene questions).
        people = self.counts.get("person", 0)
        others = ", ".join(f"{n} {label}{'s' if n != 1 else ''}" for label, n in self.counts.items()
                           if label != "person")
        if people:
            parts = [f"The camera sees {_people(people)}{', ' + others if others else ''}."]
        else:
            parts = ["The camera sees no one: 0 people.", f"It sees {others}." if others else "Nothing is in view."]
        if self.known:  # "who is at the door?"
            parts.append(f"Recognised in view: {', '.join(self.known)}.")
        for zone, ids in self.zone_occupancy.items():
            parts.append(f"Zone '{zone}': {len(ids)} in it." if ids else f"Zone '{zone}': empty (no one in it).")
        for line, c in self.line_counts.items():
            parts.append(f"Line '{line}' was crossed {c.get('in', 0)} time(s) in and {c.get('out', 0)} out.")
        if self.recent_events:
            last = list(self.recent_events)[-3:]
            parts.append("Recent events: " + "; ".join(
                f"{e['name']} {e.get('zone') or e.get('line') or ''} (track {e.get('track_id')})".replace("  ", " ")
                for e in last) + ".")
        return " ".join(parts)


def _people(n: int) -> str:
    return "1 person" if n == 1 else f"{n} people"


def trusted(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The objects that count for the scene (counts, summaries, appearances): all but those a tracker marked
    unconfirmed (``video.objects``: too weak, or a track whose scores have not reached its threshold yet)."""
    return [obj for obj in objects if obj.get("confirmed") is not False]


def known_in_view(objects: list[dict[str, Any]]) -> list[str]:
    """Who and which of this frame's objects: enrolled people by name, vehicles by plate (and its name)."""
    found = set()
    for obj in objects:
        name = (obj.get("identity") or {}).get("name")
        if name:
            found.add(f"{name} ({obj['label']})")
        plate = obj.get("plate")
        if plate:
            found.add(f"a {obj['label']} with plate {plate['text']}" + (f" ({plate['name']})" if plate.get("name")
                                                                          else ""))
    return sorted(found)
