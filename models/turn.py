"""Semantic end-of-turn detection: has the user finished what they were saying, or only paused?

Backend: Smart Turn v3.2 (BSD-2-Clause, pipecat's turn model: a Whisper-tiny encoder and a classifier,
~8 MB ONNX, 16 kHz, the last 8 s of the turn). The file ships inside the ``pipecat-ai`` wheel, installed
``--no-deps`` for the file alone (``scripts/setup.sh``); it is located with ``find_spec`` and never imported.
It runs on onnxruntime with faster-whisper's own log-mel feature extractor, preprocessed as pipecat's
``LocalSmartTurnAnalyzerV3`` does: keep the last 8 s (zero-pad at the front), normalise the waveform to zero
mean and unit variance, 80 mel bins over 800 frames.

Calls are BLOCKING (tens of milliseconds of CPU) and thread-safe: run them on a worker thread.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from models.packaged import ModelNotAvailable, packaged_file

SAMPLE_RATE = 16_000
WINDOW_S = 8
SMART_TURN_PACKAGE = "pipecat"
SMART_TURN_FILE = "audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx"


@runtime_checkable
class TurnDetector(Protocol):
    name: str

    def completion(self, audio: np.ndarray) -> float:
        """Probability (0..1) that the turn in ``audio`` (float32 mono 16 kHz, [-1, 1], the turn so far) is
        complete. Blocking."""
        ...


def smart_turn_path() -> str:
    try:
        return str(packaged_file(SMART_TURN_PACKAGE, SMART_TURN_FILE))
    except ModelNotAvailable as exc:
        raise ModelNotAvailable(
            "Smart Turn v3.2 ships inside the pipecat-ai wheel: pip install --no-deps pipecat-ai==1.14.0 "
            f"(or set voice.turn_detection: silence): {exc}"
        ) from exc


class SmartTurnV3:
    """Smart Turn v3.x through onnxruntime. Thread-safe: share one per process."""

    def __init__(self, path: str | None = None, threads: int = 1) -> None:
        import onnxruntime
        from faster_whisper.feature_extractor import FeatureExtractor

        model_path = path or smart_turn_path()
        opts = onnxruntime.SessionOptions()
        opts.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        try:
            self._session = onnxruntime.InferenceSession(model_path, sess_options=opts,
                                                         providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own types for missing or corrupt files
            raise ModelNotAvailable(f"cannot load Smart Turn from {model_path}: {exc}") from exc
        self._features = FeatureExtractor(feature_size=80, sampling_rate=SAMPLE_RATE, chunk_length=WINDOW_S)
        self.path = model_path
        self.name = "smart-turn-v3.2"
        self.completion(np.zeros(SAMPLE_RATE // 2, np.float32))  # the first run pays one-off costs

    def features(self, audio: np.ndarray) -> np.ndarray:
        """(1, 80, 800) log-mel features of the last 8 s, as pipecat computes them."""
        samples = np.asarray(audio, dtype=np.float32).reshape(-1)[-WINDOW_S * SAMPLE_RATE:]
        samples = np.pad(samples, (WINDOW_S * SAMPLE_RATE - samples.size, 0))  # silence before, speech last
        samples = (samples - samples.mean()) / np.sqrt(samples.var() + 1e-7)
        return self._features(samples, padding=0)[None].astype(np.float32)

    def completion(self, audio: np.ndarray) -> float:
        if audio.size == 0:
            return 0.0
        (probability,) = self._session.run(None, {"input_features": self.features(audio)})
        return float(np.asarray(probability).reshape(-1)[0])
