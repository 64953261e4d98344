"""StreamTracker: ids (Norfair, size-scaled distance), zone enter/exit/dwell and line crossings, the trust rules
(video.objects), run-time reconfiguration."""

from __future__ import annotations

import pytest

from models.detectors import Detection
from pipelines.protocol import LineConfig, ObjectFilter, ObjectsConfig, ZoneConfig
from pipelines.video.tracking import LOST_TRACK_S, SceneEvent, StreamTracker

W, H, FPS = 640, 480, 5.0
MIDDLE = ZoneConfig(name="middle", polygon=[(0.32, 0.0), (0.68, 0.0), (0.68, 1.0), (0.32, 1.0)])
LEFT = ZoneConfig(name="left", polygon=[(0.0, 0.0), (0.5, 0.0), (0.5, 1.0), (0.0, 1.0)])
RIGHT = ZoneConfig(name="right", polygon=[(0.5, 0.0), (1.0, 0.0), (1.0, 1.0), (0.5, 1.0)])
DOWN = LineConfig(name="door", start=(0.5, 0.0), end=(0.5, 1.0))  # drawn top to bottom: left-to-right is "in"


def person(cx: float, conf: float = 0.9, width: float = 0.1) -> Detection:
    """A person whose box is centred on x=cx (normalised), standing at y=0.8."""
    return Detection(label="person", class_id=0, conf=conf, box=(cx - width / 2, 0.3, cx + width / 2, 0.8))


def run(tracker: StreamTracker, frames: list[list[Detection]], start: int = 0) -> list[tuple[int, SceneEvent]]:
    """Feed frames at FPS; return (frame index, event) pairs."""
    out = []
    for i, dets in enumerate(frames, start):
        out += [(i, e) for e in tracker.update(dets, W, H, pts=i / FPS)]
    return out


def test_still_person_keeps_one_id_and_every_detection_is_kept() -> None:
    tracker = StreamTracker([], [], frame_rate=FPS)
    ids = []
    for i in range(20):
        dets = [person(0.4), person(0.8, conf=0.1)]  # the second is too weak to start a track
        tracker.update(dets, W, H, pts=i / FPS)
        assert len(dets) == 2
        assert dets[1].track_id is None
        ids.append(dets[0].track_id)
    assert ids[0] is None  # an id from the second sighting
    assert ids[1] is not None and ids[1] > 0
    assert set(ids[1:]) == {ids[1]}


def test_two_people_keep_distinct_ids_whatever_the_input_order() -> None:
    tracker = StreamTracker([], [], frame_rate=FPS)
    a_ids, b_ids = [], []
    for i in range(20):
        a, b = person(0.2), person(0.7)
        tracker.update([a, b] if i % 2 else [b, a], W, H, pts=i / FPS)  # results must map back by identity
        a_ids.append(a.track_id)
        b_ids.append(b.track_id)
    assert len(set(a_ids[2:])) == 1 and len(set(b_ids[2:])) == 1
    assert a_ids[-1] is not None and b_ids[-1] is not None and a_ids[-1] != b_ids[-1]


def test_box_sliding_through_a_zone_enters_once_and_exits_once_with_its_dwell() -> None:
    tracker = StreamTracker([MIDDLE], [], frame_rate=FPS)
    centres = [0.1 + 0.03 * i for i in range(30)]  # 19 px a frame, left to right
    inside = [0.32 <= c <= 0.68 for c in centres]
    expected_enter, expected_exit = inside.index(True), inside.index(False, inside.index(True))

    events = run(tracker, [[person(c)] for c in centres[:15]])
    assert tracker.occupancy == {"middle": [events[0][1].data["track_id"]]}  # mid-way: inside
    events += run(tracker, [[person(c)] for c in centres[15:]], start=15)
    assert tracker.occupancy == {"middle": []}

    assert [e.name for _, e in events] == ["zone.enter", "zone.exit"]
    (enter_at, enter), (exit_at, exit_) = events
    assert abs(enter_at - expected_enter) <= 1 and abs(exit_at - expected_exit) <= 1
    assert enter.data == {"zone": "middle", "track_id": enter.data["track_id"], "label": "person", "score": 0.9}
    assert exit_.data["track_id"] == enter.data["track_id"] and exit_.data["zone"] == "middle"
    assert abs(exit_.data["dwell_s"] - (expected_exit - expected_enter) / FPS) <= 1 / FPS + 1e-9


