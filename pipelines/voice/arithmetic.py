"""Arithmetic: a spoken sum answered exactly, not by the LLM. Qwen2.5 0.5B says "17 multiplied by 23 equals 409",
"144 divided by 12 equals 10" and, asked "Multiply that by 5." after "3 plus 4 is 7", "15" (bench/arithmetic.py).
A voice assistant that gets a sum wrong with confidence is worse than one that says nothing, and a sum needs no
model: when the whole question is one (or a follow-up on the last one), the reply is computed
(``pipelines.voice.recall.Recall.canned``) and said as "17 times 23 is 391.", at once, without the LLM.

Rule-based and narrow on purpose, like ``pipelines.voice.grounding``: the question must be nothing but a sum, in
words or digits (number words read by text2num), with one operation:
- "What is 17 times 23?", "How much is 15 percent of 80?", "What's the square root of 81?", "Twelve squared?";
- on the last answer given this way: "Add two to that.", "Now double that.", "Multiply it by 5.", "And times 7?",
  "What's that divided by 4?".
Anything else ("What is 5 plus 5 apples?", "Is 7 a prime?", "What is the speed of light times 2?") is the LLM's, and
so is a follow-up whose "that" the LLM gave."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from text_to_num import alpha2digit

_NUMBER = r"(?:(?:minus|negative) |-)?\d+(?:\.\d+)?"
_OPENING = re.compile(r"^(?:(?:and|so|ok|okay|well|now|then|also|hey|please|alright)\b[, ]*)+")
# "what" alone: tiny.en hears "What is seven times six?" as "What a 7 times 6."
_ASK = re.compile(r"^(?:what is|what's|whats|how much is|calculate|compute|work out|what does|what do you get for|"
                  r"what) ")
_CLOSING = re.compile(r"(?: equal| equals| make| makes| please| exactly)$")
_THAT = r"(?:that|it|this|the result|the answer)"


@dataclass(frozen=True, slots=True)
class Operation:
    word: str  # how the answer says it: "17 times 23 is 391."
    apply: Callable[[float, float], float]


PLUS = Operation("plus", lambda a, b: a + b)
MINUS = Operation("minus", lambda a, b: a - b)
TIMES = Operation("times", lambda a, b: a * b)
DIVIDED = Operation("divided by", lambda a, b: a / b)  # ZeroDivisionError by 0
POWER = Operation("to the power of", lambda a, b: float(a) ** b)  # OverflowError past a float
PERCENT = Operation("percent of", lambda a, b: a / 100 * b)

_BINARY = {
    "plus": PLUS, "+": PLUS, "added to": PLUS,
    "minus": MINUS, "-": MINUS, "take away": MINUS,
    "times": TIMES, "*": TIMES, "multiplied by": TIMES,  # not "x": "What is a 4x4?" asks about a car
    "divided by": DIVIDED, "/": DIVIDED, "over": DIVIDED,
    "to the power of": POWER, "to the power": POWER,
    "percent of": PERCENT, "% of": PERCENT, "per cent of": PERCENT,
}
_BINARY_WORDS = "|".join(re.escape(word) for word in sorted(_BINARY, key=len, reverse=True))
_SUM = re.compile(rf"^(?P<a>{_NUMBER}) ?(?P<op>{_BINARY_WORDS}) ?(?P<b>{_NUMBER})$")
# One number and what is done to it: (how the answer says it, the function), and the patterns naming it n
SQUARED = ("{} squared", lambda n: n * n)
SQUARE_ROOT = ("the square root of {}", math.sqrt)
_UNARY = [
    (re.compile(rf"^(?P<n>{_NUMBER}) squared$"), *SQUARED),
    (re.compile(rf"^(?P<n>{_NUMBER}) cubed$"), "{} cubed", lambda n: n ** 3),
    (re.compile(rf"^(?:the )?square root of (?P<n>{_NUMBER})$"), *SQUARE_ROOT),
    (re.compile(rf"^half of (?P<n>{_NUMBER})$"), "half of {}", lambda n: n / 2),
    (re.compile(rf"^(?:double|twice) (?P<n>{_NUMBER})$"), "double {}", lambda n: n * 2),
]
# Follow-ups on the last answer: (pattern, operation or None for the one named op, operand or None for n)
_FOLLOW_UPS = [
    (re.compile(rf"^(?:double|twice) {_THAT}$"), TIMES, 2),
    (re.compile(rf"^(?:halve|half of|half) {_THAT}$"), DIVIDED, 2),
    (re.compile(rf"^triple {_THAT}$"), TIMES, 3),
    (re.compile(rf"^(?:add|plus) (?P<n>{_NUMBER})(?: to {_THAT})?$"), PLUS, None),
    (re.compile(rf"^add {_THAT} (?:and|to) (?P<n>{_NUMBER})$"), PLUS, None),
    (re.compile(rf"^(?:subtract|take away|minus|take) (?P<n>{_NUMBER})(?: (?:from|off) {_THAT})?$"), MINUS, None),
    (re.compile(rf"^(?:multiply|times) (?:{_THAT} )?(?:by )?(?P<n>{_NUMBER})$"), TIMES, None),
    (re.compile(rf"^(?:divide {_THAT} by|divided by) (?P<n>{_NUMBER})$"), DIVIDED, None),
    (re.compile(rf"^{_THAT} ?(?P<op>{_BINARY_WORDS}) ?(?P<n>{_NUMBER})$"), None, None),
]
_UNARY_FOLLOW_UPS = [
    (re.compile(rf"^square {_THAT}$|^{_THAT} squared$"), *SQUARED),
    (re.compile(rf"^(?:the )?square root of {_THAT}$"), *SQUARE_ROOT),
]


@dataclass(frozen=True, slots=True)
class Calculation:
    text: str  # the reply: "17 times 23 is 391."
    value: float


def calculate(question: str, last: float | None = None) -> Calculation | None:
    """The exact answer to ``question`` when it is a sum, or a follow-up on ``last`` (the value of the last answer
    given this way), else None: the LLM's to answer."""
    words = _normalise(question)
    if not words:
        return None
    asked = _ASK.sub("", words)
    asked = _CLOSING.sub("", asked)
    if (found := _SUM.match(asked)) is not None:
        return _answer(_number(found["a"]), _BINARY[found["op"]], _number(found["b"]))
    for pattern, phrase, function in _UNARY:
        if (found := pattern.match(asked)) is not None:
            n = _number(found["n"])
            return _said(phrase, function, n)
    if last is None:
        return None
    for pattern, phrase, function in _UNARY_FOLLOW_UPS:
        if pattern.match(asked) is not None:
            return _said(phrase, function, last)
    for pattern, operation, operand in _FOLLOW_UPS:
        if (found := pattern.match(asked)) is not None:
            if operation is None:
                operation = _BINARY[found["op"]]
            if operand is None:
                operand = _number(found["n"])
            return _answer(last, operation, operand)
    return None


