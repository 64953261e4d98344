"""The voice loop's parts that need no model: the typed turn metrics, turn taking's edges and echo gating, and
speculation's bookkeeping (pure logic: VAD probabilities given, replies that only wait)."""

from __future__ import annotations

import asyncio
import dataclasses
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from pipelines.protocol import TurnMetrics
from pipelines.voice.config import VoiceLoopConfig
from pipelines.voice.endpointing import FRAME_SAMPLES, TurnEnded, TurnStarted, TurnTaking
from pipelines.voice.metrics import TurnMetricsBuilder
from pipelines.voice.speculation import Speculation, Speculator
from pipelines.voice.turns import Turn


def test_the_builder_has_a_typed_field_for_every_turn_metric_and_no_other():
    builder = {f.name for f in dataclasses.fields(TurnMetricsBuilder)}
    assert builder == set(TurnMetrics.model_fields) - {"turn", "speech_ms"}
    for f in dataclasses.fields(TurnMetricsBuilder):  # the same defaults: an unset stage reads as before
        assert f.default == TurnMetrics.model_fields[f.name].default, f.name


def test_a_misspelt_metric_is_an_error_not_a_silent_key():
    metrics = TurnMetricsBuilder()
    with pytest.raises(AttributeError):
        metrics.llm_first_tokn_ms = 12.0  # type: ignore[attr-defined]


def test_built_metrics_carry_what_was_set():
    metrics = TurnMetricsBuilder()
    metrics.end_of_turn, metrics.end_of_turn_ms, metrics.final_decode = "model", 210.0, "early"
    metrics.memory_entries = 0  # a zero is a value, not an absent stage
    built = metrics.build(3, 1520.0)
    assert built.model_dump(exclude_none=True) == {
        "turn": 3, "speech_ms": 1520.0, "end_of_turn": "model", "end_of_turn_ms": 210.0, "final_decode": "early",
        "memory_entries": 0, "prefill": "none", "speculation": "none", "speculations_discarded": 0}


def test_a_played_speculation_stays_played_when_a_later_one_is_discarded():
    metrics = TurnMetricsBuilder()
    metrics.speculation_discarded()
    assert (metrics.speculation, metrics.speculations_discarded) == ("discarded", 1)
    metrics.speculation = "played"
    metrics.speculation_discarded()
    assert (metrics.speculation, metrics.speculations_discarded) == ("played", 2)


def _config(**overrides: object) -> VoiceLoopConfig:
    settings: dict[str, object] = {"system_prompt": "test", "echo_gating": False, "turn_detection": "silence",
                                   "end_of_turn_silence_ms": 320}
    return VoiceLoopConfig.model_validate(settings | overrides)


def _frame() -> np.ndarray:
    return np.zeros(FRAME_SAMPLES, np.float32)


def test_turn_taking_reports_the_edges_of_speech_and_what_ended_the_turn():
    with ThreadPoolExecutor(1) as executor:
        turns = TurnTaking(_config(), None, executor, reply_playing=lambda: False)
        events = [turns.push(_frame(), 0.9) for _ in range(10)]  # 320 ms of speech: the turn starts at 250
        assert sum(isinstance(e, TurnStarted) for e in events) == 1
        assert turns.speaking and not turns.went_quiet and not turns.resumed
        assert turns.push(_frame(), 0.0) is None and turns.went_quiet and not turns.resumed
        turns.push(_frame(), 0.0)
        assert not turns.went_quiet  # only the first quiet frame is the edge
        turns.push(_frame(), 0.9)
        assert turns.resumed and turns.speaking
        ended = None
        while ended is None:
            event = turns.push(_frame(), 0.0)
            ended = event if isinstance(event, TurnEnded) else None
        assert turns.how(ended) == "silence" and not turns.smart
        assert turns.check_due() is None  # no turn model: the silence ends turns


def test_echo_gating_hears_no_user_while_our_reply_plays():
    playing = True
    with ThreadPoolExecutor(1) as executor:
        gated = TurnTaking(_config(echo_gating=True), None, executor, reply_playing=lambda: playing)
        ungated = TurnTaking(_config(echo_gating=False), None, executor, reply_playing=lambda: playing)
        assert not any(isinstance(gated.push(_frame(), 0.9), TurnStarted) for _ in range(20))
        assert not gated.speaking
        assert any(isinstance(ungated.push(_frame(), 0.9), TurnStarted) for _ in range(20))


async def test_a_speculation_confirmed_by_the_same_words_is_reused_and_other_words_restart():
    async def reply_held_until_confirmed(turn: Turn, text: str, speculation: Speculation) -> None:
        await speculation.confirmed.wait()

    speculator = Speculator(reply_held_until_confirmed)
    same, other = Turn(1), Turn(2)
    speculator.start(same, "What colour is the sky")
    task = speculator.confirm(same, "What colour is the sky?")  # punctuation and case do not count
    assert task is not None and speculator.current is None
    await asyncio.wait_for(task, 1)
    assert (same.metrics.prefill, same.metrics.speculation, same.metrics.speculations_discarded) == \
        ("reused", "played", 0)

    speculator.start(other, "Could you tell me")
    held = speculator.current
    assert speculator.confirm(other, "Could you tell me the time?") is None
    await asyncio.sleep(0)
    assert held is not None and held.task is not None and held.task.cancelled()
    assert (other.metrics.prefill, other.metrics.speculation, other.metrics.speculations_discarded) == \
        ("restarted", "discarded", 1)


