"""Does speculative decoding make the bigger model as quick to speak as the small one? The embedded LLM in each
set-up (model x decoding: plain, a draft model, n-grams) answers the spoken answer bench's own questions
(bench/answers.py, the text the user said) with the voice loop's system prompt, repetition penalty and reply cap.
The set-ups are loaded side by side and take the questions in turn, so the machine's drift hits all of them.

Reported per set-up: time to the first token and to the first three words (the first chunk the voice loop speaks:
what the user waits for once the prompt is read), the whole reply, decode tokens/s, and the draft's proposals kept
(acceptance rate). Ratios are to the first set-up. Replies are the same with and without speculation (greedy
decoding); the bench checks that too.

    bash scripts/test.sh --exec .venv/bin/python -m bench.llm_decoding           # the default set-ups
    ... -m bench.llm_decoding --setup qwen2.5-1.5b --setup qwen2.5-1.5b+draft:qwen2.5-0.5b:3 --rounds 2

A set-up is ``WEIGHTS`` (plain), ``WEIGHTS+draft:DRAFT_WEIGHTS[:N_MAX[:P_MIN]]`` or ``WEIGHTS+ngram[:N_MAX]``.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import time
from dataclasses import dataclass, field

from bench.answers import CONVERSATIONS
from models.llm import ChatMessage, LlmRequest
from models.llm.embedded import EmbeddedLlm, SpeculativeDecodingConfig, packaged_llm_path
from pipelines.voice.config import VoiceLoopOptions
from server.config.voice import VoiceSettings

DEFAULT_SETUPS = ["qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-1.5b+draft:qwen2.5-0.5b:3:0.6",
                  "qwen2.5-1.5b+draft:qwen2.5-0.5b:2:0.8", "qwen2.5-1.5b+ngram:3"]
FIRST_CHUNK_WORDS = 3  # the voice loop's first spoken chunk (pipelines/voice/streaming.py)


@dataclass
class Setup:
    name: str
    weights: str
    speculative: SpeculativeDecodingConfig
    llm: EmbeddedLlm | None = None
    first_token: list[float] = field(default_factory=list)
    first_chunk: list[float] = field(default_factory=list)
    whole: list[float] = field(default_factory=list)
    tokens: int = 0
    decode_s: float = 0.0
    replies: dict[str, str] = field(default_factory=dict)


def parse_setup(spec: str) -> Setup:
    weights, _, rest = spec.partition("+")
    if not rest:
        return Setup(spec, weights, SpeculativeDecodingConfig())
    method, *args = rest.split(":")
    if method == "draft":
        draft, *numbers = args
        config = SpeculativeDecodingConfig(method="draft", draft_weights=draft,
                                           **({"max_draft_tokens": int(numbers[0])} if numbers else {}),
                                           **({"min_draft_probability": float(numbers[1])} if len(numbers) > 1 else {}))
    elif method == "ngram":
        config = SpeculativeDecodingConfig(method="ngram", **({"max_draft_tokens": int(args[0])} if args else {}))
    else:
        raise SystemExit(f"--setup {spec}: the method is draft or ngram")
    return Setup(spec, weights, config)


def questions() -> list[str]:
    """The single questions of the audio-only categories (a follow-up needs its first turn; the scene a camera)."""
    return [q.text for c in CONVERSATIONS if c.audio_only and len(c.questions) != 2 for q in c.questions
            if q.category in {"facts", "arithmetic", "advice", "requests"}]


async def ask(setup: Setup, question: str, options: VoiceLoopOptions, system: str) -> None:
    assert setup.llm is not None
    request = LlmRequest([ChatMessage("system", system), ChatMessage("user", question)],
                         max_tokens=options.max_reply_tokens, temperature=options.temperature,
                         repeat_penalty=options.repeat_penalty)
    start = time.perf_counter()
    first = chunk = None
    text = ""
    async for piece in setup.llm.generate(request):
        now = time.perf_counter() - start
        if piece.text and first is None:
            first = now
        text += piece.text
        if chunk is None and len(re.findall(r"\S+\s", text)) >= FIRST_CHUNK_WORDS:
            chunk = now
    whole = time.perf_counter() - start
    setup.first_token.append(first or whole)
    setup.first_chunk.append(chunk or whole)
    setup.whole.append(whole)
    setup.replies[question] = text.strip()


def drafted(setup: Setup) -> tuple[float, float]:
    assert setup.llm is not None
    metrics = setup.llm.backend_metrics()
    return metrics.get("spec_decode_num_accepted_tokens_total", 0.0), metrics.get("spec_decode_num_draft_tokens_total",
                                                                                 0.0)


def median_ms(values: list[float]) -> float:
    """Median in milliseconds."""
    return statistics.median(values) * 1000


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setup", action="append", help="a set-up (repeatable); see above")
    parser.add_argument("--rounds", type=int, default=1, help="times through the questions")
    parser.add_argument("--limit", type=int, help="only the first N questions (a quick look)")
    args = parser.parse_args()
    setups = [parse_setup(spec) for spec in args.setup or DEFAULT_SETUPS]
    options, system = VoiceLoopOptions(), VoiceSettings().system_prompt
    asked = questions()[:args.limit]
    for setup in setups:
        setup.llm = await EmbeddedLlm.open(str(packaged_llm_path(setup.weights)), speculative=setup.speculative)
        await ask(setup, "Hello.", options, system)  # warm-up, not counted
        setup.first_token.clear(), setup.first_chunk.clear(), setup.whole.clear()
    print(f"{len(asked)} questions x {args.rounds} round(s), set-ups in turn: {', '.join(s.name for s in setups)}",
          flush=True)
    try:
        for _ in range(args.rounds):
            for question in asked:
                for setup in setups:
                    await ask(setup, question, options, system)
        base = setups[0]
        print(f"{'set-up':44} {'first token':>12} {'first 3 words':>14} {'whole reply':>12} {'tok/s':>7} "
              f"{'drafts kept':>16} same reply")
        for setup in setups:
            assert setup.llm is not None
            metrics = setup.llm.backend_metrics()
            tokens, seconds = metrics.get("tokens_predicted_total", 0.0), metrics.get(
                "tokens_predicted_seconds_total", 0.0)
            kept, proposed = drafted(setup)
            plain = next((s for s in setups if s.weights == setup.weights and s.speculative.method == "off"), None)
            same = "-" if plain is None or plain is setup else (
                f"{sum(plain.replies[q] == setup.replies[q] for q in asked)}/{len(asked)}")
            rate = f"{kept:.0f}/{proposed:.0f} ({kept / proposed:.0%})" if proposed else "-"
            pairs = ((setup.first_token, base.first_token), (setup.first_chunk, base.first_chunk),
                     (setup.whole, base.whole))
            times = " ".join(f"{median_ms(mine):6.0f} ms ({median_ms(mine) / median_ms(theirs):.2f}x)"
                             for mine, theirs in pairs)
            print(f"{setup.name:44} {times} {tokens / seconds if seconds else 0:7.1f} {rate:>16} {same}")
    finally:
        for setup in setups:
            if setup.llm is not None:
                await setup.llm.close()


if __name__ == "__main__":
    asyncio.run(main())
