"""bench/arithmetic.py's key: every sum's expected answer is the calculator's, and its questions that are not sums
stay the LLM's (so the bench's 'not sums taken' column starts at 0 and can only show a regression)."""

from __future__ import annotations

import re

from bench.arithmetic import CONVERSATIONS, as_digits, n
from pipelines.voice.arithmetic import calculate


def test_the_key_accepts_the_calculators_answers_and_no_question_that_is_not_a_sum_is_taken():
    for conversation in CONVERSATIONS:
        last = None
        for question in conversation:
            calculation = calculate(question.text, last)
            last = calculation.value if calculation is not None else None
            if question.is_sum:
                assert calculation is not None and re.search(question.accept, calculation.text, re.IGNORECASE), (
                    question, calculation)
            else:
                assert calculation is None, question


def test_a_number_in_the_key_is_a_whole_number_of_the_reply():
    assert re.search(n("391"), "17 times 23 is 391.")
    assert not re.search(n("39"), "17 times 23 is 391.") and not re.search(n("1"), "It is 1.5.")


def test_a_right_answer_in_words_or_with_a_thousands_comma_is_graded_right():
    """The 1.5B said "Twelve times three equals thirty-six." and "1,000.", both right."""
    assert re.search(n("36"), as_digits("Twelve times three equals thirty-six."))
    assert re.search(n("1000"), as_digits("1,000."))
    assert not re.search(n("1000"), as_digits("Ten thousand."))