def test_vanished_track_leaves_the_zone_once_the_tracker_drops_it() -> None:
    tracker = StreamTracker([LEFT], [], frame_rate=FPS)
    events = run(tracker, [[person(0.25)] for _ in range(5)])
    assert [e.name for _, e in events] == ["zone.enter"]
    track_id = events[0][1].data["track_id"]

    gone = run(tracker, [[] for _ in range(4)], start=5)  # briefly lost: still inside (occlusion)
    assert gone == [] and tracker.occupancy == {"left": [track_id]}
    gone = run(tracker, [[] for _ in range(int(LOST_TRACK_S * FPS) + 2)], start=9)
    assert [e.name for _, e in gone] == ["zone.exit"]
    exit_ = gone[0][1]
    assert exit_.data["track_id"] == track_id
    # From its first sighting (inside already) to the last frame it was seen in.
    assert abs(exit_.data["dwell_s"] - 4 / FPS) < 1e-6
    assert tracker.occupancy == {"left": []}


def test_line_crossing_counts_each_direction_once() -> None:
    tracker = StreamTracker([], [DOWN], frame_rate=FPS)
    right = [0.2 + 0.03 * i for i in range(20)]  # 0.2 -> 0.77
    events = run(tracker, [[person(c)] for c in right])
    assert [(e.name, e.data["direction"]) for _, e in events] == [("line.cross", "in")]
    assert tracker.line_counts == {"door": {"in": 1, "out": 0}}

    back = run(tracker, [[person(c)] for c in reversed(right)], start=20)
    assert [(e.name, e.data["direction"]) for _, e in back] == [("line.cross", "out")]
    assert back[0][1].data == {"line": "door", "track_id": events[0][1].data["track_id"], "label": "person",
                               "direction": "out", "score": 0.9}
    assert tracker.line_counts == {"door": {"in": 1, "out": 1}}


def test_configure_resets_only_what_changed_and_keeps_ids() -> None:
    tracker = StreamTracker([LEFT], [DOWN], frame_rate=FPS)
    frames = [[person(0.3 + 0.03 * i)] for i in range(10)]  # crosses the line, ends in the right half
    events = run(tracker, frames)
    track_id = frames[-1][0].track_id
    assert sorted(e.name for _, e in events) == ["line.cross", "zone.enter", "zone.exit"]

    tracker.configure([LEFT], [DOWN], frame_rate=10.0)  # same zones and lines: nothing resets
    assert tracker.line_counts == {"door": {"in": 1, "out": 0}}

    tracker.configure([RIGHT], [DOWN], frame_rate=FPS)  # new zones: zone state resets, counts stay
    assert tracker.occupancy == {"right": []}
    assert tracker.line_counts == {"door": {"in": 1, "out": 0}}
    still = person(0.57)
    events = run(tracker, [[still]], start=10)
    assert [(e.name, e.data["zone"], e.data["track_id"]) for _, e in events] == [("zone.enter", "right", track_id)]
    assert still.track_id == track_id

    tracker.configure([RIGHT], [], frame_rate=FPS)
    assert tracker.line_counts == {} and tracker.occupancy == {"right": [track_id]}


def test_zones_follow_a_change_of_frame_size() -> None:
    tracker = StreamTracker([RIGHT], [], frame_rate=FPS)
    for i in range(3):
        assert tracker.update([person(0.3)], W, H, pts=i / FPS) == []
    for i in range(3, 6):  # at 1280 px a zone left in 640 px space would span 0.25..0.5 and catch x=0.3
        assert tracker.update([person(0.3)], 1280, 720, pts=i / FPS) == []
    events = [tracker.update([person(0.75)], 1280, 720, pts=i / FPS) for i in range(6, 9)]
    assert [e.name for frame in events for e in frame] == ["zone.enter"]


