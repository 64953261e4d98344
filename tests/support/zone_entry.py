"""A named test seam for the video analyser: one zone entry, reported when the test says it is due."""

from __future__ import annotations

from typing import Any

# The zone the seam reports into, as a client configures it: the frame's right half.
RIGHT_HALF = {"name": "door", "polygon": [[0.5, 0.0], [1.0, 0.0], [1.0, 1.0], [0.5, 1.0]]}


class ZoneEntryAnalyzerForTest:
    """Named seam: no detector runs; on the first frame for which :meth:`due` is true it reports one ``zone.enter``
    (a person, track 1) into ``zone``, so the code under test (alerts, clips, memory) gets a real pipeline event.
    Subclasses say which zone and when."""

    name = "zone-entry-for-test"
    zone = "door"

    def __init__(self) -> None:
        self.fired = False

    def due(self, sampled: Any) -> bool:
        raise NotImplementedError

    def configure(self, config: Any) -> None:
        return None

    async def analyze(self, sampled: Any) -> Any:
        from pipelines.ports import DetectionResult

        events = []
        if not self.fired and self.due(sampled):
            self.fired = True
            events = [("zone.enter", {"zone": self.zone, "track_id": 1, "label": "person"})]
        return DetectionResult(width=sampled.frame.width, height=sampled.frame.height, objects=[],
                               inference_ms=0.0, model=self.name, events=events)
