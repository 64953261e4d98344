"""The gRPC InferenceService, served by a ``grpc.aio`` server in the HTTP server's process and event loop.

Predict / StreamPredict run the app's chat pipeline (``server.grpc_api.predict``: the same limits, cache,
prompt fitting and content filter as ``/v1/chat/completions``), StreamInput the Whisper model, Converse the voice
loop. Auth: the HTTP token, as ``authorization: Bearer <token>`` metadata. Errors are ``ApiError``s, raised
anywhere and ended with the status their code stands for by one interceptor (``server.grpc_api.errors``):
INVALID_ARGUMENT (malformed request or audio; bytes that are not the method's message: ``decoding``),
UNAUTHENTICATED, RESOURCE_EXHAUSTED (too much audio, too many conversations; too many RPCs and oversized messages
are grpc's own checks), UNAVAILABLE (no LLM upstream can serve the request, the chat service busy),
FAILED_PRECONDITION (the voice loop is disabled), DEADLINE_EXCEEDED (a reply that never finishes).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import numpy as np
from aiohttp import web

from models.stt import SpeechToText
from pipelines.errors import ApiError
from server.config import Settings
from server.engines import Engines, VoiceLoops
from server.grpc_api import inference_pb2 as pb
from server.grpc_api import inference_pb2_grpc as pb_grpc
from server.grpc_api.audio import BadAudio, PcmDecoder, decode_container, encoding_of
from server.grpc_api.conversation import Conversation
from server.grpc_api.decoding import DecodeRequests
from server.grpc_api.errors import ApiErrors
from server.grpc_api.handlers import HandlerInterceptor, with_behavior
from server.grpc_api.metrics import RpcMetrics
from server.grpc_api.predict import ChatPredictor
from server.http.auth import bearer_token
from server.v1.chat_service import ChatService

log = logging.getLogger(__name__)

MAX_CONTAINER_BYTES_PER_S = 2 * 48000 * 2  # uncompressed 48 kHz stereo: no real codec needs more


def _ms_since(moment: float) -> int:
    return round((time.perf_counter() - moment) * 1000.0)


class InferenceService(pb_grpc.InferenceServiceServicer):
    def __init__(self, settings: Settings, engines: Engines, chat: ChatService) -> None:
        self.settings = settings
        self.engines = engines
        self.analyzers = engines.analyzers
        self.predictor = ChatPredictor(chat)  # the chat pipeline of /v1/chat/completions
        self._stt: SpeechToText | None = None
        self._stt_executor = ThreadPoolExecutor(1, "grpc-stt")  # one decode at a time; more would only thrash
        self.conversations: set[Conversation] = set()
        self._conversation_slots = 0

    # ------------------------------------------------------------------ models, loaded on first use

    async def stt(self) -> SpeechToText:
        if self._stt is None:
            self._stt = await asyncio.to_thread(self.engines.stt)
        return self._stt

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in list(self.conversations)), return_exceptions=True)
        self._stt_executor.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ Predict, StreamPredict

    async def Predict(self, request: pb.PredictRequest, context: grpc.aio.ServicerContext) -> pb.PredictResponse:
        return await self.predictor.predict(request, context)

    async def StreamPredict(self, request: pb.PredictRequest, context: grpc.aio.ServicerContext,
                            ) -> AsyncIterator[pb.TokenResponse]:
        # grpc.aio needs the behaviour itself to be an async generator; closing it closes the generation
        async with contextlib.aclosing(self.predictor.stream(request, context)) as responses:
            async for response in responses:
                yield response

    # ------------------------------------------------------------------ StreamInput

    async def StreamInput(self, request_iterator: AsyncIterator[pb.AudioChunk],
                          context: grpc.aio.ServicerContext) -> pb.TranscriptResponse:
        return await self._transcribe_stream(request_iterator)

    async def _transcribe_stream(self, chunks: AsyncIterator[pb.AudioChunk]) -> pb.TranscriptResponse:
        max_s = self.settings.grpc.max_audio_s
        encoding, language = "", "en"
        pcm: PcmDecoder | None = None
        samples: list[np.ndarray] = []
        container = bytearray()
        async for chunk in chunks:
            if not encoding:  # the first chunk sets the format
                encoding, language = encoding_of(chunk.encoding), chunk.language or "en"
                if encoding == "pcm16":
                    pcm = PcmDecoder(chunk.sample_rate, chunk.channels or 1)
            elif chunk.encoding and encoding_of(chunk.encoding) != encoding:
                raise BadAudio(f"encoding changed from {encoding} to {chunk.encoding} mid-stream")
            if pcm is not None:
                if chunk.sample_rate and chunk.sample_rate != pcm.sample_rate:
                    raise BadAudio(f"sample_rate changed from {pcm.sample_rate} to {chunk.sample_rate} mid-stream")
                # resampling a large chunk (up to grpc.max_message_bytes) takes a while: off the event loop
                samples.append(await asyncio.to_thread(pcm.samples_16k, chunk.data))
                if pcm.seconds > max_s:
                    raise ApiError("audio_too_long", f"more than grpc.max_audio_s={max_s:g} s of audio")
            else:
                container += chunk.data
                if len(container) > max_s * MAX_CONTAINER_BYTES_PER_S:
                    raise ApiError("audio_too_long", f"more than {len(container)} bytes of {encoding} audio: "
                                                     f"longer than grpc.max_audio_s={max_s:g} s")
        end_of_input = time.perf_counter()
        if not encoding:
            raise BadAudio("no audio chunks were sent")
        if pcm is not None:
            audio = np.concatenate(samples) if samples else np.zeros(0, np.float32)
        else:
            audio = await asyncio.to_thread(decode_container, bytes(container), encoding)
        duration = audio.size / 16000
        if duration > max_s:
            raise ApiError("audio_too_long", f"{duration:.1f} s of audio is more than grpc.max_audio_s={max_s:g} s")
        if audio.size == 0:
            raise BadAudio("the stream held no audio samples")
        stt = await self.stt()
        loop = asyncio.get_running_loop()
        try:
            result = await loop.run_in_executor(self._stt_executor, stt.transcribe, audio, language)
        except ValueError as error:  # e.g. a language the English-only model does not have
            raise BadAudio(str(error)) from None
        return pb.TranscriptResponse(
            text=result.text, language=result.language, duration_s=duration, latency_ms=_ms_since(end_of_input),
            segments=[pb.TranscriptSegment(start_s=s.start, end_s=s.end, text=s.text) for s in result.segments],
        )

    # ------------------------------------------------------------------ Converse

    async def Converse(self, request_iterator: AsyncIterator[pb.ConversationInput],
                       context: grpc.aio.ServicerContext) -> AsyncIterator[pb.ConversationOutput]:
        if self.analyzers.audio is None:
            raise ApiError("voice_disabled", "the voice loop is disabled on this server (voice.enabled)")
        limit = self.settings.grpc.max_conversations
        if self._conversation_slots >= limit:
            raise ApiError("too_many_conversations", f"conversation limit reached ({limit})")
        self._conversation_slots += 1  # taken before the first await, so concurrent calls cannot overshoot
        conversation: Conversation | None = None
        try:
            inputs = aiter(request_iterator)
            first = await anext(inputs, None)
            config = pb.ConversationConfig()
            if first is not None and first.WhichOneof("input") == "config":
                config, first = first.config, None
            voice_loops = self.analyzers.audio
            if not isinstance(voice_loops, VoiceLoops):
                raise ApiError("voice_disabled", "this server has no voice loop configured")
            # The conversation's own prompt is the loop's config from the start (nothing is changed afterwards).
            voice = voice_loops("grpc", system_prompt=config.system_prompt or None)
            try:
                conversation = Conversation(self.settings, voice, config)
            except BadAudio:
                await voice.close()
                raise

            async def all_inputs() -> AsyncIterator[pb.ConversationInput]:
                if first is not None:
                    yield first
                async for message in inputs:
                    yield message

            self.conversations.add(conversation)
            conversation.start(all_inputs())
            async for output in conversation.outputs():
                if isinstance(output, ApiError):
                    raise output
                yield output
        finally:
            self._conversation_slots -= 1
            if conversation is not None:
                self.conversations.discard(conversation)
                await conversation.close()


# ---------------------------------------------------------------------- auth and the server's lifecycle


def _rejecting(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    async def reject(request: Any, context: grpc.aio.ServicerContext) -> None:
        raise ApiError("unauthorized", message)

    return with_behavior(handler, reject)


class TokenAuth(HandlerInterceptor):
    """The HTTP API's bearer token, as ``authorization: Bearer <token>`` call metadata."""

    def __init__(self, token: str) -> None:
        self.token = token

    def wrap(self, handler: grpc.RpcMethodHandler, call: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        header = next((value for key, value in call.invocation_metadata or ()
                       if key == "authorization"), "")
        given = bearer_token(header) if isinstance(header, str) else None
        if given is None:
            return _rejecting(handler, "missing token: send metadata 'authorization: Bearer <token>'")
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            return _rejecting(handler, "wrong token")
        return handler


class GrpcServer:
    """Started and stopped with the aiohttp app (``mount_grpc``); ``port`` is the bound port once started."""

    def __init__(self, settings: Settings, engines: Engines, chat: ChatService) -> None:
        self.settings = settings
        self.service = InferenceService(settings, engines, chat)
        self.port = 0
        self._server: grpc.aio.Server | None = None

    async def start(self) -> None:
        config = self.settings.grpc
        token = self.settings.auth.token.get_secret_value() if self.settings.auth.token else None
        server = grpc.aio.server(
            # metrics first: it counts the status the client sees; ApiErrors outside auth: it ends the rejections
            # too; request parsing last: inside the call, where it has a status
            interceptors=[RpcMetrics(), ApiErrors(), *([TokenAuth(token)] if token else []), DecodeRequests()],
            maximum_concurrent_rpcs=config.max_concurrent_rpcs,
            options=[
                ("grpc.max_send_message_length", config.max_message_bytes),
                ("grpc.max_receive_message_length", config.max_message_bytes),
                ("grpc.keepalive_time_ms", int(config.keepalive_time_s * 1000)),
                ("grpc.keepalive_timeout_ms", int(config.keepalive_timeout_s * 1000)),
                ("grpc.so_reuseport", 0),  # a port in use is an error, not a silently shared port
            ],
        )
        pb_grpc.add_InferenceServiceServicer_to_server(self.service, server)
        host = f"[{config.host}]" if ":" in config.host else config.host
        try:
            self.port = server.add_insecure_port(f"{host}:{config.port}")
        except RuntimeError as error:
            raise RuntimeError(f"gRPC cannot listen on {host}:{config.port} (grpc.host/grpc.port): {error}") from None
        await server.start()
        self._server = server
        log.info("gRPC InferenceService listening on %s:%s", host, self.port)

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(grace=1.0)
            self._server = None
        await self.service.close()


def build_grpc(settings: Settings, engines: Engines, chat: ChatService) -> GrpcServer | None:
    """gRPC beside HTTP when ``grpc.enabled``, sharing the app's chat service."""
    return GrpcServer(settings, engines, chat) if settings.grpc.enabled else None


def mount_grpc(app: web.Application, server: GrpcServer | None) -> None:
    """Started on the app's startup, stopped on its shutdown."""
    if server is not None:
        app.on_startup.append(lambda app: server.start())
        app.on_shutdown.insert(0, lambda app: server.stop())  # before the app closes the models its conversations use


GRPC_SERVER = web.AppKey("grpc_server", GrpcServer)  # only with grpc.enabled