async def test_speech_after_a_pause_discards_only_the_pause_speculation():
    async def reply_held_until_confirmed(turn: Turn, text: str, speculation: Speculation) -> None:
        await speculation.confirmed.wait()

    speculator = Speculator(reply_held_until_confirmed)
    turn = Turn(1, prefix="Could you tell me?")
    speculator.start(turn, "what the weather will be like")
    assert speculator.current is not None
    assert speculator.current.text == "Could you tell me what the weather will be like"  # the unheard turn's words
    speculator.user_resumed(turn)  # a speculation on a stable partial, not a pause: it stays
    assert speculator.current is not None
    speculator.start(turn, "what the weather will be", in_pause=True)
    assert turn.metrics.speculations_discarded == 1  # the one it replaced
    speculator.user_resumed(turn)
    assert speculator.current is None and turn.metrics.speculations_discarded == 2
    speculator.start(turn, "what the weather will be like tomorrow")
    speculator.drop()  # a barge-in cancels without counting
    assert speculator.current is None and turn.metrics.speculations_discarded == 2


async def test_partials_read_the_prompt_ahead_one_at_a_time_and_never_beside_a_speculation():
    warmed: list[str] = []
    release = asyncio.Event()

    async def warm_up_recorded(turn: Turn, text: str) -> None:  # a fake at the warm-up seam: records, waits
        warmed.append(text)
        await release.wait()

    async def reply_held_until_confirmed(turn: Turn, text: str, speculation: Speculation) -> None:
        await speculation.confirmed.wait()

    speculator = Speculator(reply_held_until_confirmed, warm_up_recorded)
    turn = Turn(1)
    speculator.partial(turn, "What is the", stable=False)
    await asyncio.sleep(0)
    speculator.partial(turn, "What is the capital", stable=False)  # one at a time: skipped
    release.set()
    await asyncio.sleep(0)
    assert speculator.warming is not None and speculator.warming.done()
    speculator.partial(turn, "What is the capital", stable=True)  # a stable partial is read ahead, not answered
    await asyncio.sleep(0)
    speculator.partial(turn, "What is the capital", stable=True)  # already read: nothing new
    await asyncio.sleep(0)
    assert warmed == ["What is the", "What is the capital"] and speculator.current is None
    assert speculator.warmed == (1, "What is the capital")
    speculator.start(turn, "What is the capital of France?", in_pause=True)
    speculator.partial(turn, "What is the capital of", stable=False)  # a speculation holds the LLM: none
    await asyncio.sleep(0)
    assert warmed == ["What is the", "What is the capital"]
    speculator.discard()
    continued_turn = Turn(2, prefix="Could you tell me?")
    speculator.partial(continued_turn, "what the weather", stable=False)
    await asyncio.sleep(0)
    assert warmed[-1] == "Could you tell me what the weather"  # the unheard turn's words come first


async def test_without_a_warm_up_a_stable_partial_starts_a_speculation():
    async def reply_held_until_confirmed(turn: Turn, text: str, speculation: Speculation) -> None:
        await speculation.confirmed.wait()

    speculator = Speculator(reply_held_until_confirmed)  # a remote LLM: nothing to read ahead into
    turn = Turn(1)
    speculator.partial(turn, "What is the capital", stable=False)
    assert speculator.current is None and speculator.warming is None
    speculator.partial(turn, "What is the capital", stable=True)
    assert speculator.current is not None and not speculator.current.in_pause
    speculator.drop()


async def test_the_turn_model_waits_for_the_speculation_to_read_its_prompt_but_not_forever():
    async def reply_held_until_confirmed(turn: Turn, text: str, speculation: Speculation) -> None:
        await speculation.confirmed.wait()

    speculator = Speculator(reply_held_until_confirmed)
    turn = Turn(1)
    await asyncio.wait_for(speculator.prompt_read(turn, 5.0), 1.0)  # no speculation: at once
    speculator.start(turn, "What is the capital of France?", in_pause=True)
    speculation = speculator.current
    assert speculation is not None
    started = asyncio.get_running_loop().time()
    await speculator.prompt_read(turn, 0.1)  # no first token: the wait ends at its limit
    assert asyncio.get_running_loop().time() - started >= 0.09
    waiting = asyncio.create_task(speculator.prompt_read(turn, 5.0))
    await asyncio.sleep(0)
    speculation.prompt_read.set()  # the first token
    await asyncio.wait_for(waiting, 1.0)
    speculator.start(turn, "What is the capital of Spain?", in_pause=True)  # replaces it: a cancelled one ...
    assert speculation.prompt_read.is_set()  # ... never keeps anyone waiting
    speculator.drop()
