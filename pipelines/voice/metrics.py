"""One turn's metrics as the voice loop learns them, stage by stage: a typed field per ``TurnMetrics`` field, so
a misspelt name is the type checker's error (and, with slots, an ``AttributeError`` at run time), not a key that
silently never reaches the client. ``tests/unit/test_voice_parts.py`` keeps the two field lists equal."""

from __future__ import annotations

import time
from dataclasses import dataclass, fields
from typing import Literal

from pipelines import telemetry
from pipelines.protocol import TurnMetrics

# The stages also observed as vigil_voice_stage_ms when the turn is reported (voice_to_voice and barge_in_stop
# are observed when they happen).
EndOfTurn = Literal["model", "silence_cap", "silence", "max_turn"]
REPORTED_STAGES = ("end_of_speech_to_final_ms", "llm_first_token_ms", "first_audio_ms")


def ms_since(moment: float) -> float:
    return round((time.perf_counter() - moment) * 1000.0, 1)


@dataclass(slots=True)
class TurnMetricsBuilder:
    """``TurnMetrics`` without ``turn`` and ``speech_ms`` (the turn's own): None until the stage happened."""

    end_of_speech_to_final_ms: float | None = None
    llm_first_token_ms: float | None = None
    first_audio_ms: float | None = None
    voice_to_voice_ms: float | None = None
    barge_in_stop_ms: float | None = None
    prefill: Literal["none", "reused", "restarted"] = "none"
    prefill_saved_ms: float | None = None
    memory_retrieval_ms: float | None = None
    memory_entries: int | None = None
    end_of_turn: EndOfTurn | None = None
    end_of_turn_ms: float | None = None
    turn_score: float | None = None
    turn_model_ms: float | None = None
    final_decode: Literal["early", "partial", "new"] | None = None
    speculation: Literal["none", "played", "discarded"] = "none"
    speculations_discarded: int = 0
    audio_send_ms: float | None = None
    continues_turn: int | None = None

    def speculation_discarded(self) -> None:
        """A speculative reply of this turn was discarded unheard (a later one that played still wins)."""
        self.speculations_discarded += 1
        if self.speculation != "played":
            self.speculation = "discarded"

    def build(self, turn: int, speech_ms: float) -> TurnMetrics:
        stages = {f.name: getattr(self, f.name) for f in fields(self)}
        return TurnMetrics(turn=turn, speech_ms=speech_ms, **{k: v for k, v in stages.items() if v is not None})

    def observe(self) -> None:
        """The reported stages into ``vigil_voice_stage_ms`` (once per turn, when it is reported)."""
        for stage in REPORTED_STAGES:
            value = getattr(self, stage)
            if value is not None:
                telemetry.VOICE_STAGE_MS.labels(stage=stage.removesuffix("_ms")).observe(value)
