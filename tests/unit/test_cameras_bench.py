"""The cameras bench's bookkeeping (bench/cameras.py): which results fall in the windows a person is in view."""

from __future__ import annotations

from bench.cameras import Clip, event_recall, gated_configs

# 10 fps, 60 frames a loop, the person in view in frames 30..44 of each loop.
CLIP = Clip("c.mp4", fps=10, frames=60, in_view=(30, 45))


def test_media_time_maps_to_the_loop_whose_window_holds_it() -> None:
    period = 5.9 + 1e-3  # the file source starts a loop 1 ms after the previous loop's last frame
    assert CLIP.loop_in_view(3.0) == 0
    assert CLIP.loop_in_view(4.4) == 0
    assert CLIP.loop_in_view(4.5) is None  # the person has left
    assert CLIP.loop_in_view(2.9) is None
    assert CLIP.loop_in_view(7 * period + 3.0) == 7  # far into the run, the 1 ms per loop still counted
    assert CLIP.loop_in_view(7 * period + 4.4) == 7
    assert CLIP.loop_in_view(7 * period + 2.9) is None


def test_only_windows_wholly_inside_the_measured_frames_count() -> None:
    assert CLIP.complete_windows(0, 45) == [0]
    assert CLIP.complete_windows(0, 44) == []  # its last frame not yet in
    assert CLIP.complete_windows(31, 200) == [1, 2]  # loop 0's window had begun; loop 3's ends at 225
    assert CLIP.complete_windows(90, 105) == [1]
    assert Clip("s.mp4", 10, 60).complete_windows(0, 600) == []  # an empty scene has none


def test_recall_counts_each_window_against_the_reference_pass() -> None:
    reference = {"zone.enter": 1, "zone.exit": 1}
    live = [{"zone.enter": 1, "zone.exit": 1}, {"zone.enter": 2, "zone.exit": 0}]
    assert event_recall(live, reference) == {"found": 3, "expected": 4, "extra": 1}
    assert event_recall([], reference) == {"found": 0, "expected": 0, "extra": 0}


def test_side_by_side_configs_cross_worker_counts_with_niceness() -> None:
    base = {"grpc": {"port": 0}, "video": {"detector_workers": 0}}
    assert gated_configs(base, {"detector_workers": 0}, [0], None) == [("gated (default)", base)]
    configs = gated_configs(base, {"detector_workers": 0}, [0, 1], [0, 19])
    assert [label for label, _ in configs] == ["gated, workers 0, nice 0", "gated, workers 0, nice 19",
                                               "gated, workers 1, nice 0", "gated, workers 1, nice 19"]
    assert configs[3][1] == {"grpc": {"port": 0}, "video": {"detector_workers": 1, "inference_nice": 19}}
    assert [label for label, _ in gated_configs(base, {}, None, [19])] == ["gated, nice 19"]
