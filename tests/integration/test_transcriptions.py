"""OpenAI-compatible audio endpoints, driven by the official ``openai`` SDK against a real server with the real
models: Piper-synthesised speech transcribed by Whisper in every response format, speech synthesis in every
format (and heard back by Whisper), auth, and a clear 4xx for every kind of bad input."""

from __future__ import annotations

import asyncio
import io
import json
import math
import os
import re
import shutil
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import av
import numpy as np
import openai
import pytest

from models.stt.batch import BatchedWhisper, FileSegment, TimedWord, group_into_cues
from pipelines.batch.engine import EngineBusy, TranscriptionEngine
from pipelines.batch.formats import Transcript, as_text
from tests.support.speech_files import spoken, wav_bytes, words

TOKEN = "audio-test-key"
SENTENCES = ["The quick brown fox jumps over the lazy dog.", "Please call Stella and ask her to bring it."]
CUE = re.compile(r"(\d\d):(\d\d):(\d\d)[,.](\d\d\d) --> (\d\d):(\d\d):(\d\d)[,.](\d\d\d)")


@pytest.fixture(scope="module")
def speech_wav() -> bytes:
    return wav_bytes(spoken(SENTENCES))


@pytest.fixture
async def server(vigil, tmp_path: Path):
    return await vigil(auth={"token": TOKEN}, transcription={"data_dir": str(tmp_path / "jobs")})


@pytest.fixture
async def clients() -> AsyncIterator[Callable[..., openai.AsyncOpenAI]]:
    """``clients(server, key=TOKEN)`` -> an SDK client for that server; all are closed afterwards."""
    made: list[openai.AsyncOpenAI] = []

    def make(server: Any, key: str = TOKEN) -> openai.AsyncOpenAI:
        made.append(openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0))
        return made[-1]

    yield make
    for made_client in made:
        await made_client.close()


def seconds(match: re.Match[str], first: int) -> float:
    h, m, s, ms = (int(match.group(first + i)) for i in range(4))
    return h * 3600 + m * 60 + s + ms / 1000


def assert_heard(text: str, sentences: list[str] = SENTENCES, min_ratio: float = 0.8) -> None:
    heard = words(text)
    expected = [w for sentence in sentences for w in words(sentence)]
    matched = sum(1 for w in expected if w in heard)
    assert matched >= min_ratio * len(expected), (text, sentences)
    assert len(heard) <= len(expected) + 3, text  # nothing heard twice


def assert_openai_error(error: openai.APIStatusError, status: int, param: str | None = None) -> dict[str, Any]:
    assert error.status_code == status
    body = error.body
    assert isinstance(body, dict) and set(body) == {"message", "type", "param", "code"}, body
    assert body["message"]
    if param is not None:
        assert body["param"] == param
    return body


# --- transcriptions: every response format ---------------------------------------------------------------------


@pytest.mark.parametrize("response_format", ["json", "text", "verbose_json", "srt", "vtt"])
async def test_transcription_in_every_response_format(clients, server, speech_wav: bytes, response_format: str):
    result = await clients(server).audio.transcriptions.create(
        model="whisper-1", file=("speech.wav", speech_wav), response_format=response_format)
    duration = len(speech_wav) / 2 / 16_000
    if response_format == "json":
        assert_heard(result.text)
        assert result.usage.seconds >= 1
    elif response_format == "text":
        assert isinstance(result, str)
        assert_heard(result)
    elif response_format == "verbose_json":
        assert result.language == "english"
        assert result.duration == pytest.approx(duration, abs=0.05)
        assert_heard(result.text)
        assert result.segments and " ".join(s.text for s in result.segments) == result.text
        starts = [s.start for s in result.segments]
        assert starts == sorted(starts) and all(0 <= s.start <= s.end <= duration for s in result.segments)
        assert all(s.tokens for s in result.segments)
    else:
        assert isinstance(result, str)
        if response_format == "vtt":
            assert result.startswith("WEBVTT\n\n")
        else:
            assert result.startswith("1\n00:00:")
        cues = list(CUE.finditer(result))
        assert cues, result
        assert all(0 <= seconds(c, 1) <= seconds(c, 5) <= duration + 0.01 for c in cues)
        assert (", " in cues[0].group(0)) is False and ("," in cues[0].group(0)) == (response_format == "srt")
        assert_heard(CUE.sub("", re.sub(r"^\d+$|WEBVTT", "", result, flags=re.M)))


