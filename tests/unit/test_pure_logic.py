"""Pure logic, no models: frame sampling, router ranking, the streaming PII filter, subtitle cues."""

from __future__ import annotations

import itertools
from fractions import Fraction

import av
import pytest

from models.llm import ChatMessage, LlmRequest
from models.llm.prometheus import parse_prometheus
from models.llm.router import CostAware, LeastConnections, LeastLatency, ModelAffinity, Upstream, UpstreamConfig
from models.stt.batch import FileSegment
from pipelines.batch.formats import Transcript, as_text
from pipelines.sampling import FpsSampler, TrackTime
from pipelines.serving.content_filter import StreamingContentFilter

# ---------------------------------------------------------------- FPS sampling


def test_fps_sampler_keeps_a_steady_grid_and_never_bursts():
    sampler = FpsSampler(5.0)
    frames = [i / 30 for i in range(90)]  # 3 s at 30 fps
    due = [pts for pts in frames if sampler.due(pts)]
    assert 14 <= len(due) <= 16  # 5 per second
    gaps = [b - a for a, b in itertools.pairwise(due)]
    assert all(0.19 <= gap <= 0.21 for gap in gaps), gaps
    sampler.due(10.0)  # a 7 s gap: one sample, then the grid again (no catch-up burst)
    assert not sampler.due(10.05) and sampler.due(10.2)


def test_fps_sampler_takes_a_slower_stream_whole_and_retargets():
    sampler = FpsSampler(10.0)
    assert all(sampler.due(i * 0.5) for i in range(10))  # 2 fps < 10 fps: every frame
    sampler.retarget(1.0)
    assert sampler.due(5.0) and not sampler.due(5.5) and sampler.due(6.0)


def test_media_time_runs_on_across_a_wrap_of_the_32_bit_rtp_timestamp():
    track_time, sampler = TrackTime(), FpsSampler(5.0)
    start = (1 << 32) - 90_000  # a sender whose random first timestamp is one second before the wrap
    seconds, sampled = [], 0
    for index in range(30):  # 3 s at 10 fps, 90 kHz clock
        frame = av.VideoFrame(16, 16, "yuv420p")
        frame.pts, frame.time_base = (start + index * 9_000) % (1 << 32), Fraction(1, 90_000)
        seconds.append(track_time.of(frame))
        sampled += sampler.due(seconds[-1])
    assert seconds == pytest.approx([index / 10 for index in range(30)])
    assert sampled == 15  # 5 per second, also after the wrap


# ---------------------------------------------------------------- router ranking


def _upstream(name: str, in_flight: int = 0, cost: float = 1.0, ttft_s: float | None = None) -> Upstream:
    upstream = Upstream(UpstreamConfig(name, "http://127.0.0.1:9", ("m",), cost=cost), 1.0)
    upstream.in_flight, upstream.ttft_s = in_flight, ttft_s
    return upstream


REQUEST = LlmRequest([ChatMessage("user", "hi")], max_tokens=4, conversation_id="c1")


def _names(ranked: list[Upstream]) -> list[str]:
    return [u.name for u in ranked]


def test_least_connections_and_least_latency_rank():
    a, b = _upstream("a", in_flight=2), _upstream("b", in_flight=0)
    assert _names(LeastConnections().rank([a, b], REQUEST)) == ["b", "a"]
    fast_busy, slow_idle, unmeasured = _upstream("f", 3, ttft_s=0.1), _upstream("s", 0, ttft_s=0.5), _upstream("u")
    assert _names(LeastLatency().rank([fast_busy, slow_idle, unmeasured], REQUEST)) == ["u", "f", "s"]


def test_model_affinity_keeps_a_conversation_home():
    affinity = ModelAffinity(max_conversations=1)
    a, b = _upstream("a", in_flight=5), _upstream("b")
    affinity.served(REQUEST, a)
    assert _names(affinity.rank([a, b], REQUEST)) == ["a", "b"]  # home first, however busy
    affinity.served(LlmRequest([ChatMessage("user", "x")], max_tokens=1, conversation_id="c2"), b)
    assert affinity.home("c1") is None  # the oldest conversation was forgotten (max 1)


def test_cost_aware_fills_the_cheap_busy_upstream_before_waking_another():
    busy_cheap, idle_cheap, idle_dear = _upstream("bc", 1, cost=1), _upstream("ic", 0, cost=1), _upstream("id", 0, 5)
    assert _names(CostAware(saturation=4).rank([idle_dear, idle_cheap, busy_cheap], REQUEST)) == ["bc", "ic", "id"]
    full = _upstream("full", 4, cost=1)
    assert _names(CostAware(saturation=4).rank([full, idle_dear], REQUEST)) == ["id", "full"]


# ---------------------------------------------------------------- PII filter


def _stream(content_filter: StreamingContentFilter, text: str, size: int) -> str:
    out = "".join(content_filter.feed(text[i:i + size]).text for i in range(0, len(text), size))
    return out + content_filter.finish().text


def test_pii_is_masked_even_when_split_across_chunks():
    text = "Mail kim.lee@example.co.kr or call 010-1234-5678; RRN 900101-1234567. Done."
    for size in [*range(1, 12), len(text)]:  # every split, e.g. "...@example.co" + ".kr"
        assert _stream(StreamingContentFilter(), text, size) == "Mail [EMAIL] or call [PHONE]; RRN [RRN]. Done."


def test_a_blocked_pattern_ends_the_answer_before_the_match():
    content_filter = StreamingContentFilter(pii=[], block_patterns=[r"secret\s+plan"])
    out = "".join(content_filter.feed(piece).text for piece in ["The sec", "ret ", "plan is ..."])
    assert content_filter.blocked and out == "The " and "secret" not in out


def test_held_text_is_bounded():
    content_filter = StreamingContentFilter(max_hold_chars=16)
    content_filter.feed("a" * 100 + "@")  # could still become an address: held, but only up to the bound
    assert content_filter.held_chars <= 17


# ---------------------------------------------------------------- subtitle cues


def _segment(start: float, end: float, text: str) -> FileSegment:
    return FileSegment(start, end, text, (), 0.0, 0.0, 1.0, 0.0)


def test_subtitle_cues_are_ordered_non_empty_and_escaped():
    transcript = Transcript("en", 3.0, (
        _segment(0.0, 1.0, " Hello --> there "), _segment(0.9, 0.9, "A < B & C"), _segment(2.0, 2.5, "  "),
    ))
    assert as_text(transcript, "srt") == (
        "1\n00:00:00,000 --> 00:00:01,000\nHello -> there\n\n"
        "2\n00:00:01,000 --> 00:00:01,001\nA < B & C\n\n"  # never before the previous end, at least 1 ms long
    )
    assert as_text(transcript, "vtt").endswith("00:00:01.000 --> 00:00:01.001\nA &lt; B &amp; C\n\n")


# ---------------------------------------------------------------- an LLM server's /metrics


def test_prometheus_text_is_summed_over_label_sets_with_the_servers_prefix_stripped():
    llama_cpp = ("# HELP llamacpp:tokens_predicted_total Tokens\nllamacpp:tokens_predicted_total 12\n"
                 "llamacpp:requests_processing 1\n")
    assert parse_prometheus(llama_cpp) == {"tokens_predicted_total": 12.0, "requests_processing": 1.0}
    vllm = ('vllm:num_requests_running{engine="0",model_name="m"} 1.0\n'
            'vllm:num_requests_running{engine="1",model_name="m"} 2.0\n')
    assert parse_prometheus(vllm, "") == {"vllm:num_requests_running": 3.0}
