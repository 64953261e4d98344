"""Asynchronous transcription jobs: the persisted queue (SQLite) behind ``/v1/audio/transcriptions/jobs``.

The restart test runs real server processes (``vigil serve``): one is killed (SIGKILL) in the middle of a
job; the next one resumes it, and the result has every segment exactly once: it equals the uninterrupted
transcription of the same file. The rest runs in-process against a real server on loopback."""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from models.stt.batch import AudioChunk, BatchedWhisper, FileSegment
from pipelines.batch.engine import TranscriptionEngine
from pipelines.batch.jobs import JobQueue
from pipelines.batch.store import JobRecord, JobStore
from server.config import ConfigError, load_settings
from tests.support.speech_files import spoken, wav_bytes, words
from tests.support.vigil_process import VigilProcess

TOKEN = "jobs-test-key"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}
LONG_SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Please call Stella and ask her to bring these things.",
    "How many people do you see in the room?",
    "The weather today is sunny with a light breeze.",
    "We will meet at the train station at noon.",
    "My favourite animal is the elephant.",
    "The library closes at six in the evening.",
    "Turn left at the second traffic light.",
    "Seven students passed the difficult exam.",
    "Bring an umbrella because it might rain.",
    "The museum has a famous painting of a ship.",
    "Coffee tastes better in the morning.",
]
SHORT_SENTENCES = ["Is anyone at the door?", "Tell me something about cats."]


@pytest.fixture(scope="module")
def long_wav() -> bytes:
    return wav_bytes(spoken(LONG_SENTENCES, pause_s=1.2))


@pytest.fixture(scope="module")
def short_wav() -> bytes:
    return wav_bytes(spoken(SHORT_SENTENCES))


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(headers=HEADERS) as session:
        yield session


async def submit(http: aiohttp.ClientSession, base: str, audio: bytes, name: str = "speech.wav",
                 model: str = "whisper-1", **fields: str) -> tuple[int, dict[str, Any]]:
    form = aiohttp.FormData()
    form.add_field("file", audio, filename=name, content_type="application/octet-stream")
    form.add_field("model", model)
    for key, value in fields.items():
        form.add_field(key, value)
    async with http.post(f"{base}/v1/audio/transcriptions/jobs", data=form) as response:
        return response.status, await response.json()


async def get_job(http: aiohttp.ClientSession, base: str, job_id: str) -> dict[str, Any]:
    async with http.get(f"{base}/v1/audio/transcriptions/jobs/{job_id}") as response:
        assert response.status == 200, await response.text()
        return await response.json()


