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

``VoiceLoop`` coordinates; each concept is a part of its own, with a narrow interface:

- turn taking (``endpointing.py``: ``TurnTaking`` on the ``Endpointer``; echo gating, the turn model),
- live transcription (``transcription.py``: partials, the early decode, the final transcript),
- speculation (``speculation.py``: the reply started on a pause, held until the final transcript),
- reply streaming (``streaming.py``: text -> clause and sentence chunks -> TTS -> the reply track),
- recall (``recall.py``: the turn's prompt from the conversation, reminders and the app's memory),
- the turn's record and typed metrics (``turns.py``, ``metrics.py``),
- the models they run on (``engine.py``: ``VoiceEngine``, shared by every session's loop).

What stays here is who holds the floor across them: the turn being spoken, the reply being played, barge-in, and
a turn that continues one whose reply was cut before the user could have heard it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import replace
from typing import Any

import av
import numpy as np

from models.llm import LlmRequest, LlmUnavailable
from models.vad import VadStream
from pipelines import telemetry
from pipelines.ports import SessionView
from pipelines.protocol import Event, Metrics, Reply, Transcript
from pipelines.voice.audio import InputResampler, ReplyAudioTrack, SilenceWatch
from pipelines.voice.config import VoiceLoopConfig
from pipelines.voice.endpointing import FRAME_SAMPLES, TurnEnded, TurnStarted, TurnTaking
from pipelines.voice.engine import VoiceEngine
from pipelines.voice.grounding import answer_lead
from pipelines.voice.metrics import EndOfTurn, TurnMetricsBuilder, ms_since
from pipelines.voice.outbox import Outbox
from pipelines.voice.recall import ContextProvider, Recall
from pipelines.voice.replies import has_video
from pipelines.voice.speculation import Speculation, Speculator
from pipelines.voice.streaming import ReplyStreamer
from pipelines.voice.transcription import Decodes, LiveTranscription
from pipelines.voice.turns import Turn, continued

__all__ = ["VoiceLoop"]

log = logging.getLogger(__name__)

# The most the turn model waits for the speculative reply to read its prompt (_make_way_for_reply).
TURN_CHECK_WAIT_S = 0.5
# The most a prompt warm-up may take (partial decodes wait for it): cancelled, llama.cpp stops within a token.
WARM_UP_TIMEOUT_S = 1.0
# Speech that began within this long of the reply's first audio going out cannot be an answer to that reply:
# hearing its first word and reacting takes longer (a word ~0.3 s, a spoken reaction >= ~0.2 s more). Such a
# barge-in is the user going on after a pause the turn model took for the end (bench/turn_ends.py: most pauses
# mid-sentence score "finished" at 200 ms on Piper's voice), so the next turn continues the cut one.
GOING_ON_S = 0.5


class VoiceLoop:
    """The session's ``AudioAnalyzer``. ``recall``: the app's memory, asked before each answer (None: none)."""

    def __init__(self, engine: VoiceEngine, config: VoiceLoopConfig, *, recall: ContextProvider | None = None) -> None:
        self.engine = engine
        self.config = config
        self.name = engine.names
        self.output_track = ReplyAudioTrack(burst_ms=config.reply_burst_ms)
        self.output_track.on_first_audio = self._first_audio_sent
        self.output_track.on_silence_after_flush = self._reply_audio_stopped
        self.output_track.on_drained = self._reply_audio_drained
        self._outbox = Outbox()  # the parts' way out: they hold no reference to this loop
        self._resample = InputResampler()
        self._vad = VadStream(engine.vad)
        self._pending = np.zeros(0, np.float32)
        self._silence = SilenceWatch(config.silent_track_s)
        self._user_quiet = asyncio.Event()  # no user turn open nor speech run: a reply may start to play
        self._user_quiet.set()
        self.recall = Recall(engine.llm, config, recall)
        track = self.output_track
        self._turns = TurnTaking(config, engine.turn, engine.turn_executor, reply_playing=lambda: track.playing)
        # Dropped by close: the one part that calls back into the loop. Prompts are read ahead only into a KV
        # cache kept here (an embedded LLM), not as extra requests to a remote API.
        warm_up = self._warm_up if getattr(engine.llm, "local_prompt_cache", False) else None
        self._speculator = Speculator(self._reply, warm_up)
        self._transcripts = LiveTranscription(engine.stt, engine.stt_executor, config, self._turns,
                                              self._speculator, self._outbox)
        self._streamer = ReplyStreamer(engine.llm, engine.tts, engine.tts_executor, track, self._outbox,
                                       max_sentences=config.max_reply_sentences, user_quiet=self._user_quiet)
        self._turn_count = 0
        self._turn: Turn | None = None  # the user turn being spoken
        self._replying: Turn | None = None  # the turn whose reply is being generated or played
        self._reply_task: asyncio.Task[None] | None = None
        self._turn_check: asyncio.Task[None] | None = None
        self._finishing: set[asyncio.Task[None]] = set()  # turns ended, waiting for their final transcript
        self._barge_in_at: float | None = None
        self._unheard: Turn | None = None  # the last turn whose reply was cut before the user could hear it

    @property
    def last_request(self) -> LlmRequest | None:
        """What the LLM was last asked (tests and debugging)."""
        return self._streamer.last_request

    @property
    def last_reply_stop(self) -> str | None:
        """Why the ReplyGuard cut the last answer ("repeat", "sentences"), or None."""
        return self._streamer.last_reply_stop

    # ------------------------------------------------------------------ AudioAnalyzer

    def attach(self, pipeline: SessionView) -> None:
        self._outbox.pipeline = pipeline

    async def process(self, frame: av.AudioFrame, pts: float) -> None:
        samples = self._resample(frame)
        if self._silence.silent_too_long(samples):
            self._error("audio_silent", f"the audio track has been digitally silent for "
                                        f"{self.config.silent_track_s:g} s (muted microphone?)")
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
        speculation = self._speculator.current
        tasks = [self._reply_task, self._turn_check, *self._transcripts.tasks(),
                 speculation.task if speculation else None, self._speculator.warming, *self._finishing]
        for task in tasks:
            if task is not None:
                task.cancel()
        self.output_track.stop()
        # Let them end, then drop every reference to them and to our own methods: a finished task's traceback
        # holds this loop, and the reply track holds its callbacks, cycles that kept an ended session (its
        # resampler's filter graph and threads) alive until a full garbage collection.
        pending = [task for task in tasks if task is not None and not task.done()]
        if pending:
            await asyncio.wait(pending, timeout=5.0)
        self._reply_task = self._turn_check = None
        self._transcripts.close()
        self._speculator.close()
        self._turn = self._replying = self._unheard = None
        self._finishing.clear()
        track = self.output_track
        track.on_first_audio = track.on_silence_after_flush = track.on_drained = None
        self.recall.memory = None
        self._outbox.pipeline = None

    async def say_text(self, text: str) -> None:
        """A typed user turn (gRPC Converse): no VAD or STT, otherwise answered like a spoken turn. It interrupts
        a reply still playing, as speaking over it would."""
        await self._interrupt_reply()
        self._speculator.discard()
        self._turn_count += 1
        turn = Turn(self._turn_count, end_of_speech=time.perf_counter())
        self._send(Transcript, turn=turn.number, text=text, final=True)
        self._replying = turn
        self._reply_task = asyncio.create_task(self._reply(turn, text, None), name="voice:reply")

    def announce(self, text: str) -> None:
        """Speak an alert now, as a reply of kind ``alert`` (``pipelines.timeline.alerts`` waits until ``idle``,
        so it never talks over the user). Barge-in cuts it like a reply; the next answer's history has it."""
        self._turn_count += 1
        turn = Turn(self._turn_count, reported=True)  # no user turn: no turn metrics

        async def speak() -> None:
            self._send(Reply, turn=turn.number, delta=text, kind="alert")
            interrupted = True  # unless synthesis finishes: then the alert's audio is queued whole
            try:
                self._streamer.play(turn, await self._streamer.synthesize(text, first=True, clause=False))
                interrupted = False
            finally:
                self._send(Reply, turn=turn.number, done=True, kind="alert", interrupted=interrupted)
                if not interrupted:
                    self.recall.announced(text)

        self._replying, self._reply_task = turn, asyncio.create_task(speak(), name="voice:alert")

    @property
    def idle(self) -> bool:
        """No user turn in progress and no reply being generated or played."""
        return self._turn is None and not self._finishing and not self._reply_active()

    # ------------------------------------------------------------------ per frame

    async def _on_vad_frame(self, chunk: np.ndarray, probability: float) -> None:
        turns = self._turns
        event = turns.push(chunk, probability)
        if self.config.barge_in and self._reply_active() and self._barge_in_at is None \
                and turns.endpointer.speech_run_ms >= self.config.barge_in_min_speech_ms:
            await self._barge_in()
        if isinstance(event, TurnStarted):
            self._start_turn()
        elif isinstance(event, TurnEnded):
            await self._end_turn(event, turns.how(event))
        elif self._turn is not None:
            if turns.resumed:
                self._speculator.user_resumed(self._turn)  # the held reply of the pause is discarded unheard
            self._transcripts.on_frame(self._turn)
            await self._maybe_check_turn(self._turn)
        self._update_user_quiet()

    def _update_user_quiet(self) -> None:
        """The user holds the floor while speaking or while their turn is open (pauses between words included)."""
        if self._turn is None and not self._turns.endpointer.speech_run:
            self._user_quiet.set()
        else:
            self._user_quiet.clear()

    # ------------------------------------------------------------------ turns

    def _start_turn(self) -> None:
        self._turn_count += 1
        self._turn = Turn(self._turn_count)
        self._continue_unheard(self._turn)
        self._transcripts.start(self._turn)

    async def _maybe_check_turn(self, turn: Turn) -> None:
        """Semantic end of turn: after a short silence, ask the turn model (on its own thread) whether the turn is
        complete; if it is and the user is still quiet, the turn ends now instead of at the silence cap."""
        due = self._turns.check_due()
        if due is None:
            return
        if self._virtual():
            await self._check_turn(turn, *due)  # replay stays deterministic
            return
        self._turn_check = asyncio.create_task(self._check_turn(turn, *due), name="voice:turn-check")

    async def _check_turn(self, turn: Turn, speech_frames: int, audio: np.ndarray) -> None:
        if not self._virtual():
            await self._make_way_for_reply(turn, speech_frames)

        def still_quiet() -> bool:
            return self._turn is turn and self._turns.speech_frames == speech_frames

        if await self._turns.finished(audio, turn.metrics, still_quiet=still_quiet,
                                      words_unfinished=lambda: self._transcripts.sounds_unfinished(speech_frames)):
            await self._end_turn(self._turns.end_now(), "model")

    async def _make_way_for_reply(self, turn: Turn, speech_frames: int) -> None:
        """Let the speculative reply's LLM read its prompt before the turn model runs. On a shared CPU each slows
        the other (llama.cpp's threads wait for the slowest: Qwen 0.5B's first token came after 252 ms instead of
        138 with the turn model beside it), and the reply is the slower path anyway: its first audio is ready
        well after the turn model has confirmed the turn. So the turn model waits for the early decode of this
        very speech, then for the first token of the speculation that decode started, ``TURN_CHECK_WAIT_S`` at
        most; a fast LLM makes the wait short."""
        deadline = time.perf_counter() + TURN_CHECK_WAIT_S
        await self._transcripts.early_decoded(speech_frames, TURN_CHECK_WAIT_S)
        await self._speculator.prompt_read(turn, deadline - time.perf_counter())

    async def _end_turn(self, ended: TurnEnded, how: EndOfTurn) -> None:
        turn, self._turn = self._turn, None
        if turn is None:
            return
        self._update_user_quiet()
        turn.end_of_speech = time.perf_counter() - ended.silence_ms / 1000.0
        turn.speech_ms = round(ended.audio.size / 16.0, 1)
        turn.metrics.end_of_turn = how
        turn.metrics.end_of_turn_ms = round(ended.silence_ms, 1)
        if ended.truncated:
            self._error("turn_too_long", f"turn {turn.number} cut at voice.max_turn_s={self.config.max_turn_s:g} s;"
                                         " answering what was said so far")
        if self._turn_check is not None and self._turn_check is not asyncio.current_task():
            self._turn_check.cancel()
        decodes = self._transcripts.end(truncated=ended.truncated)
        # The final decode runs on its own task: VAD and turn detection of what follows never wait for Whisper.
        finishing = asyncio.create_task(self._finish_turn(turn, ended, decodes), name="voice:final")
        self._finishing.add(finishing)
        finishing.add_done_callback(self._finishing.discard)
        if self._virtual():
            await asyncio.gather(finishing, return_exceptions=True)  # replay stays deterministic

    async def _finish_turn(self, turn: Turn, ended: TurnEnded, decodes: Decodes) -> None:
        try:
            text = await self._transcripts.final(turn, ended, decodes)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            log.exception("final transcription failed")
            self._error("stt_failed", f"speech recognition failed: {error}")
            self._speculator.discard(turn)
            return
        turn.metrics.end_of_speech_to_final_ms = ms_since(turn.end_of_speech or time.perf_counter())
        if turn.prefix and text:
            text = continued(turn.prefix, text)
        turn.text = text
        self._send(Transcript, turn=turn.number, text=text, final=True)
        if not text:
            self._speculator.discard(turn)
            self._report(turn)
            return
        if self._turn_count > turn.number and self._turn is None:
            # The user spoke a whole further turn while this one was transcribed: that one gets the answer.
            self._speculator.discard(turn)
            self._report(turn)
            return
        if self._replying is not None and self._replying is not turn:
            await self._interrupt_reply()  # an earlier reply still playing gives way, as barge-in would
        self._replying = turn
        self._reply_task = self._speculator.confirm(turn, text) \
            or asyncio.create_task(self._reply(turn, text, None), name="voice:reply")
        if self._virtual():
            await asyncio.gather(self._reply_task, return_exceptions=True)  # replay stays deterministic

    # ------------------------------------------------------------------ replies

    async def _prompt(self, text: str, metrics: TurnMetricsBuilder | None, *, remember: bool = True) -> LlmRequest:
        pipeline = self._outbox.pipeline
        video = pipeline is not None and has_video(pipeline.tracks)
        scene = pipeline.scene if video and pipeline else None
        # No lead from a scene that has stopped changing because detection is off (it says what was, not what is).
        lead = answer_lead(text, scene) if self.config.scene_lead and pipeline and pipeline.config.video.detect \
            else None
        return await self.recall.request(text, metrics, video=video, remember=remember,
                                         scene=scene.summary() if scene is not None else None,
                                         lead=lead)

    async def _warm_up(self, turn: Turn, text: str) -> None:
        """Have the LLM read the prompt of the question so far (one token, never heard), so that the reply's
        request finds most of it in the KV cache (``Speculator.partial``)."""
        if self._virtual() or (self._reply_task is not None and not self._reply_task.done()):
            return  # replay stays deterministic; a reply being generated holds the LLM's slot
        try:
            async with asyncio.timeout(WARM_UP_TIMEOUT_S):
                request = await self._prompt(text, None, remember=False)
                async with contextlib.aclosing(self.engine.llm.generate(replace(request, max_tokens=1))) as chunks:
                    async for _ in chunks:
                        pass
        except (LlmUnavailable, TimeoutError) as error:
            log.debug("prompt warm-up failed: %r", error)  # the reply itself will say so

    async def _reply(self, turn: Turn, text: str, speculation: Speculation | None) -> None:
        """One answer: its prompt (recall), then streamed to the track; a speculative one reports only once its
        turn confirmed it."""
        request = await self._prompt(text, turn.metrics)
        try:
            reply = await self._streamer.stream(turn, request, self.recall.canned(text), speculation)
            if reply is not None:
                self.recall.answered(text, reply)
        finally:
            if speculation is not None:
                speculation.prompt_read.set()  # it ended or failed before a first token: nobody waits on it
            if speculation is None or speculation.confirmed.is_set():
                self._reply_finished(turn)

    def _reply_finished(self, turn: Turn) -> None:
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
        turn.metrics.voice_to_voice_ms = round((when - turn.end_of_speech) * 1000.0, 1)
        if turn.audio_queued is not None:
            turn.metrics.audio_send_ms = round((when - turn.audio_queued) * 1000.0, 1)
        telemetry.VOICE_STAGE_MS.labels(stage="voice_to_voice").observe(turn.metrics.voice_to_voice_ms)

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
        self._barge_in_at = now = time.perf_counter()
        if turn is not None and turn.text and self._went_on(turn, now):
            self._unheard = turn  # the user's next words go on from it
            if self._turn is not None:
                self._continue_unheard(self._turn)
        if self._reply_task is not None:
            self._reply_task.cancel()
        self._speculator.drop()
        dropped = self.output_track.flush()
        if turn is not None:
            self._send(Event, name="barge_in", data={"turn": turn.number, "dropped_audio_ms": round(dropped / 48, 1)})
        telemetry.VOICE_BARGE_INS.inc()

    def _went_on(self, turn: Turn, now: float) -> bool:
        """Whether the speech that barges in on ``turn``'s reply goes on with the user's own turn: it began before
        any of the reply was sent, or too soon after to answer it (``GOING_ON_S``)."""
        if turn.audio_queued is None:
            return True
        if not self._turns.endpointer.speech_run:
            return False  # not the user's speech: a typed turn, or a newer turn's reply
        began = now - self._turns.endpointer.speech_run_ms / 1000.0
        return began < turn.audio_queued + GOING_ON_S

    def _continue_unheard(self, turn: Turn) -> None:
        """The user went on speaking before they could have heard the previous turn's reply (``_went_on``): this
        turn continues it (its text is prefixed to this one's, and the answer is to both)."""
        unheard, self._unheard = self._unheard, None
        if unheard is not None and unheard.number == turn.number - 1:
            turn.prefix = continued(unheard.prefix, unheard.text) if unheard.prefix else unheard.text
            turn.metrics.continues_turn = unheard.number

    def _reply_audio_stopped(self, stop_ms: float) -> None:
        """Called by the reply track when its first silent frame after a flush went out."""
        turn, self._replying = self._replying, None
        if self._barge_in_at is None:
            return
        stop = ms_since(self._barge_in_at)
        self._barge_in_at = None
        telemetry.VOICE_STAGE_MS.labels(stage="barge_in_stop").observe(stop)
        if turn is not None:
            turn.metrics.barge_in_stop_ms = stop
            self._report(turn)

    # ------------------------------------------------------------------ messages

    def _report(self, turn: Turn) -> None:
        if turn.reported:
            return
        turn.reported = True
        turn.metrics.observe()
        self._send(Metrics, turn=turn.metrics.build(turn.number, turn.speech_ms))

    def _send(self, message_type: type, **fields: Any) -> None:
        self._outbox.send(message_type, **fields)

    def _error(self, code: str, message: str) -> None:
        self._outbox.error(code, message)

    def _virtual(self) -> bool:
        return self._outbox.virtual
