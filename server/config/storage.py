"""``storage``: the persisted timeline (events, transcripts, replies, scene summaries), event clips and snapshots."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from server.config.base import Section


class AppearRule(Section):
    """Raise an ``object.appeared`` event when a new track of ``label`` is first seen (at ``min_conf`` or more)."""

    label: str = Field(min_length=1, max_length=100)
    min_conf: float = Field(0.0, ge=0, le=1)


class StorageSettings(Section):
    enabled: bool = Field(True, description="Persist the timeline and record event clips; off: live events only.")
    data_dir: Path = Field(Path("data/timeline"), description="SQLite timeline (WAL), clips/ and snapshots/.")
    retention_days: float = Field(30.0, gt=0, description="Entries (and their files) older than this are deleted.")
    quota_bytes: int = Field(10 * 1024**3, ge=0, description="Clips + snapshots on disk; oldest clips go first.")
    retention_interval_s: float = Field(60.0, gt=0, description="How often retention runs in the background.")
    clips: bool = Field(True, description="Record an MP4 clip and a JPEG snapshot per event.")
    pre_s: float = Field(3.0, ge=0, le=60, description="Seconds of video kept before an event.")
    post_s: float = Field(3.0, ge=0, le=60, description="Seconds recorded after it (later events extend the clip).")
    max_s: float = Field(60.0, gt=0, le=600, description="Longest clip; extensions stop there.")
    clip_fps: float = Field(10.0, gt=0, le=60, description="WebRTC sessions: frames kept per second (encoded).")
    scene_interval_s: float = Field(5.0, gt=0, description="A compact scene summary every this many seconds.")
    queue_entries: int = Field(10_000, ge=10, description="Entries waiting for the writer thread; more are dropped"
                                                          " (counted, reported once).")
    batch_entries: int = Field(200, ge=1, description="Entries committed per transaction at most.")
    appear: list[AppearRule] = Field(default_factory=list, description="'object appeared' rules, one per label.")

    @model_validator(mode="after")
    def _clip_fits(self) -> StorageSettings:
        if self.pre_s + self.post_s > self.max_s:
            raise ValueError("pre_s + post_s must not exceed max_s")
        return self
