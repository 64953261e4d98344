"""Does the voice loop get spoken sums right? Offline, text only: each conversation is asked of the embedded LLM with
the prompt the voice loop builds (audio only: its system prompt, the conversation so far, its reply cap and
repetition penalty), once with the calculator (``voice.calculator``, pipelines/voice/arithmetic.py: a sum, or a
follow-up on the last one, is answered without the LLM) and once without, side by side in one run.

The questions are not those the calculator's rules were written on (pipelines/voice/arithmetic.py's docstring and
tests), though one author wrote both: sums in words and in digits as tiny.en writes them, follow-ups on the answer
before, and questions that are not sums (the calculator must leave them to the LLM: a question it takes that is not
a sum is counted as a false take). A reply's numbers are read in digits before grading ("thirty-six", "1,000").
No STT: a misheard question is bench/answers.py's.

    bash scripts/test.sh --exec .venv/bin/python -m bench.arithmetic                  # the packaged default
    ... -m bench.arithmetic --llm qwen2.5-0.5b --llm qwen2.5-1.5b
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass

from text_to_num import alpha2digit

from bench.scene_questions import each_llm, models_asked, reply_to
from models.llm import ChatMessage
from models.llm.embedded import EmbeddedLlm
from pipelines.voice.arithmetic import calculate
from pipelines.voice.config import VoiceLoopOptions
from pipelines.voice.replies import session_prompt, turn_messages
from server.config.voice import VoiceSettings


@dataclass(frozen=True)
class Asked:
    text: str
    accept: str  # a right answer matches
    is_sum: bool = True  # False: the calculator must not take it


def n(value: str) -> str:
    """A number as a whole word of the reply ("391", not "3910")."""
    return rf"(?<![\d.]){re.escape(value)}(?![\d]|\.\d)"


def as_digits(reply: str) -> str:
    """A reply's numbers in digits, as the key writes them: "thirty-six" is 36 and "1,000" is 1000."""
    return alpha2digit(re.sub(r"(?<=\d),(?=\d{3}\b)", "", reply), "en")


CONVERSATIONS: list[list[Asked]] = [
    [Asked("What is 23 times 19?", n("437")), Asked("And minus 37?", n("400"))],
    [Asked("What's 156 divided by 12?", n("13")), Asked("Multiply it by 4.", n("52"))],
    [Asked("How much is 25 percent of 360?", n("90")), Asked("What's half of that?", n("45"))],
    [Asked("What is four hundred and twelve plus two hundred and ninety nine?", n("711"))],
    [Asked("What is 1,000 minus 1?", n("999")), Asked("Now add 1 to that.", n("1000"))],
    [Asked("What is eighteen times eleven?", n("198"))],
    [Asked("What's 84 divided by 7?", n("12")), Asked("Square that.", n("144"))],
    [Asked("How much is 7.5 times 4?", n("30"))],
    [Asked("What is 3 to the power of 5?", n("243"))],
    [Asked("Calculate 999 plus 999.", n("1998"))],
    [Asked("What is the square root of 144?", n("12")), Asked("Triple that.", n("36"))],
    [Asked("What is 64 minus 128?", r"-\s?64|minus 64|negative 64")],
    [Asked("What is 9 squared?", n("81")), Asked("Take away 17.", n("64"))],
    [Asked("What is 10 percent of 250?", n("25")), Asked("And what is that times 6?", n("150"))],
    [Asked("What is 45 times 45?", n("2025"))],
    # Not sums: the LLM's (accept: the fact), and the calculator must not claim them
    [Asked("What is the capital of Italy?", "rome", is_sum=False),
     Asked("Double that.", r".", is_sum=False)],  # "that" is a city: anything but a number from the calculator
    [Asked("How many days are there in a week?", n("7") + "|seven", is_sum=False),
     Asked("Multiply that by 2.", n("14") + "|fourteen", is_sum=False)],  # "that" is the LLM's: not taken
    [Asked("What is 911?", r".", is_sum=False)],
    [Asked("Is 7 a prime number?", r"\byes\b", is_sum=False)],
    [Asked("What year did the Second World War end?", n("1945"), is_sum=False)],
    [Asked("What is 2 plus 2 apples?", r".", is_sum=False)],
]


async def ask(llm: EmbeddedLlm, *, calculator: bool, label: str) -> tuple[int, int, int, int]:
    """(sums right, sums asked, false takes, questions that are not sums)."""
    options = VoiceLoopOptions()
    system = session_prompt(VoiceSettings.model_fields["system_prompt"].default, video=False)
    right = sums = false_takes = others = 0
    for conversation in CONVERSATIONS:
        history: list[ChatMessage] = []
        last: float | None = None
        for question in conversation:
            calculation = calculate(question.text, last) if calculator else None
            last = calculation.value if calculation is not None else None
            if calculation is not None:
                reply = calculation.text
            else:
                reply = (await reply_to(llm, turn_messages(system, history, question.text, video=False),
                                        options)).strip()
            if question.is_sum:
                ok = re.search(question.accept, as_digits(reply), re.IGNORECASE) is not None
                right, sums = right + ok, sums + 1
                if not ok:
                    print(f"  {label}: wrong  {question.text!r} -> {reply!r}", flush=True)
            else:
                others += 1
                if calculation is not None:
                    false_takes += 1
                    print(f"  {label}: taken  {question.text!r} -> {reply!r}", flush=True)
            history += [ChatMessage("user", question.text), ChatMessage("assistant", reply)]
    return right, sums, false_takes, others


async def run(models: list[str]) -> None:
    rows = []
    async for weights, llm in each_llm(models):
        for calculator in (True, False):
            label = f"{weights}, calculator={'on' if calculator else 'off'}"
            rows.append((label, await ask(llm, calculator=calculator, label=label)))
    print(f"\n{'set-up':34} {'sums right':>14} {'not sums taken':>15}")
    for label, (right, sums, taken, others) in rows:
        print(f"{label:34} {right:>5}/{sums:<2} {100 * right / sums:3.0f} % {taken:>10}/{others}")


def main() -> None:
    asyncio.run(run(models_asked(__doc__.splitlines()[0])))


if __name__ == "__main__":
    main()