def _normalise(question: str) -> str:
    text = question.lower().replace("×", " times ").replace("÷", " divided by ").replace("what’s", "what's")
    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)  # "1,000"
    text = text.strip().rstrip("?!. ").strip()
    # text2num turns number words into digits ("seventeen" -> 17; threshold 0: "two" too), "a hundred" -> "a 100"
    text = alpha2digit(text, "en", threshold=0)
    text = re.sub(r"\ba (?=\d)", "", text)
    text = re.sub(r"\s+", " ", text.replace(",", " ")).strip()
    return _OPENING.sub("", text).strip()


def _number(spoken: str) -> float:
    negative = spoken.startswith(("minus ", "negative ", "-"))
    value = float(spoken.split()[-1].lstrip("-"))
    return -value if negative else value


def _answer(a: float, operation: Operation, b: float) -> Calculation | None:
    return _said(f"{{}} {operation.word} {{}}", operation.apply, a, b)


def _said(phrase: str, function: Callable[..., float], *numbers: float) -> Calculation | None:
    """"``phrase`` (its {} the ``numbers``) is ``function(*numbers)``." to three decimals, or three significant
    digits below 1 ("about" when rounded), or None where no number is the answer (dividing by zero, the square root
    of a negative number) or a number is none a voice should say (15 digits or more, or a millionth or less; a
    400-digit number reads as a float's infinity): the LLM's."""
    if any(not math.isfinite(n) or abs(n) >= 1e15 for n in numbers):
        return None
    try:
        result = function(*numbers)
    except (ZeroDivisionError, OverflowError, ValueError):
        return None
    if isinstance(result, complex) or not math.isfinite(result) or abs(result) >= 1e15 or 0 < abs(result) < 1e-6:
        return None
    rounded = round(result, 3) if abs(result) >= 1 else float(f"{result:.3g}")  # 0.0001, not 0
    about = "about " if abs(rounded - result) > 1e-9 * max(1.0, abs(result)) else ""
    text = f"{phrase.format(*map(say, numbers))} is {about}{say(rounded)}."
    return Calculation(text[0].upper() + text[1:], rounded)


def say(value: float) -> str:
    """A number as the TTS should read it: 391, 12.5, minus 4."""
    if value < 0:
        return "minus " + say(-value)
    if value == int(value):
        return str(int(value))
    return f"{value:.10f}".rstrip("0").rstrip(".")
