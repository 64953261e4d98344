"""``memory``: the searchable memory of everything sessions and sources saw and heard (and chat documents)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, field_validator

from server.config.base import Section


class VoiceMemorySettings(Section):
    enabled: bool = Field(True, description="Let the voice loop answer questions about the past from memory.")
    max_entries: int = Field(5, ge=1, le=50, description="Most remembered entries put into one prompt.")
    max_tokens: int = Field(256, ge=16, description="Prompt budget for remembered entries (their times included).")
    timeout_s: float = Field(3.0, gt=0, description="A retrieval slower than this is given up: the turn is answered "
                             "without memory (e.g. while the embedding model is still loading).")


class DocumentSettings(Section):
    max_document_bytes: int = Field(1_000_000, ge=1024, description="Largest document accepted (413 beyond).")
    chunk_chars: int = Field(800, ge=100, description="Chunk length (characters, cut at paragraph/sentence ends).")
    chunk_overlap_chars: int = Field(150, ge=0, description="Characters a chunk repeats from the previous one.")
    chat_collection: str | None = Field(
        None, description="Collection every /v1/chat/completions request answers from; a request may name its own "
        "(extra field vigil.collection)."
    )
    chat_top_k: int = Field(4, ge=1, le=32, description="Chunks retrieved into a chat prompt.")


class MemorySettings(Section):
    enabled: bool = Field(True, description="Index what the timeline records (transcripts, replies, events, alerts, "
                          "scene summaries when they changed) for search; needs storage.enabled.")
    data_dir: Path = Field(Path("data/memory"), description="The entry store (SQLite, FTS5) and, with no uri, the "
                           "embedded LanceDB vector index (vectors.lance).")
    uri: str | None = Field(
        None, description="A Milvus server for the vectors, e.g. http://milvus:19530; None: LanceDB embedded in "
        "data_dir (no server to run). The same MemoryIndex code serves both (docs/search.md)."
    )
    token: SecretStr | None = Field(None, description="The Milvus server's token (user:password or API key).")
    collection: str = Field("vigil_memory", pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,254}$",
                            description="LanceDB table (or Milvus collection) holding the vectors.")
    queue_max: int = Field(10_000, ge=1, description="Entries waiting to be embedded; beyond it new ones are "
                           "refused and counted (vigil_memory_dropped_total).")
    batch_max: int = Field(64, ge=1, description="Entries embedded and written together.")
    event_names: list[str] = Field(
        default_factory=lambda: ["zone.*", "line.*", "object.*", "alert*"],
        description="Event names (shell patterns) that are indexed; config, barge_in, source.state are not.",
    )
    max_query_chars: int = Field(1000, ge=1, description="Longest search query (413 beyond).")
    max_results: int = Field(100, ge=1, le=1000, description="Largest limit a search may ask for.")
    candidates: int = Field(50, ge=1, description="Hits taken from each of keyword and vector search before fusion.")
    rrf_k: int = Field(60, ge=1, description="Reciprocal rank fusion constant: score = sum of 1 / (rrf_k + rank).")
    search_workers: int = Field(2, ge=1, le=16, description="Threads that run searches (embedding the query, "
                                "FTS5, the vector index): their own pool, beside the media and model threads.")
    search_queue_max: int = Field(8, ge=0, description="Searches waiting for a search thread; beyond it "
                                  "/api/search answers 503 server_busy with Retry-After (shed, not queued for "
                                  "seconds).")
    search_retry_after_s: float = Field(1.0, gt=0, le=3600, description="Retry-After given with a shed search.")
    voice: VoiceMemorySettings = VoiceMemorySettings()
    documents: DocumentSettings = DocumentSettings()

    @field_validator("uri")
    @classmethod
    def _server_uri(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://", "tcp://")):
            raise ValueError("memory.uri must be a Milvus server address (http://host:19530); leave it unset for "
                             "the embedded index in memory.data_dir")
        return value
