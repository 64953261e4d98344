"""The voice loop's calculator (pipelines/voice/arithmetic.py): a spoken sum is answered exactly, a follow-up goes on
from the calculator's own last answer, and anything that is not only a sum is left to the LLM."""

from __future__ import annotations

import pytest

from pipelines.voice.arithmetic import calculate, say
from pipelines.voice.config import VoiceLoopConfig
from pipelines.voice.recall import Recall


@pytest.mark.parametrize(("asked", "answer"), [
    ("What is seventeen times twenty three?", "17 times 23 is 391."),  # Qwen2.5 0.5B: 409
    ("What is 144 divided by 12?", "144 divided by 12 is 12."),  # 0.5B: 10
    ("What is fifteen percent of eighty?", "15 percent of 80 is 12."),  # 0.5B: 120%
    ("How much is 15% of 200?", "15 percent of 200 is 30."),
    ("What's 1,000 minus 437?", "1000 minus 437 is 563."),
    ("What is a hundred divided by eight?", "100 divided by 8 is 12.5."),
    ("What is ten divided by three?", "10 divided by 3 is about 3.333."),
    ("What is 0.1 plus 0.2?", "0.1 plus 0.2 is 0.3."),  # not "about": a float's last bit is not a rounding
    ("What is 1 divided by 10000?", "1 divided by 10000 is 0.0001."),
    ("What is two divided by three thousand?", "2 divided by 3000 is about 0.000667."),
    ("What is minus five plus two?", "Minus 5 plus 2 is minus 3."),
    ("Twelve squared?", "12 squared is 144."),
    ("What is 3 cubed?", "3 cubed is 27."),
    ("What's the square root of 81?", "The square root of 81 is 9."),
    ("What is 2 to the power of 10?", "2 to the power of 10 is 1024."),
    ("And what is one point five times four?", "1.5 times 4 is 6."),
    ("What is 7 × 8?", "7 times 8 is 56."),
    ("What a 7 times 6.", "7 times 6 is 42."),  # tiny.en's hearing of "What is seven times six?"
])
def test_a_sum_is_answered_exactly(asked: str, answer: str):
    calculation = calculate(asked)
    assert calculation is not None and calculation.text == answer


@pytest.mark.parametrize("asked", [
    "What is the capital of France?", "Is 7 a prime number?", "What is 911?", "What is 5 plus 5 apples?",
    "What is a 4x4?", "Count from one to five.", "And a green one?", "How many legs does a spider have?",
    "What is the speed of light times 2?", "What is 5 and 5?", "",
    # no number is the answer, or none a voice should read: the LLM says why
    "What is 5 divided by 0?", "What is the square root of minus four?", "What is 2 to the power of 100?",
    "What is 1 divided by 10000000?",
    # a number no voice should say: 400 digits read as a float's infinity (it raised OverflowError from say())
    "What is " + "9" * 400 + " plus 1?", "What is 1000000000000000 plus 1?",
    # a follow-up with nothing of the calculator's before it
    "Now double that.", "Add two to that.",
])
def test_what_is_not_only_a_sum_is_the_llms(asked: str):
    assert calculate(asked) is None


@pytest.mark.parametrize(("last", "asked", "answer"), [
    (10, "Now double that.", "10 times 2 is 20."),
    (42, "Add two to that.", "42 plus 2 is 44."),
    (7, "Multiply that by 5.", "7 times 5 is 35."),  # 0.5B: "The product of 3 and 4 multiplied by 5 is 15."
    (72, "Subtract 10 from that.", "72 minus 10 is 62."),
    (8, "And times 7?", "8 times 7 is 56."),
    (90, "What's half of that?", "90 divided by 2 is 45."),
    (12, "Square it.", "12 squared is 144."),
    (144, "What's the square root of that?", "The square root of 144 is 12."),
    (25, "And what is that times six?", "25 times 6 is 150."),
    (81, "Take away 17.", "81 minus 17 is 64."),
    (3, "Divide it by 4.", "3 divided by 4 is 0.75."),
    (3, "Add " + "9" * 400 + " to that.", None),
])
def test_a_follow_up_goes_on_from_the_last_answer(last: float, asked: str, answer: str | None):
    calculation = calculate(asked, last)
    assert (calculation.text if calculation is not None else None) == answer


def test_numbers_are_said_as_the_tts_reads_them():
    assert [say(v) for v in (391.0, 12.5, -3.0, 0.333, 1e12)] == ["391", "12.5", "minus 3", "0.333", "1000000000000"]


def test_recall_answers_a_sum_and_its_follow_up_and_forgets_it_after_the_llm_answers():
    config = VoiceLoopConfig(echo_gating=False, system_prompt="You are a helpful voice assistant.")
    recall = Recall(llm=None, config=config)  # type: ignore[arg-type]  # canned and answered never ask the LLM
    assert recall.canned("What is five plus five?") == "5 plus 5 is 10."
    recall.answered("What is five plus five?", "5 plus 5 is 10.")
    assert recall.canned("Now double that.") == "10 times 2 is 20."
    recall.answered("Now double that.", "10 times 2 is 20.")
    assert recall.last_sum == 20
    # The LLM answered the next question: its "that" is no number of the calculator's
    assert recall.canned("How many days are in a week?") is None
    recall.answered("How many days are in a week?", "There are 7 days in a week.")
    assert recall.last_sum is None and recall.canned("Double that.") is None
    off = Recall(llm=None, config=config.model_copy(update={"calculator": False}))  # type: ignore[arg-type]
    assert off.canned("What is five plus five?") is None
