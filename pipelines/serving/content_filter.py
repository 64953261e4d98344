"""Streaming content filter for generated text: masks PII (e-mail addresses, phone numbers, Korean resident
registration numbers) and stops the answer at a configured blocked pattern, also when the match is split across
chunks.

How: text is held back only while it could still be the beginning of a match. The ``regex`` module's partial
matching (``partial=True``) answers exactly that question at the end of the buffer; everything before the
earliest possible match is safe to send. A complete match that touches the end of the buffer is held too (the
next chunk might extend it: more digits, a longer domain). ``finish()`` flushes the rest with full matching.
A run of held text longer than ``max_hold_chars`` is released from its start, bounding both memory and delay.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

import regex

PiiKind = Literal["email", "phone", "kr_rrn"]

PII_PATTERNS: dict[str, str] = {
    # Korean resident registration number: YYMMDD-GNNNNNN, G (sex/century digit) 1-4.
    "kr_rrn": r"(?<!\d)\d{6}-[1-4]\d{6}(?!\d)",
    "email": r"(?<![\w.%+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}(?![\w-])",
    # Separated groups (010-1234-5678, 02 123 4567, +82 10-1234-5678, (555) 123-4567) or a bare Korean mobile.
    "phone": r"(?<![\w+])(?:(?:\+\d{1,3}[ .-]?)?(?:\(\d{1,4}\)[ .-]?|\d{2,4}[ .-])\d{3,4}[ .-]\d{4}"
             r"|01[016789]\d{7,8})(?!\d)",
}
MASKS: dict[str, str] = {"email": "[EMAIL]", "phone": "[PHONE]", "kr_rrn": "[RRN]"}
_CONTEXT_CHARS = 8  # emitted text kept for the patterns' look-behinds


@dataclass
class FilterResult:
    text: str  # safe to send now
    blocked: bool = False  # a blocked pattern matched: send ``text``, then end the answer


@dataclass
class StreamingContentFilter:
    pii: list[str] = field(default_factory=lambda: list(PII_PATTERNS))
    block_patterns: list[str] = field(default_factory=list)
    max_hold_chars: int = 256

    def __post_init__(self) -> None:
        unknown = set(self.pii) - set(PII_PATTERNS)
        if unknown:
            raise ValueError(f"unknown PII kinds: {sorted(unknown)}")
        alternatives = [f"(?P<{kind}>{PII_PATTERNS[kind]})" for kind in PII_PATTERNS if kind in self.pii]
        self._pii = regex.compile("|".join(alternatives)) if alternatives else None
        self._blocks = [regex.compile(pattern) for pattern in self.block_patterns]
        self._held = ""
        self._context = ""
        self.blocked = False
        self.masked: Counter[str] = Counter()

    @property
    def held_chars(self) -> int:
        """Characters fed but not released yet (what may still become a match)."""
        return len(self._held)

    def feed(self, chunk: str) -> FilterResult:
        if self.blocked:
            return FilterResult("", blocked=True)
        self._held += chunk
        return self._scan(final=False)

    def finish(self) -> FilterResult:
        """End of the answer: release (filtered) whatever is still held."""
        if self.blocked:
            return FilterResult("", blocked=True)
        return self._scan(final=True)

    def _earliest(self, text: str, pos: int, final: bool) -> tuple[regex.Match[str], bool] | None:
        """The leftmost (possibly partial) match from ``pos``: (match, is_block). Blocks win ties."""
        best: tuple[regex.Match[str], bool] | None = None
        for pattern in self._blocks:
            match = pattern.search(text, pos, partial=not final)
            if match is not None and (best is None or match.start() < best[0].start()):
                best = (match, True)
        if self._pii is not None:
            match = self._pii.search(text, pos, partial=not final)
            if match is not None and (best is None or match.start() < best[0].start()):
                best = (match, False)
        return best

    def _scan(self, final: bool) -> FilterResult:
        text = self._context + self._held
        cursor = len(self._context)
        out: list[str] = []
        held_from = len(text)
        while cursor < len(text):
            found = self._earliest(text, cursor, final)
            if found is None:
                out.append(text[cursor:])
                break
            match, is_block = found
            # Held too: a complete match that the text after it could still extend ("a@b.co" + ".kr": the
            # search prefers the complete match, so ask whether everything up to the end is a match's prefix).
            extendable = not final and not match.partial and match.end() < len(text) and (
                match.re.fullmatch(text, match.start(), partial=True) is not None)
            if (match.partial or extendable or (not final and match.end() == len(text))
                    or match.end() == match.start()):
                if match.end() == match.start():  # an empty match cannot hide anything: step past it
                    out.append(text[cursor:match.start() + 1])
                    cursor = match.start() + 1
                    continue
                out.append(text[cursor:match.start()])
                held_from = match.start()
                break
            out.append(text[cursor:match.start()])
            if is_block:
                self.blocked = True
                self._held = ""
                return FilterResult("".join(out), blocked=True)
            kind = match.lastgroup or "pii"
            self.masked[kind] += 1
            out.append(MASKS.get(kind, "[PII]"))
            cursor = match.end()
        held = text[held_from:] if held_from < len(text) else ""
        if len(held) > self.max_hold_chars:  # nothing real is this long: let its start go
            out.append(held[: len(held) - self.max_hold_chars])
            held = held[len(held) - self.max_hold_chars:]
        self._held = held
        emitted = "".join(out)
        self._context = (self._context + emitted)[-_CONTEXT_CHARS:]
        return FilterResult(emitted)

    def filter_all(self, text: str) -> FilterResult:
        """A whole text at once (non-streaming answers)."""
        first = self.feed(text)
        if first.blocked:
            return first
        rest = self.finish()
        return FilterResult(first.text + rest.text, rest.blocked)