async def test_transcription_of_a_compressed_file_and_a_prompt(clients, server):
    # Any format FFmpeg reads is accepted: here Ogg/Opus at 48 kHz stereo.
    pcm = spoken(SENTENCES[:1], rate=48_000)
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="ogg") as container:
        stream = container.add_stream("libopus", rate=48_000, layout="stereo")
        frame = av.AudioFrame.from_ndarray(np.stack([pcm, pcm], axis=1).reshape(1, -1), format="s16", layout="stereo")
        frame.sample_rate = 48_000
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            container.mux(packet)
    result = await clients(server).audio.transcriptions.create(
        model="tiny.en", file=("speech.ogg", buffer.getvalue()), language="en", prompt="A fox.", temperature=0)
    assert_heard(result.text, SENTENCES[:1])


async def test_silence_transcribes_to_nothing(clients, server):
    result = await clients(server).audio.transcriptions.create(
        model="whisper-1", file=("quiet.wav", wav_bytes(np.zeros(32_000, np.int16))), response_format="verbose_json")
    assert result.text == "" and result.segments == [] and result.duration == pytest.approx(2.0)


async def test_multilingual_model_detects_the_language(clients, vigil, tmp_path: Path, speech_wav: bytes):
    server = await vigil(transcription={"data_dir": str(tmp_path), "model_dir": "base"})  # packaged Whisper base
    api = clients(server, key="any")
    result = await api.audio.transcriptions.create(model="base", file=("a.wav", speech_wav),
                                                   response_format="verbose_json")
    assert result.language == "english"
    assert_heard(result.text)
    with pytest.raises(openai.BadRequestError) as error:
        await api.audio.transcriptions.create(model="base", file=("a.wav", speech_wav), language="xx")
    assert_openai_error(error.value, 400, "language")


# --- auth and bad input ---------------------------------------------------------------------------------------


async def test_transcription_needs_the_key(clients, server, speech_wav: bytes):
    with pytest.raises(openai.AuthenticationError) as wrong:
        await clients(server, key="wrong").audio.transcriptions.create(model="whisper-1", file=("a.wav", speech_wav))
    assert wrong.value.status_code == 401
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{server.url}/v1/audio/transcriptions", data={"model": "whisper-1"}) as response:
            assert response.status == 401
            assert (await response.json())["error"]["message"]
        async with http.post(f"{server.url}/v1/audio/speech", json={"model": "tts-1"}) as response:
            assert response.status == 401


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (os.urandom(4000), "not a readable audio file"),
        (b"hello, I am a text file, not a recording\n" * 50, "not a readable audio file|no audio stream"),
        (wav_bytes(np.zeros(0, np.int16)), "no audio samples"),
        (b"RIFF\x24\x00\x00\x00WAVEfmt ", "not a readable audio file"),
    ],
    ids=["random-bytes", "text", "empty-wav", "truncated-header"],
)
async def test_corrupt_or_non_audio_upload_is_a_400(clients, server, content: bytes, message: str):
    with pytest.raises(openai.BadRequestError) as error:
        await clients(server).audio.transcriptions.create(model="whisper-1", file=("upload.wav", content))
    body = assert_openai_error(error.value, 400, "file")
    assert re.search(message, body["message"]) and body["code"] == "invalid_audio"


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"model": "whisper-9"}, "model"),
        ({"language": "de"}, "language"),  # tiny.en is English-only
        ({"response_format": "docx"}, "response_format"),
        ({"temperature": 3}, "temperature"),
        ({"timestamp_granularities": ["phoneme"], "response_format": "verbose_json"}, "timestamp_granularities"),
        ({"extra_body": {"speaker": "x"}}, "speaker"),
    ],
)
async def test_invalid_transcription_parameters_are_400(clients, server, speech_wav: bytes, kwargs: dict, param: str):
    arguments = {"model": "whisper-1", "file": ("a.wav", speech_wav), **kwargs}
    with pytest.raises(openai.BadRequestError) as error:
        await clients(server).audio.transcriptions.create(**arguments)
    assert_openai_error(error.value, 400, param)


