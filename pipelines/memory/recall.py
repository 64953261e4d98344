"""Voice-loop memory: notice a question about the past, rewrite it with the conversation's context, search
memory, and fit the best entries (with their times) into the prompt's budget. Rule-based on purpose: the small
LLM is too slow to spend a call on rewriting, and rules cost microseconds on ordinary turns."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from models.llm import ChatMessage
from pipelines.memory.entries import SearchFilters, SearchHit
from pipelines.memory.index import MemoryIndex
from pipelines.memory.store import STOPWORDS
from pipelines.voice.recall import PromptContext

log = logging.getLogger(__name__)

_PAST = re.compile(
    r"\b(when did|when was|when were|last time|earlier|before|ago|yesterday|this morning|remember|recall|"
    r"what did i (?:tell|say|ask|mention)|did i (?:tell|say|mention)|what did you (?:see|hear)|"
    r"have you seen|did you see|did anyone|did someone|who came|what happened|previously|so far today)\b",
    re.IGNORECASE,
)
# The memory phrasing itself is no search term ("do you remember what I told you about the van" -> "van").
_FILLER = re.compile(
    r"\b(do you remember|can you remember|remember|recall|what did i (?:tell|say to|ask|mention to) you about|"
    r"what did i (?:tell|say|ask|mention)|did i (?:tell|say|mention)|you|me|earlier|before|last time|ago|"
    r"please|tell|about|told|said)\b",
    re.IGNORECASE,
)
_REMINDERS = re.compile(r"\b(remind|reminders?|remember|forget|note)\b", re.IGNORECASE)
_PRONOUNS = re.compile(r"\b(it|that|this|there|them|they|he|she|one)\b", re.IGNORECASE)
_WORD = re.compile(r"[A-Za-z0-9']+")

KIND_PHRASES = {"transcript": "the user said", "reply": "you said", "event": "the camera saw",
                "scene": "the camera's view", "alert": "you announced"}


def asks_about_past(text: str) -> bool:
    return _PAST.search(text) is not None


def _content_words(text: str) -> list[str]:
    return [w for w in _WORD.findall(text) if w.lower() not in STOPWORDS and len(w) > 1]


def rewrite_query(question: str, conversation: Sequence[ChatMessage]) -> str:
    """The search query: the question's own content words, plus the previous user turn's when the question
    leans on it ("when did I say that?") or has almost nothing of its own."""
    own = _content_words(_FILLER.sub(" ", question))
    if len(own) >= 2 and not _PRONOUNS.search(question):
        return " ".join(own)
    if not own and _REMINDERS.search(question):  # "what did I ask you to remember?": the requests themselves
        return "remind remember forget note"
    previous = next((m.content for m in reversed(conversation) if m.role == "user"), "")
    context = [w for w in _content_words(previous) if w.lower() not in {o.lower() for o in own}]
    return " ".join(own + context) or question


def _approx_tokens(text: str) -> int:
    return len(text) // 4 + 1  # ~4 characters per token in English: a budget, not a count


def format_entry(hit: SearchHit, now: float) -> str:
    """One remembered entry for the voice prompt, short: every token of it is read before the reply's first word
    (~5 ms a token for Qwen 0.5B on 2 cores, ~18 for the 1.5B: docs/search.md), so the date only when it is not
    today's and the time to the minute, which is as much as a spoken answer says."""
    entry = hit.entry
    at = datetime.fromtimestamp(entry.wall_time, UTC)
    when = f"{at:%H:%M} UTC" if at.date() == datetime.fromtimestamp(now, UTC).date() else f"{at:%Y-%m-%d %H:%M} UTC"
    text = f'"{entry.text}"' if entry.kind in ("transcript", "reply") else entry.text
    return f"- {when} ({_ago(now, entry.wall_time)}), {KIND_PHRASES.get(entry.kind, entry.kind)}: {text}"


