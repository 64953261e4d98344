"""What the memory holds: one ``MemoryEntry`` per transcript, reply, event, scene summary, alert or document chunk."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

EntryKind = Literal["event", "transcript", "reply", "scene", "alert", "document"]
TIMELINE_KINDS: tuple[str, ...] = ("event", "transcript", "reply", "scene", "alert")
KINDS: tuple[str, ...] = (*TIMELINE_KINDS, "document")


@dataclass(slots=True)
class MemoryEntry:
    kind: str
    text: str
    source: str = ""  # session or source id (or, for a document chunk, its collection)
    session: str = ""  # the session id; for a source, the source id too
    media_time: float | None = None  # seconds since the stream's first frame
    wall_time: float = 0.0  # unix seconds
    event_id: str | None = None
    clip_id: str | None = None
    labels: list[str] = field(default_factory=list)
    track_ids: list[int] = field(default_factory=list)
    document_id: str | None = None  # a document chunk: its document
    meta: dict[str, Any] = field(default_factory=dict)  # anything else worth showing (turn, zone, chunk index...)
    id: int | None = None  # assigned by the store
    timeline_seq: int | None = None  # the timeline entry's commit order (how far memory got: see feed.py)


@dataclass(slots=True)
class SearchFilters:
    source: str | None = None
    session: str | None = None
    kinds: tuple[str, ...] = TIMELINE_KINDS
    since: float | None = None  # wall time, unix seconds, inclusive
    until: float | None = None
    document_id: str | None = None

    def store_clauses(self, quote: Callable[[str], str], equals: str) -> list[str]:
        """The source, session, document and time clauses of a vector store's filter expression, in the store's
        syntax (its string literal, its equality operator); the kind clause differs more and stays with it."""
        fields = (("source", self.source), ("session", self.session), ("document_id", self.document_id))
        clauses = [f"{name} {equals} {quote(value)}" for name, value in fields if value is not None]
        if self.since is not None:
            clauses.append(f"wall_time >= {float(self.since)!r}")
        if self.until is not None:
            clauses.append(f"wall_time <= {float(self.until)!r}")
        return clauses


@dataclass(slots=True)
class SearchHit:
    entry: MemoryEntry
    score: float
    keyword_rank: float | None = None  # 1-based rank in the keyword list (ties share one), None when not in it
    vector_rank: float | None = None
