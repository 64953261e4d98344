"""Does the voice loop answer questions about people in view as the detector counts them? Offline, text only: the
embedded LLM answers scene questions with the prompt the voice loop builds (its system prompt, the scene line in
the question, the conversation so far, its reply cap and repetition penalty), with the reply's first word from
the counts (``voice.scene_lead``, pipelines/voice/grounding.py) and without, side by side in one run.

Two sets of questions: the spoken answer bench's eight (bench/answers.py: two people of whom one in the door zone,
then an empty room) and twelve held out from the lead's design (other wordings, and one person outside the zone).
Each scene is one conversation, asked in order, as a session would. No STT: a misheard question is
bench/answers.py's to count.

    bash scripts/test.sh --exec .venv/bin/python -m bench.scene_questions                  # the packaged default
    ... -m bench.scene_questions --llm qwen2.5-0.5b --llm qwen2.5-1.5b
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

from bench.answers import CONVERSATIONS
from models.llm import ChatMessage, LlmRequest
from models.llm.embedded import EmbeddedLlm, packaged_llm_path
from pipelines.scene import SceneState
from pipelines.voice.config import VoiceLoopOptions
from pipelines.voice.grounding import answer_lead
from pipelines.voice.replies import session_prompt, turn_messages
from server.config.voice import VoiceSettings

YES = r"\byes\b|\b(1|one|2|two)\b|people|person|someone|somebody"
NO = r"\bno\b|nobody|no one|not|n't|\b(0|zero)\b|none|empty"


@dataclass(frozen=True)
class Asked:
    text: str
    accept: str
    reject: str = ""


def scene(people: int, in_door: int) -> SceneState:
    state = SceneState()
    state.update(labels=["person"] * people, pts=1.0, ts=1.0, model="yolo",
                 zone_occupancy={"door": list(range(in_door))}, line_counts={}, events=[])
    return state


def bench_conversations() -> list[tuple[SceneState, list[Asked]]]:
    """bench/answers.py's scene conversations, on the counts its clips give (zidane: 2 people, 1 in the door zone;
    coffee: no one)."""
    counts = {"two-people": (2, 1), "no-one": (0, 0)}
    return [(scene(*counts[c.clip]), [Asked(q.text, q.accept, q.reject) for q in c.questions])
            for c in CONVERSATIONS if c.clip is not None]


HELD_OUT = [
    (scene(2, 1), [Asked("Are there any people here?", YES, r"\bno\b"),
                   Asked("Can you see somebody?", YES, r"\bno\b"),
                   Asked("How many persons are in view?", r"\b(2|two)\b"),
                   Asked("Is the door zone empty?", r"\bno\b|not empty|\b(1|one)\b", r"\byes\b|is empty")]),
    (scene(0, 0), [Asked("Is there anybody there?", NO, r"\byes\b"),
                   Asked("Can you see a person?", NO, r"\byes\b"),
                   Asked("Are there any people in view?", NO, r"\byes\b"),
                   Asked("How many people are at the door?", r"\b(0|zero|no|none)\b|nobody|no one")]),
    (scene(1, 0), [Asked("Is someone there?", r"\byes\b|\b(1|one)\b|person|someone", r"\bno\b"),
                   Asked("How many people can you see?", r"\b(1|one)\b", r"\b(2|two|0|zero)\b"),
                   Asked("Is anybody in the door zone?", NO, r"\byes\b"),
                   Asked("Is the room empty right now?", r"\bno\b|not empty|\b(1|one)\b|person|someone",
                         r"\byes\b|is empty")]),
]


async def ask(llm: EmbeddedLlm, conversations: list[tuple[SceneState, list[Asked]]], *, lead: bool,
              label: str) -> tuple[int, int]:
    options = VoiceLoopOptions()
    system = session_prompt(VoiceSettings.model_fields["system_prompt"].default, video=True)
    right = asked = 0
    for state, questions in conversations:
        history: list[ChatMessage] = []
        for question in questions:
            first = answer_lead(question.text, state) if lead else None
            messages = turn_messages(system, history, question.text, video=True, scene=state.summary(), lead=first)
            reply = await reply_to(llm, messages, options)
            if first:  # as pipelines.voice.streaming speaks it: the lead, then what the LLM went on with
                reply = first + ("" if reply[:1].isspace() else " ") + reply
            reply = reply.strip()
            ok = re.search(question.accept, reply, re.IGNORECASE) is not None and not (
                question.reject and re.search(question.reject, reply, re.IGNORECASE))
            right, asked = right + ok, asked + 1
            if not ok:
                print(f"  {label}: wrong  {question.text!r} -> {reply!r}", flush=True)
            history += [ChatMessage("user", question.text), ChatMessage("assistant", reply)]
    return right, asked


async def reply_to(llm: EmbeddedLlm, messages: list[ChatMessage], options: VoiceLoopOptions) -> str:
    """The LLM's whole reply, asked as the voice loop asks (its reply cap, temperature and repetition penalty)."""
    request = LlmRequest(messages, max_tokens=options.max_reply_tokens, temperature=options.temperature,
                         repeat_penalty=options.repeat_penalty)
    reply = ""
    async with contextlib.aclosing(llm.stream(request)) as deltas:
        async for delta in deltas:
            reply += delta
    return reply


async def each_llm(models: list[str]) -> AsyncIterator[tuple[str, EmbeddedLlm]]:
    """Each packaged model by its weights name, opened in turn and closed after."""
    for weights in models:
        llm = await EmbeddedLlm.open(str(packaged_llm_path(weights)))
        try:
            yield weights, llm
        finally:
            await llm.close()


def models_asked(description: str) -> list[str]:
    """The command line's ``--llm`` (repeated for a side-by-side run), else the packaged default."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--llm", action="append", help="models.llm.weights (default: the packaged default)")
    args = parser.parse_args()
    if not args.llm:
        from models.packaged import DEFAULT_LLM

        args.llm = [DEFAULT_LLM]
    return args.llm


async def run(models: list[str]) -> None:
    rows = []
    async for weights, llm in each_llm(models):
        for lead in (True, False):
            label = f"{weights}, scene_lead={'on' if lead else 'off'}"
            bench = await ask(llm, bench_conversations(), lead=lead, label=label)
            held = await ask(llm, HELD_OUT, lead=lead, label=label)
            rows.append((label, bench, held))
    print(f"\n{'set-up':34} {'answer bench':>14} {'held out':>14}")
    for label, (b_ok, b_n), (h_ok, h_n) in rows:
        print(f"{label:34} {b_ok:>5}/{b_n:<2} {100 * b_ok / b_n:3.0f} % {h_ok:>5}/{h_n:<2} {100 * h_ok / h_n:3.0f} %")


def main() -> None:
    asyncio.run(run(models_asked(__doc__.splitlines()[0])))


if __name__ == "__main__":
    main()