def format_entry_time_last(hit: SearchHit, now: float) -> str:
    """What happened first, its time after: a small LLM asked "when" copies the entry's opening words, so with
    this order its answer keeps the time ("person (track 1) entered zone 'gate' ... at 06:12:19 UTC")."""
    entry = hit.entry
    at = datetime.fromtimestamp(entry.wall_time, UTC)
    text = f'"{entry.text}"' if entry.kind in ("transcript", "reply") else entry.text
    source = entry.meta.get("source_name")
    by = f"{KIND_PHRASES.get(entry.kind, entry.kind)}" + (f", source '{source}'" if source else "")
    return f"- {text} ({by}) at {at:%H:%M:%S} UTC on {at:%Y-%m-%d}, {_ago(now, entry.wall_time)}"


def _ago(now: float, then: float) -> str:
    minutes = max(0, round((now - then) / 60))
    if minutes < 120:
        return "just now" if minutes == 0 else f"{minutes} min ago"
    return f"{minutes // 60} h ago" if minutes < 48 * 60 else f"{minutes // (24 * 60)} days ago"


# An entry that matched none of the query's words is kept only among this many nearest by meaning. Past them the
# nearest neighbours are whatever is closest, not what was asked, and Qwen 0.5B answered "Where did I say I left
# my keys?" with the car of another session's entry (bench/answers.py); each also costs the reply its tokens.
MEANING_ONLY_RANKS = 2


def relevant(hits: Sequence[SearchHit]) -> list[SearchHit]:
    """The hits a prompt should carry: every one the query's words matched, and those found by meaning alone
    when they are among the ``MEANING_ONLY_RANKS`` nearest."""
    return [hit for hit in hits if hit.keyword_rank is not None
            or (hit.vector_rank is not None and hit.vector_rank <= MEANING_ONLY_RANKS)]


def fit_entries(hits: Sequence[SearchHit], max_entries: int, max_tokens: int, now: float,
                formatter: Callable[[SearchHit, float], str] = format_entry) -> list[str]:
    lines, used = [], 0
    for hit in hits[:max_entries]:
        line = formatter(hit, now)
        cost = _approx_tokens(line)
        if used + cost > max_tokens:
            continue  # a shorter, lower-ranked entry may still fit
        lines.append(line)
        used += cost
    return lines


class MemoryRecall:
    """A voice loop's memory (``pipelines.voice.recall.ContextProvider``)."""

    KINDS = ("transcript", "event", "scene", "alert")

    def __init__(self, index: MemoryIndex, *, max_entries: int, max_tokens: int, timeout_s: float = 3.0) -> None:
        self.index, self.max_entries, self.max_tokens = index, max_entries, max_tokens
        self.timeout_s = timeout_s

    async def __call__(self, text: str, conversation: list[ChatMessage]) -> PromptContext | None:
        if not asks_about_past(text):
            return None  # an ordinary turn: no retrieval, no added latency
        started = time.perf_counter()
        query = rewrite_query(text, conversation)
        try:
            hits = await asyncio.wait_for(
                # Never shed: a live turn waits (bounded by timeout_s) rather than lose its memory to API searches.
                self.index.search(query, SearchFilters(kinds=self.KINDS), self.max_entries + 2, shed=False),
                self.timeout_s)
        except TimeoutError:
            log.warning("memory retrieval took over %.1f s: answering without memory", self.timeout_s)
            hits = []
        except Exception:
            log.exception("memory retrieval failed")
            hits = []
        said = text.strip().lower()
        hits = relevant([h for h in hits if h.entry.text.strip().lower() != said])  # not the question itself
        lines = fit_entries(hits, self.max_entries, self.max_tokens, time.time())
        retrieval_ms = round((time.perf_counter() - started) * 1000.0, 1)
        if not lines:
            return PromptContext("Nothing in memory matches this question about the past.",
                                 memory_retrieval_ms=retrieval_ms, memory_entries=0)
        return PromptContext("What you remember (most relevant first; answer from it and say when):\n"
                             + "\n".join(lines), memory_retrieval_ms=retrieval_ms, memory_entries=len(lines))