async def test_missing_parts_and_limits(clients, vigil, tmp_path: Path, speech_wav: bytes):
    server = await vigil(transcription={"data_dir": str(tmp_path), "max_upload_bytes": 50_000,
                                        "max_request_audio_s": 3.0})
    url = f"{server.url}/v1/audio/transcriptions"
    async with aiohttp.ClientSession() as http:
        async with http.post(url, json={"model": "whisper-1"}) as response:
            assert response.status == 400 and "multipart/form-data" in (await response.json())["error"]["message"]
        async with http.post(url, data={"model": "whisper-1"}) as response:  # urlencoded, no file
            assert response.status == 400
        form = aiohttp.FormData(default_to_multipart=True)
        form.add_field("model", "whisper-1")
        async with http.post(url, data=form) as response:
            assert response.status == 400 and (await response.json())["error"]["param"] == "file"
        form = aiohttp.FormData()
        form.add_field("file", speech_wav[:20_000], filename="a.wav")
        async with http.post(url, data=form) as response:
            assert response.status == 400 and (await response.json())["error"]["param"] == "model"
        form = aiohttp.FormData()
        form.add_field("file", speech_wav[:20_000], filename="a.wav")
        form.add_field("model", "whisper-1")
        form.add_field("prompt", "word " * 8_000)  # 40 kB + 30 kB: each field fits, together they do not
        form.add_field("language", "e" * 30_000)
        async with http.post(url, data=form) as response:
            assert response.status == 400 and "form fields" in (await response.json())["error"]["message"]
    with pytest.raises(openai.APIStatusError) as too_big:  # ~160 kB > 50 kB
        await clients(server, key="any").audio.transcriptions.create(model="whisper-1", file=("a.wav", speech_wav))
    assert_openai_error(too_big.value, 413, "file")
    four_seconds_at_4k = wav_bytes(np.zeros(4 * 4_000, np.int16), rate=4_000)  # 32 kB: within the upload limit
    with pytest.raises(openai.BadRequestError) as too_long:
        await clients(server, key="any").audio.transcriptions.create(
            model="whisper-1", file=("a.wav", four_seconds_at_4k))
    body = assert_openai_error(too_long.value, 400, "file")
    assert "/v1/audio/transcriptions/jobs" in body["message"]


async def test_direct_requests_are_bounded(tmp_path: Path):
    # Beyond max_pending_requests, a request is refused at once (503 in the API), never queued without bound.
    model = BatchedWhisper()
    engine = TranscriptionEngine(lambda: model, max_pending_requests=1)
    path = tmp_path / "long.wav"
    path.write_bytes(wav_bytes(spoken(SENTENCES * 3)))
    await engine.model()
    first = asyncio.create_task(engine.transcribe_file(path, language="en", prompt=None, temperature=0,
                                                       max_seconds=60))
    await asyncio.sleep(0)  # the first request runs up to its wait for the worker thread
    assert engine.pending_requests == 1
    with pytest.raises(EngineBusy):
        await engine.transcribe_file(path, language="en", prompt=None, temperature=0, max_seconds=60)
    assert_heard((await first).text, SENTENCES * 3)
    engine.close()


async def test_batch_threads_run_at_lower_priority():
    # Live voice turns (normal priority) get the CPU first when a long job is decoding.
    engine = TranscriptionEngine(BatchedWhisper, nice=7)
    base = os.getpriority(os.PRIO_PROCESS, 0)

    def thread_nice() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    assert await engine.job_step(thread_nice) == min(19, base + 7)
    engine.close()


# --- speech ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("response_format", ["mp3", "opus", "aac", "flac", "wav", "pcm"])
async def test_speech_in_every_format(clients, server, response_format: str):
    response = await clients(server).audio.speech.create(
        model="tts-1", voice="alloy", input="Hello there. How are you today?", response_format=response_format)
    data = response.content
    if response_format == "pcm":
        seconds_spoken = len(data) / 2 / 24_000
        assert response.response.headers["content-type"] == "audio/pcm"
    else:
        with av.open(io.BytesIO(data)) as container:
            stream = container.streams.audio[0]
            seconds_spoken = sum(frame.samples for frame in container.decode(stream)) / stream.rate
    assert 1.0 < seconds_spoken < 4.0


async def test_speech_is_heard_back_and_speed_changes_its_length(clients, server):
    api = clients(server)
    normal = await api.audio.speech.create(model="tts-1", voice="nova", input=SENTENCES[0], response_format="wav")
    faster = await api.audio.speech.create(model="tts-1", voice="nova", input=SENTENCES[0], response_format="wav",
                                           speed=2.0)
    assert len(faster.content) == pytest.approx(len(normal.content) / 2, rel=0.1)
    heard = await api.audio.transcriptions.create(model="whisper-1", file=("reply.wav", normal.content))
    assert_heard(heard.text, SENTENCES[:1])


