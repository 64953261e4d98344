"""The voice loop's config: the knobs a deployment sets (``VoiceLoopOptions``, declared here once: the server's
``voice`` section is made of them) and one session's loop config (``VoiceLoopConfig``: those knobs plus what the
server decides per session)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class VoiceLoopOptions(BaseModel):
    """VAD, turn taking, prefill, barge-in and the reply's bounds, the same for every session of a server."""

    model_config = ConfigDict(extra="forbid")

    vad_threshold: float = Field(0.5, gt=0, lt=1)
    min_speech_ms: int = Field(250, ge=32, description="Speech needed before a turn starts (a cough is shorter).")
    turn_detection: Literal["smart-turn", "silence"] = Field(
        "smart-turn", description="How a turn ends: smart-turn asks the Smart Turn v3.2 model after a short "
        "silence whether the user has finished (complete: the turn ends then; unfinished: up to "
        "turn_max_silence_ms of silence); silence: after end_of_turn_silence_ms of silence, whatever was said."
    )
    end_of_turn_silence_ms: int = Field(600, ge=64, description="Silence that ends a turn (turn_detection: silence).")
    turn_check_silence_ms: int = Field(
        200, ge=32, description="smart-turn: silence after which the turn model is asked whether the turn is complete."
    )
    turn_max_silence_ms: int = Field(
        1500, ge=64, description="smart-turn: silence that ends a turn the model called unfinished (the cap)."
    )
    turn_threshold: float = Field(0.5, gt=0, lt=1, description="smart-turn: completion probability that ends a turn.")
    max_turn_s: float = Field(30.0, gt=0, description="A longer turn is cut and answered (error turn_too_long).")
    partial_interval_ms: int = Field(400, ge=100, description="How often the growing turn is re-decoded.")
    prefill: bool = Field(
        True, description="Streaming prefill: while the user speaks, an embedded LLM reads each partial's prompt "
        "ahead (its KV cache); decode the turn as soon as the user goes quiet (or, with a remote LLM, on a stable "
        "partial) and start the reply then, during the end-of-turn silence; redone if the user goes on speaking."
    )
    prefill_stable_ms: int = Field(
        300, ge=0, description="With a remote LLM: how long a partial must be stable to start a reply on it.")
    barge_in: bool = True
    barge_in_min_speech_ms: int = Field(200, ge=32, description="User speech that interrupts a reply.")
    max_reply_tokens: int = Field(96, ge=1, le=4096)
    max_reply_sentences: int = Field(
        3, ge=1, le=100, description="A spoken reply stops after this many sentences, or at a sentence it already "
        "said (a small model's loop)."
    )
    scene_lead: bool = Field(
        True, description="A yes-or-no question about people in view ('Do you see anyone?') gets its first word from "
        "the detector's counts ('No,' of an empty view) and the LLM goes on from it (pipelines.voice.grounding); "
        "with an LLM that continues a last assistant message (the embedded one)."
    )
    calculator: bool = Field(
        True, description="A question that is only a sum ('What is 17 times 23?', 'Add two to that.') is answered "
        "exactly, without the LLM (pipelines.voice.arithmetic): a small model gets such sums wrong."
    )
    repeat_penalty: float = Field(1.1, gt=0, le=2, description="llama.cpp's repetition penalty (embedded LLM; 1: off).")
    memory_tokens: int = Field(1024, ge=64, description="Prompt budget: older exchanges are dropped beyond it.")
    temperature: float = Field(0.0, ge=0, le=2)
    silent_track_s: float = Field(10.0, gt=0, description="Digital silence this long is reported (audio_silent).")
    reply_burst_ms: float = Field(
        80, ge=0, le=500, description="The first reply audio after silence is sent this much ahead of real time "
        "(back to back), so that a receiver's jitter buffer plays it sooner; given back in the next silence."
    )

    @model_validator(mode="after")
    def _cap_after_check(self) -> VoiceLoopOptions:
        if self.turn_max_silence_ms <= self.turn_check_silence_ms:
            raise ValueError("voice.turn_max_silence_ms must be longer than voice.turn_check_silence_ms")
        return self


class VoiceLoopConfig(VoiceLoopOptions):
    """One session's voice loop: the options, and what its builder decides for this session (no defaults, so that
    the server's policy and prompt are the only ones)."""

    model_config = ConfigDict(frozen=True)

    echo_gating: bool = Field(description="Ignore VAD while our reply plays (a source without echo cancelling).")
    system_prompt: str = Field(description="The LLM's instructions.")
