"""The models a voice loop runs on, loaded once and shared by every session's loop, each blocking one on a thread
of its own."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from models.llm import LanguageModel
from models.stt import SpeechToText
from models.tts import TextToSpeech
from models.turn import TurnDetector
from models.vad import SileroVadModel


@dataclass
class VoiceEngine:
    """The models (loaded once, by the app's model pool); each blocking model has its own thread (not reentrant)."""

    vad: SileroVadModel
    stt: SpeechToText
    llm: LanguageModel
    tts: TextToSpeech
    turn: TurnDetector | None = None  # semantic end of turn (None: silence only)
    vad_executor: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1, "vad"))
    stt_executor: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1, "stt"))
    tts_executor: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1, "tts"))
    turn_executor: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1, "turn"))

    @property
    def names(self) -> str:
        return f"{self.stt.name}+{self.llm.name}+{self.tts.name}"

    async def close(self) -> None:
        # The models are not ours to close: the app's model pool owns them (see server.engines).
        for executor in (self.vad_executor, self.stt_executor, self.tts_executor, self.turn_executor):
            executor.shutdown(wait=False, cancel_futures=True)