# ---------------------------------------------------------------- fast objects, trust (video.objects)


def test_a_runner_moving_more_than_its_width_between_samples_keeps_one_id_and_enters_once() -> None:
    tracker = StreamTracker([RIGHT], [DOWN], frame_rate=FPS)
    width = 0.08  # 51 px at 640
    centres = [0.05 + 0.15 * i for i in range(7)]  # 96 px a sample: consecutive boxes never overlap
    frames = [[person(c, conf=0.85, width=width)] for c in centres]
    events = run(tracker, frames)
    ids = [f[0].track_id for f in frames]
    assert ids[0] is None and ids[1] is not None  # an id from the second sighting
    assert set(ids[1:]) == {ids[1]}
    assert sorted((e.name, e.data["track_id"]) for _, e in events) == [("line.cross", ids[1]), ("zone.enter", ids[1])]
    assert all(f[0].confirmed for f in frames[1:])


def test_an_iou_tracker_would_lose_that_runner() -> None:
    """The runner above moves 1.9 widths a sample: its boxes never overlap, which is what made ByteTrack (IoU)
    start a new track at every sighting. A sprint of 3 widths a sample is beyond the size-scaled gate too."""
    tracker = StreamTracker([], [], frame_rate=FPS)
    frames = [[person(0.05 + 0.3 * i, conf=0.85, width=0.1)] for i in range(4)]
    run(tracker, frames)
    assert {f[0].track_id for f in frames} == {None}


def test_a_weak_detection_on_the_background_is_shown_but_never_tracked_nor_raises_events() -> None:
    tracker = StreamTracker([RIGHT], [DOWN], frame_rate=FPS)
    frames = [[person(0.45 + 0.02 * i, conf=0.26)] for i in range(20)]  # drifts across the line into the zone
    events = run(tracker, frames)
    assert events == []
    assert all(f[0].track_id is None and f[0].confirmed is False for f in frames)
    assert tracker.occupancy == {"right": []} and tracker.line_counts == {"door": {"in": 0, "out": 0}}


def test_a_track_raises_events_only_once_its_median_score_reaches_the_threshold() -> None:
    tracker = StreamTracker([RIGHT], [], frame_rate=FPS)
    # The first sighting (no id yet) is not in the history; the median of the rest reaches 0.7 at the 7th: 0.76.
    scores = [0.55, 0.6, 0.58, 0.62, 0.9, 0.92, 0.95, 0.9]
    frames = [[person(0.75, conf=score)] for score in scores]
    events = run(tracker, frames)
    confirmed = [f[0].confirmed for f in frames]
    assert confirmed == [False] * 6 + [True] * 2
    assert [(i, e.name, e.data["score"]) for i, e in events] == [(6, "zone.enter", 0.95)]  # the best score so far
    assert frames[1][0].track_id is not None  # tracked (an id) while unconfirmed


def test_per_label_filters_replace_the_default_for_their_label() -> None:
    lenient = ObjectsConfig(filters={"person": ObjectFilter(min_score=0.2, threshold=0.25)})
    tracker = StreamTracker([RIGHT], [], frame_rate=FPS, objects=lenient)
    events = run(tracker, [[person(0.75, conf=0.3)] for _ in range(3)])
    assert [e.name for _, e in events] == ["zone.enter"]

    cats_only = ObjectsConfig(default=ObjectFilter(min_score=0.99))  # any label but cat: never tracked
    tracker.configure([RIGHT], [], FPS, objects=cats_only)
    cat = Detection(label="cat", class_id=15, conf=0.9, box=(0.1, 0.5, 0.2, 0.6))
    dog = Detection(label="dog", class_id=16, conf=0.9, box=(0.3, 0.5, 0.4, 0.6))
    assert tracker.update([cat, dog], W, H, pts=1.0) == [] and dog.confirmed is False


