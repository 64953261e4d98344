"""The voice loop over real WebRTC with the real embedded models: Silero VAD, Whisper tiny.en, SmolLM2, Piper."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiortc.contrib.media import MediaPlayer

from models.llm import ChatMessage
from models.stt.whisper import WhisperStt
from pipelines.voice.audio import OUT_RATE
from server.cli.client import VigilClient
from tests.support.audio import Recorder, ScriptedMicrophone, rms, silence, speech
from tests.support.llm_server import LlmServer
from tests.support.media import slideshow

QUESTION = "How many people do you see?"
# The scripted microphone sends digital silence between utterances: keep audio_silent out of the way of turns
# that run long on a loaded machine; the silent-track test sets its own short limit.
VOICE = {"enabled": True, "end_of_turn_silence_ms": 500, "silent_track_s": 600}


NUMBERS = dict(enumerate("zero one two three four five six seven eight nine ten".split()))


def _words(text: str) -> set[str]:
    """Lower-case words, digits spelled out (the recogniser writes 'one' where the LLM wrote '1')."""
    text = re.sub(r"\b(\d+)\b", lambda m: NUMBERS.get(int(m.group(1)), m.group(1)), text.lower())
    return set(re.findall(r"[a-z']+", text))


class VoiceCall:
    """A real aiortc client with a scripted microphone, recording the reply audio it receives."""

    def __init__(self, url: str, video: Any = None) -> None:
        self.mic = ScriptedMicrophone()
        self.client = VigilClient(url)
        self.recorder: Recorder | None = None
        self.video = video

        @self.client.pc.on("track")
        def on_track(track: Any) -> None:
            if track.kind == "audio":
                self.recorder = Recorder(track)

    async def __aenter__(self) -> VoiceCall:
        await self.client.connect([self.mic, *([self.video] if self.video else [])])
        await self.client.next_message("hello")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.recorder is not None:
            await self.recorder.stop()
        await self.client.close()

    async def turn(self, number: int, timeout: float = 60.0, *, heard: bool = True) -> dict[str, Any]:
        """Messages of one turn up to its metrics: final transcript, reply text (and whether it was cut),
        metrics; ``timeout`` bounds the whole turn, however many other messages arrive meanwhile. Not ``heard``:
        up to the reply's text only (metrics None), for a test's last turn, whose playing out (its metrics come
        once the reply has been heard in full) would only cost the test seconds of real time."""
        async with asyncio.timeout(timeout):
            final = await self.client.next_message("transcript", timeout,
                                                   where=lambda m: m["final"] and m["turn"] == number)
            reply = ""
            while True:
                message = await self.client.next_message(timeout=timeout)
                if message["type"] == "reply" and message["turn"] == number:
                    if message.get("done"):
                        interrupted = message.get("interrupted", False)
                        break
                    reply += message["delta"]
                elif message["type"] == "error":
                    raise AssertionError(f"error during turn {number}: {message}")
            if not heard:
                return {"final": final, "reply": reply, "interrupted": interrupted, "metrics": None}
            metrics = await self.client.next_message("metrics", timeout, where=lambda m: "turn" in m)
        return {"final": final, "reply": reply, "interrupted": interrupted, "metrics": metrics["turn"]}


def _session_loop(server: Any) -> Any:
    (session,) = server.sessions.sessions.values()
    return session.pipeline._audio_analyzer


def _system_text(server: Any) -> str:
    """What the last prompt told the model besides the conversation: the system prompt and the turn's own system
    message before the question (the scene, recalled entries: replies.turn_messages)."""
    return "\n\n".join(m.content for m in _session_loop(server).last_request.messages if m.role == "system")


async def test_spoken_question_gets_a_spoken_answer(vigil):
    server = await vigil(voice=VOICE)
    async with VoiceCall(server.url) as call:
        call.mic.say(silence(0.3))
        call.mic.say(speech(QUESTION))
        turn = await call.turn(1)
        assert {"how", "many", "people"} <= _words(turn["final"]["text"]), turn["final"]
        assert turn["reply"].strip(), "the LLM answered nothing"
        metrics = turn["metrics"]
        assert metrics["turn"] == 1 and metrics["speech_ms"] > 1000
        for stage in ("end_of_speech_to_final_ms", "llm_first_token_ms", "first_audio_ms", "voice_to_voice_ms"):
            assert metrics[stage] > 0, metrics
        assert metrics["voice_to_voice_ms"] >= metrics["first_audio_ms"] >= metrics["end_of_speech_to_final_ms"]
        assert call.recorder is not None
        async with asyncio.timeout(30):  # until the reply has finished playing
            while (last := call.recorder.last_loud()) is None or time.perf_counter() - last < 1.0:  # noqa: ASYNC110
                await asyncio.sleep(0.1)
        reply_audio = call.recorder.audio()
        loud = [s for _, s in call.recorder.frames if rms(s) > 300]
        assert len(loud) > 25, "less than half a second of audible reply audio arrived"
        # The reply audio, heard back through the same speech recogniser, says (some of) the reply's words.
        heard = WhisperStt().transcribe(_to_16k(reply_audio)).text
        overlap = _words(heard) & _words(turn["reply"])
        assert len(overlap) >= min(3, len(_words(turn["reply"]))), (heard, turn["reply"])


def _to_16k(pcm48: np.ndarray) -> np.ndarray:
    from pipelines.voice.audio import resample_pcm

    return resample_pcm(pcm48, OUT_RATE, 16000).astype(np.float32) / 32768.0


async def test_partial_transcripts_arrive_while_speaking_and_the_llm_reads_them_ahead(vigil):
    server = await vigil(voice={**VOICE, "partial_interval_ms": 250})
    # Synthesised before the call: Piper on the client's event loop would hold back the microphone's frames,
    # which then arrive in a burst, faster than anyone speaks (and too fast for partials).
    long_question = speech("Please tell me what you can see on the camera right now and how many people are there.")
    async with VoiceCall(server.url) as call:
        call.mic.say(long_question)
        partial = await call.client.next_message("transcript", 30, where=lambda m: not m["final"])
        final = await call.client.next_message("transcript", 30, where=lambda m: m["final"])
        assert partial["turn"] == final["turn"] == 1
        assert partial["text"], partial
        shared = _words(partial["text"]) & _words(final["text"])
        assert len(shared) >= 0.7 * len(_words(partial["text"])), (partial["text"], final["text"])
        assert final["text"].lower().split()[0] == partial["text"].lower().split()[0]
        # The embedded LLM read the question so far while it was spoken (its KV cache then holds it).
        number, read_ahead = _session_loop(server)._speculator.warmed
        assert number == 1 and read_ahead, "no prompt was read ahead"
        assert len(_words(read_ahead) & _words(final["text"])) >= 0.7 * len(_words(read_ahead)), read_ahead


async def test_barge_in_stops_reply_audio_and_cancels_the_llm(vigil):
    server = await vigil(voice={**VOICE, "max_reply_tokens": 200})
    async with VoiceCall(server.url) as call:
        call.mic.say(speech("Tell me a long story about a brave knight and a dragon."))
        await call.client.next_message("transcript", 60, where=lambda m: m["final"])
        assert call.recorder is not None
        async with asyncio.timeout(60):
            while call.recorder.first_loud() is None:  # noqa: ASYNC110 - wait until the reply is audible
                await asyncio.sleep(0.05)
        loop = _session_loop(server)
        reply_task = loop._reply_task
        call.mic.say(speech("Stop. What time is it?"))
        barge = await call.client.next_message("event", 30, where=lambda m: m["name"] == "barge_in")
        barged_at = time.perf_counter()
        assert barge["data"]["turn"] == 1
        cut: dict[str, Any] | None = None
        metrics: dict[str, Any] | None = None
        while cut is None or metrics is None:  # either may come first
            message = await call.client.next_message(timeout=30)
            if message["type"] == "reply" and message["turn"] == 1 and message.get("done"):
                cut = message
            elif message["type"] == "metrics" and message.get("turn", {}).get("turn") == 1:
                metrics = message
        assert cut.get("interrupted") is True, cut  # the client learns turn 1's reply is over, and why
        assert metrics["turn"]["barge_in_stop_ms"] is not None
        assert reply_task is not None and reply_task.cancelled(), "the LLM stream of turn 1 was not cancelled"
        second_final = await call.client.next_message("transcript", 60, where=lambda m: m["final"] and m["turn"] == 2)
        second_final_at = time.perf_counter()  # turn 2's reply cannot start playing before its final transcript
        assert "time" in _words(second_final["text"])
        # Turn 1's audio stopped: nothing audible between the barge-in and turn 2's reply.
        loud_after = [t for t, samples in call.recorder.frames
                      if barged_at + 0.3 < t < second_final_at and rms(samples) > 300]
        assert loud_after == [], f"{len(loud_after)} loud frames after the barge-in"


async def test_prompt_carries_the_live_scene(vigil, tmp_path: Path):
    video = slideshow(tmp_path / "people.mp4", [("zidane", 20.0)], fps=5)
    server = await vigil(voice=VOICE, video={"target_fps": 2}, models={"detector": {"backend": "yolo"}})
    player = MediaPlayer(str(video))
    async with VoiceCall(server.url, video=player.video) as call:
        await call.client.next_message("detections", 30, where=lambda m: len(m["objects"]) == 2)
        call.mic.say(speech(QUESTION))
        await call.turn(1, heard=False)
        question = _session_loop(server).last_request.messages[-1]
        # the scene stands in the question itself (replies.turn_messages), the question on its last line
        assert question.role == "user" and "The camera sees 2 people." in question.content, question
        assert question.content.splitlines()[-1].lower().startswith("how many people")
    player.video.stop()


async def test_a_yes_or_no_question_of_an_empty_view_is_answered_no(vigil, tmp_path: Path):
    """The default 0.5B answered "Yes, I can see someone!" of an empty room with "0 people" in its prompt: the
    detector's counts give the reply's first word (pipelines.voice.grounding) and the LLM goes on from it."""
    video = slideshow(tmp_path / "no-one.mp4", [("coffee", 20.0)], fps=5)
    server = await vigil(voice=VOICE, video={"target_fps": 2}, models={"detector": {"backend": "yolo"}})
    player = MediaPlayer(str(video))
    async with VoiceCall(server.url, video=player.video) as call:
        await call.client.next_message("detections", 30, where=lambda m: m["objects"] == [])
        # "Do you see anyone?" reached tiny.en through Opus as "Do you see it anyone?" in about half the runs (no
        # lead: a word off the list); this one was heard right in every run.
        call.mic.say(speech("Can you see anyone?"))
        turn = await call.turn(1, heard=False)
        reply, request = turn["reply"], _session_loop(server).last_request
        assert reply.startswith("No, ") and len(reply) > len("No, ") and "yes" not in _words(reply), (
            reply, turn["final"]["text"])
        assert request.messages[-1] == ChatMessage("assistant", "No,"), (turn["final"]["text"], request.messages)
    player.video.stop()


async def test_http_llm_backend_and_a_backend_that_is_down(vigil):
    with LlmServer() as upstream:
        server = await vigil(voice=VOICE, models={"llm": {"backend": "openai", "base_url": upstream.url}})
        async with VoiceCall(server.url) as call:
            call.mic.say(speech(QUESTION))
            turn = await call.turn(1)
            assert turn["reply"].strip()
            upstream.stop()
            call.mic.say(speech("What color is the sky?"))
            error = await call.client.next_message("error", 60)
            assert error["code"] == "llm_unavailable" and upstream.url.split("//")[1] in error["message"]
            call.client.send({"v": 1, "type": "ping", "id": "alive"})
            assert (await call.client.next_message("pong", 10))["id"] == "alive"


async def test_silent_track_and_overlong_turn_get_clear_errors(vigil):
    server = await vigil(voice={**VOICE, "max_turn_s": 3.0, "silent_track_s": 3})
    async with VoiceCall(server.url) as call:
        silent = await call.client.next_message("error", 20)
        assert silent["code"] == "audio_silent"
        monologue = " ".join(["I keep talking about the weather and the trains and the people in town."] * 3)
        call.mic.say(speech(monologue))
        error = await call.client.next_message("error", 30, where=lambda m: m["code"] == "turn_too_long")
        assert "max_turn_s" in error["message"]
        final = await call.client.next_message("transcript", 30, where=lambda m: m["final"])
        assert final["turn"] == 1 and final["text"]
        call.client.send({"v": 1, "type": "ping", "id": 1})
        assert (await call.client.next_message("pong", 10))["id"] == 1


@pytest.mark.parametrize("gating", ["on", "off"])
async def test_echo_gating_ignores_our_own_reply_coming_back(vigil, gating: str):
    """The client's microphone hears the reply it receives (no echo cancelling), as a camera with a speaker
    would. With gating on, the echo never starts a turn; with it off, it does (so the test can fail)."""
    server = await vigil(voice={**VOICE, "echo_gating": gating, "barge_in": False})
    async with VoiceCall(server.url) as call:
        assert call.recorder is not None
        transcripts: list[dict[str, Any]] = []  # every one, also those turn() skips on its way

        def keep(message: dict[str, Any], _arrived: float) -> None:
            if message.get("type") == "transcript":
                transcripts.append(message)
            call.client.messages.put_nowait(message)

        call.client.on_message = keep
        call.mic.say(speech(QUESTION))
        await asyncio.wait_for(call.mic.spoken.wait(), 30)
        recorder = call.recorder
        recorder.on_frame = lambda samples: call.mic.say(samples[-960:])  # the loudspeaker feeds the microphone
        await call.turn(1)  # on a slow machine the echo's turn 2 may cut this reply (it ends interrupted)
        await asyncio.sleep(6.0)  # the echo of the whole reply has come back by now
        second_turn = [m for m in transcripts if m["turn"] >= 2]
        if gating == "on":
            assert second_turn == [], second_turn
        else:
            assert second_turn, "without gating the echo should have been heard"


async def test_an_audio_only_session_hears_no_camera_text(vigil):
    """No video track: the prompt says nothing of a camera (a small model repeats what its prompt says), even when
    the question is about what it sees, and the answer does not speak of one."""
    server = await vigil(voice=VOICE)
    async with VoiceCall(server.url) as call:
        call.mic.say(speech("Which planet is closest to the sun?"))
        turn = await call.turn(1)
        system = _system_text(server)
        assert "camera" not in system.lower() and "see" not in _words(system), system
        assert "camera" not in turn["reply"].lower(), turn["reply"]
        call.mic.say(speech(QUESTION))
        await call.turn(2, heard=False)
        system = _system_text(server)
        assert "camera" not in system.lower(), system


async def test_a_looping_reply_is_stopped_at_its_first_repeated_sentence(vigil):
    """SmolLM2 at temperature 0 without a repetition penalty loops on this one (it said "I'm glad you're here."
    over and over); the loop guard lets each sentence through once and stops generating at the first repeat (the
    penalty is off here so that the guard is what is tested)."""
    server = await vigil(voice={**VOICE, "repeat_penalty": 1.0}, models={"llm": {"weights": "smollm2-135m"}})
    async with VoiceCall(server.url) as call:
        call.mic.say(speech("Repeat after me: I like tea. I like tea. I like tea."))
        turn = await call.turn(1)
        loop = _session_loop(server)
        assert loop.last_reply_stop == "repeat", (turn["final"]["text"], turn["reply"])
        sentences = [s.strip().lower() for s in re.split(r"(?<=[.!?])\s+", turn["reply"]) if s.strip()]
        assert sentences and len(set(sentences)) == len(sentences), turn["reply"]  # what was heard, said once
        assert loop.last_request.messages[-1].content == turn["final"]["text"]
        assert not turn["interrupted"]


async def test_a_reminder_is_acknowledged_kept_and_recalled(vigil):
    server = await vigil(voice=VOICE)
    async with VoiceCall(server.url) as call:
        call.mic.say(speech("Please remind me to buy some milk after work."))
        asked = await call.turn(1)
        assert {"remind", "you", "buy", "milk"} <= _words(asked["reply"]), asked
        call.mic.say(speech("Which planet is closest to the sun?"))
        await call.turn(2)
        call.mic.say(speech("What did I ask you to remember?"))
        recalled = await call.turn(3, heard=False)
        assert {"buy", "milk", "work"} <= _words(recalled["reply"]), recalled
        assert _session_loop(server).recall.reminders == ["to buy some milk after work"]


async def test_a_spoken_sum_is_answered_exactly_and_its_follow_up_goes_on_from_it(vigil):
    """Qwen2.5 0.5B says 23 times 19 is 457 and, asked to multiply "it" by 4 after 156 divided by 12, multiplies
    156 (bench/arithmetic.py): a sum is the calculator's (pipelines.voice.arithmetic), without the LLM."""
    server = await vigil(voice=VOICE)
    async with VoiceCall(server.url) as call:
        call.mic.say(speech("What is seventeen times twenty three?"))
        first = await call.turn(1)
        assert first["reply"] == "17 times 23 is 391.", first
        call.mic.say(speech("Add two to that."))
        second = await call.turn(2, heard=False)
        assert second["reply"] == "391 plus 2 is 393.", second
        assert _session_loop(server).recall.last_sum == 393


async def test_a_reminder_is_recalled_from_memory_in_a_later_session(vigil, tmp_path: Path):
    """The request is stored in memory (the timeline records the transcript, memory indexes it): a new session,
    which has no reminders of its own, finds it when asked what it should remember."""
    from server.state import MEMORY, TIMELINE

    memory = {"enabled": True, "data_dir": str(tmp_path / "memory"), "voice": {"timeout_s": 60}}
    server = await vigil(voice=VOICE, memory=memory)
    async with VoiceCall(server.url) as call:
        call.mic.say(speech("Please remind me to buy some milk after work."))
        asked = await call.turn(1)
        assert "milk" in asked["reply"].lower(), asked
    assert await asyncio.to_thread(server.app[TIMELINE].flush, 60.0)
    await server.app[MEMORY].flush()
    async with VoiceCall(server.url) as call:
        call.mic.say(speech("What did I ask you to remember?"))
        recalled = await call.turn(1)
        assert recalled["metrics"]["memory_entries"] >= 1, recalled["metrics"]
        system = _system_text(server)
        assert "buy some milk" in system.lower(), system