async def test_speech_with_the_espeak_backend(clients, vigil, tmp_path: Path):
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (apt-get install espeak-ng)")
    server = await vigil(models={"tts": {"backend": "espeak"}}, transcription={"data_dir": str(tmp_path)})
    api = clients(server, key="any")
    spoken_reply = await api.audio.speech.create(model="espeak-ng:en-us", voice="espeak-ng:en-us",
                                                 input=SENTENCES[0], response_format="flac")
    heard = await api.audio.transcriptions.create(model="whisper-1", file=("reply.flac", spoken_reply.content))
    assert_heard(heard.text, SENTENCES[:1], min_ratio=0.6)  # robotic voice, tiny model: most words


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"voice": "robot"}, "voice"),
        ({"voice": {"id": "voice_1234"}}, "voice"),
        ({"model": "tts-9"}, "model"),
        ({"input": ""}, "input"),
        ({"input": "   "}, "input"),
        ({"input": "a" * 5000}, "input"),
        ({"speed": 10}, "speed"),
        ({"response_format": "ogg"}, "response_format"),
        ({"stream_format": "sse"}, "stream_format"),
        ({"extra_body": {"pitch": 2}}, "pitch"),
    ],
)
async def test_invalid_speech_requests_are_400(clients, server, kwargs: dict, param: str):
    arguments = {"model": "tts-1", "voice": "alloy", "input": "Hello.", **kwargs}
    with pytest.raises(openai.BadRequestError) as error:
        await clients(server).audio.speech.create(**arguments)
    assert_openai_error(error.value, 400, param)


async def test_speech_body_must_be_json(server):
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with aiohttp.ClientSession(headers=headers) as http:
        async with http.post(f"{server.url}/v1/audio/speech", data=b"{not json",
                             headers={"Content-Type": "application/json"}) as response:
            assert response.status == 400
            assert json.loads(await response.text())["error"]["type"] == "invalid_request_error"


# --- subtitles: short cues, every word once -------------------------------------------------------------------

SUBTITLE_SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Please call Stella and ask her to bring these things with her from the store, six spoons of fresh snow peas,"
    " five thick slabs of blue cheese, and maybe a snack for her brother Bob.",
    "We also need a small plastic snake and a big toy frog for the kids.",
]


@pytest.fixture(scope="module")
def subtitle_wav() -> bytes:
    return wav_bytes(spoken(SUBTITLE_SENTENCES, pause_s=0.8))


def parse_cues(body: str, response_format: str) -> list[tuple[float, float, str]]:
    """(start, end, text) of each cue, checking the block structure of SRT / WebVTT on the way."""
    blocks = body.split("\n\n")
    assert blocks[-1] == "", body  # every cue ends with a blank line
    blocks = blocks[:-1]
    if response_format == "vtt":
        assert blocks[0] == "WEBVTT"
        blocks = blocks[1:]
    cues = []
    for number, block in enumerate(blocks, start=1):
        lines = block.split("\n")
        if response_format == "srt":
            assert lines[0] == str(number), block
            lines = lines[1:]
        timing = CUE.fullmatch(lines[0])
        assert timing, block
        assert len(lines) == 2 and lines[1].strip(), block
        cues.append((seconds(timing, 1), seconds(timing, 5), lines[1]))
    return cues


@pytest.mark.parametrize("response_format", ["srt", "vtt"])
async def test_subtitle_cues_are_short_ordered_and_hold_every_word_once(
        clients, server, subtitle_wav: bytes, response_format: str):
    body = await clients(server).audio.transcriptions.create(
        model="whisper-1", file=("speech.wav", subtitle_wav), response_format=response_format)
    cues = parse_cues(body, response_format)
    spoken_words = [w for sentence in SUBTITLE_SENTENCES for w in words(sentence)]
    assert len(cues) > len(SUBTITLE_SENTENCES), body  # the long middle sentence is cut too
    for (start, end, _), (next_start, _, _) in zip(cues, [*cues[1:], (math.inf, 0, "")], strict=True):
        assert 0 <= start < end <= next_start, body  # ordered, no overlap
        assert end - start <= 6.0 + 0.01, body  # transcription.max_cue_s
    # Every spoken word, in order, exactly once (Piper speaks deterministically and Whisper hears it all).
    assert [w for _, _, text in cues for w in words(text)] == spoken_words, body