@pytest.mark.parametrize(("rule", "tracked"), [
    (ObjectFilter(min_area=0.06), False),  # the box is 0.1 x 0.5 = 0.05 of the frame
    (ObjectFilter(max_area=0.04), False),
    (ObjectFilter(min_area=0.04, max_area=0.06), True),
    (ObjectFilter(min_ratio=0.5), False),  # width / height = 64 / 240 px = 0.27
    (ObjectFilter(max_ratio=0.2), False),
    (ObjectFilter(min_ratio=0.2, max_ratio=0.3), True),
])
def test_area_and_ratio_bounds_decide_what_is_tracked(rule: ObjectFilter, tracked: bool) -> None:
    tracker = StreamTracker([], [], frame_rate=FPS, objects=ObjectsConfig(default=rule))
    frames = [[person(0.5)] for _ in range(3)]
    run(tracker, frames)
    assert (frames[-1][0].track_id is not None) is tracked


def test_two_people_crossing_each_other_keep_their_ids() -> None:
    tracker = StreamTracker([], [], frame_rate=FPS)
    a_ids, b_ids = [], []
    for i in range(15):
        a, b = person(0.15 + 0.05 * i, width=0.12), person(0.85 - 0.05 * i, width=0.12)  # they meet at i = 7
        tracker.update([b, a], W, H, pts=i / FPS)
        a_ids.append(a.track_id)
        b_ids.append(b.track_id)
    assert set(a_ids[1:]) == {a_ids[1]} and set(b_ids[1:]) == {b_ids[1]} and a_ids[1] != b_ids[1]


def test_a_faster_rate_keeps_a_lost_track_for_the_same_seconds() -> None:
    tracker = StreamTracker([LEFT], [], frame_rate=FPS)
    run(tracker, [[person(0.25)] for _ in range(3)])
    tracker.set_rate(2 * FPS)  # boosted: twice the updates for the same LOST_TRACK_S
    gone = [tracker.update([], W, H, pts=1 + i / (2 * FPS)) for i in range(int(LOST_TRACK_S * 2 * FPS) - 2)]
    assert not any(gone) and tracker.occupancy["left"]
    gone = [tracker.update([], W, H, pts=3 + i / (2 * FPS)) for i in range(6)]
    assert [e.name for frame in gone for e in frame] == ["zone.exit"]


def test_a_track_trusted_from_its_second_sighting_starts_where_it_was_first_seen() -> None:
    """A runner seen once inside the zone and right of the line, then already beyond both: it entered and left the
    zone and crossed the line, though no two sightings with an id were on either side."""
    tracker = StreamTracker([RIGHT], [DOWN], frame_rate=FPS)
    frames = [[person(c, conf=0.85, width=0.08)] for c in (0.66, 0.49)]  # 109 px apart, right to left
    events = run(tracker, frames)
    track_id = frames[1][0].track_id
    assert track_id is not None
    assert sorted((e.name, e.data.get("direction")) for _, e in events) == [
        ("line.cross", "out"), ("zone.enter", None), ("zone.exit", None)]
    exit_ = next(e for _, e in events if e.name == "zone.exit")
    assert exit_.data["dwell_s"] == 1 / FPS  # from the first sighting to the one outside


def test_a_new_object_missing_from_the_next_frame_is_forgotten_quietly() -> None:
    """Seen once (no id yet), then not in the next frame, which has fewer detections: nothing of the earlier frame
    is read from the new one, and it never becomes a track."""
    tracker = StreamTracker([RIGHT], [], frame_rate=FPS)
    events = run(tracker, [[person(0.2), person(0.8)], [person(0.2)], [person(0.2)], [person(0.2)]])
    assert events == []
    assert tracker.unconfirmed == 0 and tracker.occupancy == {"right": []}