async def wait_for(http: aiohttp.ClientSession, base: str, job_id: str, statuses: tuple[str, ...],
                   timeout_s: float = 120.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        job = await get_job(http, base, job_id)
        if job["status"] in statuses:
            return job
        assert job["status"] in ("queued", "running"), job
        assert time.monotonic() < deadline, f"job still {job['status']}: {job}"
        await asyncio.sleep(0.05)


def assert_heard(text: str, sentences: list[str]) -> None:
    heard = words(text)
    expected = [w for sentence in sentences for w in words(sentence)]
    assert sum(1 for w in expected if w in heard) >= 0.8 * len(expected), text
    assert len(heard) <= len(expected) + 3, text


# --- a job killed mid-way completes after a restart ------------------------------------------------------------


def stored_chunks(database: Path, job_id: str) -> dict[int, str | None]:
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as conn:
        return dict(conn.execute("SELECT idx, segments FROM chunks WHERE job_id = ?", (job_id,)).fetchall())


async def test_a_job_killed_midway_completes_after_restart(tmp_path: Path, http, long_wav: bytes, short_wav: bytes):
    data_dir = tmp_path / "jobs"
    config = tmp_path / "vigil.yaml"
    config.write_text(
        f"auth: {{token: {TOKEN}}}\n"
        "api: {rate_limit: null}\n"  # the test polls the job's status often
        "webrtc: {host_addresses: ['127.0.0.1']}\n"
        "voice: {enabled: false}\n"
        "models: {detector: {backend: none}}\n"
        # one chunk per step, at most 4 s each: many small saved steps, so the kill lands between two of them
        f"transcription: {{data_dir: '{data_dir}', batch_size: 1, max_chunk_s: 4, workers: 1}}\n"
        f"storage: {{data_dir: '{tmp_path / 'timeline'}'}}\n"  # never the checkout's data/
        # memory off, as VigilProcess has it for every config it writes: it loads torch and MiniLM (~7 s a start)
        f"memory: {{enabled: false, data_dir: '{tmp_path / 'memory'}'}}\n")
    first = VigilProcess(tmp_path, config_file=config, token=TOKEN)
    try:
        await asyncio.to_thread(first.start, 60)
        status, long_job = await submit(http, first.url, long_wav, name="long.wav")
        assert status == 202 and long_job["status"] == "queued", long_job
        status, short_job = await submit(http, first.url, short_wav, name="short.wav")  # waits behind it
        assert status == 202
        while (job := await get_job(http, first.url, long_job["id"]))["progress"]["chunks_done"] < 2:
            assert job["status"] in ("queued", "running"), job
            await asyncio.sleep(0.02)
        first.stop(hard=True)  # no shutdown handler runs: the job is left 'running' mid-way
    finally:
        first.stop()
    total = job["progress"]["chunks_total"]
    assert total >= 8 and job["progress"]["chunks_done"] < total, job  # really killed mid-way
    before = stored_chunks(data_dir / "jobs.sqlite3", long_job["id"])
    done_before = {index: segments for index, segments in before.items() if segments is not None}
    assert 2 <= len(done_before) < total

    second = VigilProcess(tmp_path, config_file=config, token=TOKEN)
    try:
        await asyncio.to_thread(second.start, 60)
        resumed = await wait_for(http, second.url, long_job["id"], ("completed", "failed"))
        assert resumed["status"] == "completed", resumed
        assert resumed["attempts"] == 2  # started twice: before the kill and after the restart
        assert resumed["progress"] == {"chunks_done": total, "chunks_total": total, "fraction": 1.0,
                                       "audio_seconds_done": resumed["progress"]["audio_seconds_done"]}
        after = stored_chunks(data_dir / "jobs.sqlite3", long_job["id"])
        assert all(after[index] == segments for index, segments in done_before.items())  # not decoded again
        queued_behind = await wait_for(http, second.url, short_job["id"], ("completed", "failed"))
        assert queued_behind["status"] == "completed" and queued_behind["attempts"] == 1
        assert_heard(queued_behind["result"]["text"], SHORT_SENTENCES)

        # Nothing lost, nothing twice: the same segments as one uninterrupted pass over the file.
        form = aiohttp.FormData()
        form.add_field("file", long_wav, filename="long.wav")
        form.add_field("model", "whisper-1")
        form.add_field("response_format", "verbose_json")
        async with http.post(f"{second.url}/v1/audio/transcriptions", data=form) as response:
            assert response.status == 200
            uninterrupted = await response.json()
        result = resumed["result"]
        assert [(s["start"], s["end"], s["text"]) for s in result["segments"]] == [
            (s["start"], s["end"], s["text"]) for s in uninterrupted["segments"]]
        assert result["text"] == uninterrupted["text"]
        assert_heard(result["text"], LONG_SENTENCES)
        assert not list((data_dir / "audio").iterdir())  # finished jobs' audio is removed
    finally:
        assert second.stop() == 0  # a graceful stop


# --- the API, in-process -----------------------------------------------------------------------------------


@pytest.fixture
async def server(vigil, tmp_path: Path):
    return await vigil(auth={"token": TOKEN}, transcription={"data_dir": str(tmp_path / "jobs"), "batch_size": 4})


async def test_job_lifecycle(server, http, short_wav: bytes):
    status, job = await submit(http, server.url, short_wav, name="meeting.wav", language="en")
    assert status == 202
    assert job["object"] == "transcription.job" and job["id"].startswith("trjob_")
    assert job["filename"] == "meeting.wav" and job["duration"] == pytest.approx(len(short_wav) / 32_000, abs=0.05)
    done = await wait_for(http, server.url, job["id"], ("completed", "failed"))
    assert done["status"] == "completed" and done["error"] is None
    assert done["progress"]["fraction"] == 1.0
    assert done["progress"]["chunks_done"] == done["progress"]["chunks_total"] >= 1
    assert done["result"]["language"] == "english" and done["result"]["segments"]
    assert_heard(done["result"]["text"], SHORT_SENTENCES)

    base = f"{server.url}/v1/audio/transcriptions/jobs"
    async with http.get(f"{base}/{job['id']}/result", params={"response_format": "srt"}) as response:
        assert response.status == 200 and response.content_type == "application/x-subrip"
        assert (await response.text()).startswith("1\n00:00:00,")
    async with http.get(f"{base}/{job['id']}/result") as response:
        assert (await response.json())["text"] == done["result"]["text"]
    async with http.get(base, params={"status": "completed"}) as response:
        listed = await response.json()
    assert [j["id"] for j in listed["data"]] == [job["id"]] and "result" not in listed["data"][0]
    assert listed["data"][0]["progress"] == done["progress"] and done["progress"]["audio_seconds_done"] > 0
    async with http.get(f"{server.url}/metrics") as response:
        metrics = await response.text()
    assert 'vigil_transcription_jobs_total{status="completed"}' in metrics
    assert 'vigil_transcribed_audio_seconds_total{path="job"}' in metrics
    async with http.delete(f"{base}/{job['id']}") as response:
        assert response.status == 200 and (await response.json())["deleted"] is True
    async with http.get(f"{base}/{job['id']}") as response:
        assert response.status == 404
        assert (await response.json())["error"]["code"] == "job_not_found"


async def test_cancel_a_queued_job_and_the_queue_limit(vigil, tmp_path: Path, http, long_wav: bytes,
                                                       short_wav: bytes):
    server = await vigil(transcription={"data_dir": str(tmp_path / "jobs"), "max_active_jobs": 2, "batch_size": 1,
                                        "max_chunk_s": 4})
    base = f"{server.url}/v1/audio/transcriptions/jobs"
    _, running = await submit(http, server.url, long_wav)
    _, waiting = await submit(http, server.url, short_wav)
    status, refused = await submit(http, server.url, short_wav)  # two are active already
    assert status == 503 and refused["error"]["code"] == "server_busy"
    async with http.post(f"{base}/{waiting['id']}/cancel") as response:
        assert response.status == 200 and (await response.json())["status"] == "cancelled"
    async with http.post(f"{base}/{waiting['id']}/cancel") as response:
        assert response.status == 409
    async with http.get(f"{base}/{waiting['id']}/result") as response:
        assert response.status == 409 and (await response.json())["error"]["code"] == "job_not_completed"
    async with http.post(f"{base}/{running['id']}/cancel") as response:  # a running job stops after its step
        assert response.status == 200
        cancelled = await response.json()
    assert cancelled["status"] == "cancelled"
    status, accepted = await submit(http, server.url, short_wav)  # room again
    assert status == 202
    assert (await wait_for(http, server.url, accepted["id"], ("completed",)))["status"] == "completed"
    # the worker dropped the cancelled job (its step in flight was not saved) before it took the new one
    after = await get_job(http, server.url, running["id"])
    assert after["status"] == "cancelled" and after["progress"] == cancelled["progress"]


async def test_bad_job_submissions(server, http, short_wav: bytes):
    status, body = await submit(http, server.url, b"\x00\x01 definitely not audio " * 200, name="x.mp3")
    assert status == 400 and body["error"]["param"] == "file" and body["error"]["code"] == "invalid_audio"
    status, body = await submit(http, server.url, short_wav, model="whisper-9")
    assert status == 400 and body["error"]["param"] == "model"
    status, body = await submit(http, server.url, short_wav, language="fr")
    assert status == 400 and body["error"]["param"] == "language"
    status, body = await submit(http, server.url, short_wav, response_format="srt")  # chosen when fetching
    assert status == 400 and body["error"]["param"] == "response_format"
    base = f"{server.url}/v1/audio/transcriptions/jobs"
    async with http.get(base, params={"limit": "0"}) as response:
        assert response.status == 400
    async with http.get(base, params={"status": "lost"}) as response:
        assert response.status == 400
    async with http.get(base) as response:
        assert (await response.json())["data"] == []  # nothing was queued
    async with http.get(f"{base}/trjob_nope") as response:
        assert response.status == 404
    async with aiohttp.ClientSession() as anonymous, anonymous.get(base) as response:
        assert response.status == 401
    assert not list((Path(server.settings.transcription.data_dir) / "audio").iterdir())  # refused uploads removed


async def test_a_job_longer_than_the_limit_is_refused(vigil, tmp_path: Path, http, short_wav: bytes):
    server = await vigil(auth={"token": TOKEN}, transcription={"data_dir": str(tmp_path / "jobs"),
                                                               "max_job_audio_s": 2.0})
    status, body = await submit(http, server.url, short_wav)
    assert status == 400 and body["error"]["code"] == "audio_too_long" and "2 s" in body["error"]["message"]
    assert not list((tmp_path / "jobs" / "audio").iterdir())


async def test_one_server_per_job_directory(vigil, tmp_path: Path, http, short_wav: bytes):
    # Two servers on one directory would re-queue each other's running jobs: the second is refused.
    shared = {"data_dir": str(tmp_path / "shared")}
    first, second = await vigil(transcription=shared), await vigil(transcription=shared)
    status, job = await submit(http, first.url, short_wav)
    assert status == 202
    status, body = await submit(http, second.url, short_wav)
    assert status == 503 and body["error"]["code"] == "job_store_in_use"
    assert "transcription.data_dir" in body["error"]["message"]
    assert (await wait_for(http, first.url, job["id"], ("completed",)))["status"] == "completed"


async def test_a_corrupt_job_database_is_a_clear_503_and_the_rest_still_works(vigil, tmp_path: Path, http,
                                                                              short_wav: bytes):
    data_dir = tmp_path / "jobs"
    data_dir.mkdir()
    (data_dir / "jobs.sqlite3").write_bytes(b"this is not an SQLite database, " * 100)
    server = await vigil(auth={"token": TOKEN}, transcription={"data_dir": str(data_dir)})  # it starts anyway
    for _ in range(2):  # each request tries again (nothing stays locked), and says why it cannot
        status, body = await submit(http, server.url, short_wav)
        assert status == 503 and body["error"]["code"] == "job_store_unavailable", body
        assert "jobs.sqlite3" in body["error"]["message"] or str(data_dir) in body["error"]["message"]
        assert set(body["error"]) == {"message", "type", "param", "code"}
    form = aiohttp.FormData()
    form.add_field("file", short_wav, filename="a.wav")
    form.add_field("model", "whisper-1")
    async with http.post(f"{server.url}/v1/audio/transcriptions", data=form) as response:
        assert response.status == 200  # direct transcription does not need the job store
        assert_heard((await response.json())["text"], SHORT_SENTENCES)
    (data_dir / "jobs.sqlite3").unlink()  # repaired: the next request opens a fresh store
    status, job = await submit(http, server.url, short_wav)
    assert status == 202 and (await wait_for(http, server.url, job["id"], ("completed",)))["status"] == "completed"


async def test_a_graceful_stop_puts_the_running_job_back_without_using_an_attempt(tmp_path: Path, long_wav: bytes):
    # A deploy (SIGTERM) in the middle of a long job is not the job's fault: it must not count towards
    # max_attempts, or a few restarts would fail a long job that never crashed anything.
    engine = TranscriptionEngine(BatchedWhisper, batch_size=1, max_chunk_s=4)
    upload = tmp_path / "long.wav"
    queue = JobQueue(tmp_path / "jobs", engine, max_attempts=1)
    await queue.start()
    upload.write_bytes(long_wav)
    job = await queue.submit(upload, filename="long.wav", duration=len(long_wav) / 32_000, model="whisper-1",
                             language="en", prompt=None)
    while (running := await queue.get(job.id)).chunks_done < 1:
        assert running.status in ("queued", "running"), running
        await asyncio.sleep(0.05)
    await queue.close()
    stopped = await stored_job(tmp_path / "jobs", job.id)
    assert stopped.status == "queued" and stopped.attempts == 0 and 1 <= stopped.chunks_done < stopped.chunks_total

    queue = JobQueue(tmp_path / "jobs", engine, max_attempts=1)  # one attempt allowed: the stop did not use it
    await queue.start()
    deadline = time.monotonic() + 120
    while (resumed := await queue.get(job.id)).status in ("queued", "running"):
        assert time.monotonic() < deadline, resumed
        await asyncio.sleep(0.05)
    assert resumed.status == "completed" and resumed.attempts == 1, resumed
    assert_heard((await queue.result(resumed)).text, LONG_SENTENCES)
    await queue.close()
    engine.close()


async def stored_job(data_dir: Path, job_id: str) -> JobRecord:
    store = JobStore(data_dir / "jobs.sqlite3")
    await store.open()
    try:
        job = await store.get(job_id)
        assert job is not None
        return job
    finally:
        await store.close()


# --- the store's guarantees ---------------------------------------------------------------------------------


def a_job(job_id: str) -> JobRecord:
    return JobRecord(id=job_id, status="queued", created_at=time.time(), started_at=None, finished_at=None,
                     filename="a.wav", audio_path=f"/nonexistent/{job_id}", model="whisper-1", language="en",
                     prompt=None, duration=10.0, detected_language=None, chunks_total=None, chunks_done=0,
                     attempts=0, error=None)


def a_segment(text: str, start: float) -> FileSegment:
    return FileSegment(start=start, end=start + 1, text=text, tokens=(1, 2), avg_logprob=-0.1, no_speech_prob=0.0,
                       compression_ratio=1.0, temperature=0.0)


async def test_store_keeps_each_chunk_once_and_gives_up_on_a_crashing_job(tmp_path: Path):
    store = JobStore(tmp_path / "jobs.sqlite3")
    await store.open()
    await store.insert(a_job("one"))
    claimed = await store.claim_next(max_attempts=2)
    assert claimed is not None and claimed.status == "running" and claimed.attempts == 1
    plan = [AudioChunk(0.0, 4.0), AudioChunk(5.0, 9.0)]
    assert await store.set_plan("one", plan) == plan
    assert await store.insert(a_job("two"), max_active=2)
    assert not await store.insert(a_job("three"), max_active=2)  # two are active: the limit holds
    assert await store.get("three") is None
    assert await store.set_plan("two", plan) is None  # not running (yet): no plan stored
    assert (await store.delete("two")).id == "two" and await store.get("two") is None
    assert await store.set_plan("one", [AudioChunk(0.0, 9.0)]) == plan  # the first plan stays
    assert await store.save_chunks("one", {0: [a_segment("first", 0.0)]}, "en")
    assert await store.save_chunks("one", {0: [a_segment("again", 0.0)], 1: [a_segment("second", 5.0)]}, "en")
    assert [s.text for s in await store.segments("one")] == ["first", "second"]  # chunk 0 kept its first result
    assert (await store.get("one")).chunks_done == 2
    await store.close()

    # A process that dies during the job leaves it 'running'; each restart re-queues it, within max_attempts.
    store = JobStore(tmp_path / "jobs.sqlite3")
    await store.open()
    assert await store.requeue_running() == 1
    assert (await store.claim_next(max_attempts=2)).attempts == 2
    assert await store.requeue_running() == 1
    assert await store.claim_next(max_attempts=2) is None
    gave_up = await store.get("one")
    assert gave_up.status == "failed" and "gave up after 2 attempts" in gave_up.error
    assert not await store.save_chunks("one", {1: [a_segment("late", 5.0)]}, "en")  # not running: not saved
    await store.close()


# --- vigil transcribe ---------------------------------------------------------------------------------------


def test_vigil_transcribe_writes_every_file_with_a_progress_bar(tmp_path: Path, short_wav: bytes):
    (tmp_path / "one.wav").write_bytes(short_wav)
    (tmp_path / "two.wav").write_bytes(wav_bytes(spoken(["Coffee tastes better in the morning."])))
    (tmp_path / "broken.wav").write_bytes(b"RIFF nonsense")
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "server.cli", "transcribe", str(tmp_path / "one.wav"), str(tmp_path / "two.wav"),
         str(tmp_path / "broken.wav"), "-f", "verbose_json", "-o", str(out)],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 1  # one file could not be read; the others are done
    assert "broken.wav" in result.stderr and "not a readable audio file" in result.stderr
    assert "one.wav" in result.stderr and "100%" in result.stderr  # the progress bar
    one = json.loads((out / "one.json").read_text())
    assert_heard(one["text"], SHORT_SENTENCES)
    assert one["segments"] and all(s["end"] - s["start"] <= 6.01 for s in one["segments"])
    assert_heard(json.loads((out / "two.json").read_text())["text"], ["Coffee tastes better in the morning."])
    assert not (out / "broken.json").exists()

    text = subprocess.run([sys.executable, "-m", "server.cli", "transcribe", str(tmp_path / "two.wav"), "-q"],
                          capture_output=True, text=True, timeout=120)
    assert text.returncode == 0 and text.stderr == ""
    assert_heard(text.stdout, ["Coffee tastes better in the morning."])


