"""``backend: whisper``: Whisper on CTranslate2 (faster-whisper), packaged tiny.en by default."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from models.registry import BackendConfig
from models.stt_backends import SPEECH_TO_TEXT

if TYPE_CHECKING:
    from models.stt import WhisperStt


class WhisperConfig(BackendConfig):
    backend: Literal["whisper"] = "whisper"
    model_dir: str | None = Field(
        None, description="CTranslate2 Whisper directory, or 'base' (packaged parts); None: packaged tiny.en."
    )
    device: str = "cpu"
    compute_type: str = "int8"
    short_window: bool = Field(
        True, description="Live voice turns: decode a window fitted to the utterance (speech + 7.5 s, at least "
        "10 s) instead of Whisper's 30 s, ~4x less encoder work; a degenerate decode is redone on 30 s."
    )


@SPEECH_TO_TEXT.register(WhisperConfig)
def build(config: WhisperConfig) -> WhisperStt:
    from models.stt import WhisperStt

    return WhisperStt(config.model_dir, device=config.device, compute_type=config.compute_type,
                      short_window=config.short_window)