def test_a_runner_entering_the_view_keeps_its_id_while_its_box_grows_from_the_edge() -> None:
    """Cut by the frame's edge, the first box is a sliver (13 px) and the next the whole runner (51 px), 1.6 widths
    on: the size change says nothing of the object there, and the two sightings are one track."""
    tracker = StreamTracker([], [], frame_rate=FPS)
    sliver = Detection(label="person", class_id=0, conf=0.8, box=(0.0, 0.4, 0.02, 0.8))
    whole = Detection(label="person", class_id=0, conf=0.85, box=(0.1, 0.4, 0.18, 0.8))
    further = Detection(label="person", class_id=0, conf=0.85, box=(0.26, 0.4, 0.34, 0.8))
    for i, det in enumerate([sliver, whole, further]):
        tracker.update([det], W, H, pts=i / FPS)
    assert whole.track_id is not None and further.track_id == whole.track_id


def test_moving_tracks_are_told_apart_from_still_ones() -> None:
    tracker = StreamTracker([], [], frame_rate=FPS)
    walker = [[person(0.1 + 0.04 * i, width=0.1)] for i in range(6)]  # 0.4 widths an update
    run(tracker, walker)
    assert tracker.moving == 1
    still = StreamTracker([], [], frame_rate=FPS)
    run(still, [[person(0.5, width=0.1)] for _ in range(6)])
    assert still.moving == 0 and still.tracking


def test_an_exit_of_a_dropped_track_carries_its_best_score() -> None:
    tracker = StreamTracker([LEFT], [], frame_rate=FPS)
    run(tracker, [[person(0.25, conf=c)] for c in (0.8, 0.9, 0.85)])
    gone = run(tracker, [[] for _ in range(int(LOST_TRACK_S * FPS) + 2)], start=3)
    assert [(e.name, e.data["score"]) for _, e in gone] == [("zone.exit", 0.9)]


def test_a_session_changes_only_the_object_keys_it_names() -> None:
    from pydantic import ValidationError

    from pipelines.protocol import SessionConfig, SessionConfigPatch

    server = SessionConfig.model_validate({"video": {"objects": {"default": {"min_score": 0.6}}}})
    merged = server.merged(SessionConfigPatch.model_validate(
        {"video": {"objects": {"filters": {"car": {"min_area": 0.01}}}}}))
    assert merged.video.objects.default.min_score == 0.6  # kept: the patch named only filters
    assert merged.video.objects.of("car").min_area == 0.01 and merged.video.objects.of("person").min_score == 0.6
    with pytest.raises(ValidationError, match="min_area must be <= max_area"):
        ObjectFilter(min_area=0.5, max_area=0.1)
    with pytest.raises(ValidationError):
        SessionConfigPatch.model_validate({"video": {"objects": {"filters": {"person": {"threshold": 1.5}}}}})


def test_samples_dropped_while_a_track_is_missing_age_it_as_the_seconds_pass() -> None:
    """Under load a stream gets fewer samples than its rate: a track that left still exits LOST_TRACK_S after it
    was last seen (plus a sample), not after as many *updates* as that many seconds hold at the full rate."""
    tracker = StreamTracker([LEFT], [], frame_rate=FPS)
    run(tracker, [[person(0.25)] for _ in range(3)])  # seen until 0.4 s
    exits = []
    for i in range(1, 8):  # then one update a second (4 of 5 samples dropped)
        exits += [(0.4 + i, e.name) for e in tracker.update([], W, H, pts=0.4 + i)]
    assert exits == [(3.4, "zone.exit")]


def test_one_miss_at_a_refresh_of_a_still_scene_costs_one_step() -> None:
    tracker = StreamTracker([LEFT], [], frame_rate=FPS)
    run(tracker, [[person(0.25)] for _ in range(3)])
    assert tracker.update([], W, H, pts=5.4) == []  # the refresh 5 s on: a flaky miss
    events = [tracker.update([person(0.25)], W, H, pts=5.6 + i / FPS) for i in range(3)]
    assert not any(events) and tracker.occupancy["left"]