@pytest.mark.parametrize(
    ("overrides", "key"),
    [({"transcription": {"max_chunk_s": 60}}, "transcription.max_chunk_s"),
     ({"transcription": {"workers": 0}}, "transcription.workers"),
     ({"speech": {"max_input_chars": 0}}, "speech.max_input_chars")],
)
def test_a_wrong_audio_setting_names_its_key(overrides: dict, key: str):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_settings(None, overrides)


async def rate_limited(http: aiohttp.ClientSession, base: str) -> float:
    """Requests the API's rate limit refused so far (this process's servers, the shared token)."""
    async with http.get(f"{base}/metrics") as response:
        match = re.search(r'^vigil_api_rate_limited_total\{key="token"\} (\S+)$', await response.text(), re.M)
    return float(match.group(1)) if match else 0.0


async def run_cli(*args: str) -> tuple[int, str, str]:
    """``vigil ARGS`` as a child process, awaited without blocking the in-process server's event loop."""
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "server.cli", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    stdout, stderr = await asyncio.wait_for(child.communicate(), timeout=180)
    assert child.returncode is not None
    return child.returncode, stdout.decode(), stderr.decode()


async def test_vigil_transcribe_url_submits_jobs_and_follows_their_progress(vigil, http, tmp_path: Path,
                                                                            long_wav: bytes, short_wav: bytes):
    # A tight rate limit (status reads count too): the command waits out each 429's Retry-After and goes on.
    server = await vigil(auth={"token": TOKEN}, api={"rate_limit": {"requests": 8, "window_s": 1.0}},
                         transcription={"data_dir": str(tmp_path / "jobs"), "batch_size": 4})
    (tmp_path / "long.wav").write_bytes(long_wav)
    (tmp_path / "short.wav").write_bytes(short_wav)
    (tmp_path / "broken.wav").write_bytes(b"RIFF nonsense")
    out = tmp_path / "out"
    refused_before = await rate_limited(http, server.url)
    status, stdout, stderr = await run_cli(
        "transcribe", "--url", server.url, "--api-key", TOKEN, "--poll-interval", "0.1", "-f", "srt", "-o", str(out),
        str(tmp_path / "long.wav"), str(tmp_path / "broken.wav"), str(tmp_path / "short.wav"))
    assert status == 1, stderr  # the broken file is refused with the server's 400 message; the others are done
    assert "broken.wav: 400 the uploaded file is not usable audio" in stderr
    # the bar follows the job's status: it reaches the whole duration and shows the job's states
    assert "long.wav" in stderr and "100%" in stderr and "completed" in stderr
    assert f"{len(long_wav) / 32_000:.1f}/{len(long_wav) / 32_000:.1f} s" in stderr
    assert_heard(re.sub(r"^\d+$|^.* --> .*$", "", (out / "long.srt").read_text(), flags=re.M), LONG_SENTENCES)
    assert_heard(re.sub(r"^\d+$|^.* --> .*$", "", (out / "short.srt").read_text(), flags=re.M), SHORT_SENTENCES)
    assert not (out / "broken.srt").exists()
    assert await rate_limited(http, server.url) > refused_before  # it did run into the limit, and went on
    await asyncio.sleep(1.1)  # a fresh window for the test's own request
    async with http.get(f"{server.url}/v1/audio/transcriptions/jobs", params={"status": "completed"}) as response:
        assert sorted(j["filename"] for j in (await response.json())["data"]) == ["long.wav", "short.wav"]

    # to stdout, as json; a wrong key stops at once with the server's message (exit 2)
    status, stdout, stderr = await run_cli("transcribe", "--url", server.url, "--api-key", TOKEN, "-q", "-f", "json",
                                           str(tmp_path / "short.wav"))
    assert status == 0 and stderr == ""
    assert_heard(json.loads(stdout)["text"], SHORT_SENTENCES)
    status, stdout, stderr = await run_cli("transcribe", "--url", server.url, "--api-key", "wrong",
                                           str(tmp_path / "short.wav"), str(tmp_path / "long.wav"))
    assert status == 2 and stderr.startswith("vigil transcribe: 401 ") and stdout == ""
