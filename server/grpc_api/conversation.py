"""Converse: one bidirectional gRPC stream driving the same voice loop as a WebRTC session.

Audio chunks go into a session pipeline (in order, never dropped: a full queue holds back the gRPC reader, and
so the client, through flow control), typed text becomes a turn of its own. The pipeline's protocol messages
(transcripts, reply deltas, events, turn metrics, errors) are mapped to ``ConversationOutput``; the reply track
is played out in real time, as a loudspeaker would, and its speech is sent as PCM16 ``AudioOutput`` chunks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator

import av
import numpy as np
from aiortc.mediastreams import MediaStreamError

from pipelines.clock import WallClock
from pipelines.errors import ApiError
from pipelines.protocol import Error, Event, Metrics, Reply, ServerMessage, Transcript
from pipelines.session import SessionPipeline
from pipelines.voice.audio import OUT_RATE
from pipelines.voice.loop import VoiceLoop
from server import __version__
from server.config import Settings
from server.grpc_api import inference_pb2 as pb
from server.grpc_api.audio import BadAudio, PcmDecoder, encoding_of
from server.grpc_api.decoding import UndecodableMessage

log = logging.getLogger(__name__)

AUDIO_CHUNK_FRAMES = 5  # reply audio goes out in 100 ms chunks (5 frames of 20 ms)
MAX_TEXT_CHARS = 4000
DRAIN_LIMIT_S = 120.0  # after the client half-closes, how long the last reply may take to finish playing


class BadInput(ApiError):
    """A malformed ConversationInput; ends the call with INVALID_ARGUMENT."""

    def __init__(self, message: str) -> None:
        super().__init__("invalid_request", message)


class _End:
    pass


END = _End()


def _output(**fields: object) -> pb.ConversationOutput:
    return pb.ConversationOutput(ts=time.time(), **fields)


def to_output(message: ServerMessage) -> pb.ConversationOutput | None:
    """A pipeline message as a ConversationOutput; None for those a conversation does not carry (hello, media
    counts)."""
    if isinstance(message, Transcript):
        return _output(transcript=pb.TranscriptEvent(turn=message.turn, text=message.text, final=message.final))
    if isinstance(message, Reply):
        return _output(reply=pb.ReplyEvent(turn=message.turn, delta=message.delta or "", done=message.done,
                                           interrupted=message.interrupted))
    if isinstance(message, Event):
        return _output(event=pb.ConversationEvent(name=message.name, data_json=json.dumps(message.data)))
    if isinstance(message, Error):
        return _output(error=pb.ConversationError(code=message.code, message=message.message))
    if isinstance(message, Metrics) and message.turn is not None:
        return _output(metrics=pb.TurnMetrics(**message.turn.model_dump(exclude_none=True)))
    return None


class Conversation:
    """One Converse call: its pipeline, voice loop, reply-audio pump and outbound queue."""

    def __init__(self, settings: Settings, voice: VoiceLoop, config: pb.ConversationConfig) -> None:
        self.settings = settings
        self.id = uuid.uuid4().hex[:12]
        if config.output_sample_rate and not 8000 <= config.output_sample_rate <= 192000:
            raise BadAudio(f"output_sample_rate must be between 8000 and 192000, got {config.output_sample_rate}")
        self.output_rate = config.output_sample_rate or OUT_RATE
        self.voice = voice
        # One slot more than the limit, so an overflow can still be told to the client as a status.
        self.outbound: asyncio.Queue[pb.ConversationOutput | ApiError | _End] = asyncio.Queue(
            settings.grpc.outbound_queue_messages + 1)
        self.pipeline = SessionPipeline(
            self.id, origin="grpc", clock=WallClock(), emit=self._emit, config=settings.session_defaults(),
            server_version=__version__, audio_analyzer=voice, metrics_interval_s=settings.sessions.metrics_interval_s,
            audio_queue_frames=settings.sessions.audio_queue_frames,
        )
        self.pipeline.add_track("audio")
        self._decoder: PcmDecoder | None = None
        self._audio_quiet = asyncio.Event()  # no reply audio waiting to be sent
        self._audio_quiet.set()
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False

    def start(self, inputs: AsyncIterator[pb.ConversationInput]) -> None:
        self.pipeline.start()
        self._put(_output(started=pb.ConversationStarted(session_id=self.id, models=self.voice.name)))
        self._tasks.append(asyncio.create_task(self._play_reply_audio(), name=f"{self.id}:grpc-audio"))
        self._tasks.append(asyncio.create_task(self._read(inputs), name=f"{self.id}:grpc-read"))

    async def outputs(self) -> AsyncIterator[pb.ConversationOutput | ApiError]:
        """What to send, ending with an ``ApiError`` (the call's status) when the conversation fails."""
        while True:
            item = await self.outbound.get()
            if isinstance(item, _End):
                return
            yield item
            if isinstance(item, ApiError):
                return

    # ------------------------------------------------------------------ out

    def _put(self, item: pb.ConversationOutput | ApiError | _End) -> None:
        if self._closed:
            return
        if self.outbound.qsize() >= self.settings.grpc.outbound_queue_messages:
            # The client does not read: end the call rather than buffer without bound or drop silently.
            while not self.outbound.empty():
                self.outbound.get_nowait()
            self._closed = True
            self.outbound.put_nowait(ApiError("client_not_reading", "the client did not read its messages "
                                              f"({self.settings.grpc.outbound_queue_messages} queued)"))
            return
        self.outbound.put_nowait(item)

    def _emit(self, message: ServerMessage) -> None:
        output = to_output(message)
        if output is not None:
            self._put(output)

    async def _play_reply_audio(self) -> None:
        """Consume the reply track in real time (so barge-in and playback metrics mean what they do in a WebRTC
        session) and send its speech; the silence between replies is not sent."""
        track = self.voice.output_track
        resampler = (av.AudioResampler(format="s16", layout="mono", rate=self.output_rate)
                     if self.output_rate != OUT_RATE else None)
        pending: list[np.ndarray] = []

        def flush() -> None:
            if not pending:
                return
            pcm = np.concatenate(pending)
            pending.clear()
            if resampler is not None:
                frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
                frame.sample_rate = OUT_RATE
                parts = [f.to_ndarray().reshape(-1) for f in resampler.resample(frame)]
                pcm = np.concatenate(parts) if parts else np.zeros(0, np.int16)
            if pcm.size:
                self._put(_output(audio=pb.AudioOutput(data=pcm.astype("<i2").tobytes(),
                                                       sample_rate=self.output_rate)))

        with contextlib.suppress(MediaStreamError):
            while True:
                samples = (await track.recv()).to_ndarray().reshape(-1)
                if samples.any():
                    self._audio_quiet.clear()
                    pending.append(samples)
                    if len(pending) >= AUDIO_CHUNK_FRAMES:
                        flush()
                else:
                    flush()
                    self._audio_quiet.set()
        flush()
        self._audio_quiet.set()

    # ------------------------------------------------------------------ in

    async def _read(self, inputs: AsyncIterator[pb.ConversationInput]) -> None:
        try:
            async for message in inputs:
                await self._handle(message)
            await self._finish()
        except (BadAudio, BadInput, UndecodableMessage) as error:
            self._put(error)
        except TimeoutError:
            self._put(ApiError("reply_timeout", f"the last reply did not finish within {DRAIN_LIMIT_S:g} s of the "
                                                "end of input"))
        except asyncio.CancelledError:
            raise
        except Exception as error:  # a bug must end this call with a status, not hang it
            log.exception("Converse %s failed", self.id)
            self._put(ApiError("internal", f"conversation failed: {error}"))

    async def _handle(self, message: pb.ConversationInput) -> None:
        kind = message.WhichOneof("input")
        if kind == "audio":
            chunk = message.audio
            if encoding_of(chunk.encoding) != "pcm16":
                raise BadAudio(f"Converse takes pcm16 audio only, not {chunk.encoding!r} (StreamInput decodes "
                               "containers)")
            if self._decoder is None:
                self._decoder = PcmDecoder(chunk.sample_rate, chunk.channels or 1)
            elif (chunk.sample_rate or self._decoder.sample_rate) != self._decoder.sample_rate or \
                    (chunk.channels or 1) != self._decoder.channels:
                raise BadAudio("sample_rate and channels must stay the same for the whole conversation")
            for frame in self._decoder.frames(chunk.data):
                await self.pipeline.feed_audio(frame)
        elif kind == "text":
            text = message.text.strip()
            if not text or len(text) > MAX_TEXT_CHARS:
                raise BadInput(f"a text turn needs 1 to {MAX_TEXT_CHARS} characters, got {len(text)}")
            await self.pipeline.drain_audio()  # after the audio sent before it
            await self.voice.say_text(text)
        elif kind == "config":
            raise BadInput("config is only allowed as the first message")
        else:
            raise BadInput("empty ConversationInput: set one of config, audio or text")

    async def _finish(self) -> None:
        """The client half-closed: end a turn in progress (as trailing silence would), answer it, play the
        reply out, then end the call."""
        if self._decoder is not None:
            silence_s = self.settings.voice.end_of_turn_silence_ms / 1000.0 + 0.2
            zeros = bytes(2 * self._decoder.channels * int(silence_s * self._decoder.sample_rate))
            for frame in self._decoder.frames(zeros):
                await self.pipeline.feed_audio(frame)
        async with asyncio.timeout(DRAIN_LIMIT_S):
            await self.pipeline.drain_audio()
            while not self.voice.idle:  # noqa: ASYNC110 - the loop has no event for this; it is polled coarsely
                await asyncio.sleep(0.05)
            await self._audio_quiet.wait()
        self._put(END)

    async def close(self) -> None:
        self._closed = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.pipeline.close()
