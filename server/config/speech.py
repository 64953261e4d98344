"""``speech``: ``/v1/audio/speech``."""

from __future__ import annotations

from pydantic import Field

from server.config.base import Section


class SpeechSettings(Section):
    """OpenAI-compatible ``/v1/audio/speech`` with the configured TTS backend (``models.tts``)."""

    enabled: bool = True
    max_input_chars: int = Field(4096, ge=1)
    max_pending_requests: int = Field(8, ge=1, description="Requests waiting or running; more get 503.")
    model_aliases: list[str] = Field(
        default_factory=lambda: ["tts-1", "tts-1-hd", "gpt-4o-mini-tts"],
        description="Model names accepted besides the backend's own.",
    )
    voices: list[str] = Field(
        default_factory=lambda: ["alloy", "ash", "ballad", "coral", "echo", "fable", "onyx", "nova", "sage",
                                 "shimmer", "verse", "marin", "cedar"],
        description="Voice names accepted (all speak with the configured voice), besides the backend's own.",
    )
