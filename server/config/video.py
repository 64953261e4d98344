"""``video``: the analysis rate, batching, default zones and lines, motion gating."""

from __future__ import annotations

from pydantic import Field

from pipelines.protocol import LineConfig, MotionConfig, ObjectsConfig, ZoneConfig
from server.config.base import Section
from server.config.faces import FacesSection, PlatesSection


class VideoSettings(Section):
    target_fps: float = Field(5.0, gt=0, le=120, description="Default analysis rate; sessions may change it.")
    max_batch: int = Field(8, ge=1, description="Frames per batched inference call across streams.")
    max_wait_ms: float = Field(10.0, ge=0, description="How long the batcher waits to fill a batch.")
    inference_nice: int = Field(
        0, ge=0, le=19,
        description="Niceness added to the detector's inference threads (Linux): on an oversubscribed CPU the "
                    "voice loop keeps its latency and video analysis takes what is left (late frames are dropped, "
                    "counted). 0: the detector competes equally. 19 beside 16 cameras on 2 cores: the voice heard "
                    "~0.7x as late, and some zone events lost (docs/architecture.md).")
    detector_workers: int = Field(
        0, ge=0, le=64,
        description="Detector worker processes (0: detection runs in the server's process, on a thread). Each worker "
                    "loads models.detector itself and batches across the streams it serves; frames cross in shared "
                    "memory. A worker that dies or hangs is restarted; its streams see a counted detector outage "
                    "(vigil_detector_outages_total), never a session end.")
    detector_worker_timeout_s: float = Field(
        10.0, gt=0,
        description="With detector_workers: a worker that sends no heartbeat, or leaves a frame unanswered, this long "
                    "is taken as hung, killed and restarted.")
    zones: list[ZoneConfig] = Field(default_factory=list, description="Default zones for every session/source.")
    lines: list[LineConfig] = Field(default_factory=list, description="Default counting lines.")
    motion: MotionConfig = Field(
        default_factory=MotionConfig,
        description="Motion-gated detection, the default for every session/source (a session may override any key "
                    "in its video.motion): the detector runs only on frames with motion, a stream's first frame, and "
                    "every refresh_s while objects are in view; other sampled frames are counted as no_motion.")
    objects: ObjectsConfig = Field(
        default_factory=ObjectsConfig,
        description="Per-label object filters, the default for every session/source (Frigate's): a detection below "
                    "min_score (or outside min_area..max_area, min_ratio..max_ratio) is never tracked, and a track "
                    "raises zone and line events, appearances, clips and alerts only once the median of its last "
                    "scores reaches threshold. Defaults (min_score 0.5, threshold 0.7) chosen by bench/events.py.")
    faces: FacesSection = Field(default_factory=FacesSection, description="Face recognition (off by default).")
    plates: PlatesSection = Field(default_factory=PlatesSection, description="Licence plates (off by default).")
