"""The gRPC InferenceService of a running Vigil server, through a real grpcio client: all four RPC kinds, auth,
status codes, cancellation (checked on what the llama.cpp upstream reports), and a spoken Converse turn with
Piper speech in and synthesised audio out (heard back through Whisper)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import re
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import av
import grpc
import numpy as np
import pytest
from prometheus_client import REGISTRY

from models.stt.whisper import WhisperStt
from server.grpc_api import inference_pb2 as pb
from server.grpc_api import inference_pb2_grpc as pb_grpc
from server.grpc_api.generate import GENERATED, generate
from server.grpc_api.metrics import CALLS
from server.grpc_api.service import GRPC_SERVER
from tests.support.audio import silence, speech
from tests.support.llm_server import LlmServer, wait_idle
from tests.support.ports import free_port
from tests.support.speech_files import wav_bytes
from tests.support.vigil_process import VigilProcess

REPO = Path(__file__).resolve().parents[2]
MODEL = "smollm2-135m-instruct"
QUESTION = "How many people do you see?"
FRANCE = "What is the capital of France?"


@pytest.fixture(scope="module")
def upstream() -> Iterator[LlmServer]:
    with LlmServer() as server:
        yield server


def llm_config(upstream: LlmServer) -> dict[str, Any]:
    return {"backend": "openai", "upstreams": [{"name": "llama", "base_url": upstream.url, "models": [MODEL]}]}


@contextlib.asynccontextmanager
async def client(server: Any) -> AsyncIterator[pb_grpc.InferenceServiceStub]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.app[GRPC_SERVER].port}") as channel:
        yield pb_grpc.InferenceServiceStub(channel)


async def start(vigil: Any, upstream: LlmServer, **overrides: Any) -> Any:
    models = overrides.pop("models", {})
    return await vigil(models={"llm": llm_config(upstream), **models}, **overrides)


async def status_of(call: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    return caught.value.code(), caught.value.details() or ""


def grpc_calls() -> dict[tuple[str, str], float]:
    """``vigil_grpc_calls_total`` by (method, code) so far (the server runs in this process). Read from the counter
    itself: ``REGISTRY.get_sample_value`` collects every metric of the process on each call, which earlier tests'
    sessions make slow (test_fuzz_grpc.py reads it per example, and took 4x as long in the suite as alone)."""
    return {(sample.labels["method"], sample.labels["code"]): sample.value for family in CALLS.collect()
            for sample in family.samples if sample.name == "vigil_grpc_calls_total"}


def calls(method: str, code: str) -> float:
    return grpc_calls().get((method, code), 0.0)


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z']+", text.lower()))


def test_generated_stubs_are_current(tmp_path: Path) -> None:
    committed = REPO / "server" / "grpc_api"
    for fresh in generate(tmp_path):
        assert fresh.read_text() == (committed / fresh.name).read_text(), (
            f"{fresh.name} is stale: run `python -m server.grpc_api.generate`")
    assert {p.name for p in (tmp_path / "server" / "grpc_api").iterdir()} == set(GENERATED)


async def test_predict_and_stream_predict(vigil, upstream):
    server = await start(vigil, upstream)
    async with client(server) as stub:
        request = pb.PredictRequest(prompt=FRANCE, max_tokens=8, logprobs=True)
        unary = await stub.Predict(request)
        assert unary.text and unary.finish_reason == "length"
        assert unary.usage.completion_tokens == 8 and unary.usage.prompt_tokens > 0
        assert unary.model_id == MODEL and 0 < unary.time_to_first_token_ms <= unary.latency_ms

        tokens = [token async for token in stub.StreamPredict(request)]
        *pieces, final = tokens
        assert "".join(t.token for t in pieces) == unary.text  # greedy: the same answer either way
        assert [t.index for t in pieces] == list(range(len(pieces))) and len(pieces) > 1
        assert all(t.metadata.HasField("log_probability") and t.metadata.log_probability <= 0 for t in pieces)
        latencies = [t.metadata.latency_ms for t in tokens]
        assert latencies == sorted(latencies)
        assert final.is_finished and final.index == len(pieces) and not final.token
        assert final.finish_reason == "length" and final.usage.completion_tokens == 8
        assert not any(t.is_finished for t in pieces)

        plain = [t async for t in stub.StreamPredict(pb.PredictRequest(prompt=FRANCE, max_tokens=3))]
        assert not any(t.metadata.HasField("log_probability") for t in plain)  # not asked for, not sent

        chat = await stub.Predict(pb.PredictRequest(max_tokens=8, messages=[
            pb.ChatMessage(role="system", content="You answer questions."),
            pb.ChatMessage(role="user", content=FRANCE)]))
        # our system message replaces SmolLM2's default one (a shorter prompt), and the answer changes with it
        assert chat.usage.prompt_tokens != unary.usage.prompt_tokens and "Paris" in chat.text


async def test_cancelling_stream_predict_aborts_the_upstream_generation(vigil, upstream):
    server = await start(vigil, upstream)
    async with client(server) as stub:
        before = await wait_idle(upstream.metrics)
        call = stub.StreamPredict(pb.PredictRequest(prompt="Write a long story about a dragon.", max_tokens=300))
        received = 0
        async for _ in call:
            received += 1
            if received == 2:
                break
        call.cancel()
        after = await wait_idle(upstream.metrics)
        assert after["requests_processing"] == 0
        generated = after["tokens_predicted_total"] - before["tokens_predicted_total"]
        assert 2 <= generated < 30, generated  # far from the 300 asked for
        assert call.cancelled()
        await until_true(lambda: calls("StreamPredict", "CANCELLED") >= 1)  # the server sees it a moment later
        assert (await stub.Predict(pb.PredictRequest(prompt=FRANCE, max_tokens=2))).text  # the slot is free


async def until_true(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def test_token_in_metadata_is_required(vigil, upstream):
    unauthenticated = calls("Predict", "UNAUTHENTICATED")
    server = await start(vigil, upstream, auth={"token": "s3cret"})
    async with client(server) as stub:
        request = pb.PredictRequest(prompt=FRANCE, max_tokens=2)
        code, details = await status_of(stub.Predict(request))
        assert code == grpc.StatusCode.UNAUTHENTICATED and "authorization: Bearer" in details
        code, details = await status_of(stub.Predict(request, metadata=[("authorization", "Bearer wrong")]))
        assert code == grpc.StatusCode.UNAUTHENTICATED and "wrong token" in details

        async def chunks() -> AsyncIterator[pb.AudioChunk]:
            yield pb.AudioChunk(data=bytes(3200), sample_rate=16000)

        code, _ = await status_of(stub.StreamInput(chunks()))
        assert code == grpc.StatusCode.UNAUTHENTICATED
        code, _ = await status_of(_drain(stub.StreamPredict(request)))
        assert code == grpc.StatusCode.UNAUTHENTICATED
        good = [("authorization", "Bearer s3cret")]
        assert (await stub.Predict(request, metadata=good)).text
    assert calls("Predict", "UNAUTHENTICATED") > unauthenticated  # auth rejections are counted too


async def _drain(call: Any) -> None:
    async for _ in call:
        pass


async def test_bad_requests_get_status_codes_and_leave_the_server_serving(vigil, upstream):
    server = await start(vigil, upstream, grpc={"max_message_bytes": 4096, "max_audio_s": 1.0})
    counted = ["INVALID_ARGUMENT", "UNAVAILABLE", "OK"]
    before = {code: calls("Predict", code) for code in counted}
    async with client(server) as stub:
        invalid = [
            (pb.PredictRequest(), "give a prompt"),
            (pb.PredictRequest(messages=[pb.ChatMessage(role="robot", content="hi")]), "role"),
            (pb.PredictRequest(prompt=FRANCE, max_tokens=100000), "max_tokens"),
            (pb.PredictRequest(prompt=FRANCE, temperature=7.0), "temperature"),
            (pb.PredictRequest(prompt=FRANCE, top_p=0.0), "top_p"),
        ]
        for request, word in invalid:
            code, details = await status_of(stub.Predict(request))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and word in details, (code, details)
        code, details = await status_of(_drain(stub.StreamPredict(pb.PredictRequest())))
        assert code == grpc.StatusCode.INVALID_ARGUMENT

        code, details = await status_of(stub.Predict(pb.PredictRequest(prompt=FRANCE, model_id="no-such-model")))
        assert code == grpc.StatusCode.UNAVAILABLE and "no LLM upstream serves model 'no-such-model'" in details
        code, details = await status_of(_drain(stub.StreamPredict(
            pb.PredictRequest(prompt=FRANCE, model_id="no-such-model"))))
        assert code == grpc.StatusCode.UNAVAILABLE

        code, _ = await status_of(stub.Predict(pb.PredictRequest(prompt="x" * 10000)))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED  # over grpc.max_message_bytes

        async def audio(*chunks: pb.AudioChunk) -> AsyncIterator[pb.AudioChunk]:
            for chunk in chunks:
                yield chunk

        second = bytes(2 * 16000)
        bad_audio = [
            ((), grpc.StatusCode.INVALID_ARGUMENT, "no audio"),
            ((pb.AudioChunk(data=second[:3200], encoding="speex"),), grpc.StatusCode.INVALID_ARGUMENT, "speex"),
            ((pb.AudioChunk(data=second[:3200]),), grpc.StatusCode.INVALID_ARGUMENT, "sample_rate"),
            ((pb.AudioChunk(data=second[:3201], sample_rate=16000),), grpc.StatusCode.INVALID_ARGUMENT, "bytes"),
            ((pb.AudioChunk(data=b"RIFF garbage" * 100, encoding="wav"),), grpc.StatusCode.INVALID_ARGUMENT,
             "cannot decode"),
            (tuple(pb.AudioChunk(data=second[:3200], sample_rate=16000) for _ in range(11)),
             grpc.StatusCode.RESOURCE_EXHAUSTED, "max_audio_s"),
        ]
        for chunks, expected, word in bad_audio:
            code, details = await status_of(stub.StreamInput(audio(*chunks)))
            assert code == expected and word in details, (code, details)

        # Converse needs the voice loop, which this server does not run
        async def hello() -> AsyncIterator[pb.ConversationInput]:
            yield pb.ConversationInput(text="hello")

        code, details = await status_of(_drain(stub.Converse(hello())))
        assert code == grpc.StatusCode.FAILED_PRECONDITION and "voice" in details

        assert (await stub.Predict(pb.PredictRequest(prompt=FRANCE, max_tokens=2))).text
    # every call is counted by the status its client saw
    assert {code: calls("Predict", code) - before[code] for code in counted} == {
        "INVALID_ARGUMENT": 5, "UNAVAILABLE": 1, "OK": 1}
    assert calls("StreamInput", "RESOURCE_EXHAUSTED") >= 1 and calls("Converse", "FAILED_PRECONDITION") >= 1
    assert REGISTRY.get_sample_value("vigil_grpc_calls_in_flight", {"method": "Predict"}) == 0


def _ogg_opus(pcm: np.ndarray, rate: int) -> bytes:
    out = io.BytesIO()
    with av.open(out, "w", format="ogg") as container:
        stream = container.add_stream("libopus", rate=48000, layout="mono")
        frame = av.AudioFrame.from_ndarray(pcm.astype(np.int16).reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = rate
        for resampled in av.AudioResampler(format="s16", layout="mono", rate=48000).resample(frame):
            for packet in stream.encode(resampled):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return out.getvalue()


async def test_stream_input_transcribes_pcm_at_any_rate_and_containers(vigil, upstream):
    server = await start(vigil, upstream)
    async with client(server) as stub:
        async def pcm_chunks(rate: int, channels: int) -> AsyncIterator[pb.AudioChunk]:
            mono = speech(QUESTION, rate)
            interleaved = np.repeat(mono, channels)
            step = rate * channels // 4  # 250 ms per chunk
            for start in range(0, interleaved.size, step):
                first = start == 0
                yield pb.AudioChunk(data=interleaved[start:start + step].astype("<i2").tobytes(),
                                    sample_rate=rate if first else 0, channels=channels if first else 0,
                                    encoding="pcm16" if first else "")

        async def file_chunks(data: bytes, encoding: str) -> AsyncIterator[pb.AudioChunk]:
            for start in range(0, len(data), 4096):
                yield pb.AudioChunk(data=data[start:start + 4096], encoding=encoding)

        results = {
            "pcm16 22050 Hz mono": await stub.StreamInput(pcm_chunks(22050, 1)),
            "pcm16 44100 Hz stereo": await stub.StreamInput(pcm_chunks(44100, 2)),
            "wav 16 kHz": await stub.StreamInput(file_chunks(wav_bytes(speech(QUESTION, 16000), 16000), "wav")),
            "ogg/opus": await stub.StreamInput(file_chunks(_ogg_opus(speech(QUESTION, 24000), 24000), "opus")),
        }
        for name, result in results.items():
            assert {"how", "many", "people"} <= _words(result.text), (name, result.text)
            assert result.language == "en" and 1.0 < result.duration_s < 3.5, (name, result.duration_s)
            assert result.segments and result.segments[0].text


async def test_converse_spoken_turn_then_typed_turn(vigil, upstream):
    server = await start(vigil, upstream, voice={"enabled": True, "end_of_turn_silence_ms": 500})
    outputs: list[pb.ConversationOutput] = []
    turn_reported = {1: asyncio.Event(), 2: asyncio.Event()}
    spoken = np.concatenate([silence(0.3, 16000), speech(QUESTION, 16000), silence(1.0, 16000)])

    async def inputs() -> AsyncIterator[pb.ConversationInput]:
        yield pb.ConversationInput(config=pb.ConversationConfig(output_sample_rate=16000))
        for start in range(0, spoken.size, 1600):  # 100 ms chunks, sent faster than real time
            yield pb.ConversationInput(audio=pb.AudioChunk(
                data=spoken[start:start + 1600].astype("<i2").tobytes(), sample_rate=16000))
        await turn_reported[1].wait()
        yield pb.ConversationInput(text="What color is the sky?")
        await turn_reported[2].wait()
        # returning half-closes: the server ends the call once everything is answered

    async with client(server) as stub:
        call = stub.Converse(inputs())
        async with asyncio.timeout(120):
            async for output in call:
                outputs.append(output)
                if output.WhichOneof("output") == "metrics":
                    turn_reported[output.metrics.turn].set()
        assert await call.code() == grpc.StatusCode.OK

    kinds = [o.WhichOneof("output") for o in outputs]
    assert kinds[0] == "started" and "error" not in kinds, [o for o in outputs if o.HasField("error")]
    finals = [o.transcript for o in outputs if o.HasField("transcript") and o.transcript.final]
    assert [f.turn for f in finals] == [1, 2]
    assert {"how", "many", "people"} <= _words(finals[0].text), finals[0]
    assert finals[1].text == "What color is the sky?"
    replies = {turn: "".join(o.reply.delta for o in outputs if o.HasField("reply") and o.reply.turn == turn)
               for turn in (1, 2)}
    assert all(replies.values()), replies
    assert sum(o.HasField("reply") and o.reply.done for o in outputs) == 2
    metrics = [o.metrics for o in outputs if o.HasField("metrics")]
    assert metrics[0].speech_ms > 1000 and metrics[0].voice_to_voice_ms > 0

    # The reply audio before turn 2's transcript is turn 1's answer: heard back, it says the reply's words.
    second = kinds.index("transcript", kinds.index("metrics"))
    audio = [o.audio for o in outputs[:second] if o.HasField("audio")]
    assert audio and all(a.sample_rate == 16000 for a in audio)
    pcm = np.frombuffer(b"".join(a.data for a in audio), dtype="<i2")
    assert pcm.size > 16000 * 0.5, "less than half a second of reply audio"
    heard = await asyncio.to_thread(lambda: WhisperStt().transcribe(pcm.astype(np.float32) / 32768.0).text)
    overlap = _words(heard) & _words(replies[1])
    assert len(overlap) >= min(3, len(_words(replies[1]))), (heard, replies[1])
    assert any(o.HasField("audio") for o in outputs[second:]), "the typed turn was not spoken"


async def test_converse_typed_barge_in_limits_and_bad_input(vigil, upstream):
    server = await start(vigil, upstream, voice={"enabled": True, "max_reply_tokens": 200},
                         grpc={"max_conversations": 1})
    outputs: list[pb.ConversationOutput] = []
    first_audio, second_done = asyncio.Event(), asyncio.Event()

    async def inputs() -> AsyncIterator[pb.ConversationInput]:
        yield pb.ConversationInput(text="Tell me a long story about a brave knight and a dragon.")
        await first_audio.wait()
        yield pb.ConversationInput(text="Stop. What time is it?")  # typed over the playing reply
        await second_done.wait()

    async def messages(*items: pb.ConversationInput) -> AsyncIterator[pb.ConversationInput]:
        for item in items:
            yield item

    async with client(server) as stub:
        call = stub.Converse(inputs())
        async with asyncio.timeout(120):
            async for output in call:
                outputs.append(output)
                if output.HasField("started"):  # one conversation at most on this server
                    code, details = await status_of(_drain(stub.Converse(messages(pb.ConversationInput(text="hi")))))
                    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "conversation limit" in details
                if output.HasField("audio"):
                    first_audio.set()
                if output.HasField("reply") and output.reply.done and output.reply.turn == 2:
                    second_done.set()
        assert await call.code() == grpc.StatusCode.OK

        (barge,) = [o.event for o in outputs if o.HasField("event") and o.event.name == "barge_in"]
        assert json.loads(barge.data_json)["turn"] == 1
        ends = [(o.reply.turn, o.reply.interrupted) for o in outputs if o.HasField("reply") and o.reply.done]
        assert ends == [(1, True), (2, False)]  # 1 was cut, and says so
        metrics = {o.metrics.turn: o.metrics for o in outputs if o.HasField("metrics")}
        assert metrics[1].HasField("barge_in_stop_ms") and 2 in metrics

        bad = [
            (messages(pb.ConversationInput(audio=pb.AudioChunk(data=b"RIFF", encoding="wav"))), "pcm16 audio only"),
            (messages(pb.ConversationInput(text="hi"), pb.ConversationInput(config=pb.ConversationConfig())),
             "first message"),
            (messages(pb.ConversationInput()), "empty ConversationInput"),
            (messages(pb.ConversationInput(config=pb.ConversationConfig(output_sample_rate=5))), "output_sample_rate"),
        ]
        for requests, word in bad:
            code, details = await status_of(_drain(stub.Converse(requests)))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and word in details, (code, details)


async def test_vigil_serve_runs_grpc_beside_http(upstream, tmp_path: Path):
    """The real command line: HTTP and gRPC in one process, the gRPC port from --grpc-port, the LLM from env."""
    grpc_port = free_port()
    env = {"VIGIL_VOICE__ENABLED": "false", "VIGIL_MODELS__DETECTOR__BACKEND": "none",
           "VIGIL_MODELS__LLM__BACKEND": "openai", "VIGIL_MODELS__LLM__BASE_URL": upstream.url,
           "VIGIL_API__CACHE__SEMANTIC": "false"}  # its MiniLM would load on the first call: 6 s of nothing tested
    server = VigilProcess(tmp_path, args=["--grpc-port", str(grpc_port)], env=env)
    try:
        await asyncio.to_thread(server.start, 60)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            await asyncio.wait_for(channel.channel_ready(), 60)
            answer = await pb_grpc.InferenceServiceStub(channel).Predict(pb.PredictRequest(prompt=FRANCE,
                                                                                          max_tokens=3))
            assert answer.usage.completion_tokens == 3
        async with aiohttp.ClientSession() as session, session.get(f"{server.url}/healthz") as r:
            assert r.status == 200
    finally:
        assert await asyncio.to_thread(server.stop) == 0, server.log(2000)
