"""Voice activity detection: Silero VAD v6 (the ONNX file faster-whisper ships) through onnxruntime.

One :class:`SileroVadModel` is loaded per process and shared by every session; each audio stream owns a
small :class:`VadStream` holding the model's recurrent state and the last samples of the previous frame.

Every call here is BLOCKING (about a quarter of a millisecond of CPU per 32 ms frame); callers on the event
loop run it on a worker thread.
"""

from __future__ import annotations

import numpy as np

from models.packaged import ModelNotAvailable, packaged_file

SAMPLE_RATE = 16_000
FRAME_SAMPLES = 512  # 32 ms at 16 kHz: the only window size Silero v6 takes at this rate
CONTEXT_SAMPLES = 64  # the tail of the previous frame, prepended to each frame
STATE_SHAPE = (1, 1, 128)  # LSTM h and c


def silero_vad_path() -> str:
    return str(packaged_file("faster_whisper", "assets/silero_vad_v6.onnx"))


class SileroVadModel:
    """The loaded Silero v6 network. Thread-safe: share one instance across all streams and threads.

    The model takes ``input`` of shape (n, 576) — n consecutive frames, each being 64 context samples then
    512 new samples — plus LSTM state ``h`` and ``c`` (1, 1, 128), and returns one speech probability per
    frame and the new state. It carries the state across the n frames itself, so one call on n frames equals
    n calls on one frame.
    """

    sample_rate = SAMPLE_RATE
    frame_samples = FRAME_SAMPLES

    def __init__(self, path: str | None = None, threads: int = 1) -> None:
        try:
            import onnxruntime
        except ImportError as exc:  # pragma: no cover - onnxruntime comes with faster-whisper
            raise ModelNotAvailable("Silero VAD needs onnxruntime (pip install onnxruntime)") from exc
        model_path = path or silero_vad_path()
        opts = onnxruntime.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.enable_cpu_mem_arena = False
        opts.log_severity_level = 3
        try:
            self._session = onnxruntime.InferenceSession(
                model_path, sess_options=opts, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:  # onnxruntime raises its own exception types for missing/corrupt files
            raise ModelNotAvailable(f"cannot load Silero VAD from {model_path}: {exc}") from exc
        self.path = model_path
        self.name = "silero-vad-v6"

    def stream(self) -> VadStream:
        """Fresh per-stream state bound to this model."""
        return VadStream(self)

    def run(self, windows: np.ndarray, h: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Raw call: windows (n, 576) float32, state (1, 1, 128) each -> (probabilities (n,), h, c). Blocking."""
        probs, h_out, c_out = self._session.run(None, {"input": windows, "h": h, "c": c})
        return np.asarray(probs, dtype=np.float32).reshape(-1), h_out, c_out


class VadStream:
    """Per-stream VAD state over a shared :class:`SileroVadModel`.

    Feed consecutive 512-sample frames of float32 mono 16 kHz audio in [-1, 1]. Not thread-safe: use one
    stream from one thread at a time (calls are blocking; run them on a worker thread).
    """

    def __init__(self, model: SileroVadModel) -> None:
        self.model = model
        self._h = np.zeros(STATE_SHAPE, dtype=np.float32)
        self._c = np.zeros(STATE_SHAPE, dtype=np.float32)
        self._context = np.zeros(CONTEXT_SAMPLES, dtype=np.float32)

    def reset(self) -> None:
        """Forget all past audio (start of a new utterance or a new stream)."""
        self._h.fill(0.0)
        self._c.fill(0.0)
        self._context.fill(0.0)

    def probability(self, frame: np.ndarray) -> float:
        """Speech probability (0..1) of one 512-sample frame following the previous one. Blocking."""
        samples = _as_float_audio(frame)
        if samples.shape != (FRAME_SAMPLES,):
            raise ValueError(f"VAD frame must be {FRAME_SAMPLES} mono samples at 16 kHz, got shape {frame.shape}")
        window = np.concatenate([self._context, samples])[None, :]
        probs, self._h, self._c = self.model.run(window, self._h, self._c)
        self._context = samples[-CONTEXT_SAMPLES:].copy()
        return float(probs[0])

    def probabilities(self, audio: np.ndarray) -> np.ndarray:
        """Probabilities of consecutive frames in one model call; len(audio) must be a multiple of 512.

        Same result as calling :meth:`probability` per frame, cheaper per frame. Blocking.
        """
        samples = _as_float_audio(audio)
        if samples.ndim != 1 or samples.size % FRAME_SAMPLES:
            raise ValueError(f"audio must be 1-D with a multiple of {FRAME_SAMPLES} samples, got {audio.shape}")
        if samples.size == 0:
            return np.zeros(0, dtype=np.float32)
        frames = samples.reshape(-1, FRAME_SAMPLES)
        contexts = np.concatenate([self._context[None, :], frames[:-1, -CONTEXT_SAMPLES:]], axis=0)
        windows = np.ascontiguousarray(np.concatenate([contexts, frames], axis=1))
        probs, self._h, self._c = self.model.run(windows, self._h, self._c)
        self._context = frames[-1, -CONTEXT_SAMPLES:].copy()
        return probs


def _as_float_audio(audio: np.ndarray) -> np.ndarray:
    if not np.issubdtype(audio.dtype, np.floating):
        raise TypeError(f"VAD takes float audio in [-1, 1], got {audio.dtype} (scale int16 by 1/32768)")
    return np.asarray(audio, dtype=np.float32)
