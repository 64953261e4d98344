"""``video.plates`` refuses what cannot work, naming the key: a known plate the reader can never
read (the reader keeps only 4-10 letters and digits with a digit), two names for one plate once normalised, and a
``settle_score`` below ``min_score``."""

from __future__ import annotations

import pytest

from server.config import ConfigError, load_settings


def _plates(**plates: object) -> object:
    return load_settings(None, {"video": {"plates": {"enabled": True, **plates}}}).video.plates


@pytest.mark.parametrize(("known", "named"), [
    ({"ABCDEF": "Alice's car"}, "'ABCDEF'"),  # no digit: never read as a plate
    ({"A1": "Bob's bike"}, "'A1'"),  # too short once normalised
    ({"AB-12-CD-EF-GH-1": "Carol"}, "'AB-12-CD-EF-GH-1'"),  # 11 letters and digits: too long
])
def test_a_known_plate_the_reader_can_never_read_is_refused(known: dict, named: str):
    with pytest.raises(ConfigError, match=r"video\.plates\.known") as refused:
        _plates(known=known)
    assert named in str(refused.value) and "digit" in str(refused.value)


def test_two_names_for_one_plate_once_normalised_are_refused():
    with pytest.raises(ConfigError, match=r"video\.plates\.known") as refused:
        _plates(known={"AB12 CDE": "Alice's van", "ab12-cde": "Bob's van"})
    assert "'AB12 CDE'" in str(refused.value) and "'ab12-cde'" in str(refused.value) and "AB12CDE" in str(refused.value)


def test_settle_score_below_min_score_is_refused():
    with pytest.raises(ConfigError, match=r"video\.plates\.settle_score") as refused:
        _plates(min_score=0.8, settle_score=0.7)
    assert "min_score" in str(refused.value)


def test_plates_that_can_work_are_accepted_as_written():
    plates = _plates(known={"AB12 CDE": "Alice's van", "ab12-cde": "Alice's van", "x9 yz": "Dan"},
                     min_score=0.7, settle_score=0.7)
    assert plates.known == {"AB12 CDE": "Alice's van", "ab12-cde": "Alice's van", "x9 yz": "Dan"}
