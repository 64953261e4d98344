"""An LLM server's Prometheus text (llama.cpp's ``/metrics`` or ``Server.handle_metrics`` in-process, vLLM's
``/metrics``) as numbers."""

from __future__ import annotations


def parse_prometheus(text: str, prefix: str = "llamacpp:") -> dict[str, float]:
    """{name: value summed over its label sets}, ``prefix`` stripped from the names:
    ``llamacpp:tokens_predicted_total 12`` -> {"tokens_predicted_total": 12.0};
    ``vllm:num_requests_running{model_name="m"} 1`` (prefix "") -> {"vllm:num_requests_running": 1.0}."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, _, value = line.rpartition(" ")
            name = series.split("{", 1)[0].removeprefix(prefix)
            out[name] = out.get(name, 0.0) + float(value)
    return out
