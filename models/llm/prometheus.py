"""llama.cpp's Prometheus text (``/metrics``, or ``Server.handle_metrics`` in-process) as numbers."""

from __future__ import annotations


def parse_prometheus(text: str) -> dict[str, float]:
    """``llamacpp:tokens_predicted_total 12`` lines -> {"tokens_predicted_total": 12.0}."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name.removeprefix("llamacpp:")] = float(value)
    return out