async def test_word_timestamps_in_verbose_json(clients, server, subtitle_wav: bytes):
    result = await clients(server).audio.transcriptions.create(
        model="whisper-1", file=("speech.wav", subtitle_wav), response_format="verbose_json",
        timestamp_granularities=["word", "segment"])
    assert [w for s in result.segments for w in words(s.text)] == words(result.text)
    assert words(" ".join(w.word for w in result.words)) == words(result.text)
    times = [t for w in result.words for t in (w.start, w.end)]
    assert times == sorted(times) and times[-1] <= result.duration
    for segment in result.segments:
        assert segment.end - segment.start <= 6.0 + 0.01 and segment.tokens
        inside = [w for w in result.words if segment.start <= w.start and w.end <= segment.end]
        assert words(" ".join(w.word for w in inside)) == words(segment.text)
    with pytest.raises(openai.BadRequestError) as raised:  # OpenAI: granularities need verbose_json
        await clients(server).audio.transcriptions.create(
            model="whisper-1", file=("speech.wav", subtitle_wav), response_format="json",
            timestamp_granularities=["word"])
    assert_openai_error(raised.value, 400, "timestamp_granularities")


def test_srt_and_vtt_follow_their_specs_for_awkward_cues():
    # Pure formatting, no model: a zero-length one-word cue, cue text with a line break, '-->', and markup.
    def segment(start: float, end: float, text: str) -> FileSegment:
        return FileSegment(start=start, end=end, text=text, tokens=(1,), avg_logprob=0.0, no_speech_prob=0.0,
                           compression_ratio=1.0, temperature=0.0)

    transcript = Transcript(language="en", duration=9.0, segments=(
        segment(0.5, 0.5, "Yes."), segment(1.0, 2.5, "Tom & Jerry <b>-->\n\nbold"), segment(2.4, 3.0, " "),
        segment(3601.0, 3602.25, "An hour later."),
    ))
    assert as_text(transcript, "srt") == (
        "1\n00:00:00,500 --> 00:00:00,501\nYes.\n\n"
        "2\n00:00:01,000 --> 00:00:02,500\nTom & Jerry <b>-> bold\n\n"
        "3\n01:00:01,000 --> 01:00:02,250\nAn hour later.\n\n")
    assert as_text(transcript, "vtt") == (
        "WEBVTT\n\n"
        "00:00:00.500 --> 00:00:00.501\nYes.\n\n"
        "00:00:01.000 --> 00:00:02.500\nTom &amp; Jerry &lt;b&gt;-&gt; bold\n\n"
        "01:00:01.000 --> 01:00:02.250\nAn hour later.\n\n")


def test_words_are_grouped_into_cues_at_pauses_sentence_ends_and_the_length_limit():
    def said(*timed: tuple[float, float, str]) -> list[TimedWord]:
        return [TimedWord(start, end, f" {word}") for start, end, word in timed]

    def texts(cues: list[list[TimedWord]]) -> list[str]:
        return ["".join(w.word for w in cue).strip() for cue in cues]

    # a sentence end, then a pause of 0.5 s, end a cue; a short pause does not
    assert texts(group_into_cues(said((0, .3, "Hi."), (.4, .6, "Come"), (.7, 1, "here"), (1.5, 2, "now")))) == [
        "Hi.", "Come here", "now"]
    # one long run of words without pauses: cut before the word that would pass max_cue_s, after a comma once
    # the cue is half that long
    run = said(*((i * 0.4, i * 0.4 + 0.35, f"w{i}," if i == 9 else f"w{i}") for i in range(30)))
    cues = group_into_cues(run, max_cue_s=6.0)
    assert [w for cue in cues for w in cue] == run  # every word once, in order
    assert all(cue[-1].end - cue[0].start <= 6.0 for cue in cues)
    assert texts(cues)[0] == " ".join(f"w{i}" for i in range(9)) + " w9,"  # 3.95 s >= 3 s: the comma ends it
    assert group_into_cues([]) == []
    long_word = said((0, 8, "Mmmmmmmm"))  # longer than the limit on its own: still one cue
    assert group_into_cues(long_word, max_cue_s=6.0) == [long_word]
