"""Every limit holds under concurrency: parallel requests never overshoot it, and its slots free again."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp

from server.client import VigilClient, VigilError
from server.openai_api import CHAT_API
from tests.integration.test_batch_jobs import LONG_SENTENCES
from tests.support.scripted_llm import ScriptedLlmForTest
from tests.support.speech_files import spoken, wav_bytes

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
    server.app[CHAT_API].use_llm_for_test(scripted)
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
        assert server.app[CHAT_API].in_flight == 3
        release.set()
        answered = await asyncio.gather(*(task for task in pending if task not in done))
        assert [status for status, _ in answered] == [200] * 3
        assert server.app[CHAT_API].in_flight == 0
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
