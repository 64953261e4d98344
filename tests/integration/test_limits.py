"""Every limit holds under concurrency: parallel requests never overshoot it, and its slots free again."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import grpc
import openai
import pytest

from server.cli.client import VigilClient, VigilError
from server.grpc_api import inference_pb2 as pb
from server.grpc_api import inference_pb2_grpc as pb_grpc
from server.grpc_api.service import GRPC_SERVER
from server.v1.audio_services import AUDIO
from server.v1.chat_service import CHAT_SERVICE
from tests.integration.test_batch_jobs import LONG_SENTENCES
from tests.support.held_models import HeldModelForTest
from tests.support.scripted_llm import ScriptedLlmForTest
from tests.support.speech_files import spoken, wav_bytes

T = TypeVar("T")

CHAT_MODEL = "smollm2-135m-instruct"  # the configured model's name, answered by the scripted LLM


async def test_twenty_parallel_offers_with_a_limit_of_four_open_exactly_four(vigil):
    server = await vigil(sessions={"max_sessions": 4})
    clients = [VigilClient(server.url) for _ in range(20)]
    results = await asyncio.gather(*(c.connect(timeout=60) for c in clients), return_exceptions=True)
    accepted = [c for c, r in zip(clients, results, strict=True) if isinstance(r, str)]
    refused = [r for r in results if isinstance(r, VigilError)]
    assert len(accepted) == 4, results
    assert len(refused) == 16 and {(r.status, r.body["error"]["code"]) for r in refused} == {
        (429, "too_many_sessions")}
    assert len(server.sessions) == 4 and server.sessions.occupied == 4
    for client in accepted:
        await client.next_message("hello")
    await asyncio.gather(*(c.close() for c in accepted))
    await asyncio.gather(*(c.pc.close() for c in clients if c not in accepted))
    assert len(server.sessions) == 0 and server.sessions.occupied == 0
    again = [VigilClient(server.url) for _ in range(4)]  # the slots are free again
    await asyncio.gather(*(c.connect(timeout=60) for c in again))
    await asyncio.gather(*(c.close() for c in again))


def _open_sockets() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
    return count


async def test_an_offer_cancelled_while_being_answered_frees_its_slot_and_peer_connection(vigil):
    # A STUN server that never answers keeps ICE gathering (inside setLocalDescription) waiting, so the
    # cancellation lands mid-answer, deterministically.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as black_hole:
        black_hole.bind(("127.0.0.1", 0))
        stun = f"stun:127.0.0.1:{black_hole.getsockname()[1]}"
        server = await vigil(webrtc={"ice_servers": [{"urls": [stun]}], "offer_rate_limit": None})
        client = VigilClient(server.url)
        client.pc.addTransceiver("video")
        await client.pc.setLocalDescription(await client.pc.createOffer())
        offer = client.pc.localDescription.sdp
        await client.pc.close()
        await asyncio.sleep(0.2)
        before = _open_sockets()
        answering = asyncio.create_task(server.sessions.open(offer, server.settings.session_defaults()))
        deadline = time.monotonic() + 30
        while _open_sockets() <= before:  # the answer's ICE gathering has opened its sockets
            assert time.monotonic() < deadline and not answering.done(), answering
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)
        assert not answering.done()  # still gathering: waiting for the STUN server
        assert server.sessions.occupied == 1
        answering.cancel()
        with pytest.raises(asyncio.CancelledError):
            await answering
        assert server.sessions.occupied == 0 and len(server.sessions) == 0
        deadline = time.monotonic() + 10
        while _open_sockets() > before:  # the peer connection was closed: its sockets with it
            assert time.monotonic() < deadline, f"{_open_sockets() - before} sockets left open"
            await asyncio.sleep(0.05)


async def test_parallel_offers_are_rate_limited_per_client_with_retry_after(vigil):
    server = await vigil(webrtc={"offer_rate_limit": {"requests": 5, "window_s": 60}})
    body = {"sdp": "v=0 not really", "type": "offer"}  # refused offers count too: a bogus burst is limited

    async def post(http: aiohttp.ClientSession) -> tuple[int, dict, str | None]:
        async with http.post(f"{server.url}/offer", json=body) as response:
            return response.status, await response.json(), response.headers.get("Retry-After")

    async with aiohttp.ClientSession() as http:
        results = await asyncio.gather(*(post(http) for _ in range(12)))
    assert sorted(status for status, _, _ in results) == [400] * 5 + [429] * 7, results
    limited = [(b, retry) for status, b, retry in results if status == 429]
    assert all(b["error"]["code"] == "too_many_offers" and retry is not None and 1 <= int(retry) <= 60
               for b, retry in limited)


async def test_parallel_sources_never_exceed_max_sources(vigil):
    server = await vigil(sessions={"max_sources": 3})

    async def post(http: aiohttp.ClientSession) -> tuple[int, dict]:
        async with http.post(f"{server.url}/api/sources", json={"path": "long.mp4", "loop": True}) as response:
            return response.status, await response.json()

    async with aiohttp.ClientSession() as http:
        results = await asyncio.gather(*(post(http) for _ in range(10)))
        assert sorted(status for status, _ in results) == [201] * 3 + [429] * 7, results
        assert {b["error"]["code"] for status, b in results if status == 429} == {"too_many_sources"}
        for status, created in results:
            if status == 201:
                async with http.delete(f"{server.url}/api/sources/{created['id']}") as response:
                    assert response.status == 204
        assert sorted(status for status, _ in await asyncio.gather(*(post(http) for _ in range(4)))) == [
            201, 201, 201, 429]


async def test_parallel_result_subscribers_never_exceed_max_subscribers(vigil):
    server = await vigil(sources={"max_subscribers": 3})

    async with aiohttp.ClientSession() as http:
        status, created = await post_json(http, f"{server.url}/api/sources", json={"path": "long.mp4", "loop": True})
        assert status == 201, created
        url = f"{server.url}/api/sources/{created['id']}/results"
        source = server.sources.get(created["id"])

        async def subscribe() -> aiohttp.ClientWebSocketResponse | int:
            try:
                return await http.ws_connect(url)
            except aiohttp.WSServerHandshakeError as refused:
                return refused.status

        results = await asyncio.gather(*(subscribe() for _ in range(10)))
        sockets = [r for r in results if isinstance(r, aiohttp.ClientWebSocketResponse)]
        assert len(sockets) == 3 and sorted(r for r in results if isinstance(r, int)) == [429] * 7, results
        assert len(source.subscribers) == 3
        for ws in sockets:
            assert (await ws.receive_json(timeout=30))["type"] == "hello"
        async with http.get(url) as response:  # refused before the upgrade, in the documented shape
            assert response.status == 429
            error = (await response.json())["error"]
            assert error["code"] == "too_many_subscribers" and "sources.max_subscribers" in error["message"]
        await sockets.pop().close()
        deadline = time.monotonic() + 30
        while len(source.subscribers) > 2:  # the server notices the close
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        again = await subscribe()  # the slot is free again
        assert isinstance(again, aiohttp.ClientWebSocketResponse)
        for ws in [*sockets, again]:
            await ws.close()


async def test_parallel_v1_requests_never_exceed_the_rate_limit(vigil):
    server = await vigil(api={"rate_limit": {"requests": 5, "window_s": 60}})

    async def get(http: aiohttp.ClientSession) -> tuple[int, str | None]:
        async with http.get(f"{server.url}/v1/models") as response:
            await response.read()
            return response.status, response.headers.get("Retry-After")

    async with aiohttp.ClientSession() as http:
        results = await asyncio.gather(*(get(http) for _ in range(15)))
    assert sorted(status for status, _ in results) == [200] * 5 + [429] * 10, results
    assert all(retry is not None for status, retry in results if status == 429)


async def test_parallel_chat_generations_never_exceed_max_in_flight(vigil):
    server = await vigil(api={"max_in_flight": 3, "rate_limit": None,
                              "cache": {"exact": False, "semantic": False}})
    release = asyncio.Event()
    scripted = ScriptedLlmForTest(["Fine."], name=CHAT_MODEL, hold=release)
    server.app[CHAT_SERVICE].use_llm_for_test(scripted)
    body = {"model": CHAT_MODEL, "messages": [{"role": "user", "content": "hello"}]}

    async def ask(http: aiohttp.ClientSession) -> tuple[int, dict]:
        async with http.post(f"{server.url}/v1/chat/completions", json=body) as response:
            return response.status, await response.json()

    async with aiohttp.ClientSession() as http:
        pending = [asyncio.create_task(ask(http)) for _ in range(10)]
        async with asyncio.timeout(60):  # the held three cannot finish before the release
            while sum(task.done() for task in pending) < 7:
                await asyncio.wait([t for t in pending if not t.done()], return_when=asyncio.FIRST_COMPLETED)
        done = [task for task in pending if task.done()]
        refused = [task.result() for task in done]
        assert len(refused) == 7 and {(s, b["error"]["code"]) for s, b in refused} == {(503, "server_busy")}
        assert server.app[CHAT_SERVICE].in_flight == 3
        release.set()
        answered = await asyncio.gather(*(task for task in pending if task not in done))
        assert [status for status, _ in answered] == [200] * 3
        assert server.app[CHAT_SERVICE].in_flight == 0
        assert (await ask(http))[0] == 200  # free again


async def test_parallel_job_submissions_never_exceed_max_active_jobs(vigil, tmp_path: Path):
    server = await vigil(transcription={"data_dir": str(tmp_path / "jobs"), "max_active_jobs": 2},
                         api={"rate_limit": None})
    audio = wav_bytes(spoken(LONG_SENTENCES, pause_s=1.2))  # long enough that no job ends during the burst

    async def submit(http: aiohttp.ClientSession) -> tuple[int, dict]:
        form = aiohttp.FormData()
        form.add_field("file", audio, filename="speech.wav", content_type="audio/wav")
        form.add_field("model", "whisper-1")
        async with http.post(f"{server.url}/v1/audio/transcriptions/jobs", data=form) as response:
            return response.status, await response.json()

    async with aiohttp.ClientSession() as http:
        results = await asyncio.gather(*(submit(http) for _ in range(8)))
        assert sorted(status for status, _ in results) == [202] * 2 + [503] * 6, results
        assert {b["error"]["code"] for status, b in results if status == 503} == {"server_busy"}
        for status, job in results:  # cancelled, they free their slots at once
            if status == 202:
                async with http.post(f"{server.url}/v1/audio/transcriptions/jobs/{job['id']}/cancel") as response:
                    assert response.status == 200, await response.text()
        assert sorted(status for status, _ in await asyncio.gather(*(submit(http) for _ in range(3)))) == [
            202, 202, 503]


# ---------------------------------------------------------------- limits held by requests in flight


async def burst_with_some_held(requests: list[Awaitable[T]], held: int) -> tuple[list[T], list[asyncio.Task[T]]]:
    """Start every request at once; wait until all but ``held`` have answered (the held ones cannot answer before
    the test releases them). Returns (the answers so far, the tasks still held)."""
    pending = [asyncio.ensure_future(request) for request in requests]
    async with asyncio.timeout(120):
        while sum(task.done() for task in pending) < len(pending) - held:
            await asyncio.wait([t for t in pending if not t.done()], return_when=asyncio.FIRST_COMPLETED)
    await asyncio.sleep(0.3)  # a held request that answered late would show here
    return [t.result() for t in pending if t.done()], [t for t in pending if not t.done()]


async def post_json(http: aiohttp.ClientSession, url: str, **kwargs: Any) -> tuple[int, dict[str, Any]]:
    async with http.post(url, **kwargs) as response:
        if response.content_type == "application/json":
            return response.status, await response.json()
        await response.read()
        return response.status, {}


async def test_parallel_speech_requests_never_exceed_max_pending_requests(vigil):
    server = await vigil(speech={"max_pending_requests": 2}, api={"rate_limit": None})
    release = threading.Event()
    synthesizer = await server.app[AUDIO].speech()
    synthesizer.tts = HeldModelForTest(synthesizer.tts, ["synthesize"], release)
    body = {"model": "tts-1", "voice": "alloy", "input": "Hello there.", "response_format": "wav"}
    try:
        async with aiohttp.ClientSession() as http:
            url = f"{server.url}/v1/audio/speech"
            refused, held = await burst_with_some_held([post_json(http, url, json=body) for _ in range(8)], held=2)
            assert len(refused) == 6 and {(s, b["error"]["code"]) for s, b in refused} == {(503, "server_busy")}
            assert all(b["error"]["message"] and b["error"]["type"] for _, b in refused)
            release.set()
            assert [status for status, _ in await asyncio.gather(*held)] == [200, 200]
            assert (await post_json(http, url, json=body))[0] == 200  # free again
    finally:
        release.set()


async def test_parallel_transcriptions_never_exceed_max_pending_requests(vigil):
    server = await vigil(transcription={"max_pending_requests": 2}, api={"rate_limit": None})
    release = threading.Event()
    engine = server.app[AUDIO].engine
    engine.use_model_for_test(HeldModelForTest(await engine.model(), ["plan"], release))
    audio = wav_bytes(spoken(["The weather is nice today."]))

    def form() -> aiohttp.FormData:
        data = aiohttp.FormData()
        data.add_field("file", audio, filename="speech.wav", content_type="audio/wav")
        data.add_field("model", "whisper-1")
        return data

    try:
        async with aiohttp.ClientSession() as http:
            url = f"{server.url}/v1/audio/transcriptions"
            refused, held = await burst_with_some_held([post_json(http, url, data=form()) for _ in range(8)],
                                                       held=2)
            assert len(refused) == 6 and {(s, b["error"]["code"]) for s, b in refused} == {(503, "server_busy")}
            assert engine.pending_requests == 2
            release.set()
            answered = await asyncio.gather(*held)
            assert [status for status, _ in answered] == [200, 200]
            assert all("weather" in body["text"].lower() for _, body in answered), answered
            assert engine.pending_requests == 0
            assert (await post_json(http, url, data=form()))[0] == 200  # free again
    finally:
        release.set()


async def test_parallel_requests_of_one_api_key_never_exceed_its_rate_limit(vigil):
    server = await vigil(api={"keys": [{"name": "slow", "key": "key-slow",
                                        "rate_limit": {"requests": 4, "window_s": 60}},
                                       {"name": "other", "key": "key-other"}]})
    slow = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="key-slow", max_retries=0)
    other = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="key-other", max_retries=0)
    results = await asyncio.gather(*(slow.models.list() for _ in range(12)), return_exceptions=True)
    limited = [r for r in results if isinstance(r, openai.RateLimitError)]
    assert len(limited) == 8 and len([r for r in results if not isinstance(r, BaseException)]) == 4, results
    assert all(e.status_code == 429 and e.code == "rate_limit_exceeded" and 1 <= int(
        e.response.headers["retry-after"]) <= 60 for e in limited)
    assert (await other.models.list()).data  # the server still serves, and the other key has its own window
    await slow.close()
    await other.close()


async def test_parallel_requests_through_two_servers_never_exceed_the_shared_redis_rate_limit(vigil, redis_server):
    """Two servers share one Redis window: 12 requests split across both, at once, admit exactly the limit."""
    config = {"redis": {"url": redis_server.url, "key_prefix": "vigil-limits:"},
              "api": {"keys": [{"name": "team", "key": "key-team", "rate_limit": {"requests": 5, "window_s": 60}},
                               {"name": "other", "key": "key-other"}]}}
    servers = [await vigil(**config), await vigil(**config)]
    teams = [openai.AsyncOpenAI(base_url=s.url + "/v1", api_key="key-team", max_retries=0) for s in servers]
    results = await asyncio.gather(*(teams[i % 2].models.list() for i in range(12)), return_exceptions=True)
    limited = [r for r in results if isinstance(r, openai.RateLimitError)]
    assert len(limited) == 7 and len([r for r in results if not isinstance(r, BaseException)]) == 5, results
    assert all(e.status_code == 429 and e.code == "rate_limit_exceeded" for e in limited)
    for server in servers:  # both still serve
        other = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="key-other", max_retries=0)
        assert (await other.models.list()).data
        await other.close()
    for team in teams:
        await team.close()


def grpc_stub(server: Any, channel: grpc.aio.Channel | None = None) -> tuple[grpc.aio.Channel, Any]:
    channel = channel or grpc.aio.insecure_channel(f"127.0.0.1:{server.app[GRPC_SERVER].port}")
    return channel, pb_grpc.InferenceServiceStub(channel)


async def grpc_outcome(call: Awaitable[T]) -> T | tuple[grpc.StatusCode, str]:
    try:
        return await call
    except grpc.aio.AioRpcError as error:
        return error.code(), error.details() or ""


async def test_parallel_grpc_calls_never_exceed_max_concurrent_rpcs(vigil):
    server = await vigil(grpc={"port": 0, "max_concurrent_rpcs": 3},
                         api={"max_in_flight": 20, "rate_limit": None, "cache": {"exact": False, "semantic": False}})
    release = asyncio.Event()
    server.app[CHAT_SERVICE].use_llm_for_test(ScriptedLlmForTest(["Fine."], name=CHAT_MODEL, hold=release))
    channel, stub = grpc_stub(server)
    async with channel:
        calls = [grpc_outcome(stub.Predict(pb.PredictRequest(prompt="hello"))) for _ in range(10)]
        refused, held = await burst_with_some_held(calls, held=3)
        assert len(refused) == 7 and {code for code, _ in refused} == {grpc.StatusCode.RESOURCE_EXHAUSTED}
        release.set()
        assert [answer.text for answer in await asyncio.gather(*held)] == ["Fine."] * 3
        assert (await stub.Predict(pb.PredictRequest(prompt="hello"))).text == "Fine."  # free again


async def test_parallel_conversations_never_exceed_max_conversations(vigil):
    server = await vigil(voice={"enabled": True}, grpc={"port": 0, "max_conversations": 2})
    hang_up = asyncio.Event()

    async def inputs() -> AsyncIterator[pb.ConversationInput]:
        yield pb.ConversationInput(config=pb.ConversationConfig())
        await hang_up.wait()

    async def converse(stub: Any) -> tuple[str, Any] | tuple[grpc.StatusCode, str]:
        call = stub.Converse(inputs())
        try:
            first = await call.read()
        except grpc.aio.AioRpcError as error:
            return error.code(), error.details() or ""
        assert first.HasField("started"), first
        return "started", call

    channel, stub = grpc_stub(server)
    async with channel:
        try:
            results = await asyncio.gather(*(converse(stub) for _ in range(6)))
            started = [call for outcome, call in results if outcome == "started"]
            refused = [(code, details) for code, details in results if code != "started"]
            assert len(started) == 2 and len(refused) == 4, results
            assert all(code == grpc.StatusCode.RESOURCE_EXHAUSTED and "conversation limit" in details
                       for code, details in refused)
            assert len(server.app[GRPC_SERVER].service.conversations) == 2
        finally:
            hang_up.set()  # the admitted ones end their input: their calls finish
        for call in started:
            async with asyncio.timeout(60):
                while await call.read() is not grpc.aio.EOF:
                    pass
            assert await call.code() == grpc.StatusCode.OK
        hang_up.clear()
        again = await asyncio.gather(*(converse(stub) for _ in range(2)))  # the slots are free again
        assert [outcome for outcome, _ in again] == ["started", "started"], again
        hang_up.set()
        for _, call in again:
            call.cancel()


async def test_parallel_searches_beyond_the_queue_are_refused_with_retry_after(vigil, tmp_path: Path):
    from server.state import MEMORY

    memory = {"enabled": True, "data_dir": str(tmp_path / "memory"), "search_workers": 1, "search_queue_max": 2,
              "search_retry_after_s": 2}
    server = await vigil(memory=memory)
    index = server.app[MEMORY]
    release = threading.Event()
    await index.use_embedder_for_test(lambda embedder: HeldModelForTest(embedder, ["embed"], release))

    async def search(http: aiohttp.ClientSession, q: str) -> tuple[int, str | None, dict[str, Any]]:
        async with http.get(f"{server.url}/api/search", params={"q": q}) as response:
            return response.status, response.headers.get("Retry-After"), await response.json()

    try:
        async with aiohttp.ClientSession() as http:
            # One search runs (its query embedding held), two wait for the one search thread: the other five go.
            refused, held = await burst_with_some_held([search(http, f"parcel {n}") for n in range(8)], held=3)
            assert len(refused) == 5 and {(s, r, b["error"]["code"]) for s, r, b in refused} == {
                (503, "2", "server_busy")}, refused
            assert index.searches_in_flight == 3
            release.set()
            answered = await asyncio.gather(*held)
            assert [status for status, _, _ in answered] == [200] * 3, answered
            assert index.searches_in_flight == 0
            assert (await search(http, "parcel again"))[0] == 200  # served again
    finally:
        release.set()
