"""The persisted timeline: entries of kind ``event | transcript | reply | scene | alert`` per session or source
(``TimelineStore``), and the per-stream ``TimelineRecorder`` that fills it and writes event clips and snapshots."""

from pipelines.timeline.recorder import AppearRule, RecorderSettings, TimelineRecorder
from pipelines.timeline.store import ENTRY_KINDS, EntryKind, TimelineEntry, TimelineStore

__all__ = ["ENTRY_KINDS", "AppearRule", "EntryKind", "RecorderSettings", "TimelineEntry", "TimelineRecorder",
           "TimelineStore"]
