"""One turn's record, shared by the voice loop's parts: its number, when its speech ended, its final text, its
metrics, and the earlier turn it continues (one whose reply was cut before the user could have heard it)."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

from pipelines.voice.metrics import TurnMetricsBuilder


@dataclass
class Turn:
    number: int
    started: float = field(default_factory=time.perf_counter)
    end_of_speech: float | None = None
    speech_ms: float = 0.0
    audio_queued: float | None = None  # when its reply's first audio was queued to play
    metrics: TurnMetricsBuilder = field(default_factory=TurnMetricsBuilder)
    reported: bool = False
    text: str = ""  # the final transcript, once known
    prefix: str = ""  # the text of the turn it continues (whose reply was cut before the user could hear it)


def continued(before: str, after: str) -> str:
    """A turn whose reply was cut unheard, joined with what the user went on to say: "Could you tell me?" +
    "what the weather will be like?" -> "Could you tell me what the weather will be like?"."""
    return f"{before.rstrip().rstrip('.?!')} {after.lstrip()}".strip()


def normalise(text: str) -> str:
    """Lower case, letters, digits and spaces: two transcripts that say the same words compare equal."""
    return re.sub(r"[^a-z0-9 ]", "", text.lower()).strip()
