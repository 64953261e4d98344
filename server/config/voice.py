"""``voice``: the voice loop (VAD, turns, prefill, barge-in, the LLM's prompt). Its knobs are the pipeline's
(``pipelines.voice.config.VoiceLoopOptions``); this section adds what the server decides: whether there is a voice
loop, echo gating per session origin (``server.engines.voice_loop_config``) and the prompt."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pipelines.voice.config import VoiceLoopOptions
from server.config.base import Section


class VoiceSettings(VoiceLoopOptions, Section):
    enabled: bool = True
    echo_gating: Literal["auto", "on", "off"] = Field(
        "auto", description="Ignore VAD while our reply plays; auto: on for RTSP/file sources (no echo cancelling)."
    )
    system_prompt: str = Field(
        "You are Vigil, a helpful voice assistant. Your answers are spoken aloud: answer in one or two short, "
        "plain sentences, without lists or markdown. If you are not sure, say so briefly.",
        description="The LLM's instructions; the voice loop adds the camera (and the scene, when the question is "
        "about it) only in sessions with a video track.",
    )
