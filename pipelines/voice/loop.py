"""The voice loop of one session: VAD -> streaming STT -> streaming LLM -> streaming TTS -> reply track.

Audio arrives in order and is never dropped. Each turn moves through small steps that talk in protocol
messages: partial transcripts while the user speaks (a word prefix two consecutive decodes agree on), an early
LLM request once the partial has been stable for a while (streaming prefill), a final transcript at the end of
the turn, then reply deltas, clause-then-sentence speech, and a ``metrics`` message with the turn's timings.
Barge-in (the user speaking over a reply) is a message too: an ``event`` ``barge_in`` after the reply was cut.

The end of a turn (``turn_detection``): ``smart-turn`` asks a turn model (``models.turn``) after a short silence
whether the user has finished; complete ends the turn there, unfinished keeps listening up to a longer silence
(the cap). ``silence`` ends a turn after a fixed silence. While the user is quiet and the turn is not confirmed
yet, the reply is generated and its first audio synthesised speculatively, held unheard, and played the moment
the turn ends if the final transcript matches; speech that goes on discards it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import av
import numpy as np

from models.llm import ChatMessage, LanguageModel, LlmRequest, LlmUnavailable
from models.tts import TextToSpeech
from models.turn import TurnDetector
from models.vad import SileroVadModel, VadStream
from pipelines import telemetry
from pipelines.protocol import Event, Metrics, Reply, Transcript, TurnMetrics
from pipelines.voice.audio import InputResampler, ReplyAudioTrack, resample_pcm, trim_silence
from pipelines.voice.endpointing import (
    FRAME_SAMPLES,
    MAX_PAUSE_MS,
    Endpointer,
    TurnEnded,
    TurnStarted,
    sounds_unfinished,
)
from pipelines.voice.replies import (
    ReplyGuard,
    about_scene,
    acknowledge,
    asks_for_reminders,
    has_video,
    recite,
    reminder_request,
    session_prompt,
    without_camera,
)
from pipelines.voice.sentences import split_first_clause, split_sentences

if TYPE_CHECKING:
    from models.stt.whisper import WhisperStt
    from pipelines.session import SessionPipeline

log = logging.getLogger(__name__)

ECHO_TAIL_S = 0.4  # room reverberation after our reply stops still reaches the microphone
CLAUSE_PAUSE_MS = 120  # the pause kept after a clause spoken on its own (Piper ends every chunk with ~200 ms)


# How long the turn check waits for the early decode of the same speech, to see whether its words can end a turn.
UNFINISHED_CHECK_WAIT_S = 0.3

@dataclass(frozen=True, slots=True)
class VoiceLoopConfig:
    vad_threshold: float = 0.5
    min_speech_ms: float = 250
    turn_detection: str = "silence"  # "smart-turn" needs VoiceEngine.turn
    end_of_turn_silence_ms: float = 600
    turn_check_silence_ms: float = 200
    turn_max_silence_ms: float = 1500
    turn_threshold: float = 0.5
    max_turn_s: float = 30.0
    partial_interval_ms: float = 400
    prefill: bool = True
    prefill_stable_ms: float = 300
    barge_in: bool = True
    barge_in_min_speech_ms: float = 200
    echo_gating: bool = False
    # No default: the one prompt is the config's (voice.system_prompt), passed by server.config_mapping.
    system_prompt: str = field(kw_only=True)
    max_reply_tokens: int = 96
    max_reply_sentences: int = 3  # a spoken answer stops after this many sentences (and at a repeated one)
    repeat_penalty: float = 1.1  # llama.cpp's repetition penalty (1: off); the sentence guard catches the rest
    memory_tokens: int = 1024
    temperature: float = 0.0
    silent_track_s: float = 10.0
    reply_burst_ms: float = 80.0


@dataclass(frozen=True, slots=True)
class PromptContext:
    """Extra system-prompt text for one turn (e.g. remembered entries) and the turn metrics it adds."""

    text: str
    metrics: dict[str, Any] = field(default_factory=dict)


# Called with the user's text and the conversation so far, before the LLM is prompted; None adds nothing.
ContextProvider = Callable[[str, list[ChatMessage]], Awaitable[PromptContext | None]]


@dataclass
class VoiceEngine:
    """The models (loaded once, by the app's model pool); each blocking model has its own thread (not reentrant)."""

    vad: SileroVadModel
    stt: WhisperStt
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


def _words(text: str) -> list[str]:
    return text.split()


def _normalise(text: str) -> str:
    return re.sub(r"[^a-z0-9 ]", "", text.lower()).strip()


def _continued(before: str, after: str) -> str:
    """A turn whose reply was cut unheard, joined with what the user went on to say: "Could you tell me?" +
    "what the weather will be like?" -> "Could you tell me what the weather will be like?"."""
    return f"{before.rstrip().rstrip('.?!')} {after.lstrip()}".strip()


def _agreed_prefix(previous: str, current: str) -> str:
    """The words two consecutive decodes agree on: stable enough to show (or to prefill with)."""
    agreed = []
    for a, b in zip(_words(previous), _words(current), strict=False):
        if _normalise(a) != _normalise(b):
            break
        agreed.append(b)
    return " ".join(agreed)


@dataclass
class _Turn:
    number: int
    started: float = field(default_factory=time.perf_counter)
    end_of_speech: float | None = None
    speech_ms: float = 0.0
    audio_queued: float | None = None  # when its reply's first audio was queued to play
    metrics: dict[str, Any] = field(default_factory=dict)
    reported: bool = False
    text: str = ""  # the final transcript, once known
    prefix: str = ""  # the text of the turn it continues (whose reply was cut before it was heard)


@dataclass
class _Speculation:
    """A reply started before the end of the turn, on a partial transcript (streaming prefill): it generates and
    synthesises its first audio, then holds it unheard until the final transcript confirms it."""

    turn: _Turn
    text: str
    started: float
    in_pause: bool = False  # started while the user was quiet (else on a stable partial, while speaking)
    task: asyncio.Task[None] | None = None
    confirmed: asyncio.Event = field(default_factory=asyncio.Event)
    audio_held: asyncio.Event = field(default_factory=asyncio.Event)  # its first audio is ready, unheard

    def cancel(self) -> None:
        if self.task is not None:
            self.task.cancel()


@dataclass(frozen=True, slots=True)
class _Decode:
    """A transcription of the turn so far and how many speech frames it covered: if the turn ends with no more
    speech, it is the final transcript."""

    speech_frames: int
    task: asyncio.Task[str]


class VoiceLoop:
    """The session's ``AudioAnalyzer``."""

    def __init__(self, engine: VoiceEngine, config: VoiceLoopConfig) -> None:
        self.engine = engine
        self.config = config
        self.name = engine.names
        self.output_track = ReplyAudioTrack(burst_ms=config.reply_burst_ms)
        self.output_track.on_first_audio = self._first_audio_sent
        self.output_track.on_silence_after_flush = self._reply_audio_stopped
        self.output_track.on_drained = self._reply_audio_drained
        self.last_request: LlmRequest | None = None  # what the LLM was last asked (tests and debugging)
        self.last_reply_stop: str | None = None  # why the ReplyGuard cut the last answer ("repeat", "sentences")
        self.context_provider: ContextProvider | None = None  # e.g. memory retrieval (server/store/memory.py)
        self._pipeline: SessionPipeline | None = None
        self._resample = InputResampler()
        self._vad = VadStream(engine.vad)
        self._smart_turn = config.turn_detection == "smart-turn" and engine.turn is not None
        end_silence = config.turn_max_silence_ms if self._smart_turn else config.end_of_turn_silence_ms
        self._endpointer = Endpointer(threshold=config.vad_threshold, min_speech_ms=config.min_speech_ms,
                                      end_silence_ms=end_silence, max_turn_s=config.max_turn_s)
        self._pending = np.zeros(0, np.float32)
        self._memory: list[ChatMessage] = []
        self._reminders: list[str] = []  # what the user asked to be reminded of, in this session
        self._turn_count = 0
        self._turn: _Turn | None = None  # the user turn being spoken
        self._replying: _Turn | None = None  # the turn whose reply is being generated or played
        self._reply_task: asyncio.Task[None] | None = None
        self._speculation: _Speculation | None = None
        self._partial_task: asyncio.Task[None] | None = None
        self._finishing: set[asyncio.Task[None]] = set()  # turns ended, waiting for their final transcript
        # Decodes of the turn so far, reused as the final transcript when no speech followed them.
        self._early: _Decode | None = None  # started as soon as the user went quiet (streaming prefill)
        self._last_partial: tuple[int, str] | None = None  # (speech frames, text) of the last partial decode
        self._turn_check: asyncio.Task[None] | None = None
        self._checked_frames = -1  # speech frames of the turn when the turn model was last asked
        self._was_speech = False
        self._last_partial_at = 0.0
        self._last_decode = ""  # the previous partial decode, to agree with
        self._shown_partial = ""
        self._stable_since: float | None = None
        self._last_played = 0.0
        self._silent_s = 0.0
        self._silence_reported = False
        self._barge_in_at: float | None = None
        self._user_quiet = asyncio.Event()  # no user turn open nor speech run: a reply may start to play
        self._user_quiet.set()
        self._unheard: _Turn | None = None  # the last turn whose reply was cut before any of it was heard

    # ------------------------------------------------------------------ AudioAnalyzer

    def attach(self, pipeline: SessionPipeline) -> None:
        self._pipeline = pipeline

    async def process(self, frame: av.AudioFrame, pts: float) -> None:
        samples = self._resample(frame)
        self._watch_for_silence(samples)
        self._pending = np.concatenate([self._pending, samples])
        count = self._pending.size // FRAME_SAMPLES
        if count == 0:
            return
        ready, self._pending = self._pending[: count * FRAME_SAMPLES], self._pending[count * FRAME_SAMPLES:]
        loop = asyncio.get_running_loop()
        probabilities = await loop.run_in_executor(self.engine.vad_executor, self._vad.probabilities, ready)
        for chunk, probability in zip(ready.reshape(count, FRAME_SAMPLES), probabilities, strict=True):
            await self._on_vad_frame(chunk, float(probability))

    async def close(self) -> None:
        tasks = [self._reply_task, self._partial_task, self._turn_check, self._early.task if self._early else None,
                 self._speculation.task if self._speculation else None, *self._finishing]
        for task in tasks:
            if task is not None:
                task.cancel()
        self.output_track.stop()
        # Let them end, then drop every reference to them and to our own methods: a finished task's traceback
        # holds this loop, and the reply track holds its callbacks, cycles that kept an ended session (its
        # resampler's filter graph and threads) alive until a full garbage collection (issue 23).
        pending = [task for task in tasks if task is not None and not task.done()]
        if pending:
            await asyncio.wait(pending, timeout=5.0)
        self._reply_task = self._partial_task = self._turn_check = None
        self._early = self._speculation = None
        self._turn = self._replying = self._unheard = None
        self._finishing.clear()
        track = self.output_track
        track.on_first_audio = track.on_silence_after_flush = track.on_drained = None
        self.context_provider = None
        self._pipeline = None

    async def say_text(self, text: str) -> None:
        """A typed user turn (gRPC Converse): no VAD or STT, otherwise answered like a spoken turn. It interrupts
        a reply still playing, as speaking over it would."""
        await self._interrupt_reply()
        self._cancel_speculation()
        self._turn_count += 1
        turn = _Turn(self._turn_count, end_of_speech=time.perf_counter())
        self._send(Transcript, turn=turn.number, text=text, final=True)
        self._replying = turn
        self._reply_task = asyncio.create_task(self._reply(turn, text, None), name="voice:reply")

    def announce(self, text: str) -> None:
        """Speak an alert now, as a reply of kind ``alert`` (``pipelines.timeline.alerts`` waits until ``idle``,
        so it never talks over the user). Barge-in cuts it like a reply; the next answer's history has it."""
        self._turn_count += 1
        turn = _Turn(self._turn_count, reported=True)  # no user turn: no turn metrics

        async def speak() -> None:
            self._send(Reply, turn=turn.number, delta=text, kind="alert")
            interrupted = True  # unless synthesis finishes: then the alert's audio is queued whole
            try:
                self._play(turn, await self._synthesize(text, first=True, clause=False))
                interrupted = False
            finally:
                self._send(Reply, turn=turn.number, done=True, kind="alert", interrupted=interrupted)
                if not interrupted:
                    self._memory.append(ChatMessage("assistant", text))

        self._replying, self._reply_task = turn, asyncio.create_task(speak(), name="voice:alert")

    @property
    def idle(self) -> bool:
        """No user turn in progress and no reply being generated or played."""
        return self._turn is None and not self._finishing and not self._reply_active()

    # ------------------------------------------------------------------ per frame

    def _gated(self) -> bool:
        if not self.config.echo_gating:
            return False
        if self.output_track.playing:
            self._last_played = time.perf_counter()
            return True
        return time.perf_counter() - self._last_played < ECHO_TAIL_S

    async def _on_vad_frame(self, chunk: np.ndarray, probability: float) -> None:
        event = self._endpointer.push(chunk, probability, gated=self._gated())
        if self.config.barge_in and self._reply_active() and self._barge_in_at is None \
                and self._endpointer.speech_run_ms >= self.config.barge_in_min_speech_ms:
            await self._barge_in()
        if isinstance(event, TurnStarted):
            self._start_turn()
        elif isinstance(event, TurnEnded):
            await self._end_turn(event, "max_turn" if event.truncated else
                                 "silence_cap" if self._smart_turn else "silence")
        elif self._turn is not None:
            speculation = self._speculation
            if self._endpointer.last_frame_speech and not self._was_speech and speculation is not None \
                    and speculation.in_pause and speculation.turn is self._turn:
                self._cancel_speculation()  # the user went on after a pause: the held reply is discarded unheard
            if self.config.prefill and self._was_speech and not self._endpointer.last_frame_speech:
                self._decode_early(self._turn)
            elif self._endpointer.last_frame_speech or self._early is None:
                self._maybe_partial()  # in a pause after an early decode, nothing new to decode
            await self._maybe_check_turn(self._turn)
        self._was_speech = self._endpointer.last_frame_speech
        self._update_user_quiet()

    def _update_user_quiet(self) -> None:
        """The user holds the floor while speaking or while their turn is open (pauses between words included)."""
        if self._turn is None and not self._endpointer.speech_run:
            self._user_quiet.set()
        else:
            self._user_quiet.clear()

    def _watch_for_silence(self, samples: np.ndarray) -> None:
        if samples.size and np.abs(samples).max() > 1e-4:
            self._silent_s, self._silence_reported = 0.0, False
            return
        self._silent_s += samples.size / 16000
        if self._silent_s >= self.config.silent_track_s and not self._silence_reported:
            self._silence_reported = True
            self._error("audio_silent", f"the audio track has been digitally silent for "
                                        f"{self.config.silent_track_s:g} s (muted microphone?)")

    # ------------------------------------------------------------------ turns

    def _start_turn(self) -> None:
        self._turn_count += 1
        self._turn = _Turn(self._turn_count)
        self._continue_unheard(self._turn)
        self._last_decode, self._shown_partial, self._stable_since = "", "", None
        self._early, self._last_partial, self._checked_frames = None, None, -1
        self._last_partial_at = time.perf_counter()

    async def _maybe_check_turn(self, turn: _Turn) -> None:
        """Semantic end of turn: after a short silence, ask the turn model (on its own thread) whether the turn is
        complete; if it is and the user is still quiet, the turn ends now instead of at the silence cap."""
        endpointer = self._endpointer
        if not self._smart_turn or endpointer.silence_ms < self.config.turn_check_silence_ms \
                or self._checked_frames == endpointer.speech_frames:
            return
        self._checked_frames = speech_frames = endpointer.speech_frames
        audio = endpointer.turn_audio()
        if self._pipeline is not None and self._pipeline.clock.virtual:
            await self._check_turn(turn, speech_frames, audio)  # replay stays deterministic
            return
        self._turn_check = asyncio.create_task(self._check_turn(turn, speech_frames, audio), name="voice:turn-check")

    async def _check_turn(self, turn: _Turn, speech_frames: int, audio: np.ndarray) -> None:
        assert self.engine.turn is not None
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        try:
            score = await loop.run_in_executor(self.engine.turn_executor, self.engine.turn.completion, audio)
        except Exception:
            log.exception("turn model failed; the silence cap ends this turn")
            return
        turn.metrics["turn_score"] = round(score, 3)
        turn.metrics["turn_model_ms"] = self._ms_since(started)
        still_quiet = self._turn is turn and self._endpointer.speech_frames == speech_frames
        if still_quiet and score >= self.config.turn_threshold and not await self._text_unfinished(speech_frames):
            if self._turn is turn and self._endpointer.speech_frames == speech_frames:  # still quiet after the wait
                await self._end_turn(self._endpointer.end_now(), "model")

    async def _text_unfinished(self, speech_frames: int) -> bool:
        """Whether the words so far cannot end a turn ("Could you tell me?"), which the turn model may hear as
        finished: then the turn stays open up to the silence cap. Uses the decode of this very speech (the early
        one, waited for briefly, else the last partial); without one the model decides alone."""
        early = self._early
        text: str | None = None
        if early is not None and early.speech_frames == speech_frames:
            done, _ = await asyncio.wait({early.task}, timeout=UNFINISHED_CHECK_WAIT_S)
            if done and not early.task.cancelled() and early.task.exception() is None:
                text = early.task.result()
        elif self._last_partial is not None and self._last_partial[0] == speech_frames:
            text = self._last_partial[1]
        return text is not None and sounds_unfinished(text)

    async def _end_turn(self, ended: TurnEnded, how: str) -> None:
        turn, self._turn = self._turn, None
        if turn is None:
            return
        self._update_user_quiet()
        turn.end_of_speech = time.perf_counter() - ended.silence_ms / 1000.0
        turn.speech_ms = round(ended.audio.size / 16.0, 1)
        turn.metrics["end_of_turn"] = how
        turn.metrics["end_of_turn_ms"] = round(ended.silence_ms, 1)
        if ended.truncated:
            self._error("turn_too_long", f"turn {turn.number} cut at voice.max_turn_s={self.config.max_turn_s:g} s;"
                                         " answering what was said so far")
        for task in (self._partial_task, self._turn_check):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        early, self._early = self._early, None
        partial, self._last_partial = self._last_partial, None
        if ended.truncated:
            early = partial = None
        # The final decode runs on its own task: VAD and turn detection of what follows never wait for Whisper.
        finishing = asyncio.create_task(self._finish_turn(turn, ended, early, partial), name="voice:final")
        self._finishing.add(finishing)
        finishing.add_done_callback(self._finishing.discard)
        if self._pipeline is not None and self._pipeline.clock.virtual:
            await asyncio.gather(finishing, return_exceptions=True)  # replay stays deterministic

    async def _finish_turn(self, turn: _Turn, ended: TurnEnded, early: _Decode | None,
                           partial: tuple[int, str] | None) -> None:
        try:
            if early is not None and early.speech_frames == ended.speech_frames:
                text = (await early.task).strip()  # nothing but silence came after it: it is the final text
                turn.metrics["final_decode"] = "early"
            elif partial is not None and partial[0] == ended.speech_frames:
                text = partial[1]
                turn.metrics["final_decode"] = "partial"
            else:
                if early is not None:
                    early.task.cancel()
                text = (await self._transcribe(ended.audio)).strip()
                turn.metrics["final_decode"] = "new"
        except asyncio.CancelledError:
            raise
        except Exception as error:
            log.exception("final transcription failed")
            self._error("stt_failed", f"speech recognition failed: {error}")
            self._cancel_speculation(turn)
            return
        turn.metrics["end_of_speech_to_final_ms"] = self._ms_since(turn.end_of_speech or time.perf_counter())
        if turn.prefix and text:
            text = _continued(turn.prefix, text)
        turn.text = text
        self._send(Transcript, turn=turn.number, text=text, final=True)
        if not text:
            self._cancel_speculation(turn)
            self._report(turn)
            return
        if self._turn_count > turn.number and self._turn is None:
            # The user spoke a whole further turn while this one was transcribed: that one gets the answer.
            self._cancel_speculation(turn)
            self._report(turn)
            return
        if self._replying is not None and self._replying is not turn:
            await self._interrupt_reply()  # an earlier reply still playing gives way, as barge-in would
        speculation = self._speculation if self._speculation is not None and self._speculation.turn is turn else None
        if speculation is not None:
            self._speculation = None
        if speculation is not None and _normalise(speculation.text) == _normalise(text):
            turn.metrics["prefill"] = "reused"
            turn.metrics["prefill_saved_ms"] = round((time.perf_counter() - speculation.started) * 1000.0, 1)
            turn.metrics["speculation"] = "played"
            self._replying, self._reply_task = turn, speculation.task
            speculation.confirmed.set()
            telemetry.VOICE_PREFILL.labels(outcome="reused").inc()
        else:
            if speculation is not None:
                speculation.cancel()
                turn.metrics["prefill"] = "restarted"
                self._discarded(turn)
                telemetry.VOICE_PREFILL.labels(outcome="restarted").inc()
            self._replying = turn
            self._reply_task = asyncio.create_task(self._reply(turn, text, None), name="voice:reply")
        if self._pipeline is not None and self._pipeline.clock.virtual:
            await asyncio.gather(self._reply_task, return_exceptions=True)  # replay stays deterministic

    def _decode_early(self, turn: _Turn) -> None:
        """The user just went quiet: decode the turn now, during the end-of-turn silence. If no speech follows,
        this is the final transcript (the rest is silence) and its reply is already being prepared."""
        if self._early is not None:
            self._early.task.cancel()
        speech_frames = self._endpointer.speech_frames
        audio = self._endpointer.turn_audio(MAX_PAUSE_MS)
        task = asyncio.create_task(self._transcribe(audio), name="voice:early-decode")
        self._early = _Decode(speech_frames, task)

        def speculate(done: asyncio.Task[str]) -> None:
            if done.cancelled() or done.exception() is not None or self._turn is not turn:
                return
            if self._early is not None and self._early.task is done \
                    and self._endpointer.speech_frames == speech_frames:
                text = done.result().strip()
                if text:
                    self._show_partial(turn, text)
                    self._speculate(turn, text, in_pause=True)

        task.add_done_callback(speculate)

    def _show_partial(self, turn: _Turn, text: str) -> None:
        if text != self._shown_partial:
            self._shown_partial, self._stable_since = text, time.perf_counter()
            self._send(Transcript, turn=turn.number, text=text, final=False)

    def _maybe_partial(self) -> None:
        now = time.perf_counter()
        busy = self._partial_task is not None and not self._partial_task.done()
        if busy or (now - self._last_partial_at) * 1000.0 < self.config.partial_interval_ms:
            return
        self._last_partial_at = now
        assert self._turn is not None
        self._partial_task = asyncio.create_task(
            self._partial(self._turn, self._endpointer.turn_audio(MAX_PAUSE_MS), self._endpointer.speech_frames))

    async def _partial(self, turn: _Turn, audio: np.ndarray, speech_frames: int) -> None:
        try:
            text = (await self._transcribe(audio)).strip()
        except Exception:
            log.exception("partial transcription failed")
            return
        if self._turn is not turn:
            return  # the turn ended meanwhile; its final transcript supersedes this one
        self._last_partial = (speech_frames, text)
        previous, self._last_decode = self._last_decode, text
        agreed = _agreed_prefix(previous, text)
        if agreed and agreed != self._shown_partial:
            self._show_partial(turn, agreed)
        elif agreed and self._stable_since is not None and self.config.prefill and self._speculation is None:
            if (time.perf_counter() - self._stable_since) * 1000.0 >= self.config.prefill_stable_ms:
                self._speculate(turn, agreed)

    def _speculate(self, turn: _Turn, text: str, in_pause: bool = False) -> None:
        self._cancel_speculation()
        if turn.prefix:
            text = _continued(turn.prefix, text)
        speculation = _Speculation(turn, text, time.perf_counter(), in_pause)
        speculation.task = asyncio.create_task(self._reply(turn, text, speculation), name="voice:speculation")
        self._speculation = speculation

    def _cancel_speculation(self, turn: _Turn | None = None) -> None:
        """Discard the held speculative reply (of ``turn`` only, when given); it was never heard."""
        speculation = self._speculation
        if speculation is None or (turn is not None and speculation.turn is not turn):
            return
        speculation.cancel()
        self._speculation = None
        if not speculation.confirmed.is_set():
            self._discarded(speculation.turn)

    @staticmethod
    def _discarded(turn: _Turn) -> None:
        turn.metrics["speculations_discarded"] = turn.metrics.get("speculations_discarded", 0) + 1
        if turn.metrics.get("speculation") != "played":
            turn.metrics["speculation"] = "discarded"

    async def _transcribe(self, audio: np.ndarray) -> str:
        loop = asyncio.get_running_loop()
        result = await loop.run_in_executor(self.engine.stt_executor, self.engine.stt.transcribe_live, audio)
        return result.text

    # ------------------------------------------------------------------ replies

    async def _request(self, text: str, turn: _Turn | None = None) -> LlmRequest:
        # Only what the session has: no camera without a video track (a small model repeats whatever the
        # prompt says), the scene only when the question is about it.
        video = self._pipeline is not None and has_video(self._pipeline.tracks)
        scene = self._pipeline.scene.summary() if video and self._pipeline is not None else None
        system = session_prompt(self.config.system_prompt, video=video, scene=scene, question=text)
        if self.context_provider is not None:
            context = await self.context_provider(text, list(self._memory))
            if context is not None:
                # Remembered camera entries (other sessions' cameras) only when the question is about what was
                # seen: otherwise they lead a small model to speak of a camera this session does not have.
                system += "\n\n" + (context.text if video or about_scene(text) else without_camera(context.text))
                if turn is not None:
                    turn.metrics.update(context.metrics)
        messages = [ChatMessage("system", system), *self._memory, ChatMessage("user", text)]
        # Trim the oldest exchanges until the prompt fits the memory budget (system and question always stay).
        # count_tokens may ask the model's own tokenizer (blocking): keep it off the event loop.
        while len(messages) > 2 and await asyncio.to_thread(self.engine.llm.count_tokens, messages) \
                > self.config.memory_tokens:
            del messages[1:3]
        return LlmRequest(messages, max_tokens=self.config.max_reply_tokens, temperature=self.config.temperature,
                          repeat_penalty=self.config.repeat_penalty)

    def _canned(self, text: str) -> str | None:
        """A reply that needs no LLM: a reminder is acknowledged, and "what did I ask you to remember?" is
        answered from this session's reminders (without any, the LLM answers, from memory when it has some)."""
        reminder = reminder_request(text)
        if reminder is not None:
            return acknowledge(reminder)
        if self._reminders and asks_for_reminders(text):
            return recite(self._reminders)
        return None

    async def _reply_stream(self, request: LlmRequest, canned: str | None) -> AsyncIterator[str]:
        if canned is not None:
            yield canned
            return
        async with contextlib.aclosing(self.engine.llm.stream(request)) as deltas:
            async for delta in deltas:
                yield delta

    async def _reply(self, turn: _Turn, text: str, speculation: _Speculation | None) -> None:
        """Stream the reply: text deltas out as they come, speech chunk by chunk (the first clause, then whole
        sentences). A speculative reply holds its deltas and first audio until its turn confirms it."""
        confirmed = speculation.confirmed if speculation is not None else None
        request = await self._request(text, turn)
        if confirmed is None:
            self.last_request = request
        started = time.perf_counter()
        reply_text = ""
        buffer = ""
        held: list[str] = []  # deltas not sent yet (speculative reply not yet confirmed)

        def release_deltas() -> None:
            for delta in held:
                self._send(Reply, turn=turn.number, delta=delta)
            held.clear()

        async def hold_until_confirmed() -> None:
            if speculation is not None and not speculation.confirmed.is_set():
                speculation.audio_held.set()
                await speculation.confirmed.wait()
            if speculation is not None:  # confirmed (before or during the wait): this is the turn's answer
                self.last_request = request
            release_deltas()

        spoken = 0
        first_token = True
        canned = self._canned(text)
        guard = ReplyGuard(self.config.max_reply_sentences)
        if confirmed is None:
            self.last_reply_stop = None

        async def take(delta: str) -> None:
            """Show and speak what the guard let through: the first clause alone, then whole sentences."""
            nonlocal reply_text, buffer, spoken
            reply_text += delta
            held.append(delta)
            if confirmed is None or confirmed.is_set():
                release_deltas()
            chunks, buffer = (split_first_clause if spoken == 0 else split_sentences)(buffer + delta)
            for chunk in chunks:
                pcm = await self._synthesize(chunk, first=spoken == 0, clause=spoken == 0)
                await hold_until_confirmed()  # a speculative reply's first audio waits here, ready
                await self._play_reply(turn, pcm, first=spoken == 0)
                spoken += 1

        try:
            # Closed on leaving the loop (the guard stopping a loop, a cancel): that ends generation upstream.
            async with contextlib.aclosing(self._reply_stream(request, canned)) as stream:
                async for token in stream:
                    if first_token:
                        first_token = False
                        turn.metrics["llm_first_token_ms"] = round((time.perf_counter() - started) * 1000.0, 1)
                    if delta := guard.push(token):
                        await take(delta)
                    if guard.stopped is not None:
                        if confirmed is None or confirmed.is_set():
                            self.last_reply_stop = guard.stopped
                        log.info("reply of turn %d stopped (%s) after %r", turn.number, guard.stopped, guard.text)
                        break
            if delta := guard.finish():
                await take(delta)
            await hold_until_confirmed()
            if buffer.strip():
                pcm = await self._synthesize(buffer, first=spoken == 0, clause=False)
                await self._play_reply(turn, pcm, first=spoken == 0)
            self._send(Reply, turn=turn.number, done=True)
            self._memory += [ChatMessage("user", text), ChatMessage("assistant", reply_text.strip())]
            if (reminder := reminder_request(text)) is not None:
                self._reminders.append(reminder)  # the timeline (and so memory) has the request itself
        except LlmUnavailable as error:
            if confirmed is not None and not confirmed.is_set():
                await confirmed.wait()  # a speculation reports nothing before its turn is final
            release_deltas()
            self._error("llm_unavailable", str(error))
            self._send(Reply, turn=turn.number, done=True)
        except asyncio.CancelledError:
            if confirmed is None or confirmed.is_set():  # every answer the client saw begin also ends
                release_deltas()
                self._send(Reply, turn=turn.number, done=True, interrupted=True)
            raise
        except Exception as error:
            log.exception("reply failed")
            if confirmed is not None and not confirmed.is_set():
                await confirmed.wait()
            release_deltas()
            self._error("reply_failed", f"the reply failed: {error}")
            self._send(Reply, turn=turn.number, done=True)
        finally:
            if confirmed is None or confirmed.is_set():
                self._reply_finished(turn)

    async def _synthesize(self, text: str, *, first: bool, clause: bool) -> np.ndarray:
        """48 kHz speech for one chunk of the reply; the first starts at once (its leading silence cut) and a
        clause ends with a short pause rather than a sentence's long one."""
        if self._pipeline is not None and self._pipeline.clock.virtual:
            return np.zeros(0, np.int16)  # offline replay has nowhere to play audio
        loop = asyncio.get_running_loop()
        tts = self.engine.tts
        pcm = await loop.run_in_executor(self.engine.tts_executor, tts.synthesize, text)
        pcm = trim_silence(pcm, tts.sample_rate, lead=first, keep_tail_ms=CLAUSE_PAUSE_MS if clause else None)
        return resample_pcm(pcm, tts.sample_rate)

    async def _play_reply(self, turn: _Turn, pcm48: np.ndarray, *, first: bool) -> None:
        """A reply never starts over the user: if they speak when its first audio is ready (they went on after
        a pause), it waits for the speech to end, or for the barge-in that cuts it unheard."""
        if first:
            await self._user_quiet.wait()
        self._play(turn, pcm48)

    def _play(self, turn: _Turn, pcm48: np.ndarray) -> None:
        if pcm48.size == 0:
            return
        if turn.audio_queued is None:
            turn.audio_queued = time.perf_counter()
            if turn.end_of_speech is not None:
                turn.metrics["first_audio_ms"] = self._ms_since(turn.end_of_speech)
        self.output_track.enqueue(pcm48, turn.number)

    def _reply_finished(self, turn: _Turn) -> None:
        # A turn is reported once its reply has been heard in full: now if no audio is left to play, else when
        # the track drains (_reply_audio_drained), or when a barge-in cut it (_reply_audio_stopped).
        if self._replying is turn and self._barge_in_at is None and not self.output_track.playing:
            self._report(turn)

    def _reply_audio_drained(self) -> None:
        turn = self._replying
        if turn is not None and self._reply_task is not None and self._reply_task.done():
            self._report(turn)

    def _reply_active(self) -> bool:
        return (self._reply_task is not None and not self._reply_task.done()) or self.output_track.playing

    def _first_audio_sent(self, turn_number: int, when: float) -> None:
        turn = self._replying
        if turn is None or turn.number != turn_number or turn.end_of_speech is None:
            return
        turn.metrics["voice_to_voice_ms"] = round((when - turn.end_of_speech) * 1000.0, 1)
        if turn.audio_queued is not None:
            turn.metrics["audio_send_ms"] = round((when - turn.audio_queued) * 1000.0, 1)
        telemetry.VOICE_STAGE_MS.labels(stage="voice_to_voice").observe(turn.metrics["voice_to_voice_ms"])

    async def _interrupt_reply(self) -> None:
        """Cut the reply being generated or played (a barge-in) and wait until it is reported (the track's next
        frame), so that it keeps its metrics and the next reply starts clean."""
        if not self._reply_active():
            return
        await self._barge_in()
        for _ in range(50):
            if self._barge_in_at is None:
                break
            await asyncio.sleep(0.02)

    async def _barge_in(self) -> None:
        turn = self._replying
        self._barge_in_at = time.perf_counter()
        if turn is not None and turn.text and turn.audio_queued is None:
            self._unheard = turn  # nothing of its reply was heard: the user's next words go on from it
            if self._turn is not None:
                self._continue_unheard(self._turn)
        if self._reply_task is not None:
            self._reply_task.cancel()
        if self._speculation is not None:
            self._speculation.cancel()
        self._speculation = None
        dropped = self.output_track.flush()
        if turn is not None:
            self._send(Event, name="barge_in", data={"turn": turn.number, "dropped_audio_ms": round(dropped / 48, 1)})
        telemetry.VOICE_BARGE_INS.inc()

    def _continue_unheard(self, turn: _Turn) -> None:
        """The user went on speaking before hearing any of the previous turn's reply: this turn continues it
        (its text is prefixed to this one's, and the answer is to both)."""
        unheard, self._unheard = self._unheard, None
        if unheard is not None and unheard.number == turn.number - 1:
            turn.prefix = _continued(unheard.prefix, unheard.text) if unheard.prefix else unheard.text
            turn.metrics["continues_turn"] = unheard.number

    def _reply_audio_stopped(self, stop_ms: float) -> None:
        """Called by the reply track when its first silent frame after a flush went out."""
        turn, self._replying = self._replying, None
        if self._barge_in_at is None:
            return
        stop = round((time.perf_counter() - self._barge_in_at) * 1000.0, 1)
        self._barge_in_at = None
        telemetry.VOICE_STAGE_MS.labels(stage="barge_in_stop").observe(stop)
        if turn is not None:
            turn.metrics["barge_in_stop_ms"] = stop
            self._report(turn)

    # ------------------------------------------------------------------ messages

    def _report(self, turn: _Turn) -> None:
        if turn.reported:
            return
        turn.reported = True
        for stage in ("end_of_speech_to_final_ms", "llm_first_token_ms", "first_audio_ms"):
            if stage in turn.metrics:
                telemetry.VOICE_STAGE_MS.labels(stage=stage.removesuffix("_ms")).observe(turn.metrics[stage])
        self._send(Metrics, turn=TurnMetrics(turn=turn.number, speech_ms=turn.speech_ms, **turn.metrics))

    def _send(self, message_type: type, **fields: Any) -> None:
        if self._pipeline is not None:
            self._pipeline.send(message_type, **fields)

    def _error(self, code: str, message: str) -> None:
        if self._pipeline is not None:
            self._pipeline.error(code, message)

    @staticmethod
    def _ms_since(moment: float) -> float:
        return round((time.perf_counter() - moment) * 1000.0, 1)
